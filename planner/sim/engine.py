"""The paged engine on a simulated clock: the real scheduler and KV allocator, SimPy for time.

Two processes tell the story. Requests arrive at their trace times and join
the engine's queue. The engine runs steps back to back: schedule at the
current time, ask the cost model how long the step takes, let that time pass,
hand the scheduler the step's tokens, and record what happened; with nothing
runnable it sleeps until the next arrival. Under async scheduling vLLM's engine
core schedules a step ahead, so a request that arrives while a step runs misses
the schedule already made and joins the one after (`SimulatedEngine._admit_held`).
Every scheduling, preemption, swapping, copy-on-write and prefix-cache decision
is the engine core's own (imported, not copied); only the step's duration is
predicted. Runs of decode steps that provably change nothing but the token
counts are taken in one go (planner/sim/fast_forward.py), with the same results
as one step at a time. With speculative decoding on (planner/sim/speculative.py)
every step is taken one at a time: fast-forward's proofs assume one token per
sequence and step.
"""
from __future__ import annotations

import bisect
import gc
import heapq
import math
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import repeat
from typing import TYPE_CHECKING, Callable

import simpy

from engine.core.allocators import make_allocator
from engine.core.kv_offload import OffloadStats
from engine.core.metrics import Metrics, RequestRecord, StepRecord, TokenGaps, step_columns, summarize
from engine.core.parallel_sampling import BEAM_SEARCH_REFUSAL, ParentRequest, Parents, fans_out
from engine.core.chunked_scheduler import VllmBlockManager, make_scheduler
from engine.core.scheduler import Scheduler
from engine.core.step import begin_step, end_step
from engine.core.sequence import FinishReason, SequenceGroup
from planner.cost.shape import CostModel, StepShape, reads_context_histogram, step_shape
from planner.deploy.plan import DeploymentPlan
from planner.documents import json_safe
from planner.errors import PlannerError
from planner.sim.batch import DecodeBatch, Plan, PlanTaken, plan_columns, publish_events
from planner.sim.clients import make_clients, unmeasured, unsent
from planner.sim.synthetic import SyntheticExecutor
from planner.sim.private_blocks import PrivateBlockManager
from planner.sim.fast_forward import Window, apply_window, plan_window
from planner.sim.lazy_log import ShapeLog, StepLog
from planner.sim.pipeline import PipelinedScheduler, Stages, pipelined_run
from planner.sim.memory_guard import GUARD, check_replicas
from planner.deploy.speculation import speculation_of
from planner.sim.speculative import (SpeculatingExecutor, SpecRuntime, draft_cost_model,
                                     enable as enable_speculation)
from workloads import Trace

if TYPE_CHECKING:   # a fleet's result holds its replicas' (planner/sim/fleet.py imports this module)
    from planner.sim.fleet import FleetRun

Progress = Callable[[float, int, int], None]   # (simulated time, requests done, requests in the trace)
# Called after every step (and fast-forward window) with the engine (its
# `groups`, `steps`, `num_running` so far), the simulated time and the requests
# that ended in it (finished, rejected or truncated). It may raise to end the
# run there: the capacity search stops a probe once its SLO verdict is certain.
Watch = Callable[["SimulatedEngine", float, list[SequenceGroup]], None]
PROGRESS_EVERY = 2000                          # steps between progress reports


@dataclass
class SimResult:
    """One simulated run: the engine core's records and metrics, and what only a simulation knows."""

    plan: DeploymentPlan           # the deployment as resolved (model, GPU, limits, KV cache)
    cost_model: str                # the cost model's name: which source priced the steps
    trace_name: str
    trace_params: dict
    metrics: Metrics               # the metric set (engine.core.metrics), as for a live run
    requests: list[RequestRecord]  # one per trace request, in trace order
    steps: list[StepRecord]        # one per engine step
    shapes: list[StepShape] | ShapeLog   # the same steps as the cost model saw them (a log builds
                                         # a decode plan's shapes when first read)
    num_running: list[int]         # per step: requests in the running list
    sharing_saved: float           # share of KV slots sharing saved (decode steps, time-weighted)
    prefix_cache_hit_tokens: int
    prefix_cache_hit_rate: float
    kv_blocks_used_at_end: int     # leak check: only free or cached blocks may remain
    simulated_time: float
    wall_time: float               # seconds the simulation took to run
    fast_forwarded_steps: int      # of the steps, how many fast-forward took in bulk
    seed: int = 0                  # of the sampled tokens
    concurrency: int | None = None # a closed loop of this many clients (None: the trace's arrival times)
    fleet: FleetRun | None = None  # several replicas behind a router (planner/sim/fleet.py); None: one
    spec_decoding: dict | None = None  # speculative decoding's counters (vLLM's names); None: off
    kv_offload: dict | None = None     # the CPU KV tier's figures (--kv-offloading-size); None: off
    warnings: list[str] = field(default_factory=list)   # its trace's on this deployment (runs/trace_warnings.py)

    @property
    def params(self) -> dict:
        """The run's settings, JSON-ready (result.json's "params")."""
        fleet = {} if self.fleet is None else {"replicas": self.fleet.replica_count, "router": self.fleet.router}
        return {**self.plan.params(), "seed": self.seed, "concurrency": self.concurrency,
                "cost_model": self.cost_model, "trace": self.trace_name, "trace_params": self.trace_params,
                "num_requests": len(self.requests), **fleet}

    def summary(self) -> dict:
        """The metrics and the simulation's own figures as one flat, JSON-ready dict (result.json's top);
        a fleet's adds `fleet` (per replica, load imbalance). The KV-cache figures are one replica's."""
        fleet = {} if self.fleet is None else {"fleet": self.fleet.summary(self.metrics.duration)}
        spec = {} if self.spec_decoding is None else {"spec_decoding_stats": self.spec_decoding}
        offload = {} if self.kv_offload is None else {"kv_offload": self.kv_offload}
        return {**self._summary(), **spec, **offload, **fleet}

    def _summary(self) -> dict:
        plan = self.plan
        return {**self.metrics.to_dict(), "sharing_saved": self.sharing_saved,
                "prefix_cache_hit_tokens": self.prefix_cache_hit_tokens,
                "prefix_cache_hit_rate": self.prefix_cache_hit_rate,
                "kv_blocks_used_at_end": self.kv_blocks_used_at_end, "num_gpu_blocks": plan.num_gpu_blocks,
                "num_cpu_blocks": plan.num_cpu_blocks,
                "kv_token_slots": plan.num_gpu_blocks * plan.block_size,
                "simulated_time": self.simulated_time, "cost_model": self.cost_model, "params": self.params}


