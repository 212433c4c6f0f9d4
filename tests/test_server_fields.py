"""vLLM's request fields beyond OpenAI's: those this server honours (truncate_prompt_tokens, add_special_tokens,
chat_template_kwargs, continue_final_message) do what vLLM does; those it cannot honour are refused with a 400
naming the field, never served as if unsent. Also vLLM's JSON-only bodies, its per-choice role chunks and its
idle KV-cache usage of 0."""
from __future__ import annotations

import json

import httpx
import pytest

from engine.entrypoints.openai.app import ServerOptions
from engine.entrypoints.openai.server import BackgroundServer
from engine.llm_engine import LLMEngine
from serve_helpers import metric, save_byte_model, sse_events

# It runs a live server: scripts/test.sh runs it alone.
pytestmark = pytest.mark.serial
MAX_MODEL_LEN = 64


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    folder = save_byte_model(tmp_path_factory.mktemp("byte-llama"), max_position_embeddings=MAX_MODEL_LEN)
    engine = LLMEngine(folder, block_size=8, num_gpu_blocks=64, max_num_seqs=8)
    with BackgroundServer(engine, "tiny", folder, options=ServerOptions(trust_request_chat_template=True)) as srv:
        yield srv.url


def post(url: str, path: str, body: dict, **headers) -> httpx.Response:
    return httpx.post(url + path, content=json.dumps(body).encode(),
                      headers={"content-type": "application/json", **headers}, timeout=60)


def completion(url: str, **fields) -> httpx.Response:
    return post(url, "/v1/completions", {"prompt": "abcdefghij", "max_tokens": 3, "temperature": 0,
                                         "ignore_eos": True, **fields})


def test_truncate_prompt_tokens_keeps_the_prompts_last_tokens_as_vllm_does(url):
    whole = completion(url, prompt=list(range(10, 30)))
    cut = completion(url, prompt=list(range(10, 30)), truncate_prompt_tokens=5)
    tail = completion(url, prompt=list(range(25, 30)))
    assert whole.json()["usage"]["prompt_tokens"] == 20 and cut.json()["usage"]["prompt_tokens"] == 5
    assert cut.json()["choices"][0]["text"] == tail.json()["choices"][0]["text"]
    # -1 is the model's length: a prompt longer than the context is cut to it, leaving no room, and refused
    too_long = completion(url, prompt=list(range(3, 3 + MAX_MODEL_LEN + 10)), truncate_prompt_tokens=-1)
    assert too_long.status_code == 400 and "maximum context length" in too_long.json()["error"]["message"]
    for value, words in ((MAX_MODEL_LEN + 1, "greater than max_model_len"), (0, "empty prompt"), (-2, "")):
        refused = completion(url, truncate_prompt_tokens=value)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "truncate_prompt_tokens"
        assert words in refused.json()["error"]["message"]
    chat = post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 40}], "max_tokens": 2,
                                              "truncate_prompt_tokens": 7})
    assert chat.status_code == 200 and chat.json()["usage"]["prompt_tokens"] == 7


@pytest.mark.parametrize("field, value", [("allowed_token_ids", [65]), ("prompt_logprobs", 2), ("bad_words", ["a"]),
                                          ("skip_special_tokens", False), ("guided_choice", ["yes", "no"]),
                                          ("structured_outputs", {"choice": ["a"]}), ("return_tokens_as_token_ids", 1),
                                          ("response_format", {"type": "json_object"})])
def test_a_field_this_engine_cannot_honour_is_refused_naming_it(url, field, value):
    refused = completion(url, **{field: value})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == field, refused.text
    chat = post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], field: value})
    assert chat.status_code == 400 and chat.json()["error"]["param"] == field


def test_the_fields_defaults_are_served(url):
    defaults = {"allowed_token_ids": None, "prompt_logprobs": None, "bad_words": [], "skip_special_tokens": True,
                "spaces_between_special_tokens": True, "response_format": {"type": "text"},
                "add_special_tokens": True, "return_tokens_as_token_ids": False, "truncate_prompt_tokens": None}
    assert completion(url, **defaults).status_code == 200
    echo = post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "echo": True})
    assert echo.status_code == 400 and echo.json()["error"]["param"] == "echo"


