"""Multi-turn conversations from a file, every turn a request, as vLLM's multi-turn benchmark sends them.

vLLM's benchmarks/multi_turn/benchmark_serving_multi_turn.py reads a JSON list of conversations, each
{"id": ..., "messages": [{"role": "user" | "assistant", "content": ...}, ...]} (its
convert_sharegpt_to_openai.py writes one from a ShareGPT dump), and sends each user message with every
message before it to /v1/chat/completions, with max_tokens the answer's token count. Here each user
message becomes one request of the trace:

- its prompt: the messages up to it in the tokenizer's chat template with the generation prompt,
  tokenized as vLLM's chat endpoint tokenizes them (no special tokens added on top of the template's:
  ChatCompletionRequest.add_special_tokens defaults to False);
- its output: the answer's tokens as the benchmark counts them (add_special_tokens=False), at least 1;
- its conversation and turn, so a closed loop sends a conversation's turns one after another
  (workloads/clients.py); the prompt and answer ids are kept, so a prefix cache hits the history as a
  server's would (`prefix_len`: the tokens a turn shares with the turn before and its answer);
- its arrival, for an open loop: conversations start by the arrival process at rate / the mean turns, and
  a turn comes its predecessor's answer time (output_len x time_per_token) and a think time (exponential,
  mean think_time) after it, as the chatbot workload times turns; the turn keeps its think time, which
  `--turns-after-answers` waits after the real answer instead (workloads/sessions.py).

A raw ShareGPT dump ({"conversations": [{"from": "human" | "gpt", "value": ...}]}) is read as the
converter maps it: human and user ask; gpt, bing, chatgpt and bard answer; a leading answer is dropped.
A conversation whose messages do not alternate question, answer from the first (a system message, two
questions in a row) is skipped, as the converter drops it; a last question without an answer is left out
(the benchmark takes the output length from it). Conversations are taken in the file's order, as the
benchmark hands them out, until `num_requests` requests (the last conversation may be cut short; the
benchmark's own --max-num-requests limits its clients instead: `client_max_requests`,
workloads/clients.py). `max_turns` is its --max-turns: messages, questions and answers both, a conversation
ends once it has sent that many (so ceil(max_turns / 2) questions). `output_len` is its --limit-max-tokens:
every request's max_tokens, so every answer that long, in its request and in the history after it.

The benchmark's generation config (its generate_multi_turn.json: {"filetype": "generate_conversations",
...}) is read as well: its conversations are generated first, as the benchmark generates them with the
same seed (workloads/synthetic_conversations.py), then imported as above.
"""
from __future__ import annotations

import math
from pathlib import Path

from .arrivals import TIME_DECIMALS, arrival_times
from .errors import TraceError
from .importers import check_length_arg, json_conversations, load_tokenizer
from .schema import TraceRequest
from .tokens import stream
from .synthetic_conversations import FILETYPE, generate_conversations
from .trace import Trace

ASKS = {"user", "human"}
ANSWERS = {"assistant", "gpt", "bing", "chatgpt", "bard"}
# the chatbot workload's turn timing (workloads/chatbot.py), for an open loop over the imported turns
THINK_TIME = 10.0
TIME_PER_TOKEN = 0.05


