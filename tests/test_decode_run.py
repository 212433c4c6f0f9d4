"""A decode-batch plan priced as one run (planner/sim/decode_run.py) gives step_time's floats and shapes.

The measured model's `decode_step_times` prices rows of context histograms with array
operations; every row must be the very float `step_time` gives the same step, and the run's
shapes the very shapes the scalar plan built. End to end, a fleet and a lone deployment with
runs priced at once equal the same simulations priced step by step in the plan.
"""
from __future__ import annotations

import math
import random

import numpy as np
import pytest
from sim_helpers import sim_plan

from planner.catalog import resolve_gpu, resolve_model
from planner.catalog.quantization import weight_format
from planner.cost.measured import MeasuredCostModel
from planner.cost.shape import StepShape, context_histogram
from planner.cost.wrappers import NoisyCost, ScaledCostModel
from planner.sim import batch as batch_module
from planner.sim import simulate
from planner.sim.decode_run import DecodeRun, price_run, run_pricer
from planner.sim.fleet import simulate_fleet
from workloads import make_trace

LLAMA, H100 = resolve_model("llama-3.1-8b"), resolve_gpu("h100-sxm")


def _scalar(model, contexts):
    return model.step_time(StepShape(0, 0, 0, len(contexts), sum(contexts),
                                     decode_histogram=context_histogram(contexts)))


@pytest.mark.parametrize("knobs", [{"model": "llama-3.1-8b"}, {"model": "llama-3.1-8b", "async_scheduling": True},
                                   {"model": "llama-3.1-70b", "tp": 4}, {"model": "qwen3-30b-a3b", "tp": 2},
                                   {"model": "gpt-oss-120b", "tp": 2, "weight_format": weight_format("mxfp4")},
                                   {"model": "qwen3.5-35b-a3b", "tp": 2}])       # its GDN layers' decode too
def test_a_run_prices_each_step_as_step_time_does(knobs):
    model = MeasuredCostModel(knobs.pop("model"), H100, **knobs)
    rng = random.Random(7)
    for trial in range(40):
        bases = np.array([rng.choice([rng.randint(1, 40), rng.randint(1, 5000), rng.randint(60000, 200000)])
                          for _ in range(rng.randint(1, 70))])
        run = DecodeRun(bases, rng.randint(0, 300), 0)
        count = rng.randint(1, 90)
        low, counts, sums = run.chunk(0, count)
        times = model.decode_step_times(run.num, low, counts, sums).tolist()
        for row in range(count):
            contexts = (bases + run.first + row).tolist()
            assert times[row] == _scalar(model, contexts), (trial, row)
            # A short plan's step, priced from the batch's own bins: the same float.
            flat = context_histogram(contexts)
            bins = [list(flat[i:i + 3]) for i in range(0, len(flat), 3)]
            assert model.decode_pricer(run.num)(bins) == times[row], (trial, row)


def test_shapes_are_the_steps_histograms_and_contexts():
    rng = random.Random(3)
    bases = np.array([rng.randint(-20, 3000) for _ in range(25)]) + 30
    run = DecodeRun(bases, 5, int((bases + 5).sum()))
    run.chunk(0, 16)
    run.chunk(16, 40)
    shapes = run.shapes(50)
    assert run.shapes(20) == shapes[:20] and len(shapes) == 50
    for row, shape in enumerate(shapes):
        contexts = (bases + 5 + row).tolist()
        assert shape == StepShape(0, 0, 0, 25, sum(contexts), decode_histogram=context_histogram(contexts))


def test_extrapolation_is_flagged_for_the_steps_taken_only():
    fresh = MeasuredCostModel(LLAMA, H100)
    run = DecodeRun(np.array([100, 150, 300000]), 1, 0)
    # the next arrival falls before the step with the long context would start: not priced, not flagged
    ends, _, _ = price_run(run, fresh, fresh.decode_step_times, 0.0, 1e-9, 1, [0] * 16, 0, 100)
    assert len(ends) == 1
    scalar = MeasuredCostModel(LLAMA, H100)
    _scalar(scalar, [101, 151, 300001])
    assert fresh.extrapolated == scalar.extrapolated and scalar.extrapolated


