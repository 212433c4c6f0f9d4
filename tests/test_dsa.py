"""DeepSeek-V3.2 and GLM-5 (DeepSeek Sparse Attention) in the planner: the indexer read from their configs, the
cache as vLLM lays it out (latent + indexer key per token, 64-token blocks), and the attention priced from
NVIDIA's DSA module timings or, for other shapes, by the roofline (index_topk keys per query)."""
import dataclasses
import json

import pytest

from engine.deployment import Deployment
from planner.catalog import resolve_model
from planner.catalog.quantization import format_from_config
from planner.catalog.sparse_attention import SparseIndexer
from planner.cost import tables
from planner.cost.measured import MeasuredCostModel
from planner.cost.roofline import RooflineCostModel
from planner.cost.shape import StepShape
from planner.cost.sparse import MODULE_GEMMS
from planner.deploy.memory import plan_memory
from planner.deploy.plan import plan_deployment
from planner.errors import PlannerError

V32 = resolve_model("deepseek-v3.2")
GLM5 = resolve_model("glm-5")
FP8_BLOCK = format_from_config({"quant_method": "fp8", "weight_block_size": [128, 128]})


def _config(spec, **extra) -> dict:
    return spec.to_hf_config().to_dict() | extra


def test_ids_configs_and_counts(tmp_path):
    assert resolve_model("deepseek-ai/DeepSeek-V3.2") is V32
    assert resolve_model("zai-org/GLM-5-FP8") is GLM5 and resolve_model("nvidia/GLM-5.1-NVFP4") is GLM5
    assert V32.sparse_indexer == SparseIndexer(heads=64, head_dim=128, topk=2048)
    assert GLM5.sparse_indexer == SparseIndexer(heads=32, head_dim=128, topk=2048)
    assert V32.num_params == 671_877_929_216 and GLM5.num_params == 743_911_199_232   # transformers' counts
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_config(V32)))
    assert resolve_model(str(path)).sparse_indexer == V32.sparse_indexer


def test_the_cache_holds_the_latent_and_the_indexer_key():
    """vLLM's bytes per token and layer: 576 bf16 values, or fp8_ds_mla's 656 bytes; and 132 for the
    indexer's FP8 key with its scale. Every TP rank holds them whole."""
    assert V32.kv_cache_bytes(8, 2) == 1152 + 132
    assert V32.kv_cache_bytes(8, 1) == 656 + 132
    assert V32.kv_bytes_per_token(2) == 61 * 1284
    memory = plan_memory(V32, "h200", tp=8, weight_format=FP8_BLOCK, block_size=64)
    assert memory.block_bytes_per_gpu == 61 * 1284 * 64


@pytest.mark.parametrize("gpu, latent", [("h200", 656), ("b200", 576)])
def test_an_fp8_cache_takes_the_layout_of_the_backend_vllm_picks_on_the_gpu(gpu, latent):
    """With an FP8 cache vLLM runs FlashMLA's sparse backend on Hopper (fp8_ds_mla, 656 bytes) and FlashInfer's
    on Blackwell (576 plain FP8 values); the plan, its blocks and the roofline's bytes per key follow it. A
    bf16 cache is 1,152 bytes on both."""
    plan = plan_deployment(Deployment(model="deepseek-v3.2", gpu=gpu, tp=8, kv_cache_dtype="fp8",
                                      max_model_len=32768))
    assert plan.memory.block_bytes_per_gpu == 61 * (latent + 132) * 64
    assert plan.model.kv_cache_bytes(8, 1) == latent + 132 and plan.model.kv_cache_bytes(8, 2) == 1152 + 132
    bf16 = plan_deployment(Deployment(model="deepseek-v3.2", gpu=gpu, tp=8, max_model_len=32768))
    assert bf16.memory.block_bytes_per_gpu == 61 * (1152 + 132) * 64
    assert plan_memory(V32, gpu, tp=8, weight_format=FP8_BLOCK, kv_dtype_bytes=1).block_bytes_per_gpu == (
        plan.memory.block_bytes_per_gpu)
    # a decode step's sparse attention reads index_topk latents: fewer bytes on B200 by the roofline
    step = StepShape(decode_seqs=256, decode_context=256 * 8192)
    as_planned, ds_mla = (RooflineCostModel(m, gpu, tp=8, weight_format=FP8_BLOCK, kv_cache_dtype="fp8")
                          for m in (plan.model, V32))
    assert (as_planned.step_time(step) < ds_mla.step_time(step)) == (gpu == "b200")


