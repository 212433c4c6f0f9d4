"""The planner against GPUStack's published vLLM runs on H100 and H200: an independent check, nothing fitted.

Data. GPUStack's Inference Performance Lab (github.com/gpustack/gpustack, docs/performance-lab/) publishes
`vllm bench serve` results of `vllm serve`, each with the serving command it ran: on H100 SXM GPUs Qwen3-8B
(vLLM 0.11.0, ShareGPT at 1-8 clients), Qwen3-14B and Qwen3-32B (0.11.0), gpt-oss-20b (0.11.0), gpt-oss-120b
(0.10.2, one GPU and TP2) and Qwen3-235B-A22B (0.11.0, bf16 at TP8 and FP8 at TP4); on one 8 x H200 node
DeepSeek-R1-0528 (0.11.0, TP8: the planner's first check of MLA, docs/moe.md). The runs kept here, copied into
bench/data/gpustack_vllm.json with their page and commit, are:
- the bursts of vLLM bench's random dataset (32000/100, 4000/200, 2000/100 and 128/4 tokens; every request
  sent at once, vLLM bench's default rate), simulated at the run's own mean lengths: vLLM bench's random
  prompts tokenize a little short, and without `--ignore-eos` answers stop early (gpt-oss's 4000/200 answers
  average 134 tokens);
- the ShareGPT runs at a fixed concurrency, simulated at their recorded mean lengths, the clients served
  (`client_turnaround`) as vLLM bench's are.
Left out: the ShareGPT bursts (their lengths are the dataset's, which this machine does not have), the two
Qwen3-235B runs that lost 16 of 1,000 requests, SGLang and TensorRT-LLM.

Deployment: each run's own command as vLLM of its version runs it: its TP, max_model_len and token budget where
it sets them, vLLM's defaults otherwise (the API server's batch limits for the GPU, prefix caching on, the
checkpoint's own format: DeepSeek-R1's block FP8 with a bf16 KV cache, the engine loop in series unless the
command says `--async-scheduling`: vLLM 0.10 and 0.11 did not schedule ahead by default). A run whose
deployment the memory plan refuses (vLLM would not start it at gpu_memory_utilization 0.9) is reported as
refused, with the plan's reason.

The bench calls the chat endpoint (`--backend openai-chat`); NVIDIA's runs that the host time was fitted on
call the completions endpoint. Nothing here is fitted: the figures say where the planner stands on
deployments it has not seen (docs/calibration.md, docs/moe.md).

    .venv/bin/python bench/bench_public_gpustack.py [--cost-model measured,roofline] [--model gpt-oss]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from engine.deployment import Deployment  # noqa: E402
from planner.api import simulate  # noqa: E402
from planner.catalog.models import resolve_model  # noqa: E402
from planner.errors import PlannerError  # noqa: E402
from planner.sim.clients import SERVED_TURNAROUND  # noqa: E402

DATA = os.path.join(ROOT, "bench", "data", "gpustack_vllm.json")


@dataclass(frozen=True)
class Run:
    """One measured run: its deployment, its load, and its means (seconds)."""

    label: str
    model: str
    gpu: str
    tp: int
    async_scheduling: bool
    max_model_len: int | None
    max_num_batched_tokens: int | None
    dataset: str
    requests: int
    clients: int
    input_len: int
    output_len: int
    ttft: float
    tpot: float
    duration: float

    @property
    def moe(self) -> bool:
        return resolve_model(self.model).is_moe

    def deployment(self) -> Deployment:
        limits = {k: v for k, v in (("max_model_len", self.max_model_len),
                                    ("max_num_batched_tokens", self.max_num_batched_tokens)) if v is not None}
        served = {"client_turnaround": SERVED_TURNAROUND} if self.clients < self.requests else {}
        return Deployment(model=self.model, gpu=self.gpu, tp=self.tp, async_scheduling=self.async_scheduling,
                          **limits, **served)


def load_runs(path: str = DATA) -> list[Run]:
    runs = []
    for r in json.load(open(path))["runs"]:
        n = r["requests"]
        isl, osl = round(r["total_input_tokens"] / n), round(r["total_generated_tokens"] / n)
        name = r["model"].split("/")[-1].replace("-Instruct-2507", "")
        load = f"{isl}/{osl} " + (f"x{n} at once" if r["clients"] == n else f"{r['dataset']} c{r['clients']}")
        gpu = "" if r["gpu"] == "h100-sxm" else f"{r['gpu']} "
        flags = f"{gpu}tp{r['tp']}" + (" async" if r["async_scheduling"] else "")
        runs.append(Run(f"{name} {flags} {load}", r["model"], r["gpu"], r["tp"], r["async_scheduling"],
                        r["max_model_len"], r["max_num_batched_tokens"], r["dataset"], n, r["clients"], isl, osl,
                        r["ttft_mean_ms"] / 1e3, r["tpot_mean_ms"] / 1e3, r["duration_s"]))
    return runs


def predict(run: Run, cost_model: str) -> tuple[float, float, float]:
    """Simulated mean TTFT, mean TPOT and duration (s) of the run."""
    result = simulate(run.deployment(), workload="random",
                      params={"input_len": run.input_len, "output_len": run.output_len},
                      requests=run.requests, concurrency=run.clients, cost_model=cost_model)
    m = result.metrics
    return m.ttft_mean, m.tpot_mean, m.duration


def summarise(label: str, rows: list[tuple[float, float, float]]) -> str:
    if not rows:
        return f"{label}: no run simulated"
    names = ("TTFT", "TPOT", "duration")
    cells = []
    for i, name in enumerate(names):
        errs = [r[i] for r in rows]
        cells.append(f"{name} {sum(abs(e) for e in errs) / len(errs):.1%} ({sum(errs) / len(errs):+.1%})")
    return f"{label} ({len(rows)} runs), mean |error| (mean signed): " + ", ".join(cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cost-model", default="measured", help="comma list of cost models (measured, roofline)")
    parser.add_argument("--model", default="", help="only the runs whose model id contains this")
    args = parser.parse_args()
    runs = [r for r in load_runs() if args.model.lower() in r.model.lower()]
    print("GPUStack's vLLM runs (github.com/gpustack/gpustack docs/performance-lab/), simulated")
    print("error = simulated / measured - 1\n")
    print(f"{'run':48s} {'cost model':9s} {'TTFT s':>22s} {'TPOT ms':>22s} {'duration s':>22s}")
    errors: dict[tuple[str, str, bool], list[tuple[float, float, float]]] = {}
    for run in runs:
        for cost_model in args.cost_model.split(","):
            started = time.perf_counter()
            try:
                ttft, tpot, duration = predict(run, cost_model)
            except PlannerError as exc:
                print(f"{run.label:48s} {cost_model:9s} refused: {str(exc).split(';')[0]}")
                continue
            err = (ttft / run.ttft - 1, tpot / run.tpot - 1, duration / run.duration - 1)
            errors.setdefault((cost_model, run.gpu, run.moe), []).append(err)
            cells = [f"{sim * k:8.3f} vs {ref * k:7.3f} {e:+5.0%}" for sim, ref, e, k in
                     zip((ttft, tpot, duration), (run.ttft, run.tpot, run.duration), err, (1, 1e3, 1))]
            print(f"{run.label:48s} {cost_model:9s} {' '.join(cells)}  ({time.perf_counter() - started:.1f} s)",
                  flush=True)
    print()
    for (cost_model, gpu, moe), rows in sorted(errors.items()):
        print(summarise(f"{cost_model}, {gpu}, {'MoE' if moe else 'dense'}", rows))


if __name__ == "__main__":
    main()
