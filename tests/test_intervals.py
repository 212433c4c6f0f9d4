"""Prediction intervals: K seeds, seeded timing noise, capacity at a confidence."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from planner.cli.app import app
from planner.cost.shape import StepShape
from planner.cost.wrappers import NoisyCost
from planner.runs.seeds import interval, intervals


def test_interval_is_mean_and_interpolated_percentiles():
    iv = interval([float(x) for x in range(1, 11)])       # 1..10
    assert iv["mean"] == 5.5 and iv["level"] == 0.9 and iv["n"] == 10
    assert iv["low"] == pytest.approx(1.45) and iv["high"] == pytest.approx(9.55)
    assert interval([3.0]) == {"mean": 3.0, "low": 3.0, "high": 3.0, "level": 0.9, "n": 1}
    found = intervals([{"e2e_mean": 1.0, "ttft_p99": None}, {"e2e_mean": 3.0}])
    assert set(found) == {"e2e_mean"} and found["e2e_mean"]["mean"] == 2.0


class Base:
    name, sampling = "calibrated(x)", "greedy"

    def __init__(self, sd):
        self.noise_sd = {c: sd for c in ("prefill", "decode", "sched_prefill", "sched_decode", "sample_greedy",
                                         "sample_random", "swap", "copy")}

    def breakdown(self, shape):
        return {"forward": 0.010, "host": 0.001, "sampling": 0.0005, "swap": 0.0, "copy": 0.0}

    def step_time(self, shape):
        return sum(self.breakdown(shape).values())


def test_timing_noise_is_seeded_centred_and_scaled_by_the_residual_spread():
    shape = StepShape(decode_seqs=4, decode_context=100)
    a = [NoisyCost(Base(0.1), seed=7).step_time(shape) for _ in range(3)]
    draws = NoisyCost(Base(0.1), seed=7)
    same = [draws.step_time(shape) for _ in range(2000)]
    again = NoisyCost(Base(0.1), seed=7)
    assert [again.step_time(shape) for _ in range(2000)] == same          # reproducible
    assert a[0] == same[0] and len(set(same)) > 1000                       # it does scatter
    mean = sum(same) / len(same)
    assert mean == pytest.approx(0.0115, rel=0.02)                         # centred on the model
    sd = (sum((x - mean) ** 2 for x in same) / len(same)) ** 0.5
    assert 0.6 * 0.1 * 0.0115 < sd < 1.2 * 0.1 * 0.0115
    assert NoisyCost(Base(0.0), seed=1).step_time(shape) == pytest.approx(0.0115)


def test_simulate_seeds_reports_intervals_in_table_and_result(tmp_path):
    out = tmp_path / "run"
    args = ["simulate", "--model", "opt-125m", "--gpu", "a100-40g", "--workload", "alpaca", "-n", "40",
            "--rate", "20", "--seeds", "3", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "mean and 90% interval" in result.output
    found = json.loads((out / "result.json").read_text())["intervals"]
    for name in ("request_throughput", "e2e_mean", "ttft_p99"):
        iv = found[name]
        assert iv["low"] <= iv["mean"] <= iv["high"] and iv["level"] == 0.9 and iv["n"] == 3
    assert found["e2e_mean"]["low"] < found["e2e_mean"]["high"]          # seeds differ


def test_timing_noise_needs_a_profile():
    result = CliRunner().invoke(app, ["simulate", "--model", "opt-125m", "--gpu", "a100-40g", "-n", "5",
                                      "--timing-noise"])
    assert result.exit_code != 0 and "--timing-noise needs a calibrated cost model" in result.output


def test_capacity_at_higher_confidence_is_never_higher(tmp_path):
    def capacity(confidence):
        out = tmp_path / f"c{confidence}"
        result = CliRunner().invoke(app, ["capacity", "--slo", "e2e_mean=2", "--model", "opt-125m", "--gpu", "a100-40g",
                                          "--workload", "alpaca", "-n", "30", "--seeds", "3", "--confidence",
                                          str(confidence), "--tolerance", "0.1", "--start-rate", "8",
                                          "--out", str(out), "--json"])
        assert result.exit_code == 0, result.output
        doc = json.loads((out / "capacity.json").read_text())
        assert doc["seeds"] == 3 and all(p["slo_probability"] in (0, 1 / 3, 2 / 3, 1) for p in doc["probes"])
        for p in doc["probes"]:
            assert p["meets"] == (p["slo_probability"] >= confidence)
        return doc["capacity_rate"]
    assert capacity(1.0) <= capacity(1 / 3)
