"""The measured model's cost ledger: its terms are the step time, and each new term behaves as vLLM does."""

import json
from dataclasses import replace
from importlib import resources
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.catalog.quantization import weight_format
from planner.cost import tables
from planner.cost.calibration import CONSTANTS, Calibration, load_calibration
from planner.cost.ledger import CudaGraphs, cudagraph_capture_sizes
from planner.cost.measured import TERM_FAMILIES, MeasuredCostModel
from planner.cost.shape import StepShape, context_histogram, prefill_attn_pairs
from planner.errors import PlannerError

QWEN_TP2 = MeasuredCostModel("qwen3-32b", "h100-sxm", tp=2, async_scheduling=False)
LLAMA = MeasuredCostModel("llama-3.1-8b", "h100-sxm", async_scheduling=False)


def decode(batch, context=1024):
    contexts = [context] * batch
    return StepShape(decode_seqs=batch, decode_context=sum(contexts), decode_histogram=context_histogram(contexts))


def terms(model, shape):
    return {t.name: t for t in model.ledger(shape).terms}


# ---- the ledger is the step time --------------------------------------------------------------

MODELS = [QWEN_TP2, LLAMA, MeasuredCostModel("opt-13b", "a100-40g"),
          MeasuredCostModel("llama-3.1-70b", "l40s", tp=4, weight_format=weight_format("fp8")),
          MeasuredCostModel("qwen3-8b", "b200", kv_cache_dtype="fp8")]


@settings(max_examples=60, deadline=None)
@given(which=st.integers(0, len(MODELS) - 1), contexts=st.lists(st.integers(1, 20000), max_size=300),
       prefill=st.integers(0, 9000), cached=st.integers(0, 4000), swap=st.integers(0, 5), copy=st.integers(0, 5))
def test_terms_sum_to_step_time(which, contexts, prefill, cached, swap, copy):
    model = MODELS[which]
    shape = StepShape(prefill_seqs=1 if prefill else 0, prefill_tokens=prefill,
                      prefill_attn_pairs=prefill_attn_pairs(prefill, cached) if prefill else 0,
                      decode_seqs=len(contexts), decode_context=sum(contexts),
                      decode_histogram=context_histogram(contexts), swap_blocks=swap, copy_blocks=copy)
    ledger = model.ledger(shape)
    assert ledger.total == pytest.approx(model.step_time(shape), rel=1e-12, abs=1e-15)
    assert sum(model.breakdown(shape).values()) == pytest.approx(model.step_time(shape), rel=1e-12, abs=1e-15)
    assert all(t.seconds >= 0 and t.source in ("table", "roofline", "fitted") for t in ledger.terms)
    assert sum(row["share"] for row in ledger.rows()) == pytest.approx(1.0 if ledger.total else 0.0)


def test_every_part_of_a_vllm_step_is_a_term():
    mixed = StepShape(prefill_seqs=1, prefill_tokens=300, prefill_attn_pairs=prefill_attn_pairs(300),
                      decode_seqs=20, decode_context=20 * 900, decode_histogram=context_histogram([900] * 20))
    names = set(terms(QWEN_TP2, mixed))
    assert {"embedding lookup", "qkv GEMM", "o projection GEMM", "gate+up GEMM", "down GEMM", "attention (prefill)",
            "attention (decode)", "input RMSNorm + residual add", "q/k RMSNorm", "rotary embedding",
            "KV-cache write", "post-attention RMSNorm + residual add", "SiLU and mul", "final RMSNorm",
            "all-reduce", "LM head GEMM", "logits all-gather", "sampler", "host: schedule, inputs, outputs"} <= names
    assert "q/k RMSNorm" not in terms(LLAMA, mixed) and "logits all-gather" not in terms(LLAMA, mixed)
    opt = terms(MeasuredCostModel("opt-13b", "a100-80g"), mixed)
    assert "rotary embedding" not in opt and "activation" in opt and "input LayerNorm + residual add" in opt


