"""Fuzzing a live server (issue 27, item 9): generated request bodies get only 2xx or 4xx answers, the
engine is healthy and idle afterwards, and /metrics counts what was sent.

Bodies mix every field the server knows with values of every JSON type (huge and negative integers,
NaN and infinities, lone surrogates, nested junk) and unknown fields; some are not JSON at all. The run
is bounded: a fixed number of examples, each request with a timeout, outputs of a few tokens.
"""
from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.entrypoints.openai.server import BackgroundServer
from engine.llm_engine import LLMEngine
from serve_helpers import engine_idle, metric, save_byte_model, wait_until

MODEL = "tiny"
EXAMPLES = int(__import__("os").environ.get("FUZZ_EXAMPLES", 90))

any_text = st.text(st.characters(codec=None, categories=None), max_size=12)   # surrogates included
numbers = st.one_of(st.integers(-3, 3), st.integers(), st.floats(), st.floats(-1e-30, 1e-30), st.none())
scalars = st.one_of(numbers, any_text, st.booleans())
junk = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                      st.dictionaries(any_text, inner, max_size=3)), max_leaves=6)
small = st.one_of(st.integers(-2, 6), junk)

COMMON = {
    "model": st.one_of(st.just(MODEL), any_text, st.none()), "n": small, "best_of": small,
    "temperature": st.one_of(st.floats(-1, 3), numbers, junk), "top_p": st.one_of(st.floats(-1, 2), junk),
    "top_k": st.one_of(st.integers(-3, 400), st.integers(), junk), "seed": st.one_of(st.integers(), junk),
    "stop": st.one_of(any_text, st.lists(any_text, max_size=3), junk),
    "stop_token_ids": st.one_of(st.lists(st.integers(-2, 400), max_size=3), junk),
    "ignore_eos": st.one_of(st.booleans(), junk), "stream": st.booleans(),
    "stream_options": st.one_of(st.fixed_dictionaries({"include_usage": st.booleans()}), junk),
    "use_beam_search": st.one_of(st.booleans(), junk), "length_penalty": numbers,
    "presence_penalty": numbers, "logit_bias": junk, "include_stop_str_in_output": st.booleans(),
}
COMPLETION = {**COMMON, "prompt": st.one_of(any_text, st.lists(st.integers(-2, 330), max_size=12),
                                            st.lists(any_text, max_size=2), junk),
              "max_tokens": small, "logprobs": st.one_of(st.integers(-2, 25), junk), "echo": junk}
message = st.fixed_dictionaries({"role": st.one_of(st.sampled_from(["user", "system", "assistant"]), any_text),
                                 "content": st.one_of(any_text, junk)}, optional={"name": junk})
CHAT = {**COMMON, "messages": st.one_of(st.lists(message, max_size=3), junk),
        "max_completion_tokens": small, "max_tokens": small, "logprobs": junk, "top_logprobs": small,
        "chat_template": st.one_of(st.none(), any_text)}


words = st.text(st.characters(codec="ascii", categories=("L", "N", "Zs")), min_size=1, max_size=16)
PLAUSIBLE_COMMON = {
    "model": st.just(MODEL), "temperature": st.one_of(st.just(0.0), st.floats(0, 2)),
    "top_p": st.floats(0.05, 1), "top_k": st.integers(-1, 50), "seed": st.integers(-1, (1 << 63) - 1),
    "n": st.integers(1, 3), "stop": st.lists(words, max_size=2), "stream": st.booleans(),
    "ignore_eos": st.booleans(), "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
}
PLAUSIBLE = {
    "/v1/completions": (
        {"prompt": st.one_of(words, st.lists(st.integers(0, 319), min_size=1, max_size=10))},
        {**PLAUSIBLE_COMMON, "max_tokens": st.integers(1, 8), "logprobs": st.integers(0, 5)}),
    "/v1/chat/completions": (
        {"messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]),
                                                     "content": words}), min_size=1, max_size=3)},
        {**PLAUSIBLE_COMMON, "max_completion_tokens": st.integers(1, 8), "logprobs": st.booleans(),
         "top_logprobs": st.integers(0, 3)}),
}


def bodies(path: str, fields: dict) -> st.SearchStrategy[bytes]:
    """Mostly plausible requests with one or two fields spoiled, some wholly random ones, some non-JSON."""
    required, optional = PLAUSIBLE[path]
    spoiled = st.fixed_dictionaries(required, optional=optional).flatmap(
        lambda d: st.fixed_dictionaries({}, optional=fields).map(
            lambda bad: {**d, **dict(list(bad.items())[:2])}))
    random_doc = st.fixed_dictionaries({}, optional=fields).flatmap(
        lambda d: st.dictionaries(any_text, junk, max_size=2).map(lambda extra: {**extra, **d}))
    documents = st.one_of(spoiled, spoiled, spoiled, random_doc)
    as_json = documents.map(lambda d: json.dumps(d).encode())          # NaN and Infinity written as such
    return st.one_of(as_json, as_json, as_json, st.binary(max_size=40), junk.map(lambda v: json.dumps(v).encode()))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = save_byte_model(tmp_path_factory.mktemp("byte-llama"))
    engine = LLMEngine(folder, block_size=8, num_gpu_blocks=128, max_num_seqs=16)
    with BackgroundServer(engine, MODEL, folder) as srv:
        yield srv


def send(client: httpx.Client, path: str, raw: bytes) -> int:
    """The answer's status; a 200 stream is read to its end and must end with [DONE], not an error."""
    with client.stream("POST", path, content=raw, headers={"content-type": "application/json"}) as r:
        if r.status_code == 200 and r.headers.get("content-type", "").startswith("text/event-stream"):
            events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
            assert events and events[-1] == "[DONE]" and not any('"error"' in e[:12] for e in events), events[-3:]
        else:
            body = r.read()
            if r.status_code >= 400:
                assert set(json.loads(body)["error"]) == {"message", "type", "param", "code"}
        return r.status_code


def counts(server) -> tuple[float, float, float]:
    text = httpx.get(f"{server.url}/metrics").text
    return (metric(text, "vllm:request_success_total"),
            metric(text, "http_requests_total", handler="/v1/completions", status="4xx"),
            metric(text, "http_requests_total", handler="/v1/chat/completions", status="4xx"))


def test_fuzzed_bodies_get_only_2xx_or_4xx_and_metrics_agree(server):
    before = counts(server)
    seen = {"2xx": 0, "finished": 0, "/v1/completions": 0, "/v1/chat/completions": 0}

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.one_of(bodies("/v1/completions", COMPLETION).map(lambda b: ("/v1/completions", b)),
                     bodies("/v1/chat/completions", CHAT).map(lambda b: ("/v1/chat/completions", b))))
    def one(case):
        path, raw = case
        with httpx.Client(base_url=server.url, timeout=60) as client:
            status = send(client, path, raw)
        assert 200 <= status < 300 or 400 <= status < 500, (status, raw[:300])
        if status < 300:
            seen["2xx"] += 1
            seen["finished"] += json.loads(raw).get("n") or 1    # vllm-v1 runs (and counts) n child requests
        else:
            seen[path] += 1

    one()
    assert seen["2xx"] > 0                                  # some bodies were served, not all refused
    assert wait_until(lambda: engine_idle(server.engine), 30)
    assert httpx.get(f"{server.url}/health").status_code == 200
    after = counts(server)
    assert after[0] - before[0] == seen["finished"]            # every 200 is n finished requests, as vLLM counts
    assert after[1] - before[1] == seen["/v1/completions"]     # every refusal is counted where it was sent
    assert after[2] - before[2] == seen["/v1/chat/completions"]
