"""Roofline cost model: bounds land where the hardware says, time grows with work.
(Its speed per call is measured by bench/bench_cost_model_step_time.py, not asserted here.)"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.catalog import resolve_gpu, resolve_model
from planner.cost import CostModel, RooflineCostModel, RooflineEfficiency, StepShape, prefill_attn_pairs
from planner.errors import PlannerError

OPT13B_A100 = RooflineCostModel("opt-13b", "a100")


def prefill(n, cached=0):
    return StepShape(prefill_seqs=1, prefill_tokens=n, prefill_attn_pairs=prefill_attn_pairs(n, cached))


def test_shape_properties():
    s = StepShape(prefill_seqs=2, prefill_tokens=30, decode_seqs=5, decode_context=500)
    assert (s.total_tokens, s.batch_size, s.is_empty) == (35, 7, False)
    assert StepShape().is_empty
    assert not StepShape(swap_blocks=1).is_empty
    assert prefill_attn_pairs(4) == 10 and prefill_attn_pairs(2, cached_tokens=3) == 2 * 3 + 3


def test_is_a_cost_model_and_names_its_source():
    assert isinstance(OPT13B_A100, CostModel)
    assert OPT13B_A100.name == "roofline(a100-40g)"
    assert RooflineCostModel("opt-66b", "a100", tp=4).name == "roofline(4xa100-40g)"
    assert OPT13B_A100.describe()["efficiency"] == {"compute": 0.6, "memory": 0.8, "interconnect": 0.7}


def test_empty_step_costs_nothing():
    assert OPT13B_A100.step_time(StepShape()) == 0.0


def test_decode_batch1_is_weight_bandwidth_bound():
    m, gpu = resolve_model("opt-13b"), resolve_gpu("a100")
    shape = StepShape(decode_seqs=1, decode_context=128)
    parts = OPT13B_A100.breakdown(shape)
    assert parts["bound"]["linear"] == "memory"
    weights_time = m.weight_bytes(2) / (gpu.memory_bandwidth * 0.8)       # 25.7 GB / 1.24 TB/s ~ 20.7 ms
    assert 0.019 < weights_time < 0.022
    t = OPT13B_A100.step_time(shape)
    assert t == pytest.approx(weights_time + parts["cpu"], rel=0.02)


def test_prefill_2048_is_compute_bound():
    m = resolve_model("opt-13b")
    shape = prefill(2048)
    parts = OPT13B_A100.breakdown(shape)
    assert parts["bound"]["linear"] == "compute"
    assert parts["bound"]["prefill_attention"] == "compute"
    flops = 2048 * m.flops_per_token() + 4 * m.num_layers * m.q_size * prefill_attn_pairs(2048)
    assert OPT13B_A100.step_time(shape) == pytest.approx(flops / (312e12 * 0.6), rel=0.05)
    # a 2048-token prefill costs far more than a decode step, far less than 2048 decode steps
    decode = OPT13B_A100.step_time(StepShape(decode_seqs=1, decode_context=2048))
    assert 5 * decode < OPT13B_A100.step_time(shape) < 100 * decode


def test_decode_attention_reads_the_kv_cache():
    m = resolve_model("opt-13b")
    a = OPT13B_A100.step_time(StepShape(decode_seqs=64, decode_context=64 * 100))
    b = OPT13B_A100.step_time(StepShape(decode_seqs=64, decode_context=64 * 1100))
    kv_read = 64 * 1000 * m.kv_bytes_per_token(2) / (1.555e12 * 0.8)
    assert b - a == pytest.approx(kv_read, rel=1e-6)


def test_a_short_chunk_after_a_long_context_reads_that_context_back():
    # 16 tokens after 8,000 cached: their attention reads the cached K/V as one decode row at that context
    # does (before, priced by its pairs' FLOPs alone, it cost a third of that row); a long chunk stays
    # compute-bound.
    m = RooflineCostModel("llama-3.1-8b", "h100-sxm")
    chunk = StepShape(prefill_seqs=1, prefill_tokens=16, prefill_attn_pairs=prefill_attn_pairs(16, 8000),
                      prefill_context=8000)
    row = m.breakdown(StepShape(decode_seqs=1, decode_context=8000))["decode_attention"]
    parts = m.breakdown(chunk)
    assert parts["bound"]["prefill_attention"] == "memory"
    assert parts["prefill_attention"] == pytest.approx(row, rel=0.01)
    long = m.breakdown(StepShape(prefill_seqs=1, prefill_tokens=2048, prefill_attn_pairs=prefill_attn_pairs(2048, 8000),
                                 prefill_context=8000))
    assert long["bound"]["prefill_attention"] == "compute"


def test_lm_head_counts_sequences_not_tokens():
    long = OPT13B_A100.breakdown(prefill(2000))["lm_head"]
    short = OPT13B_A100.breakdown(prefill(10))["lm_head"]
    assert long == short


def test_tensor_parallel_halves_weight_time_and_adds_allreduce():
    shape = StepShape(decode_seqs=8, decode_context=8 * 256)
    one = OPT13B_A100.breakdown(shape)
    two = RooflineCostModel("opt-13b", "a100", tp=2).breakdown(shape)
    assert two["linear"] == pytest.approx(one["linear"] / 2, rel=1e-9)
    assert two["decode_attention"] == pytest.approx(one["decode_attention"] / 2, rel=1e-9)
    assert one["allreduce"] == 0 and two["allreduce"] > 0
    # 81 collectives x 10 us latency dominate a small decode step's all-reduce
    assert 0.8e-3 < two["allreduce"] < 1.2e-3
    t1 = OPT13B_A100.step_time(shape)
    t2 = RooflineCostModel("opt-13b", "a100", tp=2).step_time(shape)
    assert 0.5 * t1 < t2 < t1


def test_faster_hardware_is_faster():
    shape = StepShape(prefill_seqs=1, prefill_tokens=512, prefill_attn_pairs=prefill_attn_pairs(512),
                      decode_seqs=32, decode_context=32 * 400)
    times = [RooflineCostModel("llama-2-7b", g).step_time(shape) for g in ("l4", "a100-40g", "h100", "h200")]
    assert times == sorted(times, reverse=True)


def test_swap_and_copy_costs():
    m = resolve_model("opt-13b")
    block = 16 * m.kv_bytes_per_token(2)
    only_cpu = OPT13B_A100.step_time(StepShape(swap_blocks=1)) - OPT13B_A100.breakdown(StepShape(swap_blocks=1))["swap"]
    swap = OPT13B_A100.breakdown(StepShape(decode_seqs=1, decode_context=10, swap_blocks=100))["swap"]
    assert swap == pytest.approx(100 * block / 25e9)
    assert only_cpu == pytest.approx(2e-3)                 # swap-only step: transfer + fixed host time
    copy = OPT13B_A100.breakdown(StepShape(decode_seqs=1, decode_context=10, copy_blocks=10))["copy"]
    assert copy == pytest.approx(10 * 2 * block / (1.555e12 * 0.8))


def test_efficiency_and_cpu_overhead_are_parameters():
    fast = RooflineCostModel("opt-13b", "a100", efficiency=RooflineEfficiency(memory=1.0), cpu_overhead_base=0.0,
                             cpu_overhead_per_seq=0.0)
    shape = StepShape(decode_seqs=1, decode_context=1)
    assert fast.step_time(shape) < OPT13B_A100.step_time(shape)
    big = OPT13B_A100.breakdown(StepShape(decode_seqs=200, decode_context=200))["cpu"]
    assert big == pytest.approx(2e-3 + 200 * 20e-6)
    with pytest.raises(PlannerError):
        RooflineEfficiency(compute=0.0)


def test_bad_configurations():
    with pytest.raises(PlannerError, match="no interconnect"):
        RooflineCostModel("opt-125m", "cpu", tp=2)
    with pytest.raises(PlannerError, match="does not divide"):
        RooflineCostModel("opt-13b", "a100", tp=3)
    with pytest.raises(PlannerError, match="unknown GPU"):
        RooflineCostModel("opt-13b", "v100")


shapes = st.builds(
    lambda ps, pt, cached, ds, ctx, sw, cp: StepShape(
        prefill_seqs=ps, prefill_tokens=pt if ps else 0,
        prefill_attn_pairs=prefill_attn_pairs(pt, cached) if ps else 0, prefill_context=cached if ps else 0,
        decode_seqs=ds, decode_context=ds * ctx, swap_blocks=sw, copy_blocks=cp),
    st.integers(0, 4), st.integers(1, 4096), st.integers(0, 2048), st.integers(0, 512),
    st.integers(1, 4096), st.integers(0, 64), st.integers(0, 8))
MODELS = [RooflineCostModel("opt-13b", "a100"), RooflineCostModel("llama-2-70b", "h100", tp=4)]


@settings(max_examples=200, deadline=None)
@given(shapes, st.sampled_from(MODELS))
def test_step_time_equals_its_breakdown(shape, model):
    parts = model.breakdown(shape)
    del parts["bound"]
    assert model.step_time(shape) == pytest.approx(sum(parts.values()), rel=1e-12, abs=1e-15)


@settings(max_examples=200, deadline=None)
@given(shapes, st.sampled_from(MODELS), st.integers(1, 256), st.integers(1, 4096))
def test_more_work_never_takes_less_time(shape, model, extra, ctx):
    base = model.step_time(shape)
    assert base >= 0.0
    more_decode = StepShape(**{**_fields(shape), "decode_seqs": shape.decode_seqs + extra,
                               "decode_context": shape.decode_context + extra * ctx})
    more_context = StepShape(**{**_fields(shape), "decode_context": shape.decode_context + ctx})
    more_swap = StepShape(**{**_fields(shape), "swap_blocks": shape.swap_blocks + extra})
    for bigger in (more_decode, more_swap) + ((more_context,) if shape.decode_seqs else ()):
        assert model.step_time(bigger) >= base
    if shape.prefill_seqs:
        more_prefill = StepShape(**{**_fields(shape), "prefill_tokens": shape.prefill_tokens + extra,
                                    "prefill_attn_pairs": shape.prefill_attn_pairs + extra * ctx})
        assert model.step_time(more_prefill) >= base


def _fields(shape):
    return {name: getattr(shape, name) for name in StepShape.__slots__}
