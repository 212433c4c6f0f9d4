"""Simulator speed: one hour of sharegpt at 2 requests/s on opt-13b / a100-40g with `paged`.

Targets: issue 5, at most 60 s of wall time on the 2-core CI machine; issue 15,
at least 1000x real time with decode fast-forward, with results identical to
--step-by-step. Runs both, side by side, prints simulated seconds per wall
second of each, their ratio and whether every request and step record is
equal; then a profiled fast-forward run split into where the time goes: the
engine core (scheduler, block manager, sequences), SimPy, the cost model, and
the simulator's own code (executor, fast-forward, records).

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
from engine.deployment import Deployment  # noqa: E402
from planner.deploy.plan import plan_deployment  # noqa: E402
from planner.sim import simulate  # noqa: E402
from workloads import make_trace  # noqa: E402

TARGET_WALL_S = 60.0
TARGET_SPEED = 1000.0   # simulated seconds per wall second, with fast-forward


def _bucket(filename: str) -> str:
    path = filename.replace("\\", "/")
    if "/simpy/" in path:
        return "simpy"
    if "/engine/" in path:
        return "engine core"
    if "/planner/cost/" in path:
        return "cost model (+ step shape)"
    if "/planner/sim/fast_forward" in path:
        return "fast-forward"
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
    # The paper's setting and scheduler (its contiguous baselines run under it only).
    config = plan_deployment(Deployment(model=model.name, gpu=gpu.name, allocator=args.allocator, policy="paper"))
    cost = RooflineCostModel(model, gpu)

    runs = {}
    for fast in (True, False):
        t0 = time.perf_counter()
        result = simulate(trace, config, cost, fast_forward=fast)
        runs[fast] = (result, time.perf_counter() - t0)
    print(f"sharegpt, {len(trace)} requests over {args.minutes:.0f} min at {args.rate} req/s, "
          f"opt-13b / a100-40g, {args.allocator}, {cost.name}")
    for fast, (result, wall) in runs.items():
        m = result.summary()
        speed = m["simulated_time"] / wall
        label = "fast-forward" if fast else "step-by-step"
        target = f"target >= {TARGET_SPEED:.0f}x: {'met' if speed >= TARGET_SPEED else 'MISSED'}" if fast else \
            f"target <= {TARGET_WALL_S:.0f} s for 60 min: {'met' if wall <= TARGET_WALL_S else 'MISSED'}"
        print(f"  {label:<13} wall {wall:6.2f} s, {speed:7,.1f}x real time, {m['num_steps'] / wall:9,.0f} steps/s "
              f"({result.fast_forwarded_steps:,} of {m['num_steps']:,} steps fast-forwarded; {target})")
    (fast, fast_wall), (slow, slow_wall) = runs[True], runs[False]
    same = fast.requests == slow.requests and fast.steps == slow.steps and fast.metrics == slow.metrics
    print(f"  speed-up {slow_wall / fast_wall:.2f}x; identical to --step-by-step: {'yes' if same else 'NO'}")
    m = fast.summary()
    print(f"  simulated {m['simulated_time']:,.1f} s, completed {m['num_completed']}, mean batch "
          f"{m['mean_batch_size']:.1f}, normalized latency {m['normalized_latency']:.4f} s/token, "
          f"preemptions {m['preemptions']['total']}")
    if args.no_profile:
        return
    shares = profile_shares(lambda: simulate(trace, config, cost))
    print("  where the time goes (cProfile own time; profiling inflates the total):")
    for name, share in shares.items():
        print(f"    {name:<32}{share:>7.1%}")


if __name__ == "__main__":
    main()
