"""The live half of a fleet validation: K real engines in this process, stepping in turn on their own clocks.

Why not K server processes on this machine's cores (`planner serve --replicas`)?
On a small shared CPU they would time each other, not themselves: two engines
stepping at once on two cores (with other jobs beside) run each step slower
than the profile that prices the simulator measured, by a factor that moves
with whatever else runs, so the comparison would judge the machine's
contention, not the simulator. The simulator models K devices; so does this:

- every replica is a real `LLMEngine` (model, scheduler, block manager,
  prefix cache), with a clock of its own that advances only by the wall time
  its own steps take (`ReplicaClock`);
- the replicas step one at a time, always the one whose clock is earliest, and
  each arrival is routed when it is earlier than every replica's next step:
  a discrete-event loop over measured step times, as the simulator's is over
  predicted ones, so each step has the machine to itself (as each simulated
  replica has its device) and the trace's arrivals keep their times;
- the router is engine/core/routing.py's, the simulator's own, reading each
  replica as it stood at its last step end before the arrival (in-flight
  counts, KV blocks in use, the prefix cache from its KV events), as the
  simulated router does.

The fleet's wall time is then about the sum of its replicas' busy times; what
is compared are the trace-clock times, which are the replicas' own.
"""
from __future__ import annotations

import bisect
import heapq
import itertools
import tempfile
import time
from collections import deque
from dataclasses import dataclass

from engine.core.block_keys import adapter_name, cache_root
from engine.core.metrics import RequestRecord, compute_metrics
from engine.core.routing import BaseRouter, RouterPolicy, leading_held
from planner.sim.speculative import spec_step_shape
from planner.validation.live import Answers, _warm_up, random_adapters
from planner.validation.spec import ValidationSpec
from workloads import Trace
from workloads.clients import pause
from workloads.sessions import TurnsAfterAnswers


class ReplicaClock:
    """A replica's own time: its last step's end, running with the wall clock only during its steps."""

    def __init__(self) -> None:
        self.base = 0.0
        self.started: float | None = None

    def __call__(self) -> float:
        return self.base if self.started is None else self.base + (time.perf_counter() - self.started)

    def run(self, at: float) -> None:
        self.base, self.started = at, time.perf_counter()

    def stop(self) -> float:
        self.base, self.started = self(), None
        return self.base


class LiveReplica:
    """One engine and what a router may read of it: its state as published at each step end."""

    def __init__(self, engine, clock: ReplicaClock, log_events: bool) -> None:
        self.engine, self.clock = engine, clock
        self.free_at = 0.0                      # its clock: the end of its last step
        self.routed = 0
        self.ended_at: list[float] = []         # one entry per ended request, in order
        self.used: list[tuple[float, int]] = [(0.0, engine.allocator.num_used_blocks())]
        self.events: deque | None = deque() if log_events else None
        self.held: set[int] = set()
        self.prefill_held = self.prefill_cached = 0   # prompt tokens of prefill steps, and of them cached
        if log_events:
            engine.allocator.gpu.events = []

    def observe(self, out, prefill_tokens: int) -> None:
        """A step's scheduler output (before it runs): prompt tokens held vs computed, as the simulator counts."""
        if out.is_prefill and not self.engine.scheduler.config.vllm_v1:
            held = sum(len(s.token_ids) for s in out.seqs)
            self.prefill_held += held
            self.prefill_cached += held - prefill_tokens

    def prefix_counts(self) -> tuple[int, int]:
        scheduler = self.engine.scheduler
        if scheduler.config.vllm_v1:       # counted at admission, as vLLM counts them
            return scheduler.prefix_hit_tokens, scheduler.prefix_queried_tokens
        return self.prefill_cached, self.prefill_held

    def step(self, between_steps=None) -> list:
        """One engine step on this replica's clock; the requests it ended (their outputs)."""
        self.clock.run(self.free_at)
        began = time.perf_counter()
        finished = self.engine.step()
        busy = time.perf_counter() - began
        end = self.free_at = self.clock.stop()
        self.ended_at.extend([end] * len(finished))
        self.used.append((end, self.engine.allocator.num_used_blocks()))
        if self.events is not None and self.engine.allocator.gpu.events:
            self.events.append((end, list(self.engine.allocator.gpu.events)))
            self.engine.allocator.gpu.events.clear()
        if between_steps is not None:
            between_steps(busy, end)              # no replica's clock runs meanwhile
        return finished

    def blocks_used_before(self, t: float) -> int:
        i = bisect.bisect_left(self.used, (t, -1))
        return self.used[max(0, i - 1)][1]

    def cached_prefix_before(self, hashes: list[int], t: float) -> int:
        while self.events and self.events[0][0] < t:
            for stored, h in self.events.popleft()[1]:
                (self.held.add if stored else self.held.discard)(h)
        return leading_held(hashes, self.held)


