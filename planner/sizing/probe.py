"""One probe of a capacity search: simulate a configuration at one rate and judge it against the SLOs.

The verdict is `planner.runs.spec.meets` on the run's metrics, exactly as
`planner capacity` judges its probes, but cheaper in two ways:

- The configuration, its cost model and the checks are built once per
  configuration, not once per probe, and only what the verdict reads is
  computed afterwards (the metrics and whether requests keep piling up), not
  the whole analysed report.
- A probe stops as soon as its verdict is certain (`SloWatch`): a rejected or
  truncated request fails it, and so do enough requests above a percentile
  SLO's limit. For a q-th percentile over n requests (linear interpolation, as
  engine/core/metrics.py computes it) the value exceeds the limit once the
  sorted values from rank floor((n-1)q/100) up all do, i.e. once
  n - floor((n-1)q/100) requests are above it: 13 of 1,200 for a p99. A request
  counts as above a TTFT (or E2E) limit L as soon as it has waited L without a
  first token (or without finishing): whatever happens later, its value only
  grows. TPOT counts at completion. An overloaded probe, whose requests pile
  up without bound, piles up TTFT violations early and stops after a fraction
  of its trace; a probe that meets its SLOs always runs to the end. Judged by
  an SLO attainment A instead (`AttainmentWatch`), a request misses once any of
  its limits is certainly passed (the same deadlines, the rest at completion, a
  rejection or truncation), and the probe fails once fewer than A n of the n
  requests can still be within them all.

A probe judges a steady state, so its trace must be long enough to reach one.
The engine starts empty and fills up for about one request latency; a steady
window shorter than STEADY_LATENCIES latencies of the warm-up's requests cannot
tell that ramp from an overload, and a burst that ends before the engine fills
meets any SLO. A probe whose window was too short, and that met its SLOs on it,
runs again on a longer trace of the same workload (`steady_load`), up to
MAX_PROBE_REQUESTS requests; only the longest run is judged. Requests piling up
on a window still too short leave it undecided, which fails it: its SLOs may
hold only because its trace ended. (A trace file holds the requests it has, and
a closed loop is in its steady state from its clients' first round: neither
grows.)

Configurations that differ only in their block size share runs (`SharedRuns`)
when the KV cache provably never constrained the scheduler: every admission
check passed with room to spare, no append failed, nothing was preempted. With
memory out of the picture the scheduler's decisions do not depend on the block
size, so another block size replays the same run, step for step, if (1) its
cache would never have constrained it either, and (2) the cost model prices
every step of the run the same. `Trajectory.fits` checks (1) from the run's
per-step token slots T and sequences S: n sequences holding T tokens use at
most floor((T + S(b-1)) / b) blocks of b tokens, so if that plus the longest
prompt's blocks stays within the cache less its watermark at every step, every
admission check (num_free - needed >= watermark) and every append check (a free
block per sequence) passed. (2) is checked shape by shape. Either failing, the
block size runs its own simulation.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from engine.core.metrics import RequestRecord, goodput, request_quantity, slo_quantity
from engine.core.sequence import FinishReason, SequenceGroup
from planner.cost.shape import StepShape
from planner.documents import json_safe
from planner.runs.slos import meets
from planner.runs.pipeline import Simulation
from planner.analysis.verdict import (judge_growth, queue_trend, steady_requests, steady_window, too_short,
                                     warmup_latency)
from planner.runs.spec import Load
from workloads import Trace
from workloads.make import is_trace_file

WATERMARK = 0.01      # the block manager's default share of blocks admission leaves free
MAX_PROBE_REQUESTS = 20_000    # the longest trace a probe grows to
LENGTHENINGS = 3                # how many times a probe's trace may grow

# SLO metric -> (per-request value, percentile). Means and pooled ITL get no early stop.
PERCENTILE_SLOS = {"ttft_p99": ("ttft", 99), "ttft_median": ("ttft", 50), "e2e_p99": ("e2e", 99),
                   "e2e_median": ("e2e", 50), "tpot_p99": ("tpot", 99), "tpot_median": ("tpot", 50)}


def violations_to_fail(n: int, q: float) -> int:
    """How many of n values above a limit make their q-th percentile exceed it for certain.

    Non-decreasing in n, so with n the trace's size it is safe for any subset
    (e.g. the requests that have a TPOT at all)."""
    return n - int((n - 1) * q / 100.0)


def steady_load(load: Load, submitted: int, enough: int | None) -> Load | None:
    """`load` with `enough` requests for a steady window (`steady_requests`; None: its run of `submitted` had
    one), up to MAX_PROBE_REQUESTS; None when it needs no more or cannot grow."""
    if (enough is None or load.concurrency is not None or is_trace_file(load.workload)
            or submitted >= MAX_PROBE_REQUESTS):
        return None
    return replace(load, requests=min(MAX_PROBE_REQUESTS, enough), duration=None)


def slos_held(doc: dict, slos: dict[str, float], attainment: float | None = None) -> bool:
    """Whether a run met its SLOs (at `attainment`, if given) and finished every request, whatever its
    queues did."""
    return meets({k: v for k, v in doc.items() if k != "verdict"}, slos, attainment)


class VerdictCertain(Exception):
    """Raised inside the simulation to end a probe whose SLO verdict can no longer change."""

    def __init__(self, reason: str, at: float) -> None:
        super().__init__(reason, at)      # SimPy re-raises a process's exception as type(e)(*e.args)
        self.reason, self.at = reason, at


class _Deadline:
    """Counts requests whose TTFT (or E2E) is certainly above a limit, in arrival order:
    once `now - arrival > limit` a request's value is known to be above the limit,
    or it is already known exactly (its first token, or finish, is recorded)."""

    def __init__(self, metric: str, name: str, limit: float, needed: int = 0) -> None:
        self.metric, self.name, self.limit, self.needed = metric, name, limit, needed
        self.next = 0          # the first request not yet classified
        self.above = 0

    def passed(self, now: float, groups: list[SequenceGroup]) -> list[SequenceGroup]:
        """The requests newly known to be above the limit (each judged once, in arrival order)."""
        i, above = self.next, []
        limit, ttft = self.limit, self.metric == "ttft"
        while i < len(groups):
            times = groups[i].times
            if not now - times.arrival > limit:     # (the same float expression as the metric's)
                break
            at = times.first_token if ttft else times.finish
            # Unknown yet: it comes at or after now, more than `limit` after the arrival.
            if at is None or at - times.arrival > limit:
                above.append(groups[i])
            i += 1
        self.next = i
        return above

    def advance(self, now: float, groups: list[SequenceGroup]) -> None:
        """SloWatch's count: raises once `needed` requests are above the limit."""
        self.above += len(self.passed(now, groups))
        if self.above >= self.needed:
            raise VerdictCertain(f"{self.name}: {self.above} requests above {self.limit:g} s", now)


