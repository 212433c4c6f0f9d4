"""DeepSeek-V4 (one shared key/value head over a sliding window and compressed rows, hyper-connections, MXFP4
experts): config reading, the cache vLLM keeps, memory, and what the roofline prices
(planner/catalog/deepseek_v4.py, planner/cost/compressed.py)."""
import json

import pytest
from typer.testing import CliRunner

from planner import Deployment
from planner.catalog import resolve_model
from planner.catalog.deepseek_v4 import CSA, HCA, SLIDING
from planner.catalog.models import ModelSpec
from planner.catalog.quantization import checkpoint_format
from planner.cli.app import app
from planner.cost.roofline import RooflineCostModel
from planner.cost.shape import StepShape
from planner.deploy.memory import kv_block_layout
from planner.deploy.plan import plan_deployment
from planner.deploy.state_cache import state_blocks
from planner.errors import PlannerError
from planner.runs.pipeline import build_cost_model
from reference_helpers import transformers_param_count

# a small config.json in the shape DeepSeek ships it: compress_ratios with one more entry (the MTP layer's)
SMALL = {"model_type": "deepseek_v4", "architectures": ["DeepseekV4ForCausalLM"], "num_hidden_layers": 5,
         "hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 64, "q_lora_rank": 96,
         "o_lora_rank": 48, "o_groups": 4, "qk_rope_head_dim": 16, "vocab_size": 1000, "moe_intermediate_size": 64,
         "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "index_n_heads": 4,
         "index_head_dim": 32, "index_topk": 8, "sliding_window": 16, "hc_mult": 4, "hc_sinkhorn_iters": 20,
         "num_hash_layers": 2, "compress_ratios": [0, 4, 128, 4, 128, 0], "max_position_embeddings": 4096,
         "rope_theta": 10000, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "expert_dtype": "fp4",
         "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128], "fmt": "e4m3"}}



def test_config_json_read_as_vllm_builds_it():
    spec = ModelSpec.from_hf_config(SMALL, "small")
    ca = spec.compressed_attention
    assert (ca.sliding_layers, ca.csa_layers, ca.hca_layers, ca.hash_layers) == (1, 2, 2, 2)
    assert [(layers, kind.compress_ratio) for layers, kind in spec.attention_kinds] == [(1, SLIDING), (2, CSA),
                                                                                        (2, HCA)]
    assert spec.rotary_dims == 16 and spec.moe_layers == 5 and spec.checkpoint_quantization == "fp8-block+mxfp4-experts"
    # wq_b, wo_a (4 groups of 2 heads x 64 -> 48), wo_b; wq_a and wkv held whole, the indexer's wq_b on CSA layers
    csa = dict((kind.compress_ratio, kind) for _, kind in spec.attention_kinds)[CSA]
    assert csa.attention_shapes == ((512, 96), (192, 128), (256, 192), (96, 256), (64, 256), (128, 96))
    assert csa.replicated_linear_shapes == ((96, 256), (64, 256), (128, 96))
    assert spec.num_params == transformers_param_count(spec)


def test_transformers_spelling_reads_the_same():
    kinds = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
    written = {k: v for k, v in SMALL.items() if k not in ("compress_ratios", "num_hash_layers", "qk_rope_head_dim")}
    written |= {"layer_types": [kinds[r] for r in SMALL["compress_ratios"][:5]], "partial_rotary_factor": 0.25,
                "mlp_layer_types": ["hash_moe", "hash_moe", "moe", "moe", "moe"]}
    assert ModelSpec.from_hf_config(written, "small") == ModelSpec.from_hf_config(SMALL, "small")
    # transformers 5 moves expert_dtype into quantization_config
    inside = {k: v for k, v in written.items() if k != "expert_dtype"}
    inside["quantization_config"] = SMALL["quantization_config"] | {"expert_dtype": "fp4"}
    assert ModelSpec.from_hf_config(inside, "small").checkpoint_quantization == "fp8-block+mxfp4-experts"


@pytest.mark.parametrize("change, words", [
    ({"compress_ratios": [0, 4, 64, 4, 128]}, "compress ratios"),
    ({"compress_ratios": [0, 4]}, "must give each of its 5 layers"),
    ({"num_key_value_heads": 2}, "one shared key/value head"),
    ({"o_groups": 3}, "output groups that divide"),
    ({"index_topk": None}, "index_topk must be a positive integer"),
])
def test_configs_the_planner_cannot_price_are_refused_in_one_line(change, words):
    with pytest.raises(PlannerError, match=words):
        ModelSpec.from_hf_config(SMALL | change, "small")


def test_catalog_counts_equal_transformers():
    """Both releases' counts as transformers 5.25 builds them (checked on the meta device when the entries were
    written); the cards' 13B and 49B active leave out the embedding."""
    flash, pro = resolve_model("deepseek-ai/DeepSeek-V4-Flash"), resolve_model("deepseek-v4-pro")
    assert (flash.num_params, pro.num_params) == (284_332_230_231, 1_572_997_179_491)
    for spec, card in ((flash, 13e9), (pro, 49e9)):
        assert spec.active_params - spec.embedding_params == pytest.approx(card, rel=0.03)


def test_cache_from_first_principles():
    """An fp8_ds_mla row is 448 FP8 values, 7 scales, 64 bf16 rotary values and a pad byte; pages round up to
    576 bytes. A 256-token block: a CSA layer's 64 rows (37,440) and 64 indexer keys (8,640), an HCA layer's 2
    rows (1,728). A sequence holds three 64-token blocks of window rows on every layer and each compressor's
    state: 3 blocks of 4 tokens (CSA, 8,192 bytes a token), 3 of the indexer's (2,048), 17 of 8 (HCA, 4,096)."""
    flash = resolve_model("deepseek-v4-flash")
    assert flash.kv_cache_bytes() == 448 + 7 + 128 + 1
    block = 21 * (37_440 + 8_640) + 20 * 1_728
    assert kv_block_layout(flash, tp=8, kv_dtype_bytes=2, block_size=256, max_num_seqs=1024) == (block, 0)
    sequence = 43 * 3 * 37_440 + 21 * (3 * 32_832 + 3 * 8_640) + 20 * 17 * 32_832
    assert flash.kv_bytes_per_context(1) == sequence + block
    assert flash.kv_bytes_per_context(8192) == sequence + 32 * block
    assert state_blocks(flash) == -(-sequence // block) == 19
    assert flash.kv_bytes_per_token() == -(-block // 256)


def test_plan_holds_mxfp4_experts_and_prices_the_cache_in_fp8():
    plan = plan_deployment(Deployment(model="deepseek-v4-flash", gpu="h200", tp=2))
    flash = plan.model
    assert plan.weight_format.expert_scheme == "mxfp4" and plan.deployment.kv_cache_dtype == "fp8"
    assert any("fp8_ds_mla" in w for w in plan.warnings)
    nk = sum(n * k for n, k in flash.expert_shapes)
    assert plan.memory.expert_bytes_per_gpu == 43 * 256 * (nk // 2 + nk // 32) // 2      # E2M1 + an E8M0 per 32
    assert plan.block_size == 256 and plan.state_blocks == 19
    fp8 = plan_deployment(Deployment(model="sgl-project/DeepSeek-V4-Flash-FP8", gpu="h200", tp=4))
    # sgl-project's re-release keeps its experts in FP8 too: nearly twice the bytes (at twice the GPUs: 4 against 2)
    assert fp8.weight_format.expert_scheme == ""
    assert fp8.memory.expert_bytes_per_gpu * 4 > 1.8 * plan.memory.expert_bytes_per_gpu * 2


def test_a_cache_its_states_fill_is_refused_without_a_context_of_zero_to_lower_to():
    with pytest.raises(PlannerError, match=r"^the KV cache holds 0 tokens \(19 blocks x 256, 19 of them a "
                                           r"sequence's states\) .* raise --num-gpu-blocks \(now 19\)$"):
        plan_deployment(Deployment(model="deepseek-v4-flash", gpu="b200", tp=8, max_model_len=1024,
                                   num_gpu_blocks=19))


def test_a_model_folder_declares_its_mxfp4_experts_at_the_top_level(tmp_path):
    """DeepSeek's config.json keeps expert_dtype beside quantization_config, not in it."""
    (tmp_path / "config.json").write_text(json.dumps(SMALL))
    fmt = checkpoint_format(str(tmp_path))
    assert (fmt.method, fmt.scheme, fmt.expert_scheme) == ("fp8", "fp8-block", "mxfp4")
    assert fmt.experts.scheme == "mxfp4" and "experts in mxfp4" in fmt.describe()
    # NVIDIA's NVFP4 re-release keeps quant_method fp8 (its other layers stay block FP8) and names the experts'
    # format in moe_quant_algo, as vLLM's DeepseekV4 quantization config reads it; `ignore` lists the FP8 layers,
    # which vLLM's Fp8Config does not read as unquantized
    nvidia = {**SMALL, "quantization_config": {**SMALL["quantization_config"], "quant_algo": "MIXED_PRECISION",
                                               "moe_quant_algo": "NVFP4", "ignore": ["*.attn.*", "head"],
                                               "quantized_layers": {"layers.0.ffn.experts": {"quant_algo": "NVFP4"}}}}
    (tmp_path / "config.json").write_text(json.dumps(nvidia))
    fmt = checkpoint_format(str(tmp_path))
    assert (fmt.scheme, fmt.expert_scheme, fmt.excluded) == ("fp8-block", "nvfp4", ())
    assert fmt.experts.scheme == "nvfp4" and "experts in nvfp4 (E4M3 scale per 16)" in fmt.describe()
    # per-layer formats without the experts' algorithm: refused in one line, not read as DeepSeek's MXFP4 experts
    del nvidia["quantization_config"]["moe_quant_algo"]
    (tmp_path / "config.json").write_text(json.dumps(nvidia))
    with pytest.raises(PlannerError, match="moe_quant_algo None"):
        checkpoint_format(str(tmp_path))


def test_nvidia_nvfp4_release_stores_its_experts_in_nvfp4_and_reads_the_kernel_each_gpu_runs():
    """nvidia/DeepSeek-V4-Flash-NVFP4: E2M1 pairs with an E4M3 scale per 16 and two fp32 scales per expert
    matrix, where DeepSeek's MXFP4 has an E8M0 per 32; the measured model reads the NVFP4 fused-MoE rows NVIDIA
    timed on B200, and on Hopper the Marlin MoE rows vLLM's kernel there was timed in."""
    plans = {name: plan_deployment(Deployment(model=name, gpu="b200", tp=2))
             for name in ("deepseek-ai/DeepSeek-V4-Flash", "nvidia/DeepSeek-V4-Flash-NVFP4")}
    mxfp4, nvfp4 = plans.values()
    assert nvfp4.weight_format.expert_scheme == "nvfp4" and nvfp4.weight_format.scheme == "fp8-block"
    shapes = mxfp4.model.expert_shapes
    per_expert = {fmt: sum(size(n * k) for n, k in shapes) for fmt, size in
                  (("mxfp4", lambda nk: nk // 2 + nk // 32), ("nvfp4", lambda nk: nk // 2 + nk // 16 + 8))}
    assert (nvfp4.memory.expert_bytes_per_gpu - mxfp4.memory.expert_bytes_per_gpu
            == 43 * 256 * (per_expert["nvfp4"] - per_expert["mxfp4"]) // 2)
    assert nvfp4.memory.weight_bytes_per_gpu - mxfp4.memory.weight_bytes_per_gpu == pytest.approx(
        nvfp4.memory.expert_bytes_per_gpu - mxfp4.memory.expert_bytes_per_gpu, abs=1)
    cost = build_cost_model(nvfp4, "auto")
    experts = {t.name: t for t in cost.ledger(StepShape(decode_seqs=64, decode_context=64 * 4096)).terms}[
        "experts (fused MoE)"]
    assert cost.name.startswith("measured") and experts.source == "table" and "nvfp4" in experts.detail
    # Hopper has no FP4 tensor cores: vLLM runs NVFP4 experts on its Marlin MoE, NVIDIA's int4_wo rows
    hopper = build_cost_model(plan_deployment(Deployment(model="nvidia/DeepSeek-V4-Flash-NVFP4", gpu="h200", tp=2)))
    experts = {t.name: t for t in hopper.ledger(StepShape(decode_seqs=64, decode_context=64 * 4096)).terms}[
        "experts (fused MoE)"]
    assert hopper.name.startswith("measured") and experts.source == "scaled" and "int4_wo" in experts.detail


@pytest.mark.parametrize("deployment, words", [
    (Deployment(model="deepseek-v4-flash", gpu="l40s", tp=8), "H100, H200 and B200 only"),
    (Deployment(model="deepseek-v4-flash", gpu="h200", tp=2, policy="paper"), "vLLM v1"),
    (Deployment(model="deepseek-v4-flash", gpu="h200", tp=16), "8 output groups"),
])
def test_deployments_vllm_refuses_are_refused(deployment, words):
    with pytest.raises(PlannerError, match=words):
        plan_deployment(deployment)


def test_roofline_prices_slots_not_context_below_the_top_k():
    """A decoding query costs its window, top-k and HCA padding slots whatever its context below them; HCA rows
    (one per 128 tokens) and the indexer's scores (one per 4) grow with it."""
    model = RooflineCostModel("deepseek-v4-flash", "h200", tp=2, kv_cache_dtype="fp8")
    c = model._compressed
    short, long = (StepShape(decode_seqs=8, decode_context=8 * n) for n in (1024, 65536))
    assert c.decode_slots_per_query == 43 * 128 + 21 * 512 + 20 * 128
    grow = c.decode(long) - c.decode(short)
    assert grow == pytest.approx(20 * 8 * (65536 - 1024) // 128 * c.decode_per_slot
                                 + 21 * 8 * (65536 - 1024) // 4 * c.index_per_key)
    parts = model.breakdown(long)
    assert model.step_time(long) == pytest.approx(sum(v for k, v in parts.items() if k != "bound"))
    assert parts["compressors"] > 0 and parts["decode_attention"] > c.decode(long) * 0.999


def test_simulate_from_the_cli():
    result = CliRunner().invoke(app, ["simulate", "--model", "deepseek-ai/DeepSeek-V4-Flash", "--gpu", "h200",
                                      "--tp", "2", "--workload", "random", "-p", "input_len=2048",
                                      "-p", "output_len=64", "--concurrency", "16", "--requests", "32",
                                      "--max-model-len", "8192"])
    assert result.exit_code == 0, result.output
    assert "block 256" in result.output and "32 / 0 / 0" in result.output
