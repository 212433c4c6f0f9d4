"""The dp ranks of a MoE deployment step in lockstep (planner/sim/lockstep.py), as vLLM aligns them."""
from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from engine.deployment import Deployment
from planner.api import run_spec
from planner.runs.pipeline import Simulation
from planner.runs.spec import Fleet
from planner.sim.fleet import simulate_fleet
from workloads import Trace

MOE = dict(model="qwen3-30b-a3b", gpu="h100-sxm", dp=2, enable_expert_parallel=True, policy="vllm-v1",
           max_model_len=4096)


def _simulation(rate: float | None = 8.0, duration: float | None = 20.0, requests: int | None = None,
                concurrency: int | None = None, router: str | None = None, seed: int = 3, **settings) -> Simulation:
    deployment = Deployment(**{**MOE, **settings})
    spec = run_spec(deployment, workload="sharegpt", rate=rate, duration=duration, requests=requests,
                    concurrency=concurrency, seed=seed, **({"fleet": Fleet(1, router)} if router else {}))
    return Simulation.prepare(spec)


def _ranks(result) -> list[list[tuple]]:
    return [[(s.start, s.end, s.batch_size, s.prefill_tokens, s.decode_tokens, s.kv_blocks_used) for s in part.steps]
            for part in result.fleet.replicas]


def _same_run(a, b) -> None:
    assert _ranks(a) == _ranks(b)
    assert [repr(r) for r in a.requests] == [repr(r) for r in b.requests]
    assert a.fleet.routes == b.fleet.routes


@pytest.mark.parametrize("case", [
    dict(),                                              # vllm-dp, the default: publications every 100 ms
    dict(router="round-robin"),                          # every rank knows its next arrival
    dict(router="least-requests"),                       # routed as requests come: a request cuts the segment
    dict(router="least-kv"),                             # reads the ranks' blocks mid-plan
    dict(concurrency=24, rate=None, duration=None, requests=150),   # closed loop: a finish sends the next
    # ... while the ranks step: vllm-dp must not count a request that reached a rank during its step
    dict(concurrency=16, rate=None, duration=None, requests=80, dp=4, async_scheduling=False, seed=0),
    dict(async_scheduling=True),
    # requests queue behind max_num_seqs while the ranks sleep through runs: vllm-dp reads a run in flight
    dict(rate=12.0, duration=6.0, enable_prefix_caching=False, max_num_seqs=4),
    dict(enable_prefix_caching=False),
    dict(dp=4, rate=16.0),                               # four ranks
    dict(kv_offloading_size=4.0),                        # a CPU KV tier per rank, written as the plans are taken
    dict(kv_offloading_size=0.05, router="least-requests", num_gpu_blocks=400),   # a full one, loads
], ids=["vllm-dp", "round-robin", "least-requests", "least-kv", "closed-loop", "closed-loop-sync", "async",
        "queued", "no-prefix-cache", "dp4", "cpu-tier", "cpu-tier-small"])
def test_fast_forward_gives_the_step_by_step_run(case):
    """Plans held in flight across the ranks' events give the very steps and requests of stepping one
    group step at a time."""
    sim = _simulation(**case)
    fast = sim.simulate()
    slow = Simulation.prepare(replace(sim.spec, step_by_step=True)).simulate()
    _same_run(fast, slow)
    assert fast.fast_forwarded_steps > len(fast.steps) // 2       # fast-forward did most of the work
    assert fast.metrics.num_completed == len(fast.requests)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dp=st.sampled_from([2, 3, 4]), rate=st.sampled_from([2.0, 12.0, 40.0]),
       router=st.sampled_from([None, "round-robin", "least-requests", "least-kv"]), caching=st.booleans(),
       max_num_seqs=st.sampled_from([4, 64]), blocks=st.sampled_from([None, 300]))
def test_fast_forward_gives_the_step_by_step_run_for_any_deployment(dp, rate, router, caching, max_num_seqs, blocks):
    """The same, drawn: ranks, load, router, prefix caching, a small batch cap, a cache small enough
    to preempt."""
    sim = _simulation(rate=rate, duration=6.0, router=router, dp=dp, enable_prefix_caching=caching,
                      max_num_seqs=max_num_seqs, **({"num_gpu_blocks": blocks} if blocks else {}))
    _same_run(sim.simulate(), Simulation.prepare(replace(sim.spec, step_by_step=True)).simulate())


def test_the_ranks_step_together_each_step_as_long_as_the_longest():
    """Two ranks' steps that overlap in time are the same group step: the same start and end. A group
    step lasts as long as its longest rank step, so each rank's step is at least its own price and the
    slowest rank's exactly that."""
    sim = _simulation(rate=10.0)
    result = sim.simulate()
    step_time = sim.cost_model.step_time
    by_interval: dict[tuple[float, float], list[float]] = {}
    starts: dict[float, float] = {}
    for part in result.fleet.replicas:
        for step, shape in zip(part.steps, part.shapes):
            by_interval.setdefault((step.start, step.end), []).append(step_time(shape))
            assert starts.setdefault(step.start, step.end) == step.end      # no overlap with other boundaries
    shared = 0
    for (start, end), prices in by_interval.items():
        assert end - start == pytest.approx(max(prices), rel=1e-9)
        shared += len(prices) == 2
    assert shared > len(by_interval) // 2          # at 10 req/s both ranks are busy most of the time
    intervals = sorted(by_interval)
    assert all(a[1] <= b[0] for a, b in zip(intervals, intervals[1:]))   # one clock: group steps in sequence


def test_lockstep_lengthens_the_ranks_steps_and_one_busy_rank_runs_alone():
    """Waiting for the other rank's longer steps (its prompts) makes decode slower than ranks on their own
    clocks; with one request, the other rank idle, lockstep changes nothing."""
    sim = _simulation(rate=10.0)
    trace = sim.spec.load.trace()
    plan, cost = sim.plan, sim.cost_model
    together = simulate_fleet(trace, plan, cost, replicas=2, seed=3)
    apart = simulate_fleet(trace, plan, cost, replicas=2, seed=3, lockstep=False)
    assert together.metrics.tpot_mean > 1.01 * apart.metrics.tpot_mean
    assert together.metrics.num_completed == apart.metrics.num_completed
    one = Trace(trace.requests[:1])
    _same_run(simulate_fleet(one, plan, cost, replicas=2, seed=3), simulate_fleet(one, plan, cost, replicas=2, seed=3,
                                                                                   lockstep=False))


def test_a_dense_models_dp_ranks_keep_their_own_clocks():
    """vLLM aligns the dp ranks of a MoE only; a dense model's ranks are independent engines."""
    sim = _simulation(rate=10.0, model="llama-3.1-8b", enable_expert_parallel=False)
    result = sim.simulate()
    starts = [{s.start for s in part.steps} for part in result.fleet.replicas]
    assert len(starts[0] & starts[1]) < 0.1 * len(starts[0])
