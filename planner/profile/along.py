"""A quick profile timed along a live run: its points interleaved with the run's steps.

On a shared CPU the device's speed drifts by 10-20% over tens of seconds to
minutes, more than the accuracy `planner validate` checks. A profile taken in
two halves around the run (around.py) still misses a slow or fast spell in the
middle of it: one validation found every live step 8% slower than both halves.
Here the profile's points are timed between the live run's steps, with the
trace clock paused so the run does not see the time they take: a spell that
slows the run slows the profile's points alike.

Schedule (every point once per round, rounds shuffled as `planner profile`
times them):
- before the run: the warm-up round and one measured round. validate needs a
  profile to pin the live engine's device and dtype, and the round anchors
  every point before the run.
- during it: once per second of live steps, points until the profiling time
  reaches `duty` times the run's busy time so far. `duty` spreads the grid's
  remaining rounds over the time the trace's arrivals span, so a run that lasts
  longer than its arrivals (a queue) gets more rounds, still spread over all
  of it.
- after it: the round in progress is finished, and rounds are added until the
  grid's repeats are met; points that scattered are timed again.

Each slice timed during the run also says how fast the device was at that
moment of the trace: `timeline` (planner.profile.speed.SpeedTimeline), which
validate reports and the simulation follows (unless --no-speed-correction).

The profile runner is a second runner beside the live engine's: it runs the
engine's own loaded model, on a KV cache of its own. A random-weight copy of the
model built for the profile timed its decode steps 3-15% slower than the live
engine ran the same steps, interleaved step by step on the 2-core VM (the copy
lies elsewhere in memory), and every validation priced the run that much slow.
On a CPU both caches fit in memory; on a GPU the live engine's cache takes the
memory a second one would need, so GPUs are profiled around the run.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

from engine.deployment import Deployment
from engine.model_runner import ModelRunner
from planner.catalog import resolve_gpu
from planner.profile.schema import Profile, save_profile
from planner.profile.around import ProfileAround, profiled
from planner.profile.device import engine_device
from planner.profile.components import DIFFERENCE_COMPONENTS
from planner.profile.run import ProfileOptions, ProfileSession
from planner.profile.speed import SpeedTimeline

# A live step right after profiling ran 1-3% slower than its neighbours (measured on the 2-core VM:
# caches and allocator state are the profile runner's then), so points are timed in slices once per
# second of live steps, not after every step: one step in ~15 pays that, not all of them.
SLICE_EVERY_S = 1.0
MAX_DUTY = 4.0          # at most 4 s of profiling per second of live steps: keeps the run in one piece
MAX_ROUNDS_FACTOR = 3   # a run far longer than its arrivals stops sampling after 3x the grid's rounds
MIN_SLICE_POINTS = 8    # a slice with fewer forward passes says too little about the device's speed
# The speed timeline reads the forward passes only: they are most of a step's time, and the host-side
# points (scheduling, sampling: microseconds of Python) scatter far more than the device moves.
FORWARD = ("prefill", "decode")


class ProfileAlong:
    """`before_run()`, `before_steps(runner)` once the live engine is loaded, `between_steps(busy_s, now)`
    after each live step, `after_run()`: one profile."""

    def __init__(self, options: ProfileOptions, path: Path, span_s: float, say: Callable[[str], object] = print):
        self.options, self.path, self.span_s, self.say = options, path, span_s, say
        self.session: ProfileSession | None = None
        self.duty = 0.0
        self.slice_every_s, self.min_slice_points = SLICE_EVERY_S, MIN_SLICE_POINTS
        self.busy_s = self.profiling_s = self.sliced_at_s = 0.0
        self.rounds_during = 0
        self.rounds = 0             # measured rounds in the final profile
        self.drift: float | None = None
        # Per slice timed during the run: its trace time and the (point index, seconds) it measured.
        self.slices: list[tuple[float, list[tuple[int, float]]]] = []
        self.timeline: SpeedTimeline | None = None

    @classmethod
    def quick(cls, gpu: str, model: str, block_size: int, path: Path, span_s: float, say=print,
              lora: Deployment | None = None) -> "ProfileAlong":
        """The quick grid with 6 measured rounds, as many as two halves of ProfileAround time; with `lora` (a
        deployment serving adapters) what its adapters add too."""
        return cls(ProfileOptions(profiled(gpu, model, block_size, lora), quick=True, repeats=6), path, span_s, say)

    def live_device(self) -> tuple[str, str]:
        """(device, dtype) the live engine runs on: the profile's."""
        return engine_device(self.options.deployment.gpu)

    def before_run(self) -> None:
        """Nothing is timed before the live engine loads: the profile runs its model (`before_steps`)."""
        self.say(f"validate: profiling {self.options.deployment.model} on {self.options.deployment.gpu} (--quick) before, between "
                 "and after the live run's steps, on the live engine's own weights")

    def before_steps(self, runner: ModelRunner | None = None) -> Path:
        """The live engine is loaded, its run not started: the session beside its `runner` (None: on a copy
        of the model built for it), its warm-up round and one measured round, the profile so far saved."""
        self.session = ProfileSession(self.options, beside=runner)
        timer = self.session.timer
        timer.time_rounds(timer.warmup)
        start = time.perf_counter()
        timer.time_rounds(timer.warmup + 1)
        round_s = time.perf_counter() - start
        remaining = self.session.setup.grid.repeats - 1
        self.duty = min(MAX_DUTY, remaining * round_s / max(self.span_s, round_s))
        return save_profile(self.session.profile(), self.path)

    def between_steps(self, busy_s: float, now: float) -> None:
        """Once per `slice_every_s` of live steps, time points until profiling has taken `duty` times them.
        ``now``: the trace time, which the trace clock keeps while the points are timed."""
        session = self._started()
        self.busy_s += busy_s
        if self.busy_s - self.sliced_at_s < self.slice_every_s:
            return
        self.sliced_at_s = self.busy_s
        most = session.timer.warmup + MAX_ROUNDS_FACTOR * session.setup.grid.repeats
        measured: list[tuple[int, float]] = []
        while self.profiling_s < self.duty * self.busy_s and session.timer.rounds_done < most:
            start = time.perf_counter()
            i, sample = session.timer.time_next()
            self.profiling_s += time.perf_counter() - start
            measured += [(i, s) for s in sample]
        if measured:
            self.slices.append((now, measured))
        self.rounds_during = session.timer.rounds_done - session.timer.warmup - 1

    def after_run(self) -> Path:
        session = self._started()
        repeats = session.setup.grid.repeats
        session.timer.time_rounds(session.timer.warmup + repeats)    # finishes the round in progress first
        session.timer.retime_unsteady(repeats)
        profile = session.profile()
        forward = [p.component in FORWARD for p in session.points]
        self.timeline = speed_timeline(self.slices, [statistics.median(s[0]) if s[0] and f else 0.0
                                                     for s, f in zip(session.samples, forward)],
                                       self.min_slice_points)
        session.close()
        self.rounds = profile.grid.repeats
        self.drift = drift_across(profile)
        return save_profile(_noted(profile, self.rounds_during), self.path)

    def _started(self) -> ProfileSession:
        if self.session is None:
            raise RuntimeError("before_steps() first")
        return self.session

    def describe(self) -> str:
        drift = "" if self.drift is None else \
            f"; the device ran x{self.drift:.3f} its first half's times in the second"
        return (f"profiled just now, {self.rounds_during} of its {self.rounds} rounds timed between the live "
                f"run's steps, one before the run, the rest after it{drift}")


