"""NVIDIA's fused-MoE rows per expert format against the bf16 rows of the same shape and split, per GPU: the
median ratio (and range) of per-tensor `fp8` and block `fp8_block` latency over `bfloat16`, balanced routing,
no expert parallelism, at a few token counts. Half the bytes predicts about 0.5-0.6 wherever the experts'
weights bound the time; docs/moe.md ("Per-tensor FP8 experts on Hopper") reads this table.

    .venv/bin/python bench/bench_moe_fp8_rows.py
"""
from __future__ import annotations

import os
import statistics
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from planner.cost import tables  # noqa: E402

TOKENS = (8, 32, 128, 512, 2048)
SYSTEMS = ("h100_sxm", "h200_sxm", "b200_sxm", "l40s", "rtx_pro_6000_server")


def ratios(system: str) -> dict[tuple[str, int], list[float]]:
    latency: dict[tuple, dict[str, float]] = defaultdict(dict)
    for r in tables.load_rows(system, "moe"):
        if r["distribution"] == "balanced" and int(r["moe_ep_size"]) == 1 and int(r["num_tokens"]) in TOKENS:
            shape = (r["hidden_size"], r["inter_size"], r["num_experts"], r["topk"], r["moe_tp_size"],
                     int(r["num_tokens"]))
            latency[shape][r["moe_dtype"]] = r["latency"]
    out: dict[tuple[str, int], list[float]] = defaultdict(list)
    for shape, by_format in latency.items():
        for fmt in ("fp8", "fp8_block"):
            if fmt in by_format and "bfloat16" in by_format:
                out[fmt, shape[-1]].append(by_format[fmt] / by_format["bfloat16"])
    return out


def main() -> None:
    print(f"{'system':22s} {'format':10s} " + " ".join(f"{t:>20d}" for t in TOKENS) + "   (tokens)")
    for system in SYSTEMS:
        if not tables.has_table(system, "moe"):
            continue
        found = ratios(system)
        for fmt in ("fp8", "fp8_block"):
            cells = [found.get((fmt, t)) for t in TOKENS]
            if not any(cells):
                continue
            print(f"{system:22s} {fmt:10s} " + " ".join(
                f"{statistics.median(c):5.2f} [{min(c):4.2f},{max(c):5.2f}]" if c else f"{'-':>20s}" for c in cells))


if __name__ == "__main__":
    main()
