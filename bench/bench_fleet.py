"""Fleet simulation speed: K replicas of Llama-3.1-8B on one H100 each behind a router, ShareGPT.

Issue 25, item 4: a fleet of 64 replicas at 200 req/s for 10 minutes must simulate in under
2 minutes, the run of

    planner simulate --model llama-3.1-8b --gpu h100-sxm --workload sharegpt --rate 200 --duration 600
        --replicas 64 --router least-requests

For each router given: the wall time of the simulation (the pipeline's `Simulation.simulate`, as the
command runs it) split into the event loop and the fleet's result (records, merged steps, metrics
of the fleet and of every replica), steps, wall time per step and per replica, simulated seconds per
wall second and the peak memory. `--check` also runs the fleet step by step and one replica through
the fleet's own code (`run_fleet`, the router reading the engine) against the lone deployment, and
says whether each is identical request by request. The machines here are shared and noisy.

    .venv/bin/python bench/bench_fleet.py [--replicas 64] [--rate 200] [--duration 600]
        [--router least-requests,round-robin] [--check]
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.deployment import Deployment
from planner.runs.pipeline import Simulation
from planner.runs.spec import Fleet, Load, RunSpec
from planner.sim import fleet as fleet_module
from planner.sim import simulate
from planner.sim.fleet import run_fleet
from planner.sim.router import parse_router

TARGET_WALL = 120.0       # seconds for 64 replicas, 200 req/s, 10 minutes


def timed_fleet(simulation: Simulation, trace):
    """The simulation and the seconds its result took (records, merging, metrics)."""
    spent = {}
    build = fleet_module._fleet_result

    def result(*args, **kwargs):
        start = time.perf_counter()
        out = build(*args, **kwargs)
        spent["result"] = time.perf_counter() - start
        return out

    fleet_module._fleet_result = result
    try:
        start = time.perf_counter()
        run = simulation.simulate(trace=trace)
        return run, time.perf_counter() - start, spent.get("result", 0.0)
    finally:
        fleet_module._fleet_result = build


def identical(a, b) -> bool:
    return a.requests == b.requests and a.steps == b.steps and a.shapes == b.shapes and a.summary() == b.summary()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=64)
    parser.add_argument("--rate", type=float, default=200.0, help="requests/s to the whole fleet")
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of arrivals")
    parser.add_argument("--router", default="least-requests", help="policies, comma-separated")
    parser.add_argument("--check", action="store_true",
                        help="also step by step, and one replica through the fleet against the lone deployment")
    args = parser.parse_args()
    deployment = Deployment(model="llama-3.1-8b", gpu="h100-sxm")
    load = Load(workload="sharegpt", rate=args.rate, duration=args.duration)
    trace = load.trace()
    print(f"sharegpt, {len(trace)} requests over {args.duration:.0f} s at {args.rate:g} req/s, llama-3.1-8b, "
          f"{args.replicas} replicas of one h100-sxm")
    print(f"{'router':<16}{'steps':>11}{'wall s':>9}{'of it result s':>16}{'us/step':>9}{'s/replica':>11}"
          f"{'x real':>8}{'peak GiB':>10}  imbalance (requests, busy)")
    for router in args.router.split(","):
        spec = RunSpec(deployment=deployment, load=load, fleet=Fleet(args.replicas, router))
        simulation = Simulation.prepare(spec)
        run, wall, result_s = timed_fleet(simulation, trace)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20
        imbalance = run.fleet.summary()["load_imbalance"] if run.fleet else {}
        target = (args.replicas, args.rate, args.duration) == (64, 200.0, 600.0)
        verdict = f"  (target <= {TARGET_WALL:.0f} s: {'met' if wall <= TARGET_WALL else 'MISSED'})" if target else ""
        print(f"{router:<16}{len(run.steps):>11,}{wall:>9.1f}{result_s:>16.1f}{1e6 * wall / len(run.steps):>9.1f}"
              f"{wall / args.replicas:>11.2f}{run.simulated_time / wall:>8.1f}{peak:>10.1f}  "
              f"{imbalance.get('requests', 1.0):.3f}, {imbalance.get('busy_time', 1.0):.3f}{verdict}")
        if args.check:
            slow = Simulation.prepare(RunSpec(deployment=deployment, load=load, step_by_step=True,
                                              fleet=Fleet(args.replicas, router))).simulate(trace=trace)
            print(f"  identical to --step-by-step: {'yes' if identical(run, slow) else 'NO'}")
    if args.check:
        plan, cost = simulation.plan, simulation.cost_model
        lone = simulate(trace, plan, cost)
        one = run_fleet(trace, plan, cost, 1, parse_router("least-requests"))
        same = one.requests == lone.requests and one.steps == lone.steps
        print(f"one replica (run_fleet, least-requests) against the lone deployment at {args.rate:g} req/s: "
              f"{'identical' if same else 'DIFFERENT'} ({len(lone.steps):,} steps)")


if __name__ == "__main__":
    main()
