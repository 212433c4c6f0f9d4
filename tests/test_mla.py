"""DeepSeek-V2/V3/R1 and Kimi-K2: multi-head latent attention and shared experts in the planner."""
import dataclasses
import json

import pytest

from engine.deployment import Deployment
from planner.catalog import mla, resolve_model
from planner.catalog.models import ModelSpec
from planner.catalog.quantization import catalog_checkpoint_format
from planner.cost import tables
from planner.cost.measured import MeasuredCostModel
from planner.cost.roofline import RooflineCostModel
from planner.cost.shape import StepShape
from planner.deploy.memory import plan_memory
from planner.deploy.speculation import proposer_model
from planner.errors import PlannerError

# DeepSeek-V2-Lite's config.json: no q compression (q_lora_rank null), two shared experts, one dense layer
FP8_BLOCK = catalog_checkpoint_format("fp8-block", source="DeepSeek-V3's checkpoint")
V2_LITE = dict(model_type="deepseek_v2", hidden_size=2048, num_hidden_layers=27, num_attention_heads=16,
               num_key_value_heads=16, q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128,
               qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=64, n_shared_experts=2, num_experts_per_tok=6,
               moe_intermediate_size=1408, intermediate_size=10944, first_k_dense_replace=1, moe_layer_freq=1,
               vocab_size=102400, max_position_embeddings=163840, rms_norm_eps=1e-6, tie_word_embeddings=False)


def test_deepseek_ids_resolve_to_the_v3_architecture():
    for name in ("deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-R1", "deepseek-ai/DeepSeek-R1-0528",
                 "deepseek-ai/DeepSeek-V3-0324", "deepseek-r1"):
        assert resolve_model(name).name == "deepseek-v3"
    assert resolve_model("moonshotai/Kimi-K2-Instruct").name == "kimi-k2"
    # a checkpoint re-published by another organisation keeps the name of the one it quantizes
    assert resolve_model("nvidia/DeepSeek-R1-0528-FP4").name == "deepseek-v3"
    # a distill is its base model, not DeepSeek-V3
    assert resolve_model("deepseek-ai/DeepSeek-R1-Distill-Llama-70B").name == "llama-3.1-70b"


def test_deepseek_v3_counts_and_cache():
    m = resolve_model("deepseek-v3")
    assert m.num_params == 671_026_404_352          # transformers' DeepseekV3ForCausalLM, parameter for parameter
    assert m.active_params == pytest.approx(37e9, rel=0.03)
    assert m.dense_layers == 3 and m.moe_layers == 58 and m.shared_experts == 1
    # the cache holds a 512-value latent and a 64-value rotary key per token and layer: 70,272 bytes in bf16,
    # where per-head K and V (128 heads x 192) would take 5.99 MB
    assert m.kv_bytes_per_token(2) == 61 * 576 * 2
    assert m.kv_cache_width(1) == m.kv_cache_width(8) == 576


def test_v2_lite_config_file_counts_like_transformers(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    path = tmp_path / "DeepSeek-V2-Lite" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(V2_LITE))
    spec = resolve_model(str(path))
    assert spec.q_lora_rank == 0 and spec.shared_experts == 2 and spec.dense_layers == 1
    config = transformers.DeepseekV2Config(**{k: v for k, v in V2_LITE.items() if k != "model_type"})
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(config)
    assert spec.num_params == sum(p.numel() for p in hf.parameters()) == 15_706_484_224


def test_bad_latent_shapes_are_named():
    with pytest.raises(PlannerError, match="qk_rope_head_dim"):
        ModelSpec.from_hf_config({**V2_LITE, "qk_rope_head_dim": None}, name="bad")
    with pytest.raises(PlannerError, match="latent attention needs"):
        ModelSpec.from_hf_config({**V2_LITE, "v_head_dim": 0}, name="bad")