def _messages(entry, i: int, path: Path) -> list[tuple[str, str]] | None:
    """Entry i's (role, content) messages, "user" or "assistant"; None if they do not alternate."""
    if not isinstance(entry, dict) or not ({"messages", "conversations"} & set(entry)):
        raise TraceError(f"{path}: entry {i}: expected an object with messages (vLLM's multi-turn format) or "
                         f"conversations (a ShareGPT dump)")
    field, role_key, text_key = ("messages", "role", "content") if "messages" in entry else \
        ("conversations", "from", "value")
    raw = entry[field]
    if not isinstance(raw, list):
        raise TraceError(f"{path}: entry {i}: {field}: not a list")
    messages = []
    for m in raw:
        if not (isinstance(m, dict) and isinstance(m.get(role_key), str) and isinstance(m.get(text_key), str)):
            raise TraceError(f"{path}: entry {i}: {field}: each message needs a string {role_key!r} and "
                             f"{text_key!r}")
        who = m[role_key]
        messages.append(("user" if who in ASKS else "assistant" if who in ANSWERS else who, m[text_key]))
    if field == "conversations" and messages and messages[0][0] == "assistant":
        messages = messages[1:]          # a follow-up's leading answer, dropped as the converter drops it
    if any(role != ("user", "assistant")[k % 2] for k, (role, _) in enumerate(messages)):
        return None
    return messages[:len(messages) // 2 * 2]


def _answers_of(messages: list[tuple[str, str]], length: int, tokenizer) -> list[tuple[str, str]]:
    """The messages with every answer `length` tokens long: with the multi-turn benchmark's
    --limit-max-tokens every request's max_tokens is that limit, so the server's answer, which the next turn
    sends back, has that length (without an early EOS). The answer's own tokens, repeated or cut to the
    length (its question's if it has none), stand for the server's."""
    resized = []
    for k, (role, text) in enumerate(messages):
        if role == "assistant":
            ids = tokenizer(text, add_special_tokens=False).input_ids or \
                tokenizer(messages[k - 1][1], add_special_tokens=False).input_ids or [0]
            text = tokenizer.decode(_to_length(ids, length))
        resized.append((role, text))
    return resized


def _to_length(ids: list[int], length: int) -> list[int]:
    """`ids` repeated, or cut, to `length` of them."""
    return (ids * (length // len(ids) + 1))[:length]


def _shared(a: list[int], b: list[int]) -> int:
    """How many leading tokens a and b share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def import_conversations(
    path: str | Path,
    tokenizer_path: str | Path,
    num_requests: int | None = None,
    seed: int = 0,
    *,
    arrival: str = "poisson",
    rate: float = math.inf,
    cv: float = 1.0,
    max_turns: int | None = None,
    output_len: int | None = None,
) -> Trace:
    """The trace of a conversations file's turns (see the module); with `output_len`, every answer that many
    tokens (the benchmark's --limit-max-tokens: see `_answers_of`)."""
    path = Path(path)
    if num_requests is not None and num_requests < 1:
        raise TraceError(f"num_requests: must be >= 1, got {num_requests}")
    if output_len is not None:
        check_length_arg("output_len", output_len)
    if max_turns is not None and max_turns < 1:
        raise TraceError(f"max_turns: must be >= 1 messages, got {max_turns}")
    data = json_conversations(path, "conversations file",
                              also=f"the benchmark's generation config (an object with \"filetype\": \"{FILETYPE}\")")
    tokenizer = load_tokenizer(tokenizer_path, source=path)
    if not getattr(tokenizer, "chat_template", None):
        raise TraceError(f"{tokenizer_path}: the tokenizer has no chat template, and the multi-turn benchmark "
                         f"sends chat messages: give the chat model's tokenizer folder")
    generated = isinstance(data, dict)
    if generated:
        data = generate_conversations(data, path, tokenizer, seed)
    conversations = []
    for i, entry in enumerate(data):
        messages = _messages(entry, i, path)
        if messages and max_turns is not None:      # the benchmark counts a question and its answer as two
            messages = messages[:(max_turns + 1) // 2 * 2]
        if messages and output_len is not None:
            messages = _answers_of(messages, output_len, tokenizer)
        if messages:
            conversations.append((i, messages))
    if not conversations:
        raise TraceError(f"{path}: no conversation to import (none alternates a user message and its answer)")
    limit = math.inf if num_requests is None else num_requests
    turns: list[tuple[int, list[tuple[list[int], list[int]]]]] = []   # (entry, [(prompt ids, answer ids)])
    count = 0
    for i, messages in conversations:
        if count >= limit:
            break
        pairs = []
        for k in range(0, len(messages), 2):
            if count >= limit:
                break
            chat = [{"role": role, "content": text} for role, text in messages[:k + 1]]
            formatted = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
            pairs.append((list(tokenizer(formatted, add_special_tokens=False).input_ids),
                          list(tokenizer(messages[k + 1][1], add_special_tokens=False).input_ids)))
            count += 1
        turns.append((i, pairs))
    mean_turns = count / len(turns)
    starts = arrival_times(stream(seed, "arrivals"), arrival=arrival, rate=rate / mean_turns, cv=cv,
                           num_requests=len(turns))
    thinks = stream(seed, "think").exponential(THINK_TIME, count)
    requests: list[TraceRequest] = []
    for (i, pairs), start in zip(turns, starts):
        at, before, think = float(start), [], None
        for k, (prompt, answer) in enumerate(pairs):
            if not prompt:
                raise TraceError(f"{path}: entry {i}: turn {k} tokenizes to no tokens")
            if output_len is not None and answer:     # (the resized answer, its text re-tokenized: to length)
                answer = _to_length(answer, output_len)
            length = output_len or max(1, len(answer))
            requests.append(TraceRequest(
                request_id=f"conv-{i}-{k}", arrival_time=round(at, TIME_DECIMALS), prompt_len=len(prompt),
                output_len=length, prompt_token_ids=prompt, output_token_ids=answer or None,
                conversation_id=f"conv-{i}", turn=k, think_time=think, prefix_len=_shared(prompt, before)))
            before = prompt + answer
            drawn = float(thinks[len(requests) - 1])
            at += length * TIME_PER_TOKEN + drawn
            think = round(drawn, TIME_DECIMALS)
    params = {"source": str(path), "tokenizer": str(tokenizer_path), "num_requests": num_requests,
              "conversations": len(turns), "skipped": len(data) - len(conversations), "generated": generated,
              "seed": seed,
              "arrival": arrival, "rate": rate, "cv": cv, "think_time": THINK_TIME,
              "time_per_token": TIME_PER_TOKEN, "max_turns": max_turns, "output_len": output_len}
    return Trace(sorted(requests, key=lambda r: r.arrival_time), name="conversations-import", params=params)
