"""Fleets (planner/sim/fleet.py, planner/sim/router.py): K replicas behind a router in one simulation.

One replica is the lone deployment request by request; a fleet's fast-forward equals its
step-by-step simulation under every routing policy; round-robin splits evenly, least-requests
never picks a busier replica, prefix-aware keeps a prefix on the replica that holds it; the
CLI takes --replicas and --router, refuses bad values in one line and writes the fleet block.
"""
from __future__ import annotations

import csv
import json
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_helpers import sim_plan
from typer.testing import CliRunner

from engine.core.routing import BaseRouter, session_owner
from engine.deployment import Deployment
from planner.catalog import resolve_gpu, resolve_model
from planner.cli.app import app
from planner.cost.measured import MeasuredCostModel
from planner.errors import PlannerError
from planner.runs.pipeline import Simulation
from planner.runs.spec import Fleet, Load, RunSpec
from planner.sim import simulate
from planner.sim.fleet import run_fleet, simulate_fleet
from planner.sim.router import Router, parse_router
from workloads import Trace, TraceRequest, make_trace

LLAMA, H100 = resolve_model("llama-3.1-8b"), resolve_gpu("h100-sxm")
MEASURED = MeasuredCostModel(LLAMA, H100)
POLICIES = ["round-robin", "least-requests", "least-kv", "prefix-aware", "weighted:least-requests=1,least-kv=1,prefix-aware=3"]
runner = CliRunner()


def plan(**knobs):
    return sim_plan(LLAMA, H100, **knobs)


def same_run(a, b) -> None:
    """Request by request and step by step the same simulation."""
    assert a.requests == b.requests
    assert a.steps == b.steps
    assert a.shapes == b.shapes and a.num_running == b.num_running
    assert a.summary() == b.summary()


def prefix_trace(num_requests=120, rate=20.0, num_prefixes=8, prefix_len=512, seed=0) -> Trace:
    return make_trace("prefix", num_requests=num_requests, rate=rate, seed=seed, prefix_len=prefix_len,
                      num_prefixes=num_prefixes)


# -- one replica is the lone deployment ---------------------------------------------------------------

@pytest.mark.parametrize("policy", ["round-robin", "least-requests", "least-kv", "prefix-aware"])
@pytest.mark.parametrize("engine_policy", ["paper", "vllm-v1"])
def test_one_replica_is_the_single_deployment_request_by_request(policy, engine_policy):
    # run_fleet itself (not simulate_fleet's shortcut): a router that reads the engines leaves the
    # replica blind to its next arrival, so each arrival cuts its plan; the times must not move.
    knobs = {"policy": engine_policy, "max_model_len": 8192, "enable_prefix_caching": True}
    p = plan(**knobs)
    trace = prefix_trace(num_requests=60, rate=12.0, num_prefixes=3) if policy == "prefix-aware" \
        else make_trace("sharegpt", num_requests=80, rate=16.0, seed=1)
    lone = simulate(trace, p, MEASURED)
    fleet = run_fleet(trace, p, MEASURED, 1, parse_router(policy))
    assert fleet.requests == lone.requests
    assert fleet.steps == lone.steps and fleet.shapes == lone.shapes
    assert fleet.metrics.to_dict() == lone.metrics.to_dict()
    assert fleet.fleet.routes == [0] * len(trace)


def test_one_replica_through_the_pipeline_is_todays_run():
    load = Load(workload="sharegpt", requests=60, rate=10.0)
    d = Deployment(model="llama-3.1-8b", gpu="h100-sxm")
    one = Simulation.prepare(RunSpec(deployment=d, load=load, fleet=Fleet(1, "least-requests"))).simulate()
    lone = Simulation.prepare(RunSpec(deployment=d, load=load)).simulate()
    same_run(one, lone)
    assert one.fleet is None and "fleet" not in one.summary()


# -- fast-forward equals step by step -------------------------------------------------------------------

@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("engine_policy", ["paper", "vllm-v1"])
def test_fleet_fast_forward_equals_step_by_step(policy, engine_policy):
    prefix = "prefix" in policy
    p = plan(policy=engine_policy, max_model_len=8192, enable_prefix_caching=prefix)
    trace = prefix_trace(num_requests=90, rate=30.0, num_prefixes=6, prefix_len=256, seed=2) if prefix \
        else make_trace("sharegpt", num_requests=120, rate=40.0, seed=2)
    fast = simulate_fleet(trace, p, MEASURED, replicas=3, router=policy)
    slow = simulate_fleet(trace, p, MEASURED, replicas=3, router=policy, fast_forward=False)
    assert fast.fleet.routes == slow.fleet.routes
    same_run(fast, slow)
    for a, b in zip(fast.fleet.replicas, slow.fleet.replicas):
        assert a.requests == b.requests and a.steps == b.steps
    if not (prefix and engine_policy == "vllm-v1"):    # vLLM v1 with prefix caching goes step by step
        assert fast.fast_forwarded_steps > len(fast.steps) // 3