class SloWatch:
    """The simulator's `watch` for one probe: raises VerdictCertain once the probe fails for sure."""

    def __init__(self, slos: dict[str, float], num_requests: int) -> None:
        self.engine = None                       # the run watched, for its records when it stops
        self.deadlines: list[_Deadline] = []
        self.at_finish: list[list] = []          # [metric, name, limit, needed, count]
        for name, limit in slos.items():
            if name not in PERCENTILE_SLOS:
                continue
            metric, q = PERCENTILE_SLOS[name]
            needed = violations_to_fail(num_requests, q)
            if metric == "tpot":
                self.at_finish.append([metric, name, limit, needed, 0])
            else:
                self.deadlines.append(_Deadline(metric, name, limit, needed))

    def __call__(self, engine, now: float, ended: list[SequenceGroup]) -> None:
        self.engine = engine
        for group in ended:
            if group.finish_reason is FinishReason.REJECTED:
                raise VerdictCertain("a request was rejected", now)
            record = RequestRecord.from_group(group)
            if record.truncated:
                raise VerdictCertain("a request was truncated", now)
            for entry in self.at_finish:
                value = record.tpot
                if value is not None and value > entry[2]:
                    entry[4] += 1
                    if entry[4] >= entry[3]:
                        raise VerdictCertain(f"{entry[1]}: {entry[4]} requests above {entry[2]:g} s", now)
        for deadline in self.deadlines:
            deadline.advance(now, engine.groups)


