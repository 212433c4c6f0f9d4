"""The memory plan against vLLM's own start-up logs: what vLLM 0.19.0 set aside on one H100 node for 39 runs of 17
models (bench/data/vllm_memory_logs.json, copied from public logs, its `source`), and what the planner plans for
the same deployment.

Prints one row per run (weights, activation peak, non-torch memory and KV cache in GiB, logged / planned) and
the mean and largest error of the KV cache, the figure that sets how many tokens a deployment holds. The KV
cache is compared in GiB: for a model with sliding-window layers (Gemma, gpt-oss) vLLM's logged token count
is not its full-attention capacity.

    python bench/bench_memory_vllm_logs.py
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from planner import Deployment
from planner.deploy.plan import plan_deployment

DATA = Path(__file__).parent / "data" / "vllm_memory_logs.json"


def planned(run: dict, gpu: str) -> dict:
    deployment = Deployment(model=run["model"], gpu=gpu, tp=run["tp"], pp=run["pp"], dtype=run["dtype"],
                            quantization=run["quantization"], kv_cache_dtype=run["kv_cache_dtype"],
                            gpu_memory_utilization=run["gpu_memory_utilization"],
                            max_model_len=run["max_model_len"], policy="vllm-v1", enable_prefix_caching=False)
    plan = plan_deployment(deployment, refuse=False).memory.summary()
    return {"weights_gib": plan["weights_gib_per_gpu"], "activation_gib": plan["activations_gib_per_gpu"],
            "non_torch_gib": plan["non_torch_gib_per_gpu"], "kv_gib": plan["kv_gib_per_gpu"]}


def main() -> None:
    data = json.loads(DATA.read_text())
    print(f"vLLM {data['vllm']} on {data['gpu']}: logged / planned, GiB per GPU\n")
    print("| model | dtype, quantization, KV | TP x PP | weights | activations | non-torch | KV cache | KV error |")
    print("|---|---|---|---|---|---|---|---|")
    errors = []
    for run in data["runs"]:
        logged, plan = run["logged"], planned(run, data["gpu"])
        error = plan["kv_gib"] / logged["kv_gib"] - 1
        errors.append(error)
        cells = [f"{logged[k]:.2f} / {plan[k]:.2f}" if logged[k] is not None else f"- / {plan[k]:.2f}"
                 for k in ("weights_gib", "activation_gib", "non_torch_gib", "kv_gib")]
        kind = f"{run['dtype']}, {run['quantization'] or '16-bit'}, KV {run['kv_cache_dtype']}"
        print(f"| {run['model']} | {kind} | {run['tp']} x {run['pp']} | {' | '.join(cells)} | {error:+.1%} |")
    absolute = [abs(e) for e in errors]
    print(f"\nKV cache: mean absolute error {statistics.mean(absolute):.1%}, median {statistics.median(absolute):.1%}, "
          f"largest {max(errors, key=abs):+.1%} over {len(errors)} runs")


if __name__ == "__main__":
    main()
