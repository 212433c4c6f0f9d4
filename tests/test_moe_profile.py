"""planner profile's routing measurement on the CPU engine: the experts a random-weight MoE's routers
touch per forward pass, against the uniform-routing expectation."""

import pytest

pytest.importorskip("torch")

from engine.model_runner import ModelRunner  # noqa: E402
from planner.catalog import ModelSpec  # noqa: E402
from planner.profile.routing import measure_experts_touched  # noqa: E402
from planner.profile.schema import ModelArch  # noqa: E402
from tiny_models import save_tiny_model  # noqa: E402


@pytest.mark.parametrize("kind", ["qwen3_moe", "gpt_oss"])
def test_experts_touched_grow_from_k_to_all(kind, tmp_path):
    folder = save_tiny_model(kind, tmp_path / kind)
    spec = ModelSpec.from_model_dir(folder)
    runner = ModelRunner(folder, block_size=16, num_gpu_blocks=64, dtype="float32")
    found = measure_experts_touched(runner, spec, [1, 2, 8, 64, 200])
    k, e = spec.num_experts_per_tok, spec.num_experts
    assert [f.tokens for f in found] == [1, 2, 8, 64, 200]
    assert found[0].measured == k and found[0].uniform == pytest.approx(k)     # one token: exactly its top k
    assert all(a.measured <= b.measured for a, b in zip(found, found[1:]))
    assert found[-1].measured == e and found[-1].uniform == pytest.approx(e, rel=1e-6)
    assert all(k <= f.measured <= min(e, f.tokens * k) for f in found)
    # (the tiny checkpoints' peaked random routers touch fewer experts than uniform routing at 4-16 tokens:
    # the uniform column is the cost models' assumption, the measured one what this engine did)
    # the hooks are gone: a later forward pass counts nothing more
    assert not any(m._forward_hooks for m in runner.model.modules())


def test_profile_model_records_the_experts():
    arch = ModelArch.of(ModelSpec.from_hf_config(dict(
        model_type="mixtral", hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
        intermediate_size=64, num_local_experts=4, num_experts_per_tok=2, vocab_size=200,
        max_position_embeddings=256), name="tiny"))
    assert (arch.num_experts, arch.num_experts_per_tok, arch.moe_intermediate_size) == (4, 2, 64)
    dense = ModelArch.model_validate({k: v for k, v in arch.model_dump().items() if "expert" not in k})
    assert dense.num_experts == 0                # a profile written before MoE models reads as dense
