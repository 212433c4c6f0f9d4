"""The live half of a validation: replay a trace online against the wall clock on the real engine.

Each request is released when the trace clock reaches its arrival time (or,
in a closed loop of N clients, the moment one of the N requests in flight
ends; paced by a rate too, whichever is later), and the engine steps as fast
as it can. The engine (torch) is imported only when
a live run starts: the rest of the planner never needs torch.
"""
from __future__ import annotations

import heapq
import itertools
import tempfile
import time
from collections import deque
from contextlib import contextmanager
from itertools import takewhile

from engine.core.block_keys import adapter_name
from engine.core.kv_offload import CpuKvTier
from engine.core.metrics import RequestRecord, compute_metrics
from engine.core.sampling_params import SamplingParams
from engine.core.speculative import SpecDecodingStats
from planner.cost.shape import StepShape
from planner.sim.speculative import spec_step_shape
from planner.validation.compare import LiveRun
from planner.validation.spec import ValidationSpec
from workloads import Trace
from workloads.clients import pause
from workloads.sessions import TurnsAfterAnswers


class TraceClock:
    """Seconds since ``start()``, less the time spent ``paused()``: the trace's own time axis, read by
    the live engine."""

    def __init__(self) -> None:
        self.origin = time.perf_counter()

    def start(self) -> None:
        self.origin = time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self.origin

    @contextmanager
    def paused(self):
        """Work done inside (profiling between steps) takes no trace time: arrivals and stamps skip it."""
        stopped = time.perf_counter()
        try:
            yield
        finally:
            self.origin += time.perf_counter() - stopped


def run_live(trace: Trace, folder: str, spec: ValidationSpec, *, device: str, dtype: str, progress=None,
             speed_probe=None, profiler=None) -> LiveRun:
    """Replay ``trace`` online on the engine over the model `folder`, deployed as `spec` says, on
    `device` in `dtype` (a profile's: planner/profile/check.py's pin_live_device, or the `live_device()`
    of a profile timed along or around the run).

    ``profiler``, if given, is a profile timed along the run (planner/profile/along.py, or around it:
    around.py): ``profiler.before_steps(runner)`` is called once the engine is loaded and warmed up, with
    its runner, and ``profiler.between_steps(busy_s, now)`` after each step with the step's wall time and
    the trace time, with the trace clock paused.

    ``speed_probe(runner) -> ratio``, if given, times the device on the engine's own runner right
    before the run (its KV cache still empty) and right after it (planner/profile/speed.py).
    """
    from cuda_ext import ops_for               # torch: only a live run needs it
    from engine.llm_engine import LLMEngine    # torch

    shapes: list[StepShape] = []
    clock = TraceClock()
    # spec_step_shape is step_shape for a step without drafts (speculation off: the same shapes).
    engine = LLMEngine(folder, spec.live_deployment.replace(dtype=dtype), device=device, seed=spec.seed,
                       clock=clock,
                       step_observer=lambda out: shapes.append(spec_step_shape(out)))
    before = speed_probe(engine.runner) if speed_probe else None
    _warm_up(engine, engine.runner.vocab_size)
    shapes.clear()
    with tempfile.TemporaryDirectory(prefix="planner-adapters-") as adapters:
        loras = random_adapters([engine], trace, adapters)
        if profiler is not None:
            profiler.before_steps(engine.runner)
        groups = _replay(engine, trace, clock, spec, progress, profiler.between_steps if profiler is not None else None,
                         loras)
    after = speed_probe(engine.runner) if speed_probe else None
    requests = [RequestRecord.from_group(g, spec.deployment.stream_interval) for g in groups]
    return LiveRun(requests, engine.steps, shapes, compute_metrics(requests, engine.steps, engine.scheduler.preemptions),
                   engine.runner.num_gpu_blocks, engine.runner.num_cpu_blocks, engine.max_model_len,
                   engine.scheduler.config.max_num_batched_tokens, ops_for(engine.runner.device).backend,
                   (before, after),
                   None if engine.spec_decoding_stats is None else engine.spec_decoding_stats.as_dict(),
                   engine.deployment.max_num_seqs, engine.deployment.enable_prefix_caching,
                   None if engine.allocator.offload is None else engine.allocator.offload.stats.as_dict())


