"""vLLM's own balancer of a deployment's data-parallel ranks (`vllm-dp`, planner/sim/router.py).

The pick rule is vLLM 0.19's (`DPLBAsyncMPClient.get_core_engine_for_request`): the lowest 4 x waiting
+ running, the first lowest from rank 0, then one more waiting counted on the rank picked; the counts are
the ranks' own as the DP coordinator last published them (every 100 ms), which replace the front end's.
It is the default for one deployment's dp ranks, a run is the same with and without fast-forward, and
the CLI refuses it where there are no dp ranks to balance.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
from typer.testing import CliRunner

from engine.deployment import Deployment
from planner.api import run_spec
from planner.cli.app import app
from planner.errors import PlannerError
from planner.runs.pipeline import Simulation
from planner.runs.spec import Fleet, Load, RunSpec
from planner.sim.router import DP_BALANCER, DpBalancer, parse_router

MOE_DP2 = Deployment(model="qwen3-30b-a3b", gpu="h100-sxm", dp=2, enable_expert_parallel=True, policy="vllm-v1",
                     max_model_len=4096)


class Rank:
    """A rank as the balancer reads it: the (waiting, running) counts it published by time t."""

    def __init__(self, published: list[tuple[float, int, int]]) -> None:
        self.published = published

    def request_counts_before(self, t: float) -> tuple[int, int]:
        before = [(w, r) for end, w, r in self.published if end < t]
        return before[-1] if before else (0, 0)


def test_ties_go_to_rank_0_and_each_pick_counts_as_waiting_until_the_next_publication():
    balancer = DpBalancer([Rank([]), Rank([])])
    # one publication window: rank 0 (tie), then rank 1 (rank 0 now scores 4), then rank 0 again (4 = 4)
    assert [balancer.pick(None, t) for t in (0.01, 0.02, 0.03)] == [0, 1, 0]


def test_a_publication_replaces_the_front_ends_own_counts():
    # Both ranks published one running request by 0.1 s: the three picks before it are forgotten, and the
    # tie goes to rank 0 again (the bias vLLM later rotated away, PR 47420).
    ranks = [Rank([(0.05, 0, 1)]), Rank([(0.06, 0, 1)])]
    balancer = DpBalancer(ranks)
    assert [balancer.pick(None, t) for t in (0.0, 0.01, 0.02)] == [0, 1, 0]
    assert balancer.pick(None, 0.15) == 0
    assert balancer.pick(None, 0.16) == 1


def test_waiting_requests_weigh_four_running_ones():
    # rank 0: 1 waiting (score 4); rank 1: 3 running (score 3): rank 1 takes it, then rank 0 (4 < 7)
    balancer = DpBalancer([Rank([(0.0, 1, 0)]), Rank([(0.0, 0, 3)])])
    assert [balancer.pick(None, t) for t in (0.12, 0.13)] == [1, 0]


def test_it_is_the_default_for_one_deployments_dp_ranks():
    assert Fleet().router_for(MOE_DP2) == DP_BALANCER and Fleet().policy(MOE_DP2).reads_engines
    assert Fleet(2).router_for(MOE_DP2) == "round-robin"                   # replicas: round-robin among them
    assert Fleet().router_for(MOE_DP2.replace(dp=1, enable_expert_parallel=False)) == "round-robin"
    assert Fleet(1, "least-requests").router_for(MOE_DP2) == "least-requests"   # the ranks behind a router
    spec = RunSpec(deployment=MOE_DP2, load=Load(rate=4.0))
    assert "--router" not in spec.command()
    assert "--router round-robin" in replace(spec, fleet=Fleet(1, "round-robin")).command()


@pytest.mark.parametrize("deployment, replicas", [(MOE_DP2.replace(dp=1), 1), (MOE_DP2, 2)])
def test_it_is_refused_without_dp_ranks_to_balance(deployment, replicas):
    with pytest.raises(PlannerError, match="--router vllm-dp is vLLM's balancer of one deployment's"):
        Fleet(replicas, DP_BALANCER).policy(deployment)
    assert parse_router(" VLLM-DP ").name == DP_BALANCER


def test_the_cli_refuses_it_in_one_line(tmp_path):
    result = CliRunner().invoke(app, ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--requests", "5",
                                      "--router", "vllm-dp", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "give --dp 2 or more and one replica" in result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1


@pytest.mark.parametrize("settings", [dict(), dict(model="llama-3.1-8b", enable_expert_parallel=False)],
                         ids=["moe-lockstep", "dense-own-clocks"])
def test_fast_forward_gives_the_step_by_step_run(settings):
    spec = run_spec(MOE_DP2.replace(**settings), workload="sharegpt", rate=12.0, duration=12.0, seed=4)
    sim = Simulation.prepare(spec)
    fast = sim.simulate()
    slow = Simulation.prepare(replace(spec, step_by_step=True)).simulate()
    assert fast.fleet.router == DP_BALANCER and fast.fleet.routes == slow.fleet.routes
    assert [repr(r) for r in fast.requests] == [repr(r) for r in slow.requests]
    assert fast.steps == slow.steps
    assert fast.fast_forwarded_steps > len(fast.steps) // 2
    assert 0.35 < fast.fleet.routes.count(0) / len(fast.fleet.routes) < 0.65