class AttainmentWatch:
    """The simulator's `watch` for a probe judged by SLO attainment (planner/runs/slos.py, `meets`): raises
    VerdictCertain once so many requests have missed a per-request limit that fewer than `attainment` of the
    `num_requests` can still be within them all. A request misses when it is rejected or truncated, when it
    has waited longer than a TTFT (or E2E) limit without its first token (or its end), or at its end when a
    value there is over its limit."""

    def __init__(self, slos: dict[str, float], num_requests: int, attainment: float,
                 stream_interval: int = 1) -> None:
        self.engine = None
        self.num_requests, self.attainment = num_requests, attainment
        self.stream_interval = stream_interval          # (an ITL limit judges the gaps a client sees)
        self.limits: dict[str, float] = {}          # per-request quantity -> its tightest limit
        for name, limit in slos.items():
            quantity = slo_quantity(name)
            self.limits[quantity] = min(limit, self.limits.get(quantity, limit))
        self.deadlines = [_Deadline(q, q, self.limits[q]) for q in ("ttft", "e2e") if q in self.limits]
        self.missed: set[str] = set()

    def _miss(self, request_id: str, now: float) -> None:
        self.missed.add(request_id)
        # (the arithmetic of `slo_attainment`: good / submitted, with every unjudged request counted good)
        if (self.num_requests - len(self.missed)) / self.num_requests < self.attainment:
            raise VerdictCertain(f"SLO attainment: {len(self.missed)} of {self.num_requests} requests missed a "
                                 f"limit", now)

    def __call__(self, engine, now: float, ended: list[SequenceGroup]) -> None:
        self.engine = engine
        for group in ended:
            if group.finish_reason is FinishReason.REJECTED:
                self._miss(group.request_id, now)
                continue
            record = RequestRecord.from_group(group, self.stream_interval)
            if record.truncated or any(request_quantity(record, q) > limit for q, limit in self.limits.items()):
                self._miss(group.request_id, now)
        for deadline in self.deadlines:
            for group in deadline.passed(now, engine.groups):
                self._miss(group.request_id, now)


class _FleetWatch:
    """A probe's SloWatch over a fleet (planner/sim/fleet.py passes the fleet, whose `groups` are every
    request in arrival order). A replica that fast-forwards reports the end of its steps, which may lie
    past the simulation clock while another replica has not yet recorded a first token it gives before
    then: the deadlines are judged at the clock instead (no request gets a first token before it), so a
    request still waiting then is certainly above the limit."""

    def __init__(self, watch: SloWatch) -> None:
        self.watch = watch

    def __call__(self, fleet, now: float, ended: list[SequenceGroup]) -> None:
        self.watch(fleet, min(now, fleet.env.now), ended)


@dataclass
class Probe:
    rate: float
    ok: bool
    doc: dict                  # the metrics the verdict read, or why and when the probe stopped early
    stopped_early: bool = False
    shared_from: int | None = None   # the block size whose run this one replays (SharedRuns)
    lengthened_to: int | None = None  # the requests of the trace judged, when the given one was too short


@dataclass
class Trajectory:
    """A run's KV-cache demand step by step, and the steps as the cost model priced them."""

    token_slots: list[int]         # per step: KV slots holding tokens
    num_seqs: list[int]            # per step: sequences holding KV (the running requests, one sequence each)
    shapes: list[StepShape]
    max_prompt: int                # the longest prompt of the trace: the most one admission can need

    def fits(self, block_size: int, num_gpu_blocks: int) -> bool:
        """Whether a cache of `num_gpu_blocks` blocks of `block_size` never constrains this run."""
        room = num_gpu_blocks - int(WATERMARK * num_gpu_blocks) - math.ceil(self.max_prompt / block_size)
        spare = block_size - 1
        return room >= 0 and all((t + s * spare) // block_size <= room
                                 for t, s in zip(self.token_slots, self.num_seqs))


