"""P/D study: which prefill:decode ratio `planner search --pd auto` picks against aggregated serving
(docs/pd.md): Llama-3.1-70B on H100 at TP 4 and 8, a long-prompt random workload (8,000 prompt tokens,
200 output tokens), vLLM v1's scheduler, pools linked by InfiniBand NDR (one 400 Gb/s NIC per GPU).

Runs the CLI (`planner search --pd auto --json`) once per target rate and prints a markdown table per
rate: aggregated serving's fewest replicas, the cheapest P:D meeting the SLOs, the pool that binds in
the winner and in its neighbours with one replica fewer, and the winner's TTFT in parts.

    python bench/bench_pd_study.py [--rates 2,4,8,16] [--tp 4,8] [--duration 120] [--slo ttft_p99=3,tpot_p99=0.05]
        [--prefill-tp 8 --decode-tp 4]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


# vLLM v1's scheduler as docs/pd.md's study ran it: a 2,048-token budget, 256 sequences, no prefix caching (the
# policy's defaults on an H100 became vLLM's API server's since: 8,192 tokens, 1,024 sequences, prefix caching on).
POLICY = ("--policy", "vllm-v1", "--max-num-batched-tokens", "2048", "--max-num-seqs", "256",
          "--no-enable-prefix-caching")


def search(rate: float, tps: str, duration: float, slo: str, input_len: int, output_len: int,
           pools: list[str]) -> dict:
    tag = "".join(pools).replace("--", "-")
    out = f"/tmp/bench_pd_study/rate-{rate:g}{tag}"
    cmd = [sys.executable, "-c", "import sys; from planner.cli import main; sys.argv[0] = 'planner'; main()",
           "search", "--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--tp", tps, *POLICY,
           "--workload", "random", "-p", f"input_len={input_len}", "-p", f"output_len={output_len}",
           "--rate", str(rate), "--duration", str(duration), "--slo", slo, "--pd", "auto", *pools, "--json", "--out", out]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode:
        sys.exit(done.stderr.strip().splitlines()[-1])
    return json.loads(done.stdout)


def ttft_parts(rate: float, tp: int, pd: str, duration: float, input_len: int, output_len: int,
               pools: list[str]) -> dict:
    """The winner simulated once more, for its TTFT in parts (result.json's pd.ttft_parts_mean)."""
    out = f"/tmp/bench_pd_study/sim-{rate:g}-{tp}{''.join(pools).replace('--', '-')}"
    cmd = [sys.executable, "-c", "import sys; from planner.cli import main; sys.argv[0] = 'planner'; main()",
           "simulate", "--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--tp", str(tp), *POLICY,
           "--workload", "random", "-p", f"input_len={input_len}", "-p", f"output_len={output_len}",
           "--rate", str(rate), "--duration", str(duration), "--pd", pd, *pools, "--json", "--out", out]
    doc = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    return {"parts": doc["pd"]["ttft_parts_mean"], "ttft_mean": doc["ttft_mean"], "ttft_p99": doc["ttft_p99"],
            "tpot_p99": doc["tpot_p99"], "verdict": doc["verdict"]["lines"][0]}


def neighbour(config: dict, prefill: int, decode: int) -> str:
    row = next((r for r in config["neighbours"] if r["pd"] == f"{prefill}:{decode}"), None)
    if row is None:
        return "-"
    return f"{row['pd']} {'meets' if row['meets'] else 'misses'}, {row['binds']} binds"


def report(rate: float, doc: dict, args) -> None:
    print(f"\n### {rate:g} req/s ({doc['wall_time']:.0f} s of search)\n")
    print("| TP | aggregated replicas (GPUs, $/h) | P:D (GPUs, $/h) | binds | one prefill fewer | one decode fewer "
          "| TTFT mean = prefill queue + prefill + decode admission + transfer + decode start + first step |")
    print("|---|---|---|---|---|---|---|")
    for config in doc["configs"]:
        agg, best = config["aggregated"], config["best"]
        aggregated = ("-" if agg["replicas"] is None else
                      f"{agg['replicas']} ({agg['gpus']}, {agg['cost_per_hour']:.2f})")
        if best is None:
            print(f"| {config['tp']} | {aggregated} | {config['note']} | | | | |")
            continue
        p, d = best["prefill"], best["decode"]
        sim = ttft_parts(rate, config["tp"], best["pd"], args.duration, args.input_len, args.output_len, pools(args))
        parts = " + ".join(f"{v * 1e3:.0f}" for v in sim["parts"].values())
        print(f"| {config['tp']} | {aggregated} | {best['pd']} ({best['gpus']}, {best['cost_per_hour']:.2f}) | "
              f"{best['binds']}{' (queues)' if best['saturated'] else ''} | {neighbour(config, p - 1, d)} | "
              f"{neighbour(config, p, d - 1)} | {sim['ttft_mean'] * 1e3:.0f} ms = {parts} ms |")
        print(f"\n<!-- {config['tp']}: {sim['verdict']} -->", file=sys.stderr)


def pools(args) -> list[str]:
    """--prefill-tp / --decode-tp passed through (each pool's TP; default: the searched TP)."""
    return [w for name in ("prefill_tp", "decode_tp") if getattr(args, name) is not None
            for w in ("--" + name.replace("_", "-"), str(getattr(args, name)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="2,4,8,16")
    ap.add_argument("--tp", default="4,8")
    ap.add_argument("--duration", type=float, default=120.0)
    ap.add_argument("--slo", default="ttft_p99=3,tpot_p99=0.05")
    ap.add_argument("--input-len", type=int, default=8000)
    ap.add_argument("--output-len", type=int, default=200)
    ap.add_argument("--prefill-tp", type=int, help="the prefill pool's TP (default: the searched TP)")
    ap.add_argument("--decode-tp", type=int, help="the decode pool's TP (default: the searched TP)")
    args = ap.parse_args()
    started = time.perf_counter()
    for rate in (float(r) for r in args.rates.split(",")):
        report(rate, search(rate, args.tp, args.duration, args.slo, args.input_len, args.output_len, pools(args)),
               args)
    print(f"\n{time.perf_counter() - started:.0f} s in all", file=sys.stderr)


if __name__ == "__main__":
    main()
