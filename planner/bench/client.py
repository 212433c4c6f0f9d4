"""`planner bench`: replay a trace against any OpenAI-compatible server, measuring as vLLM's serving benchmark does.

Each request leaves at its trace arrival time (time 0 = the start of the
run), streams with ``max_tokens`` = its output length (and ``ignore_eos``),
to /v1/completions (the prompt as text, or as the trace's token ids) or
/v1/chat/completions (one user message), and is timed on the client:
- TTFT: from sending to the first chunk that carries a choice (in chat, content);
- ITL: every gap between consecutive chunks;
- E2E: from sending to the last chunk;
- TPOT: (E2E - TTFT) / (output tokens - 1), output tokens from the server's usage.
A request that fails (HTTP error, broken stream, no token) is kept as failed
with its error, never dropped: completed + failed = submitted.

Each request's ``model`` is the base model's name or a LoRA adapter's
(``request_models``, vLLM bench's --lora-modules and --lora-assignment).
"""
from __future__ import annotations

import asyncio
import csv
import json
import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from engine.core.metrics import RequestRecord, compute_metrics, goodput, latency_summary
from workloads import Trace, TraceRequest
from workloads.clients import ClientKnobs, TurnQueue, check_clients, pause
from workloads.schema import MAX_TOKEN_ID
from workloads.sessions import TurnsAfterAnswers

DEFAULT_VOCAB = 256   # prompt ids below this are valid for every real tokenizer


@dataclass
class BenchRequest:
    request_id: str
    arrival: float                # when the trace says it arrives (s since the start)
    prompt_len: int
    expected_output_len: int
    start: float | None = None    # when it was sent
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    latency: float | None = None  # E2E; of a failed request, the time until it failed
    output_len: int = 0           # tokens the server generated (usage), else chunks counted
    success: bool = False
    finish_reason: str | None = None
    error: str | None = None
    model: str | None = None      # the `model` it was sent with: the base model's name or a LoRA adapter's

    @property
    def tpot(self) -> float | None:
        if not self.success or self.output_len < 2:
            return None
        return (self.latency - self.ttft) / (self.output_len - 1)

    def record(self) -> RequestRecord:
        """As the planner's per-request record (times in seconds since the start of the run)."""
        start = self.start if self.start is not None else self.arrival
        if not self.success:   # (it ends when it failed: the run's duration runs to it, as vLLM's benchmark's)
            return RequestRecord(self.request_id, start, self.prompt_len, 0, finish=start + (self.latency or 0.0),
                                 rejected=True, reject_reason=self.error or "failed")
        first = start + self.ttft
        times = [first]
        for gap in self.itl:
            times.append(times[-1] + gap)
        # (its tokens, not its chunks: a chunk holds several under --stream-interval or speculation)
        return RequestRecord(self.request_id, start, self.prompt_len, self.output_len, first_token=first,
                             finish=start + self.latency, token_times=times, seq_output_len=self.output_len)


PROMPT_FORMATS = ("text", "tokens")
ENDPOINT_TYPES = ("completions", "chat")
LORA_ASSIGNMENTS = ("random", "round-robin")    # vLLM bench's --lora-assignment (random its default)

# Prompt words: one per trace token, so equal token ids (a shared prefix) give equal text. Common
# English words are one token in most tokenizers; the prompt length kept is the server's own count.
WORDS = ("the of and to in is was for on are with as by at be this from or have an they which one you were "
         "her all she there would their we him been has when who will more no if out so said what up its "
         "about into than them can only other new some could time these two may then do first any my now "
         "such like our over man me even most made after also did many before must through back years where "
         "much your way well down should because each just those people how too little state good very make "
         "world still own see men work long get here between both life being under never day same another "
         "know while last might us great old year off come since against go came right used take three").split()


def prompt_text(token_ids: list[int]) -> str:
    """The words standing for a trace's prompt token ids."""
    return " ".join(WORDS[t % len(WORDS)] for t in token_ids)


