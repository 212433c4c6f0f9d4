"""`planner serve`: a real server on 127.0.0.1 driven by the official openai client.

Every wait is bounded in time; only loopback addresses are used.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import torch

from engine.llm_engine import LLMEngine
from engine.entrypoints.openai.server import BackgroundServer
from serve_helpers import save_byte_model
from tiny_models import save_tiny_model

# It reads the wall clock (a live engine, a server, a time limit): scripts/test.sh runs it alone.
pytestmark = pytest.mark.serial

NUM_BLOCKS = 256
MODEL = "tiny"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_byte_model(tmp_path_factory.mktemp("byte-llama"))


@pytest.fixture(scope="module")
def server(folder):
    engine = LLMEngine(folder, block_size=8, num_gpu_blocks=NUM_BLOCKS, max_num_seqs=64)
    with BackgroundServer(engine, MODEL, folder) as srv:
        yield srv


@pytest.fixture()
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=60)


def wait_until(condition, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def idle(server) -> bool:
    engine = server.engine
    # vllm-v1 (the default) never hands out block 0, vLLM v1's null block.
    return not engine.has_unfinished_requests() and engine.allocator.num_free_blocks() == NUM_BLOCKS - 1


def test_completions_match_the_offline_engine(client, folder):
    from engine import LLM, SamplingParams
    got = client.completions.create(model=MODEL, prompt="Hello there", max_tokens=6, temperature=0,
                                    extra_body={"ignore_eos": True})
    ref = LLM(folder, block_size=8, num_gpu_blocks=32).generate(
        "Hello there", SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), use_tqdm=False)[0]
    assert got.choices[0].text == ref.outputs[0].text
    assert got.choices[0].finish_reason == "length"
    assert got.usage.completion_tokens == 6 and got.usage.prompt_tokens == len(ref.prompt_token_ids)

    # Token-id prompts and streaming give the same text.
    ids = ref.prompt_token_ids
    stream = client.completions.create(model=MODEL, prompt=ids, max_tokens=6, temperature=0, stream=True,
                                       stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == ref.outputs[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 6


def test_return_token_ids_gives_the_answers_ids_as_vllm_does(server):
    # vLLM's return_token_ids: a completion choice carries the prompt's and the answer's ids (streamed: each
    # chunk its own ids, the prompt's with the first); a chat answer carries the prompt's ids at its top
    http = httpx.Client(base_url=f"{server.url}/v1", timeout=60)
    body = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 5, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    whole = http.post("/completions", json=body).json()["choices"][0]
    assert whole["prompt_token_ids"] == [5, 6, 7] and len(whole["token_ids"]) == 5
    streamed, prompts = [], []
    with http.stream("POST", "/completions", json=body | {"stream": True}) as response:
        for line in response.iter_lines():
            if line.startswith("data:") and "[DONE]" not in line:
                choice = json.loads(line[5:])["choices"][0]
                streamed += choice["token_ids"]
                prompts.append(choice.get("prompt_token_ids"))
    assert streamed == whole["token_ids"] and prompts[0] == [5, 6, 7] and not any(prompts[1:])
    chat = http.post("/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                                "max_tokens": 3, "ignore_eos": True, "return_token_ids": True}).json()
    assert chat["prompt_token_ids"] and len(chat["choices"][0]["token_ids"]) == 3
    assert "token_ids" not in http.post("/completions", json={**body, "return_token_ids": False}).json()["choices"][0]


def test_chat_with_and_without_streaming_and_n_samples(client):
    messages = [{"role": "user", "content": "Say hi"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=5, temperature=0,
                                           extra_body={"ignore_eos": True})
    assert whole.choices[0].message.role == "assistant" and whole.usage.completion_tokens == 5
    parts = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=5, temperature=0,
                                           stream=True, extra_body={"ignore_eos": True})
    streamed = "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
    assert streamed == whole.choices[0].message.content

    many = client.completions.create(model=MODEL, prompt="abc", n=3, max_tokens=4, temperature=1.0, seed=7,
                                     extra_body={"ignore_eos": True})
    assert sorted(c.index for c in many.choices) == [0, 1, 2]
    assert many.usage.completion_tokens == 12
    texts: dict[int, str] = {}
    for c in client.completions.create(model=MODEL, prompt="abc", n=3, max_tokens=4, temperature=1.0, seed=7,
                                       stream=True, extra_body={"ignore_eos": True}):
        for choice in c.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert texts == {c.index: c.text for c in many.choices}   # same seed, same samples


def test_logprobs_and_stop_strings(client):
    out = client.completions.create(model=MODEL, prompt="xyz", max_tokens=8, temperature=0, logprobs=2,
                                    extra_body={"ignore_eos": True})
    lp = out.choices[0].logprobs
    assert len(lp.token_logprobs) == 8 and all(v <= 0 for v in lp.token_logprobs)
    assert all(1 <= len(top) <= 3 for top in lp.top_logprobs)
    text = out.choices[0].text
    stop = text[3:5]
    cut = client.completions.create(model=MODEL, prompt="xyz", max_tokens=8, temperature=0, stop=[stop],
                                    extra_body={"ignore_eos": True})
    assert cut.choices[0].finish_reason == "stop" and cut.choices[0].text == text[:text.index(stop)]


def test_64_concurrent_streams_none_lost(server):
    async def one(client, i):
        n = 0
        finish = None
        stream = await client.completions.create(model=MODEL, prompt=f"request {i}", max_tokens=4,
                                                 temperature=0, stream=True, extra_body={"ignore_eos": True},
                                                 stream_options={"include_usage": True})
        async for chunk in stream:
            if chunk.choices:
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage:
                n = chunk.usage.completion_tokens
        return n, finish

    async def main():
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=120)
        return await asyncio.wait_for(asyncio.gather(*(one(client, i) for i in range(64))), timeout=120)

    results = asyncio.run(main())
    assert results == [(4, "length")] * 64
    assert wait_until(lambda: idle(server))


def test_bad_requests_get_400_and_the_server_keeps_serving(server, client):
    url = f"{server.url}/v1/completions"
    bad_json = httpx.post(url, content=b'{"model": "tiny", "prompt": ', headers={"content-type": "application/json"})
    assert bad_json.status_code == 400 and "JSON" in bad_json.json()["error"]["message"]

    with pytest.raises(openai.NotFoundError) as unknown:     # vLLM: 404 for a model it does not serve
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=2)
    assert "no-such-model" in unknown.value.body["message"] and unknown.value.body["param"] == "model"

    with pytest.raises(openai.BadRequestError) as too_long:
        client.completions.create(model=MODEL, prompt=[5] * 200, max_tokens=2)
    assert "maximum context length is 128" in too_long.value.body["message"]

    with pytest.raises(openai.BadRequestError) as bad_token:
        client.completions.create(model=MODEL, prompt=[5, 999], max_tokens=2)
    assert "999" in bad_token.value.body["message"] and "320" in bad_token.value.body["message"]

    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="hi", max_tokens=2, stream=True, presence_penalty=1.0)

    ok = client.completions.create(model=MODEL, prompt="still here", max_tokens=2)
    assert ok.usage.completion_tokens >= 1
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_client_disconnect_aborts_the_request_and_frees_its_blocks(server):
    assert wait_until(lambda: idle(server))
    body = {"model": MODEL, "prompt": "a long story", "max_tokens": 100, "stream": True, "ignore_eos": True}
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", f"{server.url}/v1/completions", json=body) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            got = [line for line, _ in zip(lines, range(6)) if line.startswith("data:")]
            assert got and server.engine.has_unfinished_requests()
    # The connection is closed mid-stream: the request must go and its blocks come back.
    assert wait_until(lambda: idle(server)), (server.engine.allocator.num_free_blocks(), NUM_BLOCKS)


def test_models_health_and_metrics(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    text = httpx.get(f"{server.url}/metrics").text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:num_preemptions_total", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:time_per_output_token_seconds_count", "vllm:inter_token_latency_seconds_sum",
                 "vllm:e2e_request_latency_seconds_count"):
        assert name in text
    count = next(line for line in text.splitlines() if line.startswith("vllm:e2e_request_latency_seconds_count"))
    assert float(count.split()[-1]) > 0
    assert 'block_size="8"' in text and f'num_gpu_blocks="{NUM_BLOCKS}"' in text
    threads = next(line for line in text.splitlines() if line.startswith("planner:engine_threads"))
    assert int(threads.split()[-1]) == torch.get_num_threads()     # what validate --endpoint profiles at


def test_a_cache_salt_keeps_a_prompts_cached_blocks_to_its_salt(server, client):
    """vLLM's `cache_salt` on completions and chats: a prompt's cached blocks are a hit only for requests of the
    same salt (vLLM's prefix-cache counters say how many prompt tokens hit); a salt that is not a non-empty
    string is vLLM's 400."""
    from serve_helpers import metric

    def hits_after(salt, chat=False) -> float:
        extra = {"cache_salt": salt} if salt else {}
        if chat:
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "salted " * 6}],
                                           max_tokens=2, extra_body=extra)
        else:
            client.completions.create(model=MODEL, prompt="a prompt of forty bytes for the cache.. ", max_tokens=2,
                                      extra_body=extra)
        assert wait_until(lambda: idle(server))
        return metric(httpx.get(f"{server.url}/metrics").text, "vllm:prefix_cache_hits_total")
    def gains(*calls) -> list[float]:
        hits = [hits_after(*call) for call in calls]
        return [b - a for a, b in zip(hits, hits[1:])]
    # 32: the prompt's full blocks of 8 tokens but the one with its last token
    assert gains(("probe",), ("probe",), ("tenant-a",), ("tenant-a",), ("tenant-b",), (None,), (None,)) == \
        [32, 0, 32, 0, 0, 32]
    chats = gains(("tenant-c", True), ("tenant-c", True), ("tenant-d", True), ("tenant-c", True))
    assert chats[0] > 0 and chats[1:] == [0, chats[0]]
    queries = metric(httpx.get(f"{server.url}/metrics").text, "vllm:prefix_cache_queries_total")
    assert queries >= 10 * 40
    for bad in ("", 7, ["a"]):
        answer = httpx.post(f"{server.url}/v1/completions", json={"model": MODEL, "prompt": "hi", "cache_salt": bad})
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "cache_salt"
        assert "Parameter 'cache_salt' must be a non-empty string if provided." in answer.json()["error"]["message"]


