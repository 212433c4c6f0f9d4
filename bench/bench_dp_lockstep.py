"""What the DP ranks' lockstep does to a MoE deployment: the simulation with it against the ranks on their own clocks.

vLLM runs the data-parallel ranks of a MoE deployment in lockstep: every MoE layer gathers all
ranks' tokens, so no rank's step ends before the slowest rank's, and a rank with nothing to run
steps a dummy batch meanwhile. The simulator does the same (planner/sim/lockstep.py); this bench
runs each load twice, with the lockstep (as `planner simulate` does) and with each rank on its own
clock (`simulate_fleet(..., lockstep=False)`, what the simulator did before), and prints mean TPOT,
TTFT and E2E of both and their ratio. As a cross-check it prints the upper estimate the free-running
run gives of the lockstep's cost: each rank's decode steps stretched to the longest step of the other
rank overlapping them (it overstates: a long step straddling two short ones stretches both).

    .venv/bin/python bench/bench_dp_lockstep.py [--rates 4,8,12] [--duration 300]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.deployment import Deployment  # noqa: E402
from planner.api import run_spec  # noqa: E402
from planner.runs.pipeline import Simulation  # noqa: E402
from planner.sim.fleet import simulate_fleet  # noqa: E402


def stretched(mine, other) -> np.ndarray:
    """Each of `mine` steps' duration under lockstep: at least the longest of `other`'s overlapping it.
    `other` holds steps of one rank, in order: they do not overlap, so their ends rise with their starts."""
    starts, ends, durations = other[:, 0], other[:, 1], other[:, 1] - other[:, 0]
    out = mine[:, 1] - mine[:, 0]
    for i, (start, end) in enumerate(mine[:, :2]):
        first = np.searchsorted(ends, start, side="right")
        last = np.searchsorted(starts, end, side="left")
        if last > first:
            out[i] = max(out[i], durations[first:last].max())
    return out


def upper_estimate(result) -> float:
    """Decode time of a free-running DP2 run with every step stretched to the other rank's overlapping
    ones, over its own decode time."""
    ranks = [np.array([(s.start, s.end, s.prefill_tokens) for s in part.steps]) for part in result.fleet.replicas]
    own = lock = 0.0
    for i, mine in enumerate(ranks):
        decode = mine[:, 2] == 0
        own += float((mine[decode, 1] - mine[decode, 0]).sum())
        lock += float(stretched(mine, ranks[1 - i])[decode].sum())     # DP2: the one other rank
    return lock / own


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="4,8,12", help="ShareGPT requests/s over both ranks")
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of arrivals")
    args = parser.parse_args()
    deployment = Deployment(model="qwen3-30b-a3b", gpu="h100-sxm", dp=2, enable_expert_parallel=True,
                            policy="vllm-v1", max_model_len=8192)
    print("qwen3-30b-a3b, DP2 x EP2 on H100, ShareGPT, vllm-v1: ranks in lockstep against ranks on their own clocks")
    print(f"{'rate':>5s} {'TPOT ms own/lock':>17s} {'x':>6s} {'TTFT ms own/lock':>17s} {'x':>6s} "
          f"{'E2E s own/lock':>15s} {'x':>6s} {'upper estimate x':>16s}")
    for rate in (float(r) for r in args.rates.split(",")):
        sim = Simulation.prepare(run_spec(deployment, workload="sharegpt", rate=rate, duration=args.duration))
        trace = sim.spec.load.trace()
        apart, together = (simulate_fleet(trace, sim.plan, sim.cost_model, replicas=2, lockstep=lockstep)
                           for lockstep in (False, True))
        own, lock = apart.metrics, together.metrics
        print(f"{rate:5g} {own.tpot_mean * 1e3:8.2f}/{lock.tpot_mean * 1e3:8.2f} {lock.tpot_mean / own.tpot_mean:6.3f} "
              f"{own.ttft_mean * 1e3:8.2f}/{lock.ttft_mean * 1e3:8.2f} {lock.ttft_mean / own.ttft_mean:6.3f} "
              f"{own.e2e_mean:7.3f}/{lock.e2e_mean:7.3f} {lock.e2e_mean / own.e2e_mean:6.3f} "
              f"{upper_estimate(apart):16.3f}")


if __name__ == "__main__":
    main()