class ReplayRouter(BaseRouter):
    """The shared pick rule over the live replicas' published state."""

    def __init__(self, policy: RouterPolicy, replicas: list[LiveReplica], block_size: int) -> None:
        super().__init__(policy, len(replicas), block_size)
        self.replicas = replicas

    def in_flight(self, now: float) -> list[int]:
        return [r.routed - bisect.bisect_left(r.ended_at, now) for r in self.replicas]

    def kv_usage(self, now: float) -> list[float]:
        return [r.blocks_used_before(now) / r.engine.allocator.num_gpu_blocks for r in self.replicas]

    def cached_prefix(self, hashes: list[int], now: float) -> list[int]:
        return [r.cached_prefix_before(hashes, now) for r in self.replicas]


@dataclass
class LiveFleet:
    """The fleet's requests (trace order), steps (start order) and metrics; the replica of each request and
    step; each replica's engine and prefix counts."""

    requests: list[RequestRecord]
    steps: list
    shapes: list
    metrics: dict
    routes: list[int]
    step_replicas: list[int]
    replicas: list[LiveReplica]
    speed: tuple[float | None, float | None] = (None, None)   # canary ratios before and after the run

    @property
    def prefix_cache_hit_rate(self) -> float:
        hit, held = (sum(c) for c in zip(*(r.prefix_counts() for r in self.replicas)))
        return hit / held if held else 0.0


def make_replicas(folder: str, spec: ValidationSpec, count: int, *, device: str, dtype: str,
                  log_events: bool, weights_of=None) -> tuple[list[LiveReplica], list[list]]:
    """`count` engines of the spec's deployment, warmed up, each with its own clock; their step shapes.
    They run one loaded model (that of the runner `weights_of`, else the first replica's), each on a KV cache
    of its own: the simulated replicas are identical devices, and copies of the model loaded one after
    another ran the same steps up to 15% apart on the 2-core VM (bench/bench_profile_beside.py)."""
    from engine.llm_engine import LLMEngine  # torch: only a live run needs it
    replicas, shapes = [], []
    for _ in range(count):
        clock, mine = ReplicaClock(), []
        box: list[LiveReplica] = []

        def observe(out, mine=mine, box=box):
            shape = spec_step_shape(out)
            mine.append(shape)
            if box:                                 # not during the warm-up
                box[0].observe(out, shape.prefill_tokens)
        engine = LLMEngine(folder, spec.live_deployment.replace(dtype=dtype), device=device, seed=spec.seed,
                           clock=clock, step_observer=observe,
                           weights_of=weights_of)
        weights_of = engine.runner
        _warm_up(engine, engine.runner.vocab_size)
        mine.clear()
        box.append(LiveReplica(engine, clock, log_events))
        replicas.append(box[0])
        shapes.append(mine)
    return replicas, shapes