def test_fleet_closed_loop_fast_forward_equals_step_by_step():
    p = plan(max_model_len=8192)
    trace = make_trace("sharegpt", num_requests=80, rate=1.0, seed=5)
    fast = simulate_fleet(trace, p, MEASURED, replicas=3, router="least-requests", concurrency=12)
    slow = simulate_fleet(trace, p, MEASURED, replicas=3, router="least-requests", concurrency=12,
                          fast_forward=False)
    assert fast.fleet.routes == slow.fleet.routes
    same_run(fast, slow)
    assert fast.metrics.num_completed == 80


# -- the policies ----------------------------------------------------------------------------------------

def test_round_robin_splits_evenly():
    trace = make_trace("sharegpt", num_requests=100, rate=20.0, seed=3)
    run = simulate_fleet(trace, plan(), MEASURED, replicas=4, router="round-robin")
    assert run.fleet.routes == [i % 4 for i in range(100)]
    summary = run.fleet.summary()
    assert [r["num_requests"] for r in summary["per_replica"]] == [25] * 4
    assert summary["load_imbalance"]["requests"] == 1.0
    assert sum(r["request_share"] for r in summary["per_replica"]) == pytest.approx(1.0)


def skewed_trace(count=80, gap=0.05) -> Trace:
    """Every other request long: round-robin over two replicas sends all the long ones to the first."""
    return Trace([TraceRequest(request_id=f"r{i}", arrival_time=gap * i, prompt_len=64,
                               output_len=800 if i % 2 == 0 else 8) for i in range(count)], name="skewed")


def test_least_requests_never_picks_a_busier_replica_and_beats_round_robin(monkeypatch):
    seen = []
    pick = Router.pick

    def watched(self, group, now, session=None):
        in_flight = [e.routed_count - e.ended_before(now) for e in self.engines]
        chosen = pick(self, group, now, session)
        seen.append((in_flight, chosen))
        return chosen

    monkeypatch.setattr(Router, "pick", watched)
    trace, p = skewed_trace(), plan()
    least = simulate_fleet(trace, p, MEASURED, replicas=2, router="least-requests")
    assert len(seen) == len(trace)
    assert all(counts[chosen] == min(counts) for counts, chosen in seen)
    rr = simulate_fleet(trace, p, MEASURED, replicas=2, router="round-robin")
    imbalance = {name: run.fleet.summary()["load_imbalance"] for name, run in (("least", least), ("rr", rr))}
    assert imbalance["least"]["output_tokens"] < imbalance["rr"]["output_tokens"]
    assert imbalance["least"]["busy_time"] <= imbalance["rr"]["busy_time"]
    assert least.metrics.e2e_mean < rr.metrics.e2e_mean


def test_least_kv_picks_the_emptiest_cache(monkeypatch):
    seen = []
    pick = Router.pick

    def watched(self, group, now, session=None):
        used = [e.blocks_used_before(now) for e in self.engines]
        chosen = pick(self, group, now, session)
        seen.append((used, chosen))
        return chosen

    monkeypatch.setattr(Router, "pick", watched)
    simulate_fleet(skewed_trace(60), plan(), MEASURED, replicas=3, router="least-kv")
    assert all(used[chosen] == min(used) for used, chosen in seen)


def test_prefix_aware_keeps_each_prefix_on_its_replica_and_hits_more_than_round_robin():
    p = plan(enable_prefix_caching=True, max_model_len=8192)
    trace = prefix_trace(num_requests=160, rate=4.0, num_prefixes=16, prefix_len=512, seed=7)
    aware = simulate_fleet(trace, p, MEASURED, replicas=4, router="prefix-aware")
    rr = simulate_fleet(trace, p, MEASURED, replicas=4, router="round-robin")
    homes: dict[str, set[int]] = {}
    for req, replica in zip(trace.requests, aware.fleet.routes):
        homes.setdefault(req.prefix_id, set()).add(replica)
    assert all(len(replicas) == 1 for replicas in homes.values()), homes   # the replica holding the prefix
    assert len({r for replicas in homes.values() for r in replicas}) > 1   # new prefixes still spread
    assert aware.prefix_cache_hit_rate > rr.prefix_cache_hit_rate + 0.05
    assert aware.metrics.ttft_mean < rr.metrics.ttft_mean
    per_replica = aware.fleet.summary()["per_replica"]
    assert all(0 <= r["prefix_cache_hit_rate"] <= 1 for r in per_replica)


