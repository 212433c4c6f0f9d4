"""How much a prediction can move: several seeds, timing noise, and capacity at a confidence.

`planner simulate --seeds K` simulates K seeds of the same workload (seed,
seed+1, ...: new arrival times, lengths and sampled tokens) in a process pool;
every metric is then reported as its mean and a 90% interval (the 5th and
95th percentiles over the seeds, linearly interpolated). With
`--timing-noise`, each step's time also scatters the way the profile's
measurements scattered around their fitted curves (`NoisyCost`), seeded by the
run's seed so a run is reproducible. `planner capacity --seeds K --confidence p`
counts a rate as meeting the SLOs when at least a fraction p of the seeds do.
"""
from __future__ import annotations

import os
import random
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

from planner.cost.shape import StepShape

LEVEL = 0.9
METRICS = ("request_throughput", "output_token_throughput", "normalized_latency", "ttft_mean", "ttft_p99",
           "tpot_mean", "tpot_p99", "itl_mean", "itl_p99", "e2e_mean", "e2e_median", "e2e_p99",
           "mean_batch_size", "kv_utilization", "step_time_median", "simulated_time")


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default), q in [0, 1]."""
    position = q * (len(sorted_values) - 1)
    low = int(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def interval(values: list[float], level: float = LEVEL) -> dict:
    ordered = sorted(values)
    tail = (1 - level) / 2
    return {"mean": sum(ordered) / len(ordered), "low": percentile(ordered, tail),
            "high": percentile(ordered, 1 - tail), "level": level, "n": len(ordered)}


def intervals(docs: list[dict], level: float = LEVEL) -> dict[str, dict]:
    """{metric: {mean, low, high, level, n}} over result documents (metrics missing in a run are skipped)."""
    out = {}
    for name in METRICS:
        values = [float(d[name]) for d in docs if isinstance(d.get(name), (int, float))]
        if values:
            out[name] = interval(values, level)
    return out


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
    from planner.errors import PlannerError
    if not hasattr(cost_model, "noise_sd"):
        raise PlannerError(f"--timing-noise needs a calibrated cost model (a profile); this run uses "
                           f"{cost_model.name}")
    return NoisyCost(cost_model, seed)


def seed_specs(spec, seeds: int) -> list:
    from planner.errors import PlannerError
    if seeds < 1:
        raise PlannerError(f"--seeds must be >= 1, got {seeds}")
    return [replace(spec, seed=spec.seed + i) for i in range(seeds)]


def run_seeds(spec, seeds: int, run_first):
    """Seeds 2..K in a process pool while `run_first()` runs seed 1 here; (its result, all K documents)."""
    from planner.sweep import run_document

    specs = seed_specs(spec, seeds)
    if len(specs) == 1:
        first = run_first()
        return first, [None]
    workers = max(1, min(os.cpu_count() or 1, len(specs) - 1))
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(run_document, s) for s in specs[1:]]
        first = run_first()
        return first, [None] + [f.result() for f in futures]


def slo_probability(spec, rate: float, slos: dict, seeds: int) -> tuple[float, list[dict]]:
    """Fraction of `seeds` seeds meeting the SLOs at `rate`, and their documents (seed order)."""
    from planner.sweep import meets, run_document, run_sweep

    specs = seed_specs(replace(spec, rate=rate), seeds)
    docs = [run_document(specs[0])] if seeds == 1 else run_sweep(specs)
    return sum(meets(d, slos) for d in docs) / len(docs), docs
