"""Where speculative decoding stops paying: Llama-3.1-8B on one H100, EAGLE-style acceptance (docs/speculative.md).

Runs `planner simulate` (the CLI, as a user would) on ShareGPT under a closed loop of N clients for
N = 1, 2, 4, ..., 1024, without speculation and with EAGLE speculation for each K asked (default
acceptance curve: EAGLE-3 on Llama-3.1-8B-Instruct, MT-bench, vLLM issue #20780), vLLM v1's
scheduler with its defaults on an H100 (8,192-token budget, prefix caching), and prints a markdown table: TPOT mean, output
throughput, mean acceptance length, and the speedup of each; then, per K, the smallest concurrency
at which speculation's throughput falls below the plain deployment's.

    python bench/bench_spec_study.py [--k 3] [--requests-per-client 4] [--min-requests 200] [--workload alpaca]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

CONCURRENCY = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def sweep(speculative: str, concurrency: int, requests: int, seed: int, workload: str) -> dict:
    cmd = [sys.executable, "-c", "import sys; from planner.cli import main; sys.argv[0] = 'planner'; main()", "simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm",
           "--policy", "vllm-v1", "--workload", workload, "--concurrency", str(concurrency),
           "--requests", str(requests), "--seed", str(seed), "--speculative", speculative, "--json",
           "--out", f"/tmp/bench_spec_study/{workload}-{speculative.replace(':', '-')}-{concurrency}"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", default="3", help="comma list of draft lengths (default 3)")
    ap.add_argument("--requests-per-client", type=int, default=4)
    ap.add_argument("--min-requests", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workload", default="sharegpt", help="a built-in workload (default sharegpt)")
    args = ap.parse_args()
    ks = [int(k) for k in args.k.split(",")]
    settings = ["none"] + [f"eagle:{k}" for k in ks]
    rows: dict[int, dict[str, dict]] = {}
    wall = time.perf_counter()
    for c in CONCURRENCY:
        n = max(args.min_requests, args.requests_per_client * c)
        rows[c] = {s: sweep(s, c, n, args.seed, args.workload) for s in settings}
        print(f"concurrency {c}: done ({time.perf_counter() - wall:.0f} s)", file=sys.stderr)
    head = ["clients", "TPOT none (ms)", "tok/s none"]
    for k in ks:
        head += [f"TPOT eagle:{k} (ms)", f"tok/s eagle:{k}", f"AL eagle:{k}", f"TPOT gain eagle:{k}",
                 f"throughput gain eagle:{k}"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---:|" * len(head))
    stops = {k: None for k in ks}
    for c, by in rows.items():
        base = by["none"]
        cells = [str(c), f"{base['tpot_mean'] * 1e3:.2f}", f"{base['output_token_throughput']:,.0f}"]
        for k in ks:
            r = by[f"eagle:{k}"]
            gain_t = base["tpot_mean"] / r["tpot_mean"]
            gain_x = r["output_token_throughput"] / base["output_token_throughput"]
            cells += [f"{r['tpot_mean'] * 1e3:.2f}", f"{r['output_token_throughput']:,.0f}",
                      f"{r['spec_decoding_stats']['mean_acceptance_length']:.2f}", f"{gain_t:.2f}x", f"{gain_x:.2f}x"]
            if gain_x < 1 and stops[k] is None:
                stops[k] = c
        print("| " + " | ".join(cells) + " |")
    for k in ks:
        print(f"\neagle:{k}: throughput below no speculation from {stops[k]} clients on" if stops[k]
              else f"\neagle:{k}: pays at every concurrency up to {CONCURRENCY[-1]}")
    print(f"\n({time.perf_counter() - wall:.0f} s wall)", file=sys.stderr)


if __name__ == "__main__":
    main()