@dataclass
class BenchConfig:
    endpoint: str                 # base URL, e.g. http://127.0.0.1:8000 (with or without /v1)
    model: str | None = None      # default: the first model /v1/models lists
    ignore_eos: bool = True
    vocab_size: int = DEFAULT_VOCAB
    seed: int = 0
    timeout: float = 600.0        # per request
    temperature: float = 0.0
    # "tokens" sends the trace's token ids (exact prompt lengths: what `validate` replays); `planner bench`
    # sends "text" by default, as `vllm bench serve` does, which every OpenAI server takes.
    prompt_format: str = "tokens"
    endpoint_type: str = "completions"     # or "chat" (/v1/chat/completions, the prompt as one user message)
    api_key: str | None = None    # sent as "Authorization: Bearer <key>" (default: $OPENAI_API_KEY)
    # At most this many requests in flight (vllm bench serve's --max-concurrency): that many clients, each
    # sending its next request when its last one ends, never before the request's time, and its timing starts
    # when it is sent; a conversation's turns go one after another from one client (workloads/clients.py).
    # With every request due at once this is a closed loop of that many clients.
    max_concurrency: int | None = None
    # With max_concurrency over a trace of conversations: how many the clients keep active in all, each
    # K // N (vLLM's multi-turn benchmark's --max-active-conversations; None: one each).
    max_active_conversations: int | None = None
    # With max_concurrency: each client's own rate, a pause after each request (vLLM's multi-turn benchmark's
    # --request-rate; workloads/clients.py `pause`; None: none).
    client_request_rate: float | None = None
    # With max_concurrency: stop them all once one stops (vLLM's multi-turn benchmark's default early stop);
    # the requests never sent are left out of the results.
    client_early_stop: bool = False
    # With max_concurrency: the most requests each client sends (vLLM's multi-turn benchmark's
    # --max-num-requests M, M // N a client); None: no limit.
    client_max_requests: int | None = None
    # With max_concurrency: every conversation's first turn first, left out of the results (vLLM's multi-turn
    # benchmark's --warmup-step; workloads/clients.py).
    client_warmup_step: bool = False
    # With max_concurrency over conversations: round_robin, or random (vLLM's multi-turn benchmark's
    # --conversation-sampling; workloads/clients.py).
    conversation_sampling: str = "round_robin"
    # With max_concurrency: the first X% of the answered requests, as sent, left out of the results (vLLM's
    # multi-turn benchmark's --warmup-percentages X%).
    client_warmup_percent: float = 0.0
    # Without max_concurrency: a conversation's later turn sent once the answer to the turn before it has ended
    # (its think time after), not at its trace time (workloads/sessions.py); the turns after a failed one are
    # never sent, and left out of the results.
    turns_after_answers: bool = False
    # LoRA adapters to send as `model` (vLLM bench's --lora-modules), and how a trace without adapters of its
    # own picks one per request (--lora-assignment; None: random, vLLM bench's default). See request_models.
    lora_modules: tuple[str, ...] = ()
    lora_assignment: str | None = None
    # A header that carries each request's conversation id (a trace's `conversation_id`), which a fleet's
    # `session` routing reads (the vLLM production stack's --session-key); None: not sent.
    session_key: str | None = None

    def __post_init__(self) -> None:
        if self.prompt_format not in PROMPT_FORMATS:
            raise ValueError(f"prompt format {self.prompt_format!r}: choose one of {', '.join(PROMPT_FORMATS)}")
        if self.endpoint_type not in ENDPOINT_TYPES:
            raise ValueError(f"endpoint type {self.endpoint_type!r}: choose one of {', '.join(ENDPOINT_TYPES)}")
        if self.endpoint_type == "chat" and self.prompt_format == "tokens":
            raise ValueError("a chat endpoint takes text messages: use --prompt-format text with "
                             "--endpoint-type chat")
        if self.api_key is None:
            self.api_key = os.environ.get("OPENAI_API_KEY") or None
        if not 0 < self.timeout < math.inf:       # 0 or NaN failed every request; inf is no deadline to httpx
            raise ValueError(f"--timeout must be a positive, finite number of seconds, got {self.timeout}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"--max-concurrency must be >= 1, got {self.max_concurrency}")
        check_clients(self.max_concurrency, ClientKnobs.of(self))
        if not 1 <= self.vocab_size <= MAX_TOKEN_ID:
            raise ValueError(f"--vocab-size must be 1 to {MAX_TOKEN_ID:,} (every vocabulary is smaller), "
                             f"got {self.vocab_size}")
        self.lora_modules = tuple(self.lora_modules or ())
        if any(not name.strip() for name in self.lora_modules):
            raise ValueError("--lora-modules: an adapter's name cannot be empty")
        if self.lora_assignment is not None:
            if self.lora_assignment not in LORA_ASSIGNMENTS:
                raise ValueError(f"--lora-assignment {self.lora_assignment!r}: choose one of "
                                 f"{', '.join(LORA_ASSIGNMENTS)}")
            if not self.lora_modules:
                raise ValueError("--lora-assignment picks among the adapters of --lora-modules: give them too")

    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def api_base(endpoint: str) -> str:
    base = endpoint.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise ValueError(f"--endpoint {endpoint!r}: give a URL such as http://127.0.0.1:8000")
    try:
        httpx.URL(base)
    except httpx.InvalidURL as exc:
        raise ValueError(f"--endpoint {endpoint!r}: {exc}; give a URL such as http://127.0.0.1:8000") from None
    return base if base.endswith("/v1") else base + "/v1"


def served_model(endpoint: str, timeout: float = 30.0, headers: dict | None = None) -> dict:
    """The first entry of /v1/models."""
    url = api_base(endpoint) + "/models"
    try:
        r = httpx.get(url, timeout=timeout, headers=headers)
        r.raise_for_status()
        data = r.json()["data"]
    except httpx.ConnectError:       # (its text is the socket's "[Errno 111] Connection refused")
        raise ValueError(f"cannot list the models at {url}: nothing answers there (is the server up?)") from None
    except (httpx.HTTPError, KeyError, ValueError, TypeError) as exc:
        raise ValueError(f"cannot list the models at {url}: {exc}") from None
    if not data:
        raise ValueError(f"{url} lists no model")
    if not (isinstance(data, list) and isinstance(data[0], dict) and isinstance(data[0].get("id"), str)):
        raise ValueError(f"cannot list the models at {url}: its data is not a list of models with an id")
    return data[0]


def request_models(trace: Trace, cfg: BenchConfig) -> list[str | None]:
    """Each request's adapter name, None for the base model. A trace whose requests carry adapters (`lora`,
    as a workload's -p loras=N draws them) keeps them: adapter k is the k-th name of --lora-modules, 0 the
    base model; --lora-assignment is then refused, the trace having chosen already. A trace without any gets
    one of the names per request, as vLLM bench does: random.choice seeded by the bench's seed, or in turn."""
    ids = [r.lora for r in trace]
    names = cfg.lora_modules
    top = max(ids, default=0)
    if top:
        if not names:
            raise ValueError(f"the trace's requests run LoRA adapters (up to lora {top}): name them with "
                             f"--lora-modules NAME ... (adapter k is the k-th name)")
        if top > len(names):
            raise ValueError(f"the trace's requests run LoRA adapter {top}, but --lora-modules names "
                             f"{len(names)}: give one name per adapter (adapter k is the k-th name)")
        if cfg.lora_assignment is not None:
            raise ValueError("--lora-assignment picks adapters for a trace without them; this trace's requests "
                             "carry their own (a workload draws them with -p lora_assignment=...)")
        return [names[k - 1] if k else None for k in ids]
    if not names:
        return [None] * len(ids)
    if cfg.lora_assignment == "round-robin":
        return [names[i % len(names)] for i in range(len(ids))]
    rng = random.Random(cfg.seed)
    return [rng.choice(names) for _ in ids]


def request_body(cfg: BenchConfig, model: str, trace: Trace, req: TraceRequest,
                 answers: dict[str, list[int]] | None = None) -> tuple[str, dict]:
    """The path and body of one request, in the configured endpoint type and prompt format. `answers`: the
    server's answers to earlier conversation turns (ids), which a turn's history sends back."""
    ids = trace.prompt_token_ids(req, cfg.vocab_size, cfg.seed, answers)
    body = {"model": model, "temperature": cfg.temperature, "stream": True, "stream_options": {"include_usage": True}}
    if cfg.endpoint_type == "chat":
        body |= {"messages": [{"role": "user", "content": prompt_text(ids)}], "max_completion_tokens": req.output_len}
    else:
        body |= {"prompt": ids if cfg.prompt_format == "tokens" else prompt_text(ids), "max_tokens": req.output_len}
    if req.n > 1:
        body["n"] = req.n
    if req.priority:                    # vLLM's field, read by a server scheduling by priority
        body["priority"] = req.priority
    if req.cache_salt is not None:      # vLLM's field: the request's tenant, whose cached blocks are its own
        body["cache_salt"] = req.cache_salt
    if cfg.ignore_eos:
        body["ignore_eos"] = True
    if sends_back_answers(cfg, req):    # vLLM's field: the answer's ids come with its chunks
        body["return_token_ids"] = True
    return ("/chat/completions" if cfg.endpoint_type == "chat" else "/completions"), body


def sends_back_answers(cfg: BenchConfig, req: TraceRequest) -> bool:
    """A conversation turn sent as token ids: its answer's ids go back in the next turn's history, as vLLM's
    multi-turn benchmark sends each answer back (a text prompt sends the trace's, the text's ids being the
    server's tokenizer's)."""
    return req.conversation_id is not None and cfg.prompt_format == "tokens" and cfg.endpoint_type != "chat"


async def _send(client: httpx.AsyncClient, cfg: BenchConfig, model: str, trace: Trace, req: TraceRequest,
                out: BenchRequest, answers: dict[str, list[int]] | None = None) -> None:
    """Send one request and time its stream into `out`; a conversation turn's answer ids into `answers`."""
    path, body = request_body(cfg, model, trace, req, answers)
    answer = [] if answers is not None and body.get("return_token_ids") else None
    session = {cfg.session_key: req.conversation_id} if cfg.session_key and req.conversation_id else None
    out.start = time.perf_counter()
    try:
        async with client.stream("POST", path, json=body, headers=session) as response:
            if response.status_code != 200:
                out.error = await _http_error(response)
                return
            await _read_stream(response, out, chat=cfg.endpoint_type == "chat", answer=answer)
    except (httpx.HTTPError, ValueError) as exc:
        out.error = f"{type(exc).__name__}: {exc}".rstrip(": ")[:500]    # (a timeout's own text is empty)
    if not out.success:
        out.latency = time.perf_counter() - out.start
    if answer and out.success:
        answers[req.request_id] = answer


async def _http_error(response) -> str:
    text = (await response.aread()).decode(errors="replace")
    try:
        text = json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        pass
    return f"HTTP {response.status_code}: {text}"[:500]


async def _read_stream(response, out: BenchRequest, chat: bool, answer: list[int] | None = None) -> None:
    """Time the chunks as vLLM's benchmark does; a chat chunk counts once it carries content. `answer` gathers
    the chunks' generated ids (vLLM's return_token_ids)."""
    chunks = 0
    last = out.start
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        doc = json.loads(data)
        if "error" in doc:
            out.error = str(doc["error"].get("message", doc["error"]) if isinstance(doc["error"], dict)
                            else doc["error"])[:500]
            return
        now = time.perf_counter()
        choices = doc.get("choices") or []
        delta = (choices[0].get("delta") or {}) if choices and chat else {}
        if choices and (not chat or delta.get("content") or choices[0].get("finish_reason")):
            if chunks == 0:
                out.ttft = now - out.start
            else:
                out.itl.append(now - last)
            last = now
            chunks += 1
            out.finish_reason = choices[0].get("finish_reason") or out.finish_reason
            if answer is not None:
                answer.extend(choices[0].get("token_ids") or ())
        usage = doc.get("usage")
        if usage:
            out.output_len = usage.get("completion_tokens") or 0
            out.prompt_len = usage.get("prompt_tokens") or out.prompt_len   # the server's own count
    if chunks == 0:
        out.error = "the stream ended without a token"
        return
    out.latency = last - out.start
    out.output_len = out.output_len or chunks
    out.success = True


async def run_bench_async(trace: Trace, cfg: BenchConfig, progress=None) -> tuple[list[BenchRequest], float]:
    adapters = request_models(trace, cfg)       # checked before the server is asked anything
    base = cfg.model or served_model(cfg.endpoint, headers=cfg.headers())["id"]
    results = [BenchRequest(r.request_id, r.arrival_time, r.prompt_len, r.output_len, model=adapter or base)
               for r, adapter in zip(trace, adapters)]
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=api_base(cfg.endpoint), limits=limits, headers=cfg.headers(),
                                 timeout=httpx.Timeout(cfg.timeout, connect=30.0)) as client:
        origin = time.perf_counter()
        outs = {req.request_id: out for req, out in zip(trace, results)}
        answers: dict[str, list[int]] = {}     # conversation turns' answers, sent back by the turns after

        async def send(req: TraceRequest, at: float | None = None) -> bool:
            """Send `req` at its time (or at `at`, s since the start), then the client's pause; whether the server
            answered it."""
            delay = origin + (req.arrival_time if at is None else at) - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            began = time.perf_counter()
            await _send(client, cfg, outs[req.request_id].model, trace, req, outs[req.request_id], answers)
            if progress is not None:
                progress()
            wait = pause(cfg.client_request_rate, time.perf_counter() - began, req.request_id, cfg.seed)
            if wait > 0:               # the client's own pace, before its next request
                await asyncio.sleep(wait)
            return outs[req.request_id].success

        if cfg.max_concurrency:
            queue = TurnQueue(trace.requests, cfg.max_concurrency, ClientKnobs.of(cfg), cfg.seed)
            await asyncio.gather(*(_client(queue, send, first) for first in queue.begin(cfg.max_concurrency)))
            while queue.take_new_phase():      # the warm-up has ended: the benchmark's clients begin
                await asyncio.gather(*(_client(queue, send, first)
                                       for first in queue.begin(cfg.max_concurrency)))
            if queue.dropped:          # left by stopped clients: never sent, so neither done nor failed
                results = [out for out in results if out.start is not None]
            results = queue.measured(results)     # (a warm-up out of the figures)
        elif cfg.turns_after_answers:
            sessions = TurnsAfterAnswers(trace.requests)
            await asyncio.gather(*(_session(sessions, first, send, origin) for first in sessions.starts))
            if sessions.dropped:       # the turns after a failed one: never sent, so neither done nor failed
                results = [out for out in results if out.start is not None]
        else:
            await asyncio.gather(*(send(req) for req in trace))
    for out in results:   # times relative to the start of the run
        if out.start is not None:
            out.start -= origin
    return results, time.perf_counter() - origin