class Due:
    """When the next request arrives (inf: none is due). The arrival process sets it before it sleeps;
    an engine yields once when a step ends exactly then, so that the request joins first."""

    __slots__ = ("at",)

    def __init__(self) -> None:
        self.at = math.inf


class Sleeper:
    """A process that sleeps through steps priced in advance, woken earlier when a request cuts them."""

    env: simpy.Environment
    process: simpy.Process | None
    wake_at: float

    def sleep_until(self, end: float):
        """Let simulated time pass until `end`, or the earlier end a cut sets meanwhile."""
        self.wake_at = end
        while True:
            try:
                yield WakeAt(self.env, max(self.wake_at, self.env.now))
                return
            except simpy.Interrupt:
                pass


def kept_before(start: float, ends: list[float], t: float, ahead: int = 0, cut: bool = False) -> int:
    """Of steps from `start` ending at `ends`, how many start before `t` (a request arriving at `t`
    joins the step after them), and `ahead` more (under async scheduling the next step was scheduled
    without it: it joins the one after that, so the next step runs as planned). A `cut` is a request
    that reached the engine after the steps were planned: at their very start, it came after the first
    step's schedule, as it does step by step, and joins the step after it."""
    before = bisect.bisect_left(ends, t) + 1 if start < t or (cut and start == t) else 0
    return min(len(ends), before + ahead)


STEP, PLAN, WINDOW, IDLE = "step", "plan", "window", "idle"


@dataclass(slots=True)
class Move:
    """What an engine does next from now, priced but not yet taken: one step (`price`, then `finish(end)`
    takes it and returns the requests it ended), a decode plan or fast-forward window (`plan`), or nothing
    to compute (`out`: the scheduler's output, what it ended itself)."""

    kind: str
    price: float = 0.0
    finish: Callable[[float], list] | None = None
    plan: Plan | Window | None = None
    out: object = None
    shape: StepShape | None = None     # a step's shape, and its seconds beyond the shape's price (a draft
    extra: float = 0.0                 # proposer's): what the dp ranks' vote re-prices (planner/sim/lockstep.py)