def random_adapters(engines: list, trace: Trace, folder: str) -> dict:
    """The LoRA adapters the trace's requests run (their `lora` ids): random ones of the deployment's
    max_lora_rank (the model's weights are random too), written under `folder` and loaded by every engine (of
    one model): {id: LoRARequest}."""
    ids = sorted({r.lora for r in trace.requests} - {0})
    if not ids:
        return {}
    from engine.lora import LoRARequest, write_random_adapter     # torch
    first = engines[0]
    requests = {}
    for lora_id in ids:
        name = adapter_name(lora_id)          # (the name the simulator keys its blocks by)
        path = write_random_adapter(first.runner.model, f"{folder}/{name}", first.deployment.max_lora_rank,
                                    seed=lora_id)
        requests[lora_id] = LoRARequest(name, lora_id, path)
        for engine in engines:
            engine.add_lora(requests[lora_id])
    return requests


def speculation_curves(stats: dict | None) -> dict:
    """The curves a live run measured (its SpecDecodingStats document) as the deployment's `acceptance`,
    `draft_rates` and `draft_persistence` for the simulation; {} without speculation."""
    return SpecDecodingStats.from_dict(stats).curves() if stats else {}


class Answers(dict):
    """The answers the live model gave to conversation turns (request id -> its ids), which the conversation's
    later turns send back in their history (Trace.prompt_token_ids), as a multi-turn client does."""

    def __init__(self, trace: Trace) -> None:
        super().__init__()
        self.turns = {r.request_id for r in trace if r.conversation_id is not None}

    def keep(self, finished) -> None:
        for out in finished:
            if out.request_id in self.turns and out.outputs:
                self[out.request_id] = list(out.outputs[0].token_ids)


