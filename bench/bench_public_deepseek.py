"""DeepSeek-R1 on 8 x H200 against a public measured vLLM deployment: the planner's first check of MLA.

Data. GPUStack's performance lab published vLLM v0.11.0 serving DeepSeek-R1-0528 on one 8 x H200 node
(`vllm serve deepseek-ai/DeepSeek-R1-0528 -tp 8`, everything else vLLM's defaults), measured with
`vllm bench serve` (github.com/gpustack/gpustack, docs/performance-lab/deepseek-r1/h200.md, "Baseline
benchmark results"). The runs below are those with fixed lengths (vLLM bench's random dataset) and the one
at a fixed concurrency; the ShareGPT burst is left out (its lengths are the dataset's, which this machine
does not have). Every burst sends all its requests at once (vLLM bench's default request rate, inf), which
is a closed loop with one client per request. The ShareGPT run at 4 clients is simulated with fixed lengths
at its recorded means (22,836 input and 21,338 output tokens over 100 requests).

Deployment, as vLLM 0.11 runs that command on H200: the FP8 (128 x 128 block) checkpoint, a bf16 KV cache,
vLLM's API-server batch limits for the GPU, prefix caching on, and the engine loop in series with the GPU
(async scheduling was not yet vLLM's default in 0.11). Nothing is fitted to these runs; the measured model
prices each layer's MLA module, the other GEMMs and the fused MoE from NVIDIA's H200 tables
(docs/moe.md), the roofline model everything.

    .venv/bin/python bench/bench_public_deepseek.py
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from engine.deployment import Deployment  # noqa: E402
from planner.api import simulate  # noqa: E402

SOURCE = "github.com/gpustack/gpustack docs/performance-lab/deepseek-r1/h200.md (vLLM v0.11.0, -tp 8, H200)"


@dataclass(frozen=True)
class Run:
    """One measured run: its load and its means (seconds)."""

    label: str
    input_len: int
    output_len: int
    requests: int
    clients: int
    ttft: float
    tpot: float
    duration: float


# input_len: the run's total input tokens over its requests (vLLM's random prompts tokenize a little short)
RUNS = (
    Run("random 128/4, 1000 at once", 127, 4, 1000, 1000, 19.39211, 0.35183, 22.07),
    Run("random 2K/100, 500 at once", 1997, 100, 500, 500, 28.91190, 0.23702, 59.26),
    Run("random 4K/200, 500 at once", 3995, 200, 500, 500, 63.05871, 0.16423, 132.68),
    Run("random 32K/100, 100 at once", 31999, 100, 100, 100, 101.35199, 0.36579, 206.90),
    Run("ShareGPT means 228/213, 4 clients", 228, 213, 100, 4, 0.12330, 0.01936, 108.42),
)


def predict(run: Run, cost_model: str) -> tuple[float, float, float]:
    deployment = Deployment(model="deepseek-ai/DeepSeek-R1-0528", gpu="h200", tp=8, async_scheduling=False)
    result = simulate(deployment, workload="random", params={"input_len": run.input_len,
                                                             "output_len": run.output_len},
                      requests=run.requests, concurrency=run.clients, cost_model=cost_model)
    m = result.metrics
    return m.ttft_mean, m.tpot_mean, m.duration


def main() -> None:
    print(f"DeepSeek-R1-0528 on 8 x H200, simulated against {SOURCE}")
    print("error = simulated / measured - 1\n")
    header = f"{'run':36s} {'cost model':10s} {'TTFT':>22s} {'TPOT':>22s} {'duration':>22s}"
    print(header)
    errors: dict[str, list[tuple[float, float, float]]] = {}
    for run in RUNS:
        for cost_model in ("measured", "roofline"):
            started = time.perf_counter()
            ttft, tpot, duration = predict(run, cost_model)
            err = (ttft / run.ttft - 1, tpot / run.tpot - 1, duration / run.duration - 1)
            errors.setdefault(cost_model, []).append(err)
            cells = [f"{sim:8.3f} vs {ref:7.3f} {e:+5.0%}" for sim, ref, e in
                     zip((ttft, tpot, duration), (run.ttft, run.tpot, run.duration), err)]
            print(f"{run.label:36s} {cost_model:10s} {' '.join(cells)}  ({time.perf_counter() - started:.1f} s)")
    print()
    for cost_model, rows in errors.items():
        means = [sum(abs(r[i]) for r in rows) / len(rows) for i in range(3)]
        print(f"{cost_model:10s} mean |error|: TTFT {means[0]:.1%}, TPOT {means[1]:.1%}, duration {means[2]:.1%}")


if __name__ == "__main__":
    main()