def test_chat_template_kwargs_are_the_templates_variables(url):
    template = "{{ greeting | default('') }}{% for m in messages %}{{ m.content }}{% endfor %}"
    body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 1, "chat_template": template}
    plain = post(url, "/v1/chat/completions", body).json()["usage"]["prompt_tokens"]
    greeted = post(url, "/v1/chat/completions", body | {"chat_template_kwargs": {"greeting": "well, "}})
    assert greeted.json()["usage"]["prompt_tokens"] > plain
    taken = post(url, "/v1/chat/completions", body | {"chat_template_kwargs": {"tokenize": True}})
    assert taken.status_code == 400 and taken.json()["error"]["param"] == "chat_template_kwargs"
    both = post(url, "/v1/chat/completions", body | {"continue_final_message": True})
    assert both.status_code == 400 and both.json()["error"]["param"] == "continue_final_message"
    assert post(url, "/v1/chat/completions", body | {"continue_final_message": True,
                                                     "add_generation_prompt": False}).status_code == 200


def test_a_body_not_sent_as_json_is_refused_as_vllm_refuses_it(url):
    for content_type in ("text/plain", "application/x-www-form-urlencoded", ""):
        refused = post(url, "/v1/completions", {"prompt": "a"}, **{"content-type": content_type})
        assert refused.status_code == 400 and "Only 'application/json'" in refused.json()["error"]["message"]
    assert completion(url, **{}).status_code == 200
    assert post(url, "/v1/completions", {"prompt": "a", "max_tokens": 1},
                **{"content-type": "application/json; charset=utf-8"}).status_code == 200


def test_a_streamed_chat_sends_each_choice_its_own_role_chunk(url):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "n": 2, "stream": True}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as response:
        chunks = [json.loads(e) for e in sse_events(response) if e != "[DONE]"]
    roles = [c["choices"] for c in chunks[:2]]
    assert roles == [[{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                       "finish_reason": None}] for i in range(2)]


def test_an_idle_server_reports_no_kv_cache_in_use(url):
    completion(url)
    page = httpx.get(url + "/metrics").text
    assert metric(page, "vllm:kv_cache_usage_perc") == 0.0


def test_tokenize_and_detokenize_as_vllm_answers_them(url):
    tokenized = post(url, "/tokenize", {"prompt": "hello world", "return_token_strs": True}).json()
    assert tokenized["count"] == len(tokenized["tokens"]) > 0 and tokenized["max_model_len"] == MAX_MODEL_LEN
    assert "".join(tokenized["token_strs"]).replace("\u0120", " ") == "hello world"    # (byte-level: a space is Ġ)
    served = completion(url, prompt="hello world", max_tokens=1).json()["usage"]["prompt_tokens"]
    assert served == tokenized["count"]
    assert post(url, "/detokenize", {"tokens": tokenized["tokens"]}).json() == {"prompt": "hello world"}
    # a chat's ids are those a chat request sends; a text longer than the context is counted, not refused
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    chat_ids = post(url, "/tokenize", chat).json()
    answered = post(url, "/v1/chat/completions", chat | {"max_tokens": 1}).json()["usage"]["prompt_tokens"]
    assert chat_ids["count"] == answered and chat_ids["token_strs"] is None
    assert post(url, "/tokenize", {"prompt": "ab" * MAX_MODEL_LEN * 4}).json()["count"] > MAX_MODEL_LEN
    for path, body, param in (("/tokenize", {}, None), ("/tokenize", {"prompt": "a", "messages": chat["messages"]},
                                                        None),
                              ("/detokenize", {"tokens": [10 ** 6]}, "tokens"), ("/detokenize", {"tokens": [-1]},
                                                                                 "tokens[0]"),
                              ("/tokenize", {"prompt": "a", "model": "other"}, "model")):
        refused = post(url, path, body)
        assert refused.status_code in (400, 404) and refused.json()["error"]["param"] == param, refused.text
    assert httpx.get(url + "/version").json()["version"] and httpx.get(url + "/ping").status_code == 200
