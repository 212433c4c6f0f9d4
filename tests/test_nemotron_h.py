"""Nemotron-H hybrids (Mamba-2 + attention + MLP/MoE blocks): config reading, weights and states per GPU, and
what each cost model prices (planner/catalog/nemotron_h.py, planner/catalog/mamba.py, planner/cost/mamba.py)."""
import dataclasses

import pytest
from typer.testing import CliRunner

from engine.deployment import Deployment
from planner.api import simulate
from planner.catalog import resolve_model
from planner.catalog.kept_layers import kept_fractions
from planner.catalog.mamba import Mamba2
from planner.catalog.models import ModelSpec
from planner.catalog.quantization import recorded_format
from planner.cli.app import app
from planner.cost.measured import MeasuredCostModel
from planner.cost.roofline import RooflineCostModel
from planner.cost.shape import StepShape
from planner.deploy.plan import plan_deployment
from planner.errors import PlannerError

# a small Nemotron 3 style config.json: every block kind, the experts in a latent space
SMALL = {"model_type": "nemotron_h", "hybrid_override_pattern": "M-M*EME", "hidden_size": 256,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 512,
         "vocab_size": 1000, "max_position_embeddings": 4096, "mamba_num_heads": 8, "mamba_head_dim": 32,
         "n_groups": 2, "ssm_state_size": 16, "conv_kernel": 4, "mamba_ssm_cache_dtype": "float32",
         "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
         "moe_shared_expert_intermediate_size": 256, "moe_latent_size": 64, "mlp_hidden_act": "relu2"}


def _transformers_count(config: dict) -> int:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.NemotronHConfig(**config))
    return sum(p.numel() for p in model.parameters())


def test_config_blocks_counted_as_transformers_builds_them():
    spec = ModelSpec.from_hf_config(SMALL, "small")
    assert (spec.num_layers, spec.linear_attention_layers, spec.attention_layers) == (4, 3, 1)
    assert (spec.mlp_layers, spec.dense_mlp_layers, spec.moe_layers) == (3, 1, 2)
    assert spec.block_pattern == "M-M*EME" and spec.rotary_dims == 0 and not spec.gated_mlp
    assert spec.num_params == _transformers_count(SMALL)
    # transformers 5's own spelling of the blocks reads the same; a dense model too
    listed = {k: v for k, v in SMALL.items() if k != "hybrid_override_pattern"}
    listed["layers_block_type"] = ["mamba", "mlp", "mamba", "attention", "moe", "mamba", "moe"]
    assert ModelSpec.from_hf_config(listed, "small") == spec
    dense = {k: v for k, v in SMALL.items() if "expert" not in k and "moe" not in k}
    dense["hybrid_override_pattern"] = "M-*-"
    d = ModelSpec.from_hf_config(dense, "dense")
    assert not d.is_moe and d.dense_mlp_layers == 2 and d.num_params == _transformers_count(dense)


def test_the_shared_mlp_is_n_shared_experts_wide_as_vllm_builds_it():
    """vLLM's NemotronHMoE makes the shared MLP n_shared_experts x moe_shared_expert_intermediate_size wide (1
    in every NVIDIA config; transformers reads the size alone); none at 0."""
    assert ModelSpec.from_hf_config(SMALL, "small").shared_expert_width == 256
    assert ModelSpec.from_hf_config({**SMALL, "n_shared_experts": 1}, "small").shared_expert_width == 256
    assert ModelSpec.from_hf_config({**SMALL, "n_shared_experts": 2}, "small").shared_expert_width == 512
    assert ModelSpec.from_hf_config({**SMALL, "n_shared_experts": 0}, "small").shared_expert_width == 0


@pytest.mark.parametrize("change, words", [
    ({"n_shared_experts": "two"}, "n_shared_experts must be a count"),
    ({"hybrid_override_pattern": "M-X"}, "hybrid_override_pattern"),
    ({"hybrid_override_pattern": "M-M-"}, "without attention"),
    ({"mlp_hidden_act": "silu"}, "squared ReLU"),
    ({"n_groups": 3}, "multiple of 3 groups"),
    ({"mamba_ssm_cache_dtype": "int8"}, "mamba_ssm_cache_dtype"),
])
def test_bad_configs_are_refused_in_one_line(change, words):
    with pytest.raises(PlannerError, match=words) as err:
        ModelSpec.from_hf_config({**SMALL, **change}, "small")
    assert "\n" not in str(err.value)


