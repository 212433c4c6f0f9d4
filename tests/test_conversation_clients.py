"""Closed loops over multi-turn conversations (workloads/clients.py): a client sends a conversation's next
turn only when the answer to the one before has come, as vLLM's multi-turn benchmark does, in the simulator,
the live engine's replay and `planner bench` alike (against a server: tests/test_bench.py). A trace without
conversations keeps its order."""
from __future__ import annotations

import json
import random
from dataclasses import replace
from collections import defaultdict

import pytest

from engine.deployment import Deployment
from planner.cost.linear import LinearCostModel
from planner.errors import PlannerError
from planner.sim import simulate
from planner.validation.run import validate
from planner.validation.spec import ValidationSpec
from sim_helpers import ConstantCost, sim_plan
from tiny_models import save_tiny_model
from workloads import TraceRequest, make_trace
from workloads.clients import ClientKnobs, TurnQueue

# It reads the wall clock (a live engine, a server, a time limit): scripts/test.sh runs it alone.
pytestmark = pytest.mark.serial


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return save_tiny_model("llama", tmp_path_factory.mktemp("llama"))


def request(request_id: str, conversation: str | None = None, turn: int = 0) -> TraceRequest:
    return TraceRequest(request_id=request_id, arrival_time=0.0, prompt_len=8, output_len=4,
                        conversation_id=conversation, turn=turn)


def test_a_client_keeps_its_conversation_and_others_take_the_next_ones():
    a0, s, a1, b0, a2, b1 = (request("a0", "A"), request("s"), request("a1", "A", 1), request("b0", "B"),
                             request("a2", "A", 2), request("b1", "B", 1))
    queue = TurnQueue([a0, s, a1, b0, a2, b1])
    assert (queue.first(), queue.first()) == (a0, s)      # two clients: A's first turn and the lone request
    assert queue.after(s) == b0             # the lone request's client begins the next conversation, not A's turn
    assert queue.after(a0) == a1 and queue.after(b0) == b1 and queue.after(a1) == a2
    assert len(queue) == 0 and queue.after(a2) is None and queue.after(b1) is None and queue.first() is None


def test_without_conversations_the_trace_goes_in_its_order():
    reqs = [request(f"r{i}") for i in range(5)]
    queue = TurnQueue(reqs)
    sent = [queue.first(), queue.first()]
    for client in (1, 0, 2):
        sent.append(queue.after(sent[client]))
    assert sent == reqs and queue.after(reqs[4]) is None


def test_a_client_of_several_conversations_turns_to_them_in_rotation():
    # vLLM's multi-turn client (round_robin sampling): it takes conversations up to its share, sends the turn of
    # the one taken last and puts one with turns left behind the others; K // N each (5 // 2 = 2)
    a0, a1, a2, b0, b1 = (request("a0", "A"), request("a1", "A", 1), request("a2", "A", 2),
                          request("b0", "B"), request("b1", "B", 1))
    c0, d0, e0 = request("c0", "C"), request("d0"), request("e0")
    queue = TurnQueue([a0, b0, c0, d0, e0, a1, b1, a2], clients=2, knobs=ClientKnobs(max_active_conversations=5))
    sent = [queue.first()]              # one client, from its first request to its last
    while (nxt := queue.after(sent[-1])) is not None:
        sent.append(nxt)
    # it stops when it finds no conversation left to take, leaving A's last two turns unsent, as the
    # benchmark's client exits then
    assert sent == [b0, a0, b1, c0, d0, e0] and (len(queue), queue.dropped, queue.stopped) == (0, 2, False)
    assert queue.first() is None and queue.stopped     # the other client finds none either: every client stopped