def _replay(engine, trace: Trace, clock: TraceClock, spec: ValidationSpec, progress, between_steps,
            loras: dict | None = None) -> list:
    """Release each request at its arrival time, or with ``spec.concurrency`` N the first N at once and each
    client's next one as its request ends (a conversation's next turn, workloads/clients.py), the deployment's
    client_turnaround (and its client's pause) later, stamped with the time it is sent, as the simulator's
    clients do (planner/sim/clients.py); paced (a rate too), a released request is sent at its arrival time if
    that is later, stamped with it. With the deployment's turns_after_answers (an open loop), a conversation's
    later turn is sent when its previous turn's end says (workloads/sessions.py), stamped with that time, as the
    simulator's Sessions send it. Step until all are done; the requests' groups (a warm-up's left out)."""
    vocab = engine.runner.vocab_size
    groups = []
    closed_loop = spec.concurrency is not None
    sessions = spec.sessions(trace)       # an open loop whose turns wait for their answers, or None
    # an open loop's requests sent at their arrival times, in arrival order (the first turns, with sessions)
    pending = deque(() if closed_loop else sessions.starts if sessions is not None else trace.requests)
    turns_due: list[tuple[float, int, object]] = []    # sessions, a heap: (when, order, a turn whose answer ended)
    clients = spec.turn_queue(trace)
    in_flight: dict[str, tuple[object, float]] = {}     # request id -> (the request, when sent), not ended
    turnaround, rate = spec.deployment.client_turnaround, spec.deployment.client_request_rate
    on_the_way: list[tuple[float, int, object]] = []   # closed loop, a heap: (when, order, the ended request)
    order = itertools.count()
    not_yet_due: list = []            # paced: requests whose clients are free, each waiting for its arrival time
    answers = Answers(trace)

    def send(req, at: float) -> None:
        engine.add_request(req.request_id, req.engine_prompt(trace.prompt_token_ids(req, vocab, spec.seed, answers)),
                           req.sampling_params(), arrival_time=at, output_len_hint=req.output_len,
                           priority=req.priority, lora_request=(loras or {}).get(req.lora))
        groups.append(engine.groups[req.request_id])
        in_flight[req.request_id] = (req, at)

    def release(req, at: float) -> None:
        """A client's next request sent now (stamped `at`), or paced, at its arrival time."""
        if req is None:
            return
        if spec.paced and req.arrival_time > at:
            not_yet_due.append(req)
        else:
            send(req, at)

    def next_due() -> float | None:
        times = [on_the_way[0][0]] if on_the_way else []
        times += [min(r.arrival_time for r in not_yet_due)] if not_yet_due else []
        return min(times) if times else None

    def new_clients(at: float) -> None:
        for req in clients.begin(spec.concurrency):
            release(req, at)

    done = 0
    clock.start()   # trace time 0: the first arrival is due now
    if closed_loop:
        new_clients(0.0)
    while pending or clients or not_yet_due or turns_due or engine.has_unfinished_requests():
        if closed_loop:
            while on_the_way and on_the_way[0][0] <= clock():   # stamped when sent, as a server stamps it
                sent, _, req, refused = heapq.heappop(on_the_way)
                release(clients.after(req, refused), sent)
            for req in sorted((r for r in not_yet_due if r.arrival_time <= clock()), key=lambda r: r.arrival_time):
                not_yet_due.remove(req)
                send(req, req.arrival_time)
            if not engine.has_unfinished_requests():
                due = next_due()
                if due is not None:
                    time.sleep(max(0.0, due - clock()))
                else:       # nothing in flight and nothing on its way: every client is free
                    new_clients(clock())
                continue
        else:
            now = engine.clock()
            for _ in range(sum(1 for _ in takewhile(lambda r: r.arrival_time <= now, pending))):
                req = pending.popleft()
                send(req, req.arrival_time)
            while turns_due and turns_due[0][0] <= now:      # stamped when due, as the simulator's sessions
                when, _, req = heapq.heappop(turns_due)
                send(req, when)
            if not engine.has_unfinished_requests():
                times = ([pending[0].arrival_time] if pending else []) + ([turns_due[0][0]] if turns_due else [])
                time.sleep(max(0.0, min(times) - engine.clock()))
                continue
        began = time.perf_counter()
        finished = engine.step()
        if between_steps is not None:
            busy_s, now = time.perf_counter() - began, clock()
            with clock.paused():
                between_steps(busy_s, now)
        done += len(finished)
        answers.keep(finished)
        ended = [(*in_flight.pop(out.request_id), out.metrics.rejected) for out in finished]
        if sessions is not None and ended:    # each ended turn's next one sent when due (after its think time)
            now = clock()
            for req, _, refused in ended:
                if (turn := sessions.after(req, refused)) is not None:
                    heapq.heappush(turns_due, (TurnsAfterAnswers.due(turn, now), next(order), turn))
        if closed_loop and ended:   # each ended request (finished or refused) frees its client for its next
            now = clock()
            for req, sent, refused in ended:
                wait = turnaround + pause(rate, now - sent, req.request_id, spec.seed)
                heapq.heappush(on_the_way, (now + wait, next(order), req, refused))
        if progress is not None and finished:
            progress(done, len(trace))
    return clients.measured(groups)      # (a closed loop's warm-up out of the figures)


def _warm_up(engine, vocab: int) -> None:
    """One throw-away request so one-time costs (kernel build, allocator warm-up) stay out of the timings."""
    engine.add_request("__warmup__", {"prompt_token_ids": list(range(4, 4 + min(32, vocab - 4)))},
                       SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    engine.steps.clear()
    engine.scheduler.reset_spec_stats()
    if engine.scheduler.config.vllm_v1:   # its prefix-cache counters count the run's own requests
        engine.scheduler.prefix_hit_tokens = engine.scheduler.prefix_queried_tokens = 0
    offload = engine.allocator.offload
    if offload is not None:               # the CPU tier starts empty, as the simulation's
        engine.allocator.offload = CpuKvTier(offload.num_blocks)
