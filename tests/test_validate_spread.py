"""validate's simulated interval: K seeds of timing noise, whether each measurement falls inside, the verdict."""
from __future__ import annotations

import json

import pytest

from engine.deployment import Deployment
from planner.errors import PlannerError
from planner.validation.compare import COMPARED, metric
from planner.validation.report import judge, validation_verdict, write_report
from planner.validation.run import validate
from planner.validation.spec import ValidationSpec
from planner.validation.spread import place, simulate_spread
from sim_helpers import sim_plan
from tiny_models import save_tiny_model
from workloads import make_trace

# It reads the wall clock (a live engine, a server, a time limit): scripts/test.sh runs it alone.
pytestmark = pytest.mark.serial


class NoisyConstantCost:
    """A ConstantCost with the parts and residual spread NoisyCost draws from (a calibrated model's interface)."""

    sampling = "greedy"

    def __init__(self, sd: float = 0.2, seconds: float = 0.01) -> None:
        self.name = f"noisy-constant({seconds * 1e3:g}ms)"
        self.seconds = seconds
        self.noise_sd = {name: sd for name in ("prefill", "decode", "sched_prefill", "sched_decode",
                                               "sample_greedy", "sample_random", "swap", "copy")}

    def breakdown(self, shape) -> dict[str, float]:
        return {"forward": 0.8 * self.seconds, "host": 0.2 * self.seconds}

    def step_time(self, shape) -> float:
        return self.seconds


class ConstantCost:
    name = "constant(10ms)"

    def step_time(self, shape) -> float:
        return 0.01


def _spread(cost, seeds=5, workers=1):
    trace = make_trace("alpaca", num_requests=30, rate=20.0, seed=0).scaled(length_scale=0.3, max_output_len=40)
    return simulate_spread(trace, sim_plan(gpu="a100-40g"), cost, seeds=seeds, sim_seed=0, metric_of=metric,
                           metrics=COMPARED, workers=workers)


@pytest.mark.parametrize("measured, inside, miss", [
    (10.0, True, 0.0), (9.0, True, 0.0), (11.0, True, 0.0),      # the edges belong to the interval
    (8.0, False, 9.0 / 8.0 - 1),                                   # below: the low edge is 12.5% high
    (12.0, False, 11.0 / 12.0 - 1),                                # above: the high edge is 8.3% low
    (None, None, None),
])
def test_a_measurement_is_placed_against_the_interval(measured, inside, miss):
    got_inside, got_miss = place(measured, {"low": 9.0, "high": 11.0})
    assert got_inside is inside
    assert got_miss == (None if miss is None else pytest.approx(miss))
    assert place(measured, None) == (None, None)


def test_the_noisy_seeds_are_reproducible_and_differ_from_each_other():
    first, again = _spread(NoisyConstantCost()), _spread(NoisyConstantCost())
    assert first.seeds == [1, 2, 3, 4, 5] and first.level == 0.9
    assert first.intervals == again.intervals                  # same seeds, same numbers
    e2e = first.intervals["e2e_mean"]
    assert e2e["n"] == 5 and e2e["low"] < e2e["mean"] < e2e["high"]   # the noise moves the result
    assert set(first.intervals) <= set(COMPARED) and {"request_throughput", "step_time_median"} <= set(first.intervals)


def test_the_process_pool_gives_what_one_process_gives():
    alone, pooled = _spread(NoisyConstantCost(), seeds=3, workers=1), _spread(NoisyConstantCost(), seeds=3, workers=2)
    assert pooled.workers == 2 and alone.workers == 1
    assert alone.intervals == pooled.intervals


def test_no_noise_no_interval():
    assert _spread(ConstantCost()) is None                        # nothing to draw the noise from
    assert _spread(NoisyConstantCost(), seeds=0) is None          # --seeds 0
    flat = _spread(NoisyConstantCost(sd=0.0), seeds=2)            # zero spread: a point, the noiseless value
    row = flat.intervals["request_throughput"]
    assert row["low"] == row["high"]


def test_seeds_must_not_be_negative():
    with pytest.raises(PlannerError, match="--seeds"):
        ValidationSpec(seeds=-1)


