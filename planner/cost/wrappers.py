"""Cost models built on another one: timing noise, a constant speed factor, replayed durations.

- `BuiltOn`: the base of a model that adds terms to another's steps (LoRA's kernels, the CPU KV tier's
  copies) and answers with it for all else.

- `NoisyCost`: each part of a step scatters by the profile's residual spread
  (seeded, so a run is reproducible): `--timing-noise`, and the spread behind
  `--seeds` intervals.
- `ScaledCostModel`: the same device running slower or faster by a factor
  (validate's canary speed level, planner/profile/speed.py).
- `ReplayCost`: the live run's own step durations in order (validate's error
  attribution, planner/validation/attribution.py).
"""
from __future__ import annotations

import random

from planner.cost.shape import CostModel, StepShape, reads_context_histogram
from planner.errors import PlannerError


class BuiltOn:
    """A cost model that adds to `inner`'s steps and answers with it for all else (its profile, source,
    prices_each_context ...): LoraCost, OffloadCost."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def __getattr__(self, name):
        if name == "inner":              # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)


class NoisyCost:
    """A calibrated cost model whose parts each scatter by the profile's residual spread (normal,
    relative, clipped at zero), from a seeded generator: the same seed gives the same run."""

    def __init__(self, base, seed: int) -> None:
        self.base, self.rng = base, random.Random(seed)
        self.name = f"{base.name}+noise"
        sd = base.noise_sd
        self.sd = {"host_prefill": sd["sched_prefill"], "host_decode": sd["sched_decode"],
                   "sampling": sd[f"sample_{base.sampling}"], "swap": sd["swap"], "copy": sd["copy"],
                   "prefill": sd["prefill"], "decode": sd["decode"]}

    def __getattr__(self, name):          # profile, source, describe ... come from the base model
        if name == "base":                # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.base, name)

    def step_time(self, shape: StepShape) -> float:
        gauss = self.rng.gauss
        total = 0.0
        for part, seconds in self.base.breakdown(shape).items():
            if not seconds:
                continue
            if part == "forward":
                sd = self.sd["prefill" if shape.prefill_tokens else "decode"]
            elif part == "host":
                sd = self.sd["host_prefill" if shape.prefill_tokens else "host_decode"]
            else:
                sd = self.sd[part]
            total += max(0.0, seconds * (1.0 + sd * gauss(0.0, 1.0)))
        return total


def with_timing_noise(cost_model, seed: int):
    if not hasattr(cost_model, "noise_sd"):
        raise PlannerError(f"--timing-noise needs a calibrated cost model (a profile); this run uses "
                           f"{cost_model.name}")
    return NoisyCost(cost_model, seed)


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


class ReplayCost:
    """A cost model that returns given step durations in order (the simulator prices each step once, in
    order); steps beyond the list, if the simulation schedules more, fall back to `fallback`."""

    def __init__(self, durations: list[float], fallback: CostModel, name: str = "replay(measured)") -> None:
        self.durations, self.fallback, self.name = durations, fallback, name
        self.index = 0

    def step_time(self, shape: StepShape) -> float:
        i = self.index
        self.index += 1
        return self.durations[i] if i < len(self.durations) else self.fallback.step_time(shape)
