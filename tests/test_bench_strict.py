"""`planner bench` against a strict OpenAI server that is not ours (issue 27, item 7).

The fake server takes only what OpenAI's API documents: a string prompt for /v1/completions and string
message contents for /v1/chat/completions (as guidellm's mock server does); a token-id prompt is a 400.
Text prompts (the default) are served; token ids fail every request, and bench then exits non-zero.
"""
from __future__ import annotations

import csv
import json
import threading
import time

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route
from typer.testing import CliRunner

from engine.entrypoints.openai.server import free_port
from planner.cli.app import app as cli

OUTPUT_TOKENS = 3


def _chunks(chat: bool, prompt_tokens: int):
    for i in range(OUTPUT_TOKENS):
        last = i == OUTPUT_TOKENS - 1
        choice = ({"index": 0, "delta": {"content": f"w{i}"}} if chat else {"index": 0, "text": f"w{i}"})
        yield f"data: {json.dumps({'choices': [{**choice, 'finish_reason': 'length' if last else None}]})}\n\n"
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": OUTPUT_TOKENS,
             "total_tokens": prompt_tokens + OUTPUT_TOKENS}
    yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
    yield "data: [DONE]\n\n"


def _refuse(field: str) -> JSONResponse:
    return JSONResponse({"error": {"message": f"{field}: Input should be a valid string", "type": "BadRequestError",
                                   "param": field, "code": 400}}, status_code=400)


SESSIONS: list[str | None] = []      # each completion's x-session-id header
SALTS: list[str | None] = []         # and its body's cache_salt


async def completions(request: Request):
    SESSIONS.append(request.headers.get("x-session-id"))
    body = await request.json()
    SALTS.append(body.get("cache_salt"))
    if not isinstance(body.get("prompt"), str):
        return _refuse("prompt")
    return StreamingResponse(_chunks(False, len(body["prompt"].split())), media_type="text/event-stream")


async def chat(request: Request):
    body = await request.json()
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m.get("content"), str) for m in messages):
        return _refuse("messages")
    words = sum(len(m["content"].split()) for m in messages)
    return StreamingResponse(_chunks(True, words), media_type="text/event-stream")


async def models(request: Request):
    return JSONResponse({"object": "list", "data": [{"id": "mock", "object": "model"}]})


@pytest.fixture(scope="module")
def strict_server():
    app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]),
                            Route("/v1/chat/completions", chat, methods=["POST"]),
                            Route("/v1/models", models)])
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(30)


def bench(url: str, tmp_path, *extra: str):
    args = ["bench", "--endpoint", url, "--workload", "alpaca", "--requests", "6", "--rate", "50",
            "--length-scale", "0.2", "--out", str(tmp_path), "--json", *extra]
    return CliRunner().invoke(cli, args)


@pytest.mark.parametrize("extra", [(), ("--endpoint-type", "chat")])
def test_text_prompts_are_served_by_a_strict_server(strict_server, tmp_path, extra):
    result = bench(strict_server, tmp_path, *extra)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert (doc["num_completed"], doc["num_failed"]) == (6, 0)
    assert doc["ttft_mean"] > 0 and doc["e2e_mean"] >= doc["ttft_mean"]
    rows = list(csv.DictReader((tmp_path / "requests.csv").open()))
    assert [int(r["output_len"]) for r in rows] == [OUTPUT_TOKENS] * 6
    # The prompt length kept is the server's own count (here: words), not the trace's.
    assert all(int(r["prompt_len"]) >= 1 for r in rows)


def test_token_prompts_fail_every_request_and_bench_exits_non_zero(strict_server, tmp_path):
    result = bench(strict_server, tmp_path, "--prompt-format", "tokens")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert (doc["num_completed"], doc["num_failed"]) == (0, 6)
    assert "prompt: Input should be a valid string" in doc["failures"][0]["error"]
    assert result.stderr.startswith("error: every request failed (6)") and result.stderr.count("\n") == 1


def test_chat_with_token_prompts_is_a_one_line_error(strict_server, tmp_path):
    result = bench(strict_server, tmp_path, "--endpoint-type", "chat", "--prompt-format", "tokens")
    assert result.exit_code == 2 and result.stderr.startswith("error: a chat endpoint takes text messages")


@pytest.mark.parametrize("timeout", ["0", "nan", "-1", "inf"])
def test_a_timeout_no_request_could_meet_is_a_one_line_error(strict_server, tmp_path, timeout):
    """0, a negative or NaN failed every request one by one (httpx: 'deadline must not be NaN')."""
    result = bench(strict_server, tmp_path, "--timeout", timeout)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: --timeout must be a positive, finite number of seconds, got ")


def test_session_key_sends_each_requests_conversation_in_that_header(strict_server, tmp_path):
    """For a fleet routing by `session` (serve --router session): each request's conversation id in the header."""
    from workloads import make_trace
    SESSIONS.clear()
    quick = {"think_time": 0.01, "time_per_token": 0.0001}         # (turns a few ms apart)
    args = ["bench", "--endpoint", strict_server, "--workload", "chatbot", "--requests", "8", "--rate", "50",
            "--length-scale", "0.05", "--out", str(tmp_path), "--json", "--session-key", "X-Session-Id",
            *(f"-p{k}={v}" for k, v in quick.items())]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    trace = make_trace("chatbot", num_requests=8, rate=50.0, seed=0, **quick)
    assert sorted(SESSIONS) == sorted(r.conversation_id for r in trace.requests)
    SESSIONS.clear()
    assert bench(strict_server, tmp_path).exit_code == 0 and SESSIONS == [None] * 6     # (not asked: not sent)
    bad = bench(strict_server, tmp_path, "--session-key", "x session")
    assert bad.exit_code == 2 and bad.stderr.startswith("error: --session-key 'x session' is not an HTTP header name")


def test_a_traces_tenants_are_sent_as_vllms_cache_salt(strict_server, tmp_path):
    """A workload's -p tenants=K salts each request (vLLM's cache_salt field); an unsalted one sends none."""
    from workloads import make_trace
    SALTS.clear()
    assert bench(strict_server, tmp_path, "-p", "tenants=3").exit_code == 0
    trace = make_trace("alpaca", num_requests=6, rate=50.0, seed=0, tenants=3)
    assert sorted(SALTS) == sorted(r.cache_salt for r in trace) and set(SALTS) <= {"tenant-1", "tenant-2",
                                                                                   "tenant-3"}
    SALTS.clear()
    assert bench(strict_server, tmp_path).exit_code == 0 and SALTS == [None] * 6
