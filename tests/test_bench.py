"""`planner bench` against a real server on 127.0.0.1: every request accounted for, vLLM's timing conventions."""
from __future__ import annotations

import csv
import json
from collections import defaultdict

import pytest
from typer.testing import CliRunner

from engine.llm_engine import LLMEngine
from planner.cli.app import app
from planner.bench.client import BenchRequest, bench_metrics
from engine.entrypoints.openai.server import BackgroundServer
from serve_helpers import save_byte_model
from workloads import make_trace
from workloads.clients import ClientKnobs, TurnQueue

# It reads the wall clock (a live engine, a server, a time limit): scripts/test.sh runs it alone.
pytestmark = pytest.mark.serial


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = save_byte_model(tmp_path_factory.mktemp("byte-llama"))
    engine = LLMEngine(folder, block_size=8, num_gpu_blocks=128, max_num_seqs=16)
    with BackgroundServer(engine, "tiny", folder) as srv:
        yield srv


def test_bench_replays_a_workload_and_writes_the_planner_schema(server, tmp_path):
    result = CliRunner().invoke(app, ["bench", "--endpoint", server.url, "--workload", "alpaca", "--requests", "8",
                                      "--rate", "40", "--length-scale", "0.1", "--max-prompt-len", "40",
                                      "--max-output-len", "6", "--slo", "ttft_p99=30", "--out", str(tmp_path),
                                      "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert (doc["num_completed"], doc["num_failed"], doc["model"] or "tiny") == (8, 0, "tiny")
    for key in ("request_throughput", "output_token_throughput", "ttft_mean", "ttft_p99", "tpot_mean",
                "itl_mean", "e2e_p99", "request_goodput"):
        assert doc[key] is not None and doc[key] >= 0, key
    assert doc["num_good"] == 8
    rows = list(csv.DictReader((tmp_path / "requests.csv").open()))
    assert len(rows) == 8
    # ignore_eos: every output has exactly the trace's length.
    assert all(r["output_len"] == r["expected_output_len"] for r in rows)
    assert all(float(r["e2e"]) >= float(r["ttft"]) > 0 for r in rows)
    assert json.loads((tmp_path / "result.json").read_text())["num_completed"] == 8


def test_failed_requests_are_reported_not_dropped(server, tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"request_id": "ok", "arrival_time": 0, "prompt_len": 8, "output_len": 3}\n'
                     '{"request_id": "too-long", "arrival_time": 0.01, "prompt_len": 500, "output_len": 3}\n')
    result = CliRunner().invoke(app, ["bench", "--endpoint", server.url, "--trace", str(trace),
                                      "--out", str(tmp_path / "run"), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert (doc["num_submitted"], doc["num_completed"], doc["num_failed"]) == (2, 1, 1)
    assert doc["failures"][0]["request_id"] == "too-long" and "maximum context length" in doc["failures"][0]["error"]


def test_unreachable_endpoint_is_one_line_and_exit_2(tmp_path):
    result = CliRunner().invoke(app, ["bench", "--endpoint", "http://127.0.0.1:9", "--workload", "alpaca",
                                      "--requests", "2", "--out", str(tmp_path)])
    assert result.exit_code == 2 and result.stderr.startswith("error: cannot list the models")
    assert "nothing answers there (is the server up?)" in result.stderr and "Errno" not in result.stderr


def test_tpot_follows_vllm_from_usage_tokens_not_chunks():
    # Two chunks, but the server generated 5 tokens (it streamed several per chunk).
    r = BenchRequest("a", 0.0, 4, 5, start=0.0, ttft=0.1, itl=[0.4], latency=0.5, output_len=5, success=True)
    failed = BenchRequest("b", 0.0, 4, 5, start=0.0, error="HTTP 400: no")
    m = bench_metrics([r, failed], {"e2e_p99": 1.0})
    assert m["tpot_mean"] == pytest.approx((0.5 - 0.1) / 4)
    assert m["itl_mean"] == pytest.approx(0.4)
    assert (m["num_completed"], m["num_failed"], m["num_good"]) == (1, 1, 1)
    # and as the planner's record, which `validate --endpoint` compares with the simulation's
    assert r.record().tpot == pytest.approx((0.5 - 0.1) / 4)


def test_max_concurrency_keeps_at_most_n_requests_in_flight_in_a_closed_loop(server, tmp_path):
    result = CliRunner().invoke(app, ["bench", "--endpoint", server.url, "--workload", "alpaca", "--requests", "10",
                                      "--length-scale", "0.1", "--max-prompt-len", "20", "--max-output-len", "5",
                                      "--max-concurrency", "3", "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["num_completed"] == 10 and doc["max_concurrency"] == 3
    rows = list(csv.DictReader((tmp_path / "requests.csv").open()))
    spans = [(float(r["start"]), float(r["start"]) + float(r["e2e"])) for r in rows]
    # no instant with more than 3 requests in flight, and the clients kept the loop busy
    assert max(sum(s <= t < e for s, e in spans) for t, _ in spans) <= 3
    assert 2 < doc["mean_concurrency"] <= 3


def test_bench_takes_vllm_bench_spellings_a_burstiness_and_a_limit_in_flight(server, tmp_path):
    result = CliRunner().invoke(app, ["bench", "--endpoint", server.url, "--workload", "alpaca", "--num-prompts", "8",
                                      "--request-rate", "40", "--burstiness", "0.5", "--max-concurrency", "2",
                                      "--length-scale", "0.1", "--max-prompt-len", "20", "--max-output-len", "5",
                                      "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert (doc["num_completed"], doc["rate"], doc["burstiness"], doc["max_concurrency"]) == (8, 40.0, 0.5, 2)
    rows = list(csv.DictReader((tmp_path / "requests.csv").open()))
    spans = [(float(r["start"]), float(r["start"]) + float(r["e2e"])) for r in rows]
    assert max(sum(s <= t < e for s, e in spans) for t, _ in spans) <= 2


def test_bench_takes_a_workloads_parameters(server, tmp_path):
    # vllm bench serve --dataset-name random --random-input-len 24 --random-output-len 3, as -p KEY=VALUE
    result = CliRunner().invoke(app, ["bench", "--endpoint", server.url, "--workload", "random", "-p", "input_len=24",
                                      "-p", "output_len=3", "--requests", "4", "--prompt-format", "tokens",
                                      "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader((tmp_path / "requests.csv").open()))
    assert [(int(r["prompt_len"]), int(r["output_len"])) for r in rows] == [(24, 3)] * 4
    bad = CliRunner().invoke(app, ["bench", "--endpoint", server.url, "--workload", "random", "-p", "turns=2",
                                   "--out", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "expected KEY=VALUE with KEY one of input_len" in bad.stderr


def bench_turns(server, tmp_path, trace, *flags: str) -> tuple[dict, dict]:
    """`planner bench` of `trace` against `server`, its ids sent as tokens, with `flags`: the JSON document it
    prints, and its requests.csv rows by request id."""
    path = tmp_path / "trace.jsonl"
    trace.save(path)
    result = CliRunner().invoke(app, ["bench", "--endpoint", server.url, "--trace", str(path), "--prompt-format",
                                      "tokens", *flags, "--out", str(tmp_path / "run"), "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["request_id"]: r for r in csv.DictReader((tmp_path / "run" / "requests.csv").open())}
    return json.loads(result.stdout), rows


@pytest.mark.parametrize("clients", [["--max-concurrency", "1"], ["--turns-after-answers"]])
def test_bench_drops_a_conversation_whose_turn_the_server_refused(server, tmp_path, clients):
    # vLLM's multi-turn benchmark drops a conversation once a turn fails: A's second turn is longer than the
    # server's 128-token context, so A's third is never sent, and B's turns follow; so do users who wait for
    # their answers (an open loop's, each later turn sent once the one before has ended)
    from workloads import Trace, TraceRequest

    def turn(conversation: str, k: int, prompt_len: int) -> TraceRequest:
        return TraceRequest(request_id=f"{conversation}{k}", arrival_time=0.0, prompt_len=prompt_len, output_len=4,
                            conversation_id=conversation, turn=k)
    trace = Trace([turn("a", 0, 10), turn("b", 0, 10), turn("a", 1, 200), turn("b", 1, 20), turn("a", 2, 210)])
    doc, rows = bench_turns(server, tmp_path, trace, *clients)
    assert sorted(rows) == ["a0", "a1", "b0", "b1"] and doc["num_failed"] == 1


def test_bench_says_when_turns_after_answers_finds_no_conversation_to_time(server, tmp_path):
    from workloads import Trace, TraceRequest
    path = Trace([TraceRequest(request_id=f"r{i}", arrival_time=0.0, prompt_len=10, output_len=2)
                  for i in range(2)]).save(tmp_path / "plain.jsonl")
    result = CliRunner().invoke(app, ["bench", "--endpoint", server.url, "--trace", str(path), "--prompt-format",
                                      "tokens", "--turns-after-answers", "--out", str(tmp_path / "run"), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["num_completed"] == 2
    assert result.stderr.startswith("warning: --turns-after-answers: the trace has no conversation with a later "
                                    "turn")


def test_bench_sends_a_turn_its_think_time_after_the_answer_before_it(server, tmp_path):
    # --turns-after-answers: first turns at their trace times, each later one its think time after the answer
    # to the turn before ended (workloads/sessions.py)
    trace = make_trace("chatbot", num_requests=12, rate=50.0, seed=13, max_history=40, max_output_len=6,
                       think_time=0.2, time_per_token=1e-4)
    doc, rows = bench_turns(server, tmp_path, trace, "--turns-after-answers")
    assert doc["num_completed"] == len(rows) == 12
    previous, later = {}, 0
    for req in trace:
        start = float(rows[req.request_id]["start"])
        before = previous.get(req.conversation_id)
        if before is None:
            assert start == pytest.approx(req.arrival_time, abs=0.05)
        else:
            answered = float(before["start"]) + float(before["e2e"])
            assert answered + req.think_time - 0.01 <= start <= answered + req.think_time + 0.1
            later += 1
        previous[req.conversation_id] = rows[req.request_id]
    assert later >= 4


@pytest.mark.parametrize("clients, sent", [(["--max-concurrency", "3"], 12),
                                           (["--max-concurrency", "2", "--max-active-conversations", "4"], 9),
                                           (["--max-concurrency", "3", "--client-max-requests", "2"], 6),
                                           (["--max-concurrency", "2", "--client-warmup-step"], 8),
                                           (["--max-concurrency", "1", "--max-active-conversations", "4",
                                             "--conversation-sampling", "random", "--seed", "9"], 7)])
def test_bench_clients_send_a_conversations_turns_one_after_another(server, tmp_path, clients, sent):
    # 4 conversations of 2-4 turns; with --max-active-conversations 4, two clients of two conversations each
    trace = make_trace("chatbot", num_requests=12, rate=1000.0, seed=13, max_history=40, max_output_len=6,
                       think_time=0.001, time_per_token=1e-4)     # every turn due at once: a closed loop
    doc, rows = bench_turns(server, tmp_path, trace, *clients)
    # two conversations a client: a client that finds none left to take stops, as the benchmark's does, leaving
    # its other conversation's turns unsent (and out of the results); or each stops after its two requests; or
    # a warm-up sends the four first turns, left out of the results
    assert doc["num_completed"] == len(rows) == sent
    by_conversation = defaultdict(list)
    for req in trace:
        if req.request_id not in rows:
            continue
        warmed = "--client-warmup-step" in clients
        assert len(by_conversation[req.conversation_id]) == req.turn - warmed    # none sent after one left unsent
        row = rows[req.request_id]
        by_conversation[req.conversation_id].append((float(row["start"]), float(row["start"]) + float(row["e2e"])))
    assert any(len(turns) > 1 for turns in by_conversation.values())
    for turns in by_conversation.values():
        assert all(after[0] >= before[1] for before, after in zip(turns, turns[1:]))
    if "--conversation-sampling" in clients:       # one client: its random picks, as the planner's queue draws them
        queue = TurnQueue(trace.requests, 1, ClientKnobs(max_active_conversations=4, conversation_sampling="random"),
                          seed=9)
        order = [queue.first()]
        while order[-1] is not None:
            order.append(queue.after(order[-1]))
        started = sorted(rows, key=lambda request_id: float(rows[request_id]["start"]))
        assert started == [r.request_id for r in order[:-1]]
    if "--max-active-conversations" in clients and "--conversation-sampling" not in clients:
        # all four under way at once, two requests at a time
        spans = [(turns[0][0], turns[-1][1]) for turns in by_conversation.values()]
        assert max(sum(s <= t < e for s, e in spans) for t, _ in spans) == 4
        sent = [(float(r["start"]), float(r["start"]) + float(r["e2e"])) for r in rows.values()]
        assert max(sum(s <= t < e for s, e in sent) for t, _ in sent) <= 2


def test_bench_leaves_a_warmup_percentage_out(server, tmp_path):
    # vLLM's multi-turn benchmark's --warmup-percentages 25%: 3 of the 12 answered requests out of the results,
    # the first three sent (the three clients' first turns)
    trace = make_trace("chatbot", num_requests=12, rate=1000.0, seed=13, max_history=40, max_output_len=6,
                       think_time=0.001, time_per_token=1e-4)
    doc, rows = bench_turns(server, tmp_path, trace, "--max-concurrency", "3", "--client-warmup-percent", "25")
    queue = TurnQueue(trace.requests, 3)
    firsts = {queue.first().request_id for _ in range(3)}
    assert doc["num_completed"] == len(rows) == 9
    assert set(rows) == {r.request_id for r in trace} - firsts


def test_a_failed_request_ends_when_it_fails_and_the_run_lasts_until_then(monkeypatch):
    """vLLM's benchmark divides by its whole run, failed requests included: a server that dies late must not
    make the requests it served look faster (8 served in 1.45 s of a 6.25 s run read 5.5 req/s)."""
    import asyncio
    import httpx
    from planner.bench.client import BenchConfig, run_bench_async
    from workloads import Trace, TraceRequest

    async def serve(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content)["max_tokens"] == 9:      # the late one: the server has gone
            await asyncio.sleep(0.3)
            raise httpx.ReadTimeout("")
        chunks = [{"choices": [{"index": 0, "text": "w", "finish_reason": None}]},
                  {"choices": [{"index": 0, "text": "w", "finish_reason": "length"}]},
                  {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}}]
        text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})

    real = httpx.AsyncClient
    monkeypatch.setattr(httpx, "AsyncClient", lambda **kw: real(transport=httpx.MockTransport(serve), **kw))
    trace = Trace([TraceRequest(request_id=str(i), arrival_time=0.0, prompt_len=4, output_len=out)
                   for i, out in enumerate((2, 2, 9))])
    results, wall = asyncio.run(run_bench_async(trace, BenchConfig("http://mock", model="m")))
    failed = results[-1]
    assert not failed.success and failed.error == "ReadTimeout" and failed.latency >= 0.3
    m = bench_metrics(results)
    assert m["num_completed"] == 2 and 0.3 <= m["duration"] <= wall
    assert m["request_throughput"] == pytest.approx(2 / m["duration"])
