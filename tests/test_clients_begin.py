"""A closed loop's clients begin together (`TurnQueue.begin`): the same requests and the same state as one
`first` a client, however many clients find nothing to begin, which stop all together instead of one by one
(`--concurrency 99999999999` over eight requests ran for ever)."""
from __future__ import annotations

import json
import time

from hypothesis import given, settings, strategies as st
from typer.testing import CliRunner

from planner.cli.app import app
from workloads import TraceRequest
from workloads.clients import ClientKnobs, TurnQueue


@st.composite
def loops(draw):
    """A trace of conversations and lone requests, a number of clients and the knobs vLLM's benchmark takes."""
    requests, turns = [], {}
    for i in range(draw(st.integers(1, 12))):
        conversation = draw(st.sampled_from([None, "a", "b", "c", "d"]))
        turn = turns.get(conversation, -1) + 1 if conversation is not None else 0
        turns[conversation] = turn
        requests.append(TraceRequest(request_id=f"r{i}", arrival_time=0.0, prompt_len=8, output_len=2,
                                     conversation_id=conversation, turn=turn))
    conversations = sum(1 for r in requests if r.turn == 0)
    clients = draw(st.integers(1, 3 * len(requests) + 3))
    active = draw(st.one_of(st.none(), st.integers(clients, max(clients, conversations))))
    warmup = draw(st.booleans())
    knobs = ClientKnobs(max_active_conversations=active if active is not None and active <= conversations else None,
                        client_early_stop=draw(st.booleans()), client_warmup_step=warmup,
                        client_max_requests=draw(st.one_of(st.none(), st.integers(1, 3))),
                        conversation_sampling=draw(st.sampled_from(["round_robin", "random"])))
    return requests, clients, knobs, draw(st.integers(0, 3))


def state(queue: TurnQueue) -> dict:
    """What a queue holds, comparable (a conversation's turns by id, a client by what it holds)."""
    return {"starts": [r.request_id for r in queue.starts], "rest": {k: [r.request_id for r in v]
                                                                        for k, v in queue.rest.items()},
            "sent": sorted(queue.sent), **{name: getattr(queue, name) for name in (
                "unsent", "stopped", "left", "warming", "warmup_ids", "sent_order", "new_phase", "clients_left",
                "clients_begun", "conversations_each", "early_stop")}}


@settings(max_examples=300, deadline=None)
@given(loops())
def test_clients_begun_together_send_and_stop_as_one_by_one(loop):
    requests, clients, knobs, seed = loop
    together, one_by_one = (TurnQueue(requests, clients, knobs, seed) for _ in range(2))
    firsts = together.begin(clients)
    assert [r.request_id for r in firsts] == [r.request_id for r in (one_by_one.first() for _ in range(clients))
                                               if r is not None]
    assert state(together) == state(one_by_one)


def test_a_billion_clients_over_eight_requests_send_eight_at_once(tmp_path):
    runs = {}
    for clients in ("8", "99999999999"):
        started = time.perf_counter()
        result = CliRunner().invoke(app, ["simulate", "--model", "opt-125m", "--gpu", "a100", "--requests", "8",
                                          "--concurrency", clients, "--json", "--out", str(tmp_path / clients)])
        assert result.exit_code == 0, result.output
        assert time.perf_counter() - started < 30
        runs[clients] = json.loads(result.stdout)
    few, many = runs["8"], runs["99999999999"]
    assert many["num_completed"] == 8 and many["duration"] == few["duration"] and many["e2e_mean"] == few["e2e_mean"]