class SimulatedEngine(Sleeper):
    """The engine process and the state the arrival process hands it requests through."""

    def __init__(self, env: simpy.Environment, scheduler: Scheduler, cost_model: CostModel,
                 executor: SyntheticExecutor, total: int, progress: Progress | None,
                 fast_forward: bool = True, watch: Watch | None = None,
                 device_speed: Callable[[float], float] | None = None, due: Due | None = None,
                 routed: bool = False, async_scheduling: bool = False) -> None:
        self.env = env
        self.scheduler = scheduler
        self.allocator = scheduler.allocator
        self.cost_model = cost_model
        self.executor = executor
        self.total = total
        self.progress = progress
        self.fast_forward = fast_forward
        self.watch = watch
        self.device_speed = device_speed
        self.fast_forwarded_steps = 0      # steps taken inside fast-forward windows and the decode batch
        self.due = due or Due()            # the next arrival (to this engine, or with `routed` to any)
        # Routed: a router picks the engine of each request when it arrives, so the engine cannot know
        # its next arrival; its windows run on and a request routed to it cuts them (`cut`).
        self.routed = routed
        self.arrivals_done = False
        self.idle: simpy.Event | None = None   # set while the engine sleeps, waiting for work
        # Whether blocks this engine lent out will come back (a P/D prefill replica's, held until the
        # decode side reads them: planner/sim/pd.py); requests that wait for them are not a stall.
        self.blocks_lent: Callable[[], bool] | None = None
        # a closed loop's (planner/sim/clients.py): told the requests that ended, and which of them were refused
        self.on_ended: Callable[[list[str], set[str]], None] | None = None
        self.process: simpy.Process | None = None
        self.pending = None                # the window or batch plan the engine sleeps through
        self.wake_at = 0.0
        self.batch: DecodeBatch | None = None
        self.backoff = 0                   # steps to take before trying a decode batch again
        self.backoff_next = 1
        self.groups: list[SequenceGroup | ParentRequest] = []   # every request submitted, in arrival order
        # vllm-v1 runs a request with n > 1 as n child requests (engine/core/parallel_sampling.py); `parents`
        # turns the children that end into the requests that end. A prefill pool sets `fan_out` off.
        self.parents = Parents()
        self.fan_out = scheduler.config.vllm_v1
        self.ended_at: list[float] = []    # when each ended request ended, in that order
        self.done = 0
        self.steps = StepLog(block_size=scheduler.allocator.block_size,   # a plan's records built when read
                             num_gpu_blocks=scheduler.allocator.num_gpu_blocks)
        self.plans_taken: list[PlanTaken] = []   # the decode plans whose steps it took, in order
        self.shapes = ShapeLog()           # StepShapes, a priced plan's built only when read
        self.num_running: list[int] = []
        self.v1 = scheduler.config.vllm_v1
        self.prefill_held_tokens = 0       # tokens of the sequences in prefill steps
        self.prefill_cached_tokens = 0     # of those, already in the KV cache (prefix hits)
        self.logical_token_time = 0.0      # sum over decode steps of (tokens of the batch) x duration
        self.physical_token_time = 0.0     # same, counting each shared KV slot once
        # What a router sees of this engine (planner/sim/router.py): the requests routed here, the
        # blocks in use at the start, and, when the block pool logs its KV events, those events per
        # step end and the prefix cache they describe up to the last step a router can know of.
        self.routed_count = 0
        self.initial_blocks_used = self.allocator.num_used_blocks()
        # (end, blocks in use) after each step or run of steps that could end requests, as vLLM publishes its
        # KV-cache usage: make_stats runs after update_from_output has freed the finished requests' blocks.
        self.published_used: list[tuple[float, int]] = []
        # (end, waiting, running) after each step or run of steps, as vLLM's engine core sends its request
        # counts to the data-parallel coordinator (`_maybe_publish_request_counts`, after each step).
        self.published_counts: list[tuple[float, int, int]] = []
        self.run_counts = (0, 0)               # (waiting, running) as the run of steps slept through began
        self.queued_at: list[float] = []       # when each request submitted straight to the waiting queue came
        self.kv_events: deque | None = None
        self.published: set[int] = set()
        self.speculation: SpecRuntime | None = None   # speculative decoding's shapes and proposer price
        # vLLM's async scheduling schedules each step as the one before it starts (see `_admit_held`):
        # a request that arrives while a step runs waits out the schedule already made.
        self.async_scheduling = async_scheduling
        self.held: list[tuple[float, SequenceGroup]] = []   # (arrival, request) not yet in a schedule
        self.last_start = 0.0                      # when the last step taken began
        # The data-parallel ranks of a MoE deployment step together (planner/sim/lockstep.py): their group
        # then runs this engine's steps, sleeps and cuts.
        self.group = None

    def release(self) -> None:
        """Let go of what a finished run coordinated through this engine: its scheduler (with the block pool
        and caches), executor and cost model, and the callbacks of a closed loop, a lockstep group or a P/D
        pool. Those hold the engine as it holds them, and the cycles would outlive the run in a process that
        goes on (the collector, paused for runs, leaves them to a full collection that seldom comes):
        hundreds of MiB a run for a large KV cache. Cut here, reference counting frees it all once the
        caller lets the engine go. The run's records (steps, shapes, groups) stay the result's."""
        self.scheduler = self.allocator = self.executor = self.cost_model = None
        self.on_ended = self.blocks_lent = self.group = self.watch = self.progress = None
        self.process = self.pending = self.batch = self.idle = None

    @property
    def horizon(self) -> float:
        """Windows stop before the step that starts at or after this (and `ahead` steps after it): the
        next arrival they know of, or, while requests wait out the schedule made without them
        (`_admit_held`), the step after this one. A replica routed as requests come does not know its next
        one (it could go elsewhere), but a lockstep group's ranks stop at the next request of the group: a
        request cuts a rank's run anyway, and most requests go to one of a few ranks."""
        if self.held:
            return math.nextafter(self.env.now, math.inf)
        return math.inf if self.routed and self.group is None else self.due.at

    @property
    def ahead(self) -> int:
        """Steps a plan takes past the horizon's: one with a step scheduled ahead when the next request
        arrives (it joins the schedule made at that step's end); none while held requests wait for the
        step now starting to end."""
        return 0 if self.held else self.scheduled_ahead()

    def scheduled_ahead(self) -> int:
        """1 when the engine schedules a step ahead: async scheduling with requests to run (vLLM schedules
        nothing past a request's last token: an engine left without any runs a request that arrives in
        the next schedule)."""
        return 1 if self.async_scheduling and self.scheduler.has_unfinished() else 0

    def ended(self, requests: list) -> None:
        """These requests (groups or parents) ended now (finished, rejected or truncated); in a closed loop
        each one's client sends its next request."""
        if not requests:
            return
        self.done += len(requests)
        self.ended_at.extend(repeat(self.env.now, len(requests)))
        if self.on_ended is not None:
            self.on_ended([r.request_id for r in requests],
                          {r.request_id for r in requests if r.finish_reason is FinishReason.REJECTED})

    def submit(self, group: SequenceGroup) -> SequenceGroup | ParentRequest:
        """`group` joins the queue (under vllm-v1 with n > 1, as n child requests); returns the request
        the records follow: `group`, or the children's parent."""
        enqueue = self._hold if self.async_scheduling and self.idle is None else self.scheduler.add
        queued = len(self.scheduler.waiting)
        if self.fan_out and fans_out(group.params):
            self.groups.append(self.parents.fan_out(group, enqueue))
        else:
            self.groups.append(group)
            enqueue(group)
        if self.routed:
            self.queued_at.extend(repeat(self.env.now, len(self.scheduler.waiting) - queued))
        idle = self.idle
        if idle is not None:
            if not idle.triggered:         # a lockstep group's ranks share one (another rank's request woke it)
                idle.succeed()
            self.idle = None
        elif self.routed:
            self.cut(self.env.now)
        return self.groups[-1]

    def _hold(self, group: SequenceGroup) -> None:
        """Keep a request that arrived while a step runs until a schedule can take it (`_admit_held`)."""
        self.held.append((self.env.now, group))

    def cut(self, t: float) -> None:
        """A request arrived at `t`: keep only the steps of the plan slept through that start before it
        (and under async scheduling the one after them, scheduled already)."""
        if self.group is not None:
            self.group.cut(t, self.scheduled_ahead())
            return
        pending = self.pending
        if pending is None:
            return
        ends = pending.ends
        keep = kept_before(pending.start, ends, t, self.scheduled_ahead(), cut=True)
        if keep < len(ends):
            pending.truncate(keep)
            self.wake_at = ends[-1] if keep else pending.start
            self.process.interrupt()

    # -- what a router sees: each engine as it published itself at its last step end before `t` ----

    def ended_before(self, t: float) -> int:
        """Requests that ended (finished, rejected, truncated) before `t`."""
        return bisect.bisect_left(self.ended_at, t)

    def blocks_used_before(self, t: float) -> int:
        """KV blocks in use after the last step that ended before `t`, its finished requests' blocks freed
        (vLLM's KV-cache usage gauge, updated once per step, as the live fleet reads it); a step slept
        through in bulk counts from its plan. Only a run's last step ends requests, so the steps before it
        publish the blocks they ran with."""
        pending = self.pending
        if pending is not None and pending.ends and pending.ends[0] < t:
            return self.allocator.num_used_blocks() + pending.taken(bisect.bisect_left(pending.ends, t))
        last = self.steps.last_before(t)
        if last is None:
            return self.initial_blocks_used
        published = self.published_used
        i = bisect.bisect_left(published, (t, -1)) - 1
        return published[i][1] if i >= 0 and published[i][0] == last[0] else last[1]

    def request_counts_before(self, t: float) -> tuple[int, int]:
        """(waiting, running) requests after the last step that ended before `t`. A run of steps slept
        through is logged at its first step's end and at its last's: nothing joins or leaves in between (a
        request reaching the engine cuts the run at the step it arrived in; only the last step finishes
        requests); a run still slept through reads as it began."""
        pending = self.pending
        if pending is not None and pending.ends and pending.ends[0] < t:
            return self.run_counts
        counts = self.published_counts
        i = bisect.bisect_left(counts, (t,)) - 1
        return (counts[i][1], counts[i][2]) if i >= 0 else (0, 0)

    def cached_prefix_before(self, hashes: list[int], t: float) -> int:
        """How many of a prompt's leading block hashes the prefix cache held, as its KV events
        published it up to the last step that ended before `t`."""
        self._sync(t)
        while self.kv_events and self.kv_events[0][0] < t:
            for stored, h in self.kv_events.popleft()[1]:
                if stored:
                    self.published.add(h)
                else:
                    self.published.discard(h)
        published, (dropped, added) = self.published, self._plan_events(t)
        held = 0
        for h in hashes:
            if h not in added and (h not in published or h in dropped):
                break
            held += 1
        return held

    def _plan_events(self, t: float) -> tuple[set[int], set[int]]:
        """The prefix hashes the steps of the decode plan slept through that ended before `t` drop from and
        add to the cache, those steps not yet taken (`DecodeBatch.plan_events`)."""
        plan = self.pending
        if not isinstance(plan, Plan) or not plan.ends or plan.ends[0] >= t:
            return set(), set()
        return self.batch.plan_events(plan, bisect.bisect_left(plan.ends, t))

    def log_kv_events(self) -> None:
        """Keep the block pool's KV events, tagged with the end of the step that made them."""
        self.kv_events = deque()
        self.allocator.gpu.events = []

    def _tag_events(self, end: float) -> None:
        publish_events(self.kv_events, self.allocator.gpu.events, end)

    def _sync(self, t: float) -> None:
        """Take now the steps of a window slept through that ended before `t` (their KV events)."""
        window = self.pending
        if isinstance(window, Window) and window.ends[0] < t:
            head = window.split(bisect.bisect_left(window.ends, t), self.allocator.block_size)
            records, _ = self._apply_window(head)
            self._took(records, head.shapes)
            self.took_steps(head.start, head.ends)

    def _apply_window(self, window: Window):
        tag = None
        if self.kv_events is not None:
            ends = window.ends
            tag = lambda j: self._tag_events(ends[j - 1])   # noqa: E731
        result = apply_window(window, self.scheduler, self.executor.window_samples(window.groups, window.steps),
                              tag)
        if self.kv_events is not None:
            self._tag_events(window.ends[-1])
        return result

    def run(self):
        """The engine process: the decode batch or a fast-forward window when one is proven, else one
        step; asleep when idle."""
        env = self.env
        step_time = self.cost_model.step_time
        histogram = reads_context_histogram(self.cost_model)   # build decode histograms only for a model that reads them
        while True:
            if self.held:
                self._admit_held()
            move = self.next_move(step_time, histogram, self.horizon, ahead=self.ahead)
            kind = move.kind
            if kind is STEP:
                self.last_start = env.now
                yield env.timeout(move.price)
                end = env.now
                yield from self._stepped(1, end, move.finish(end))
            elif kind is PLAN:
                yield from self.run_plan(move.plan)
            elif kind is WINDOW:
                yield from self.run_window(move.plan)
            elif (yield from self.wait_for_work(move.out)):
                return

    def next_move(self, step_time: Callable[[StepShape], float], histogram: bool, horizon: float,
                  windows: bool = True, ahead: int = 0) -> Move:
        """What the engine does next from now: a plan of the decode batch (none of its steps starting at
        or after `horizon` but the `ahead` first of those), a fast-forward window (with `windows`; none
        starting at or after `horizon`), a step, or nothing."""
        if self.fast_forward:
            move = self._batch_move(step_time, histogram, horizon, ahead)
            if move is not None:
                if move.kind is PLAN:
                    self._run_begins()
                return move
            if windows and not self.v1:   # windows assume the paper's policy
                window = plan_window(self.scheduler, step_time, self.env.now, horizon, histogram=histogram)
                if window is not None:
                    self._run_begins()
                    return Move(WINDOW, plan=window)
        step = begin_step(self.scheduler, self.env.now)
        if not step.has_work:
            return Move(IDLE, out=step.out)
        # The shape before update, which marks the step's tokens computed.
        shape = (step_shape(step.out, histogram) if self.speculation is None
                 else self.speculation.shape(step.out, histogram))
        return self._step_move(step, shape, step_time)

    def _admit_held(self, all_now: bool = False) -> None:
        """A schedule under async scheduling. vLLM's engine core (vllm/v1/engine/core.py
        `step_with_batch_queue`, two batches in flight) schedules step N+1 right after it launches
        step N, and takes in the requests that reached it only when step N's outputs are back, just
        before it schedules step N+2: a request that arrives while step N runs joins step N+2, one step
        later than without async scheduling. Here the schedule at the end of the last step taken is the
        next step's, made without the requests held since that step began; those that arrived before it
        join now. When nothing was left to schedule ahead (vLLM does not schedule a request past its last
        token), the engine had no step in flight and they all join this one."""
        held = self.held
        if all_now or not self.scheduler.has_unfinished():
            ready, self.held = held, []
        else:
            waiting = next((i for i, (arrival, _) in enumerate(held) if arrival > self.last_start), len(held))
            ready, self.held = held[:waiting], held[waiting:]
        for _, group in ready:
            self.scheduler.add(group)

    def _batch_move(self, step_time: Callable[[StepShape], float], histogram: bool, horizon: float,
                    ahead: int = 0) -> Move | None:
        """The decode batch's next move (planner/sim/batch.py): a plan of decode steps, or a step that
        admits prompts; None when the batch cannot take the next step (the scheduler's then)."""
        batch = self.batch
        if batch is None:
            if self.backoff:
                self.backoff -= 1
                return None
            batch = self.batch = DecodeBatch.build(self.scheduler, self.executor, histogram, self.cost_model,
                                                   cuttable=self.routed or self.group is not None,
                                                   kv_events=self.kv_events if self.group is None else False)
            if batch is None:
                self._back_off()
                return None
        plan = batch.plan(self.env.now, horizon, step_time, ahead=ahead)
        if plan is not None:
            move = Move(PLAN, plan=plan)
        elif batch.can_mix():
            move = self._mixed_move(batch, step_time)
        elif batch.can_prefill():
            step = begin_step(self.scheduler, self.env.now)
            move = self._step_move(step, step_shape(step.out, histogram), step_time, batch)
        else:
            self.drop_batch()
            self._back_off()
            return None
        self.backoff_next = 1
        return move

    def _back_off(self) -> None:
        """Outside the batch's proof: step without it for a while (longer each time it fails again)."""
        if self.scheduler.running:
            self.backoff = self.backoff_next
            self.backoff_next = min(2 * self.backoff_next, 64)

    def drop_batch(self) -> None:
        """Write the batch's requests up to date and hand the scheduler back to step-by-step simulation."""
        if self.batch is not None:
            self.batch.release()
            self.batch = None

    def settle(self, out) -> bool:
        """A step with nothing to compute: count what the scheduler ended itself; True to look again now."""
        ended = self.parents.ended(out.finished_now)
        self.ended(ended)
        if self.watch is not None and ended:
            self.watch(self, self.env.now, ended)
        if out.rejected or out.truncated or out.preempted:
            return True                        # the scheduler ended or preempted requests itself
        if self.held:                          # nothing ran, so nothing was scheduled ahead: they join now
            self._admit_held(all_now=True)
            return True
        return False

    def check_done(self) -> bool:
        """Are all requests sent and ended? (Requests left that the scheduler can neither run nor reject
        once all are sent: an error.)"""
        if not self.arrivals_done:
            return False
        if self.scheduler.has_unfinished():
            if self.blocks_lent is not None and self.blocks_lent():
                return False                   # it sleeps until they come back (their release wakes it)
            raise PlannerError(f"the scheduler stalled with {self.scheduler.num_unfinished()} "
                               f"requests it can neither run nor reject")
        return True

    def wait_for_work(self, out):
        """A step with nothing to compute: count what the scheduler ended itself, then look again, sleep
        until the next arrival, or (True) end the run once every request is done."""
        if self.settle(out):
            return False
        if self.check_done():
            return True
        self.idle = self.env.event()
        yield self.idle                        # sleep until the next request arrives
        return False

    def _step_move(self, step, shape: StepShape, step_time: Callable[[StepShape], float],
                   batch: DecodeBatch | None = None) -> Move:
        """One step of `shape`, priced; its `finish` hands the scheduler its tokens and records it (and,
        for a step that admits prompts beside the decode `batch`, drops the batch if they do not join it)."""
        env, scheduler, allocator, out = self.env, self.scheduler, self.allocator, step.out
        start = env.now
        num_running = len(scheduler.running)
        if self.v1:
            physical = allocator.token_slots_used() if shape.prefill_tokens == 0 else 0
        elif out.is_prefill:
            physical = 0
            # Prompt tokens a prefix-cache hit spared: held by each sequence, not computed.
            held = sum(len(s.token_ids) for s in out.seqs)
            self.prefill_held_tokens += held
            self.prefill_cached_tokens += held - shape.prefill_tokens
        else:
            physical = allocator.token_slots_used()
        price = step_time(shape)
        extra = self.speculation.proposer_seconds(out, shape) if self.speculation is not None else 0.0
        if extra:
            price += extra

        def finish(end: float) -> list:
            # A partial prompt chunk samples nothing: only the sampling part gets tokens.
            finished, record = end_step(scheduler, step, self.executor.samples(out.sampling_part()), end)
            if self.kv_events is not None:
                self._tag_events(end)
            self.steps.append(record)
            self.shapes.append(shape)
            self.num_running.append(num_running)
            if not out.is_prefill and out.seqs and shape.prefill_tokens == 0:
                # Sharing is measured on decode steps, where every sequence with KV
                # on the GPU is in the batch holding exactly its tokens: their sum
                # against the slots they really occupy.
                self.logical_token_time += shape.decode_context * (end - start)
                self.physical_token_time += physical * (end - start)
            if batch is not None and self.batch is not None and not batch.joined(out.groups):
                self.drop_batch()
            return finished

        return Move(STEP, price * self.device_speed(start) if self.device_speed is not None else price, finish,
                    shape=shape, extra=extra)

    def _stepped(self, count: int, end: float, finished: list[SequenceGroup]):
        """After `count` steps ending at `end`: what `after_steps` does; and if a request is due at this
        very instant, one yield so it joins before the next schedule (SimPy runs same-time events in
        creation order)."""
        self.after_steps(count, end, finished)
        if self.due.at <= end:
            yield self.env.timeout(0)

    def after_steps(self, count: int, end: float, finished: list[SequenceGroup]) -> None:
        """After `count` steps ending at `end`: the requests they ended, progress, the watch."""
        if self.routed:
            self.published_used.append((end, self.allocator.num_used_blocks()))
            # vLLM's engine core takes in the requests that reached it during a step only after sending its
            # counts: those queued since the last step began are not counted yet.
            late = len(self.queued_at) - bisect.bisect_right(self.queued_at, self.last_start)
            self.published_counts.append((end, len(self.scheduler.waiting) - late, len(self.scheduler.running)))
        finished = self.parents.ended(finished)
        self.ended(finished)
        taken = len(self.steps)
        if self.progress is not None and taken // PROGRESS_EVERY != (taken - count) // PROGRESS_EVERY:
            self.progress(end, self.done, self.total)
        if self.watch is not None:
            self.watch(self, end, finished)

    def _took(self, records: list[StepRecord], shapes: list[StepShape]) -> None:
        """Record a window's decode steps, taken in bulk (every running request in each)."""
        logical, physical = self.logical_token_time, self.physical_token_time
        for record, shape in zip(records, shapes):
            duration = record.end - record.start
            logical += shape.decode_context * duration
            physical += record.token_states * duration
        self.logical_token_time, self.physical_token_time = logical, physical
        self.shapes.extend(shapes)
        self.steps.extend(records)
        self.num_running.extend(repeat(records[0].batch_size, len(records)))   # the same in each
        self.fast_forwarded_steps += len(records)

    def _took_plan(self, plan: Plan, num: int) -> None:
        """Record a plan of the decode batch's `num` members, taken: its steps and shapes as the plan
        (built when read), the token-time sums step by step as its records hold them."""
        taken = PlanTaken.of(plan, len(self.steps), len(plan.ends), num)
        self.plans_taken.append(taken)
        self.steps.add_plan(taken)
        plan.log_shapes(self.shapes)
        logical, physical = self.logical_token_time, self.physical_token_time
        start, tokens = plan.start, plan.token_states
        for end, context in zip(plan.ends, plan.contexts()):
            duration = end - start
            tokens += num
            logical += context * duration
            physical += tokens * duration
            start = end
        self.logical_token_time, self.physical_token_time = logical, physical
        self.num_running.extend(repeat(num, len(plan.ends)))
        self.fast_forwarded_steps += len(plan.ends)

    def step_columns(self) -> dict:
        """metrics.step_columns(self.steps): the plans' steps from the plans in bulk, the rest read."""
        if not self.plans_taken:
            return step_columns(self.steps)
        import numpy as np
        at, planned = plan_columns(self.plans_taken, self.allocator)
        rest = np.ones(len(self.steps), dtype=bool)
        rest[at] = False
        rest = np.flatnonzero(rest)
        kept = self.steps.kept_records()
        read = step_columns(kept if kept is not None else [self.steps[i] for i in rest.tolist()])
        columns = {}
        for name, values in planned.items():
            column = columns[name] = np.empty(len(self.steps), dtype=values.dtype)
            column[at] = values
            column[rest] = read[name]
        return columns

    def run_window(self, window: Window):
        """Sleep through a fast-forward window's decode steps, then take them: the core's state, the
        records (a request routed here meanwhile cuts the window short)."""
        self.pending = window
        yield from self.sleep_until(window.ends[-1])
        self.pending = None
        if not window.steps:
            return
        self.took_steps(window.start, window.ends)
        self._published_run(window.ends)
        records, finished = self._apply_window(window)
        self._took(records, window.shapes)
        yield from self._stepped(len(records), window.ends[-1], finished)

    def run_plan(self, plan: Plan):
        """Sleep through a plan of the decode batch, then take its steps (a request routed here
        meanwhile cuts it short)."""
        self.pending = plan
        yield from self.sleep_until(plan.ends[-1])
        self.pending = None
        if not plan.steps:
            return
        self.took_steps(plan.start, plan.ends)
        yield from self._stepped(len(plan.ends), plan.ends[-1], self.take_plan(plan))

    def took_steps(self, start: float, ends: list[float]) -> None:
        """Steps from `start` ending at `ends` were taken (for `_admit_held`: when the last began)."""
        self.last_start = ends[-2] if len(ends) > 1 else start

    def _run_begins(self) -> None:
        """A run of steps to sleep through starts: the requests waiting and running in all its steps but
        the last (which may end some), as a router reads them."""
        if self.routed:
            self.run_counts = (len(self.scheduler.waiting), len(self.scheduler.running))

    def _published_run(self, ends: list[float]) -> None:
        """The counts a run of steps published before its last step's (`after_steps` logs that one)."""
        if self.routed and len(ends) > 1:
            self.published_counts.append((ends[0], *self.run_counts))

    def take_plan(self, plan: Plan) -> list:
        """Take the steps of a plan slept through; returns the requests they finished."""
        self._published_run(plan.ends)
        members = len(self.batch.members)
        finished = self.batch.apply(plan)
        self._took_plan(plan, members)
        return finished

    def _mixed_move(self, batch: DecodeBatch, step_time: Callable[[StepShape], float]) -> Move:
        """vLLM v1's step that decodes the batch and admits prompts, through the batch."""
        step = batch.mix(self.env.now)

        def finish(end: float) -> list:
            finished, ok = batch.mixed(step, end)
            if self.kv_events is not None:
                self._tag_events(end)
            record, shape = step.record, step.shape
            self.steps.append(record)
            self.shapes.append(shape)
            self.num_running.append(step.num_running)
            self.fast_forwarded_steps += 1
            if shape.prefill_tokens == 0:          # nothing admitted: a decode step
                self.logical_token_time += shape.decode_context * (end - record.start)
                self.physical_token_time += record.token_states * (end - record.start)
            if not ok:
                self.drop_batch()
            return finished

        return Move(STEP, step_time(step.shape), finish, shape=step.shape)


