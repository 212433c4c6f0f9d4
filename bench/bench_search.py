"""`planner search` at scale: 200 configurations over 10-minute ShareGPT traces, local executor.

Target (issue 15): at most 5 minutes on 2 cores. The grid: opt-13b on
a100-80g and h100-sxm, TP 1/2/4/8, block sizes 8/16/32/64/128, max_num_seqs
32/64/128/256/512 (2 x 4 x 5 x 5 = 200). Every probe of every capacity search
replays the same 1,200 ShareGPT requests (10 minutes at 2 req/s) at its rate.
Prints the wall time, the load average while it ran, the probes (how many
stopped early) and the best configuration. `--plain` runs the reference search
(every configuration from scratch, full probes) and, with `--compare`, both,
side by side, with the largest relative difference between their capacities.

    .venv/bin/python bench/bench_search.py [--workers 2] [--requests 1200] [--gpus a100-80g] [--tps 1,2]
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.deployment import Deployment  # noqa: E402
from planner.runs.spec import Load, RunSpec  # noqa: E402
from planner.sizing import SearchGrid, make_executor, run_search  # noqa: E402

TARGET_S = 300.0


def cpu_seconds() -> float:
    """User + system time of this process and of its finished children (the pool's workers)."""
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


def run(grid: SearchGrid, workers: int, verbose: bool):
    load_before = os.getloadavg()
    cpu0 = cpu_seconds()
    t0 = time.perf_counter()

    def done(row: dict, n: int, total: int) -> None:
        if verbose:
            print(f"  [{n}/{total}] {time.perf_counter() - t0:7.1f} s  {row['gpu']} x{row['tp']} block "
                  f"{row['block_size']} seqs {row['max_num_seqs']}: {row['capacity']} req/s, {row['probes']} probes, "
                  f"{row['simulations']} simulated "
                  f"(load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)

    result = run_search(grid, make_executor("local", workers=workers), on_done=done)
    wall = time.perf_counter() - t0
    cpu = cpu_seconds() - cpu0
    load_after = os.getloadavg()
    probes = sum(r["probes"] for r in result.configs)
    sims = sum(r["simulations"] for r in result.configs)
    early = sum(r.get("early_stops", 0) for r in result.configs)
    name = "plain (reference)" if grid.plain else "fast"
    print(f"{name}: {len(result.configs)} configurations, {probes} probes, {sims} simulated ({early} stopped "
          f"early; the others replayed a run of another block size) of {grid.base.load.requests} ShareGPT "
          f"requests (more where a probe lengthened its trace), "
          f"{workers} workers")
    print(f"  wall {wall:.1f} s (target <= {TARGET_S:.0f} s: {'met' if wall <= TARGET_S else 'MISSED'}); "
          f"{probes / wall:.2f} probes/s")
    print(f"  load average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f} on {os.cpu_count()} cores")
    print(f"  CPU time {cpu:.1f} s (all processes): {cpu / workers:.1f} s of wall time on {workers} idle cores; "
          f"the wall time above includes waiting for the other processes on this machine")
    b = result.best
    if b:
        print(f"  best: {b['gpu']} x{b['tp']}, block {b['block_size']}, max_num_seqs {b['max_num_seqs']}: "
              f"{b['capacity']:.3g} req/s at ${b['cost_per_hour']:.2f}/h")
    return result, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--requests", type=int, default=1200)
    parser.add_argument("--gpus", default="a100-80g,h100-sxm")
    parser.add_argument("--tps", default="1,2,4,8")
    parser.add_argument("--block-sizes", default="8,16,32,64,128")
    parser.add_argument("--max-num-seqs", default="32,64,128,256,512")
    parser.add_argument("--rate", type=float, default=2.0, help="target rate (requests/s)")
    parser.add_argument("--tolerance", type=float, default=0.1)
    parser.add_argument("--plain", action="store_true", help="the reference search instead")
    parser.add_argument("--compare", action="store_true", help="run the fast search and the reference")
    parser.add_argument("-v", "--verbose", action="store_true", help="a line per configuration")
    args = parser.parse_args()

    def ints(text: str) -> tuple[int, ...]:
        return tuple(int(x) for x in text.split(","))

    # The paper's scheduler, as when the target was set (vllm-v1 became the default later).
    base = RunSpec(deployment=Deployment(model="opt-13b", policy="paper"),
                   load=Load(workload="sharegpt", requests=args.requests))
    grid = SearchGrid(base=base, slos={"ttft_p99": 2.0, "tpot_p99": 0.1},
                      gpus=tuple(args.gpus.split(",")), tps=ints(args.tps), block_sizes=ints(args.block_sizes),
                      max_num_seqs=ints(args.max_num_seqs), target_rate=args.rate, tolerance=args.tolerance,
                      plain=args.plain)
    fast, fast_wall = run(grid, args.workers, args.verbose)
    if not args.compare:
        return
    plain, plain_wall = run(replace(grid, plain=True), args.workers, args.verbose)
    worst = 0.0
    for a, b in zip(fast.configs, plain.configs):
        if (a["capacity"] is None) != (b["capacity"] is None):
            worst = float("inf")
        elif a["capacity"] is not None:
            worst = max(worst, abs(a["capacity"] - b["capacity"]) / max(a["capacity"], b["capacity"]))
    print(f"fast / plain wall time: {fast_wall:.1f} / {plain_wall:.1f} s = {plain_wall / fast_wall:.2f}x faster; "
          f"largest capacity difference {worst:.1%} (tolerance {args.tolerance:.0%})")


if __name__ == "__main__":
    main()
