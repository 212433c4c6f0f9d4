"""vLLM bench's --ramp-up-strategy: the request rate rising request by request from a start to an end rate."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from engine.deployment import Deployment
from planner import capacity, simulate
from planner.cli import app
from planner.cli.serve import load_bench_trace
from planner.analysis.ramp import knee
from planner.errors import PlannerError
from planner.runs.spec import Load, RunSpec
from planner.validation.report import load_text
from planner.validation.spec import ValidationSpec
from workloads import RampUp, TraceError, arrival_times, make_trace

H100 = Deployment(model="llama-3.1-8b", gpu="h100-sxm", policy="vllm-v1", max_model_len=4096)
LINEAR = RampUp("linear", 2.0, 60.0)


def test_request_i_of_n_is_sent_at_the_rate_vllm_bench_gives_it():
    # vllm/benchmarks/serve.py _get_current_request_rate: progress i / (N - 1), straight or geometric
    assert RampUp("linear", 1.0, 4.0).rates(4).tolist() == [1.0, 2.0, 3.0, 4.0]
    assert RampUp("exponential", 1.0, 8.0).rates(4).tolist() == pytest.approx([1.0, 2.0, 4.0, 8.0])
    assert RampUp("linear", 3.0, 9.0).rates(1).tolist() == [3.0]


def test_each_gap_is_drawn_at_its_requests_rate_and_left_unscaled():
    # constant gaps show the schedule exactly: the gap before request i is 1 / rate_i (the first request at 0)
    times = arrival_times(np.random.default_rng(0), arrival="constant", num_requests=4,
                          ramp_up=RampUp("linear", 1.0, 4.0))
    assert times.tolist() == pytest.approx([0.0, 1 / 2, 1 / 2 + 1 / 3, 1 / 2 + 1 / 3 + 1 / 4])
    # Poisson: vLLM draws one exponential gap per request at its own rate and sums them, no rescaling
    ramp = RampUp("exponential", 1.0, 30.0)
    drawn = np.random.default_rng(5).exponential(1.0 / ramp.rates(500))
    times = arrival_times(np.random.default_rng(5), num_requests=500, ramp_up=ramp)
    assert times == pytest.approx(np.cumsum(drawn) - drawn[0], abs=1e-6)


@settings(max_examples=200, deadline=None)
@given(strategy=st.sampled_from(["linear", "exponential"]), start=st.floats(0.01, 1e4), factor=st.floats(1, 1e3),
       count=st.integers(0, 300), arrival=st.sampled_from(["poisson", "gamma", "constant"]), seed=st.integers(0, 99))
def test_any_ramp_gives_a_sorted_trace_from_zero_with_every_request(strategy, start, factor, count, arrival, seed):
    ramp = RampUp(strategy, start, start * factor)
    times = arrival_times(np.random.default_rng(seed), arrival=arrival, cv=2.0, num_requests=count, ramp_up=ramp)
    assert len(times) == count and np.all(np.diff(times) >= 0) and np.all(np.isfinite(times))
    assert count == 0 or times[0] == 0.0
    rates = ramp.rates(count)
    assert np.all(np.diff(rates) >= 0) and (count == 0 or rates[0] == pytest.approx(start))


def test_the_trace_starts_at_the_start_rate_and_ends_at_the_end_rate():
    times = np.array([r.arrival_time for r in make_trace("random", num_requests=20_000, seed=2, ramp_up=LINEAR)])
    rates = LINEAR.rates(20_000)
    # the first and the last 1,000 requests: sent over the time their rates' gaps add up to (3.2 and 58.5 req/s)
    for part in (slice(0, 1000), slice(-1000, None)):
        span = times[part][-1] - times[part][0]
        assert span == pytest.approx(np.sum(1 / rates[part][1:]), rel=0.1)
    # with a burstiness the gaps are gamma-shaped at the same rates: as regular as shape 16 says (cv 1/4)
    bursty = make_trace("random", num_requests=2000, seed=2, ramp_up=RampUp("linear", 5.0, 5.0),
                        arrival="gamma", cv=0.25)
    gaps = np.diff([r.arrival_time for r in bursty])
    assert gaps.mean() == pytest.approx(0.2, rel=0.03) and gaps.std() / gaps.mean() == pytest.approx(0.25, rel=0.1)


@pytest.mark.parametrize("kwargs,message", [
    ({"ramp_up": RampUp("linear", 2.0, 6.0), "rate": 4.0}, "a ramp-up sets the request rate"),
    ({"ramp_up": RampUp("linear", 2.0, 6.0), "duration": 60.0}, "give a request count and no duration"),
    ({"ramp_up": RampUp("linear", 8.0, 6.0)}, "must not be above the end rate"),
    ({"ramp_up": RampUp("exponential", 0.0, 6.0)}, "start rps: must be a number > 0"),
    ({"ramp_up": RampUp("step", 1.0, 6.0)}, "expected one of linear, exponential"),
])
def test_vllm_bench_refusals_hold_in_one_line(kwargs, message):
    with pytest.raises(TraceError, match=message):
        make_trace("random", **{"num_requests": 10, **kwargs})


def test_a_chatbot_trace_cannot_be_ramped_request_by_request():
    with pytest.raises(TraceError, match="chatbot turn follows its conversation"):
        make_trace("chatbot", num_requests=10, ramp_up=LINEAR)


def test_a_trace_file_is_retimed_by_the_ramp(tmp_path):
    path = tmp_path / "t.jsonl"
    make_trace("alpaca", num_requests=30, rate=1.0, seed=1).save(path)
    ramped = make_trace(str(path), ramp_up=LINEAR, seed=1)
    assert [r.request_id for r in ramped] == [f"alpaca-{i}" for i in range(30)]
    assert ramped.params["ramp_up_strategy"] == "linear" and ramped.requests[0].arrival_time == 0.0
    assert ramped.requests[-1].arrival_time < 30 / 2.0      # faster than its start rate throughout


def test_a_ramp_past_capacity_overloads_the_end_of_the_run_and_not_its_start():
    # Llama-3.1-8B on an H100 serves about 20 of these requests/s: a ramp from 2 to 60 req/s passes it, and the
    # last requests' tokens come far slower than the first's; a ramp from 2 to 6 stays under it
    def tpot_late_over_early(ramp: RampUp) -> float:
        run = simulate(H100, workload="sharegpt", requests=1500, ramp_up=ramp)
        served = sorted((r for r in run.sim.requests if r.completed and r.output_len > 1), key=lambda r: r.arrival)
        tpot = [(r.finish - r.first_token) / (r.output_len - 1) for r in served]
        tenth = len(tpot) // 10
        return float(np.mean(tpot[-tenth:]) / np.mean(tpot[:tenth]))
    assert tpot_late_over_early(LINEAR) > 1.5          # (1.81 here)
    assert tpot_late_over_early(RampUp("linear", 2.0, 6.0)) < 1.15   # (1.04)


def test_the_run_records_and_says_its_ramp_and_the_command_repeats_it():
    spec = RunSpec(deployment=H100, load=Load(workload="random", requests=200, ramp_up=RampUp("exponential", 1, 16)))
    doc = simulate(spec).document()
    params = doc["params"]["trace_params"]
    assert (params["ramp_up_strategy"], params["ramp_up_start_rps"], params["ramp_up_end_rps"]) == \
        ("exponential", 1, 16)
    assert doc["verdict"]["ramp_up"] == "exponential ramp-up from 1 to 16 req/s"
    assert doc["verdict"]["lines"][0].startswith("exponential ramp-up from 1 to 16 req/s; the trace offers")
    # the trace's mean rate is the ramp's: 199 exponential gaps, each at its request's rate, span 1/r_i in
    # mean with a variance of 1/r_i^2 (within three standard deviations: 27%; a rate of 1 req/s misses by 66%)
    means = 1 / RampUp("exponential", 1, 16).rates(200)[1:]
    spread = 3 * np.sqrt(np.sum(means ** 2)) / np.sum(means)
    assert doc["verdict"]["offered_rate"] == pytest.approx(199 / np.sum(means), rel=spread)
    assert "--ramp-up-strategy exponential --ramp-up-start-rps 1 --ramp-up-end-rps 16" in doc["command"]
    # a next command at a steady rate (or capacity's search for one) replaces the ramp
    assert "--ramp-up" not in spec.command(rate=4.0) and "--ramp-up" not in spec.command(capacity=True)


def test_a_ramp_with_a_limit_in_flight_paces_the_clients():
    load = Load(workload="random", requests=120, ramp_up=RampUp("linear", 5, 50), concurrency=4)
    assert load.paced
    doc = simulate(H100, **{k: getattr(load, k) for k in ("workload", "requests", "ramp_up", "concurrency")}
                   ).document()
    assert doc["verdict"]["lines"][0].startswith("linear ramp-up from 5 to 50 req/s, at most 4 requests in flight")
    assert doc["mean_concurrency"] <= 4 and doc["params"]["concurrency"] == 4


def test_cli_simulates_a_ramp_and_refuses_what_vllm_bench_refuses(tmp_path):
    base = ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--workload", "random", "--requests", "60"]
    result = CliRunner().invoke(app, [*base, "--ramp-up-strategy", "linear", "--ramp-up-start-rps", "2",
                                      "--ramp-up-end-rps", "20", "--out", str(tmp_path / "ok"), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["params"]["trace_params"]["ramp_up_end_rps"] == 20
    for extra, message in [
        (["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "2", "--ramp-up-end-rps", "6", "--rate", "3"],
         "error: --ramp-up-strategy sets the request rate, as in vllm bench serve: drop --rate"),
        (["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "2"],
         "error: --ramp-up-strategy needs both --ramp-up-start-rps and --ramp-up-end-rps"),
        (["--ramp-up-end-rps", "6"], "error: --ramp-up-start-rps and --ramp-up-end-rps shape a ramp-up"),
        (["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "2", "--ramp-up-end-rps", "6", "--duration", "9"],
         "error: --ramp-up-strategy raises the rate request by request up to the last"),
    ]:
        result = CliRunner().invoke(app, [*base, *extra, "--out", str(tmp_path / "no")])
        assert result.exit_code == 2, result.output
        assert result.stderr.startswith(message) and result.stderr.count("\n") == 1
    assert not (tmp_path / "no").exists()


def test_capacity_and_search_look_for_a_steady_rate():
    with pytest.raises(PlannerError, match="a ramp-up sets a rising one"):
        capacity(H100, slos="ttft_p99=1", workload="random", requests=50, ramp_up=LINEAR)


def test_validate_and_bench_send_the_same_ramp():
    ramp = RampUp("linear", 1.0, 8.0)
    spec = ValidationSpec(workload="alpaca", ramp_up=ramp, requests=30, length_scale=1.0, max_prompt_len=10**6,
                          max_output_len=10**6)
    assert spec.request_rate is None and math.isinf(spec.arrival_rate)
    assert load_text(spec) == "by a linear ramp-up from 1 to 8 req/s (Poisson)"
    assert load_text(ValidationSpec(ramp_up=ramp, concurrency=3)).endswith("(Poisson), at most 3 in flight")
    with pytest.raises(PlannerError, match="drop --rate"):
        ValidationSpec(ramp_up=ramp, rate=2.0)
    bench = load_bench_trace("alpaca", None, None, 30, 0, 1.0, None, None, ramp_up=ramp)
    expected = make_trace("alpaca", num_requests=30, seed=0, ramp_up=ramp)
    assert [r.arrival_time for r in bench] == [r.arrival_time for r in spec.trace()] == \
        [r.arrival_time for r in expected]
    result = CliRunner().invoke(app, ["bench", "--endpoint", "http://127.0.0.1:9", "--workload", "alpaca",
                                      "--rate", "2", "--ramp-up-strategy", "linear", "--ramp-up-start-rps", "1",
                                      "--ramp-up-end-rps", "8"])
    assert result.exit_code == 2 and result.stderr.startswith("error: --ramp-up-strategy sets the request rate")


def part(offered, served):
    return {"offered_rate": offered, "served_rate": served}


def test_the_knee_is_where_completions_fall_behind_for_good():
    assert knee([part(5, 5), part(10, 9.5), part(20, 19)]) is None
    assert knee([part(5, 5), part(10, 8), part(20, 19), part(30, 22), part(40, 23)]) == 3     # (share 1: noise)
    assert knee([part(5, 5), part(10, 10), part(20, 12)]) is None          # one share behind may be noise
    assert knee([part(5, 4), part(10, 5), part(20, 6)]) == 0


def test_a_ramp_run_reads_as_a_load_curve():
    # ten shares of the requests in sending order: the ramp's rates over each, offered and served rates, latencies
    past = simulate(H100, workload="sharegpt", requests=2000, ramp_up=LINEAR).document()["verdict"]
    profile = past["ramp_up_profile"]
    assert len(profile) == 10 and sum(p["requests"] for p in profile) == 2000
    assert profile[0]["rate_from"] == 2.0 and profile[-1]["rate_to"] == 60.0
    assert all(a["rate_to"] < b["rate_from"] for a, b in zip(profile, profile[1:]))
    assert profile[-1]["tpot_mean"] > 1.5 * profile[0]["tpot_mean"]
    # early on the engine keeps pace (served within 10% of offered); late it falls behind, and says from where
    assert profile[0]["served_rate"] == pytest.approx(profile[0]["offered_rate"], rel=0.1)
    assert profile[-1]["served_rate"] < 0.9 * profile[-1]["offered_rate"]
    line = past["lines"][1]
    assert line.startswith("Over the ramp (mean TTFT ") and "completions fell behind arrivals from about " in line
    within = simulate(H100, workload="sharegpt", requests=1000, ramp_up=RampUp("linear", 2, 6)).document()["verdict"]
    assert within["lines"][1].endswith("completions kept pace with arrivals to its end (6 req/s).")
    steady = simulate(H100, workload="sharegpt", requests=200, rate=4.0).document()["verdict"]
    assert steady["ramp_up_profile"] is None