class WakeAt(simpy.events.Timeout):
    """A timeout that fires at the absolute time `at`, exactly. SimPy fires a timeout at now + delay,
    and some times cannot be reached that way: when the delay and `at` share a binade and now holds a
    half of `at`'s last bit, every sum is a tie rounded to even and every other float is skipped. A
    slept-through plan must end at the very float a step-by-step run reaches by adding each step's
    duration, so it is pushed onto SimPy's queue at that time (its private queue: SimPy has no public
    call for an absolute time)."""

    def __init__(self, env: simpy.Environment, at: float):
        simpy.events.Event.__init__(self, env)
        self._ok, self._value, self._delay = True, None, at - env.now
        heapq.heappush(env._queue, (at, simpy.events.NORMAL, next(env._eid), self))


def arrivals(env: simpy.Environment, trace: Trace, engine: SimulatedEngine):
    """Release each trace request at its arrival time."""
    due = engine.due
    for req in trace.requests:
        delay = req.arrival_time - env.now
        if delay > 0:
            due.at = env.now + delay          # exactly the env.now SimPy will wake us at
            yield env.timeout(delay)
            due.at = math.inf
        engine.submit(engine.executor.make_group(req))
    engine.arrivals_done = True


def check_adapters_served(dep, trace: Trace) -> None:
    """A trace whose requests run LoRA adapters needs a deployment that serves them (vLLM's server would answer
    them "model does not exist")."""
    if not dep.enable_lora and any(r.lora for r in trace.requests):
        raise PlannerError("the trace's requests run LoRA adapters (their `lora`): give --enable-lora (and "
                           "--max-loras, --max-lora-rank as the server runs them)")