def test_session_keeps_each_conversation_on_its_replica_and_hits_more_than_round_robin():
    """`session` (the vLLM production stack's): every turn of a conversation goes to the replica its id hashes to,
    so its history's cached blocks are there; a request of no session goes to the least loaded replica."""
    p = plan(enable_prefix_caching=True, max_model_len=8192)
    trace = make_trace("chatbot", num_requests=200, rate=3.0, seed=7)
    session = simulate_fleet(trace, p, MEASURED, replicas=4, router="session")
    rr = simulate_fleet(trace, p, MEASURED, replicas=4, router="round-robin")
    replica_of = {r.request_id: i for i, rep in enumerate(session.fleet.replicas) for r in rep.requests}
    conversations = {r.request_id: r.conversation_id for r in trace.requests}
    homes: dict[str, set[int]] = {}
    for request_id, replica in replica_of.items():
        homes.setdefault(conversations[request_id], set()).add(replica)
    assert all(replicas == {session_owner(conv, [0, 1, 2, 3])} for conv, replicas in homes.items())
    assert len({r for replicas in homes.values() for r in replicas}) == 4           # and conversations spread
    assert session.prefix_cache_hit_rate > rr.prefix_cache_hit_rate + 0.05
    same_run(session, simulate_fleet(trace, p, MEASURED, replicas=4, router="session", fast_forward=False))


def test_a_session_keeps_its_replica_while_others_leave_and_no_session_is_least_requests():
    sessions = [f"user-{i}" for i in range(400)]
    owners = [session_owner(s, [0, 1, 2, 3]) for s in sessions]
    assert sorted(Counter(owners).values())[0] > 400 / 4 * 0.75                 # spread about evenly
    without_2 = [session_owner(s, [0, 1, 3]) for s in sessions]                   # (positions in [0, 1, 3])
    assert all([0, 1, 3][w] == o for w, o in zip(without_2, owners) if o != 2)    # only replica 2's sessions move

    class Counts(BaseRouter):
        def in_flight(self, now):
            return [3, 1, 2]
    router = Counts(parse_router("session"), 3, 16)
    assert router.pick([1, 2, 3], 0.0) == 1                                       # no session: the least loaded
    assert router.pick([1, 2, 3], 0.0, session="user-7") == session_owner("user-7", [0, 1, 2]) == 2
    mixed = Counts(parse_router("weighted:session=1,least-requests=2"), 3, 16)
    assert mixed.pick([1, 2, 3], 0.0, session="user-7") == 1                      # load outweighs the session


# -- the weighted mix and bad specs -------------------------------------------------------------------

def test_weighted_mix_parses():
    policy = parse_router(" Weighted:least-requests=1, prefix-aware=3 ")
    assert policy.name == "weighted:least-requests=1,prefix-aware=3"
    assert dict(policy.weights) == {"least-requests": 1.0, "prefix-aware": 3.0}
    assert policy.uses_prefix and policy.reads_engines and not policy.round_robin
    assert not parse_router("weighted:least-kv=0.5,prefix-aware=0").uses_prefix
    assert parse_router(None).round_robin and not parse_router("round-robin").reads_engines
    assert parse_router("least-kv").weights == (("least-kv", 1.0),)


@pytest.mark.parametrize("text", ["nonsense", "weighted", "weighted:", "weighted:foo=1", "weighted:least-kv",
                                  "weighted:least-kv=x", "weighted:least-kv=-1", "weighted:least-kv=nan",
                                  "weighted:least-kv=inf", "weighted:least-kv=0", "weighted:round-robin=1",
                                  "weighted:least-kv=1,least-kv=2"])
def test_bad_router_specs_are_refused(text):
    with pytest.raises(PlannerError, match="--router"):
        parse_router(text)


