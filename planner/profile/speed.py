"""The device's speed during a live validation run, relative to its profile.

A shared CPU does not keep one speed: on the 2-core machines this project runs
on, the same forward pass moves by 10-20% between minutes (other tenants of the
host, frequency changes), and a process of our own beside it can stall a
2-thread matmul several-fold. A profile averages over the minutes it was
taken in; a short live run sees the minutes it ran in. That difference is the
machine's, not the cost model's, yet it lands in every error `validate`
reports.

So `validate` times the profile's canary points (planner.profile.check) on the
live engine's own runner right before the live run and right after it, and
reports `factor` = the mean of the two measured/profiled ratios as the device's
speed level during the run. The canaries are independent of the live run's own
timings: they say how fast the device was, not how long the run's steps took.

With `--speed-correction` the simulation prices steps with the profile scaled
by that factor (`ScaledCostModel`), and the report keeps the errors without
it. The canary times its points as the profiler does, one call per point per
round in shuffled order (back-to-back repetitions of one shape ran up to 8%
faster than the profile's rounds). The correction is off by default because a
few seconds of canary can catch a passing spell that the run does not see.
Measured on the 2-core CPU VM (opt-125m; throughput and mean E2E errors,
without -> with the correction): validate sharegpt +4.1% -> +1.9% and -6.7% ->
-3.4%; sharegpt with chunked prefill +9.2% -> +2.0% and -14.5% -> -4.5%; but
scripts/main.sh with canaries of 1.251 before and 1.020 after its live run
-0.1% -> -6.5% and -11.5% -> +1.1%, the median step time +1.7% -> +15.8%.

When `validate` re-profiles (`--reprofile`, or a stale profile), it times the
profile itself along the live run (planner/profile/along.py; around it on a
GPU): the whole grid, in the run's own minutes rather than seconds of canary.
No speed level is taken then. On a CPU the profile's points timed between
the run's steps give a `SpeedTimeline` instead: the device's speed at each
moment of the run, which the simulation follows by default (see the class:
spread over the run, it does not share the canaries' weakness).
"""
from __future__ import annotations

import bisect
import statistics
from dataclasses import asdict, dataclass

from planner.profile.check import canary_points, canary_ratio, time_canary


CANARY_BUDGET_S = 4.0      # each bracketing canary (before, after): a few forward passes


@dataclass
class SpeedLevel:
    before: float | None         # canary measured / profiled right before the live run
    after: float | None          # ... and right after it
    applied: bool                # the simulation priced steps with the profile scaled by factor

    @property
    def factor(self) -> float | None:
        ratios = [r for r in (self.before, self.after) if r is not None]
        return sum(ratios) / len(ratios) if ratios else None

    def as_dict(self) -> dict:
        return {**asdict(self), "factor": self.factor}

    def headline(self) -> str:
        if self.factor is None:
            return "device speed level: not measured (no canary point)"
        how = ("the simulation uses the profile scaled by it" if self.applied
               else "not applied (--speed-correction applies it)")
        canaries = ", ".join(f"{when} {r:.3f}" for when, r in (("before", self.before), ("after", self.after))
                             if r is not None)
        return (f"device speed during the live run: x{self.factor:.3f} the profile's step times "
                f"(canaries {canaries}); {how}")


@dataclass
class SpeedTimeline:
    """The device's speed through a live run: at trace time t, factor(t) times the profile's step times.

    Even a profile timed along the run (planner/profile/along.py) holds one
    time per shape, the mean over the whole run, while a shared CPU moves by
    5-10% within it; the steps of one shape run at one moment (the large
    batches at the peak of the load), so they see that moment's speed, not the
    mean. Measured on the 2-core VM: in one main.sh validation the profile's
    points ran 5-10% slower in two of their nine rounds, the ones timed while
    the run's batches of 8-15 ran, and the simulation underpriced those steps
    by 11-14% and mean E2E by 15%.

    Each slice of profile points timed between the run's steps gives one
    factor: the median over its points of the time measured then over the
    point's pooled median. Between slices the factor is interpolated; before
    the first and after the last it stays at theirs. The live run's own step
    times are never used: the factors come from the profile's runner, so they
    say how fast the device was, not how long the run's steps took.

    The simulation follows it unless `--no-speed-correction`, and the report
    keeps the errors without it. Nineteen validations on the 2-core VM
    (opt-125m: ten of main.sh's quick setting; at their defaults two of
    sharegpt, four of alpaca, three of sharegpt with chunked prefill), each
    simulated without and with it (mean |error|, without -> with): throughput
    1.97% -> 0.91%, mean E2E 4.34% -> 2.76%, median step 4.3% -> 3.2%; the
    worst 5.6% -> 3.5%, 11.4% -> 6.0% and 10.1% -> 8.8%; four runs off the
    targets without it, none with it. (Five runs before the profile was fitted
    to means, not medians, had shown no gain in E2E, 3.8% -> 3.9%: the median
    fit's own bias of 1-2% hid it.)
    """

    times: list[float]          # trace time of each slice (seconds since the first arrival)
    factors: list[float]
    applied: bool = False       # the simulation priced each step at its moment's speed (not --no-speed-correction)

    def __post_init__(self) -> None:
        if not self.times or len(self.times) != len(self.factors):
            raise ValueError("a speed timeline needs one factor per slice, and at least one slice")

    def __call__(self, t: float) -> float:
        k = bisect.bisect_right(self.times, t)
        if k == 0:
            return self.factors[0]
        if k == len(self.times):
            return self.factors[-1]
        t0, t1 = self.times[k - 1], self.times[k]
        f0, f1 = self.factors[k - 1], self.factors[k]
        return f0 + (f1 - f0) * (t - t0) / (t1 - t0) if t1 > t0 else f1

    def as_dict(self) -> dict:
        return {"times": self.times, "factors": self.factors, "applied": self.applied, "min": min(self.factors),
                "max": max(self.factors), "median": statistics.median(self.factors)}

    def headline(self) -> str:
        return (f"device speed through the live run: x{min(self.factors):.3f} to x{max(self.factors):.3f} "
                f"the profile's step times (median x{statistics.median(self.factors):.3f}, "
                f"{len(self.factors)} slices of its points timed between the run's steps); "
                + ("the simulation prices each step at the speed of its moment" if self.applied
                   else "not applied (--no-speed-correction)"))


def canary_probe(profile, budget_s: float = CANARY_BUDGET_S):
    """A function runner -> measured/profiled ratio over the profile's canary points, or None when the
    profile has no points to time again (per-layer scaled, or none fit the budget)."""
    if profile is None or profile.per_layer_scaling:
        return None
    selected = canary_points(profile, budget_s)
    if not selected:
        return None

    def probe(runner) -> float | None:
        fitting = [m for m in selected if _blocks_needed(m, runner.block_size) <= runner.num_gpu_blocks]
        return canary_ratio(time_canary(fitting, runner, budget_s=budget_s)) if fitting else None
    return probe


def _blocks_needed(m, block_size: int) -> int:
    """KV blocks a canary point's decode batch occupies (prefill inputs wrap around the cache)."""
    if m.component != "decode":
        return 0
    seqs = int(m.features["seqs"])
    return seqs * -(-(int(m.features["context"]) // seqs) // block_size)
