"""Fleet simulation speed: K replicas of Llama-3.1-8B on one H100 each behind a router, ShareGPT.

Issue 25, item 4: a fleet of 64 replicas at 200 req/s for 10 minutes must simulate in under
2 minutes, the run of

    planner simulate --model llama-3.1-8b --gpu h100-sxm --workload sharegpt --rate 200 --duration 600
        --replicas 64 --router least-requests --policy paper

(the paper's policy: the default when docs/fleets.md's figures were taken, before vllm-v1 became it;
`--policy vllm-v1` runs today's default, prefix caching on).

For each router given: the wall and CPU time of the simulation (the pipeline's `Simulation.simulate`,
as the command runs it) split into the event loop and the fleet's result (records, merged steps,
metrics of the fleet and of every replica), steps, CPU time per step and per replica, simulated
seconds per wall second and the peak memory. The machines here are shared by several jobs, so the
target is judged on CPU time (what an idle core would take). `--before` also runs the fleet with
its decode plans priced one step at a time and their shapes built at once (the simulator before
planner/sim/decode_run.py), checks it identical, and prints the CPU ratio: side by side in one
process. `--check` also runs the fleet step by step (timed: the CPU ratio of the two, side by side) and one
replica through the fleet's own code (`run_fleet`, the router reading the engine) against the lone
deployment, and says whether each is identical request by request. `--workload` and
`--kv-offloading-size GIB` (a CPU KV tier per replica, vllm-v1) vary the fleet (stop 81: a tier, and
the prefix-aware router, no longer step the replicas one at a time).

    .venv/bin/python bench/bench_fleet.py [--replicas 64] [--rate 200] [--duration 600]
        [--router least-requests,round-robin,prefix-aware] [--policy paper|vllm-v1] [--workload sharegpt]
        [--kv-offloading-size GIB] [--before] [--check]
"""
from __future__ import annotations

import argparse
import hashlib
import os
import resource
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.deployment import Deployment
from planner.runs.pipeline import Simulation
from planner.runs.spec import Fleet, Load, RunSpec
from planner.sim import batch as batch_module
from planner.sim import fleet as fleet_module
from planner.sim import simulate
from planner.sim.fleet import run_fleet
from planner.sim.router import parse_router

TARGET_WALL = 120.0       # seconds for 64 replicas, 200 req/s, 10 minutes (judged on CPU time)


def timed_fleet(simulation: Simulation, trace, step_priced: bool = False):
    """The simulation, its wall and CPU seconds, and the wall seconds its result took (records, merging,
    metrics); `step_priced`: its plans priced one step at a time, as before runs were priced at once."""
    spent = {}
    build, pricer = fleet_module._fleet_result, batch_module.run_pricer

    def result(*args, **kwargs):
        start = time.perf_counter()
        out = build(*args, **kwargs)
        spent["result"] = time.perf_counter() - start
        return out

    fleet_module._fleet_result = result
    if step_priced:
        batch_module.run_pricer = lambda cost_model: None
    try:
        start, cpu = time.perf_counter(), time.process_time()
        run = simulation.simulate(trace=trace)
        return run, time.perf_counter() - start, time.process_time() - cpu, spent.get("result", 0.0)
    finally:
        fleet_module._fleet_result, batch_module.run_pricer = build, pricer


def identical(a, b) -> bool:
    return a.requests == b.requests and a.steps == b.steps and a.shapes == b.shapes and a.summary() == b.summary()


def fingerprint(run) -> tuple:
    """What --before compares without holding two runs: the summary, every step's end and record fields
    and every request's times (equal floats in equal order)."""
    steps = np.array([(s.start, s.end, s.batch_size, s.kv_blocks_used, s.token_states) for s in run.steps])
    times = np.array([(r.arrival, r.first_token or -1.0, r.finish or -1.0, len(r.token_times)) for r in run.requests])
    return run.summary(), hashlib.sha1(steps.tobytes()).hexdigest(), hashlib.sha1(times.tobytes()).hexdigest()


