"""What the timing noise allows: K simulations of a validation's trace, each step's time scattered as the
profile's measurements scattered, and the 90% interval of every compared metric over them.

A measurement is never exactly its prediction: a profile's points scatter
around their fitted curves (`residual_sd`, fit error and run-to-run noise
together), and a live run draws one sample of that scatter, step by step;
where requests queue, a few slower steps also change which requests share a
batch. So `validate` simulates the same trace K more times (`--seeds K`,
default 5) with `NoisyCost` seeded 1..K (the seeded normal scatter of every
part of every step), on the same deployment, speed level or timeline as the
headline simulation, and reports for each metric the interval between the
5th and 95th percentiles of the K values (planner.runs.seeds.interval):
whether the measurement falls inside it, and if not, `interval_miss`, the
relative error of the nearest edge (nearest edge / measured - 1, the sign of
`relative_error`).

The headline `simulated` column stays the noiseless simulation; the live run
happens once. The first noisy simulation runs in this process and is timed;
the others follow it here when they would take under IN_PROCESS_S in all, else
in a process pool (planner/runs/pools.py LocalExecutor).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from planner.cost.wrappers import NoisyCost, ScaledCostModel
from planner.deploy.plan import DeploymentPlan
from planner.runs.pools import LocalExecutor
from planner.runs.seeds import LEVEL, interval
from planner.sim import simulate
from workloads import Trace

DEFAULT_SEEDS = 5
# The seeds after the first run in this process when they take less than this in all: starting a pool and
# pickling the trace to it cost 0.2-0.4 s on the 2-core VM, more than main.sh's quick run's 5 simulations
# (measured: 0.18 s in one process, 0.38 s in a pool of 2).
IN_PROCESS_S = 2.0


@dataclass(frozen=True)
class NoisyRun:
    """One noisy simulation of a validation's trace: picklable, for a worker process."""
    trace: Trace
    plan: DeploymentPlan
    cost_model: object                    # a calibrated cost model (it has noise_sd)
    seed: int                             # NoisyCost's seed; the simulation's own seed stays the headline's
    sim_seed: int
    speed_factor: float | None = None     # a canary speed level applied to the headline simulation
    timeline: object | None = None        # a SpeedTimeline the headline simulation followed
    clients: dict = field(default_factory=dict)   # simulate's concurrency and paced ({}: the trace's times)


def simulate_noisy(run: NoisyRun) -> dict:
    """The summary of one simulation priced by the cost model with seeded timing noise."""
    priced = NoisyCost(run.cost_model, run.seed)
    if run.speed_factor is not None:
        priced = ScaledCostModel(priced, run.speed_factor)
    return simulate(run.trace, run.plan, priced, seed=run.sim_seed, **run.clients,
                    device_speed=run.timeline).summary()


@dataclass
class Spread:
    """The K noisy simulations' metrics and their intervals."""
    seeds: list[int]
    level: float
    intervals: dict[str, dict]            # {metric: {mean, low, high, level, n}}
    wall_s: float                         # how long the K simulations took, in all
    workers: int

    def as_dict(self) -> dict:
        return {"seeds": self.seeds, "level": self.level, "noise": "NoisyCost: the profile's residual_sd per "
                "step part, seeded", "wall_s": self.wall_s, "workers": self.workers, "intervals": self.intervals}


def noise_capable(cost_model) -> bool:
    """Whether the cost model carries a profile's residual spread (a calibrated one)."""
    return isinstance(getattr(cost_model, "noise_sd", None), dict)


def simulate_spread(trace: Trace, plan: DeploymentPlan, cost_model, *, seeds: int, sim_seed: int,
                    metric_of, metrics: tuple[str, ...], speed_factor: float | None = None, timeline=None,
                    clients: dict | None = None, workers: int | None = None) -> Spread | None:
    """K noisy simulations and the interval of each of `metrics` (`metric_of(summary, name)` reads one);
    None when `seeds` is 0 or the cost model has no noise to draw from. The first runs here; the rest run
    here too when they would take under IN_PROCESS_S, else in a process pool (`workers`: None decides,
    1 runs all here, more forces the pool). `clients`: how requests reach the engine, as `simulate` takes it
    (concurrency, paced; None: the trace's times)."""
    if seeds < 1 or not noise_capable(cost_model):
        return None
    started = time.perf_counter()
    runs = [NoisyRun(trace, plan, cost_model, seed, sim_seed, speed_factor, timeline, clients or {})
            for seed in range(1, seeds + 1)]
    summaries = [simulate_noisy(runs[0])]
    rest = runs[1:]
    if workers is None and (time.perf_counter() - started) * len(rest) < IN_PROCESS_S:
        workers = 1
    executor = LocalExecutor(workers)
    summaries += executor.map(simulate_noisy, rest)
    found = {}
    for name in metrics:
        values = [v for s in summaries if (v := metric_of(s, name)) is not None]
        if len(values) == len(summaries):
            found[name] = interval(values, LEVEL)
    used = 1 if executor.workers == 1 or len(rest) <= 1 else min(executor.workers, len(rest))
    return Spread([r.seed for r in runs], LEVEL, found, time.perf_counter() - started, used)


def place(measured: float | None, bounds: dict | None) -> tuple[bool | None, float | None]:
    """(inside the interval, how far outside: 0 inside, else nearest edge / measured - 1); None, None when
    either is missing."""
    if measured is None or bounds is None:
        return None, None
    low, high = bounds["low"], bounds["high"]
    if low <= measured <= high:
        return True, 0.0
    if measured == 0:
        return False, None
    edge = low if measured < low else high
    return False, edge / measured - 1
