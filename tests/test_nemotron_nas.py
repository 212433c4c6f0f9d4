"""Llama-3.3-Nemotron-Super-49B (model_type nemotron-nas, DeciLMForCausalLM): Llama's layers with the attention
dropped on 31 of 80 and MLPs of six widths. The planner holds, caches, multiplies and reduces what vLLM's
DeciLMDecoderLayer builds: 49 attention blocks, 80 MLP blocks at their own widths."""
import json

import pytest

from engine.deployment import Deployment
from planner.catalog import resolve_model
from planner.catalog.kept_layers import kept_fractions
from planner.catalog.nemotron_nas import ffn_width
from planner.cost.measured import MeasuredCostModel
from planner.cost.roofline import RooflineCostModel
from planner.cost.shape import StepShape
from planner.deploy.plan import plan_deployment
from planner.errors import PlannerError

SUPER = resolve_model("nvidia/Llama-3_3-Nemotron-Super-49B-v1")
LLAMA70 = resolve_model("meta-llama/Llama-3.3-70B-Instruct")


def _block(attention: bool = True, ffn_mult: float | None = 2.625, **ffn) -> dict:
    return {"attention": {"no_op": not attention, "n_heads_in_group": 8 if attention else None,
                          "replace_with_linear": False},
            "ffn": {"no_op": ffn_mult is None and not ffn, "ffn_mult": ffn_mult, "replace_with_linear": False, **ffn}}


def _config(blocks: list[dict], **extra) -> dict:
    return {"model_type": "nemotron-nas", "architectures": ["DeciLMForCausalLM"], "hidden_size": 8192,
            "num_attention_heads": 64, "num_key_value_heads": None, "intermediate_size": None,
            "num_hidden_layers": len(blocks), "vocab_size": 128256, "max_position_embeddings": 131072,
            "rope_theta": 500000.0, "hidden_act": "silu", "block_configs": blocks, **extra}


def _write(tmp_path, config: dict) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


def test_an_mlps_width_is_decilms_rule():
    """ffn_mult x hidden x 2/3, rounded up to a multiple of 256: 5.25 is Llama-3.3-70B's 28,672."""
    assert ffn_width(5.25, 8192) == LLAMA70.intermediate_size == 28672
    assert [ffn_width(m, 8192) for m in (3.28125, 2.625, 1.3125, 1.0, 0.5)] == [17920, 14336, 7168, 5632, 2816]


def test_a_config_reads_as_attention_and_mlp_blocks(tmp_path):
    """A dropped attention leaves its layer's MLP, a dropped MLP its attention; an MLP may give its width."""
    spec = resolve_model(_write(tmp_path, _config(
        [_block(ffn_mult=5.25), _block(attention=False, ffn_mult=1.0), _block(ffn_mult=None),
         _block(attention=False, ffn_mult=None, intermediate_size=4096)])))
    assert spec.block_pattern == "*-.-*..-" and spec.num_layers == spec.attention_layers == 2
    assert spec.ffn_layers == 3 and spec.mlp_widths == (28672, 5632, 4096) and spec.intermediate_size == 28672
    assert spec.num_kv_heads == 8 and spec.tp_allreduces == 2 + 3 + 1
    assert resolve_model(_write(tmp_path, spec.to_hf_config().to_dict())) == spec


def test_the_super_49b_is_the_shipped_config():
    """49 attention layers of 8 KV heads, 80 MLPs; 49,867,145,216 parameters, which Llama's parts built to its
    config count too (tests/test_catalog.py), against Hugging Face's 49.9B."""
    assert resolve_model("nvidia/Llama-3_3-Nemotron-Super-49B-v1_5-FP8") is SUPER
    assert (SUPER.attention_layers, SUPER.ffn_layers, SUPER.num_kv_heads) == (49, 80, 8)
    assert [(layers, width) for layers, width, _ in SUPER.dense_mlp_kinds] == [
        (49, 28672), (1, 17920), (6, 14336), (10, 7168), (8, 5632), (6, 2816)]
    assert SUPER.num_params == 49_867_145_216


