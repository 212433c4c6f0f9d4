"""Clients that hold connections, send huge bodies or read KV events cannot stall or probe the server: half-sent
request heads time out, connections stop at a cap, bodies are parsed off the event loop, /kv_events asks the
API key, and the router tokenizes only a prompt's head."""
from __future__ import annotations

import asyncio
import json
import resource
import socket
import time

import httpx
import pytest

from engine.core.routing import parse_policy
from engine.entrypoints import http_guard
from engine.entrypoints.openai.app import ServerOptions
from engine.entrypoints.openai.errors import RequestError
from engine.entrypoints.openai.protocol import (MAX_CONTENT_PARTS, ChatCompletionRequest, CompletionRequest,
                                               parse_body)
from engine.entrypoints.openai.server import BackgroundServer
from engine.entrypoints.router.proxy import PREFIX_CHARS, Proxy
from engine.core.sampling_params import SamplingParams
from engine.llm_engine import LLMEngine
from serve_helpers import save_byte_model

# It reads the wall clock (a live engine, a server, a time limit): scripts/test.sh runs it alone.
pytestmark = pytest.mark.serial

KEY = "s3cret"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_byte_model(tmp_path_factory.mktemp("byte-llama"))


@pytest.fixture(scope="module")
def server(folder):
    engine = LLMEngine(folder, block_size=8, num_gpu_blocks=128, max_num_seqs=16)
    with BackgroundServer(engine, "tiny", folder, options=ServerOptions(api_key=KEY)) as srv:
        yield srv


def connect(server) -> socket.socket:
    return socket.create_connection((server.host, server.port), timeout=10)


def closed_by_server(sock: socket.socket, within: float) -> bool:
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except (socket.timeout, TimeoutError):
        return False
    except ConnectionResetError:
        return True


def test_a_request_head_that_never_ends_is_cut_off(server, monkeypatch):
    monkeypatch.setattr(http_guard.GuardedH11Protocol, "head_timeout", 0.5)
    silent, trickling = connect(server), connect(server)
    trickling.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")           # never the blank line
    assert closed_by_server(silent, 5) and closed_by_server(trickling, 5)
    # a whole request on a connection made as slowly still gets its answer, and keeps its connection
    sock = connect(server)
    sock.sendall(b"GET /health HTTP/1.1\r\n")
    time.sleep(0.2)
    sock.sendall(b"Host: x\r\n\r\n")
    sock.settimeout(5)
    assert sock.recv(200).startswith(b"HTTP/1.1 200")
    for s in (silent, trickling, sock):
        s.close()


def test_connections_past_the_cap_are_closed_at_once(server, monkeypatch):
    open_now = 2
    monkeypatch.setattr(http_guard.GuardedH11Protocol, "connection_cap", open_now)
    held = [connect(server) for _ in range(open_now)]
    time.sleep(0.2)                              # let the server accept them
    extra = connect(server)
    assert closed_by_server(extra, 5)
    for s in held + [extra]:
        s.close()
    monkeypatch.undo()
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200


def test_the_cap_keeps_room_below_the_descriptor_limit():
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert http_guard.connection_cap() <= max(64, soft - http_guard.FD_RESERVE)


def test_kv_events_ask_the_api_key(server):
    assert httpx.get(f"{server.url}/kv_events").status_code == 401
    answer = httpx.get(f"{server.url}/kv_events", headers={"authorization": f"Bearer {KEY}"})
    assert answer.status_code == 200 and "next" in answer.json()
    assert httpx.get(f"{server.url}/health").status_code == 200            # vLLM's: no key on /health


def test_a_trailing_slash_is_a_json_404_and_a_long_path_is_not_echoed(server):
    answer = httpx.post(f"{server.url}/v1/completions/", json={"prompt": "hi"},
                        headers={"authorization": f"Bearer {KEY}"})
    assert answer.status_code == 404 and answer.json()["error"]["type"] == "NotFoundError"
    long = httpx.get(f"{server.url}/" + "a" * 60_000)
    assert long.status_code == 404 and len(long.content) < 1_000


def test_a_body_of_millions_of_token_ids_parses_at_json_speed():
    raw = json.dumps({"prompt": [0] * 2_000_000, "max_tokens": 1}).encode()
    started = time.perf_counter()
    json.loads(raw)
    decode = time.perf_counter() - started
    started = time.perf_counter()
    body = parse_body(raw, CompletionRequest)
    parse = time.perf_counter() - started
    assert len(body.single_prompt()) == 2_000_000
    # the lone-surrogate check walked every value building a path for each: 15x json.loads alone
    assert parse < 8 * decode + 0.5