class Prober:
    """Probes of one configuration: its deployment plan and cost model prepared once, reused at every rate."""

    def __init__(self, simulation: Simulation, slos: dict[str, float], early_stop: bool = True) -> None:
        self.simulation, self.slos, self.early_stop = simulation, slos, early_stop
        self.attainment = simulation.spec.slo_attainment     # None: judged by the SLOs' statistics
        self.cost_model = simulation.cost_model
        self.num_gpu_blocks = simulation.plan.num_gpu_blocks
        d = simulation.spec.deployment
        self.block_size = d.block_size
        # Runs another block size may replay: the paper's policy over paged blocks, nothing shared, one
        # deployment (a fleet's router may read KV use, which depends on the block size).
        self.fleet = simulation.spec.fleet.replicas > 1
        self.shareable = (d.allocator == "paged" and not d.prefix_caching_on
                          and not d.vllm_v1 and d.num_gpu_blocks is None and not self.fleet)

    def __call__(self, rate: float) -> Probe:
        return self.run(rate)[0]

    def run(self, rate: float) -> tuple[Probe, Trajectory | None]:
        """The probe at `rate`, and its trajectory when another block size might replay it: the trajectories
        of every run it made, since whether it lengthened its trace depended on the shorter runs too."""
        given = load = replace(self.simulation.spec.load, rate=rate)
        trajectories = []
        for _ in range(LENGTHENINGS + 1):
            probe, trajectory, longer = self._run_once(rate, load)
            trajectories.append(trajectory)
            if longer is None:
                break
            load = longer
        if load is not given:
            probe.lengthened_to = load.requests
        if any(t is None for t in trajectories):
            return probe, None
        return probe, Trajectory([n for t in trajectories for n in t.token_slots],
                                 [n for t in trajectories for n in t.num_seqs],
                                 [shape for t in trajectories for shape in t.shapes],
                                 max(t.max_prompt for t in trajectories))

    def _run_once(self, rate: float, load: Load) -> tuple[Probe, Trajectory | None, Load | None]:
        """The probe on one trace, its trajectory, and the longer load to run when its window was too short."""
        trace = load.trace()
        watch = None
        if self.early_stop:
            watch = (SloWatch(self.slos, len(trace)) if self.attainment is None
                     else AttainmentWatch(self.slos, len(trace), self.attainment,
                                          self.simulation.spec.deployment.stream_interval))
        try:
            result = self.simulation.simulate(load, trace=trace, watch=watch if not self.fleet else
                                              _FleetWatch(watch) if watch is not None else None)
        except VerdictCertain as stop:
            probe = Probe(rate, False, {"stopped_at": stop.at, "stopped_because": stop.reason,
                                        "num_submitted": len(trace)}, True)
            if not self.shareable:
                return probe, None, None
            engine = watch.engine
            return probe, self._trajectory(trace, engine.steps, engine.num_running, engine.shapes), None
        doc = json_safe(result.summary())
        window = steady_window(result.requests)
        trend = queue_trend(result.requests, window) if window is not None else None
        latency = warmup_latency(result.requests, window)
        growing, inconclusive = judge_growth(trend, too_short(window, latency) and load.concurrency is None)
        doc["verdict"] = {"overloaded": growing, "inconclusive": inconclusive}
        if self.attainment is not None:
            doc.update(goodput([r for r in result.requests if r.completed], self.slos, doc.get("duration")))
        probe = Probe(rate, meets(doc, self.slos, self.attainment), doc)
        longer = (steady_load(load, len(trace), steady_requests(len(trace), window, latency))
                  if slos_held(doc, self.slos, self.attainment) else None)
        if not self.shareable:
            return probe, None, longer
        return probe, self._trajectory(trace, result.steps, result.num_running, result.shapes), longer

    def _trajectory(self, trace: Trace, steps, num_running, shapes) -> Trajectory | None:
        if not self.shareable or any(r.n != 1 or r.beam_width > 1 for r in trace.requests):
            return None
        return Trajectory([s.token_states for s in steps], list(num_running), list(shapes),
                          max((r.prompt_len for r in trace.requests), default=0))

    def replays(self, trajectory: Trajectory, other: "Prober") -> bool:
        """Whether this configuration would run `other`'s run (of that trajectory) step for step."""
        if not (self.shareable and trajectory.fits(self.block_size, self.num_gpu_blocks)):
            return False
        mine, theirs = self.cost_model.step_time, other.cost_model.step_time
        return all(mine(shape) == theirs(shape) for shape in set(trajectory.shapes))


class SharedRuns:
    """Probes of configurations that differ only in block size: a run the KV cache never
    constrained is replayed by every block size whose cache would not have constrained it either."""

    def __init__(self, probers: dict[int, Prober]) -> None:
        self.probers = probers
        self.runs: dict[float, list[tuple[int, Probe, Trajectory]]] = {}   # rate -> unconstrained runs

    def probe(self, block_size: int, rate: float) -> Probe:
        prober = self.probers[block_size]
        for other, probe, trajectory in self.runs.get(rate, ()):
            if prober.replays(trajectory, self.probers[other]):
                return replace(probe, shared_from=other)
        probe, trajectory = prober.run(rate)
        if trajectory is not None and trajectory.fits(block_size, prober.num_gpu_blocks):
            self.runs.setdefault(rate, []).append((block_size, probe, trajectory))
        return probe

    def prober(self, block_size: int):
        """The probe function of one block size, for `search_capacity`."""
        return lambda rate: self.probe(block_size, rate)