# ---- CUDA-graph padding -------------------------------------------------------------------------

def test_capture_sizes_are_vllms():
    sizes = cudagraph_capture_sizes()                       # max_num_seqs 256: the largest is min(512, 512)
    assert sizes[:6] == (1, 2, 4, 8, 16, 24) and sizes[-3:] == (480, 496, 512) and len(sizes) == 51
    assert 248 in sizes and 252 not in sizes and 264 not in sizes and 272 in sizes
    assert cudagraph_capture_sizes(max_num_seqs=64) == (1, 2, 4, *range(8, 129, 8))
    assert cudagraph_capture_sizes(max_num_seqs=2) == (1, 2, 4)
    assert cudagraph_capture_sizes(max_num_seqs=1024, max_num_batched_tokens=100)[-1] == 96


def test_a_batch_of_9_runs_as_16():
    graphs = CudaGraphs(cudagraph_capture_sizes())
    assert [graphs.padded(n) for n in (1, 3, 5, 9, 16, 17, 257, 512, 513, 2048)] == \
        [1, 4, 8, 16, 16, 24, 272, 512, 513, 2048]
    ledger = QWEN_TP2.ledger(decode(9))
    assert (ledger.tokens, ledger.padded_tokens) == (9, 16)
    t = terms(QWEN_TP2, decode(9))
    assert "m=16 " in t["qkv GEMM"].detail and "m=9 " in t["LM head GEMM"].detail   # logits: real rows only
    assert t["qkv GEMM"].seconds == pytest.approx(terms(QWEN_TP2, decode(16))["qkv GEMM"].seconds)
    unpadded = MeasuredCostModel("qwen3-32b", "h100-sxm", tp=2, async_scheduling=False, leave_out=("padding",))
    assert unpadded.ledger(decode(9)).padded_tokens == 9
    assert unpadded.step_time(decode(9)) < QWEN_TP2.step_time(decode(9))


def test_steps_beyond_the_largest_graph_run_eagerly_unpadded():
    chunk = StepShape(prefill_seqs=1, prefill_tokens=1000, prefill_attn_pairs=prefill_attn_pairs(1000))
    ledger = QWEN_TP2.ledger(chunk)
    assert ledger.padded_tokens == 1000
    assert "(eager)" in terms(QWEN_TP2, chunk)["all-reduce"].detail
    assert "(CUDA graph)" in terms(QWEN_TP2, decode(500))["all-reduce"].detail
    small = MeasuredCostModel("qwen3-32b", "h100-sxm", tp=2, max_num_seqs=64)     # graphs up to 128 tokens
    assert small.ledger(decode(129)).padded_tokens == 129
    assert "(eager)" in terms(small, decode(129))["all-reduce"].detail


def test_a_short_chunk_after_a_long_cached_prompt_costs_its_work():
    m = MeasuredCostModel("llama-3.1-70b", "h100-sxm", tp=8)
    tail = StepShape(prefill_seqs=1, prefill_tokens=4, prefill_attn_pairs=prefill_attn_pairs(4, 8188))
    like = StepShape(prefill_seqs=1, prefill_tokens=256, prefill_attn_pairs=prefill_attn_pairs(256))  # 32,896 pairs
    assert terms(m, tail)["attention (prefill)"].seconds == pytest.approx(
        terms(m, like)["attention (prefill)"].seconds, rel=0.01)
    fresh = StepShape(prefill_seqs=1, prefill_tokens=4096, prefill_attn_pairs=prefill_attn_pairs(4096))
    assert m.breakdown(fresh)["attention"] > 3 * m.breakdown(tail)["attention"]
    # before: a 4-token prompt's launch-bound time times its pairs over a 4-token prompt's (3,276x)
    before = MeasuredCostModel("llama-3.1-70b", "h100-sxm", tp=8, leave_out=("chunk_attention",))
    assert before.breakdown(tail)["attention"] > 1.0


# ---- collectives ----------------------------------------------------------------------------------