def report(router: str, run, wall: float, cpu: float, result_s: float, replicas: int, target: bool) -> None:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20
    imbalance = run.fleet.summary()["load_imbalance"] if run.fleet else {}
    verdict = f"  (target <= {TARGET_WALL:.0f} s: {'met' if cpu <= TARGET_WALL else 'MISSED'})" if target else ""
    print(f"{router:<16}{len(run.steps):>11,}{wall:>9.1f}{cpu:>8.1f}{result_s:>16.1f}{1e6 * cpu / len(run.steps):>9.1f}"
          f"{cpu / replicas:>11.2f}{run.simulated_time / wall:>8.1f}{peak:>10.1f}  "
          f"{imbalance.get('requests', 1.0):.3f}, {imbalance.get('busy_time', 1.0):.3f}{verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=64)
    parser.add_argument("--rate", type=float, default=200.0, help="requests/s to the whole fleet")
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of arrivals")
    parser.add_argument("--router", default="least-requests", help="policies, comma-separated")
    parser.add_argument("--before", action="store_true", help="also with plans priced step by step: the CPU ratio")
    parser.add_argument("--check", action="store_true",
                        help="also step by step, and one replica through the fleet against the lone deployment")
    parser.add_argument("--policy", default="paper",
                        help="the replicas' scheduling policy: paper (as docs/fleets.md's figures were taken) or "
                             "vllm-v1 (today's default: prefix caching on, vLLM's H100 limits)")
    parser.add_argument("--workload", default="sharegpt")
    parser.add_argument("--kv-offloading-size", type=float, default=None, help="GiB of CPU KV tier per replica")
    args = parser.parse_args()
    tier = {} if args.kv_offloading_size is None else {"kv_offloading_size": args.kv_offloading_size}
    deployment = Deployment(model="llama-3.1-8b", gpu="h100-sxm", policy=args.policy, **tier)
    load = Load(workload=args.workload, rate=args.rate, duration=args.duration)
    trace = load.trace()
    print(f"{args.workload}, {len(trace)} requests over {args.duration:.0f} s at {args.rate:g} req/s, llama-3.1-8b, "
          f"{args.replicas} replicas of one h100-sxm, policy {args.policy}"
          + (f", a {args.kv_offloading_size:g} GiB CPU KV tier each" if tier else "")
          + f"; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'router':<16}{'steps':>11}{'wall s':>9}{'CPU s':>8}{'of it result s':>16}{'us/step':>9}{'s/replica':>11}"
          f"{'x real':>8}{'peak GiB':>10}  imbalance (requests, busy)")
    target = (args.replicas, args.rate, args.duration) == (64, 200.0, 600.0)
    for router in args.router.split(","):
        simulation = Simulation.prepare(RunSpec(deployment=deployment, load=load, fleet=Fleet(args.replicas, router)))
        run, wall, cpu, result_s = timed_fleet(simulation, trace)
        report(router, run, wall, cpu, result_s, args.replicas, target)
        if args.before:
            mark = fingerprint(run)
            del run
            run, wall, old_cpu, result_s = timed_fleet(Simulation.prepare(simulation.spec), trace, step_priced=True)
            report("  step-priced", run, wall, old_cpu, result_s, args.replicas, False)
            print(f"  runs priced at once take {cpu / old_cpu:.2f}x the CPU of plans priced step by step; "
                  f"identical: {'yes' if fingerprint(run) == mark else 'NO'}")
        if args.check:
            stepped = Simulation.prepare(RunSpec(deployment=deployment, load=load, step_by_step=True,
                                                 fleet=Fleet(args.replicas, router)))
            slow_cpu = time.process_time()
            slow = stepped.simulate(trace=trace)
            slow_cpu = time.process_time() - slow_cpu
            print(f"  step by step: {slow_cpu:.1f} CPU s, the fast path {cpu / slow_cpu:.2f}x that "
                  f"({run.fast_forwarded_steps:,} of {len(run.steps):,} steps in bulk); "
                  f"identical to --step-by-step: {'yes' if identical(run, slow) else 'NO'}")
    if args.check:
        plan, cost = simulation.plan, simulation.cost_model
        lone = simulate(trace, plan, cost)
        one = run_fleet(trace, plan, cost, 1, parse_router("least-requests"))
        same = one.requests == lone.requests and one.steps == lone.steps
        print(f"one replica (run_fleet, least-requests) against the lone deployment at {args.rate:g} req/s: "
              f"{'identical' if same else 'DIFFERENT'} ({len(lone.steps):,} steps)")


if __name__ == "__main__":
    main()
