"""Dual-batch overlap and DeepGEMM's experts behind DeepEP, side by side (docs/moe.md, "Dual-batch overlap").

DeepSeek-R1 (its FP8 release) on H200 nodes, the measured cost model: one decode step's output tok/s per GPU
by sequences per rank (2,000-token contexts), the all2all backend and the experts' kernel apart: vLLM's
default all-gather with NVIDIA's timing of its fused MoE (Triton) and with --moe-backend deep_gemm, DeepEP's
low-latency kernels (vLLM's wide-EP decode recipe) with Triton's and with DeepGEMM's experts (what vLLM runs
behind DeepEP, planner/cost/deepgemm.py), and --enable-dbo on top (planner/cost/dbo.py); then closed loops of
clients (random 2,000 in / 500 out) on DeepEP with and without DBO; then ShareGPT at a few rates on DP 16, with
DBO also as each rank alone would split its steps, without the dp ranks' vote (planner/sim/dp_vote.py), to show
what the vote is worth.

    .venv/bin/python bench/bench_dbo.py [--dps 16,64] [--skip-runs]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from contextlib import contextmanager

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.deployment import Deployment  # noqa: E402
from planner import simulate  # noqa: E402
from planner.cost.measured import MeasuredCostModel  # noqa: E402
from planner.cost.shape import StepShape, context_histogram  # noqa: E402
from planner.deploy.plan import plan_deployment  # noqa: E402
from planner.sim import dp_vote  # noqa: E402

MODEL, GPU, BACKEND, CONTEXT = "deepseek-r1", "h200", "deepep_low_latency", 2000
SEQS = (32, 64, 128, 256, 512)
SHAREGPT_RATES = (8, 16, 32, 64)       # req/s on DP 16, 2 minutes each
# (row, all2all backend, --moe-backend, --enable-dbo)
LAYOUTS = (("all-gather, Triton experts (vLLM's default)", "allgather_reducescatter", "auto", False),
           ("all-gather, --moe-backend deep_gemm", "allgather_reducescatter", "deep_gemm", False),
           ("DeepEP LL, --moe-backend triton", BACKEND, "triton", False),
           ("DeepEP LL, DeepGEMM experts (auto)", BACKEND, "auto", False),
           ("DeepEP LL, DeepGEMM experts + DBO", BACKEND, "auto", True))


def cost_model(dp: int, all2all: str, kernel: str, dbo: bool) -> MeasuredCostModel:
    plan = plan_deployment(Deployment(model=MODEL, gpu=GPU, dp=dp, enable_expert_parallel=True,
                                      all2all_backend=all2all, moe_backend=kernel, enable_dbo=dbo))
    return MeasuredCostModel(MODEL, GPU, moe=plan.moe_parallel, weight_format=plan.weight_format,
                             max_num_seqs=plan.deployment.max_num_seqs,
                             max_num_batched_tokens=plan.max_num_batched_tokens,
                             async_scheduling=plan.deployment.async_scheduling)


def per_gpu(model: MeasuredCostModel, seqs: int) -> float:
    shape = StepShape(decode_seqs=seqs, decode_context=seqs * CONTEXT,
                      decode_histogram=context_histogram([CONTEXT] * seqs))
    return seqs / model.step_time(shape)


def whole_run(dp: int, dbo: bool, clients_per_rank: int) -> tuple[float, float, float, float]:
    clients = clients_per_rank * dp
    started = time.perf_counter()
    result = simulate(Deployment(model=MODEL, gpu=GPU, dp=dp, enable_expert_parallel=True, all2all_backend=BACKEND,
                                 enable_dbo=dbo),
                      workload="random", params={"input_len": 2000, "output_len": 500}, concurrency=clients,
                      requests=4 * clients)
    m = result.metrics
    return m.output_token_throughput / dp, m.tpot_mean * 1e3, m.ttft_mean, time.perf_counter() - started


@contextmanager
def without_vote():
    """Each rank splits its steps on its own tokens, as the simulator did before the dp ranks' vote."""
    of = dp_vote.DpVote.of
    dp_vote.DpVote.of = classmethod(lambda cls, cost_model: None)
    try:
        yield
    finally:
        dp_vote.DpVote.of = of


def sharegpt_run(dp: int, dbo: bool, rate: float) -> str:
    result = simulate(Deployment(model=MODEL, gpu=GPU, dp=dp, enable_expert_parallel=True, all2all_backend=BACKEND,
                                 enable_dbo=dbo),
                      workload="sharegpt", rate=rate, requests=int(rate * 120))
    m = result.metrics
    return f"{m.output_token_throughput / dp:,.0f} tok/s/GPU, TPOT {m.tpot_mean * 1e3:.1f} ms, TTFT {m.ttft_mean:.3f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dps", default="16,64", help="data-parallel sizes (EP = DP at TP 1)")
    parser.add_argument("--skip-runs", action="store_true", help="the per-step table only")
    args = parser.parse_args()
    dps = [int(x) for x in args.dps.split(",")]
    print(f"{MODEL} on {GPU}, one decode step at {CONTEXT:,}-token contexts: output tok/s per GPU "
          f"at {', '.join(map(str, SEQS))} sequences per rank")
    for dp in dps:
        for name, all2all, kernel, dbo in LAYOUTS:
            model = cost_model(dp, all2all, kernel, dbo)
            print(f"  DP{dp:<3} {name:44} " + " / ".join(f"{per_gpu(model, s):,.0f}" for s in SEQS))
    if args.skip_runs:
        return
    print("\nclosed loops: random 2,000 in / 500 out, 4 x clients requests; output tok/s per GPU, mean TPOT, "
          "mean TTFT")
    for dp in dps:
        for per_rank in (64, 256):
            runs = {dbo: whole_run(dp, dbo, per_rank) for dbo in (False, True)}
            print(f"  DP{dp} x {per_rank} clients a rank: " + "; ".join(
                f"{'DBO' if dbo else 'no DBO'} {tok:,.0f} tok/s/GPU, {tpot:.1f} ms, {ttft:.2f} s ({wall:.1f} s wall)"
                for dbo, (tok, tpot, ttft, wall) in runs.items()))
    print("\nShareGPT, Poisson arrivals, 2 minutes, DP 16: without DBO | DBO | DBO, each rank alone (no vote)")
    for rate in SHAREGPT_RATES:
        with without_vote():
            alone = sharegpt_run(16, True, rate)
        print(f"  {rate} req/s: {sharegpt_run(16, False, rate)} | {sharegpt_run(16, True, rate)} | {alone}")


if __name__ == "__main__":
    main()