@pytest.mark.parametrize("arrival_step", [0, 5, 63, 64, 100])    # 63: the first chunk's last step
def test_a_run_takes_the_step_scheduled_ahead_of_an_arrival(arrival_step):
    """Under async scheduling a request that arrives during a step joins the schedule made at the end of
    the next one, so a plan runs through that next step: one step past those starting before the arrival,
    the same floats, wherever the chunks end."""
    model = MeasuredCostModel(LLAMA, H100)
    run = DecodeRun(np.array([100, 2000, 7000]), 1, 0)
    whole, _, _ = price_run(run, model, model.decode_step_times, 0.0, math.inf, 300, [0] * 16, 0, 100)
    arrival = whole[arrival_step] - 1e-7           # during step arrival_step (0-based), near its end
    kept, _, _ = price_run(run, model, model.decode_step_times, 0.0, arrival, 300, [0] * 16, 0, 100)
    ahead, _, _ = price_run(run, model, model.decode_step_times, 0.0, arrival, 300, [0] * 16, 0, 100, 1)
    assert kept == whole[:arrival_step + 1]
    assert ahead == whole[:arrival_step + 2]


def test_wrappers_that_cannot_price_runs_step_as_before():
    assert run_pricer(MeasuredCostModel(LLAMA, H100)) is not None
    gpt_oss = MeasuredCostModel("gpt-oss-20b", H100, weight_format=weight_format("mxfp4"))
    assert run_pricer(gpt_oss) is not None                                # sliding-window layers too
    noisy = NoisyCost.__new__(NoisyCost)           # forwards what it lacks to its base: never the run price
    noisy.base = MeasuredCostModel(LLAMA, H100)
    assert callable(noisy.decode_step_times) and run_pricer(noisy) is None
    assert run_pricer(ScaledCostModel(MeasuredCostModel(LLAMA, H100), 1.1)) is None


@pytest.mark.parametrize("policy", ["paper", "vllm-v1"])
def test_runs_priced_at_once_equal_the_plan_priced_step_by_step(policy, monkeypatch):
    trace = make_trace("sharegpt", duration=6, rate=40.0, seed=5)
    plan = sim_plan(LLAMA, H100, policy=policy, max_model_len=8192)

    def both():     # a model each: the name says what its own run extrapolated (the lone one does)
        return (simulate_fleet(trace, plan, MeasuredCostModel(LLAMA, H100), replicas=4, router="least-requests"),
                simulate(trace, plan, MeasuredCostModel(LLAMA, H100)))

    priced = []
    monkeypatch.setattr(batch_module, "price_run", lambda *args: priced.append(1) or price_run(*args))
    runs = both()
    assert len(priced) > 100                          # the routed replicas' plans went through runs
    monkeypatch.setattr(batch_module, "run_pricer", lambda cost_model: None)
    for fast, slow in zip(runs, both()):
        assert fast.requests == slow.requests and fast.steps == slow.steps and fast.shapes == slow.shapes
        assert fast.summary() == slow.summary()


def test_shape_logs_read_as_lists_and_pickle_as_lists():
    import pickle

    from planner.sim.lazy_log import ShapeLog

    run = DecodeRun([30, 500, 1000], 2, 1536)
    log = ShapeLog([StepShape(1, 10, 55)])
    log.add_run(run, 4)
    log.append(StepShape(0, 0, 0, 3, 9))
    shapes = [StepShape(1, 10, 55), *run.shapes(4), StepShape(0, 0, 0, 3, 9)]
    assert len(log) == 6 and log == shapes and shapes == log and log[1:5] == shapes[1:5] and list(log) == shapes
    assert pickle.loads(pickle.dumps(log)) == shapes and type(pickle.loads(pickle.dumps(log))) is list
    later = ShapeLog.later(lambda: list(shapes), 6)
    assert later == log and len(later) == 6 and later[-1] == shapes[-1]


