"""Decode fast-forward gives exactly the step-by-step simulation: every request record,
every step record and shape, every metric, and the core's state at the end.

The caches are small so that windows meet everything the proof must get right:
preemption (recompute and swap), block-boundary crossings, the watermark,
prefix-cache hits, forks and copy-on-write. Each case also asserts that
fast-forward really took steps in bulk, so a change in the scheduler or block
manager that quietly disables it (or makes it diverge) fails here.
"""
from __future__ import annotations

import json

import pytest
import simpy

from planner.catalog import resolve_gpu, resolve_model
from planner.cost import RooflineCostModel
from planner.sim.engine import WakeAt
from golden_cases import numbers
from planner.sim import simulate
from sim_helpers import sim_plan
from workloads import WORKLOADS, Trace, TraceRequest, make_trace

OPT_13B, A100 = resolve_model("opt-13b"), resolve_gpu("a100-40g")
COST = RooflineCostModel(OPT_13B, A100)


def run_both(trace: Trace, **config):
    base = sim_plan(OPT_13B, A100, **config)
    fast = simulate(trace, base, COST)
    slow = simulate(trace, base, COST, fast_forward=False)
    return fast, slow


def assert_identical(fast, slow) -> None:
    assert slow.fast_forwarded_steps == 0
    assert fast.requests == slow.requests        # arrival, first token, every token time, finish, preemptions
    assert fast.steps == slow.steps              # every step: times, batch, memory breakdown, preemptions
    assert fast.shapes == slow.shapes            # what the cost model was asked
    assert fast.metrics == slow.metrics


CASES = [(w, mode, caching) for w in WORKLOADS for mode in ("recompute", "swap")
         for caching in (False, True) if not (caching and w in ("alpaca", "fixed", "uniform"))]


@pytest.mark.parametrize("workload,mode,caching", CASES)
def test_fast_forward_equals_step_by_step(workload, mode, caching):
    requests = 12 if workload == "beam" else 40
    trace = make_trace(workload, num_requests=requests, rate=4.0, seed=3)
    fast, slow = run_both(trace, preemption_mode=mode, enable_prefix_caching=caching, num_gpu_blocks=160,
                          num_cpu_blocks=400, block_size=8, max_model_len=2048)
    assert_identical(fast, slow)
    if workload != "beam":   # beam search is outside the proof: every step runs normally there
        assert fast.fast_forwarded_steps > len(fast.steps) // 2
    if workload in ("sharegpt", "chatbot"):
        assert fast.metrics["preemptions"]["total"] > 0      # the cache really was tight


@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_fast_forward_at_other_block_sizes_and_budgets(block_size):
    trace = make_trace("sharegpt", num_requests=30, rate=8.0, seed=1)
    fast, slow = run_both(trace, block_size=block_size, num_gpu_blocks=max(40, 2400 // block_size),
                          num_cpu_blocks=4000 // block_size, max_num_seqs=6, max_model_len=2048)
    assert_identical(fast, slow)
    assert fast.fast_forwarded_steps > 0


def test_window_runs_up_to_the_limit_of_free_blocks():
    # Two long requests that grow until the cache is full: windows must stop
    # exactly where the append check would fail, and the preemption lands on
    # the same step as step by step.
    trace = Trace([TraceRequest(request_id=r, arrival_time=0.0, prompt_len=20, output_len=200) for r in "AB"],
                  name="two")
    fast, slow = run_both(trace, block_size=4, num_gpu_blocks=60, num_cpu_blocks=60, max_model_len=1024)
    assert_identical(fast, slow)
    assert fast.metrics["preemptions"]["total"] > 0
    assert fast.fast_forwarded_steps > 100


def test_model_length_limit_ends_requests_on_the_same_step():
    trace = Trace([TraceRequest(request_id=str(i), arrival_time=0.1 * i, prompt_len=50, output_len=500)
                   for i in range(4)], name="long")
    fast, slow = run_both(trace, block_size=16, num_gpu_blocks=100, num_cpu_blocks=0, max_model_len=300)
    assert_identical(fast, slow)
    assert {r.output_len for r in fast.requests} == {250}


def test_step_by_step_turns_it_off():
    trace = make_trace("sharegpt", num_requests=10, rate=2.0, seed=0)
    result = simulate(trace, sim_plan(OPT_13B, A100), COST, fast_forward=False)
    assert result.fast_forwarded_steps == 0
    assert simulate(trace, sim_plan(OPT_13B, A100), COST).fast_forwarded_steps > 0


@pytest.mark.parametrize("now,end", [(0.1, 0.30000000000000004), (1e-9, 3.7), (123.456, 123.456000001),
                                     (0.0, 5e-324), (7.0, 7.0),
                                     # no delay reaches these: now + delay ties and rounds to even past them
                                     (0.049120685437784986, 0.23426102357652842),
                                     (0.040515055382920565, 0.19165613971291487)])
def test_a_sleep_lands_exactly_on_the_end_time(now, end):
    # A slept-through plan must end on the float a step-by-step run reaches by adding each duration.
    env = simpy.Environment(initial_time=now)

    def sleeper():
        yield WakeAt(env, end)
    env.process(sleeper())
    env.run()
    assert env.now == end


def test_cli_step_by_step_gives_the_same_document(tmp_path):
    from typer.testing import CliRunner

    from planner.cli.app import app

    docs = []
    for extra in ([], ["--step-by-step"]):
        result = CliRunner().invoke(app, ["simulate", "--workload", "sharegpt", "--requests", "30", "--rate", "4",
                                          "--out", str(tmp_path / str(len(docs))), "--json", *extra])
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout)
        docs.append(numbers(doc))       # every number; the command lines differ by the flag
    assert docs[0] == docs[1]
    assert docs[0]["num_completed"] == 30


def test_windows_give_each_decode_its_own_context_as_step_by_step_does():
    # The measured model prices every decode sequence at its own context (from the
    # shape's histogram of contexts), so a window must carry the histogram step
    # by step, sequences crossing into the next power-of-two bucket included.
    from planner.cost.measured import MeasuredCostModel
    from planner.cost.shape import context_histogram

    model, gpu = resolve_model("llama-3.1-8b"), resolve_gpu("h100-sxm")
    cost = MeasuredCostModel(model, gpu)
    trace = make_trace("sharegpt", num_requests=30, rate=4.0, seed=2)
    base = sim_plan(model, gpu, num_gpu_blocks=400, num_cpu_blocks=400, max_model_len=4096)
    fast, slow = simulate(trace, base, cost), simulate(trace, base, cost, fast_forward=False)
    assert_identical(fast, slow)
    assert fast.fast_forwarded_steps > len(fast.steps) // 2
    decodes = [s for s in fast.shapes if s.decode_seqs]
    for s in decodes:
        hist = s.decode_histogram
        assert sum(hist[1::3]) == s.decode_seqs and sum(hist[2::3]) == s.decode_context
        assert all(2 ** (k - 1) < total / n <= 2 ** k for k, n, total in zip(hist[::3], hist[1::3], hist[2::3]))
    assert sum(len(s.decode_histogram) > 3 for s in decodes) > len(decodes) // 4   # contexts really do differ
    assert context_histogram([40, 3, 33, 64, 65]) == (2, 1, 3, 6, 3, 137, 7, 1, 65)