def test_prompt_tokens_details_say_how_much_of_the_prompt_was_cached(folder):
    """vLLM's --enable-prompt-tokens-details: usage.prompt_tokens_details.cached_tokens, whole and streamed (only
    when some prompt tokens were cached, as vLLM); without the flag, no details."""
    from engine.entrypoints.openai.app import ServerOptions

    prompt = "forty bytes of prompt for the cache hit!"
    for details in (True, False):
        engine = LLMEngine(folder, block_size=8, num_gpu_blocks=64)
        options = ServerOptions(enable_prompt_tokens_details=details)
        with BackgroundServer(engine, MODEL, folder, options=options) as srv:
            client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=60)
            first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2).usage
            again = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2).usage
            stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, stream=True,
                                               stream_options={"include_usage": True})
            streamed = [chunk.usage for chunk in stream if chunk.usage is not None]
            chat = [client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                                   max_tokens=2).usage for _ in range(2)]
        assert first.prompt_tokens_details is None                    # (nothing cached the first time)
        if details:
            full = (again.prompt_tokens - 1) // 8 * 8                  # its full blocks, but the last token's
            assert again.prompt_tokens_details.cached_tokens == full > 0
            assert [u.prompt_tokens_details.cached_tokens for u in streamed] == [full]
            assert chat[0].prompt_tokens_details is None and chat[1].prompt_tokens_details.cached_tokens > 0
        else:
            assert again.prompt_tokens_details is None and streamed[0].prompt_tokens_details is None
            assert chat[1].prompt_tokens_details is None


