"""How much the DP ranks' lockstep, which the simulator leaves out, would lengthen decode steps.

vLLM runs the data-parallel ranks of a MoE deployment in lockstep: every MoE layer gathers all
ranks' tokens, so no rank's step ends before the slowest rank's, and a rank with nothing to run
steps a dummy batch meanwhile. The simulator runs each rank on its own clock and prices its steps
as if every rank scheduled as many tokens (docs/moe.md), so a rank's decode steps never wait for
the other rank's prefill. This bench sizes what that leaves out, from the simulation itself: per
rank, each step stretched to the longest step of the other ranks that overlaps it in time, and the
ratio of the stretched decode time to the simulated one (what mean TPOT would grow by, to first
order). The overlap rule overstates the stretch where a long step straddles two short ones, so the
figure is an upper estimate, not a simulation of the lockstep.

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="4,8,12", help="ShareGPT requests/s over both ranks")
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of arrivals")
    args = parser.parse_args()
    deployment = Deployment(model="qwen3-30b-a3b", gpu="h100-sxm", dp=2, enable_expert_parallel=True,
                            policy="vllm-v1", max_model_len=8192)
    print("qwen3-30b-a3b, DP2 x EP2 on H100, ShareGPT, vllm-v1 (the simulator's ranks on their own clocks)")
    print(f"{'rate':>5s} {'TPOT ms':>8s} {'decode steps':>12s} {'overlapping a prefill':>21s} "
          f"{'decode time x (lockstep, upper)':>31s}")
    for rate in (float(r) for r in args.rates.split(",")):
        sim = Simulation.prepare(run_spec(deployment, workload="sharegpt", rate=rate, duration=args.duration))
        result = sim.simulate()
        ranks = [np.array([(s.start, s.end, s.prefill_tokens) for s in part.steps]) for part in result.fleet.replicas]
        own = lock = 0.0
        decode_steps = overlapped = 0
        for i, mine in enumerate(ranks):
            other = ranks[1 - i]                      # DP2: the one other rank
            decode = mine[:, 2] == 0
            longer = stretched(mine, other)
            own += float((mine[decode, 1] - mine[decode, 0]).sum())
            lock += float(longer[decode].sum())
            decode_steps += int(decode.sum())
            prefills = other[other[:, 2] > 0]
            hit = stretched(mine[decode], prefills) > (mine[decode, 1] - mine[decode, 0])
            overlapped += int(hit.sum())
        print(f"{rate:5g} {result.metrics.tpot_mean * 1e3:8.2f} {decode_steps:12d} "
              f"{overlapped / decode_steps:20.1%} {lock / own:31.3f}")


if __name__ == "__main__":
    main()
