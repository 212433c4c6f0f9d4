"""Simulator speed: one hour of sharegpt at 2 requests/s on opt-13b / a100-40g with `paged`.

Target (issue 5): at most 60 s of wall time on the 2-core CI machine. Prints
simulated seconds per wall second, then a second, profiled run split into
where the time goes: the engine core (scheduler, block manager, sequences),
SimPy, the cost model, and the simulator's own code (executor, records).

    .venv/bin/python bench/bench_simulator.py [--minutes 60] [--rate 2] [--allocator paged] [--no-profile]
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from planner.catalog import resolve_gpu, resolve_model  # noqa: E402
from planner.cost import RooflineCostModel  # noqa: E402
from planner.simulator import SimConfig, simulate  # noqa: E402
from workloads import make_trace  # noqa: E402

TARGET_WALL_S = 60.0


def _bucket(filename: str) -> str:
    path = filename.replace("\\", "/")
    if "/simpy/" in path:
        return "simpy"
    if "/engine/" in path:
        return "engine core"
    if "/planner/cost/" in path:
        return "cost model (+ step shape)"
    if "/planner/sim/" in path:
        return "simulator (executor, records)"
    return "other (builtins, stdlib)"


def profile_shares(run) -> dict[str, float]:
    """Own time (tottime) per bucket, as a fraction of the profiled total."""
    profiler = cProfile.Profile()
    profiler.enable()
    run()
    profiler.disable()
    stats = pstats.Stats(profiler).stats
    totals: dict[str, float] = {}
    for (filename, _, _), (_, _, tottime, _, _) in stats.items():
        key = _bucket(filename)
        totals[key] = totals.get(key, 0.0) + tottime
    grand = sum(totals.values()) or 1.0
    return {k: v / grand for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="simulated minutes of arrivals")
    parser.add_argument("--rate", type=float, default=2.0)
    parser.add_argument("--allocator", default="paged")
    parser.add_argument("--no-profile", action="store_true", help="skip the profiled second run")
    args = parser.parse_args()

    model, gpu = resolve_model("opt-13b"), resolve_gpu("a100-40g")
    trace = make_trace("sharegpt", duration=args.minutes * 60, rate=args.rate, seed=0)
    config = SimConfig(model, gpu, allocator=args.allocator)
    cost = RooflineCostModel(model, gpu)

    t0 = time.perf_counter()
    result = simulate(trace, config, cost)
    wall = time.perf_counter() - t0
    m = result.metrics
    print(f"sharegpt, {len(trace)} requests over {args.minutes:.0f} min at {args.rate} req/s, "
          f"opt-13b / a100-40g, {args.allocator}, {cost.name}")
    print(f"  steps {m['num_steps']:,}, simulated {m['simulated_time']:,.1f} s, wall {wall:.2f} s "
          f"(target <= {TARGET_WALL_S:.0f} s for 60 min: {'met' if wall <= TARGET_WALL_S else 'MISSED'})")
    print(f"  simulated seconds per wall second: {m['simulated_time'] / wall:,.1f}; "
          f"steps per wall second: {m['num_steps'] / wall:,.0f}")
    print(f"  completed {m['num_completed']}, mean batch {m['mean_batch_size']:.1f}, "
          f"normalized latency {m['normalized_latency']:.4f} s/token, preemptions {m['preemptions']['total']}")
    if args.no_profile:
        return
    shares = profile_shares(lambda: simulate(trace, config, cost))
    print("  where the time goes (cProfile own time; profiling inflates the total):")
    for name, share in shares.items():
        print(f"    {name:<32}{share:>7.1%}")


if __name__ == "__main__":
    main()
