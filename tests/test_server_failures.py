"""A failing step fails only its own requests; disconnects abort and are counted; nothing is cut short (issue 27).

The failure is injected into the model runner: a step that prefills a marked prompt raises. The request
in that step gets a 500 naming the internal error; a stream decoding in other steps runs to the end;
/metrics counts the failure and /health says what is true.

A fleet's replica that freezes with its port open (SIGSTOP) is found by the proxy's health watcher: new
requests pass it over, those waiting on it go to another replica, its streams end with an error event, and
it is routed to again once it answers (fake replicas, which start in a second; one real fleet, slow). A
replica that refuses, or is killed before it answers, has its requests sent to another too; once an answer
has begun, or when the replica answered an error, nothing is sent again.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
import uvicorn
from typer.testing import CliRunner

from engine.core.routing import parse_policy
from engine.entrypoints.openai.server import BackgroundServer, free_port
from engine.entrypoints.router import launch
from engine.entrypoints.router.launch import BackgroundFleet
from engine.entrypoints.router.proxy import Proxy, build_proxy_app
from engine.llm_engine import LLMEngine
from serve_helpers import engine_idle, metric, save_byte_model, sse_events, wait_until

# It reads the wall clock (a live engine, a server, a time limit): scripts/test.sh runs it alone.
pytestmark = pytest.mark.serial

MODEL = "tiny"
POISON = [5, 300, 7, 300, 5]   # a prompt only the failing requests start with (300: no byte's token)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_byte_model(tmp_path_factory.mktemp("byte-llama"))


@pytest.fixture()
def failing_server(folder):
    """A server whose runner raises on any step that prefills a prompt starting with POISON."""
    engine = LLMEngine(folder, block_size=8, num_gpu_blocks=64, max_num_seqs=8, max_model_len=128)
    execute = engine.runner.execute

    def execute_or_fail(inputs):
        if any(i.start_pos == 0 and i.token_ids[:len(POISON)] == POISON for i in inputs):
            raise RuntimeError("injected device fault")
        return execute(inputs)
    engine.runner.execute = execute_or_fail
    with BackgroundServer(engine, MODEL, folder) as srv:
        yield srv


def metrics_text(server) -> str:
    return httpx.get(f"{server.url}/metrics").text


def stream_in_thread(url: str, body: dict, into: list) -> threading.Thread:
    def run():
        with httpx.Client(timeout=60) as c, c.stream("POST", url, json=body) as r:
            into.extend(sse_events(r))
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_an_injected_step_failure_fails_only_its_request(failing_server):
    srv = failing_server
    events: list[str] = []
    long = {"prompt": "a long story", "max_tokens": 80, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    thread = stream_in_thread(f"{srv.url}/v1/completions", long, events)
    assert wait_until(lambda: len(events) >= 2)
    bad = httpx.post(f"{srv.url}/v1/completions", json={"prompt": POISON, "max_tokens": 4}, timeout=60)
    assert bad.status_code == 500
    error = bad.json()["error"]
    assert error["type"] == "InternalServerError" and "RuntimeError: injected device fault" in error["message"]
    thread.join(60)
    assert events[-1] == "[DONE]" and json.loads(events[-2])["usage"]["completion_tokens"] == 80
    assert httpx.get(f"{srv.url}/health").status_code == 200
    ok = httpx.post(f"{srv.url}/v1/completions", json={"prompt": "after", "max_tokens": 3}, timeout=60)
    assert ok.status_code == 200
    text = metrics_text(srv)
    assert metric(text, "planner:engine_step_failures_total") == 1
    assert metric(text, "vllm:request_success_total", finished_reason="error") == 1
    assert wait_until(lambda: engine_idle(srv.engine))


def test_steps_failing_in_a_row_make_health_503_until_one_succeeds(failing_server):
    srv = failing_server
    for _ in range(3):
        r = httpx.post(f"{srv.url}/v1/completions", json={"prompt": POISON, "max_tokens": 2, "stream": True},
                       timeout=60)
        assert r.status_code == 500
    health = httpx.get(f"{srv.url}/health")
    assert health.status_code == 503 and "injected device fault" in health.json()["error"]["message"]
    ok = httpx.post(f"{srv.url}/v1/completions", json={"prompt": "fine", "max_tokens": 2}, timeout=60)
    assert ok.status_code == 200 and httpx.get(f"{srv.url}/health").status_code == 200


def test_disconnected_clients_are_aborted_and_counted_with_their_tokens(folder):
    engine = LLMEngine(folder, block_size=8, num_gpu_blocks=64, max_model_len=128)
    execute = engine.runner.execute

    def slow_execute(inputs):       # 20 ms a step: a request of 110 tokens outlasts the client's patience
        time.sleep(0.02)
        return execute(inputs)
    engine.runner.execute = slow_execute
    with BackgroundServer(engine, MODEL, folder) as srv:
        body = {"prompt": "never read", "max_tokens": 110, "ignore_eos": True}
        with pytest.raises(httpx.ReadTimeout):     # a non-streaming client that gives up
            httpx.post(f"{srv.url}/v1/completions", json=body, timeout=0.5)
        assert wait_until(lambda: engine_idle(engine), 30)
        with httpx.Client(timeout=30) as c, c.stream("POST", f"{srv.url}/v1/completions",
                                                      json={**body, "stream": True}) as r:
            got = [line for line, _ in zip(r.iter_lines(), range(6))]
            assert got
        assert wait_until(lambda: engine_idle(engine), 30)
        text = metrics_text(srv)
        assert metric(text, "vllm:request_success_total", finished_reason="abort") == 2
        assert metric(text, "vllm:request_success_total", finished_reason="length") == 0
        generated = metric(text, "vllm:generation_tokens_total")
        assert 0 < generated < 220 and metric(text, "vllm:request_generation_tokens_sum") == generated
        assert metric(text, "vllm:request_generation_tokens_count") == 2


def test_the_engine_refuses_a_context_the_cache_cannot_hold(tmp_path):
    folder = save_byte_model(tmp_path / "long-context", max_position_embeddings=2048)
    with pytest.raises(ValueError, match=r"max seq len \(2048\) is larger than the maximum number of tokens "
                                         r"that can be stored in KV cache \(1008\)"):
        LLMEngine(folder, block_size=16, num_gpu_blocks=64)
    from planner.cli.app import app
    result = CliRunner().invoke(app, ["serve", "--model", folder, "--block-size", "16", "--num-gpu-blocks", "64"])
    last = result.stderr.strip().splitlines()[-1]        # after "loading ...": one line, no traceback
    assert result.exit_code == 2 and last.startswith("error: The model's max seq len (2048)") and "1008" in last
    assert "Traceback" not in result.stderr


def test_small_cache_requests_are_served_whole_or_refused_never_cut_short(tmp_path):
    folder = save_byte_model(tmp_path / "small-cache", max_position_embeddings=2048)
    engine = LLMEngine(folder, block_size=16, num_gpu_blocks=64, max_model_len=1008, max_num_seqs=16)
    with BackgroundServer(engine, MODEL, folder) as srv:
        url = f"{srv.url}/v1/completions"
        long = httpx.post(url, json={"prompt": [65] * 1000, "max_tokens": 100}, timeout=60)
        assert long.status_code == 400 and long.json()["error"]["param"] == "max_tokens"
        # vllm-v1 (the default) runs n = 16 as 16 child requests, each fitting alone: served whole (the
        # paper's scheduler refuses it, its 16 sequences at their largest being more than the whole cache).
        wide = httpx.post(url, json={"prompt": "hi", "n": 16, "max_tokens": 80, "temperature": 1.0,
                                     "ignore_eos": True}, timeout=300)
        assert wide.status_code == 200 and wide.json()["usage"]["completion_tokens"] == 16 * 80
        four = httpx.post(url, json={"prompt": "hi", "n": 4, "max_tokens": 80, "temperature": 1.0,
                                     "ignore_eos": True}, timeout=120)
        assert four.status_code == 200 and four.json()["usage"]["completion_tokens"] == 320
        results: list = [None] * 6

        def one(i):     # together they need ~3x the cache: preempted and resumed, never truncated
            body = {"prompt": [66 + i] * 400, "max_tokens": 100, "ignore_eos": True}
            results[i] = httpx.post(url, json=body, timeout=300).json()
        threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert [r["usage"]["completion_tokens"] for r in results] == [100] * 6
        assert metric(metrics_text(srv), "vllm:num_preemptions_total") > 0
        assert wait_until(lambda: engine_idle(engine))


# -- a replica that freezes ----------------------------------------------------------------------------

# A stand-in replica: /health, an empty /metrics, and completions that answer after `wait` seconds, or
# stream `events` events `wait` seconds apart (`wait` may be {"<replica index>": seconds}: only those wait),
# or answer `status` with an error naming the replica; its process can be frozen with SIGSTOP.
FAKE_REPLICA = """
import asyncio, json, sys
import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

