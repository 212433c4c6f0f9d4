"""AsyncEngine: one asyncio task steps LLMEngine; HTTP handlers submit requests and read their updates.

The engine is only touched by the loop task: a step runs in one worker
thread (so the event loop keeps serving sockets while the model computes),
and requests are added or aborted between steps. A handler gets a queue of
updates per request: each update holds, per sequence, the tokens, text and
logprobs new since the last one.

A step that fails ends only the requests it ran (each gets a 500 naming the
internal error); the loop goes on. The engine is unhealthy only while steps
keep failing (``UNHEALTHY_AFTER`` in a row) or once the loop itself has died.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from engine.core.sampling_params import SamplingParams
from engine.detokenizer import stream_holdback
from engine.entrypoints.openai.errors import RequestError
from engine.llm_engine import LLMEngine, StepError
from engine.lora import LoRARequest
from engine.outputs import RequestOutput

log = logging.getLogger("engine.entrypoints.openai")

UNHEALTHY_AFTER = 3      # consecutive failed steps after which /health says 503


@dataclass(slots=True)
class SeqDelta:
    index: int
    token_ids: list[int]
    text: str
    logprobs: list | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass(slots=True)
class Update:
    seqs: list[SeqDelta]
    final: RequestOutput | None = None      # set on the last update of a request
    error: str | None = None                # the engine refused (400) or failed (500) the request
    status: int = 400


@dataclass
class _Stream:
    params: SamplingParams
    deltas: bool                            # streaming: publish every step, not only the end
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    sent_tokens: list[int] = field(default_factory=list)
    sent_chars: list[int] = field(default_factory=list)


class AsyncEngine:
    def __init__(self, engine: LLMEngine, stats=None) -> None:
        self.engine = engine
        engine.stream_text = True
        engine.keep_steps = False           # (a server's memory must not grow with the steps it has run)
        self.stats = stats                  # ServerStats, told about every finished request
        self._streams: dict[str, _Stream] = {}
        # (request id, prompt, params, arrival, priority, LoRA adapter or None)
        self._to_add: list[tuple[str, dict, SamplingParams, float, int, LoRARequest | None]] = []
        self._to_abort: list[str] = []
        self._calls: list[tuple[Callable[[], object], asyncio.Future]] = []   # engine calls between steps
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-step")
        # vLLM's --stream-interval: after a sequence's first token, its tokens go out N at a time (the rest at
        # its end; engine/core/metrics.py streamed_times, whose rule this is)
        self.stream_interval = engine.deployment.stream_interval
        self._task: asyncio.Task | None = None
        self._closing = False
        self.failed_in_a_row = 0            # consecutive failed steps
        self.last_error: str | None = None
        self.kv_events = None               # a KvEventLog (kv_events.py), fed after every step

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        """Finish every request in flight, then stop."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        for _, done in self._calls:          # (asked for as the loop ended)
            if not done.done():
                done.set_exception(RequestError("the engine is not serving now (shutting down)", status=503))
        self._executor.shutdown(wait=True)

    @property
    def serving(self) -> bool:
        """Taking requests: the loop runs and is not shutting down."""
        return self._task is not None and not self._task.done() and not self._closing

    @property
    def healthy(self) -> bool:
        """Serving, and steps are not failing one after another (requests are still taken then: a step
        that succeeds is what makes the engine healthy again)."""
        return self.serving and self.failed_in_a_row < UNHEALTHY_AFTER

    # -- requests ----------------------------------------------------------------
    async def generate(self, request_id: str, prompt: dict, params: SamplingParams, arrival: float,
                       stream: bool, priority: int = 0,
                       lora_request: LoRARequest | None = None) -> AsyncIterator[Update]:
        """Updates for one request until its final one; leaving early aborts it. `lora_request`: the
        adapter it runs with (None: the base model)."""
        if not self.serving:
            raise RequestError(f"the engine is not serving now ({self.why_not()})", status=503)
        s = _Stream(params, stream, sent_tokens=[0] * params.n, sent_chars=[0] * params.n)
        self._streams[request_id] = s
        self._to_add.append((request_id, prompt, params, arrival, priority, lora_request))
        self._wake.set()
        finished = False
        try:
            while True:
                update = await s.queue.get()
                if update.final is not None or update.error is not None:
                    finished = True
                yield update
                if finished:
                    return
        finally:
            self._streams.pop(request_id, None)
            if not finished:   # the client went away (or the handler failed): free its blocks
                self._to_abort.append(request_id)
                self._wake.set()

    async def between_steps(self, call: Callable[[], object]):
        """`call()`'s result (or its exception), called on the engine while no step runs, after the requests
        sent before it are added (a LoRA adapter loaded or dropped while the server runs)."""
        if not self.serving:
            raise RequestError(f"the engine is not serving now ({self.why_not()})", status=503)
        done = asyncio.get_running_loop().create_future()
        self._calls.append((call, done))
        self._wake.set()
        return await done

    def why_not(self) -> str:
        if self._closing:
            return "shutting down"
        if self._task is None or self._task.done():
            return "the engine loop has stopped"
        return f"the last {self.failed_in_a_row} steps failed: {self.last_error}"

    # -- the loop ----------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        engine = self.engine
        while True:
            self._apply_queued()
            if not engine.has_unfinished_requests():
                if self._closing and not self._to_add:
                    return
                self._wake.clear()
                if not (self._to_add or self._to_abort or self._calls or self._closing):
                    await self._wake.wait()
                continue
            try:
                finished = await loop.run_in_executor(self._executor, engine.step)
                self.failed_in_a_row = 0
            except StepError as exc:   # only the step's own requests failed; the engine goes on
                finished = self._step_failed(exc, exc.outputs)
            except Exception as exc:   # outside the step (none is known): end everything, go on
                finished = self._step_failed(exc, [engine.abort_request(rid) for rid in list(engine.groups)])
            if self.kv_events is not None:
                self.kv_events.drain()
            self._publish(finished)
            self._fail_orphans()

    def _step_failed(self, exc: Exception, outputs: list[RequestOutput]) -> list[RequestOutput]:
        log.error("engine step failed: %s", exc, exc_info=getattr(exc, "cause", exc))
        self.failed_in_a_row += 1
        self.last_error = f"{type(exc).__name__}: {exc}" if not isinstance(exc, StepError) else str(exc)
        if self.stats is not None:
            self.stats.step_failures += 1
        for out in outputs:
            out.error = out.error or f"internal error: {self.last_error}"
            for o in out.outputs:
                o.finish_reason = "error"
        return outputs

    def _fail_orphans(self) -> None:
        """After a failed step: streams whose request the engine no longer holds and that no
        update will reach (there should be none) get an error, so none waits for ever."""
        if not self.failed_in_a_row:
            return
        pending = {rid for rid, *_ in self._to_add}
        for request_id, s in self._streams.items():
            if request_id not in self.engine.groups and request_id not in pending and s.queue.empty():
                s.queue.put_nowait(Update([], error=f"internal error: {self.last_error}", status=500))

    def _apply_queued(self) -> None:
        engine = self.engine
        for request_id in self._to_abort:
            aborted = engine.abort_request(request_id)
            if aborted is not None and self.stats is not None:
                self.stats.observe(aborted.metrics, aborted)
        self._to_abort.clear()
        for request_id, prompt, params, arrival, priority, lora in self._to_add:
            s = self._streams.get(request_id)
            if s is None:          # gone before it was added
                continue
            try:
                engine.add_request(request_id, prompt, params, arrival_time=arrival, priority=priority,
                                   lora_request=lora)
            except ValueError as exc:
                s.queue.put_nowait(Update([], error=str(exc)))
            except Exception as exc:   # a bug, not the request: a 500, and the loop goes on
                log.exception("adding request %s failed", request_id)
                s.queue.put_nowait(Update([], error=f"internal error: {type(exc).__name__}: {exc}", status=500))
        self._to_add.clear()
        calls, self._calls = self._calls, []
        for call, done in calls:
            if done.cancelled():
                continue
            try:
                done.set_result(call())
            except Exception as exc:
                done.set_exception(exc)

    def _publish(self, finished: list[RequestOutput]) -> None:
        done = {o.request_id for o in finished}
        for group in self.engine.last_step_groups:
            s = self._streams.get(group.request_id)
            if s is not None and s.deltas and group.request_id not in done:
                self._publish_deltas(group, s)
        for out in finished:
            if self.stats is not None:
                self.stats.observe(out.metrics, out)
            s = self._streams.get(out.request_id)
            if s is None:
                continue
            if out.error is not None:
                failed = any(o.finish_reason == "error" for o in out.outputs)
                s.queue.put_nowait(Update([], error=out.error, status=500 if failed else 400))
                continue
            seqs = []
            for o in out.outputs:
                i = o.index
                sent_t = s.sent_tokens[i] if i < len(s.sent_tokens) else 0
                sent_c = s.sent_chars[i] if i < len(s.sent_chars) else 0
                text = o.text or ""
                seqs.append(SeqDelta(i, o.token_ids[sent_t:], text[sent_c:],
                                     None if o.logprobs is None else o.logprobs[sent_t:],
                                     o.finish_reason, o.stop_reason))
            s.queue.put_nowait(Update(seqs, final=out))

    def _publish_deltas(self, group, s: _Stream) -> None:
        """What a streaming request's sequences gained in the last step."""
        engine = self.engine
        holdback = stream_holdback(group.params.stop, group.params.include_stop_str_in_output)
        seqs = []
        for i, seq in enumerate(group.seqs[:group.params.n]):
            tokens = seq.output_token_ids
            if len(tokens) <= s.sent_tokens[i]:
                continue
            if s.sent_tokens[i] and len(tokens) - s.sent_tokens[i] < self.stream_interval and not seq.is_finished:
                continue
            text = engine.text_state(seq).text
            visible = len(text) - holdback if not seq.is_finished else len(text)
            new_text = text[s.sent_chars[i]:visible] if visible > s.sent_chars[i] else ""
            logprobs = engine.seq_logprobs(seq)
            seqs.append(SeqDelta(i, tokens[s.sent_tokens[i]:], new_text,
                                 None if logprobs is None else logprobs[s.sent_tokens[i]:]))
            s.sent_tokens[i] = len(tokens)
            s.sent_chars[i] += len(new_text)
        if seqs:
            s.queue.put_nowait(Update(seqs))