def benchmark_client(client_id: int, seed: int, share: int, tasks: list, sent: list):
    """A transcription of vLLM's multi-turn benchmark's `client_main` under --conversation-sampling random
    (benchmarks/multi_turn/benchmark_serving_multi_turn.py), its queue of conversations `tasks` shared: yields
    each request it sends, and goes on when that request has ended."""
    rng = random.Random(seed + client_id + 1)      # its process's random.seed(client_seed)
    active: dict[str, list] = {}
    turns_count: dict[str, int] = defaultdict(int)
    task_queue_empty = False
    while not task_queue_empty:
        while len(active) < share and not task_queue_empty:
            if not tasks:
                task_queue_empty = True
                break
            conv_id, messages = tasks.pop(0)
            active[conv_id] = messages
        if len(active) == 0 or task_queue_empty:
            break
        conv_id = rng.choice(list(active.keys()))
        messages = active[conv_id]
        turns_count[conv_id] += 1                    # messages: its user's, then the answer
        sent.append(messages[turns_count[conv_id] // 2])   # (a request a user message)
        yield
        turns_count[conv_id] += 1
        if turns_count[conv_id] >= 2 * len(messages):
            active.pop(conv_id)


def sent_in_order(queue: TurnQueue, clients: int) -> list:
    """What `clients` clients of `queue` send when every request ends in the order it was sent."""
    sent = [req for req in (queue.first() for _ in range(clients)) if req is not None]
    pending = list(sent)
    while pending:
        nxt = queue.after(pending.pop(0))
        if nxt is not None:
            sent.append(nxt)
            pending.append(nxt)
    return sent


@pytest.mark.parametrize("clients, active, seed", [(1, 3, 0), (2, 6, 0), (3, 6, 5), (2, 2, 1)])
def test_random_sampling_picks_as_vllms_multi_turn_client_picks(clients, active, seed):
    # --conversation-sampling random: each client picks its next conversation with random.choice over its
    # active ones in the order it took them, from its own generator (seed + client number + 1). Requests end
    # in the order they were sent; the TurnQueue and the benchmark's client, transcribed, send the same turns.
    turns = [1, 3, 4, 2, 5, 1, 3, 2, 4]
    trace = [request(f"{c}{t}", str(c), t) for t in range(max(turns)) for c, n in enumerate(turns) if t < n]
    by_conversation = defaultdict(list)
    for req in trace:
        by_conversation[req.conversation_id].append(req)
    tasks = list(by_conversation.items())
    expected: list = []
    runners = [benchmark_client(i, seed, active // clients, tasks, expected) for i in range(clients)]
    in_flight = []
    for runner in runners:                       # each client's first request, in the order they start
        if next(runner, "done") is None:
            in_flight.append(runner)
    while in_flight:                             # the oldest request ends; its client sends its next
        runner = in_flight.pop(0)
        if next(runner, "done") is None:
            in_flight.append(runner)

    knobs = ClientKnobs(max_active_conversations=active, conversation_sampling="random")
    sent = sent_in_order(TurnQueue(trace, clients=clients, knobs=knobs, seed=seed), clients)
    assert [r.request_id for r in sent] == [r.request_id for r in expected]
    for conversation in by_conversation.values():     # a conversation's turns still in their order
        ids = [r.request_id for r in sent if r.conversation_id == conversation[0].conversation_id]
        assert ids == [r.request_id for r in conversation][:len(ids)]
    rotated = sent_in_order(TurnQueue(trace, clients=clients,
                                      knobs=replace(knobs, conversation_sampling="round_robin")), clients)
    if active > clients:                         # several conversations a client: another order than rotation
        assert [r.request_id for r in sent] != [r.request_id for r in rotated]


def test_random_sampling_after_a_warm_up_draws_as_new_clients():
    # the benchmark's phase after its warm-up starts new client processes, numbered from 0 and seeded again:
    # its turns are picked as a run without warm-up over the later turns picks them
    turns = [3, 4, 2, 5, 3]
    trace = [request(f"{c}{t}", str(c), t) for t in range(max(turns)) for c, n in enumerate(turns) if t < n]
    knobs = ClientKnobs(max_active_conversations=3, conversation_sampling="random")

    def one_client(queue):
        sent = [queue.first()]
        while sent[-1] is not None:
            sent.append(queue.after(sent[-1]))
        return [r.request_id for r in sent[:-1]]
    warmed = TurnQueue(trace, clients=1, knobs=replace(knobs, client_warmup_step=True), seed=4)
    assert one_client(warmed) == ["00", "10", "20", "30", "40"] and warmed.take_new_phase()
    later = TurnQueue([r for r in trace if r.turn > 0], clients=1, knobs=knobs, seed=4)
    assert one_client(warmed) == one_client(later)
    assert one_client(TurnQueue([r for r in trace if r.turn > 0], clients=1, knobs=knobs, seed=5)) != \
        one_client(TurnQueue([r for r in trace if r.turn > 0], clients=1, knobs=knobs, seed=4))


def test_what_vllms_multi_turn_benchmark_refuses_is_refused(tmp_path):
    reqs = [request("a0", "A"), request("b0", "B"), request("a1", "A", 1)]
    with pytest.raises(ValueError, match="must be at least the 3 clients"):
        TurnQueue(reqs, clients=3, knobs=ClientKnobs(max_active_conversations=2))
    with pytest.raises(ValueError, match="more than the trace's 2 conversations"):
        TurnQueue(reqs, clients=1, knobs=ClientKnobs(max_active_conversations=3))
    with pytest.raises(PlannerError, match="give their number"):     # an open loop has no clients to share them
        ValidationSpec(Deployment(model="opt-125m", gpu="cpu", max_active_conversations=4), workload="chatbot").trace()
    with pytest.raises(PlannerError, match="more than the trace's 2 conversations"):    # before any live run
        ValidationSpec(Deployment(model="opt-125m", gpu="cpu", max_active_conversations=4), workload="chatbot",
                       requests=10, concurrency=2, seed=2).trace()
    from typer.testing import CliRunner
    from planner.cli import app
    result = CliRunner().invoke(app, ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--workload",
                                      "chatbot", "--requests", "50", "--rate", "2", "--max-active-conversations", "4",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 2 and "give their number (--concurrency N" in result.stderr
    served = CliRunner().invoke(app, ["serve", "--model", "opt-125m", "--max-active-conversations", "4"])
    assert served.exit_code == 2 and "a server's clients are whoever connects" in served.stderr


def turns_in_order(records, trace, turnaround: float = 0.0) -> int:
    """Assert every turn was sent no earlier than its conversation's turn before ended (plus the turnaround),
    and none after one left unsent; the most conversations under way at once."""
    by_id = {r.request_id: r for r in records if r.finish is not None}
    conversations = defaultdict(list)
    for req in trace:
        if req.request_id in by_id:
            assert len(conversations[req.conversation_id]) == req.turn
            conversations[req.conversation_id].append(by_id[req.request_id])
    for turns in conversations.values():
        for before, after in zip(turns, turns[1:]):
            assert after.arrival >= before.finish + turnaround - 1e-12
    spans = [(turns[0].arrival, turns[-1].finish) for turns in conversations.values()]
    return max(sum(s <= t < e for s, e in spans) for t, _ in spans)


@pytest.mark.parametrize("turnaround, active, sampling", [(0.0, None, "round_robin"), (0.001, None, "round_robin"),
                                                         (0.0, 12, "round_robin"), (0.0, 12, "random")])
def test_simulated_clients_send_a_conversations_turns_one_after_another(turnaround, active, sampling):
    trace = make_trace("chatbot", num_requests=80, rate=50.0, seed=3)
    plan = sim_plan("llama-3.1-8b", "h100-sxm", policy="vllm-v1", max_model_len=4096,
                    client_turnaround=turnaround, max_active_conversations=active, conversation_sampling=sampling)
    cost = LinearCostModel(0.01, 1e-4)
    fast = simulate(trace, plan, cost, concurrency=4)
    under_way = turns_in_order(fast.requests, trace, turnaround)
    if active is None:
        assert under_way <= 4           # no client holds two conversations
    else:                               # three each, in rotation: more conversations under way than clients
        assert 4 < under_way <= 12
    in_flight = [(r.arrival, r.finish) for r in fast.requests]
    assert max(sum(s <= t < e for s, e in in_flight) for t, _ in in_flight) == 4   # one request a client
    # with three conversations a client, a client that finds none left to take stops, as the benchmark's
    # does, leaving the turns of its other two unsent
    sent = [r for r in fast.requests if r.finish is not None]
    assert fast.metrics.num_completed == fast.metrics.num_submitted == len(sent)
    assert len(sent) == 80 if active is None else len(sent) < 80
    slow = simulate(trace, plan, cost, concurrency=4, fast_forward=False)
    assert fast.requests == slow.requests and fast.steps == slow.steps


@pytest.mark.parametrize("policy, active, sampling, sent", [
    ("vllm-v1", None, "round_robin", 10), ("paper", None, "round_robin", 10), ("vllm-v1", 4, "round_robin", 8),
    ("vllm-v1", 4, "random", 9)])
def test_the_live_engine_and_the_simulator_send_the_same_turns(llama_dir, policy, active, sampling, sent):
    # Each turn's history holds the answer the live model gave to the turn before (as a multi-turn client
    # sends it back), so the live prefix cache hits the answer's blocks as the simulated one hits the trace's:
    # the same batches, prefills and blocks step for step (with prefix caching, both policies; and with two
    # conversations a client, 4 conversations in the 12 requests of seed 3).
    deployment = Deployment(model=llama_dir, gpu="cpu", block_size=8, max_num_seqs=8, max_model_len=80,
                            policy=policy, enable_prefix_caching=True, max_active_conversations=active,
                            conversation_sampling=sampling)
    spec = ValidationSpec(deployment, workload="chatbot", concurrency=2, requests=12 if active else 10,
                          length_scale=0.1, max_prompt_len=40, max_output_len=12, seed=3 if active else 2)
    v = validate(spec, cost_model=ConstantCost())
    # (two conversations a client: a client that finds none left to take stops, leaving its other's turns,
    # which its random picks leave fewer of)
    assert v.live.metrics["num_completed"] == v.simulated["num_completed"] == sent

    def steps(records):
        return [(s.batch_size, s.prefill_tokens, s.decode_tokens, s.kv_blocks_used) for s in records]
    assert steps(v.live.steps) == steps(v.sim_steps)
    trace = spec.trace()
    assert len({r.conversation_id for r in trace}) < len(trace)     # conversations of several turns
    assert turns_in_order(v.live.requests, trace) == turns_in_order(v.sim_requests, trace) > (2 if active else 1)
    assert [r.request_id for r in v.live.requests] == [r.request_id for r in v.sim_requests]   # in sending order
    computed = sum(s.prefill_tokens for s in v.live.steps)       # the same in both (above): the live cache hit
    assert v.simulated["prefix_cache_hit_rate"] > 0 and computed < sum(r.prompt_len for r in v.live.requests)


def test_a_live_fleet_hits_the_answers_sent_back_as_the_simulated_fleet(llama_dir):
    # session routing keeps a conversation on one replica, whose cache holds its answers' blocks: live (the
    # model's answers sent back) and simulated (the trace's) turns hit them alike
    from planner.validation.fleet import validate_fleet
    from planner.sim.router import parse_router
    deployment = Deployment(model=llama_dir, gpu="cpu", block_size=8, max_model_len=80, enable_prefix_caching=True)
    spec = ValidationSpec(deployment, workload="chatbot", concurrency=2, requests=10, length_scale=0.1,
                          max_prompt_len=40, max_output_len=12, seed=2, seeds=0, kv_cache_memory_bytes=1 << 22)
    result = validate_fleet(spec, 2, parse_router("session"), cost_model=ConstantCost())
    assert result.live.metrics["num_completed"] == result.sim.metrics["num_completed"] == 10
    assert result.live.routes == result.sim.fleet.routes
    assert result.live.prefix_cache_hit_rate == result.sim.prefix_cache_hit_rate > 0
    turns_in_order(result.live.requests, spec.trace())
    # with a warm-up first: its first turns out of both fleets' figures and routes
    warmed = replace(spec, deployment=replace(deployment, client_warmup_step=True))
    result = validate_fleet(warmed, 2, parse_router("session"), cost_model=ConstantCost())
    later = sum(r.turn > 0 for r in warmed.trace())
    assert result.live.metrics["num_completed"] == result.sim.metrics["num_completed"] == later > 0
    assert result.live.routes == result.sim.fleet.routes and len(result.live.routes) == later
    # a context too short for the later turns: a refused turn ends its conversation in both fleets
    short = replace(spec, deployment=replace(deployment, max_model_len=24))
    result = validate_fleet(short, 2, parse_router("session"), cost_model=ConstantCost())
    assert result.live.metrics["num_rejected"] == result.sim.metrics["num_rejected"] > 0
    assert result.live.routes == result.sim.fleet.routes and len(result.live.routes) < 10


def test_bench_sends_back_the_answer_the_server_gave(monkeypatch):
    # vLLM's multi-turn benchmark puts the server's answer into the next turn's history: asked with vLLM's
    # return_token_ids, a turn's answer ids come with its chunks and the conversation's next prompt holds them
    import httpx
    import planner.bench.client as bench
    from planner.bench.client import BenchConfig, run_bench

    bodies = []

    def answer_of(prompt: list[int], n: int) -> list[int]:       # a server's answer: not the trace's
        return [(sum(prompt) + i) % 200 + 3 for i in range(n)]

    def serve(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        ids = answer_of(body["prompt"], body["max_tokens"])
        chunks = [{"choices": [{"index": 0, "text": "x", "token_ids": [t] if body.get("return_token_ids") else None,
                                "finish_reason": None}]} for t in ids]
        chunks.append({"choices": [], "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(ids)}})
        sse = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx.Response(200, content=sse.encode(), headers={"content-type": "text/event-stream"})

    real = httpx.AsyncClient
    monkeypatch.setattr(bench.httpx, "AsyncClient",
                        lambda **kw: real(**kw, transport=httpx.MockTransport(serve)))
    trace = make_trace("chatbot", num_requests=12, rate=1000.0, seed=5, max_history=10**6, max_output_len=6,
                       think_time=0.001, time_per_token=1e-4)
    results, _ = run_bench(trace, BenchConfig(endpoint="http://mock", model="m", prompt_format="tokens",
                                              max_concurrency=3, vocab_size=256))
    assert all(r.success for r in results) and all(b.get("return_token_ids") for b in bodies)
    answers, expected = {}, []
    for req in sorted(trace, key=lambda r: (r.conversation_id, r.turn)):     # each turn after the one before
        prompt = trace.prompt_token_ids(req, 256, 0, answers)
        answers[req.request_id] = answer_of(prompt, req.output_len)
        expected.append(prompt)
    assert sorted(b["prompt"] for b in bodies) == sorted(expected)
    assert any(trace.prompt_token_ids(r, 256, 0) not in expected for r in trace if r.turn > 0)   # not the trace's


def test_a_clients_pause_is_vllms_multi_turn_poisson_sleep():
    # an exponential time of mean 1/R minus the request's duration, none when that is not positive; the same
    # draw for a request wherever it is drawn
    from workloads.clients import pause
    assert pause(None, 0.1, "r") == 0.0 and pause(2.0, 0.5, "r") == 0.0 and pause(2.0, 0.7, "r") == 0.0
    assert pause(2.0, 0.1, "r", seed=3) == pause(2.0, 0.1, "r", seed=3) != pause(2.0, 0.1, "r", seed=4)
    draws = [pause(2.0, 0.1, f"r{i}") for i in range(4000)]
    assert min(draws) > 0 and sum(draws) / len(draws) == pytest.approx(0.4, rel=0.05)


def test_simulated_clients_pause_at_their_own_rate():
    # one conversation a client: a turn is sent its predecessor's end + the turnaround + the predecessor's pause
    from workloads.clients import pause
    trace = make_trace("chatbot", num_requests=60, rate=50.0, seed=3)
    plan = sim_plan("llama-3.1-8b", "h100-sxm", policy="vllm-v1", max_model_len=4096, client_turnaround=0.001,
                    client_request_rate=0.5)
    cost = LinearCostModel(0.01, 1e-4)
    fast = simulate(trace, plan, cost, concurrency=4, seed=7)
    by_id = {r.request_id: r for r in fast.requests}
    gaps = 0
    for req in trace:
        if req.turn:
            before, after = by_id[f"{req.request_id.rsplit('-', 1)[0]}-{req.turn - 1}"], by_id[req.request_id]
            wait = 0.001 + pause(0.5, before.finish - before.arrival, before.request_id, 7)
            assert after.arrival == pytest.approx(before.finish + wait, abs=1e-9)
            gaps += wait > 0.5
    assert gaps > 5                      # pauses of seconds, not the turnaround alone
    slow = simulate(trace, plan, cost, concurrency=4, seed=7, fast_forward=False)
    assert fast.requests == slow.requests and fast.steps == slow.steps


def test_live_clients_pause_at_their_own_rate(llama_dir):
    # the live replay pauses each client as the simulator does: a turn waits its predecessor's pause (drawn from
    # the live duration, which the replay reads after the step that ended it: within a step of the record's)
    # after its end, and no longer than a step more
    from workloads.clients import pause
    deployment = Deployment(model=llama_dir, gpu="cpu", block_size=8, max_num_seqs=8, max_model_len=80,
                            enable_prefix_caching=True, client_request_rate=4.0)
    spec = ValidationSpec(deployment, workload="chatbot", concurrency=2, requests=10, length_scale=0.1,
                          max_prompt_len=40, max_output_len=12, seed=2, seeds=0)
    v = validate(spec, cost_model=ConstantCost())
    assert v.live.metrics["num_completed"] == v.simulated["num_completed"] == 10
    by_id = {r.request_id: r for r in v.live.requests}
    step = max(s.duration for s in v.live.steps)
    waits = []
    for req in spec.trace():
        if req.turn:
            before = by_id[f"{req.request_id.rsplit('-', 1)[0]}-{req.turn - 1}"]
            wait = pause(4.0, before.finish - before.arrival, before.request_id, spec.seed)
            gap = by_id[req.request_id].arrival - before.finish
            assert wait - step <= gap <= wait + step + 0.05
            waits.append(wait)
    assert sum(w > 0 for w in waits) >= len(waits) // 2


def test_bench_clients_pause_at_their_own_rate(monkeypatch):
    # planner bench's clients pause as the simulator's: a turn goes out its predecessor's pause after its end
    import httpx
    import planner.bench.client as bench
    from planner.bench.client import BenchConfig, run_bench
    from workloads.clients import pause

    def serve(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        chunks = [{"choices": [{"index": 0, "text": "x", "finish_reason": None}]}] * body["max_tokens"]
        chunks.append({"choices": [], "usage": {"prompt_tokens": len(body["prompt"]),
                                                "completion_tokens": body["max_tokens"]}})
        sse = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx.Response(200, content=sse.encode(), headers={"content-type": "text/event-stream"})

    real = httpx.AsyncClient
    monkeypatch.setattr(bench.httpx, "AsyncClient", lambda **kw: real(**kw, transport=httpx.MockTransport(serve)))
    trace = make_trace("chatbot", num_requests=12, rate=1000.0, seed=13, max_history=40, max_output_len=6,
                       think_time=0.001, time_per_token=1e-4)
    results, _ = run_bench(trace, BenchConfig(endpoint="http://mock", model="m", prompt_format="tokens", seed=1,
                                              max_concurrency=4, client_request_rate=8.0, vocab_size=256))
    by_id = {r.request_id: r for r in results}
    assert all(r.success for r in results)
    paused = 0
    for req in trace:
        if req.turn:
            before, after = by_id[f"{req.request_id.rsplit('-', 1)[0]}-{req.turn - 1}"], by_id[req.request_id]
            wait = pause(8.0, before.latency, before.request_id, 1)
            assert after.start - (before.start + before.latency) >= wait - 0.01
            paused += wait > 0.05
    assert paused >= 3


def test_an_early_stop_ends_the_loop_when_a_client_finds_no_conversation_left():
    # vLLM's multi-turn benchmark's default: the client that finds the queue empty exits and the others stop
    # after their request under way; the trace's turns not yet sent are never sent
    a0, a1, a2, a3 = (request(f"a{t}", "A", t) for t in range(4))
    b0, c0 = request("b0", "B"), request("c0", "C")
    for early_stop, sent_after in ((True, [None]), (False, [a1, a2, a3, None])):
        queue = TurnQueue([a0, b0, c0, a1, a2, a3], clients=2, knobs=ClientKnobs(client_early_stop=early_stop))
        assert (queue.first(), queue.first()) == (a0, b0)
        assert queue.after(b0) == c0 and queue.after(c0) is None      # C done, nothing left to take
        sent, last = [], a0
        while (last := queue.after(last)) is not None:
            sent.append(last)
        assert sent + [None] == sent_after
        assert (len(queue), queue.dropped) == ((0, 3) if early_stop else (0, 0))
    with pytest.raises(ValueError, match="--client-early-stop stops a closed loop's clients"):
        TurnQueue([a0], knobs=ClientKnobs(client_early_stop=True))


def test_a_client_stops_once_it_has_sent_its_most_requests():
    # vLLM's multi-turn benchmark's --max-num-requests M over N clients: each sends M // N, then stops,
    # leaving its conversation's later turns; with the early stop the first to stop stops them all
    a0, a1, a2, a3 = (request(f"a{t}", "A", t) for t in range(4))
    b0, b1, c0 = request("b0", "B"), request("b1", "B", 1), request("c0", "C")
    for early_stop in (False, True):
        queue = TurnQueue([a0, b0, c0, a1, b1, a2, a3], clients=2,
                          knobs=ClientKnobs(client_early_stop=early_stop, client_max_requests=2))
        assert (queue.first(), queue.first()) == (a0, b0)
        assert queue.after(a0) == a1 and queue.after(a1) is None       # the first client's two sent: it stops
        assert (len(queue), queue.dropped) == ((0, 4) if early_stop else (2, 2))   # (a2, a3 left)
        if early_stop:
            assert queue.after(b0) is None
            continue
        assert queue.after(b0) == b1 and queue.after(b1) is None       # the other's two, then it stops too
        assert queue.stopped and (len(queue), queue.dropped) == (0, 3)   # c0 never begun
    with pytest.raises(ValueError, match="--client-max-requests must be at least 1"):
        TurnQueue([a0], clients=1, knobs=ClientKnobs(client_max_requests=0))
    with pytest.raises(ValueError, match="--client-max-requests limits a closed loop's clients"):
        TurnQueue([a0], knobs=ClientKnobs(client_max_requests=2))


def test_a_refused_turn_ends_its_conversation():
    # vLLM's multi-turn benchmark drops a conversation whose turn failed: its later turns are never sent
    a0, a1, a2 = (request(f"a{t}", "A", t) for t in range(3))
    b0, b1 = request("b0", "B"), request("b1", "B", 1)
    queue = TurnQueue([a0, b0, a1, b1, a2], clients=1)
    assert queue.first() == a0 and queue.after(a0) == a1
    assert queue.after(a1, refused=True) == b0 and queue.dropped == 1      # a2 never sent
    assert queue.after(b0) == b1 and queue.after(b1) is None and queue.dropped == 1


@pytest.mark.parametrize("replicas", [1, 2])
def test_simulated_clients_send_no_turn_after_a_refused_one(replicas):
    from planner.sim.fleet import simulate_fleet
    trace = make_trace("chatbot", num_requests=200, rate=50.0, seed=3, max_history=6000)
    cost = LinearCostModel(0.01, 1e-4)
    plan = sim_plan("llama-3.1-8b", "h100-sxm", policy="vllm-v1", max_model_len=1024)
    fast, slow = (simulate_fleet(trace, plan, cost, replicas=replicas, concurrency=4, fast_forward=ff)
                  for ff in (True, False))
    assert fast.requests == slow.requests
    refused = {r.request_id for r in fast.requests if r.rejected}
    sent = {r.request_id for r in fast.requests}
    assert refused and len(sent) < len(trace)
    for req in trace:            # each conversation: its turns up to its first refused one, none after
        later_sent = [r.request_id for r in trace if r.conversation_id == req.conversation_id and r.turn > req.turn
                      and r.request_id in sent]
        assert req.request_id not in refused or not later_sent


def test_a_warm_up_sends_every_first_turn_before_the_benchmarks_phase():
    # vLLM's multi-turn benchmark's --warmup-step: clients of one conversation each send every first turn; when
    # all have ended, new clients send the later turns, the conversations in the order their first turns ended
    a0, a1, a2 = (request(f"a{t}", "A", t) for t in range(3))
    b0, c0, c1 = request("b0", "B"), request("c0", "C"), request("c1", "C", 1)
    d0, d1 = request("d0", "D"), request("d1", "D", 1)
    queue = TurnQueue([a0, b0, c0, d0, a1, c1, d1, a2], clients=2,
                      knobs=ClientKnobs(max_active_conversations=2, client_warmup_step=True, client_early_stop=True))
    assert (queue.first(), queue.first()) == (a0, b0)                # one conversation a client, not two
    assert queue.after(b0) == c0 and queue.after(c0) == d0 and queue.after(d0) is None   # C, then D, warmed
    assert not queue.stopped                   # (no early stop in the warm-up: the other client goes on)
    assert not queue.take_new_phase()                                # A's first turn is still under way
    assert queue.after(a0) is None and queue.take_new_phase() and not queue.take_new_phase()
    assert queue.warmup_ids == {"a0", "b0", "c0", "d0"} and len(queue) == 4     # B had one turn: done
    # the benchmark's phase (K = 2 over 2 clients: one each): C, D, A in the order their first turns ended
    assert (queue.first(), queue.first()) == (c1, d1)
    assert queue.after(c1) == a1 and queue.after(a1) == a2 and queue.after(a2) is None
    records = [request(r) for r in ("a0", "c1", "a1")]
    assert [r.request_id for r in queue.measured(records)] == ["c1", "a1"]
    # its clients' limit counts each phase apart: one request each leaves D and A unwarmed, never sent after
    limited = TurnQueue([a0, b0, c0, d0, a1, c1, d1, a2], clients=2,
                        knobs=ClientKnobs(client_warmup_step=True, client_max_requests=1))
    assert (limited.first(), limited.first()) == (a0, b0)
    assert limited.after(b0) is None and limited.after(a0) is None and limited.take_new_phase()
    assert limited.first() == a1 and limited.first() is None and limited.dropped == 4     # C and D never begun
    assert limited.after(a1) is None and limited.stopped and limited.dropped == 5      # and A's last turn
    with pytest.raises(ValueError, match="--client-warmup-step warms up a closed loop's clients"):
        TurnQueue([a0], knobs=ClientKnobs(client_warmup_step=True))


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_simulated_warm_up_is_left_out_of_the_figures(replicas):
    from planner.sim.fleet import simulate_fleet
    trace = make_trace("chatbot", num_requests=120, rate=50.0, seed=3)
    firsts = {r.request_id for r in trace if r.turn == 0}
    cost = LinearCostModel(0.01, 1e-4)
    plan = sim_plan("llama-3.1-8b", "h100-sxm", policy="vllm-v1", max_model_len=4096, client_warmup_step=True)
    fast, slow = (simulate_fleet(trace, plan, cost, replicas=replicas, concurrency=4, fast_forward=ff)
                  for ff in (True, False))
    assert fast.requests == slow.requests
    measured = {r.request_id for r in fast.requests}
    # every later turn measured, no first turn; their span begins after the warm-up's
    assert measured == {r.request_id for r in trace} - firsts and fast.metrics.num_completed == len(measured)
    assert fast.metrics.duration == max(r.finish for r in fast.requests) - min(r.arrival for r in fast.requests)
    assert min(r.arrival for r in fast.requests) > 1.0 and fast.steps[0].start == 0.0
    if replicas == 2:
        assert sum(row["num_requests"] for row in fast.fleet.summary()["per_replica"]) == len(measured)
        assert len(fast.fleet.routes) == len(measured)


def test_a_warmup_percentage_leaves_out_the_first_answered_requests_as_sent():
    # vLLM's multi-turn benchmark's --warmup-percentages X%: its samples (answered requests) by start time, the
    # first int(X% of them) dropped
    reqs = [request(f"r{i}") for i in range(10)]
    queue = TurnQueue(reqs, clients=1, knobs=ClientKnobs(client_warmup_percent=30))
    sent = [queue.first()]
    while sent[-1] is not None:
        sent.append(queue.after(sent[-1], refused=sent[-1].request_id == "r1"))
    # 9 answered (r1 refused): int(2.7) = 2 left out, r0 and r2
    assert queue.unmeasured == {"r0", "r2"}
    assert [r.request_id for r in queue.measured(reqs)] == ["r1", *(f"r{i}" for i in range(3, 10))]
    for knobs, problem in ((ClientKnobs(client_warmup_percent=100), "must be at least 0 and below 100"),
                           (ClientKnobs(client_warmup_percent=10, client_warmup_step=True), "give one")):
        with pytest.raises(ValueError, match=problem):
            TurnQueue(reqs, clients=1, knobs=knobs)
    with pytest.raises(ValueError, match="--client-warmup-percent leaves out the first requests of a closed loop"):
        TurnQueue(reqs, knobs=ClientKnobs(client_warmup_percent=10))


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_simulated_warmup_percentage_is_left_out_of_the_figures(replicas):
    from planner.sim.fleet import simulate_fleet
    trace = make_trace("chatbot", num_requests=120, rate=50.0, seed=3)
    cost = LinearCostModel(0.01, 1e-4)
    plan = sim_plan("llama-3.1-8b", "h100-sxm", policy="vllm-v1", max_model_len=4096, client_warmup_percent=25)
    fast, slow = (simulate_fleet(trace, plan, cost, replicas=replicas, concurrency=4, fast_forward=ff)
                  for ff in (True, False))
    assert fast.requests == slow.requests
    whole = simulate_fleet(trace, sim_plan("llama-3.1-8b", "h100-sxm", policy="vllm-v1", max_model_len=4096),
                           cost, replicas=replicas, concurrency=4)
    # the same run, its first 30 requests as sent (25% of 120) out of the figures, the span after them
    by_arrival = sorted(whole.requests, key=lambda r: r.arrival)
    assert {r.request_id for r in fast.requests} == {r.request_id for r in by_arrival[30:]}
    assert fast.metrics.num_completed == 90 and fast.steps == whole.steps
    assert fast.metrics.duration == max(r.finish for r in fast.requests) - by_arrival[30].arrival


def test_a_live_warmup_percentage_leaves_out_what_the_simulated_one_does(llama_dir):
    deployment = Deployment(model=llama_dir, gpu="cpu", block_size=8, max_num_seqs=8, max_model_len=80,
                            client_warmup_percent=20)
    spec = ValidationSpec(deployment, workload="chatbot", concurrency=2, requests=10, length_scale=0.1,
                          max_prompt_len=40, max_output_len=12, seed=2)
    v = validate(spec, cost_model=ConstantCost())
    assert v.live.metrics["num_completed"] == v.simulated["num_completed"] == 8      # 2 of the 10 left out
    assert [r.request_id for r in v.live.requests] == [r.request_id for r in v.sim_requests]


def test_a_disaggregated_fleets_warm_up_is_left_out_too(tmp_path):
    from typer.testing import CliRunner
    from planner.cli import app
    runs = {}
    for name, extra in (("plain", []), ("warm", ["--client-warmup-step"])):
        result = CliRunner().invoke(app, ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--pd", "1:1",
                                          "--workload", "chatbot", "--requests", "60", "--concurrency", "4", *extra,
                                          "--json", "--out", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
        runs[name] = json.loads(result.stdout)
    import csv
    rows = csv.DictReader((tmp_path / "plain" / "requests.csv").open())
    firsts = sum(row["request_id"].endswith("-0") for row in rows)
    assert runs["plain"]["num_completed"] == 60 and runs["warm"]["num_completed"] == 60 - firsts > 0


@pytest.mark.parametrize("replicas", [1, 2])
def test_simulated_clients_send_their_most_requests(replicas):
    from planner.sim.fleet import simulate_fleet
    trace = make_trace("chatbot", num_requests=120, rate=50.0, seed=3)
    cost = LinearCostModel(0.01, 1e-4)
    for early_stop in (False, True):
        plan = sim_plan("llama-3.1-8b", "h100-sxm", policy="vllm-v1", max_model_len=4096, client_max_requests=5,
                        client_early_stop=early_stop)
        fast, slow = (simulate_fleet(trace, plan, cost, replicas=replicas, concurrency=4, fast_forward=ff)
                      for ff in (True, False))
        assert fast.requests == slow.requests and fast.metrics.num_completed == len(fast.requests)
        # four clients of five requests each; with the early stop, the others stop after their request under way
        # once the first has sent its five
        assert len(fast.requests) == 20 if not early_stop else 5 + 3 <= len(fast.requests) < 20


@pytest.mark.parametrize("replicas", [1, 2])
def test_simulated_clients_stop_early(replicas):
    from planner.sim.fleet import simulate_fleet
    trace = make_trace("chatbot", num_requests=120, rate=50.0, seed=3)
    plan = sim_plan("llama-3.1-8b", "h100-sxm", policy="vllm-v1", max_model_len=4096, client_early_stop=True)
    cost = LinearCostModel(0.01, 1e-4)
    fast, slow = (simulate_fleet(trace, plan, cost, replicas=replicas, concurrency=4, fast_forward=ff)
                  for ff in (True, False))
    assert fast.requests == slow.requests and fast.metrics.num_completed == len(fast.requests) < len(trace)
    whole = simulate_fleet(trace, sim_plan("llama-3.1-8b", "h100-sxm", policy="vllm-v1", max_model_len=4096),
                           cost, replicas=replicas, concurrency=4)
    # the stop leaves out the tail where fewer than 4 clients remain: more of them in flight on average
    assert whole.metrics.num_completed == len(trace)
    assert fast.metrics.mean_concurrency > whole.metrics.mean_concurrency


def test_live_clients_stop_early_as_the_simulated_ones(llama_dir):
    deployment = Deployment(model=llama_dir, gpu="cpu", block_size=8, max_num_seqs=8, max_model_len=80,
                            enable_prefix_caching=True, client_early_stop=True)
    spec = ValidationSpec(deployment, workload="chatbot", concurrency=2, requests=12, length_scale=0.1,
                          max_prompt_len=40, max_output_len=12, seed=3, seeds=0)
    v = validate(spec, cost_model=ConstantCost())
    assert v.live.metrics["num_completed"] == v.simulated["num_completed"] < 12

    def steps(records):
        return [(s.batch_size, s.prefill_tokens, s.decode_tokens, s.kv_blocks_used) for s in records]
    assert steps(v.live.steps) == steps(v.sim_steps)
    # each client stopping after its three requests (the benchmark's --max-num-requests 6 over 2 clients)
    limited = replace(spec, deployment=replace(deployment, client_early_stop=False, client_max_requests=3))
    v = validate(limited, cost_model=ConstantCost())
    assert v.live.metrics["num_completed"] == v.simulated["num_completed"] == 6
    assert steps(v.live.steps) == steps(v.sim_steps)
    # a context too short for the later turns: a refused turn ends its conversation, live and simulated
    short = replace(spec, deployment=replace(deployment, client_early_stop=False, max_model_len=24))
    v = validate(short, cost_model=ConstantCost())
    assert v.live.metrics["num_rejected"] == v.simulated["num_rejected"] > 0
    assert v.live.metrics["num_submitted"] == v.simulated["num_submitted"] < 12
    assert steps(v.live.steps) == steps(v.sim_steps)
    # a warm-up first (the benchmark's --warmup-step): the same steps, its first turns out of both figures
    warmed = replace(spec, deployment=replace(deployment, client_early_stop=False, client_warmup_step=True))
    v = validate(warmed, cost_model=ConstantCost())
    later = sum(r.turn > 0 for r in warmed.trace())
    assert v.live.metrics["num_completed"] == v.simulated["num_completed"] == later > 0
    assert steps(v.live.steps) == steps(v.sim_steps)


def test_bench_clients_stop_early(monkeypatch):
    # planner bench stops as the benchmark does, and leaves the requests never sent out of its results
    import httpx
    import planner.bench.client as bench
    from planner.bench.client import BenchConfig, bench_metrics, run_bench

    def serve(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        chunks = [{"choices": [{"index": 0, "text": "x", "finish_reason": None}]}] * body["max_tokens"]
        sse = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx.Response(200, content=sse.encode(), headers={"content-type": "text/event-stream"})

    real = httpx.AsyncClient
    monkeypatch.setattr(bench.httpx, "AsyncClient", lambda **kw: real(**kw, transport=httpx.MockTransport(serve)))
    trace = make_trace("chatbot", num_requests=12, rate=1000.0, seed=5, max_history=40, max_output_len=6,
                       think_time=0.001, time_per_token=1e-4)       # conversations of 1, 1, 3 and 7 turns
    results, _ = run_bench(trace, BenchConfig(endpoint="http://mock", model="m", prompt_format="tokens",
                                              max_concurrency=2, client_early_stop=True, vocab_size=256))
    metrics = bench_metrics(results)
    assert 0 < len(results) < 12 and metrics["num_failed"] == 0 and metrics["num_completed"] == len(results)