INDEX, PORT = int(sys.argv[1]), int(sys.argv[2])

async def health(request):
    return Response(status_code=200)

async def metrics(request):
    return PlainTextResponse("")

async def complete(request):
    body = await request.json()
    wait = body.get("wait", 0)
    wait = wait.get(str(INDEX), 0) if isinstance(wait, dict) else wait
    if "status" in body:
        return JSONResponse({"error": {"message": f"replica {INDEX} says no"}}, status_code=body["status"])
    if not body.get("stream"):
        await asyncio.sleep(wait)
        return JSONResponse({"replica": INDEX})
    async def events():
        for i in range(body.get("events", 1)):
            yield "data: " + json.dumps({"replica": INDEX, "event": i}) + "\\n\\n"
            await asyncio.sleep(wait)
        yield "data: [DONE]\\n\\n"
    return StreamingResponse(events(), media_type="text/event-stream")

app = Starlette(routes=[Route("/health", health), Route("/metrics", metrics),
                        Route("/v1/completions", complete, methods=["POST"])])
uvicorn.run(app, host="127.0.0.1", port=PORT, log_level="warning")
"""

# Test probes: every 0.1 s, 1 s each, 2 missed in a row: a frozen replica is down ~2 s after it froze.
PROBES = {"probe_period": 0.1, "probe_timeout": 1.0, "probe_failures": 2}
# One probe at the start, then none for a minute: a killed replica stays up, so requests are still sent to it.
NO_PROBES = {**PROBES, "probe_period": 60.0}


class FakeFleet:
    """Fake replica processes behind a real proxy (with its health watcher) on a thread."""

    def __init__(self, count: int, policy: str, probes: dict = PROBES) -> None:
        self.processes: list[subprocess.Popen] = []
        self.urls: list[str] = []
        self.server = None
        try:
            for i in range(count):
                port = free_port()
                self.processes.append(subprocess.Popen([sys.executable, "-c", FAKE_REPLICA, str(i), str(port)]))
                self.urls.append(f"http://127.0.0.1:{port}")
            assert all(wait_until(lambda u=u: _answers(u + "/health"), 30) for u in self.urls)
            self.proxy = Proxy(self.urls, parse_policy(policy), block_size=16, **probes)
            self.port = free_port()
            self.server = uvicorn.Server(uvicorn.Config(build_proxy_app(self.proxy), host="127.0.0.1",
                                                        port=self.port, log_level="warning", lifespan="on"))
            self.thread = threading.Thread(target=self.server.run, name="test-proxy", daemon=True)
            self.thread.start()
            assert wait_until(lambda: self.server.started, 30)
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def freeze(self, i: int) -> None:
        os.kill(self.processes[i].pid, signal.SIGSTOP)

    def thaw(self, i: int) -> None:
        os.kill(self.processes[i].pid, signal.SIGCONT)

    def kill(self, i: int) -> None:
        """SIGKILL: its port closes (requests waiting on it see the connection close, new ones are refused)."""
        self.processes[i].kill()
        self.processes[i].wait(10)

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=5).text

    def in_flight(self) -> list[int]:
        return [r.in_flight for r in self.proxy.replicas]

    def retries(self) -> list[float]:
        """planner:router_retries_total of each replica, as /metrics gives it ([] without the family)."""
        text = self.metrics()
        return [metric(text, "planner:router_retries_total", replica=str(i)) for i in range(len(self.urls))
                if f'planner:router_retries_total{{replica="{i}"}}' in text]

    def stop(self) -> None:
        for p in self.processes:             # thawed first: a frozen one would neither drain nor die on SIGTERM
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
        if self.server is not None:
            self.server.should_exit = True
            self.thread.join(30)
        for p in self.processes:
            p.kill()                         # nothing to drain (a thawed one still sleeps on its 60 s request)
            p.wait(10)

    def __enter__(self) -> "FakeFleet":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def post_in_thread(url: str, body: dict, into: list, timeout: float = 30) -> threading.Thread:
    """POST on a thread; `into` gets the response (or the exception) and the seconds it took."""
    def run():
        start = time.monotonic()
        try:
            into.append(httpx.post(url, json=body, timeout=timeout))
        except httpx.HTTPError as exc:
            into.append(exc)
        into.append(time.monotonic() - start)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def stopped_answering(fleet: FakeFleet, i: int) -> str:
    return f"replica {i} ({fleet.urls[i]}) stopped answering its health checks"


@pytest.mark.parametrize("policy", ["round-robin", "least-kv"])
def test_a_frozen_replica_is_passed_over_its_waiting_request_goes_to_another_and_it_comes_back(policy):
    with FakeFleet(2, policy) as fleet:
        url = f"{fleet.url}/v1/completions"
        assert httpx.post(url, json={}, timeout=10).json() == {"replica": 0}
        waiting: list = []
        waiter = post_in_thread(url, {"wait": {"1": 60}}, waiting)     # the next turn: replica 1
        assert wait_until(lambda: fleet.proxy.replicas[1].in_flight == 1, 10)
        fleet.freeze(1)
        early: list = []                # sent while replica 1 is frozen but not yet marked down
        post_in_thread(url, {}, early).join(20)
        waiter.join(20)
        assert len(waiting) == 2, "the request waiting on the frozen replica was not answered in 20 s"
        answer, took = waiting
        assert isinstance(answer, httpx.Response), answer
        # Nothing of replica 1's answer had come: once it is marked down, replica 0 serves the request.
        assert answer.status_code == 200 and answer.json() == {"replica": 0}
        assert took < 10                # ~2 s: 2 probes of 1 s missed, 0.1 s apart
        assert isinstance(early[0], httpx.Response) and early[0].json() == {"replica": 0}, early
        assert early[1] < 10
        after = [httpx.post(url, json={}, timeout=5) for _ in range(6)]
        assert [a.json() for a in after] == [{"replica": 0}] * 6
        start = time.monotonic()
        health = httpx.get(f"{fleet.url}/health", timeout=5)
        assert time.monotonic() - start < 1       # the watcher's verdict, not another probe's timeout
        # The fleet still serves: 200, the replica that cannot named (a load balancer keeps the fleet).
        assert health.status_code == 200 and health.json() == {"status": "degraded",
                                                               "unhealthy": [stopped_answering(fleet, 1)]}
        text = httpx.get(f"{fleet.url}/metrics", timeout=5).text
        assert metric(text, "planner:router_replica_up", replica="1") == 0
        assert metric(text, "planner:router_replica_up", replica="0") == 1
        assert metric(text, "planner:router_replica_down_total", replica="1") == 1
        assert metric(text, "planner:router_failures_total", replica="1") == 1
        assert metric(text, "planner:router_retries_total", replica="1") == 1
        assert metric(text, "planner:router_retries_total", replica="0") == 0
        fleet.thaw(1)
        assert wait_until(lambda: _answers(f"{fleet.url}/health"), 10)
        back = [httpx.post(url, json={}, timeout=10).json()["replica"] for _ in range(4)]
        assert sorted(back) == [0, 0, 1, 1]
        text = httpx.get(f"{fleet.url}/metrics", timeout=5).text
        assert metric(text, "planner:router_replica_up", replica="1") == 1
        assert [r.in_flight for r in fleet.proxy.replicas] == [0, 0]


def test_a_stream_from_a_replica_that_freezes_ends_with_an_error_event():
    with FakeFleet(2, "round-robin") as fleet:
        url = f"{fleet.url}/v1/completions"
        assert httpx.post(url, json={}, timeout=10).json() == {"replica": 0}
        events: list[str] = []

        def read():                     # every event as it comes (the stream runs ~20 s if nothing stops it)
            body = {"stream": True, "events": 400, "wait": 0.05}
            with httpx.Client(timeout=30) as c, c.stream("POST", url, json=body) as r:
                events.extend(line[6:] for line in r.iter_lines() if line.startswith("data: "))
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert wait_until(lambda: fleet.proxy.replicas[1].in_flight == 1, 10)
        time.sleep(0.3)
        fleet.freeze(1)
        reader.join(20)
        assert not reader.is_alive()
        assert 0 < len(events) < 400 and json.loads(events[0]) == {"replica": 1, "event": 0}
        assert events[-1] == "[DONE]"                  # ended as a replica ends a stream that fails
        error = json.loads(events[-2])["error"]
        assert error == {"message": stopped_answering(fleet, 1), "type": "BadGatewayError", "param": None,
                         "code": 502}
        assert wait_until(lambda: fleet.proxy.replicas[1].in_flight == 0, 5)


def test_with_every_replica_frozen_a_request_gets_a_503_naming_each():
    with FakeFleet(2, "least-requests") as fleet:
        fleet.freeze(0)
        fleet.freeze(1)
        assert wait_until(lambda: not any(r.up for r in fleet.proxy.replicas), 10)
        answer = httpx.post(f"{fleet.url}/v1/completions", json={}, timeout=5)
        message = answer.json()["error"]["message"]
        assert answer.status_code == 503 and answer.json()["error"]["type"] == "ServiceUnavailableError"
        assert message == f"no replica is up: {stopped_answering(fleet, 0)}; {stopped_answering(fleet, 1)}"


# -- a replica that fails before it answers: the request goes to another -----------------------------

@pytest.mark.parametrize("policy", ["round-robin", "least-requests", "least-kv", "prefix-aware"])
def test_a_replica_that_refuses_connections_has_its_requests_answered_by_another(policy):
    with FakeFleet(2, policy, NO_PROBES) as fleet:
        url = f"{fleet.url}/v1/completions"
        fleet.kill(1)                   # a closed port; the watcher, not probing, still holds it up
        answers: list = [[] for _ in range(6)]
        threads = [post_in_thread(url, {"wait": 0.2}, into) for into in answers]   # at once: 0 is busy
        for t in threads:
            t.join(20)
        assert [(a[0].status_code, a[0].json()) for a in answers] == [(200, {"replica": 0})] * 6
        text = fleet.metrics()
        retried = metric(text, "planner:router_retries_total", replica="1")
        # Each pick of replica 1 was refused and sent on (least-requests picks it, idle, every time).
        assert retried >= 1 and retried == metric(text, "planner:router_failures_total", replica="1")
        assert metric(text, "planner:router_requests_total", replica="1") == retried
        assert metric(text, "planner:router_requests_total", replica="0") == 6
        assert metric(text, "planner:router_retries_total", replica="0") == 0
        assert fleet.in_flight() == [0, 0]


def test_a_replica_killed_while_a_request_waits_for_its_headers_has_it_answered_by_another():
    with FakeFleet(2, "round-robin") as fleet:
        url = f"{fleet.url}/v1/completions"
        assert httpx.post(url, json={}, timeout=10).json() == {"replica": 0}
        waiting: list = []
        waiter = post_in_thread(url, {"wait": {"1": 60}}, waiting)     # the next turn: replica 1
        assert wait_until(lambda: fleet.proxy.replicas[1].in_flight == 1, 10)
        fleet.kill(1)                   # its connection closes before any header: no watcher needed
        waiter.join(20)
        answer, took = waiting
        assert isinstance(answer, httpx.Response) and answer.status_code == 200, answer
        assert answer.json() == {"replica": 0} and took < 5
        text = fleet.metrics()
        assert metric(text, "planner:router_retries_total", replica="1") == 1
        assert metric(text, "planner:router_requests_total", replica="0") == 2
        assert fleet.in_flight() == [0, 0]


def test_a_stream_whose_replica_dies_after_its_first_chunk_is_not_sent_again():
    with FakeFleet(2, "round-robin") as fleet:
        url = f"{fleet.url}/v1/completions"
        assert httpx.post(url, json={}, timeout=10).json() == {"replica": 0}
        events: list[str] = []

        def read():                     # every event as it comes
            body = {"stream": True, "events": 400, "wait": 0.05}
            with httpx.Client(timeout=30) as c, c.stream("POST", url, json=body) as r:
                events.extend(line[6:] for line in r.iter_lines() if line.startswith("data: "))
        reader = threading.Thread(target=read, daemon=True)          # replica 1's turn
        reader.start()
        assert wait_until(lambda: len(events) >= 2, 10)
        fleet.kill(1)
        reader.join(20)
        assert not reader.is_alive()
        # The client had replica 1's events: another replica's stream would repeat them, so it ends in error.
        assert json.loads(events[0]) == {"replica": 1, "event": 0} and len(events) < 400
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["code"] == 502 and error["message"].startswith(f"replica 1 ({fleet.urls[1]}) broke off")
        assert not any(json.loads(e).get("replica") == 0 for e in events[:-2])
        text = fleet.metrics()
        assert metric(text, "planner:router_requests_total", replica="0") == 1
        assert fleet.retries() == [0, 0]
        assert wait_until(lambda: fleet.in_flight() == [0, 0], 5)


def test_an_error_answer_from_a_replica_is_relayed_not_sent_again():
    with FakeFleet(2, "round-robin") as fleet:
        url = f"{fleet.url}/v1/completions"
        answers = [httpx.post(url, json={"status": status}, timeout=10) for status in (400, 500, 503, 500)]
        # The replica's own status and body: the request may be bad, or partly run.
        assert [(a.status_code, a.json()["error"]["message"]) for a in answers] == [
            (400, "replica 0 says no"), (500, "replica 1 says no"), (503, "replica 0 says no"),
            (500, "replica 1 says no")]
        stream = httpx.post(url, json={"status": 500, "stream": True}, timeout=10)
        assert stream.status_code == 500 and stream.json()["error"]["message"] == "replica 0 says no"
        text = fleet.metrics()
        assert metric(text, "planner:router_requests_total") == 5
        assert fleet.retries() == [0, 0]
        assert metric(text, "planner:router_failures_total") == 0
        assert fleet.in_flight() == [0, 0]


def test_when_every_replica_fails_a_request_gets_one_502_naming_each():
    with FakeFleet(2, "least-requests", NO_PROBES) as fleet:
        fleet.kill(0)
        fleet.kill(1)
        answer = httpx.post(f"{fleet.url}/v1/completions", json={}, timeout=10)
        assert answer.status_code == 502 and answer.json()["error"]["type"] == "BadGatewayError"
        message = answer.json()["error"]["message"]
        first, second = message.split("; ")        # the replica picked first, then the other: each once
        assert first.startswith(f"replica 0 ({fleet.urls[0]}) did not answer: ConnectError")
        assert second.startswith(f"replica 1 ({fleet.urls[1]}) did not answer: ConnectError")
        assert "\n" not in message
        text = fleet.metrics()
        assert metric(text, "planner:router_retries_total", replica="0") == 1      # sent on to replica 1
        assert metric(text, "planner:router_retries_total", replica="1") == 0      # no one left to send it to
        assert metric(text, "planner:router_failures_total") == 2
        assert fleet.in_flight() == [0, 0]


@pytest.mark.slow
def test_a_frozen_replica_of_a_real_fleet_stops_getting_requests(tmp_path):
    """Two engine replicas behind the proxy with its production probe settings: one frozen while it
    generates; once it is marked down its request is served by the other, and so are new requests."""
    folder = save_byte_model(tmp_path / "model")
    config = {"folder": folder, "deployment": {"block_size": 8, "kv_cache_memory_bytes": 1 << 22}, "device": "cpu",
              "model_name": MODEL, "threads": 1}
    with BackgroundFleet([config] * 2, parse_policy("round-robin"), 8, log_dir=tmp_path / "logs") as fleet:
        frozen = fleet.replicas[1].process
        url = f"{fleet.url}/v1/completions"
        try:
            first = httpx.post(url, json={"prompt": "hi", "max_tokens": 2}, timeout=60)
            assert first.status_code == 200
            waiting: list = []
            waiter = post_in_thread(url, {"prompt": "a long story", "max_tokens": 100, "ignore_eos": True},
                                    waiting, timeout=120)
            assert wait_until(lambda: fleet.proxy.replicas[1].in_flight == 1, 10)
            os.kill(frozen.pid, signal.SIGSTOP)
            frozen_at = time.monotonic()
            assert wait_until(lambda: not fleet.proxy.replicas[1].up, 60)
            down_after = time.monotonic() - frozen_at
            waiter.join(60)
            answer, took = waiting
            assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 100, answer
            served = [httpx.post(url, json={"prompt": "next", "max_tokens": 2}, timeout=60) for _ in range(4)]
            assert [s.status_code for s in served] == [200] * 4
            text = httpx.get(f"{fleet.url}/metrics", timeout=30).text
            assert metric(text, "planner:router_requests_total", replica="1") == 1
            assert metric(text, "planner:router_retries_total", replica="1") == 1
            print(f"frozen replica: its request answered by the other after {took:.1f} s; marked down "
                  f"{down_after:.1f} s after the freeze")
            assert down_after < 20
            os.kill(frozen.pid, signal.SIGCONT)
            assert wait_until(lambda: _answers(f"{fleet.url}/health"), 30)
        finally:
            os.kill(frozen.pid, signal.SIGCONT)


@pytest.mark.parametrize("flags, message", [
    (["--replicas", "2", "--probe-timeout", "0"], "error: --probe-timeout must be positive, got 0.0"),
    (["--replicas", "2", "--probe-interval", "-1"], "error: --probe-interval must be positive, got -1.0"),
    (["--replicas", "2", "--probe-misses", "0"], "error: --probe-misses must be positive, got 0"),
    (["--probe-misses", "3"], "error: --probe-misses sets the fleet proxy's health checks: give --replicas K too"),
    # a typo must not start replica processes until the machine gives out
    (["--replicas", "99999999999"], "error: --replicas 99999999999: a live fleet runs 1 to 64 replicas on this "
                                    "machine (planner simulate --replicas sizes a larger one)"),
    (["--log-level", "loud"], "error: --log-level 'loud': choose one of critical, error, warning, info, debug, "
                              "trace"),
    (["--replicas", "0"], "error: --replicas 0: a live fleet runs 1 to 64 replicas on this machine (planner "
                          "simulate --replicas sizes a larger one)"),
])
def test_serve_refuses_bad_health_probe_settings_in_one_line(folder, flags, message):
    from planner.cli.app import app
    result = CliRunner().invoke(app, ["serve", "--model", folder, *flags])
    assert result.exit_code == 2 and result.stderr.strip().splitlines() == [message]


def test_serve_refuses_an_address_it_cannot_listen_on_before_loading(folder, monkeypatch):
    """A mistyped host or a port in use: one line before the model loads (uvicorn would log it after)."""
    from engine import llm_engine
    from planner.cli.app import app
    monkeypatch.setattr(llm_engine, "LLMEngine", lambda *a, **k: pytest.fail("the model was loaded"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for flags, message in ((["--host", "no-such-host.invalid"], "cannot listen on --host no-such-host.invalid "
                                                                     "--port 8000: "),
                               (["--port", str(port)], f"cannot listen on --host 127.0.0.1 --port {port}: Address "
                                                       f"already in use"),
                               (["--port", str(port), "--replicas", "2"], "Address already in use")):
            result = CliRunner().invoke(app, ["serve", "--model", folder, *flags])
            assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1, result.output
            assert result.stderr.startswith(f"error: {message}") or message in result.stderr


def test_serve_hands_the_health_probe_settings_to_the_fleet_proxy(folder, monkeypatch):
    from planner.cli.app import app
    got = {}
    monkeypatch.setattr(launch, "serve_fleet", lambda *args, **kwargs: got.update(kwargs))
    result = CliRunner().invoke(app, ["serve", "--model", folder, "--replicas", "2", "--probe-interval", "0.5",
                                      "--probe-timeout", "1", "--probe-misses", "3"])
    assert result.exit_code == 0, result.output
    assert got["probes"] == {"probe_period": 0.5, "probe_timeout": 1.0, "probe_failures": 3}
    proxy = launch.proxy_server(["http://127.0.0.1:1"], parse_policy("round-robin"), 16, "127.0.0.1", 0,
                                probes=got["probes"]).config.app.state.proxy
    assert (proxy.probe_period, proxy.probe_timeout, proxy.probe_failures) == (0.5, 1.0, 3)


class _Upstream:
    """What the proxy's relay reads of a replica's streamed answer: its chunks and its close."""

    def __init__(self) -> None:
        self.closed = 0

    async def aiter_raw(self):
        yield b'data: {"replica": 0}\n\n'

    async def aclose(self) -> None:
        self.closed += 1


@pytest.mark.parametrize("spec, leaves", [("2.3", "while the headers go out"), ("2.4", "at the first chunk"),
                                         ("2.4", "never")])
def test_a_relayed_stream_ends_its_request_as_its_client_leaves(spec, leaves):
    """A client that leaves right after the headers still has the replica's connection closed (aborting the
    request there) and its in-flight count released the moment its response is over: a relay never
    started (ASGI 2.3: starlette cancels the stream when it sees the disconnect) runs no `finally`, and one
    whose send failed (ASGI 2.4: the server raises OSError) would wait for the garbage collector."""
    import asyncio

    from starlette.requests import ClientDisconnect

    from engine.entrypoints.router.proxy import RelayedStream, _Relay
    from engine.entrypoints.router.replicas import Replica

    async def run() -> None:
        replica, upstream, sent = Replica(0, "http://replica", in_flight=1), _Upstream(), []

        class Owner:     # the proxy's part the relay calls when the request ends
            @staticmethod
            def _ended(r: Replica) -> None:
                r.in_flight -= 1

        async def receive():
            if leaves != "while the headers go out":
                await asyncio.sleep(3600)
            return {"type": "http.disconnect"}

        async def send(message) -> None:
            if message["type"] == "http.response.start" and leaves == "while the headers go out":
                await asyncio.sleep(0.05)          # the disconnect is seen while the headers go out
            if message["type"] == "http.response.body" and leaves == "at the first chunk":
                raise OSError("the client is gone")
            sent.append(message["type"])

        relay = _Relay(Owner(), replica, upstream)
        response = RelayedStream(relay, headers={})
        try:
            await response({"type": "http", "asgi": {"spec_version": spec}, "method": "POST"}, receive, send)
        except ClientDisconnect:                   # starlette's word for the OSError
            assert leaves == "at the first chunk"
        assert upstream.closed == 1 and replica.in_flight == 0       # now, not when the relay is collected
        assert ("http.response.body" in sent) == (leaves == "never")

    asyncio.run(run())
