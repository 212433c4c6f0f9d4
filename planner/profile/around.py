"""A quick profile taken in two halves around a live run, and pooled.

On a shared CPU the device's speed drifts by 10-20% over minutes. A profile
taken only before a live run compares the run with the minutes before it;
half of the rounds right before the run and half right after it bracket the
run instead, so a drift during it lands on both sides and largely cancels in
the pooled medians. The two halves are timed exactly as `planner profile
--quick` times its points (same grid, shuffled rounds); only the rounds are
split in time. `drift` (the median over points of after / before) says how
far the device moved across the run.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.deployment import Deployment
from planner.errors import PlannerError
from planner.profile.schema import Measurement, Profile, save_profile
from planner.profile import pieces
from planner.profile.device import engine_device
from planner.profile.components import DIFFERENCE_COMPONENTS
from planner.profile.fit import fit_all
from planner.profile.run import ProfileOptions, run_profile


def profiled(gpu: str, model: str, block_size: int, lora: Deployment | None = None) -> Deployment:
    """What a validation's profile times: the model on the GPU at the block size, with the LoRA settings of
    `lora` when it serves adapters."""
    served = {} if lora is None or not lora.enable_lora else \
        {"enable_lora": True, "max_loras": lora.max_loras, "max_lora_rank": lora.max_lora_rank}
    return Deployment(model=model, gpu=gpu, block_size=block_size, **served)


def _key(m: Measurement) -> tuple:
    return m.component, tuple(sorted(m.features.items()))


def pool_profiles(before: Profile, after: Profile) -> tuple[Profile, float]:
    """One profile from two timings of the same grid (their samples pooled), and the drift after / before."""
    same = ("fingerprint", "model", "tp", "block_size", "dtype", "per_layer_scaling")
    differing = [name for name in same if getattr(before, name) != getattr(after, name)]
    # The device's free memory and load average differ between any two timings; what it is may not.
    volatile = {"memory_bytes", "load_average"}
    if before.device.model_dump(exclude=volatile) != after.device.model_dump(exclude=volatile):
        differing.insert(0, "device")
    if differing:
        raise PlannerError(f"cannot pool two profiles that differ in {', '.join(differing)}")
    later = {_key(m): m for m in after.measurements}
    pooled, ratios = [], []
    for m in before.measurements:
        other = later.get(_key(m))
        if other is None:           # a point only one half could time (the KV cache sized differently)
            continue
        if m.component not in DIFFERENCE_COMPONENTS:      # (a difference of two passes says nothing of drift)
            ratios.append(other.median_s / m.median_s if m.median_s > 0 else 1.0)
        pooled.append(_pool(m, other))
    if not pooled:
        raise PlannerError("the two halves of the profile share no grid point")
    grid = before.grid.model_copy(update={
        "repeats": before.grid.repeats + after.grid.repeats,
        "kv_cache_blocks": min(before.grid.kv_cache_blocks, after.grid.kv_cache_blocks),
        "notes": [*before.grid.notes, "timed in two halves, right before and right after a live run, "
                                      "samples pooled (planner/profile/around.py)"]})
    profile = before.model_copy(update={"grid": grid, "measurements": pooled, "fit": fit_all(pooled),
                                        "created": after.created})
    return profile, statistics.median(ratios)


def _pool(a: Measurement, b: Measurement) -> Measurement:
    samples = a.samples_s + b.samples_s
    if a.layer_medians_s is None:
        median, spread = pieces.summarize(samples)
        return a.model_copy(update={"median_s": median, "spread": spread, "samples_s": samples})
    # Per-layer scaled: the full-model time is derived from two models' medians; average the halves'.
    layers = {k: (a.layer_medians_s[k] + b.layer_medians_s[k]) / 2 for k in a.layer_medians_s}
    return a.model_copy(update={"median_s": (a.median_s + b.median_s) / 2, "spread": max(a.spread, b.spread),
                                "samples_s": samples, "layer_medians_s": layers})


@dataclass
class ProfileAround:
    """`before_run()` times half of a quick profile's rounds, `after_run()` the other half and pools them."""

    options: ProfileOptions
    path: Path
    say: Callable[[str], object] = print
    before: Profile | None = None
    drift: float | None = None

    @classmethod
    def quick(cls, gpu: str, model: str, block_size: int, path: Path, say=print,
              lora: Deployment | None = None) -> "ProfileAround":
        """Each half times 3 rounds of the quick grid after its warm-up round; the pooled profile has 6."""
        return cls(ProfileOptions(profiled(gpu, model, block_size, lora), quick=True, repeats=3), path, say)

    def _half(self, when: str) -> Profile:
        self.say(f"validate: profiling {self.options.deployment.model} on {self.options.deployment.gpu} (--quick), half of it "
                 f"{when} the live run")
        return run_profile(self.options)

    def before_run(self) -> Path:
        self.before = self._half("before")
        return save_profile(self.before, self.path)

    timeline = None      # no points are timed during the run, so no speed timeline (ProfileAlong's)

    def live_device(self) -> tuple[str, str]:
        """(device, dtype) the live engine runs on: the profile's."""
        return engine_device(self.options.deployment.gpu)

    def before_steps(self, runner=None) -> None:
        """Nothing: the first half was timed before the live engine loaded (ProfileAlong starts here)."""

    def between_steps(self, busy_s: float, now: float) -> None:
        """Nothing is timed during the run (ProfileAlong times points here)."""

    def after_run(self) -> Path:
        if self.before is None:
            raise RuntimeError("after_run() before before_run()")
        pooled, self.drift = pool_profiles(self.before, self._half("after"))
        return save_profile(pooled, self.path)

    def describe(self) -> str:
        drift = "" if self.drift is None else f"; the device ran x{self.drift:.3f} the first half's times in the second"
        return f"profiled just now, half right before and half right after the live run{drift}"
