"""What the balancer of a deployment's data-parallel ranks changes: round-robin, vLLM's own (vllm-dp) and
least-requests side by side.

Qwen3-30B-A3B with DP2 x EP2 on H100 (vllm-v1, measured cost model, max_model_len 8192), ShareGPT arrivals
at each rate, the same trace for every router: mean TPOT, TTFT and E2E, rank 0's share of the requests, and
the simulator's CPU time and speed (simulated seconds per CPU second). docs/moe.md holds the figures.

    .venv/bin/python bench/bench_dp_balancer.py [--minutes 10] [--rates 4,12,24]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.deployment import Deployment  # noqa: E402
from planner.api import run_spec  # noqa: E402
from planner.runs.pipeline import Simulation  # noqa: E402
from planner.runs.spec import Fleet  # noqa: E402

ROUTERS = ("round-robin", "vllm-dp", "least-requests")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="minutes of arrivals per run")
    parser.add_argument("--rates", default="4,12,24", help="requests/s, a comma list")
    args = parser.parse_args()
    deployment = Deployment(policy="vllm-v1", max_model_len=8192, model="qwen3-30b-a3b", gpu="h100-sxm", dp=2,
                            enable_expert_parallel=True)
    print(f"{'rate':>6} {'router':15} {'TPOT ms':>8} {'TTFT ms':>8} {'E2E s':>7} {'rank 0':>7} {'CPU s':>6} "
          f"{'x real':>7}")
    for rate in (float(r) for r in args.rates.split(",")):
        for router in ROUTERS:
            spec = run_spec(deployment, workload="sharegpt", rate=rate, duration=args.minutes * 60.0,
                            fleet=Fleet(1, router))
            simulation = Simulation.prepare(spec)
            trace = spec.load.trace()
            cpu = time.process_time()
            result = simulation.simulate(trace=trace)
            cpu = time.process_time() - cpu
            m, routes = result.metrics, result.fleet.routes
            print(f"{rate:6g} {router:15} {m.tpot_mean * 1e3:8.2f} {m.ttft_mean * 1e3:8.1f} {m.e2e_mean:7.3f} "
                  f"{routes.count(0) / len(routes):7.3f} {cpu:6.1f} {result.simulated_time / cpu:7.0f}", flush=True)


if __name__ == "__main__":
    main()
