"""vLLM bench's --burstiness: arrivals at a rate with gamma-distributed gaps of shape B (1: Poisson)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from engine.deployment import Deployment
from planner import simulate
from planner.cli import app
from planner.cli.serve import load_bench_trace
from planner.errors import PlannerError
from planner.runs.spec import Load, RunSpec
from planner.validation.report import load_text
from planner.validation.spec import ValidationSpec
from workloads import TraceError, burstiness_arrival, make_trace

H100 = Deployment(model="llama-3.1-8b", gpu="h100-sxm", policy="vllm-v1", max_model_len=4096)


def gaps(burstiness: float, rate: float = 4.0, n: int = 20_000) -> np.ndarray:
    trace = make_trace("random", num_requests=n, rate=rate, seed=3, **burstiness_arrival(burstiness, rate))
    return np.diff([r.arrival_time for r in trace])


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gaps_keep_the_rate_and_spread_as_the_gamma_shape_says(burstiness):
    # vLLM draws gamma(shape B, scale 1 / (rate B)): mean 1 / rate, coefficient of variation 1 / sqrt(B)
    g = gaps(burstiness)
    assert g.mean() == pytest.approx(1 / 4.0, rel=0.03)
    assert g.std() / g.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)


def test_a_burstiness_of_one_is_the_poisson_trace_itself():
    assert burstiness_arrival(1, 4.0) == burstiness_arrival(1.0, None) == {}
    assert Load(workload="random", rate=4.0, requests=50, burstiness=1.0).trace().requests == \
        Load(workload="random", rate=4.0, requests=50).trace().requests


@pytest.mark.parametrize("burstiness, rate, message", [
    (0.0, 4.0, "burstiness: must be a number from 1e-12 to 1e+12"),
    (-1.0, 4.0, "burstiness: must be a number"),
    (math.nan, 4.0, "burstiness: must be a number"),
    (0.5, math.inf, "burstiness: 0.5 shapes the gaps between arrivals at a finite request rate"),
    (0.5, None, "burstiness: 0.5 shapes the gaps between arrivals at a finite request rate"),
])
def test_a_burstiness_without_gaps_to_shape_is_refused_naming_it(burstiness, rate, message):
    with pytest.raises(TraceError) as refused:
        burstiness_arrival(burstiness, rate)
    assert str(refused.value).startswith(message)


def test_bursty_arrivals_at_the_same_rate_queue_longer_and_lower_the_goodput():
    # the same mean rate at three quarters of the deployment's capacity (about 16 req/s of these requests):
    # bursts pile requests up where Poisson spreads them, and fewer requests meet the SLOs
    runs = {b: simulate(H100, workload="random", params={"input_len": 2048, "output_len": 128}, rate=12.0,
                        requests=600, burstiness=b, slos="ttft_p99=0.5,tpot_p99=0.05").document()
            for b in (4.0, 1.0, 0.1)}
    assert runs[4.0]["ttft_p99"] < runs[1.0]["ttft_p99"] < runs[0.1]["ttft_p99"]
    assert runs[4.0]["ttft_mean"] < runs[1.0]["ttft_mean"] < runs[0.1]["ttft_mean"]
    assert runs[4.0]["num_good"] == 600 and runs[0.1]["num_good"] < 600 * 0.75
    assert runs[0.1]["request_goodput"] < 0.75 * runs[0.1]["request_throughput"]


def test_the_run_records_and_says_its_arrival_process_and_the_command_repeats_it():
    spec = RunSpec(deployment=H100, load=Load(workload="random", rate=8.0, requests=80, burstiness=0.25))
    result = simulate(spec)
    doc = result.document()
    assert doc["params"]["trace_params"]["arrival"] == "gamma"
    assert doc["params"]["trace_params"]["cv"] == pytest.approx(2.0)
    assert "requested 8 req/s (gamma arrivals, burstiness 0.25)" in doc["verdict"]["lines"][0]
    assert "--rate 8.0 --burstiness 0.25" in spec.command()


def test_cli_refuses_a_burstiness_the_load_cannot_use_in_one_line(tmp_path):
    base = ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--workload", "random", "--requests", "20",
            "--out", str(tmp_path / "run")]
    for extra, message in [(["--concurrency", "4", "--burstiness", "0.5"], "a closed loop (--concurrency) sends"),
                           (["--burstiness", "0"], "burstiness: must be a number")]:
        result = CliRunner().invoke(app, [*base, *extra])
        assert result.exit_code == 2, result.output
        assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
        assert message in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", [["capacity", "--concurrency", "max", "--slo", "tpot_p99=0.05"],
                                     ["search", "--concurrency", "8", "--slo", "tpot_p99=0.05"]])
def test_a_search_for_clients_refuses_a_burstiness_before_it_starts(command, tmp_path):
    result = CliRunner().invoke(app, [*command, "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--burstiness", "0.5",
                                      "--requests", "20", "--out", str(tmp_path / "run")])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --burstiness shapes the gaps") and result.stderr.count("\n") == 1
    assert "searching" not in result.stderr and not (tmp_path / "run").exists()


def test_the_api_refuses_a_burstiness_beside_its_own_arrival_params():
    with pytest.raises(PlannerError, match="burstiness and the params arrival and cv set the same"):
        simulate(H100, workload="random", rate=2.0, requests=20, params={"cv": 2.0}, burstiness=0.5)


def test_cli_simulates_a_bursty_rate_with_a_limit_in_flight(tmp_path):
    result = CliRunner().invoke(app, ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--workload",
                                      "random", "--requests", "60", "--rate", "20", "--burstiness", "0.5",
                                      "--concurrency", "8", "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["params"]["trace_params"]["arrival"] == "gamma" and doc["params"]["concurrency"] == 8
    assert "--burstiness 0.5" in doc["command"]


def test_validate_and_bench_shape_their_arrivals_the_same_way():
    spec = ValidationSpec(workload="alpaca", rate=6.0, burstiness=0.5, requests=30)
    assert spec.trace().params["arrival"] == "gamma"
    assert load_text(spec) == "at 6 req/s (gamma, burstiness 0.5)"
    assert load_text(ValidationSpec(rate=6.0, concurrency=3)) == "at 6 req/s (Poisson), at most 3 in flight"
    with pytest.raises(PlannerError, match="finite request rate"):
        ValidationSpec(concurrency=3, burstiness=0.5)
    bench = load_bench_trace("alpaca", None, 6.0, 30, 0, 1.0, None, None, burstiness=0.5)
    assert [r.arrival_time for r in bench] == [r.arrival_time for r in make_trace(
        "alpaca", num_requests=30, rate=6.0, seed=0, arrival="gamma", cv=1 / math.sqrt(0.5))]


def test_capacity_at_bursty_arrivals_is_lower():
    # the same SLOs hold at a lower mean rate when requests come in bursts
    from planner import capacity
    found = {b: capacity(H100, slos="ttft_p99=0.5,tpot_p99=0.05", workload="random",
                         params={"input_len": 2048, "output_len": 128}, requests=300, burstiness=b).rate
             for b in (1.0, 0.25)}
    assert found[0.25] is not None and found[0.25] < 0.75 * found[1.0]