def test_fleet_spec_checks_and_command_line():
    d = Deployment(model="llama-3.1-8b", gpu="h100-sxm")
    assert Fleet(2, "prefix-aware").policy(d).uses_prefix      # vllm-v1, the default, caches prefixes
    for off in (d.replace(enable_prefix_caching=False), d.replace(policy="paper")):
        with pytest.raises(PlannerError, match="--enable-prefix-caching"):
            Fleet(2, "prefix-aware").policy(off)
    for bad in (0, -1, True, 2.5):
        with pytest.raises(PlannerError, match="--replicas"):
            Fleet(bad).policy(d)
    spec = RunSpec(deployment=d, load=Load(workload="sharegpt", rate=5.0), fleet=Fleet(4, "least-kv"))
    assert "--replicas 4 --router least-kv" in spec.command()
    assert "--replicas" not in RunSpec(deployment=d).command()


# -- property: every request goes to exactly one replica and all complete --------------------------------

@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.tuples(st.integers(1, 600), st.integers(1, 300), st.floats(0, 0.2)), min_size=1,
                        max_size=30),
       replicas=st.integers(1, 4), policy=st.sampled_from(POLICIES))
def test_every_request_goes_to_one_replica_and_completes(lengths, replicas, policy):
    t, requests = 0.0, []
    for i, (prompt, output, gap) in enumerate(lengths):
        t += gap
        requests.append(TraceRequest(request_id=f"r{i}", arrival_time=t, prompt_len=prompt, output_len=output,
                                     prefix_id=f"p{i % 3}" if prompt > 64 else None,
                                     prefix_len=64 if prompt > 64 else 0))
    trace = Trace(requests, name="drawn")
    p = plan(enable_prefix_caching=True, max_model_len=4096)
    fast = run_fleet(trace, p, MEASURED, replicas, parse_router(policy))
    routes = fast.fleet.routes
    assert len(routes) == len(trace) and all(0 <= r < replicas for r in routes)
    assert sorted(r.request_id for part in fast.fleet.replicas for r in part.requests) == \
        sorted(r.request_id for r in trace.requests)
    for i, part in enumerate(fast.fleet.replicas):
        assert [r.request_id for r in part.requests] == \
            [req.request_id for req, j in zip(trace.requests, routes) if j == i]
    assert fast.metrics.num_completed == len(trace) and all(r.completed for r in fast.requests)
    assert fast.kv_blocks_used_at_end == sum(part.kv_blocks_used_at_end for part in fast.fleet.replicas)
    slow = run_fleet(trace, p, MEASURED, replicas, parse_router(policy), fast_forward=False)
    assert slow.fleet.routes == routes and slow.requests == fast.requests


# -- the CLI -----------------------------------------------------------------------------------------------

def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


BASE = ("--model", "llama-3.1-8b", "--gpu", "h100", "--requests", 40)
SIM = (*BASE, "--rate", 8)


@pytest.mark.parametrize("args,message", [
    (("--replicas", 0), "--replicas must be >= 1"),
    (("--replicas", "two"), "--replicas"),
    (("--replicas", 2, "--router", "nonsense"), "--router 'nonsense'"),
    (("--replicas", 2, "--router", "prefix-aware", "--no-enable-prefix-caching"), "--enable-prefix-caching"),
    (("--replicas", 2, "--router", "weighted:least-kv=x"), "must be a number"),
])
@pytest.mark.parametrize("command", ["simulate", "capacity"])
def test_cli_refuses_bad_fleets_in_one_line(tmp_path, command, args, message):
    extra = ("--slo", "0.1") if command == "capacity" else ("--rate", 8)
    result = invoke(command, *BASE, *args, *extra, "--out", tmp_path / "x")
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_cli_capacity_takes_one_replica_count(tmp_path):
    result = invoke("capacity", *BASE, "--replicas", "1,2", "--slo", "0.1", "--out", tmp_path / "x")
    assert result.exit_code == 2 and "one count" in result.output and "Traceback" not in result.output