@pytest.fixture(scope="module")
def live_validation(tmp_path_factory):
    """One short live validation of a tiny model, priced by the noisy constant model (seconds on a CPU)."""
    folder = save_tiny_model("llama", tmp_path_factory.mktemp("llama"))
    spec = ValidationSpec(Deployment(model=folder, gpu="cpu", block_size=8, max_num_seqs=8), workload="alpaca",
                          rate=40.0, requests=12, length_scale=0.3, max_prompt_len=40, max_output_len=24, seeds=4)
    return validate(spec, cost_model=NoisyConstantCost())


def test_comparison_json_carries_the_interval_of_every_metric(live_validation, tmp_path):
    v = live_validation
    paths, doc = write_report(v, tmp_path / "report")
    assert json.loads(paths["comparison"].read_text()) == doc
    spread = doc["simulated_spread"]
    assert spread["seeds"] == [1, 2, 3, 4] and spread["level"] == 0.9 and spread["wall_s"] >= 0
    for name in ("request_throughput", "e2e_mean", "step_time_median"):
        row = doc["comparison"][name]
        assert set(row) == {"measured", "simulated", "relative_error", "interval_low", "interval_high",
                            "inside_interval", "interval_miss"}
        assert row["interval_low"] <= row["interval_high"]
        inside = row["interval_low"] <= row["measured"] <= row["interval_high"]
        assert row["inside_interval"] is inside and (row["interval_miss"] == 0) is inside
        assert spread["intervals"][name]["low"] == row["interval_low"]
    assert set(doc["verdict"]["judged"]) == {"request_throughput", "e2e_mean", "step_time_median"}
    assert doc["verdict"]["seeds"] == 4
    markdown = paths["markdown"].read_text()
    assert "simulated 90% interval" in markdown and "over 4 simulations" in markdown
    assert "simulated 90% interval" in paths["html"].read_text()


def _forced(v, name, *, simulated, low, high):
    """Set one metric's simulated value and interval around the measurement (the verdict reads only these)."""
    measured = metric(v.live.metrics, name)
    v.simulated[name] = simulated * measured
    v.spread.intervals[name] = {**v.spread.intervals[name], "low": low * measured, "high": high * measured}


def test_the_verdict_passes_a_metric_inside_the_interval_even_off_its_target(live_validation):
    v = live_validation
    saved = (dict(v.simulated), {k: dict(b) for k, b in v.spread.intervals.items()})
    try:
        for name in ("request_throughput", "step_time_median"):
            _forced(v, name, simulated=1.0, low=0.99, high=1.01)       # on target
        _forced(v, "e2e_mean", simulated=1.2, low=0.95, high=1.3)       # 20% off, but the noise allows it
        judged = judge(v)
        assert judged["e2e_mean"] == {**judged["e2e_mean"], "within_target": False, "inside_interval": True,
                                      "pass": True}
        verdict = validation_verdict(v)
        assert verdict["within_targets"] and "inside the simulated 90% interval" in verdict["lines"][0]

        _forced(v, "e2e_mean", simulated=1.2, low=1.1, high=1.3)        # 20% off and outside: 10% short of it
        judged = judge(v)["e2e_mean"]
        assert not judged["pass"] and judged["interval_miss"] == pytest.approx(0.1)
        verdict = validation_verdict(v)
        assert not verdict["within_targets"] and "e2e_mean +20.0%" in verdict["missed"][0]
        assert "the measurement outside the simulated 90% interval, errors +10.0% to +30.0%" in verdict["missed"][0]

        _forced(v, "e2e_mean", simulated=1.08, low=1.1, high=1.3)       # outside, but within the 10% target
        assert judge(v)["e2e_mean"]["pass"] and validation_verdict(v)["within_targets"]
    finally:
        v.simulated.clear()
        v.simulated.update(saved[0])
        v.spread.intervals.update(saved[1])


def test_without_a_spread_the_targets_alone_judge(live_validation):
    v = live_validation
    spread, v.spread = v.spread, None
    try:
        rows = v.comparison()
        assert all(r["inside_interval"] is None and r["interval_low"] is None for r in rows.values())
        verdict = validation_verdict(v)
        assert verdict["seeds"] == 0 and all(j["inside_interval"] is None for j in verdict["judged"].values())
        assert verdict["within_targets"] == all(j["within_target"] for j in verdict["judged"].values())
    finally:
        v.spread = spread