async def _client(queue: TurnQueue, send, req: TraceRequest) -> None:
    """One client of a closed loop: its requests one after another from its first (`queue.begin`), each its
    last one's next (`queue.after`)."""
    while req is not None:
        answered = await send(req)
        req = queue.after(req, refused=not answered)


async def _session(sessions: TurnsAfterAnswers, first: TraceRequest, send, origin: float) -> None:
    """One conversation's user (or a lone request's): its first turn at its trace time, each later one when the
    answer before it has ended says (`TurnsAfterAnswers.due`)."""
    req, at = first, None
    while req is not None:
        answered = await send(req, at)
        ended_at = time.perf_counter() - origin
        req = sessions.after(req, refused=not answered)
        at = TurnsAfterAnswers.due(req, ended_at) if req is not None else None


def run_bench(trace: Trace, cfg: BenchConfig, progress=None) -> tuple[list[BenchRequest], float]:
    return asyncio.run(run_bench_async(trace, cfg, progress))


# -- results ---------------------------------------------------------------------------
# A served request's quantities as the client measured them (TPOT over the server's own token count; a request
# of one token has none, and counts as 0 for goodput, as in vLLM's benchmark).
PER_REQUEST = {"ttft": lambda r: r.ttft, "tpot": lambda r: r.tpot or 0.0, "e2e": lambda r: r.latency,
               "itl": lambda r: max(r.itl) if r.itl else 0.0,
               "normalized_latency": lambda r: r.latency / max(r.output_len, 1)}