def make_engine(env: simpy.Environment, trace: Trace, plan: DeploymentPlan, cost_model: CostModel, *, seed: int,
                total: int, progress: Progress | None = None, fast_forward: bool = True, watch: Watch | None = None,
                device_speed: Callable[[float], float] | None = None, due: Due | None = None,
                routed: bool = False, start: bool = True) -> SimulatedEngine:
    """One engine as `plan` deploys it: its KV allocator, scheduler and executor, its process started
    (unless not `start`: a lockstep group runs it)."""
    dep = plan.deployment
    if dep.vllm_v1 and any(r.beam_width > 1 for r in trace.requests):
        raise PlannerError(BEAM_SEARCH_REFUSAL)
    check_adapters_served(dep, trace)
    GUARD.check(lambda: "while building its engines (one per replica, each with its own block tables)")
    spec = speculation_of(dep)
    private = dep.vllm_v1 and dep.enable_prefix_caching and spec is None
    if private:     # vLLM v1's, its sampled blocks keyed when their request comes back (or a tier stores them)
        allocator = PrivateBlockManager(plan.block_size, plan.num_gpu_blocks, state_blocks=plan.state_blocks,
                                        offload_blocks=plan.offload_blocks)
    elif dep.vllm_v1:  # vLLM v1's block order, so prefix hits match vLLM's
        allocator = VllmBlockManager(plan.block_size, plan.num_gpu_blocks, enable_prefix_caching=dep.enable_prefix_caching,
                                     state_blocks=plan.state_blocks, offload_blocks=plan.offload_blocks)
    else:
        allocator = make_allocator(dep.allocator, block_size=dep.block_size, num_gpu_blocks=plan.num_gpu_blocks,
                                   num_cpu_blocks=plan.num_cpu_blocks, max_model_len=plan.max_model_len,
                                   enable_prefix_caching=dep.enable_prefix_caching)
    pipelined = dep.pp > 1
    if pipelined:      # batches in flight: the scheduler counts their tokens computed (planner/sim/pipeline.py)
        scheduler = PipelinedScheduler(plan.scheduler_config(), allocator)
        fast_forward = False
    else:
        scheduler = make_scheduler(plan.scheduler_config(), allocator)
    if spec is None:
        executor = SyntheticExecutor(trace, vocab_size=plan.model.vocab_size, seed=seed,
                                     real_token_ids=dep.enable_prefix_caching,
                                     private_blocks=allocator if private else None)
    else:   # the engine scheduler's own speculation; steps one at a time (see the module docstring)
        enable_speculation(scheduler, spec, seed)
        executor = SpeculatingExecutor(trace, vocab_size=plan.model.vocab_size, seed=seed,
                                       real_token_ids=dep.enable_prefix_caching, spec=spec)
        fast_forward = False
    engine = SimulatedEngine(env, scheduler, cost_model, executor, total, progress,
                             fast_forward=fast_forward and device_speed is None, watch=watch,
                             device_speed=device_speed, due=due, routed=routed,
                             async_scheduling=dep.async_scheduling and not pipelined)   # pp: its batch queue
    if spec is not None:
        engine.speculation = SpecRuntime(spec, cost_model, draft_cost_model(plan))
    if start:
        stages = Stages.of(plan.model, plan.gpu, dep.tp, dep.pp, plan.dtype_bytes, dep.node_link) if pipelined else None
        engine.process = env.process(pipelined_run(engine, stages, cost_model.step_time) if pipelined
                                     else engine.run())
    return engine


