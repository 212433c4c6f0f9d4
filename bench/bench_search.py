"""`planner search` at scale: 200 configurations over 10-minute ShareGPT traces, local executor.

Target (issue 15): at most 5 minutes on 2 cores. The grid: opt-13b on
a100-80g and h100-sxm, TP 1/2/4/8, block sizes 8/16/32/64/128, max_num_seqs
32/64/128/256/512 (2 x 4 x 5 x 5 = 200). Every probe of every capacity search
replays the same 1,200 ShareGPT requests (10 minutes at 2 req/s) at its rate.
Prints the wall time, the load average while it ran, probes and simulations
per second, and the best configuration.

    .venv/bin/python bench/bench_search.py [--workers 2] [--requests 1200] [--configs 200]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from planner.search import SearchGrid, make_executor, run_search  # noqa: E402

TARGET_S = 300.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--requests", type=int, default=1200)
    parser.add_argument("--configs", type=int, default=200, help="use the first N configurations of the grid")
    parser.add_argument("--rate", type=float, default=2.0, help="target rate (requests/s)")
    parser.add_argument("--tolerance", type=float, default=0.1)
    args = parser.parse_args()
    grid = SearchGrid(model="opt-13b", workload="sharegpt", slos={"ttft_p99": 2.0, "tpot_p99": 0.1},
                      gpus=("a100-80g", "h100-sxm"), tps=(1, 2, 4, 8), block_sizes=(8, 16, 32, 64, 128),
                      max_num_seqs=(32, 64, 128, 256, 512), target_rate=args.rate, duration=None,
                      requests=args.requests, tolerance=args.tolerance)
    configs = grid.configs()[:args.configs]
    grid = SearchGrid(**{**grid.__dict__, "gpus": tuple(dict.fromkeys(c[0] for c in configs))}) \
        if args.configs < len(grid.configs()) else grid
    load_before = os.getloadavg()
    t0 = time.perf_counter()

    def done(row: dict, n: int, total: int) -> None:
        print(f"  [{n}/{total}] {time.perf_counter() - t0:7.1f} s  {row['gpu']} x{row['tp']} block "
              f"{row['block_size']} seqs {row['max_num_seqs']}: {row['capacity']} req/s, {row['probes']} probes "
              f"(load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)

    result = run_search(grid, make_executor("local", workers=args.workers), on_done=done)
    wall = time.perf_counter() - t0
    load_after = os.getloadavg()
    probes = sum(r["probes"] for r in result.configs)
    print(f"{len(result.configs)} configurations, {probes} simulations of {args.requests} ShareGPT requests, "
          f"{args.workers} workers")
    print(f"  wall {wall:.1f} s (target <= {TARGET_S:.0f} s: {'met' if wall <= TARGET_S else 'MISSED'}); "
          f"{probes / wall:.2f} simulations/s")
    print(f"  load average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f} on {os.cpu_count()} cores")
    b = result.best
    if b:
        print(f"  best: {b['gpu']} x{b['tp']}, block {b['block_size']}, max_num_seqs {b['max_num_seqs']}: "
              f"{b['capacity']:.3g} req/s at ${b['cost_per_hour']:.2f}/h")


if __name__ == "__main__":
    main()