def test_a_body_that_would_be_slow_to_validate_is_refused_at_json_speed():
    """Validated item by item, a batch of a million one-id prompts (or a message of a million parts) held the
    server's GIL for seconds, to be refused anyway: the batch and the oversized list are refused first."""
    batch = json.dumps({"prompt": [[1]] * 1_000_000}).encode()
    started = time.perf_counter()
    json.loads(batch)
    decode = time.perf_counter() - started
    started = time.perf_counter()
    with pytest.raises(RequestError, match=r"^prompt: send one prompt per request \(batched prompts are not"):
        parse_body(batch, CompletionRequest)
    assert time.perf_counter() - started < 3 * decode + 0.5
    parts = [{"type": "text", "text": "a"}] * (MAX_CONTENT_PARTS + 1)
    with pytest.raises(RequestError, match=r"^the messages hold 65,537 content parts in all; at most 65,536$"):
        parse_body(json.dumps({"messages": [{"role": "user", "content": parts}]}).encode(), ChatCompletionRequest)
    # nor spread over many messages: 14 of 65,536 parts each (15 MB), refused at the speed of its JSON
    spread = json.dumps({"messages": [{"role": "user", "content": [{"type": "text"}] * MAX_CONTENT_PARTS}] * 14})
    started = time.perf_counter()
    json.loads(spread)
    decode = time.perf_counter() - started
    started = time.perf_counter()
    with pytest.raises(RequestError, match=r"^the messages hold 917,504 content parts in all"):
        parse_body(spread.encode(), ChatCompletionRequest)
    assert time.perf_counter() - started < 3 * decode + 0.5
    two = {"messages": [{"role": "user", "content": parts[:MAX_CONTENT_PARTS // 2]}] * 2}    # at the cap: fine
    assert parse_body(json.dumps(two).encode(), ChatCompletionRequest).message_dicts()[1]["content"] == "a" * 32768
    assert parse_body(b'{"prompt": [[1, 2]]}', CompletionRequest).single_prompt() == [1, 2]   # one is fine


def test_a_lone_surrogate_is_still_found_after_the_escape_check():
    raw = b'{"prompt": ["fine", "\\ud800"], "max_tokens": 1}'
    with pytest.raises(Exception, match=r"prompt\[1\]: the string holds a lone UTF-16 surrogate"):
        parse_body(raw, CompletionRequest)
    paired = b'{"prompt": "\\ud83d\\ude00", "max_tokens": 1}'           # an emoji as a surrogate pair: fine
    assert parse_body(paired, CompletionRequest).prompt == "\U0001F600"


class _Tokenizer:
    def __init__(self):
        self.seen = []

    def __call__(self, text, add_special_tokens=True, verbose=True):
        self.seen.append(len(text))
        return {"input_ids": [ord(c) for c in text]}


def test_the_router_tokenizes_only_a_prompts_head():
    tokenizer = _Tokenizer()
    proxy = Proxy(["http://127.0.0.1:1"], parse_policy("prefix-aware"), 16, tokenizer)
    short = proxy.token_ids({"prompt": "abc"})
    assert short == [97, 98, 99]
    long = proxy.token_ids({"prompt": "x" * (PREFIX_CHARS + 10)})
    assert tokenizer.seen[-1] == PREFIX_CHARS and len(long) == PREFIX_CHARS - 1     # the cut token dropped


@pytest.mark.parametrize("key, read_ok", [(KEY, True), (None, False)])
def test_the_router_reads_kv_events_with_the_replicas_key(server, key, read_ok):
    proxy = Proxy([server.url], parse_policy("prefix-aware"), 8, api_key=key)

    async def read():
        async with httpx.AsyncClient() as client:
            await proxy.router.refresh(client)

    asyncio.run(read())
    replica = proxy.replicas[0]
    if read_ok:
        assert replica.down is None and replica.next_event >= 0
    else:
        assert "401" in replica.down


def test_a_request_http_cannot_parse_gets_a_json_400(server):
    sock = connect(server)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}")
    sock.settimeout(10)
    answer = b""
    while chunk := sock.recv(4096):
        answer += chunk
    sock.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"application/json" in head
    assert json.loads(body)["error"]["type"] == "BadRequestError"
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200


def test_a_health_probe_may_ask_with_head(server):
    assert httpx.head(f"{server.url}/health", timeout=10).status_code == 200
    assert httpx.head(f"{server.url}/v1/models", headers={"authorization": f"Bearer {KEY}"}).status_code == 200


def test_a_server_keeps_no_record_per_step(folder):
    """A run's step records are for validation and profiling; a server that kept them would grow by one a step
    for as long as it lives. Its requests keep everything else about them (prefix cache, metrics)."""
    engine = LLMEngine(folder, block_size=8, num_gpu_blocks=128, max_num_seqs=16)
    with BackgroundServer(engine, "tiny", folder) as srv:
        for i in range(6):
            answer = httpx.post(f"{srv.url}/v1/completions", timeout=60,
                                json={"model": "tiny", "prompt": f"hello {i}", "max_tokens": 4})
            assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 4
    assert engine.steps == [] and not engine.groups
    plain = LLMEngine(folder, block_size=8, num_gpu_blocks=128, max_num_seqs=16)      # (a run keeps them)
    plain.add_request("r", "hello", SamplingParams(max_tokens=4, ignore_eos=True))
    while plain.has_unfinished_requests():
        plain.step()
    assert len(plain.steps) == 4