def test_cli_writes_the_fleet_block(tmp_path):
    out = tmp_path / "run"
    result = invoke("simulate", *SIM, "--replicas", 3, "--router", "least-requests", "--out", out, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "result.json").read_text())
    assert json.loads(result.stdout)["fleet"] == doc["fleet"]
    fleet = doc["fleet"]
    assert fleet["replicas"] == 3 and fleet["router"] == "least-requests"
    assert doc["params"]["replicas"] == 3 and doc["params"]["router"] == "least-requests"
    assert [r["replica"] for r in fleet["per_replica"]] == [0, 1, 2]
    assert sum(r["num_requests"] for r in fleet["per_replica"]) == doc["num_submitted"] == 40
    assert sum(r["request_share"] for r in fleet["per_replica"]) == pytest.approx(1.0)
    for row in fleet["per_replica"]:
        for key in ("ttft_mean", "tpot_mean", "e2e_mean", "request_throughput", "kv_utilization", "busy_time",
                    "prefix_cache_hit_rate", "preemptions"):
            assert key in row
    assert set(fleet["load_imbalance"]) == {"requests", "output_tokens", "busy_time", "kv_utilization"}
    assert "--replicas 3 --router least-requests" in doc["command"]
    with (out / "requests.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 40 and {int(r["replica"]) for r in rows} == {0, 1, 2}
    with (out / "steps.csv").open() as f:
        steps = list(csv.DictReader(f))
    assert {int(s["replica"]) for s in steps} == {0, 1, 2}
    assert [float(s["start"]) for s in steps] == sorted(float(s["start"]) for s in steps)
    html = (out / "report.html").read_text()
    assert "Replicas (3, router least-requests)" in html and "3 replicas of" in html


def test_cli_table_shows_the_replicas(tmp_path):
    result = invoke("simulate", *SIM, "--replicas", 2, "--out", tmp_path / "run")
    assert result.exit_code == 0, result.output
    assert "2 replicas, router round-robin" in result.output


def test_cli_sweeps_replica_counts(tmp_path):
    out = tmp_path / "sweep"
    result = invoke("simulate", *SIM, "--replicas", "1,2", "--router", "least-kv", "--out", out, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "sweep.json").read_text())
    assert [r["params"].get("replicas", 1) for r in doc["runs"]] == [1, 2]
    assert "replicas" in doc["verdict"]["swept"]
    assert any("replicas 2" in line for line in doc["verdict"]["lines"])
    with (out / "comparison.csv").open() as f:
        assert [row["replicas"] for row in csv.DictReader(f)] == ["1", "2"]


def test_replicas_count_the_command_lines_replicas_not_their_dp_ranks():
    """--dp 2 --replicas 2 is two replicas of two engines each: `params.replicas` is 2 (a sweep's row, the report's
    title, a re-run's --replicas), `fleet.engines` 4, one row per engine."""
    from planner import simulate
    from planner.runs.spec import Fleet, Load, RunSpec
    moe = Deployment(model="qwen3-30b-a3b", gpu="h100-sxm", dp=2, enable_expert_parallel=True)
    load = Load(workload="random", params=(("input_len", 100), ("output_len", 20)), requests=16, rate=4)
    doc = simulate(RunSpec(deployment=moe, load=load, fleet=Fleet(2))).sim.summary()
    assert doc["params"]["replicas"] == 2 and doc["fleet"]["replicas"] == 2 and doc["fleet"]["engines"] == 4
    assert len(doc["fleet"]["per_replica"]) == 4
    lone = simulate(RunSpec(deployment=moe, load=load)).sim.summary()
    assert lone["params"]["replicas"] == 1 and lone["fleet"]["engines"] == 2


def test_a_fleets_steady_busy_and_kv_full_shares_are_an_engines():
    """Three replicas' steps together are three engines' time: the shares are per engine (a fleet read 103% KV
    full and a busy share of 3 before stop 69), and a step is counted for its part inside the window."""
    from planner import simulate
    from planner.runs.spec import Fleet, Load, RunSpec
    load = Load(workload="sharegpt", rate=30, requests=200)
    doc = simulate(RunSpec(deployment=Deployment(model="opt-125m", gpu="a100-80g", num_gpu_blocks=300), load=load,
                           fleet=Fleet(3))).document()
    steady = doc["steady_state"]
    assert 0 < steady["busy_share"] <= 1 and 0 < steady["kv_full_share"] <= 1
    assert doc["verdict"]["kv_full_share"] == steady["kv_full_share"]      # what the verdict judges (103% before)


def test_replicas_throughputs_add_up_to_the_fleets():
    """Each replica's rate over the fleet's span (a replica's own span is shorter, so the replica with fewer
    requests could show the higher rate and the rows summed past the fleet's)."""
    from planner import simulate
    from planner.runs.spec import Fleet, Load, RunSpec
    doc = simulate(RunSpec(deployment=Deployment(model="opt-125m", gpu="a100-80g"),
                           load=Load(workload="sharegpt", rate=10, requests=200), fleet=Fleet(2))).document()
    rows = doc["fleet"]["per_replica"]
    for key in ("request_throughput", "output_token_throughput"):
        assert sum(r[key] for r in rows) == pytest.approx(doc[key])