def test_mamba_state_and_its_split_under_tensor_parallelism():
    nano = resolve_model("nemotron-3-nano-30b-a3b").linear_attention
    # the convolution's last 3 inputs of x, B and C in bf16; 64 heads x 64 x 128 recurrent states in fp32
    assert nano.state_bytes_per_gpu(1, 2) == 3 * (4096 + 2 * 8 * 128) * 2 + 64 * 64 * 128 * 4
    assert nano.state_bytes_per_gpu(2, 2) * 2 == nano.state_bytes_per_gpu(1, 2)
    assert nano.in_proj_per_gpu(2) * 2 == nano.shapes(2688)[0][0]
    lone = Mamba2(layers=1, heads=8, head_dim=32, groups=1, state_size=16, conv_kernel=4)
    assert lone.groups_per_gpu(4) == 1                 # vLLM copies a lone group to every rank
    assert lone.in_proj_per_gpu(4) == 2 * (2 * 32 + 1) + 2 * 16
    with pytest.raises(PlannerError, match="groups"):
        nano.heads_per_gpu(16)                         # 8 groups over 16 ranks


def test_latent_projections_are_whole_on_every_rank():
    super_ = resolve_model("nemotron-3-super-120b-a12b")
    latent = super_.moe_layers * 2 * 4096 * 1024
    assert super_.whole_linear_params == latent
    assert super_.linear_params_per_gpu(4) == pytest.approx((super_.dense_linear_params - latent) / 4 + latent)
    assert super_.expert_shapes == ((2688, 1024), (1024, 2688))


def test_nvfp4_release_keeps_attention_and_some_mamba_projections_in_16_bits():
    nano = resolve_model("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4")
    fmt = recorded_format("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4")
    kept = kept_fractions(nano, fmt.excluded)
    assert kept["attention"] == (1.0, 1.0, 1.0, 1.0)
    assert kept["linear_attention"] == pytest.approx((6 / 23, 6 / 23))
    assert "mlp" not in kept and "shared_experts" not in kept
    all_nvfp4 = dataclasses.replace(fmt, excluded=())
    assert nano.weight_bytes_per_gpu(1, 2, fmt) > nano.weight_bytes_per_gpu(1, 2, all_nvfp4)


def test_cost_models_price_every_block_kind():
    step = StepShape(decode_seqs=16, decode_context=16 * 2048)
    measured = MeasuredCostModel("nemotron-3-super-120b-a12b", "b200", tp=2,
                                 weight_format=recorded_format("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-FP8"))
    terms = {t.name: t for t in measured.ledger(step).terms}
    assert terms["latent down-projection GEMM"].detail.startswith("b200_sxm gemm_fp8, m=16 n=1024 k=4096")
    assert "moe fp8" in terms["experts (fused MoE)"].detail and terms["experts (fused MoE)"].source == "table"
    assert terms["linear attention (conv + selective scan)"].source == "roofline"
    assert terms["all-reduce"].count == 48 + 40 + 1            # one per block and the embedding's
    assert terms["input RMSNorm + residual add"].count == 88 and "rotary embedding" not in terms
    assert "shared expert squared ReLU" in terms and "post-attention RMSNorm + residual add" not in terms
    roofline = RooflineCostModel("nemotron-3-super-120b-a12b", "b200", tp=2)
    parts = roofline.breakdown(step)
    assert parts["linear_attention"] > 0 and roofline.step_time(step) > parts["linear_attention"]
    # a longer context costs the Mamba-2 blocks nothing: only the 8 attention blocks read more
    longer = StepShape(decode_seqs=16, decode_context=16 * 8192)
    assert roofline.breakdown(longer)["linear_attention"] == parts["linear_attention"]


def test_simulates_with_states_in_the_kv_pool():
    dep = Deployment(model="nemotron-3-nano-30b-a3b", gpu="h100-sxm", max_model_len=8192)
    plan = plan_deployment(dep)
    nano = resolve_model("nemotron-3-nano-30b-a3b")
    # one attention layer's page holds one Mamba-2 layer's state (vLLM aligns the two)
    assert plan.block_size * nano.kv_cache_bytes(1, 2) >= nano.linear_attention.state_bytes_per_gpu(1, 2)
    run = simulate(dep, workload="random", concurrency=8, requests=24, params={"input_len": 1024, "output_len": 64})
    assert run.metrics.num_completed == 24 and run.metrics.tpot_mean > 0


def test_the_engine_refuses_to_profile_it_in_one_line(tmp_path):
    result = CliRunner().invoke(app, ["profile", "--gpu", "cpu", "--model", "nemotron-3-nano-30b-a3b", "--quick",
                                      "--out", str(tmp_path / "p.json")])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "does not run nemotron_h" in result.output