def test_the_plan_takes_vllms_64_token_blocks_on_hopper_and_blackwell_only():
    plan = plan_deployment(Deployment(model="deepseek-v3.2", gpu="h200", tp=8, max_model_len=32768))
    assert plan.block_size == 64 and plan.memory.block_size == 64
    assert plan.deployment.enable_prefix_caching
    with pytest.raises(PlannerError, match="H100, H200 and B200 only"):
        plan_deployment(Deployment(model="deepseek-v3.2", gpu="a100-80g", tp=8))


def test_the_measured_model_reads_nvidias_dsa_module():
    """The decode curve goes through the table's rows; the module's projections leave the GEMM terms."""
    model = MeasuredCostModel("deepseek-v3.2", "h200", tp=8, weight_format=FP8_BLOCK)
    row = next(r for r in tables.load_rows("h200_sxm", "dsa_generation")
               if r["model"] == "deepseek-ai/DeepSeek-V3.2" and r["num_heads"] == 16 and r["batch_size"] == 64
               and r["step"] == 8192 and r["kv_cache_dtype"] == "bfloat16" and r["gemm_type"] == "fp8_block")
    assert model.generation_attention(64, 8193) == pytest.approx(row["latency"], rel=0.01)   # 8192 cached + the new one
    ledger = model.ledger(StepShape(decode_seqs=64, decode_context=64 * 8193))
    names = {t.name for t in ledger.terms}
    assert not names & {f"{g} GEMM" for g in MODULE_GEMMS} and "experts (fused MoE)" in names
    assert ledger.total == pytest.approx(model.step_time(StepShape(decode_seqs=64, decode_context=64 * 8193)))


def test_a_cached_prefix_costs_the_indexer_more_pairs():
    """A chunk after a cached prefix: the module's price of the chunk as a fresh prompt, and the indexer's
    FP8 scores of the extra (query, key) pairs."""
    model = MeasuredCostModel("deepseek-v3.2", "h200", tp=8, weight_format=FP8_BLOCK)
    fresh = StepShape(prefill_seqs=1, prefill_tokens=2048, prefill_attn_pairs=2048 * 2049 // 2)
    cached = dataclasses.replace(fresh, prefill_attn_pairs=fresh.prefill_attn_pairs + 2048 * 30000)
    extra = model.step_time(cached) - model.step_time(fresh)
    assert extra == pytest.approx(61 * 2048 * 30000 * model._sparse.index_per_pair)
    assert 0 < extra < model.step_time(fresh)


def test_other_shapes_fall_back_to_the_roofline_parts():
    """A DSA model NVIDIA did not time: its indexer GEMMs are priced, and its attention by the roofline."""
    other = dataclasses.replace(V32, name="dsa-other", sparse_indexer=SparseIndexer(heads=32, head_dim=128, topk=1024))
    model = MeasuredCostModel(other, "h200", tp=8, weight_format=FP8_BLOCK)
    names = {t.name for t in model.ledger(StepShape(decode_seqs=8, decode_context=8 * 4096)).terms}
    assert {"indexer wq_b GEMM", "indexer wk + weights_proj GEMM"} <= names
    assert model.describe()["tables"]["generation"] == "DSA roofline"


@pytest.mark.parametrize("cost", ["measured", "roofline"])
def test_attention_reads_index_topk_keys_however_long_the_context(cost):
    """Past a few thousand tokens a longer context adds only the indexer's scores of the extra keys."""
    make = MeasuredCostModel if cost == "measured" else RooflineCostModel
    model = make(V32, "h200", tp=8, weight_format=FP8_BLOCK)
    step = [model.step_time(StepShape(decode_seqs=64, decode_context=64 * c)) for c in (8192, 16384, 32768)]
    assert step[0] < step[1] < step[2]
    assert step[2] - step[1] == pytest.approx(2 * (step[1] - step[0]), rel=0.25)     # linear in the keys
    dense = make("deepseek-v3", "h200", tp=8, weight_format=FP8_BLOCK)
    grows = [dense.step_time(StepShape(decode_seqs=64, decode_context=64 * c)) for c in (8192, 32768)]
    assert step[2] - step[0] < grows[1] - grows[0]     # dense MLA reads every latent
