"""vLLM's all2all backends for wide expert parallelism, side by side (docs/moe.md, "Expert-parallel dispatch
through DeepEP"): one MoE layer's dispatch and combine by EP size and tokens per rank, then whole runs.

DeepSeek-R1 (its FP8 release) on H200 nodes, the measured cost model: per layer, microseconds of the
all-gather / reduce-scatter (vLLM's default) against DeepEP's low-latency and normal kernels
(planner/cost/all2all.py, DeepEP's published rates); then a closed loop of clients on each layout
(random 2,000-token prompts, 500-token answers, 8 x clients requests), output tok/s and mean TPOT.

    .venv/bin/python bench/bench_all2all.py [--dps 16,32,64] [--skip-runs]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.deployment import ALL2ALL_BACKENDS, Deployment  # noqa: E402
from planner import simulate  # noqa: E402
from planner.cost.measured import MeasuredCostModel  # noqa: E402
from planner.deploy.plan import plan_deployment  # noqa: E402

MODEL, GPU = "deepseek-r1", "h200"
TOKENS = (1, 8, 128, 2048)


def per_layer(dp: int) -> dict[str, list[float]]:
    """Microseconds of one MoE layer's dispatch and combine for each backend at TOKENS tokens per rank."""
    found = {}
    for backend in ALL2ALL_BACKENDS:
        plan = plan_deployment(Deployment(model=MODEL, gpu=GPU, dp=dp, enable_expert_parallel=True,
                                          all2all_backend=backend))
        model = MeasuredCostModel(MODEL, GPU, moe=plan.moe_parallel, weight_format=plan.weight_format)
        found[backend] = [model._moe.dispatch(t) * 1e6 for t in TOKENS]
    return found


def whole_run(dp: int, backend: str) -> tuple[float, float, float]:
    clients = 16 * dp
    started = time.perf_counter()
    result = simulate(Deployment(model=MODEL, gpu=GPU, dp=dp, enable_expert_parallel=True, all2all_backend=backend),
                      workload="random", params={"input_len": 2000, "output_len": 500}, concurrency=clients,
                      requests=8 * clients)
    m = result.metrics
    return m.output_token_throughput, m.tpot_mean * 1e3, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dps", default="16,32,64", help="data-parallel sizes (EP = DP at TP 1)")
    parser.add_argument("--skip-runs", action="store_true", help="the per-layer table only")
    args = parser.parse_args()
    dps = [int(x) for x in args.dps.split(",")]
    print(f"{MODEL} on {GPU}, one MoE layer's dispatch + combine (us) at {', '.join(map(str, TOKENS))} tokens per rank")
    print(f"{'EP':>4}  " + "  ".join(f"{b:>30}" for b in ALL2ALL_BACKENDS))
    for dp in dps:
        row = per_layer(dp)
        print(f"{dp:>4}  " + "  ".join(f"{' / '.join(f'{v:,.0f}' for v in row[b]):>30}" for b in ALL2ALL_BACKENDS))
    if args.skip_runs:
        return
    print("\nwhole runs: random 2,000 in / 500 out, 16 x DP clients, 8 x clients requests; output tok/s, mean TPOT")
    for dp in dps:
        runs = {backend: whole_run(dp, backend) for backend in ALL2ALL_BACKENDS}
        base = runs[ALL2ALL_BACKENDS[0]][0]
        print(f"DP {dp} ({16 * dp} clients): " + "; ".join(
            f"{backend} {tok_s:,.0f} tok/s ({tok_s / base - 1:+.1%}), {tpot:.1f} ms, {wall:.1f} s wall"
            for backend, (tok_s, tpot, wall) in runs.items()))


if __name__ == "__main__":
    main()
