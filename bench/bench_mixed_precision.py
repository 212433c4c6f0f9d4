"""ModelOpt's MIXED_PRECISION checkpoints as the planner sees them (docs/models.md, stop 60): NVIDIA's Qwen3.6 NVFP4
releases keep the attention and Gated DeltaNet projections in FP8 and the MLPs (or experts and shared expert) and
the LM head in W4A16 NVFP4, which vLLM multiplies with FP4 Marlin on every GPU; any layer the config does not
list stays 16-bit.

Per deployment (one GPU, vLLM's defaults, --max-model-len 32768 so the 16-bit model fits on 80 GB), the same
model as the 16-bit release, vLLM's online FP8 (every linear layer per-tensor FP8, the head 16-bit) and NVIDIA's
mixed release: weights per GPU, the cache's blocks, one step of 32 decodes at 4,096 tokens and one 4,096-token
prefill by the roofline and by the measured model (`-` where it refuses), and the measured decode step's GEMM
seconds by the tables they read (the W4A16 experts: vLLM's Marlin MoE, from NVIDIA's `int4_wo` rows).

    .venv/bin/python bench/bench_mixed_precision.py
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.deployment import Deployment  # noqa: E402
from planner.cost.shape import StepShape, prefill_attn_pairs  # noqa: E402
from planner.deploy.plan import plan_deployment  # noqa: E402
from planner.errors import PlannerError  # noqa: E402
from planner.runs.pipeline import build_cost_model  # noqa: E402

CHECKPOINTS = (("Qwen/Qwen3.6-27B", None), ("Qwen/Qwen3.6-27B", "fp8"), ("nvidia/Qwen3.6-27B-NVFP4", None),
               ("Qwen/Qwen3.6-35B-A3B", "fp8"), ("nvidia/Qwen3.6-35B-A3B-NVFP4", None))
GPUS = ("h100", "b200", "l40s")
DECODE = StepShape(decode_seqs=32, decode_context=32 * 4096)
PREFILL = StepShape(prefill_seqs=1, prefill_tokens=4096, prefill_attn_pairs=prefill_attn_pairs(4096))


def step_ms(plan, kind: str) -> tuple[str, str, object]:
    try:
        cost = build_cost_model(plan, kind)
    except PlannerError:
        return "-", "-", None
    return f"{cost.step_time(DECODE) * 1e3:.2f}", f"{cost.step_time(PREFILL) * 1e3:.1f}", cost


def gemm_tables(cost) -> str:
    """The measured decode step's layer and LM-head GEMM seconds, by the table each reads."""
    if cost is None:
        return ""
    seconds: dict[str, float] = {}
    for term in cost.ledger(DECODE).terms:
        if term.group in ("gemm", "lm_head"):
            table = term.detail.split(",")[0].split(" ", 1)[1]
            seconds[table] = seconds.get(table, 0.0) + term.seconds
    return "; ".join(f"{table} {s * 1e3:.2f}" for table, s in seconds.items())


def main() -> None:
    print(f"{'checkpoint':42} {'gpu':5} {'weights':>8} {'blocks':>7} {'roofline ms':>16} {'measured ms':>16}  "
          f"measured decode GEMMs (ms)")
    for gpu in GPUS:
        for model, quantization in CHECKPOINTS:
            name = model + (f" --quantization {quantization}" if quantization else "")
            try:
                plan = plan_deployment(Deployment(model=model, gpu=gpu, quantization=quantization,
                                                  max_model_len=32768))
            except PlannerError as exc:
                print(f"{name:42} {gpu:5} does not fit: {str(exc)[:60]}")
                continue
            roof = step_ms(plan, "roofline")
            meas = step_ms(plan, "measured")
            print(f"{name:42} {gpu:5} {plan.memory.weight_bytes_per_gpu / 2 ** 30:6.1f} G {plan.num_gpu_blocks:7,} "
                  f"{roof[0]:>7} / {roof[1]:>6} {meas[0]:>7} / {meas[1]:>6}  {gemm_tables(meas[2])}")


if __name__ == "__main__":
    main()