@pytest.mark.parametrize("change, message", [
    (lambda b: b[1]["attention"].update(replace_with_linear=True), "replaces a block with a linear layer"),
    (lambda b: b[1]["attention"].update(n_heads_in_group=4), "differ in n_heads_in_group"),
    (lambda b: b[0]["ffn"].update(hidden_act="relu"), "vLLM's Llama MLP runs silu only"),
    (lambda b: b[0]["ffn"].pop("ffn_mult"), "needs an ffn_mult or an intermediate_size"),
    (lambda b: b.pop(), "block_configs must list each of its 2 layers"),
    (lambda b: b[0]["ffn"].update(ffn_mult=float("nan")), "needs an ffn_mult or an intermediate_size"),
    (lambda b: [block["ffn"].update(no_op=True) for block in b], "without MLP layers"),
])
def test_what_vllm_does_not_build_is_refused_in_one_line(tmp_path, change, message):
    blocks = [_block(), _block()]
    change(blocks)
    config = _config(blocks) | {"num_hidden_layers": 2}
    with pytest.raises(PlannerError, match=message) as error:
        resolve_model(_write(tmp_path, config))
    assert "\n" not in str(error.value)


def test_only_the_attention_layers_cache():
    """49 layers of 8 KV heads: 49/80 of Llama-3.3-70B's KV bytes per token, and less weight on each GPU."""
    assert SUPER.kv_bytes_per_token() == 49 * 2 * 8 * 128 * 2 == LLAMA70.kv_bytes_per_token() * 49 // 80
    assert SUPER.weight_bytes_per_gpu(2) < 0.72 * LLAMA70.weight_bytes_per_gpu(2)


def test_excluded_modules_are_matched_on_the_decoder_layers():
    """Checkpoint names are Llama's, model.layers.N with N the decoder layer: layer 6 has an MLP, no attention."""
    assert kept_fractions(SUPER, ("model.layers.6.self_attn.q_proj",)) == {}
    assert kept_fractions(SUPER, ("model.layers.6.mlp.down_proj",)) == {"mlp": (0.0, 0.0, 1 / 80)}
    assert kept_fractions(SUPER, ("model.layers.0.self_attn*",))["attention"] == (1 / 49,) * 4


@pytest.mark.parametrize("make", [MeasuredCostModel, RooflineCostModel])
def test_each_mlp_is_priced_at_its_width(make):
    """The measured ledger prices the MLP GEMMs width by width, 80 layers in all, and the step is the ledger's
    sum; both models put the step below Llama-3.3-70B's and above a 49-layer Llama-3.3-70B's MLPs alone."""
    model = make(SUPER, "h100", tp=2)
    step = StepShape(decode_seqs=32, decode_context=32 * 2048)
    assert model.step_time(step) < make(LLAMA70, "h100", tp=2).step_time(step)
    if make is MeasuredCostModel:
        terms = model.ledger(step).terms
        assert model.ledger(step).total == pytest.approx(model.step_time(step))
        ups = [t for t in terms if t.name.startswith("gate+up (")]
        assert len(ups) == 6 and sum(int(t.detail.split(", x")[1].split()[0]) for t in ups) == 80
        assert any("x129 layers" in t.detail for t in terms if t.name.startswith("input RMSNorm"))


def test_the_plan_runs_the_super_49b_on_one_h100_in_fp8():
    """NVIDIA sized it for one H100 in FP8: about 52 GB of weights leave the cache 98,304 tokens of 49 layers."""
    plan = plan_deployment(Deployment(model="nvidia/Llama-3_3-Nemotron-Super-49B-v1-FP8", gpu="h100", tp=1,
                                      max_model_len=32768))
    memory = plan.memory
    assert memory.block_bytes_per_gpu == 49 * 2 * 8 * 128 * 2 * plan.block_size
    assert 50e9 < memory.weight_bytes_per_gpu < 54e9 and memory.kv_token_slots > 2 * 32768