@contextmanager
def collector_paused():
    """The cyclic garbage collector off for a while (as it was after): a run allocates millions of
    small, acyclic objects (requests, token lists, records), which the collector would rescan again
    and again for nothing, along with every earlier run's results still held.

    On the way out what was made meanwhile goes to the oldest generation unscanned (freeze, then
    unfreeze): turned on with millions of objects in the youngest, the collector would scan them all
    at the next allocation and again as they age (0.3 s at the end of the DP2 x EP2 hour of
    bench/bench_moe_speed.py). Unscanned, anything a run left in a reference cycle would stay for good, so
    a run leaves none: its engines are released at its end (`SimulatedEngine.release`, run_quietly) and
    the cost models keep no closure over themselves (tests/test_sim_releases_memory.py); reference
    counting frees the rest when it is let go."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.freeze()
            gc.unfreeze()
            gc.enable()


def run_quietly(env: simpy.Environment, until_done: Callable[[], object], release: Callable[[], None]):
    """Run the simulation, then `until_done()` (the records), with the garbage collector paused; then
    `release()` the engines and what coordinated them (`SimulatedEngine.release`)."""
    try:
        with collector_paused():
            env.run()
            return until_done()
    finally:
        release()


def simulate(trace: Trace, plan: DeploymentPlan, cost_model: CostModel, *, seed: int = 0,
             concurrency: int | None = None, paced: bool = False, fast_forward: bool = True,
             progress: Progress | None = None, watch: Watch | None = None,
             device_speed: Callable[[float], float] | None = None) -> SimResult:
    """Run `trace` through the engine core, as `plan` deploys it, on a SimPy clock priced by `cost_model`.

    `concurrency` N: a closed loop of N clients, each sending the trace's next
    request when its previous one ends (the deployment's `client_turnaround`
    after it; the trace's times do not count unless `paced`: then each request
    is sent at its trace time or, with N out, when one ends); None: every
    request at its trace time. `fast_forward` (the default) takes
    provably uneventful decode steps in bulk; False steps one at a time. Both give the same results. `seed` draws
    the sampled tokens. `watch` sees every step and may end the run by
    raising (see `Watch`). `device_speed(t)` scales the price of a step that
    starts at t: the speed a validated live run's device had then
    (planner.profile.speed.SpeedTimeline); it steps one at a time, since a
    window prices its steps before their start times are known."""
    wall_start = time.perf_counter()
    check_replicas(1, plan.simulated_blocks)
    env = simpy.Environment()
    engine = make_engine(env, trace, plan, cost_model, seed=seed, total=len(trace), progress=progress,
                         fast_forward=fast_forward, watch=watch, device_speed=device_speed)
    loop = make_clients(env, trace.requests, lambda req, at: engine.submit(engine.executor.make_group(req, arrival=at)),
                        concurrency=concurrency, deployment=plan.deployment, seed=seed, due=engine.due,
                        all_sent=lambda: setattr(engine, "arrivals_done", True), paced=paced)
    if loop is None:
        env.process(arrivals(env, trace, engine))
    else:
        engine.on_ended = loop.ended
        loop.start()

    def records() -> SimResult:
        if progress is not None:
            progress(env.now, engine.done, len(trace))
        check_all_ended(engine.groups, len(trace) - unsent(loop))
        warm = unmeasured(loop)          # (a warm-up's requests out of the figures)
        return replica_result(plan, cost_model, trace, seed, engine,
                              [RequestRecord.from_group(g, plan.deployment.stream_interval) for g in engine.groups
                               if g.request_id not in warm])

    result = run_quietly(env, records, engine.release)
    result.concurrency = concurrency
    result.wall_time = time.perf_counter() - wall_start
    return result


def check_all_ended(groups: list[SequenceGroup], total: int) -> None:
    if len(groups) != total or any(g.finish_reason is None for g in groups):
        raise PlannerError("the simulation ended with requests neither completed nor rejected")


def prefix_counts(engine: SimulatedEngine) -> tuple[int, int]:
    """(prompt tokens found in the prefix cache, prompt tokens looked up) of an engine's run."""
    scheduler = engine.scheduler
    if scheduler.config.vllm_v1:       # counted at admission, as vLLM counts them
        return scheduler.prefix_hit_tokens, scheduler.prefix_queried_tokens
    return engine.prefill_cached_tokens, engine.prefill_held_tokens