def bench_metrics(results: list[BenchRequest], slos: dict[str, float] | None = None) -> dict:
    """The planner's metric names (compute_metrics), with TPOT as vLLM's benchmark defines it, and goodput."""
    metrics = compute_metrics([r.record() for r in results], [])
    done = [r for r in results if r.success]
    metrics["num_failed"] = len(results) - len(done)   # counted as rejected too: completed + rejected = submitted
    metrics.update(latency_summary("tpot", [t for r in done if (t := r.tpot) is not None]))
    metrics.pop("preemptions", None)    # the client cannot see them
    if slos:
        metrics["slos"] = slos
        metrics.update(goodput(done, slos, metrics.get("duration"), lambda r, quantity: PER_REQUEST[quantity](r)))
    return metrics


REQUEST_COLUMNS = ["request_id", "arrival", "start", "prompt_len", "expected_output_len", "output_len",
                   "first_token", "finish", "ttft", "tpot", "e2e", "itl_mean", "success", "finish_reason", "error",
                   "model"]


def write_requests_csv(results: list[BenchRequest], path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(REQUEST_COLUMNS)
        for r in results:
            ok = r.success
            w.writerow([r.request_id, r.arrival, r.start, r.prompt_len, r.expected_output_len, r.output_len,
                        r.start + r.ttft if ok else None, r.start + r.latency if ok else None,
                        r.ttft if ok else None, r.tpot, r.latency if ok else None,
                        sum(r.itl) / len(r.itl) if ok and r.itl else None, ok, r.finish_reason, r.error, r.model])
