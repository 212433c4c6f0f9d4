"""The device's speed during a live validation run, relative to its profile.

A shared CPU does not keep one speed: on the 2-core machines this project runs
on, the same forward pass moves by 10-20% between minutes (other tenants of the
host, frequency changes), and a process of our own beside it can stall a
2-thread matmul several-fold. A profile averages over the minutes it was
taken in; a short live run sees the minutes it ran in. That difference is the
machine's, not the cost model's, yet it lands in every error `validate`
reports.

So `validate` times the profile's canary points (planner.profile_check) on the
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
profile itself in two halves around the live run (planner/profiling/around.py):
minutes of the whole grid on both sides rather than seconds of canary, and the
drift between the halves is reported in place of a speed level.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from planner.cost.shape import CostModel, StepShape, reads_context_histogram

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


class ScaledCostModel:
    """Another cost model's step times times `factor`: the same device running slower or faster."""

    def __init__(self, inner: CostModel, factor: float) -> None:
        self.inner, self.factor = inner, factor
        self.name = f"{inner.name} x{factor:.3f} (speed level)"
        self.profile = getattr(inner, "profile", None)
        self.source = getattr(inner, "source", None)
        self.prices_each_context = reads_context_histogram(inner)

    def step_time(self, shape: StepShape) -> float:
        return self.inner.step_time(shape) * self.factor


def canary_probe(profile, budget_s: float = CANARY_BUDGET_S):
    """A function runner -> measured/profiled ratio over the profile's canary points, or None when the
    profile has no points to time again (per-layer scaled, or none fit the budget)."""
    from planner.profile_check import canary_points, canary_ratio, time_canary

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