def replica_result(plan: DeploymentPlan, cost_model: CostModel, trace: Trace, seed: int, engine: SimulatedEngine,
                   records: list[RequestRecord] | None = None, columns: dict | None = None,
                   gaps: TokenGaps | None = None) -> SimResult:
    """One engine's result (`records`: its requests' records, `columns` its steps' step_columns, `gaps`
    the TokenGaps of its requests or more, when the caller made them)."""
    scheduler = engine.scheduler
    if records is None:
        records = [RequestRecord.from_group(g, plan.deployment.stream_interval) for g in engine.groups]
    hit, held = prefix_counts(engine)
    return SimResult(
        plan, cost_model.name, trace.name, json_safe(trace.params),
        summarize(records, engine.steps, scheduler.preemptions,
                  engine.step_columns() if columns is None else columns, gaps),
        records, engine.steps, engine.shapes, engine.num_running,
        sharing_saved=(1 - engine.physical_token_time / engine.logical_token_time
                       if engine.logical_token_time > 0 else 0.0),
        prefix_cache_hit_tokens=hit, prefix_cache_hit_rate=hit / held if held else 0.0,
        kv_blocks_used_at_end=scheduler.allocator.num_used_blocks(), simulated_time=engine.env.now,
        wall_time=0.0, fast_forwarded_steps=engine.fast_forwarded_steps, seed=seed,
        spec_decoding=spec_decoding(engine), kv_offload=offload_summary(plan, [engine]))