def test_chat_without_a_template_is_a_clear_400(tmp_path):
    from tiny_models import save_word_tokenizer
    folder = save_tiny_model("llama", tmp_path / "no-template")
    save_word_tokenizer(folder)
    engine = LLMEngine(folder, block_size=8, num_gpu_blocks=16, max_model_len=64)
    with BackgroundServer(engine, "plain", folder) as srv:
        r = httpx.post(f"{srv.url}/v1/chat/completions",
                       json={"model": "plain", "messages": [{"role": "user", "content": "w1"}]})
        assert r.status_code == 400 and "chat template" in r.json()["error"]["message"]
        ok = httpx.post(f"{srv.url}/v1/completions", json={"model": "plain", "prompt": "w1 w2", "max_tokens": 2})
        assert ok.status_code == 200


def test_shutdown_drains_requests_in_flight(folder):
    engine = LLMEngine(folder, block_size=8, num_gpu_blocks=64)
    srv = BackgroundServer(engine, MODEL, folder)
    results: list = []
    streaming = threading.Semaphore(0)

    def stream_one(i):
        body = {"model": MODEL, "prompt": f"drain {i}", "max_tokens": 100, "stream": True, "ignore_eos": True,
                "stream_options": {"include_usage": True}}
        with httpx.Client(timeout=60) as http, http.stream("POST", f"{srv.url}/v1/completions", json=body) as r:
            events = []
            for line in r.iter_lines():
                if line.startswith("data: "):
                    if not events:
                        streaming.release()   # this request is in flight
                    events.append(line[6:])
        usage = json.loads(events[-2])["usage"]
        results.append((events[-1], usage["completion_tokens"]))

    threads = [threading.Thread(target=stream_one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    assert all(streaming.acquire(timeout=60) for _ in threads)
    in_flight = engine.has_unfinished_requests()
    srv.stop(timeout=60)
    for t in threads:
        t.join(60)
    assert in_flight and not srv.thread.is_alive()
    assert results == [("[DONE]", 100)] * 4   # every request in flight at shutdown finished in full


@pytest.mark.parametrize("args, message", [
    (["--model", "opt-125m", "--tp", "2"], "--tp 2 is not supported"),
    (["--model", "opt-125m", "--pp", "2"], "--pp 2 is not supported"),
    (["--model", "no-such-model"], "no-such-model"),
    (["--model", "opt-125m", "--max-request-body-size", "0"], "--max-request-body-size must be at least 1"),
    (["--model", "opt-125m", "--chat-template-timeout", "0"], "--chat-template-timeout must be positive"),
    (["--model", "opt-125m", "--limit-concurrency", "0"], "--limit-concurrency must be at least 1"),
    (["--model", "opt-125m", "--client-turnaround", "0.001"], "--client-turnaround describes a run's clients"),
    (["--model", "opt-125m", "--turns-after-answers"], "--turns-after-answers describes a run's clients"),
    (["--model", "opt-125m", "--device", "gpu"], "device 'gpu': choose auto, cpu or cuda"),
    (["--model", "opt-125m", "--session-key", "x-user"], "--session-key names the header session routing reads"),
    (["--model", "opt-125m", "--replicas", "2", "--router", "least-requests", "--session-key", "x-user"],
     "--session-key names the header session routing reads"),
    (["--model", "opt-125m", "--replicas", "2", "--router", "session", "--session-key", "x:user"],
     "--session-key 'x:user' is not an HTTP header name"),
    pytest.param(["--model", "opt-125m", "--device", "cuda"], "no CUDA device found",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")),
])
def test_serve_cli_bad_input_is_one_line_and_exit_2(args, message):
    from typer.testing import CliRunner

    from planner.cli.app import app
    result = CliRunner().invoke(app, ["serve", *args])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and message in result.stderr and result.stderr.count("\n") == 1


def test_priority_scheduling_serves_vllms_priority_field(folder):
    # --scheduling-policy priority and one request at a time: of two requests queued behind a long one, the
    # priority-0 one sent second is served before the priority-1 one sent first (vLLM's `priority` field)
    engine = LLMEngine(folder, block_size=8, num_gpu_blocks=NUM_BLOCKS, max_num_seqs=1, scheduling_policy="priority")
    engine.step_observer = lambda out: time.sleep(0.02)       # the long request takes over 2 s: time to queue
    with BackgroundServer(engine, MODEL, folder) as srv:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=60)
        done = []

        def send(name, priority, tokens):
            client.completions.create(model=MODEL, prompt="Hello", max_tokens=tokens, temperature=0,
                                      extra_body={"ignore_eos": True, "priority": priority})
            done.append(name)

        with ThreadPoolExecutor(3) as pool:
            first = pool.submit(send, "long", 0, 120)
            assert wait_until(lambda: engine.has_unfinished_requests())
            low = pool.submit(send, "low", 1, 4)
            assert wait_until(lambda: len(engine.scheduler.waiting) == 1)
            high = pool.submit(send, "high", 0, 4)
            for f in (first, low, high):
                f.result()
        assert done == ["long", "high", "low"]
