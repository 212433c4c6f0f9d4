"""AsyncEngine: one asyncio task steps LLMEngine; HTTP handlers submit requests and read their updates.

The engine is only touched by the loop task: a step runs in one worker
thread (so the event loop keeps serving sockets while the model computes),
and requests are added or aborted between steps. A handler gets a queue of
updates per request: each update holds, per sequence, the tokens, text and
logprobs new since the last one.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from engine.core.sampling_params import SamplingParams
from engine.detokenizer import stream_holdback
from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput

log = logging.getLogger("engine.entrypoints.openai")


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
    error: str | None = None                # the engine failed or refused the request


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
        self.stats = stats                  # ServerStats, told about every finished request
        self._streams: dict[str, _Stream] = {}
        self._to_add: list[tuple[str, dict, SamplingParams, float]] = []
        self._to_abort: list[str] = []
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-step")
        self._task: asyncio.Task | None = None
        self._closing = False
        self.error: str | None = None       # set when a step failed: the server is unhealthy
        self.num_aborted = 0

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        """Finish every request in flight, then stop."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task
        self._executor.shutdown(wait=True)

    @property
    def healthy(self) -> bool:
        return self.error is None and self._task is not None and not self._task.done()

    # -- requests ----------------------------------------------------------------
    async def generate(self, request_id: str, prompt: dict, params: SamplingParams, arrival: float,
                       stream: bool) -> AsyncIterator[Update]:
        """Updates for one request until its final one; leaving early aborts it."""
        if self.error is not None:
            raise RuntimeError(f"the engine stopped: {self.error}")
        s = _Stream(params, stream, sent_tokens=[0] * params.n, sent_chars=[0] * params.n)
        self._streams[request_id] = s
        self._to_add.append((request_id, prompt, params, arrival))
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
                if not (self._to_add or self._to_abort or self._closing):
                    await self._wake.wait()
                continue
            try:
                finished = await loop.run_in_executor(self._executor, engine.step)
            except Exception as exc:   # a bug or a device failure: fail every request, report unhealthy
                log.exception("engine step failed")
                self.error = f"{type(exc).__name__}: {exc}"
                for s in self._streams.values():
                    s.queue.put_nowait(Update([], error=self.error))
                return
            self._publish(finished)

    def _apply_queued(self) -> None:
        engine = self.engine
        for request_id in self._to_abort:
            if engine.abort_request(request_id):
                self.num_aborted += 1
        self._to_abort.clear()
        for request_id, prompt, params, arrival in self._to_add:
            s = self._streams.get(request_id)
            if s is None:          # gone before it was added
                continue
            try:
                engine.add_request(request_id, prompt, params, arrival_time=arrival)
            except ValueError as exc:
                s.queue.put_nowait(Update([], error=str(exc)))
        self._to_add.clear()

    def _publish(self, finished: list[RequestOutput]) -> None:
        done = {o.request_id for o in finished}
        engine = self.engine
        for group in engine.last_step_groups:
            s = self._streams.get(group.request_id)
            if s is None or not s.deltas or group.request_id in done:
                continue
            holdback = stream_holdback(group.params.stop, group.params.include_stop_str_in_output)
            seqs = []
            for i, seq in enumerate(group.seqs[:group.params.n]):
                tokens = seq.output_token_ids
                if len(tokens) <= s.sent_tokens[i]:
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
        for out in finished:
            if self.stats is not None:
                self.stats.observe(out.metrics, out)
            s = self._streams.get(out.request_id)
            if s is None:
                continue
            if out.error is not None:
                s.queue.put_nowait(Update([], error=out.error))
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
