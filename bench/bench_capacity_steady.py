"""Capacity from a short trace, checked by long runs (stop 70).

A capacity probe judges a steady state. Before stop 70 a probe judged the
trace it was given and watched only the waiting queue; under vLLM v1
(max_num_seqs 1024) an overload is a running batch that keeps growing, and a
short trace (200 requests at 256 req/s is a 0.8 s burst) ends before anything
shows. Now a probe whose steady window is shorter than 8 warm-up latencies runs
again on a longer trace, and requests piling up anywhere in the system count
as an overload (planner/sizing/probe.py, planner/analysis/verdict.py).

For each case: the capacity `planner capacity` finds from traces of 200 and of
1,000 requests, and the requests its probe at capacity ran on; then long runs
(LONG requests each) at that capacity and 10 % above it: served against offered
rate in the steady window, the SLO metrics, and whether the SLOs hold. A sound
capacity meets its SLOs on the long run and sits below the rate whose long run
misses them.

    .venv/bin/python bench/bench_capacity_steady.py [--long 20000]
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.deployment import Deployment  # noqa: E402
from planner import capacity, simulate  # noqa: E402
from planner.runs.slos import meets  # noqa: E402

CASES = [
    ("llama-3.1-8b on h100-sxm (vllm-v1)", Deployment(model="llama-3.1-8b", gpu="h100-sxm"),
     {"ttft_p99": 0.5, "tpot_p99": 0.03}),
    ("opt-6.7b on a100-80g (paper policy)", Deployment(model="opt-6.7b", gpu="a100-80g", policy="paper"),
     {"ttft_p99": 2.0, "tpot_p99": 0.2}),
    ("qwen3-32b on 2 x h100-sxm (vllm-v1)", Deployment(model="qwen3-32b", gpu="h100-sxm", tp=2),
     {"ttft_p99": 1.0, "tpot_p99": 0.05}),
]


def long_run(deployment: Deployment, rate: float, requests: int, slos: dict) -> str:
    doc = simulate(deployment, workload="sharegpt", rate=rate, requests=requests).document()
    steady, verdict = doc["steady_state"], doc["verdict"]
    shown = ", ".join(f"{k} {doc[k]:.4g}" for k in slos)
    return (f"{rate:7.3g} req/s x {requests}: served {steady['request_throughput']:.3g} of "
            f"{verdict['queue']['arrival_rate']:.3g} req/s offered in the steady window, {shown}, "
            f"{verdict['state']}: {'meets' if meets(doc, slos) else 'misses'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long", type=int, default=20_000, help="requests of each long check run")
    args = parser.parse_args()
    for title, deployment, slos in CASES:
        print(f"{title}, ShareGPT, SLO {slos}")
        found = None
        for requests in (200, 1000):
            result = capacity(deployment, slos=slos, workload="sharegpt", requests=requests)
            judged = (result.document["at_capacity"] or {}).get("num_submitted")
            print(f"  capacity from {requests:5d} requests: {result.rate} req/s (its probe ran {judged} requests)")
            found = result.rate if found is None else min(found, result.rate)
        for rate in (found, 1.1 * found):
            print("  long run " + long_run(deployment, rate, args.long, slos))


if __name__ == "__main__":
    main()