def speed_timeline(slices: list[tuple[float, list[tuple[int, float]]]], medians: list[float],
                   min_points: int = MIN_SLICE_POINTS) -> SpeedTimeline | None:
    """Per slice, the median over its points of seconds measured / the point's median over the profile
    (points whose median is 0 are left out)."""
    times, factors = [], []
    for now, measured in slices:
        ratios = [s / medians[i] for i, s in measured if medians[i] > 0]
        if len(ratios) >= min_points:
            times.append(now)
            factors.append(statistics.median(ratios))
    return SpeedTimeline(times, factors) if times else None


def drift_across(profile: Profile) -> float:
    """The median over points of the later half of their repetitions' median over the earlier half's."""
    ratios = []
    for m in profile.measurements:
        if m.component in DIFFERENCE_COMPONENTS:       # (a difference of two passes says nothing of drift)
            continue
        half = len(m.samples_s) // 2
        if half:
            early, late = statistics.median(m.samples_s[:half]), statistics.median(m.samples_s[half:])
            ratios.append(late / early if early > 0 else 1.0)
    return statistics.median(ratios) if ratios else 1.0


def _noted(profile: Profile, rounds_during: int) -> Profile:
    note = (f"timed along a live run: {rounds_during} rounds between its steps, the rest right before and "
            "after it (planner/profile/along.py)")
    return profile.model_copy(update={"grid": profile.grid.model_copy(update={"notes": [*profile.grid.notes, note]})})


def profile_for_live_run(gpu: str, model: str, block_size: int, path: Path, span_s: float, say=print,
                         lora: Deployment | None = None):
    """How `planner validate` profiles the device it validates on: along the run on a CPU, around it on a GPU
    (`lora`: the validated deployment, whose LoRA settings the profile times)."""
    if resolve_gpu(gpu).kind == "cpu":
        return ProfileAlong.quick(gpu, model, block_size, path, span_s, say, lora)
    return ProfileAround.quick(gpu, model, block_size, path, say, lora)
