"""The fixed set of commands whose numbers the restructure must not change (issue 22).

Each case is a `planner` command line run with --json; `tests/data/golden/<name>.json`
holds what the code before the restructure printed (recorded at commit 802f3c7).
test_golden.py runs the same lines now and compares every number.
"""
from __future__ import annotations

import math
import re

REQUESTS = ["--requests", "150"]
WORKLOADS = ("sharegpt", "alpaca", "chatbot", "prefix", "parallel", "beam", "fixed", "uniform")

CASES: dict[str, list[str]] = {
    **{f"simulate-{w}": ["simulate", "--workload", w, "--rate", "2", *REQUESTS] for w in WORKLOADS},
    "simulate-chunked": ["simulate", "--workload", "sharegpt", "--rate", "4", *REQUESTS, "--chunked-prefill"],
    "simulate-chunked-prefix": ["simulate", "--workload", "prefix", "--rate", "4", *REQUESTS, "--chunked-prefill",
                                "--enable-prefix-caching"],
    "simulate-prefix-caching": ["simulate", "--workload", "prefix", "--rate", "4", *REQUESTS,
                                "--enable-prefix-caching"],
    "simulate-recompute-pressure": ["simulate", "--workload", "sharegpt", "--rate", "4", *REQUESTS,
                                    "--num-gpu-blocks", "300"],
    "simulate-swap-pressure": ["simulate", "--workload", "sharegpt", "--rate", "4", *REQUESTS,
                               "--num-gpu-blocks", "300", "--preemption-mode", "swap"],
    "simulate-roofline-tp2": ["simulate", "--model", "llama-2-13b", "--gpu", "a10g", "--tp", "2", "--workload",
                              "alpaca", "--rate", "3", *REQUESTS, "--max-model-len", "2048"],
    "simulate-h100-llama": ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--workload", "sharegpt",
                            "--rate", "8", *REQUESTS, "--max-model-len", "4096", "--block-size", "32",
                            "--max-num-seqs", "128"],
    "simulate-calibrated-cpu": ["simulate", "--model", "opt-125m", "--gpu", "cpu", "--workload", "alpaca",
                                "--rate", "4", "--requests", "60"],
    "simulate-seeds": ["simulate", "--workload", "alpaca", "--rate", "4", "--requests", "80", "--seeds", "3"],
    "simulate-step-by-step": ["simulate", "--workload", "sharegpt", "--rate", "2", *REQUESTS, "--step-by-step"],
    "sweep": ["simulate", "--workload", "sharegpt", "--requests", "100", "--rate", "1,3",
              "--allocator", "paged,orca-max"],
    "capacity": ["capacity", "--workload", "sharegpt", "--requests", "100", "--slo", "0.2", "--tolerance", "0.1"],
    "capacity-chunked": ["capacity", "--workload", "alpaca", "--requests", "100", "--slo", "ttft_p99=2",
                         "--slo", "tpot_p99=0.1", "--tolerance", "0.1", "--chunked-prefill"],
    "search": ["search", "--model", "opt-6.7b", "--gpus", "a100-80g,l40s", "--tp", "1,2", "--requests", "80",
               "--slo", "ttft_p99=2,tpot_p99=0.2", "--tolerance", "0.1", "--workers", "1"],
}

# vllm-v1 became the default policy, with prefix caching on, after the goldens were recorded: the paper's
# cases run its policy by name, and the chunked cases that ran without prefix caching say so. So did
# vLLM's async scheduling on a GPU: the chunked cases, recorded with the host in series, say so too.
PAPER = ["--policy", "paper"]
NO_PREFIX_CACHING = ["--no-enable-prefix-caching"]
SYNCHRONOUS = ["--no-async-scheduling"]
for _name, _line in CASES.items():
    if "--chunked-prefill" not in _line:
        _line += PAPER
        continue
    _line += SYNCHRONOUS
    if "--enable-prefix-caching" not in _line:
        _line += NO_PREFIX_CACHING

# Keys whose values measure the machine, not the model: left out of the comparison.
IGNORED_KEYS = {"wall_time", "simulated_seconds_per_wall_second", "profile_check", "report", "folder"}


def numbers(doc, path: str = "") -> dict[str, float]:
    """Every number in a JSON document by its path ('runs.0.ttft_mean'), ignored keys left out."""
    found: dict[str, float] = {}
    if isinstance(doc, dict):
        for key, value in doc.items():
            if key not in IGNORED_KEYS:
                found.update(numbers(value, f"{path}.{key}" if path else str(key)))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            found.update(numbers(value, f"{path}.{i}"))
    elif isinstance(doc, bool) or doc is None:
        pass
    elif isinstance(doc, (int, float)):
        found[path] = float(doc)
    return found


def same_number(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15)


def case_name(name: str) -> str:
    return re.sub(r"[^a-z0-9-]", "-", name)

MEASURED_RUN = "tests/data/golden/measured_run.jsonl"
CASES["validate-measured"] = ["validate", "--measured", MEASURED_RUN, "--model", "llama-2-7b", "--gpu", "a100-40g",
                              "--num-gpu-blocks", "2000", *PAPER]
CASES["validate-measured-chunked"] = ["validate", "--measured", MEASURED_RUN, "--model", "llama-3.1-8b", "--gpu",
                                      "h100-sxm", "--chunked-prefill", "--max-num-batched-tokens", "2048",
                                      "--max-model-len", "8192", "--enable-prefix-caching",
                                      "--max-num-seqs", "256",   # recorded before vllm-v1's 1024 on an H100
                                      *SYNCHRONOUS]

# The quick live validation: opt-125m on this CPU, priced by the shipped profile, no speed correction.
# Only its simulated side is compared (the live side is timed on whatever machine runs it).
LIVE_VALIDATION = dict(gpu="cpu", model="opt-125m", workload="sharegpt", rate=3.0, requests=12, seed=0,
                       length_scale=0.15, max_output_len=96, block_size=16, max_num_seqs=32, policy="paper",
                       profile="profiles/cpu/opt-125m.json")