def test_the_all_reduce_floor_dominates_tiny_messages():
    ar = QWEN_TP2.allreduce
    one, eight, big = ar(1, True), ar(8, True), ar(4096, False)
    assert one == pytest.approx(eight, rel=0.1)                      # 5 KB and 80 KB: both at the floor
    assert 2e-6 < one < 10e-6                                        # NVLink custom all-reduce: a few us
    assert big > 10 * one                                             # 40 MB: bandwidth-bound
    assert ar(8, False) > 3 * one                                     # eager: the launch floor is higher


def test_pcie_gpus_use_nccl_beyond_two_and_pay_its_floor():
    tp2, tp4 = (MeasuredCostModel("llama-3.1-70b", "l40s", tp=tp) for tp in (2, 4))
    assert "custom all-reduce" in terms(tp2, decode(8))["all-reduce"].detail
    assert "nccl" in terms(tp4, decode(8))["all-reduce"].detail
    assert tp4.allreduce(1) > tp2.allreduce(1)                       # NCCL over PCIe: a higher floor
    nvlink = MeasuredCostModel("llama-3.1-70b", "h100-sxm", tp=8)
    assert "custom all-reduce" in terms(nvlink, decode(8))["all-reduce"].detail


def test_messages_over_the_custom_all_reduce_buffer_go_to_nccl():
    tp8 = MeasuredCostModel("llama-3.1-70b", "h100-sxm", tp=8)        # 8 MiB = 512 tokens x 8192 x 2 bytes
    assert "custom all-reduce" in terms(tp8, decode(512))["all-reduce"].detail
    chunk = StepShape(prefill_seqs=1, prefill_tokens=8192, prefill_attn_pairs=prefill_attn_pairs(8192))
    assert "nccl (message over" in terms(tp8, chunk)["all-reduce"].detail
    nccl = {r["message_size"]: r["latency"] for r in tables.load_rows("h100_sxm", "allreduce")
            if r["backend"] == "nccl" and r["num_gpus"] == 8}
    assert tp8.allreduce(8192, False) == pytest.approx(nccl[8192 * 8192], rel=0.05)


def test_logits_are_gathered_under_tensor_parallelism():
    gather = QWEN_TP2.logits_gather
    assert gather(1) == pytest.approx(gather(2), rel=0.2)            # latency floor
    assert gather(256) > 3 * gather(1)                               # 78 MB of logits: bandwidth-bound


# ---- elementwise kernels ---------------------------------------------------------------------------

def test_elementwise_kernels_cost_their_floor_plus_their_bytes():
    floor = QWEN_TP2.calibration.elementwise_floor_s
    one = terms(QWEN_TP2, decode(1))["SiLU and mul"]
    assert one.count == 64 and one.seconds == pytest.approx(64 * floor, rel=0.05)   # 1 token: the floor
    many = terms(QWEN_TP2, StepShape(prefill_seqs=1, prefill_tokens=8192,
                                     prefill_attn_pairs=prefill_attn_pairs(8192)))["SiLU and mul"]
    moved = 8192 * 3 * 12800 * 2 * 64                                # gate, up and product, 2 bytes, 64 layers
    assert many.seconds == pytest.approx(64 * floor + moved / (3.35e12 * 0.8), rel=1e-6)
    bare = MeasuredCostModel("qwen3-32b", "h100-sxm", tp=2, async_scheduling=False, leave_out=("elementwise",))
    assert bare.breakdown(decode(8))["elementwise"] == 0.0 < QWEN_TP2.breakdown(decode(8))["elementwise"]


# ---- host time -------------------------------------------------------------------------------------

