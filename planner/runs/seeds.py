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
import pickle
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

from engine.core.metrics import percentile
from planner.errors import PlannerError
from planner.runs.slos import meets
from planner.runs.pipeline import Simulation
from planner.runs.result import RunResult
from planner.runs.spec import Load
from planner.runs.sweep import document_of, run_many


LEVEL = 0.9
# Each seed is a whole simulation, and its run is prepared before any starts: a typo's 1e11 would fill the
# machine's memory with prepared runs. A 90% interval's ends settle within a few hundred seeds.
MAX_SEEDS = 1000
METRICS = ("request_throughput", "output_token_throughput", "normalized_latency", "ttft_mean", "ttft_p99",
           "tpot_mean", "tpot_p99", "itl_mean", "itl_p99", "e2e_mean", "e2e_median", "e2e_p99",
           "mean_batch_size", "kv_utilization", "step_time_median", "simulated_time")


def interval(values: list[float], level: float = LEVEL) -> dict:
    ordered = sorted(values)
    tail = (1 - level) / 2
    return {"mean": sum(ordered) / len(ordered), "low": percentile(ordered, 100 * tail),
            "high": percentile(ordered, 100 * (1 - tail)), "level": level, "n": len(ordered)}


def intervals(docs: list[dict], level: float = LEVEL) -> dict[str, dict]:
    """{metric: {mean, low, high, level, n}} over result documents (metrics missing in a run are skipped)."""
    out = {}
    for name in METRICS:
        values = [float(d[name]) for d in docs if isinstance(d.get(name), (int, float))]
        if values:
            out[name] = interval(values, level)
    return out


def seed_loads(load: Load, seeds: int) -> list[Load]:
    """`load` at seeds seed, seed+1, ..., seed+K-1."""
    if not 1 <= seeds <= MAX_SEEDS:
        raise PlannerError(f"--seeds must be 1 to {MAX_SEEDS:,}, got {seeds}")
    return [replace(load, seed=load.seed + i) for i in range(seeds)]


def run_seeds(simulation: Simulation, seeds: int, **options) -> tuple[RunResult, list[dict]]:
    """The first seed run here (its full result; `options` as for `Simulation.run`), seeds 2..K in a
    process pool meanwhile; (the first result, the other K-1 result documents)."""
    loads = seed_loads(simulation.spec.load, seeds)
    if len(loads) == 1:
        return simulation.run(**options), []
    workers = max(1, min(os.cpu_count() or 1, len(loads) - 1))
    # Pickled here, once, before the first seed runs: the pool's feeder thread would otherwise pickle
    # the simulation while this thread's run fills the cost model's caches (a dict changing size).
    frozen = pickle.dumps(simulation)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(_document_of_pickled, frozen, load) for load in loads[1:]]
        first = simulation.run(**options)
        return first, [f.result() for f in futures]


def _document_of_pickled(frozen: bytes, load: Load) -> dict:
    return document_of(pickle.loads(frozen), load)


def slo_probability(simulation: Simulation, load: Load, slos: dict, seeds: int) -> tuple[float, list[dict]]:
    """Fraction of `seeds` seeds of `load` meeting the SLOs (at the spec's SLO attainment, if it sets one), and
    their documents (seed order)."""
    loads = seed_loads(load, seeds)
    docs = run_many([(simulation, load) for load in loads], workers=1 if seeds == 1 else None)
    attainment = simulation.spec.slo_attainment
    return sum(meets(d, slos, attainment) for d in docs) / len(docs), docs
