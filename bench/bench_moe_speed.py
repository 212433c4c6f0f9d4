"""Simulator speed on mixture-of-experts models: one hour of traffic, simulated seconds per wall second.

Issue 24's target: simulating one hour of traffic on an MoE model stays at least 500x faster than real
time. Each case is `planner simulate` of 3,600 s of ShareGPT arrivals (vllm-v1 policy, measured cost
model, fast-forward on, as simulate runs by default) on the catalog's MoE models; it prints the
simulated time, the wall time, the ratio and the steps per wall second. The cost model is built once
before the clock starts (as Simulation.prepare does for every run).

    .venv/bin/python bench/bench_moe_speed.py [--minutes 60] [--quick] [--no-async-scheduling]

The cases run as `planner simulate` does by default: async scheduling on, vLLM's own default on a GPU;
`--no-async-scheduling` runs them with the host in series (as the figures before stop 44 were taken).
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

TARGET_SPEED = 500.0
# (label, deployment settings, request rate): 2 req/s per replica, the load of the dense simulator bench
# (bench/bench_simulator.py), which every deployment here serves without its queue growing.
CASES = (
    ("qwen3-30b-a3b, 1 x h100, bf16", dict(model="qwen3-30b-a3b", gpu="h100-sxm"), 2.0),
    ("qwen3-30b-a3b, dp2 x ep2 on h100", dict(model="qwen3-30b-a3b", gpu="h100-sxm", dp=2,
                                                enable_expert_parallel=True), 4.0),
    ("gpt-oss-120b, 2 x h100 (TP2), mxfp4", dict(model="gpt-oss-120b", gpu="h100-sxm", tp=2), 2.0),
    ("mixtral-8x7b, 2 x h100 (TP2)", dict(model="mixtral-8x7b", gpu="h100-sxm", tp=2), 2.0),
)


def run_case(settings: dict, rate: float, minutes: float,
             async_scheduling: bool | None = None) -> tuple[float, float, float, int, int]:
    """(simulated seconds, wall seconds, CPU seconds, steps, completed requests) of one case."""
    deployment = Deployment(policy="vllm-v1", max_model_len=8192, async_scheduling=async_scheduling, **settings)
    spec = run_spec(deployment, workload="sharegpt", rate=rate, duration=minutes * 60.0)
    sim = Simulation.prepare(spec)
    trace = spec.load.trace()
    start, cpu = time.perf_counter(), time.process_time()
    result = sim.simulate(trace=trace)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return result.simulated_time, wall, cpu, len(result.steps), result.metrics.num_completed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="minutes of arrivals per case")
    parser.add_argument("--quick", action="store_true", help="the first case only")
    parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                        help="vLLM's async scheduling [default: vLLM's own choice, on]")
    args = parser.parse_args()
    print(f"{'case':40s} {'rate':>6s} {'simulated s':>12s} {'wall s':>8s} {'CPU s':>7s} {'x real (wall)':>13s} "
          f"{'x real (CPU)':>12s} {'steps':>8s} {'done':>7s}")
    worst = None
    for label, settings, rate in CASES[:1] if args.quick else CASES:
        simulated, wall, cpu, steps, done = run_case(settings, rate, args.minutes, args.async_scheduling)
        worst = simulated / wall if worst is None else min(worst, simulated / wall)
        print(f"{label:40s} {rate:6.1f} {simulated:12.0f} {wall:8.1f} {cpu:7.1f} {simulated / wall:13.0f} "
              f"{simulated / cpu:12.0f} {steps:8d} {done:7d}", flush=True)
    # wall time counts the waits of a shared machine; CPU time is the simulator's own work
    print(f"slowest: {worst:.0f}x real time (wall); target >= {TARGET_SPEED:.0f}x: "
          f"{'met' if worst >= TARGET_SPEED else 'MISSED'}")


if __name__ == "__main__":
    main()
