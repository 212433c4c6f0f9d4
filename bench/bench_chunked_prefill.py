"""The paper's policy against chunked prefill (vLLM v1) on the CPU, live engine and simulator.

ShareGPT-like traffic (the built-in sharegpt workload, lengths scaled down for
the CPU) near saturation: the request rate is a fraction (--load, default 0.9)
of the throughput the simulator predicts with every request queued at once.
For each policy the same trace is replayed online against the real engine
(opt-125m, random weights) and simulated with a calibrated CPU profile
(--profile, default profiles/cpu/opt-125m.json; on a busy machine profile it
right before with `planner profile --gpu cpu --model opt-125m --quick --out P`,
or the live engine runs far past the saturation the profile predicts). The
table prints TTFT mean, TPOT p99 and ITL p99 of both, side by side, from one
run (timings on a shared machine are noisy: compare within the table).

    python bench/bench_chunked_prefill.py [--requests 48] [--budget 128] [--load 0.9] [--profile P]
"""
from __future__ import annotations

import argparse
import math
from dataclasses import replace

from engine.deployment import Deployment
from planner.deploy.plan import plan_deployment
from planner.profile.checkpoints import model_folder
from planner.sim import simulate
from planner.validation.run import load_cost_model, validate
from planner.validation.spec import ValidationSpec
from workloads import Trace

METRICS = (("ttft_mean", "TTFT mean"), ("tpot_p99", "TPOT p99"), ("itl_p99", "ITL p99"),
           ("request_throughput", "req/s"))


def saturation_rate(spec: ValidationSpec) -> float:
    """Requests/s the simulator sustains when the whole trace is queued at time 0."""
    trace = spec.trace()
    burst = Trace([r.model_copy(update={"arrival_time": 0.0}) for r in trace.requests], name="burst")
    _, model = model_folder(spec.deployment.model)
    plan = plan_deployment(spec.deployment.replace(max_model_len=2048, num_gpu_blocks=4096, num_cpu_blocks=0),
                           refuse=False)
    return simulate(burst, plan, load_cost_model(spec, model)).metrics.request_throughput


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--budget", type=int, default=128, help="max_num_batched_tokens of the chunked policy")
    ap.add_argument("--load", type=float, default=0.9, help="rate as a fraction of the saturation throughput")
    ap.add_argument("--length-scale", type=float, default=0.2)
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", default=None, help="profile JSON of this CPU (default profiles/cpu/opt-125m.json)")
    ap.add_argument("--rate", type=float, default=None, help="request rate (default: --load x saturation)")
    args = ap.parse_args()

    deployment = Deployment(model="opt-125m", gpu="cpu", max_num_seqs=args.max_num_seqs, policy="paper")
    paper = ValidationSpec(deployment, workload="sharegpt", rate=1.0, requests=args.requests, seed=args.seed,
                           length_scale=args.length_scale, max_output_len=128, profile=args.profile)
    chunked = replace(paper, deployment=deployment.replace(policy="vllm-v1", max_num_batched_tokens=args.budget))
    # One rate for both, from the paper policy's saturation (the reference the paper measured against).
    rate = args.rate or args.load * saturation_rate(paper)
    print(f"sharegpt x{args.length_scale} lengths, {args.requests} requests at {rate:.2f} req/s "
          f"({rate / saturation_rate(paper):.0%} of the simulated saturation throughput); "
          f"chunked budget {args.budget} tokens")
    rows = []
    for name, cfg in (("paper", replace(paper, rate=rate)), ("chunked", replace(chunked, rate=rate))):
        result = validate(cfg)
        rows.append((name, result.live.metrics, result.simulated))
    header = f"{'policy':8} {'source':9}" + "".join(f"{title:>12}" for _, title in METRICS)
    print(header)
    print("-" * len(header))
    for name, live, sim in rows:
        for source, metrics in (("live", live), ("simulated", sim)):
            cells = "".join(f"{_fmt(metrics.get(key), key):>12}" for key, _ in METRICS)
            print(f"{name:8} {source:9}{cells}")
    live_ratio = {key: rows[1][1].get(key) / rows[0][1].get(key) for key, _ in METRICS
                  if rows[0][1].get(key)}
    sim_ratio = {key: rows[1][2].get(key) / rows[0][2].get(key) for key, _ in METRICS
                 if rows[0][2].get(key)}
    print("chunked / paper, live:      " + "  ".join(f"{k} {v:.2f}x" for k, v in live_ratio.items()))
    print("chunked / paper, simulated: " + "  ".join(f"{k} {v:.2f}x" for k, v in sim_ratio.items()))


def _fmt(value, key: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:.3f}" if key == "request_throughput" else f"{value * 1000:.1f} ms"


if __name__ == "__main__":
    main()
