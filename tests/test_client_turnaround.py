"""A closed loop's client turnaround: served clients' next requests join the step after the one running."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from engine.deployment import Deployment
from planner.cli import app
from planner.cost.linear import LinearCostModel
from planner.sim import simulate
from planner.sim.fleet import simulate_fleet
from sim_helpers import sim_plan
from workloads import make_trace

COST = LinearCostModel(0.01, 1e-4)      # every step at least 10 ms


def trace(n: int = 60):
    return make_trace("random", num_requests=n, rate=1.0, seed=0, input_len=200, output_len=30, range_ratio=0.5)


def run(turnaround: float, clients: int = 6, policy: str = "vllm-v1", **options):
    plan = sim_plan("opt-125m", "a100-40g", policy=policy, client_turnaround=turnaround)
    return simulate(trace(), plan, COST, concurrency=clients, **options)


@pytest.mark.parametrize("policy", ["vllm-v1", "paper"])
def test_a_served_clients_next_request_arrives_a_turnaround_after_and_joins_the_step_after_the_running_one(policy):
    result = run(0.002, policy=policy)
    records, steps = result.requests, result.steps
    finishes = sorted(r.finish for r in records)
    for r in records[6:]:            # the first six are sent at t = 0
        assert any(r.arrival == pytest.approx(f + 0.002, abs=1e-12) for f in finishes)
        # the step running when it arrived had started before it: the request's first step is a later one
        running = next(s for s in steps if s.start < r.arrival < s.end)
        assert r.first_token > running.end


def test_in_process_clients_join_the_very_next_step_and_served_ones_wait_a_step_longer():
    at_once, served = run(0.0), run(0.002)
    assert all(r.arrival in {q.finish for q in at_once.requests} for r in at_once.requests[6:])
    assert served.metrics.ttft_mean > at_once.metrics.ttft_mean + 0.005     # about one 10 ms step more
    assert served.metrics.num_completed == at_once.metrics.num_completed == 60


@pytest.mark.parametrize("policy", ["vllm-v1", "paper"])
def test_fast_forward_gives_the_step_by_step_result_with_a_turnaround(policy):
    fast, slow = run(0.003, policy=policy), run(0.003, policy=policy, fast_forward=False)
    assert fast.fast_forwarded_steps > 0
    assert fast.requests == slow.requests and fast.steps == slow.steps


def test_a_turnaround_longer_than_a_step_leaves_the_engine_idle_meanwhile():
    result = run(0.5, clients=1)
    records = result.requests
    assert all(b.arrival == pytest.approx(a.finish + 0.5, abs=1e-12) for a, b in zip(records, records[1:]))
    assert result.simulated_time > records[-1].finish - records[0].arrival - 1e-9
    assert result.metrics.mean_concurrency < 1.0


@pytest.mark.parametrize("router", ["round-robin", "least-requests"])
def test_a_fleet_of_served_clients_fast_forwards_as_it_steps(router):
    plan = sim_plan("opt-125m", "a100-40g", policy="vllm-v1", client_turnaround=0.002)
    fast, slow = (simulate_fleet(trace(), plan, COST, replicas=2, router=router, concurrency=6, fast_forward=ff)
                  for ff in (True, False))
    assert fast.requests == slow.requests and fast.steps == slow.steps
    one = simulate_fleet(trace(), plan, COST, replicas=1, concurrency=6)
    assert one.requests == run(0.002).requests       # one replica is the lone deployment


@pytest.mark.parametrize("value", [-0.001, float("nan"), float("inf")])
def test_a_turnaround_is_a_finite_number_of_seconds(value):
    with pytest.raises(ValueError, match="client_turnaround must be a finite number of seconds >= 0"):
        Deployment(client_turnaround=value)


def test_cli_takes_the_turnaround_and_refuses_a_negative_one_in_one_line():
    runner = CliRunner()
    bad = runner.invoke(app, ["simulate", "--model", "opt-125m", "--gpu", "a100-40g", "--workload", "random",
                              "--requests", "20", "--concurrency", "4", "--client-turnaround", "-1"])
    assert bad.exit_code != 0 and "client_turnaround must be a finite number" in bad.output
    assert "Traceback" not in bad.output
