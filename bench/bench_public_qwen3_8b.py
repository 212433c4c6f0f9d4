"""The planner against a public sweep of vLLM 0.18 serving Qwen3-8B on one H100: an independent check, nothing fitted.

Data. github.com/adithyaJRunpod/vllm_bench (commit 9f6d09d, 2026-04-02) holds the `vllm bench serve` logs of
`vllm serve Qwen/Qwen3-8B --gpu-memory-utilization 0.95 --max-model-len 8128` (vLLM 0.18.0, one H100 80GB HBM3)
and of eleven variants of it (one flag each: token budget, max_num_seqs, FP8 KV cache, FP8 weights, prefix
caching, eager mode, chunked prefill off), each server's log beside: 116 runs of 1,024 random prompts
(512 in / 256 out, some 128 / 128) on the chat endpoint at a request rate with a limit on requests in flight
(`--request-rate R --max-concurrency C`: 5-500 req/s, 4-256 in flight), copied into
bench/data/runpod_qwen3_8b_h100.json with the file each came from.

Each run is simulated as its command ran it (`Deployment` with the command's flags; vLLM 0.18's defaults
otherwise: async scheduling, prefix caching, 8,192 batched tokens, 1,024 sequences on an H100), under the same
load (`simulate(..., rate=R, concurrency=C)`, the clients served), priced by the measured model. Left out:
`--enforce-eager` runs (the planner prices vLLM with CUDA graphs). The log's KV cache size is set beside the
memory plan's for each server.

Compared: mean TTFT, mean TPOT (vLLM bench's mean ITL: every request has the same number of tokens, so the
two are the same mean), mean E2E and the run's duration. Nothing is fitted to these runs.

    .venv/bin/python bench/bench_public_qwen3_8b.py [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from engine.deployment import Deployment  # noqa: E402
from planner.api import simulate  # noqa: E402
from planner.deploy.plan import plan_deployment  # noqa: E402
from planner.sim.clients import SERVED_TURNAROUND  # noqa: E402

DATA = os.path.join(ROOT, "bench", "data", "runpod_qwen3_8b_h100.json")
NOT_MODELLED = ("--enforce-eager",)
# the serve flags the runs vary, as Deployment fields (a flag followed by its value, or a switch)
VALUED = {"--max-num-batched-tokens": ("max_num_batched_tokens", int), "--max-num-seqs": ("max_num_seqs", int),
          "--kv-cache-dtype": ("kv_cache_dtype", str), "--quantization": ("quantization", str),
          "--gpu-memory-utilization": ("gpu_memory_utilization", float), "--max-model-len": ("max_model_len", int)}
SWITCHES = {"--enable-prefix-caching": ("enable_prefix_caching", True),
            "--no-enable-prefix-caching": ("enable_prefix_caching", False),
            "--no-enable-chunked-prefill": ("enable_chunked_prefill", False)}
IGNORED = {"--host", "--port", "--dtype"}          # (--dtype auto: the checkpoint's bf16)


@dataclass(frozen=True)
class Run:
    """One measured run: its server's settings, its load and its means (seconds)."""

    id: str
    settings: tuple[tuple[str, object], ...]
    rate: float
    clients: int
    requests: int
    input_len: int
    output_len: int
    ttft: float
    tpot: float
    e2e: float
    duration: float
    kv_tokens_logged: int | None

    @property
    def flags(self) -> str:
        return flags_of(self.settings)

    def deployment(self) -> Deployment:
        return Deployment(model="Qwen/Qwen3-8B", gpu="h100-sxm", client_turnaround=SERVED_TURNAROUND,
                          **dict(self.settings))


def flags_of(settings: tuple[tuple[str, object], ...]) -> str:
    """The settings a variant changes from the sweep's base server, in a few words."""
    changed = [f"{k}={v}" for k, v in settings if k not in ("gpu_memory_utilization", "max_model_len")]
    return ",".join(changed) or "defaults"