def test_a_step_log_holds_plans_as_entries_and_reads_as_their_records():
    import pickle

    from planner.sim.lazy_log import StepLog

    trace = make_trace("sharegpt", duration=5, rate=20.0, seed=4)
    run = simulate(trace, sim_plan(LLAMA, H100, policy="vllm-v1", max_model_len=8192), MeasuredCostModel(LLAMA, H100))
    log = run.steps
    assert isinstance(log, StepLog) and len(log.kept_records()) < len(log) / 2     # most steps not built yet
    ends = [end for entry in log.entries() for end in (entry.ends if hasattr(entry, "ends") else [entry.end])]
    times = [0.0, *ends, *(math.nextafter(end, math.inf) for end in ends),
             *(random.Random(1).uniform(0, run.simulated_time + 1) for _ in range(300))]
    found = [log.last_before(t) for t in times]      # the least-kv router's question, on the entries
    records = list(log)
    assert log.kept_records() is None and len(records) == len(log) and log == records
    for t, answer in zip(times, found):
        before = [r for r in records if r.end < t]
        assert answer == ((before[-1].end, before[-1].kv_blocks_used) if before else None)
    assert pickle.loads(pickle.dumps(log)) == records and type(pickle.loads(pickle.dumps(log))) is list


def test_a_fleets_shapes_are_its_replicas_in_step_order_when_read():
    trace = make_trace("sharegpt", duration=4, rate=30.0, seed=2)
    plan = sim_plan(LLAMA, H100, max_model_len=8192)
    fleet = simulate_fleet(trace, plan, MeasuredCostModel(LLAMA, H100), replicas=3, router="least-requests")
    parts = fleet.fleet.replicas
    by_replica = [iter(p.shapes) for p in parts]
    assert len(fleet.shapes) == len(fleet.steps)
    assert list(fleet.shapes) == [next(by_replica[r]) for r in fleet.fleet.step_replicas]


def test_step_columns_give_the_metrics_the_records_give():
    from engine.core.metrics import StepRecord, step_columns, summarize

    trace = make_trace("sharegpt", duration=5, rate=20.0, seed=4)
    run = simulate(trace, sim_plan(LLAMA, H100, policy="vllm-v1", max_model_len=8192), MeasuredCostModel(LLAMA, H100))
    still = [StepRecord(1.0, 1.0, i % 3 == 0, 2 + i, 2, 5 * (i % 2), i % 3, 10, 7, 1, 2, 0, 90, 0, 0) for i in range(9)]
    for steps in (run.steps, still, run.steps[:1]):
        assert summarize(run.requests, steps, columns=step_columns(steps)) == summarize(run.requests, steps)


@pytest.mark.parametrize("knobs", [{"policy": "vllm-v1"}, {"policy": "paper"},
                                   {"policy": "vllm-v1", "num_gpu_blocks": 700}])
def test_an_engines_step_columns_from_its_plans_equal_its_records_read_back(knobs, monkeypatch):
    from engine.core.metrics import step_columns
    from planner.sim.engine import SimulatedEngine

    checked = []
    own = SimulatedEngine.step_columns

    def checking(self):
        columns = own(self)
        assert self.plans_taken                              # most steps came from plans
        for name, values in step_columns(self.steps).items():
            assert columns[name].dtype == values.dtype and np.array_equal(columns[name], values), name
        checked.append(len(self.steps))
        return columns

    monkeypatch.setattr(SimulatedEngine, "step_columns", checking)
    trace = make_trace("sharegpt", duration=6, rate=40.0, seed=5)
    plan = sim_plan(LLAMA, H100, max_model_len=8192, **knobs)
    simulate(trace, plan, MeasuredCostModel(LLAMA, H100))
    simulate_fleet(trace, plan, MeasuredCostModel(LLAMA, H100), replicas=3, router="least-kv")
    assert len(checked) == 4
