"""Capacity judges a steady state (stop 70): requests piling up in the running batch are an overload, and a
probe whose trace ends before the engine fills up runs again on a longer one."""
from __future__ import annotations

import pytest

from engine.core.metrics import RequestRecord
from engine.deployment import Deployment
from planner import capacity, simulate
from planner.analysis.verdict import binding_slo, judge_growth, queue_trend, steady_window, too_short, warmup_latency
from planner.runs.slos import meets
from planner.runs.spec import Load
from planner.sizing.probe import MAX_PROBE_REQUESTS, steady_load


def _admitted_on_arrival(arrival_rate: float, service_rate: float, n: int) -> list[RequestRecord]:
    """vLLM v1's way of overloading: every request is scheduled as it arrives (the waiting queue stays
    empty) and the requests finish in order at `service_rate`, so the running batch grows."""
    records = []
    for i in range(n):
        arrival = i / arrival_rate
        finish = max(arrival + 1.0, (i + 1) / service_rate)
        records.append(RequestRecord(str(i), arrival, 10, 10, first_scheduled=arrival, first_token=arrival + 0.1,
                                     finish=finish, token_times=[arrival + 0.1, finish]))
    return records


def _verdict(records):
    window = steady_window(records)
    trend = queue_trend(records, window)
    return trend, judge_growth(trend, too_short(window, warmup_latency(records, window)))


def test_a_running_batch_that_keeps_growing_is_an_overload():
    trend, (overloaded, inconclusive) = _verdict(_admitted_on_arrival(10.0, 5.0, 2000))
    assert trend["mean_waiting"] == 0 and not trend["waiting_growing"]
    assert trend["in_system_slope"] == pytest.approx(5.0, rel=0.05)        # arrivals - completions
    assert overloaded and not inconclusive
    trend, (overloaded, inconclusive) = _verdict(_admitted_on_arrival(5.0, 10.0, 2000))
    assert not trend["growing"] and not overloaded and not inconclusive


def test_growth_on_a_window_too_short_is_undecided_and_fails_the_slos():
    # Requests that live 30 s, arriving at 10 req/s for 20 s: the count in the system grows all through the
    # steady window (16 s) as any engine filling up would, stable or not.
    records = [RequestRecord(str(i), i / 10, 10, 10, first_scheduled=i / 10, first_token=i / 10 + 0.1,
                             finish=i / 10 + 30, token_times=[i / 10 + 0.1, i / 10 + 30]) for i in range(200)]
    trend, (overloaded, inconclusive) = _verdict(records)
    assert trend["in_system_growing"] and not overloaded and inconclusive
    assert not meets({"ttft_p99": 0.2, "verdict": {"inconclusive": True}}, {"ttft_p99": 1.0})
    # Above a capacity, a probe that failed only by being undecided is bound by throughput, not by an SLO it met.
    assert binding_slo({"ttft_p99": 1.0}, [(2.0, False, {"ttft_p99": 0.2, "verdict": {"inconclusive": True}})],
                       1.0) == "queue_growth"


def test_a_load_grows_only_where_it_can():
    load = Load(workload="sharegpt", rate=4.0, requests=200)
    assert steady_load(load, 200, 900).requests == 900
    assert steady_load(load, 200, 10 ** 9).requests == MAX_PROBE_REQUESTS
    assert steady_load(Load(workload="sharegpt", rate=4.0, duration=30.0), 120, 900).duration is None
    assert steady_load(load, 200, None) is None                                   # long enough
    assert steady_load(load, MAX_PROBE_REQUESTS, MAX_PROBE_REQUESTS * 2) is None  # at the cap
    assert steady_load(Load(workload="sharegpt", concurrency=8, requests=200), 200, 900) is None
    assert steady_load(Load(workload="tests/data/golden/measured_run.jsonl", rate=4.0), 200, 900) is None


def test_a_short_trace_does_not_overstate_the_capacity():
    """200 requests at 256 req/s are a 0.8 s burst that vLLM v1 admits whole: stop 69 called that capacity
    (256 req/s) while its own run at that rate served 16 req/s. Now the probes lengthen their traces, and
    10 % under the capacity found (the search's tolerance) the SLOs hold on a run of 8,000 requests."""
    deployment = Deployment(model="llama-3.1-8b", gpu="h100-sxm")
    slos = {"ttft_p99": 0.5, "tpot_p99": 0.03}
    found = capacity(deployment, slos=slos, workload="sharegpt", requests=200, tolerance=0.1)
    at = found.document["at_capacity"]
    assert 20 < found.rate < 80 and at["num_submitted"] > 1000
    assert f"--requests {at['num_submitted']}" in found.document["verdict"]["next_command"]
    long = simulate(deployment, workload="sharegpt", rate=0.9 * found.rate, requests=8000).document()
    assert meets(long, slos), (found.rate, {k: long[k] for k in slos}, long["verdict"]["state"])
    assert long["steady_state"]["request_throughput"] > 0.95 * long["verdict"]["queue"]["arrival_rate"]
