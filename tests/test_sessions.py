"""Open loops whose users wait for their answers (--turns-after-answers, workloads/sessions.py): a
conversation's later turn is sent its think time after the answer to the turn before has ended, not at its
trace time, in the simulator (one engine, a fleet, disaggregated pools), the live engine's and the live
fleet's replays, and `planner bench` (tests/test_bench.py); a refused turn ends its conversation."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from engine.deployment import Deployment
from planner.cli import app
from planner.cost.linear import LinearCostModel
from planner.sim import simulate
from planner.sim.fleet import simulate_fleet
from planner.validation.run import validate
from planner.validation.spec import ValidationSpec
from sim_helpers import ConstantCost, sim_plan
from tiny_models import save_tiny_model
from workloads import Trace, TraceRequest, make_trace
from workloads.sessions import TurnsAfterAnswers

COST = LinearCostModel(0.01, 1e-4)


def turn(request_id: str, conversation: str | None = None, k: int = 0, *, arrival: float = 0.0,
         think: float | None = None, prompt_len: int = 8) -> TraceRequest:
    return TraceRequest(request_id=request_id, arrival_time=arrival, prompt_len=prompt_len, output_len=4,
                        conversation_id=conversation, turn=k, think_time=think)


def test_first_turns_go_at_their_times_and_each_later_turn_after_its_answer():
    a0, s, b0 = turn("a0", "A"), turn("s", arrival=1.0), turn("b0", "B", arrival=2.0)
    a1, a2 = turn("a1", "A", 1, arrival=3.0, think=2.0), turn("a2", "A", 2, arrival=9.0)
    sessions = TurnsAfterAnswers([a0, s, b0, a1, a2])
    assert list(sessions.starts) == [a0, s, b0] and len(sessions) == 5
    assert sessions.after(s) is None and sessions.after(b0) is None
    assert sessions.after(a0) == a1 and sessions.after(a1) == a2 and sessions.after(a2) is None
    assert TurnsAfterAnswers.due(a1, 5.0) == 7.0              # its think time after the answer
    assert TurnsAfterAnswers.due(a2, 5.0) == 9.0              # none given: its trace time ...
    assert TurnsAfterAnswers.due(a2, 12.0) == 12.0            # ... but never before the answer
    assert sessions.dropped == 0


def test_a_refused_turn_ends_its_conversation():
    a0, a1, a2, b0 = turn("a0", "A"), turn("a1", "A", 1), turn("a2", "A", 2), turn("b0", "B")
    sessions = TurnsAfterAnswers([a0, b0, a1, a2])
    sessions.starts.clear()
    assert sessions.after(a0, refused=True) is None
    assert sessions.dropped == 2 and len(sessions) == 0 and sessions.after(b0) is None


def test_a_think_time_belongs_to_a_conversation_turn_and_survives_a_trace_file(tmp_path):
    with pytest.raises(ValidationError, match="(?s)think_time.*give its conversation_id"):
        turn("x", think=1.0)
    with pytest.raises(ValidationError, match="think_time"):
        turn("x", "A", 1, think=-1.0)
    trace = make_trace("chatbot", num_requests=30, rate=2.0, seed=4)
    for suffix in ("csv", "jsonl"):
        path = tmp_path / f"chat.{suffix}"
        trace.save(path)
        assert [r.think_time for r in Trace.load(path)] == [r.think_time for r in trace]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"request_id": "a", "arrival_time": 0, "prompt_len": 4, "output_len": 2, '
                   '"conversation_id": "c", "think_time": true}\n')
    with pytest.raises(Exception, match="think_time: must be a number"):
        Trace.load(bad)


def test_a_chatbot_turn_keeps_the_think_time_its_arrival_was_spaced_by():
    trace = make_trace("chatbot", num_requests=80, rate=2.0, seed=1)
    per_token = trace.params["time_per_token"]
    turns = defaultdict(list)
    for req in trace:
        turns[req.conversation_id].append(req)
    assert any(len(t) > 2 for t in turns.values())
    for conversation in turns.values():
        assert conversation[0].think_time is None
        for before, after in zip(conversation, conversation[1:]):
            assert after.think_time > 0
            assert after.arrival_time == pytest.approx(before.arrival_time + before.output_len * per_token
                                                       + after.think_time, abs=2e-3)


def chatbot(requests: int = 80, rate: float = 6.0) -> Trace:
    """Conversations whose answers take longer than the trace's estimates (opt-125m on a small cache at a
    rate it cannot keep up with), with short think times."""
    return make_trace("chatbot", num_requests=requests, rate=rate, seed=3, think_time=0.5, max_history=400,
                      max_output_len=200)


def plan(**knobs):
    return sim_plan("opt-125m", "a100-40g", num_gpu_blocks=200, **knobs)


def turns_wait(records, trace: Trace, exact: bool = True, slack: float = 0.0) -> int:
    """Assert each later turn of `trace` among `records` was sent its think time after the turn before
    ended (within `slack` later, or exactly), and the first turns at their trace times; the later turns."""
    by_id = {r.request_id: r for r in records}
    previous = {}
    later = 0
    for req in trace:
        record = by_id[req.request_id]
        before = previous.get(req.conversation_id)
        if before is None:
            assert record.arrival == req.arrival_time
        else:
            due = by_id[before.request_id].finish + req.think_time
            assert due - 1e-9 <= record.arrival <= due + slack if not exact else record.arrival == pytest.approx(due)
            later += 1
        if req.conversation_id is not None:
            previous[req.conversation_id] = req
    return later


def test_simulated_turns_wait_for_their_answers_where_the_open_loop_sends_them_early():
    trace = chatbot()
    slow = LinearCostModel(0.08, 1e-4)      # 80 ms a token, where the trace estimated 50
    waiting = simulate(trace, plan(turns_after_answers=True), slow)
    assert waiting.metrics.num_completed == len(trace)
    assert turns_wait(waiting.requests, trace) > 20
    # the open loop sends turns at their estimated times, some before the answers they continue have ended
    open_loop = {r.request_id: r for r in simulate(trace, plan(), slow).requests}
    early = [req for req in trace if req.turn and open_loop[req.request_id].arrival
             < open_loop[f"{req.request_id.rsplit('-', 1)[0]}-{req.turn - 1}"].finish]
    assert early


def test_a_trace_without_conversations_runs_as_the_open_loop():
    trace = make_trace("sharegpt", num_requests=60, rate=20.0, seed=2)
    waiting, open_loop = simulate(trace, plan(turns_after_answers=True), COST), simulate(trace, plan(), COST)
    assert waiting.requests == open_loop.requests and waiting.steps == open_loop.steps


def test_fast_forward_gives_the_step_by_step_result_when_turns_wait():
    trace = chatbot(rate=3.0)
    fast = simulate(trace, plan(turns_after_answers=True), COST)
    slow = simulate(trace, plan(turns_after_answers=True), COST, fast_forward=False)
    assert fast.fast_forwarded_steps > 0
    assert fast.requests == slow.requests and fast.steps == slow.steps


def test_a_refused_turn_ends_its_conversation_in_the_simulation():
    trace = Trace([turn("a0", "A"), turn("b0", "B", arrival=0.01),
                   turn("a1", "A", 1, arrival=1.0, think=0.1, prompt_len=300),     # past the context: refused
                   turn("b1", "B", 1, arrival=1.0, think=0.1), turn("a2", "A", 2, arrival=2.0, think=0.1)])
    result = simulate(trace, plan(turns_after_answers=True, max_model_len=128), COST)
    records = {r.request_id: r for r in result.requests}
    assert sorted(records) == ["a0", "a1", "b0", "b1"] and records["a1"].rejected     # a2 never sent
    assert result.metrics.num_completed == 3
    sent_anyway = simulate(trace, plan(max_model_len=128), COST)      # the open loop sends it at its time
    assert len(sent_anyway.requests) == 5


@pytest.mark.parametrize("router", ["round-robin", "least-requests"])
def test_a_fleets_turns_wait_for_their_answers_too(router):
    trace = chatbot(rate=10.0)
    fleet = simulate_fleet(trace, plan(turns_after_answers=True), COST, replicas=2, router=router)
    assert fleet.metrics.num_completed == len(trace)
    assert turns_wait(fleet.requests, trace) > 20
    one = simulate_fleet(trace, plan(turns_after_answers=True), COST, replicas=1, router=router)
    assert one.requests == simulate(trace, plan(turns_after_answers=True), COST).requests


def simulate_pools(deployment: Deployment, trace: Trace, concurrency: int | None = None):
    """`trace` through a prefill pool and a decode pool of one `deployment` replica each, the KV crossing at
    once."""
    import math
    from planner.catalog.links import KvLink
    from planner.runs.pd import Disaggregation
    from planner.runs.pipeline import prepare_pools
    from planner.runs.spec import Load, RunSpec
    from planner.sim.pd import KvPath, simulate_pd
    from planner.sim.router import parse_router
    pools = prepare_pools(RunSpec(deployment=deployment, load=Load(workload="random", requests=4),
                                  pd=Disaggregation(1, 1)))
    path = KvPath(KvLink("instant", math.inf, 0.0, "test", "test"), math.inf, 1, pools.path.bytes_per_token)
    return simulate_pd(trace, pools.prefill, pools.decode, path, parse_router("least-requests"),
                       concurrency=concurrency)


def test_disaggregated_pools_send_a_turn_after_the_decode_pool_answered_the_one_before():
    trace = make_trace("chatbot", num_requests=40, rate=4.0, seed=3, think_time=0.5)
    deployment = Deployment.of(model="llama-3.1-8b", gpu="h100-sxm", policy="vllm-v1", turns_after_answers=True)
    sim = simulate_pools(deployment, trace)
    assert sim.metrics.num_completed == len(trace)
    assert turns_wait(sim.requests, trace) > 5


@pytest.mark.parametrize("clients", [{"concurrency": 1}, {"turns_after_answers": True}])
def test_a_turn_the_prefill_pool_refused_ends_its_conversation(clients):
    # (a closed loop's clients drop the conversation too, as vLLM's multi-turn benchmark does)
    deployment = Deployment.of(model="llama-3.1-8b", gpu="h100-sxm", policy="vllm-v1", max_model_len=128,
                               turns_after_answers=clients.get("turns_after_answers", False))
    trace = Trace([turn("a0", "A"), turn("b0", "B", arrival=0.01),
                   turn("a1", "A", 1, arrival=1.0, think=0.1, prompt_len=300),     # past the context: refused
                   turn("b1", "B", 1, arrival=1.0, think=0.1), turn("a2", "A", 2, arrival=2.0, think=0.1)])
    sim = simulate_pools(deployment, trace, clients.get("concurrency"))
    records = {r.request_id: r for r in sim.requests}
    assert sorted(records) == ["a0", "a1", "b0", "b1"] and records["a1"].rejected     # a2 never sent


def test_a_closed_loop_refuses_turns_after_answers_in_one_line(tmp_path):
    result = CliRunner().invoke(app, ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--workload",
                                      "chatbot", "--requests", "20", "--concurrency", "4", "--turns-after-answers",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "--turns-after-answers times an open loop's conversations" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    from planner.bench.client import BenchConfig
    with pytest.raises(ValueError, match="--turns-after-answers times an open loop"):
        BenchConfig("http://127.0.0.1:9", max_concurrency=2, turns_after_answers=True)


def test_cli_simulate_times_turns_by_the_answers_and_says_so_in_its_command(tmp_path):
    args = ["simulate", "--model", "opt-125m", "--gpu", "a100-40g", "--workload", "chatbot", "--requests", "80",
            "--rate", "6", "-p", "think_time=0.5", "--num-gpu-blocks", "200", "--json"]
    import json
    runs = {}
    for flag in ("--no-turns-after-answers", "--turns-after-answers"):
        result = CliRunner().invoke(app, [*args, flag, "--out", str(tmp_path / flag)])
        assert result.exit_code == 0, result.output
        runs[flag] = json.loads(result.stdout)
    waiting, open_loop = runs["--turns-after-answers"], runs["--no-turns-after-answers"]
    assert waiting["deployment"]["turns_after_answers"] is True and "--turns-after-answers" in waiting["command"]
    assert waiting["num_completed"] == open_loop["num_completed"] == 80
    # opt-125m answers far faster than the trace's 50 ms a token: the users' turns come sooner
    assert waiting["duration"] < 0.8 * open_loop["duration"]
    assert not [w for w in waiting["warnings"] if "--turns-after-answers" in w]


def test_cli_says_when_turns_after_answers_finds_no_conversation_to_time(tmp_path):
    result = CliRunner().invoke(app, ["simulate", "--model", "opt-125m", "--gpu", "a100-40g", "--workload",
                                      "sharegpt", "--requests", "20", "--turns-after-answers", "--json",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    import json
    said = ("--turns-after-answers: the trace has no conversation with a later turn, so every request is sent at "
            "its arrival time, as without it")
    assert json.loads(result.stdout)["warnings"] == [said]
    assert f"warning: {said}\n" in result.stderr          # said before the run, on one line


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return save_tiny_model("llama", tmp_path_factory.mktemp("llama"))


def live_spec(llama_dir, **knobs) -> ValidationSpec:
    deployment = Deployment(model=llama_dir, gpu="cpu", block_size=8, max_num_seqs=8, max_model_len=80,
                            turns_after_answers=True, **knobs)
    return ValidationSpec(deployment, workload="chatbot", requests=10, rate=20.0, length_scale=0.1,
                          max_prompt_len=40, max_output_len=12, seed=2, seeds=0,
                          params=(("think_time", 0.05),))


@pytest.mark.serial     # a live engine on the wall clock: run alone (scripts/test.sh)
def test_the_live_engine_sends_a_turn_its_think_time_after_the_answer_as_the_simulator(llama_dir):
    spec = live_spec(llama_dir)
    trace = spec.trace()
    v = validate(spec, cost_model=ConstantCost())
    assert v.live.metrics["num_completed"] == v.simulated["num_completed"] == len(trace)
    assert turns_wait(v.sim_requests, trace) == turns_wait(v.live.requests, trace, exact=False, slack=0.05) > 2


@pytest.mark.serial     # a live engine on the wall clock: run alone (scripts/test.sh)
def test_a_live_fleet_sends_a_turn_after_its_answer_as_the_simulated_fleet(llama_dir):
    from planner.sim.router import parse_router
    from planner.validation.fleet import validate_fleet
    spec = replace(live_spec(llama_dir), kv_cache_memory_bytes=1 << 22)
    trace = spec.trace()
    result = validate_fleet(spec, 2, parse_router("round-robin"), cost_model=ConstantCost())
    assert result.live.metrics["num_completed"] == result.sim.metrics["num_completed"] == len(trace)
    assert turns_wait(result.sim.requests, trace) == turns_wait(result.live.requests, trace, exact=False,
                                                                 slack=0.05) > 2