def test_host_time_is_in_series_without_async_scheduling_and_hidden_with_it():
    cal = QWEN_TP2.calibration
    sync_model = QWEN_TP2
    async_model = MeasuredCostModel("qwen3-32b", "h100-sxm", tp=2, async_scheduling=True)
    shape = decode(64)
    host = cal.host_step_s + 64 * cal.host_seq_s
    assert terms(sync_model, shape)["host: schedule, inputs, outputs"].seconds == pytest.approx(host)
    gpu = sync_model.step_time(shape) - host
    assert async_model.step_time(shape) == pytest.approx(max(gpu, host))
    slow_host = replace(cal, host_step_s=1.0)                         # host longer than the GPU: it shows
    exposed = MeasuredCostModel("qwen3-32b", "h100-sxm", tp=2, calibration=slow_host, async_scheduling=True)
    assert exposed.step_time(shape) == pytest.approx(1.0 + 64 * cal.host_seq_s)
    assert terms(exposed, shape)["host: schedule, inputs, outputs"].seconds == pytest.approx(
        1.0 + 64 * cal.host_seq_s - gpu)


def test_fitted_constants_come_from_the_data_file_with_their_source():
    doc = json.loads(resources.files("planner").joinpath("data/measured_calibration.json").read_text())
    cal = load_calibration()
    for name in CONSTANTS:
        assert getattr(cal, name) == doc["constants"][name]["value"] > 0
        assert doc["constants"][name]["meaning"] and doc["constants"][name]["unit"]
    assert "silicon_sample.csv" in cal.source["package"] and "H100" in cal.source["fitted_to"]
    assert cal.source["rows_held_out"] and "bench_silicon_h100.py" in cal.source["refit"]
    # the host times are fitted; the elementwise floor is aiconfigurator's constant, and says so
    assert doc["constants"]["host_step_s"]["fitted"] and doc["constants"]["host_seq_s"]["fitted"]
    assert not doc["constants"]["elementwise_floor_s"]["fitted"]
    assert "mem_empirical_constant_latency" in doc["constants"]["elementwise_floor_s"]["meaning"]
    after = cal.source["figures"]["all terms, fitted host time"]
    assert after["fit"]["runs"] == 90 and after["held-out"]["runs"] == 48
    assert "measured_calibration.json" in QWEN_TP2.describe()["host_overhead"]
    assert QWEN_TP2.describe()["calibration"] == cal.source


def test_the_calibration_runs_are_h100_vllm_only():
    """The derived data file the bench fits to holds NVIDIA's H100 vLLM runs and nothing of another GPU."""
    doc = json.loads((Path(__file__).parent.parent / "bench" / "data" / "silicon_h100_vllm.json").read_text())
    assert "silicon_sample.csv" in doc["source"]["file"] and "h100_sxm" in doc["source"]["filter"]
    ids = [row[doc["columns"].index("id")] for row in doc["rows"]]
    assert len(ids) == 138 and all("h100_sxm" in i and "_vllm_" in i for i in ids)


def test_a_damaged_calibration_file_is_a_one_line_error(monkeypatch, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "measured_calibration.json").write_text('{"constants": {}}')
    monkeypatch.setattr("planner.cost.calibration.resources.files", lambda package: tmp_path)
    load_calibration.cache_clear()
    try:
        with pytest.raises(PlannerError, match="measured_calibration.json is unreadable"):
            load_calibration()
    finally:
        load_calibration.cache_clear()


def test_leaving_every_new_term_out_prices_the_old_way():
    old = MeasuredCostModel("llama-3.1-8b", "h100-sxm", async_scheduling=False, leave_out=TERM_FAMILIES)
    parts = old.breakdown(decode(9))
    assert parts["elementwise"] == 0.0 and parts["host"] == pytest.approx(17.1e-6 + 9 * 2.21e-6)
    assert old.ledger(decode(9)).padded_tokens == 9
    with pytest.raises(PlannerError, match="unknown term"):
        MeasuredCostModel("llama-3.1-8b", "h100-sxm", leave_out=("nonsense",))


def test_calibration_constructor_takes_the_fitted_names():
    cal = Calibration(**dict.fromkeys(CONSTANTS, 0.0), source={})
    zero = MeasuredCostModel("llama-3.1-8b", "h100-sxm", calibration=cal, async_scheduling=False)
    assert zero.breakdown(decode(4))["host"] == 0.0
