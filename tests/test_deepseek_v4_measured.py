"""DeepSeek-V4 in the measured model (planner/cost/measured_compressed.py): each layer's attention module and the
hyper-connections read from NVIDIA's timed vLLM 0.24 tables, the MXFP4 experts in the kernel vLLM runs per GPU."""
import dataclasses

import pytest

from planner.catalog import resolve_gpu, resolve_model
from planner.catalog.quantization import recorded_format
from planner.cost import tables
from planner.cost.measured import MeasuredCostModel
from planner.cost.select import select_cost_model
from planner.cost.shape import StepShape
from planner.errors import PlannerError

FLASH = resolve_model("deepseek-v4-flash")
RELEASED = recorded_format("deepseek-ai/DeepSeek-V4-Flash")      # FP8 blocks, MXFP4 experts


def measured(gpu: str = "h200", tp: int = 2, model=FLASH) -> MeasuredCostModel:
    return MeasuredCostModel(model, gpu, tp=tp, weight_format=RELEASED, kv_cache_dtype="fp8")


def timed(table: str, ratio: int, **where) -> float:
    """One raw row of h200's V4-Flash table at 32 heads (TP 2)."""
    return next(r["latency"] for r in tables.load_rows("h200_sxm", table)
                if r["model"] == "sgl-project/DeepSeek-V4-Flash-FP8" and r["num_heads"] == 32
                and r["compress_ratio"] == ratio and all(r[k] == v for k, v in where.items()))


@pytest.mark.parametrize("batch, cached", [(64, 4096), (256, 2048)])
def test_decode_is_the_layers_mix_of_the_timed_modules(batch, cached):
    # 21 CSA layers, 20 HCA layers, and 2 window-only layers at the HCA price within the window
    want = (21 * timed("dsv4_generation", 4, batch_size=batch, step=cached)
            + 20 * timed("dsv4_generation", 128, batch_size=batch, step=cached)
            + 2 * timed("dsv4_generation", 128, batch_size=batch, step=128)) / 43
    model = measured()
    assert model.generation_attention(batch, cached + 1) == pytest.approx(want, rel=1e-3)
    step = StepShape(decode_seqs=batch, decode_context=batch * (cached + 1))
    assert model.decode_attention(step) == pytest.approx(43 * model.generation_attention(batch, cached + 1))


def test_prefill_reads_the_cached_prefix_of_each_timed_length():
    model = measured()
    fresh = (21 * timed("dsv4_context", 4, batch_size=4, isl=1024, step=2048)
             + 20 * timed("dsv4_context", 128, batch_size=4, isl=1024, step=2048)
             + 2 * timed("dsv4_context", 128, batch_size=4, isl=1024, step=0)) / 43
    assert model._compressed.prefill(4, 1024, 2048)[0] == pytest.approx(fresh, rel=1e-9)
    # the step's mean prefix from its pairs: 4 chunks of 1024 tokens, each after 2048 cached ones
    chunks = StepShape(prefill_seqs=4, prefill_tokens=4096, prefill_attn_pairs=4 * (1024 * 2048 + 1024 * 1025 // 2))
    assert model.ledger(chunks).by_group()["attention"] == pytest.approx(43 * fresh, rel=1e-9)
    # a longer prefix costs more; between timed prefixes the price lies between theirs
    none, some, more = (model._compressed.prefill(1, 4096, p)[0] for p in (0, 1000, 2048))
    assert none < some < more


def test_the_ledger_prices_what_the_module_leaves_out_once():
    model = measured()
    terms = {t.name: t for t in model.ledger(StepShape(decode_seqs=64, decode_context=64 * 4096)).terms}
    # projections, rotary and cache writes are inside the timed module
    assert not [n for n in terms if n.startswith(("qkv", "o projection", "rotary", "KV-cache write"))]
    mhc = tables.load_rows("h200_sxm", "mhc")
    pre, post = (next(r["latency"] for r in mhc if r["kernel"] == k and r["hidden_size"] == 4096
                      and r["num_tokens"] == 64) for k in ("pre", "post"))
    assert terms["hyper-connections (mHC pre + post)"].seconds == pytest.approx(43 * (pre + post))
    assert {"all-reduce", "shared expert gate+up GEMM", "router GEMM", "experts (fused MoE)"} <= set(terms)
    assert "dsv4_generation" in terms["attention (decode)"].detail


def test_mxfp4_experts_in_the_kernel_vllm_runs_on_each_gpu():
    hopper = {t.name: t for t in measured("h200").ledger(StepShape(decode_seqs=64, decode_context=64 * 4096)).terms}
    blackwell = {t.name: t for t in measured("b200").ledger(StepShape(decode_seqs=64, decode_context=64 * 4096)).terms}
    # Blackwell: NVIDIA timed V4's own MXFP4 x MXFP8 experts; Hopper: only gpt-oss's MXFP4 Triton kernel
    assert blackwell["experts (fused MoE)"].source == "table" and "w4a8_mxfp4_mxfp8" in blackwell[
        "experts (fused MoE)"].detail
    assert hopper["experts (fused MoE)"].source == "scaled" and "w4a16_mxfp4" in hopper["experts (fused MoE)"].detail
    fp8 = MeasuredCostModel(FLASH, "h200", tp=2, weight_format=recorded_format("sgl-project/DeepSeek-V4-Flash-FP8"),
                            kv_cache_dtype="fp8")
    assert "moe fp8_block" in fp8.name


def test_auto_reads_the_tables_and_an_untimed_shape_falls_back_to_the_roofline():
    chosen = select_cost_model(FLASH, resolve_gpu("h200"), tp=2, block_size=256)
    assert chosen.name.startswith("measured") and "dsv4" in " ".join(chosen.describe()["notes"])
    wider = dataclasses.replace(FLASH, name="v4-wide-window", compressed_attention=dataclasses.replace(
        FLASH.compressed_attention, window=256))
    with pytest.raises(PlannerError, match="no timed DeepSeek-V4 attention module"):
        measured(model=wider)
    fallback = select_cost_model(wider, resolve_gpu("h200"), tp=2, block_size=256)
    assert fallback.name.startswith("roofline") and "DeepSeek-V4" in fallback.profile_note


def test_every_split_vllm_allows_is_timed():
    pro = resolve_model("deepseek-v4-pro")
    for gpu in ("h100", "h200", "b200"):
        for tp in (1, 2, 4, 8):
            assert measured(gpu, tp).generation_attention(8, 1025) > 0
            assert measured(gpu, tp, pro).generation_attention(8, 1025) > 0