def test_tensor_parallel_splits_heads_not_the_latent():
    """vLLM keeps the down-projections and the latent cache whole on every rank: the KV block of a GPU
    does not shrink with TP, and the replicated weights are not divided."""
    m = resolve_model("deepseek-v3")
    replicated = m.num_layers * sum(n * k for n, k in mla.replicated_shapes(m))
    assert replicated == 61 * (1536 + 576) * 7168
    w1, w8 = m.weight_bytes_per_gpu(1), m.weight_bytes_per_gpu(8)
    # 8 GPUs hold 8 copies of the replicated parts and one of everything else
    assert 8 * w8 - w1 == pytest.approx(7 * m.replicated_params * 2, rel=1e-6)
    assert m.replicated_params > replicated
    # in FP8 too: the down-projections' bytes (with their block scales) on every rank, the rest split
    whole = 61 * sum(FP8_BLOCK.matrix_bytes(n, k) for n, k in mla.replicated_shapes(m))
    split = m.linear_bytes_per_gpu(FP8_BLOCK, 1) - whole
    assert m.linear_bytes_per_gpu(FP8_BLOCK, 8) == -(-split // 8) + whole


def test_memory_plan_block_bytes_do_not_shrink_with_tp():
    plans = [plan_memory("deepseek-v3", "h200", tp=8, max_num_batched_tokens=8192, weight_format=FP8_BLOCK),
             plan_memory("deepseek-v3", "h200", tp=4, dp=2, expert_parallel=True, max_num_batched_tokens=8192,
                         weight_format=FP8_BLOCK)]
    for plan in plans:
        assert plan.block_bytes_per_gpu == 16 * 61 * 576 * 2
    assert plans[0].weight_bytes_per_gpu > 0 and plans[0].num_gpu_blocks > 0


def _decode(batch: int, context: int) -> StepShape:
    return StepShape(decode_seqs=batch, decode_context=batch * context)


def test_roofline_prices_decode_on_the_latent():
    m = resolve_model("deepseek-v3")
    model = RooflineCostModel(m, "h200", tp=8)
    short, long = model.breakdown(_decode(32, 1024)), model.breakdown(_decode(32, 9216))
    per_key = (long["decode_attention"] - short["decode_attention"]) / (32 * 8192)
    gpu = model.gpu
    bytes_bound = 61 * 576 * 2 / (gpu.memory_bandwidth * 0.8)
    flops_bound = 61 * 16 * mla.decode_flops_per_key(m) / (gpu.peak_flops(2) * 0.6)
    assert per_key == pytest.approx(max(bytes_bound, flops_bound) * model.block_size_factor, rel=1e-9)
    # at TP 1 all 128 heads multiply against each latent key: compute-bound, 8x the FLOPs of TP 8
    assert RooflineCostModel(m, "h200", tp=1)._decode_per_key > model._decode_per_key


def test_measured_model_reads_nvidias_mla_module_and_prices_the_rest():
    model = MeasuredCostModel("deepseek-v3", "h200", tp=8, weight_format=FP8_BLOCK)
    ledger = model.ledger(_decode(32, 2048))
    names = {t.name: t for t in ledger.terms}
    for term in ("shared expert gate+up GEMM", "shared expert down GEMM", "experts (fused MoE)", "attention (decode)"):
        assert names[term].source == "table", term
    # the module times the projections, latent norms, rotary and cache write: they are not priced again
    assert not [n for n in names if n.startswith(("q_a", "q_b", "kv_b", "o projection", "qkv", "rotary",
                                                  "KV-cache write", "q and KV latent"))]
    assert "mla_generation" in names["attention (decode)"].detail
    assert ledger.total == pytest.approx(model.step_time(_decode(32, 2048)))
    row = next(r["latency"] for r in tables.load_rows("h200_sxm", "mla_generation")
               if r["num_heads"] == 16 and r["kv_cache_dtype"] == "bfloat16" and r["gemm_type"] == "fp8_block"
               and r["batch_size"] == 32 and r["step"] == 2048)
    assert model.generation_attention(32, 2049) == pytest.approx(row, rel=0.02)      # 2048 cached + the new one
    # Kimi-K2 is DeepSeek-V3's layer at half the heads: at TP 4 it reads the same 16-head rows
    kimi = MeasuredCostModel("kimi-k2", "h200", tp=4, weight_format=FP8_BLOCK)
    assert kimi.generation_attention(32, 2049) == pytest.approx(model.generation_attention(32, 2049))


def test_an_mla_shape_nvidia_never_timed_is_priced_by_the_roofline():
    lite = MeasuredCostModel(ModelSpec.from_hf_config(V2_LITE, name="deepseek-v2-lite"), "h200")
    ledger = lite.ledger(_decode(32, 2048))
    names = {t.name: t for t in ledger.terms}
    assert names["q GEMM"].source == names["kv_b GEMM"].source == "table"
    assert names["q_a + kv_a GEMM"].detail.split(", m=32 ")[1].startswith("n=576 k=2048")   # kv_a alone: no q_a
    attention = names["attention (decode)"]
    assert attention.source == "roofline" and lite.describe()["tables"]["generation"] == "MLA roofline"
    # decode attention is affine in the context: the floor plus the latent's bytes (or FLOPs) per key
    longer = lite.decode_attention(_decode(32, 4096))
    assert longer - attention.seconds == pytest.approx(27 * 32 * 2048 * lite._latent["decode_per_key"], rel=1e-6)


def test_fp8_checkpoint_and_fp8_kv():
    plan = plan_memory("deepseek-v3", "h200", tp=8, max_num_batched_tokens=8192, kv_dtype_bytes=1,
                       weight_format=FP8_BLOCK)
    assert plan.block_bytes_per_gpu == 16 * 61 * 576
    fp8 = MeasuredCostModel("deepseek-v3", "h200", tp=8, kv_cache_dtype="fp8", weight_format=FP8_BLOCK)
    bf16 = MeasuredCostModel("deepseek-v3", "h200", tp=8, weight_format=FP8_BLOCK)
    step = _decode(64, 8192)
    assert fp8.decode_attention(step) < bf16.decode_attention(step)


def test_one_layer_spec_is_consistent():
    m = dataclasses.replace(resolve_model("kimi-k2"), num_layers=1, dense_layers=0)
    assert m.moe_layers == 1 and m.kv_bytes_per_token(2) == 576 * 2


def test_speculative_heads_of_deepseek():
    """DeepSeek's MTP head is one of its MoE layers (latent attention, routed and shared experts); an EAGLE
    head is a plain Llama layer of the target's width, with no latent or experts."""
    target = resolve_model("deepseek-v3")
    mtp, shares = proposer_model(Deployment(model="deepseek-v3", speculative="mtp:1"), target)
    assert shares and mtp.num_layers == 1 and mtp.moe_layers == 1 and mtp.is_mla and mtp.shared_experts == 1
    eagle, _ = proposer_model(Deployment(model="deepseek-v3", speculative="eagle:2"), target)
    assert not eagle.is_mla and not eagle.is_moe and eagle.head_size == 7168 // 128
    assert eagle.kv_bytes_per_token(2) == 2 * 128 * 56 * 2