class FleetReplay:
    """One live fleet's replay, an event at a time (see the module): `next_time()` is when its next event
    happens on the trace clock (None once every request ended), `advance()` takes it. Requests are sent at
    their arrival times, or by the spec's closed loop of clients (planner/sim/clients.py's rules: N sent at
    once, each client's next one (workloads/clients.py) as its request ends, the deployment's
    client_turnaround and its client's pause later; paced, never before its arrival time), each stamped with
    the time it is sent; with the deployment's turns_after_answers, a conversation's later turn when its previous
    one's end says (workloads/sessions.py)."""

    def __init__(self, trace: Trace, replicas: list[LiveReplica], shapes: list[list], policy: RouterPolicy,
                 spec: ValidationSpec, between_steps=None, progress=None, loras: dict | None = None) -> None:
        self.trace, self.replicas, self.shapes, self.seed = trace, replicas, shapes, spec.seed
        self.loras = loras or {}               # the trace's LoRA adapters by id, loaded on every replica
        self.router = ReplayRouter(policy, replicas, spec.deployment.block_size)
        self.vocab = replicas[0].engine.runner.vocab_size
        self.between_steps, self.progress = between_steps, progress
        self.groups, self.routes, self.done = [], [], 0
        self.clients, self.paced = spec.concurrency, spec.paced
        self.turnaround, self.rate = spec.deployment.client_turnaround, spec.deployment.client_request_rate
        self.stream_interval = spec.deployment.stream_interval
        self.unsent = spec.turn_queue(trace)                 # the closed loop's
        self.sessions = spec.sessions(trace)                 # an open loop's turns that wait for their answers
        self.in_flight: dict[str, tuple[object, float]] = {}    # request id -> (the request, when sent), not ended
        self.answers = Answers(trace)
        # a heap: (when, order released, request, ended, refused): a request to send then, or one that ended (or
        # was refused), whose client takes its next then (after the turnaround and its pause, as the simulator's
        # clients do)
        self.due: list[tuple[float, int, object, bool, bool]] = []
        self.order = itertools.count()
        if self.clients is None:
            for req in trace.requests if self.sessions is None else self.sessions.starts:
                self._due(req, 0.0)
        else:
            self._new_clients(0.0)

    def _new_clients(self, at: float) -> None:
        for req in self.unsent.begin(self.clients):
            self._due(req, at)

    def _due(self, req, at: float) -> None:
        """A request due at `at`: at its arrival time in an open loop, never before it when paced."""
        if req is None:
            return
        when = req.arrival_time if self.clients is None or (self.paced and req.arrival_time > at) else at
        heapq.heappush(self.due, (when, next(self.order), req, False, False))

    def _next_step(self) -> LiveReplica | None:
        busy = [r for r in self.replicas if r.engine.has_unfinished_requests()]
        return min(busy, key=lambda r: r.free_at) if busy else None

    def next_time(self) -> float | None:
        nxt = self._next_step()
        if not self.due and nxt is None and self.unsent:    # nothing out, nothing on its way: every client free
            self._new_clients(max(r.free_at for r in self.replicas))
        times = [t for t in (self.due[0][0] if self.due else None,
                             nxt.free_at if nxt is not None else None) if t is not None]
        return min(times) if times else None

    def advance(self) -> None:
        nxt = self._next_step()
        if self.due and (nxt is None or self.due[0][0] <= nxt.free_at):
            when, _, req, ended, refused = heapq.heappop(self.due)
            if ended:
                self._due(self.unsent.after(req, refused), when)
            else:
                self._route(req, when)
            return
        ended = nxt.step(self.between_steps)
        self.done += len(ended)
        self.answers.keep(ended)
        for out in ended:
            req, sent = self.in_flight.pop(out.request_id)
            if self.sessions is not None and (turn := self.sessions.after(req, out.metrics.rejected)) is not None:
                due = TurnsAfterAnswers.due(turn, nxt.free_at)   # its next turn, sent then
                heapq.heappush(self.due, (due, next(self.order), turn, False, False))
            if self.clients is not None:       # each ended request frees its client for its next
                wait = self.turnaround + pause(self.rate, nxt.free_at - sent, req.request_id, self.seed)
                heapq.heappush(self.due, (nxt.free_at + wait, next(self.order), req, True, out.metrics.rejected))
        if self.progress is not None and ended:
            self.progress(self.done, len(self.trace))

    def _route(self, req, at: float) -> None:
        tokens = self.trace.prompt_token_ids(req, self.vocab, self.seed, self.answers)
        # (random_adapters' names)
        chosen = self.router.pick(tokens, at, cache_root(adapter_name(req.lora), req.cache_salt), req.conversation_id)
        replica = self.replicas[chosen]
        if not replica.engine.has_unfinished_requests():     # idle: it wakes at the arrival
            replica.free_at = replica.clock.base = max(replica.free_at, at)
        replica.routed += 1
        replica.engine.add_request(req.request_id, req.engine_prompt(tokens), req.sampling_params(),
                                   arrival_time=at, output_len_hint=req.output_len, priority=req.priority,
                                   lora_request=self.loras.get(req.lora))
        self.groups.append(replica.engine.groups[req.request_id])
        self.routes.append(chosen)
        self.in_flight[req.request_id] = (req, at)

    def result(self) -> LiveFleet:
        warm = self.unsent.unmeasured        # (a closed loop's warm-up out of the figures)
        kept = [i for i, g in enumerate(self.groups) if g.request_id not in warm]
        return _fleet_result([self.groups[i] for i in kept], [self.routes[i] for i in kept], self.replicas,
                             self.shapes, self.stream_interval)