def serve_settings(command: str) -> dict[str, object] | None:
    """The Deployment fields a `vllm serve Qwen/Qwen3-8B ...` command sets (None: a setting not modelled)."""
    words = shlex.split(command)[3:]
    settings: dict[str, object] = {}
    i = 0
    while i < len(words):
        flag = words[i]
        if flag in NOT_MODELLED:
            return None
        if flag in SWITCHES:
            key, value = SWITCHES[flag]
            settings[key] = value
            i += 1
        elif flag in VALUED:
            key, kind = VALUED[flag]
            settings[key] = kind(words[i + 1])
            i += 2
        elif flag in IGNORED:
            i += 2
        else:
            raise SystemExit(f"{command!r}: unknown flag {flag}")
    return settings


def load_runs(path: str = DATA) -> tuple[list[Run], int]:
    """The runs the planner can price, and how many were left out."""
    runs, left_out = [], 0
    for r in json.load(open(path))["runs"]:
        settings = serve_settings(r["serve"])
        if settings is None:
            left_out += 1
            continue
        runs.append(Run(r["id"], tuple(sorted(settings.items())), r["rate"], r["max_concurrency"], r["successful"],
                        r["input_len"], r["output_len"], r["ttft_mean_ms"] / 1e3, r["itl_mean_ms"] / 1e3,
                        r["e2el_mean_ms"] / 1e3, r["duration_s"], r["kv_cache_tokens_logged"]))
    return runs, left_out


def predict(run: Run) -> tuple[float, float, float, float]:
    """Simulated mean TTFT, mean TPOT, mean E2E and duration (s)."""
    m = simulate(run.deployment(), workload="random", params={"input_len": run.input_len,
                                                               "output_len": run.output_len},
                 requests=run.requests, rate=run.rate, concurrency=run.clients).metrics
    return m.ttft_mean, m.tpot_mean, m.e2e_mean, m.duration


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="every fourth run only")
    args = parser.parse_args()
    runs, left_out = load_runs()
    print("Qwen3-8B on one H100, vLLM 0.18.0 (github.com/adithyaJRunpod/vllm_bench at 9f6d09d), simulated")
    print(f"{len(runs)} runs ({left_out} left out: --enforce-eager)\n")
    print("KV cache per server: logged by vLLM against the memory plan")
    for settings in sorted({r.settings for r in runs}, key=str):
        logged = sorted({r.kv_tokens_logged for r in runs if r.settings == settings and r.kv_tokens_logged})
        plan = plan_deployment(Deployment(model="Qwen/Qwen3-8B", gpu="h100-sxm", **dict(settings)))
        planned = plan.num_gpu_blocks * plan.block_size
        cells = ", ".join(f"{n:,} ({planned / n - 1:+.2%})" for n in logged) or "not logged"
        print(f"  {flags_of(settings):40s} planned {planned:,}; logged {cells}")
    print("\nerror = simulated / measured - 1")
    print(f"{'run':44s} {'flags':26s} {'rate':>5s} {'C':>4s} {'TTFT ms':>20s} {'TPOT ms':>18s} {'E2E s':>16s} "
          f"{'duration s':>18s}")
    errors = []
    for run in runs[::4] if args.quick else runs:
        started = time.perf_counter()
        sim = predict(run)
        ref = (run.ttft, run.tpot, run.e2e, run.duration)
        err = tuple(s / r - 1 for s, r in zip(sim, ref))
        errors.append(err)
        cells = [f"{s * k:7.1f} vs {r * k:6.1f} {e:+4.0%}" for s, r, e, k in zip(sim, ref, err, (1e3, 1e3, 1, 1))]
        print(f"{run.id[:44]:44s} {run.flags[:26]:26s} {run.rate:5.0f} {run.clients:4d} {' '.join(cells)}"
              f"  ({time.perf_counter() - started:.1f} s)", flush=True)
    print()
    for i, name in enumerate(("TTFT", "TPOT", "E2E", "duration")):
        values = [e[i] for e in errors]
        print(f"{name:8s} mean |error| {sum(abs(v) for v in values) / len(values):6.1%}   median |error| "
              f"{statistics.median(abs(v) for v in values):6.1%}   mean signed {sum(values) / len(values):+6.1%}   "
              f"worst {max(values, key=abs):+6.1%}")


if __name__ == "__main__":
    main()
