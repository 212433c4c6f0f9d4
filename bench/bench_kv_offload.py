"""What vLLM's CPU KV offloading buys long multi-turn chats: Qwen3-32B on one H100 (docs/offload.md).

Runs the planner's Python API (the measured cost model, vLLM v1's scheduler and its H100 defaults) on the
chatbot workload with long histories (each turn's prompt is the whole conversation so far, up to 8,192
tokens; 8 turns on average, 10 s of thinking between them), where one GPU's KV cache (about 32,000 tokens
beside the 64 GB of weights) cannot keep every live conversation. Prints two markdown tables:

1. at a fixed rate, no tier against tiers of --kv-offloading-size GiB: the GPU's prefix hits, the tier's
   hits, TTFT and TPOT, and the share of the host link the tier's copies take;
2. `capacity`: the highest rate each deployment sustains within the SLO.

    python bench/bench_kv_offload.py [--rate 0.5] [--requests 400] [--seed 0] [--no-capacity]
"""
from __future__ import annotations

import argparse
import time

from engine.deployment import Deployment
from planner import capacity, simulate

MODEL, GPU, MAX_MODEL_LEN = "qwen3-32b", "h100-sxm", 16384
PARAMS = {"max_history": 8192, "mean_turns": 8}
SIZES = (None, 8.0, 32.0, 128.0)          # GiB of host memory (None: no tier)
SLO = {"ttft_p99": 10.0, "tpot_p99": 0.1}


def deployment(size: float | None) -> Deployment:
    return Deployment(model=MODEL, gpu=GPU, max_model_len=MAX_MODEL_LEN, kv_offloading_size=size)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=0.5, help="requests/s (default 0.5)")
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-capacity", action="store_true", help="skip the capacity search (about a minute)")
    args = ap.parse_args()
    print(f"## {MODEL} on one {GPU}, chatbot (max_history 8192, mean_turns 8) at {args.rate:g} req/s, "
          f"{args.requests} requests\n")
    print("| --kv-offloading-size | tier blocks | GPU prefix hits | tier hits | TTFT mean (s) | TTFT p99 (s) | "
          "TPOT mean (ms) | host link busy | wall (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for size in SIZES:
        start = time.perf_counter()
        doc = simulate(deployment(size), workload="chatbot", rate=args.rate, requests=args.requests,
                       seed=args.seed, params=PARAMS).document()
        tier = doc.get("kv_offload") or {}
        print(f"| {'off' if size is None else f'{size:g} GiB'} | {tier.get('cpu_blocks', 0):,} | "
              f"{doc['prefix_cache_hit_rate']:.1%} | {tier.get('hit_rate', 0):.1%} | {doc['ttft_mean']:.3f} | "
              f"{doc['ttft_p99']:.2f} | {doc['tpot_mean'] * 1e3:.2f} | {tier.get('host_link_utilization', 0):.2%} | "
              f"{time.perf_counter() - start:.1f} |")
    if args.no_capacity:
        return
    print(f"\n| --kv-offloading-size | capacity (req/s) within ttft_p99 {SLO['ttft_p99']:g} s, "
          f"tpot_p99 {SLO['tpot_p99']:g} s |")
    print("|---|---|")
    for size in (None, 32.0):
        found = capacity(deployment(size), workload="chatbot", requests=args.requests, seed=args.seed,
                         params=PARAMS, slos=SLO, start_rate=args.rate)
        print(f"| {'off' if size is None else f'{size:g} GiB'} | {found.rate:.3f} (binds: {found.binding_slo}) |")


if __name__ == "__main__":
    main()
