"""Every catalog model on a few GPUs, bf16 and FP8, TP 1-8, simulated one after another in one process.

Each deployment runs 64 requests of vLLM bench's random dataset (1,024 in / 128 out) from 16 clients. The
bench prints what no single test covers:

- crashes: a run that fails other than with the planner's one-line refusal (a PlannerError or ValueError);
  there must be none;
- refusals by reason (heads TP does not split, a model that does not fit, a format the GPU lacks, ...);
- the process's resident memory after the sweep and after running its first quarter again (every table
  and cache then loaded already): a run must leave nothing behind (stop 83 found every closed-loop run
  leaking its engines: 9.2 GiB after 400 runs);
- orderings a user would question, listed for a look, not failed: a B200 slower than an H100, TP 2k slower
  than TP k where a step takes over 5 ms, FP8 slower than bf16 (NVIDIA's tables say so in places:
  per-tensor FP8 fused MoE on Hopper, small dense models at 16 sequences).

    .venv/bin/python bench/bench_catalog_sweep.py [--quick] [--gpus h100-sxm,b200]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from engine.deployment import Deployment  # noqa: E402
from planner.api import simulate  # noqa: E402
from planner.catalog import list_models  # noqa: E402

FORMATS = (None, "fp8")
TPS = (1, 2, 4, 8)
REFUSALS = (ValueError,)       # PlannerError, OutOfMemory and pydantic's errors are ValueErrors


def resident_mib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20


def reason(exc: Exception) -> str:
    """A refusal's first line with its numbers and names of models left out, to count alike ones together."""
    words = str(exc).splitlines()[0].split()[:9]
    return " ".join("N" if any(c.isdigit() for c in w) else w for w in words)


def run(model: str, gpu: str, fmt: str | None, tp: int) -> float | None:
    """The deployment's mean TPOT (None where no request produced two tokens)."""
    result = simulate(Deployment(model=model, gpu=gpu, tp=tp, quantization=fmt), workload="random",
                      params={"input_len": 1024, "output_len": 128}, requests=64, concurrency=16)
    return result.metrics.tpot_mean


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", default="h100-sxm,b200,rtx-pro-6000")
    parser.add_argument("--quick", action="store_true", help="every seventh deployment only")
    args = parser.parse_args()
    jobs = [(m.name, g, q, tp) for m in list_models() for g in args.gpus.split(",") for q in FORMATS for tp in TPS]
    if args.quick:
        jobs = jobs[::7]
    tpot: dict[tuple, float | None] = {}
    refused: Counter = Counter()
    crashes: list[str] = []
    started = time.perf_counter()
    for model, gpu, fmt, tp in jobs:
        try:
            tpot[model, gpu, fmt, tp] = run(model, gpu, fmt, tp)
        except REFUSALS as exc:
            refused[type(exc).__name__ + ": " + reason(exc)] += 1
        except Exception:        # noqa: BLE001 - what the bench is for
            crashes.append(f"{model} {gpu} {fmt} tp{tp}:\n{traceback.format_exc()}")
    wall = time.perf_counter() - started
    swept_mib = resident_mib()
    again = [job for job in jobs[:len(jobs) // 4] if job in tpot]
    for job in again:
        run(*job)
    again_mib = resident_mib()
    print(f"{len(jobs)} deployments in {wall:.0f} s: {len(tpot)} simulated, {sum(refused.values())} refused, "
          f"{len(crashes)} crashed")
    print(f"resident memory: {swept_mib} MiB after the sweep, {again_mib} MiB after {len(again)} of its runs "
          f"again")
    print("refusals by reason:")
    for text, count in refused.most_common():
        print(f"  {count:4d}  {text}")
    print("orderings to look at:")
    for (model, gpu, fmt, tp), t in sorted(tpot.items(), key=lambda kv: str(kv[0])):
        for other, label in (((model, "b200", fmt, tp), "B200 slower than H100") if gpu == "h100-sxm" else (None, ""),
                             ((model, gpu, fmt, 2 * tp), f"TP{2 * tp} slower than TP{tp}"),
                             ((model, gpu, "fp8", tp), "FP8 slower than bf16") if fmt is None else (None, "")):
            slower = tpot.get(other) if other else None
            if t is not None and slower is not None and slower > t * 1.05 and (t > 0.005 or "TP" not in label):
                print(f"  {label}: {model} {gpu} {fmt or 'bf16'} tp{tp}: {slower * 1e3:.2f} vs {t * 1e3:.2f} ms")
    for crash in crashes:
        print("CRASH", crash)
    sys.exit(1 if crashes else 0)


if __name__ == "__main__":
    main()
