"""What multi-LoRA serving costs and how --max-loras queues: Llama-3.1-8B on one H100 (docs/lora.md).

Runs the planner's Python API (the measured cost model, vLLM v1's scheduler and its H100 defaults) on ShareGPT
at a fixed rate with requests spread uniformly over N adapters, and prints two markdown tables:

1. the price of adapters: no LoRA, then --max-loras N at each rank (every adapter may run together), with the
   memory the slots take from the KV cache and the TPOT and TTFT;
2. the queue --max-loras makes: rank 16, N adapters in the traffic, --max-loras from N down to 1 (a waiting
   request of another adapter is passed over while max_loras run, as vLLM's scheduler does).

    python bench/bench_lora.py [--adapters 8] [--rate 8] [--requests 600] [--seed 0]
"""
from __future__ import annotations

import argparse

from engine.deployment import Deployment
from planner import simulate

MODEL, GPU = "llama-3.1-8b", "h100"
RANKS = (16, 64)


def run(deployment: Deployment, args, loras: int) -> dict:
    doc = simulate(deployment, workload="sharegpt", rate=args.rate, requests=args.requests, seed=args.seed,
                   params={"loras": loras} if loras else None).document()
    return {"tpot_ms": doc["tpot_mean"] * 1e3, "ttft_s": doc["ttft_mean"], "ttft_p99_s": doc["ttft_p99"],
            "throughput": doc["request_throughput"], "blocks": doc["num_gpu_blocks"],
            "lora_gib": (doc["memory_plan"] or {}).get("lora_gib_per_gpu", 0.0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--adapters", type=int, default=8, help="adapters in the traffic (default 8)")
    ap.add_argument("--rate", type=float, default=8.0, help="requests/s (default 8)")
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    n = args.adapters
    base = run(Deployment(model=MODEL, gpu=GPU), args, 0)
    print(f"## {MODEL} on one {GPU}, ShareGPT at {args.rate:g} req/s, {args.requests} requests, {n} adapters\n")
    print("| deployment | LoRA slots (GiB) | KV blocks | TPOT mean (ms) | x no LoRA | TTFT mean (s) |")
    print("|---|---|---|---|---|---|")
    print(f"| no LoRA | 0 | {base['blocks']:,} | {base['tpot_ms']:.2f} | 1.000 | {base['ttft_s']:.3f} |")
    for rank in RANKS:
        got = run(Deployment(model=MODEL, gpu=GPU, enable_lora=True, max_loras=n, max_lora_rank=rank), args, n)
        print(f"| --max-loras {n} --max-lora-rank {rank} | {got['lora_gib']:.2f} | {got['blocks']:,} | "
              f"{got['tpot_ms']:.2f} | {got['tpot_ms'] / base['tpot_ms']:.3f} | {got['ttft_s']:.3f} |")
    print(f"\n| --max-loras (rank 16, {n} adapters) | TTFT mean (s) | TTFT p99 (s) | TPOT mean (ms) | req/s |")
    print("|---|---|---|---|---|")
    for slots in sorted({n, n // 2, 2, 1} - {0}, reverse=True):
        got = run(Deployment(model=MODEL, gpu=GPU, enable_lora=True, max_loras=slots), args, n)
        print(f"| {slots} | {got['ttft_s']:.3f} | {got['ttft_p99_s']:.2f} | {got['tpot_ms']:.2f} | "
              f"{got['throughput']:.2f} |")


if __name__ == "__main__":
    main()