def offload_summary(plan: DeploymentPlan, engines: list[SimulatedEngine]) -> dict | None:
    """result.json's `kv_offload`: the CPU tier's size, its hits, the blocks it loaded and stored (summed over
    the engines), and the share of each GPU's host link their copies took over the run; None without a tier."""
    tiers = [getattr(e.scheduler.allocator, "offload", None) for e in engines]   # (the paper's baselines have none)
    if tiers[0] is None:
        return None
    stats = OffloadStats.total([t.stats for t in tiers])
    moved = (stats.blocks_loaded + stats.blocks_stored) * plan.block_bytes_per_gpu
    busy = max(e.env.now for e in engines) * len(engines) * plan.gpu.host_link_bandwidth
    return {"cpu_blocks": tiers[0].num_blocks, "kv_offloading_size_gib": plan.deployment.kv_offloading_size,
            **stats.as_dict(), "host_link_utilization": moved / busy if busy else 0.0}


def spec_decoding(engine: SimulatedEngine) -> dict | None:
    """result.json's `spec_decoding_stats`: the scheduler's counters (vLLM's names: num_drafts,
    num_draft_tokens, num_accepted_tokens, num_accepted_tokens_per_pos, acceptance_rate,
    acceptance_rate_per_pos, mean_acceptance_length), the curve they were drawn from and the
    expected mean acceptance length it gives, and the seconds the proposer added to the steps."""
    return fleet_spec_decoding([engine])


def fleet_spec_decoding(engines: list[SimulatedEngine]) -> dict | None:
    """`spec_decoding_stats` over several engines (a fleet's replicas): their counters summed."""
    runtimes = [e.speculation for e in engines if e.speculation is not None]
    if not runtimes:
        return None
    first, *others = [e.scheduler.spec_stats for e in engines]
    total = first.merged(others)
    return {**runtimes[0].spec.as_dict(), **total.as_dict(),
            "proposer_seconds": sum(r.proposer_time for r in runtimes)}
