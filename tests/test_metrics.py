"""Metric definitions (docs/architecture.md) on hand-computed timelines, through the simulator's clock."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from engine.core.block_manager import BlockManager, blocks_at_most
from engine.core.metrics import Metrics, RequestRecord, StepRecord, compute_metrics, summarize
from planner.catalog import resolve_gpu, resolve_model
from planner.cost import StepShape
from planner.sim import simulate
from sim_helpers import sim_plan
from planner.runs.slos import meets
from workloads import Trace, TraceRequest


class OneSecondSteps:
    """Every step that computes something takes one second."""

    name = "constant"

    def step_time(self, shape: StepShape) -> float:
        return 0.0 if shape.is_empty else 1.0


def run(*rows, **config):
    """rows: (id, arrival, prompt_len, output_len[, extra TraceRequest fields])."""
    reqs = [TraceRequest(request_id=r[0], arrival_time=r[1], prompt_len=r[2], output_len=r[3],
                         **(r[4] if len(r) > 4 else {})) for r in rows]
    base = dict(model=resolve_model("opt-125m"), gpu=resolve_gpu("a100-40g"), block_size=2, num_gpu_blocks=64,
                num_cpu_blocks=8, max_model_len=64)
    return simulate(Trace(reqs, name="tiny"), sim_plan(**(base | config)), OneSecondSteps())


def record(result, rid) -> RequestRecord:
    return next(r for r in result.requests if r.request_id == rid)


def test_parallel_sampling_is_normalized_per_sequence_not_per_token_sum():
    # Prefill [0, 1] gives each sequence its first token, three decode steps the rest:
    # each of the 4 sequences has 4 tokens, the request ends at t=4.
    par = run(("par", 0.0, 2, 4, {"n": 4}))
    one = run(("one", 0.0, 2, 4))
    r = record(par, "par")
    assert (r.output_len, r.seq_output_len, r.num_seqs, r.e2e) == (16, 4, 4, 4.0)
    for key, expected in (("normalized_latency", 4 / 4), ("tpot_mean", 3 / 3), ("itl_mean", 1.0)):
        assert par.metrics[key] == pytest.approx(expected), key
        assert one.metrics[key] == pytest.approx(expected), key      # n does not change a user's wait
    # Throughput still counts every generated token.
    assert par.metrics["output_token_throughput"] == pytest.approx(16 / 4)
    assert one.metrics["output_token_throughput"] == pytest.approx(4 / 4)


def test_itl_per_request_and_pooled_and_tpot_agree():
    # The scheduler test's timeline: 4 blocks of 2; B is preempted at t=3 (token times A [1,3,4], B [1,3,5,6]).
    res = run(("A", 0.0, 3, 3), ("B", 0.0, 2, 4), ("C", 0.5, 2, 1), num_gpu_blocks=4, max_model_len=16)
    a, b, c = (record(res, x) for x in "ABC")
    assert (a.itl, b.itl, c.itl) == ([2, 1], [2, 2, 1], [])
    assert b.itl_mean == pytest.approx(b.tpot) == pytest.approx(5 / 3)  # TPOT is a request's mean gap
    assert a.itl_p50 == pytest.approx(1.5) and a.itl_p99 == pytest.approx(1.99)
    assert c.itl_p99 is None and c.tpot is None
    m = res.metrics
    assert m["itl_mean"] == pytest.approx(8 / 5)                      # pooled over all five gaps
    assert m["itl_median"] == m["itl_p50"] == pytest.approx(2)
    assert m["itl_p99"] == pytest.approx(2)
    assert m["request_itl_p99_mean"] == pytest.approx((1.99 + 2) / 2)
    assert m["tpot_mean"] == pytest.approx((1.5 + 5 / 3) / 2)        # mean over requests of their mean gap


@pytest.mark.parametrize("mode, decode, prefill", [("recompute", 4 / 3, 4 / 3), ("swap", 5 / 4, 3 / 2)])
def test_batch_size_counts_decode_steps_as_the_paper_does(mode, decode, prefill):
    # Steps: prefill AB, prefill C, decode AB, decode A, B (re-prefill or swapped-in decode), decode B.
    res = run(("A", 0.0, 3, 3), ("B", 0.0, 2, 4), ("C", 0.5, 2, 1), num_gpu_blocks=4, max_model_len=16,
              preemption_mode=mode)
    m = res.metrics
    assert m["mean_batch_size"] == pytest.approx(decode)
    assert m["mean_prefill_batch_size"] == pytest.approx(prefill)
    assert m["mean_step_batch_size"] == pytest.approx(8 / 6)
    assert m["num_prefill_steps"] + m["num_decode_steps"] == m["num_steps"] == 6


def test_a_prefill_admitting_one_request_does_not_halve_the_batch():
    # A alone, then B joins: prefill A, prefill B, then two requests in every decode step.
    m = run(("A", 0.0, 2, 5), ("B", 0.5, 2, 5)).metrics
    assert m["mean_batch_size"] == pytest.approx(2.0)
    assert m["mean_prefill_batch_size"] == pytest.approx(1.0)
    assert m["mean_step_batch_size"] < 2.0


def test_truncated_requests_are_counted_apart_and_fail_slos():
    # "clip": prompt 10 + 10 wanted tokens > max_model_len 16, so its output stops at 6 tokens.
    # "ok" completes. Neither is rejected.
    res = run(("clip", 0.0, 10, 10), ("ok", 0.0, 2, 3), max_model_len=16)
    m = res.metrics
    assert record(res, "clip").truncated and record(res, "clip").seq_output_len == 6
    assert (m["num_completed"], m["num_rejected"], m["num_truncated"], m["num_submitted"]) == (1, 0, 1, 2)
    assert m["e2e_mean"] == pytest.approx(record(res, "ok").e2e)   # latencies: completed requests only
    assert not meets(res.summary(), {"normalized_latency": 1e9})    # a truncated request fails any SLO


def test_a_request_that_would_outgrow_the_whole_cache_is_refused_up_front():
    # 4 blocks of 2 = 8 slots; the prompt fits but 6 + 8 tokens never can: refused, not cut short (issue 27).
    res = run(("big", 0.0, 6, 8), num_gpu_blocks=4, max_model_len=64)
    m = res.metrics
    assert (m["num_completed"], m["num_rejected"], m["num_truncated"]) == (0, 1, 0)
    assert m["normalized_latency"] is None


def test_rejected_truncated_completed_add_up():
    res = run(("long", 0.0, 20, 2), ("clip", 0.0, 10, 10), ("ok", 0.0, 2, 2), max_model_len=16)
    m = res.metrics
    assert (m["num_completed"], m["num_rejected"], m["num_truncated"]) == (1, 1, 1)
    assert m["num_completed"] + m["num_rejected"] + m["num_truncated"] == m["num_submitted"] == 3


def test_metrics_json_keeps_the_result_file_names():
    summary = summarize([], [])
    assert isinstance(summary, Metrics)
    doc = summary.to_dict()
    assert compute_metrics([], []) == doc
    json.dumps(doc)
    for name in ("num_submitted", "num_completed", "num_rejected", "num_truncated", "request_throughput",
                 "output_token_throughput", "total_token_throughput", "ttft_mean", "ttft_median", "ttft_p99",
                 "tpot_mean", "tpot_median", "tpot_p99", "itl_mean", "itl_median", "itl_p50", "itl_p99",
                 "e2e_mean", "e2e_median", "e2e_p99", "normalized_latency", "num_steps", "mean_batch_size",
                 "mean_prefill_batch_size", "mean_step_batch_size", "kv_utilization", "memory_breakdown",
                 "step_time_mean", "step_time_median", "preemptions", "duration"):
        assert name in doc, name
        assert summary[name] == doc[name]
    assert doc["preemptions"] == {"recompute": 0, "swap": 0, "total": 0}


def _step(start, prefill_tokens, decode_tokens, batch):
    return StepRecord(start, start + 1.0, decode_tokens == 0 and prefill_tokens > 0, batch, batch, prefill_tokens,
                      decode_tokens, 0, 0, 0, 0, 0, 8, 0, 0)


def test_steps_are_classified_by_the_tokens_they_compute():
    steps = [_step(0, 10, 0, 1),      # prefill of one request
             _step(1, 0, 3, 3),       # decode
             _step(2, 0, 0, 0),       # only swaps blocks: neither kind
             _step(3, 4, 2, 3)]       # mixed (chunked prefill): a decode step of 3 requests
    m = summarize([], steps)
    assert (m.num_prefill_steps, m.num_decode_steps, m.num_steps) == (1, 2, 4)
    assert m.mean_batch_size == pytest.approx(3.0)
    assert m.mean_prefill_batch_size == pytest.approx(1.0)
    assert m.mean_step_batch_size == pytest.approx(7 / 4)


def test_large_latency_lists_give_the_same_percentiles():
    import random

    from engine.core.metrics import _median_p99, percentile
    rng = random.Random(1)
    values = [rng.expovariate(1.0) for _ in range(100_001)]   # past the partition threshold
    assert _median_p99(values) == (percentile(values, 50), percentile(values, 99))


def test_latencies_have_the_percentiles_vllm_bench_prints_and_slos_take_them():
    # ten requests with TTFTs 1..10 s: p90 and p95 interpolate linearly between the 9th/10th values
    done = [RequestRecord(request_id=f"r{i}", arrival=0.0, prompt_len=1, output_len=1, first_token=float(i),
                          finish=float(i), token_times=[float(i)]) for i in range(1, 11)]
    m = summarize(done, [])
    assert (m.ttft_median, m.ttft_p90, m.ttft_p95, m.ttft_p99) == pytest.approx((5.5, 9.1, 9.55, 9.91))
    assert (m.e2e_p90, m.e2e_p95) == pytest.approx((9.1, 9.55))
    large = [float(i % 1000) for i in range(100_001)]      # past the partition threshold: the same values
    small = summarize([RequestRecord(request_id="x", arrival=0.0, prompt_len=1, output_len=1, first_token=v,
                                     finish=v, token_times=[v]) for v in large[:50_000]], [])
    from engine.core.metrics import _latency_stats, percentile
    assert _latency_stats(large)[2:] == tuple(percentile(large, q) for q in (90, 95, 99))
    assert small.ttft_p95 == percentile(large[:50_000], 95)
    assert meets(m.to_dict(), {"ttft_p90": 9.2}) and not meets(m.to_dict(), {"ttft_p95": 9.5})


def test_peaks_per_second_as_vllm_bench_counts_them(monkeypatch):
    # vllm bench serve's "Peak output token throughput" and "Peak concurrent requests": whole seconds from the
    # first arrival (0.5 s). a runs 0.5-1.4 s (second 0), b 0.9-2.6 s (seconds 0-2), c 1.6-1.9 s (second 1):
    # requests per second 2 / 2 / 1; token times per second 3 (a's) / 5 (b's 1.5 and 1.6, c's three) / 1
    def rec(rid, arrival, times):
        return RequestRecord(request_id=rid, arrival=arrival, prompt_len=1, output_len=len(times),
                             first_token=times[0], finish=times[-1], token_times=times)
    done = [rec("a", 0.5, [1.0, 1.2, 1.4]), rec("c", 1.6, [1.7, 1.8, 1.9]), rec("b", 0.9, [1.5, 1.6, 2.6])]
    m = summarize(done, [])
    assert (m.max_output_tokens_per_s, m.max_concurrent_requests) == (5.0, 2)
    assert (m.total_input_tokens, m.total_output_tokens) == (3, 9)      # vLLM bench's totals
    from engine.core import metrics
    monkeypatch.setattr(metrics, "LARGE", 5)                 # numpy's count: the same
    assert metrics.peak_per_second(done) == (5.0, 2)


def test_many_token_times_give_the_same_gaps(monkeypatch):
    # TokenGaps (past LARGE token times) against the lists' way: the same pooled gaps in the same
    # order and the same per-request p99, requests of no, one and many token times among them; and
    # for any subset in any order (a fleet's replicas), whether past LARGE or not.
    import random

    from engine.core import metrics
    from engine.core.metrics import TokenGaps, _gaps
    rng = random.Random(2)
    done = []
    for i in range(400):
        times, t = [], rng.random()
        for _ in range(rng.choice([0, 1, 2, 3, rng.randint(4, 900)])):
            t += rng.expovariate(30.0)
            times.append(t)
        done.append(RequestRecord(request_id=f"r{i}", arrival=0.0, prompt_len=1, output_len=len(times),
                                  token_times=times))
    gaps = TokenGaps(done)
    pooled, worst = gaps.pick(done)
    small = {id(r): _gaps([r]) for r in done}
    assert list(pooled) == [g for r in done for g in small[id(r)][0]]
    assert worst == [w for r in done for w in small[id(r)][1]]
    assert gaps.pick([r for r in done if len(r.token_times) < 2]) == ([], [])
    monkeypatch.setattr(metrics, "LARGE", 10_000)          # (these 400 requests hold 38,920 times)
    for count in (len(done), 300, 20):
        subset = rng.sample(done, count)
        pooled, worst = gaps.of(subset)
        assert (sum(len(r.token_times) for r in subset) >= metrics.LARGE) == (count > 20)   # both ways taken
        assert list(pooled) == [g for r in subset for g in small[id(r)][0]]
        assert worst == [w for r in subset for w in small[id(r)][1]]


def test_the_run_lasts_until_its_last_request_ends_a_failed_one_too():
    # As vLLM's benchmark times its run: a request that fails after the others finished lengthens it.
    ok = RequestRecord("ok", 0.0, 4, 3, first_token=0.5, finish=2.0, token_times=[0.5, 1.0, 2.0], seq_output_len=3)
    failed = RequestRecord("failed", 1.0, 4, 0, finish=8.0, rejected=True, reject_reason="HTTP 502")
    m = summarize([ok, failed], [])
    assert m.duration == 8.0 and m.request_throughput == pytest.approx(1 / 8)
    assert summarize([ok], []).duration == 2.0
    unfinished = RequestRecord("cut", 0.0, 4, 1, first_token=0.5, finish=None, truncated=True)
    assert summarize([ok, unfinished], []).duration == 2.0


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.integers(1, 12), st.integers(1, 4), st.sampled_from([1, 2, 4, 8]))
def test_a_request_alone_needs_exactly_the_blocks_it_is_refused_without(prompt, out, n, block_size):
    """The paper's scheduler refuses up front a request the whole cache could never hold (it would outgrow
    it), counting its blocks with `blocks_at_most`. Run without that refusal, the request completes with that
    many blocks and not with one fewer. (The count was too high once: n = 2 samples of a 2-token prompt on 3
    blocks of 16 were refused, as vLLM v0 would not; its samples share the prompt's last block until their
    first decode.)"""
    need = blocks_at_most(prompt, out, n, block_size, 256, reserve_per_seq=1)

    def alone(blocks: int) -> RequestRecord:
        return record(run(("r", 0.0, prompt, out, {"n": n}), block_size=block_size, num_gpu_blocks=blocks,
                          max_model_len=256), "r")
    assert alone(need).completed
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(BlockManager, "max_blocks_alone", lambda self, group: 0)    # (never refused up front)
        assert alone(need).completed
        if need > 1:
            assert not alone(need - 1).completed