def run_live_fleet(trace: Trace, folder: str, spec: ValidationSpec, count: int, policy: RouterPolicy, *,
                   device: str, dtype: str, profiler=None, progress=None, speed_probe=None) -> LiveFleet:
    """Replay `trace` (open loop) on `count` live engines behind `policy` (see the module). `speed_probe(runner)`
    times the device on replica 0's runner right before and right after the run (planner/profile/speed.py)."""
    return run_live_fleets(trace, folder, spec, count, [policy], device=device, dtype=dtype,
                           profiler=profiler, progress=progress, speed_probe=speed_probe)[0]


def run_live_fleets(trace: Trace, folder: str, spec: ValidationSpec, count: int, policies: list[RouterPolicy], *,
                    device: str, dtype: str, profiler=None, progress=None, speed_probe=None) -> list[LiveFleet]:
    """One live fleet per policy on the same trace, replayed together: the fleet furthest behind on the trace
    clock takes the next event, so all of them cross each stretch of the trace in the same minutes of wall
    time and a machine whose speed drifts (a shared CPU) slows them alike, as comparing policies needs.
    `profiler`: a profile timed along the run (planner/validation/live.py's run_live), on the model every
    replica runs."""
    with tempfile.TemporaryDirectory(prefix="planner-adapters-") as adapters:
        return _run_fleets(trace, folder, spec, count, policies, device, dtype, profiler, progress, speed_probe,
                           adapters)


def _run_fleets(trace: Trace, folder: str, spec: ValidationSpec, count: int, policies: list[RouterPolicy],
                device: str, dtype: str, profiler, progress, speed_probe, adapters: str) -> list[LiveFleet]:
    between_steps = profiler.between_steps if profiler is not None else None
    replays: list[FleetReplay] = []
    for policy in policies:                              # every fleet's replicas run the first one's model
        replicas, shapes = make_replicas(folder, spec, count, device=device, dtype=dtype, log_events=policy.uses_prefix,
                                         weights_of=replays[0].replicas[0].engine.runner if replays else None)
        loras = random_adapters([r.engine for r in replicas], trace, f"{adapters}/{len(replays)}")
        replays.append(FleetReplay(trace, replicas, shapes, policy, spec, between_steps, progress, loras))
    runner = replays[0].replicas[0].engine.runner
    before = speed_probe(runner) if speed_probe else None
    if profiler is not None:
        profiler.before_steps(runner)
    while True:
        due = [(t, i) for i, r in enumerate(replays) if (t := r.next_time()) is not None]
        if not due:
            break
        replays[min(due)[1]].advance()
    after = speed_probe(runner) if speed_probe else None
    results = [r.result() for r in replays]
    for result in results:
        result.speed = (before, after)
    return results


def _fleet_result(groups, routes, replicas: list[LiveReplica], shapes: list[list],
                  stream_interval: int = 1) -> LiveFleet:
    records = [RequestRecord.from_group(g, stream_interval) for g in groups]
    tagged = sorted(((s.start, i, j) for i, r in enumerate(replicas) for j, s in enumerate(r.engine.steps)))
    steps = [replicas[i].engine.steps[j] for _, i, j in tagged]
    step_shapes = [shapes[i][j] for _, i, j in tagged]
    preemptions = {k: sum(r.engine.scheduler.preemptions[k] for r in replicas) for k in ("recompute", "swap")}
    return LiveFleet(records, steps, step_shapes, compute_metrics(records, steps, preemptions), routes,
                     [i for _, i, _ in tagged], replicas)
