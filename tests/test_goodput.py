"""Goodput as vLLM's benchmark counts it (`vllm bench serve --goodput`): requests within every SLO, per second."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from engine.core.metrics import RequestRecord, goodput
from engine.deployment import Deployment
from planner import simulate
from planner.cli import app

H100 = Deployment(model="llama-3.1-8b", gpu="h100-sxm", policy="vllm-v1", max_model_len=4096)


def record(rid: str, ttft: float, gaps: list[float]) -> RequestRecord:
    times = [ttft]
    for gap in gaps:
        times.append(times[-1] + gap)
    return RequestRecord(rid, 0.0, 10, len(times), first_token=ttft, finish=times[-1], token_times=times,
                         seq_output_len=len(times))


def test_a_request_is_good_when_each_quantity_its_slos_bound_is_within_the_limit():
    fast, slow_start, slow_tokens = record("a", 0.2, [0.05, 0.05]), record("b", 0.6, [0.05]), record("c", 0.1, [0.2])
    one_token = record("d", 0.3, [])          # no TPOT: 0 for goodput, as vLLM's benchmark counts it
    served = [fast, slow_start, slow_tokens, one_token]
    assert goodput(served, {"ttft_p99": 0.5, "tpot_mean": 0.1}, 2.0) == {"num_good": 2, "request_goodput": 1.0}
    assert goodput(served, {"ttft_p99": 0.6}, 2.0)["num_good"] == 4          # a limit is inclusive
    assert goodput(served, {"itl_p99": 0.1}, 2.0)["num_good"] == 3           # each request's longest gap
    assert goodput(served, {"e2e_p99": 0.35}, 2.0)["num_good"] == 3          # all but b (0.65 s)
    assert goodput(served, {"ttft_p99": 0.5}, 0.0)["request_goodput"] == 0.0


def test_simulate_with_slos_reports_the_requests_within_every_limit():
    result = simulate(H100, workload="random", params={"input_len": 2048, "output_len": 128}, rate=14.0,
                      requests=300, slos="ttft_p99=0.3,tpot_p99=0.04")
    doc = result.document()
    done = [r for r in result.sim.requests if r.completed]
    good = [r for r in done if r.ttft <= 0.3 and (r.tpot or 0.0) <= 0.04]
    assert 0 < len(good) < len(done)                        # the limits split the run's requests
    assert doc["num_good"] == len(good)
    assert doc["request_goodput"] == pytest.approx(len(good) / doc["duration"])
    assert doc["verdict"]["goodput"] == {"num_good": len(good), "request_goodput": doc["request_goodput"]}
    assert "of the requests within every limit" in next(line for line in doc["verdict"]["lines"]
                                                          if line.startswith("SLOs"))


def test_without_slos_there_is_no_goodput():
    doc = simulate(H100, workload="random", rate=2.0, requests=20).document()
    assert "request_goodput" not in doc and doc["verdict"]["goodput"] is None


def test_cli_prints_the_goodput_beside_the_throughput(tmp_path):
    args = ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--workload", "random", "--requests", "40",
            "--rate", "4", "--slo", "ttft_p99=1", "--out", str(tmp_path)]
    shown = CliRunner().invoke(app, args)
    assert shown.exit_code == 0, shown.output
    assert "goodput (within every SLO)" in shown.stdout
    assert "<td>request_goodput</td>" in (tmp_path / "report.html").read_text()
    doc = json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout)
    assert doc["num_good"] == doc["num_completed"] == 40

