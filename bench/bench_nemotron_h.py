"""Nemotron-H and Nemotron 3 (planner/catalog/nemotron_h.py): one step of 64 decodes at 4,096 tokens and one
4,096-token prefill on each cost model, with the measured model's Mamba-2, expert and attention terms, and the
Mamba-2 state and cache block each plan holds. The figures in docs/models.md.

    .venv/bin/python bench/bench_nemotron_h.py
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.deployment import Deployment  # noqa: E402
from planner.catalog import resolve_model  # noqa: E402
from planner.catalog.quantization import recorded_format  # noqa: E402
from planner.cli.explain import step  # noqa: E402
from planner.cost.measured import MeasuredCostModel  # noqa: E402
from planner.cost.roofline import RooflineCostModel  # noqa: E402
from planner.deploy.plan import plan_deployment  # noqa: E402

# (model or checkpoint id, GPU, TP); an id's recorded release sets its format, a catalog name is bf16
RUNS = [("nemotron-3-nano-30b-a3b", "h100-sxm", 1), ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4", "b200", 1),
        ("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-FP8", "b200", 2), ("nemotron-h-56b", "h100-sxm", 4)]
DECODE, PREFILL = step(64, 4096), step(0, 1, prefill_tokens=4096)
TERMS = ("linear attention (conv + selective scan)", "experts (fused MoE)", "attention (decode)")


def main() -> None:
    print(f"{'model':44s} {'GPU':>10s} {'state/layer B':>14s} {'block':>6s} {'decode ms':>10s} "
          f"{'mamba':>7s} {'experts':>8s} {'attn':>6s} {'roofline':>9s} {'prefill ms (measured / roofline)':>33s}")
    for model_id, gpu, tp in RUNS:
        model, fmt = resolve_model(model_id), recorded_format(model_id)
        measured = MeasuredCostModel(model, gpu, tp, weight_format=fmt)
        roofline = RooflineCostModel(model, gpu, tp, weight_format=fmt)
        terms = {t.name: t.seconds * 1e3 for t in measured.ledger(DECODE).terms}
        plan = plan_deployment(Deployment(model=model_id, gpu=gpu, tp=tp))
        print(f"{model_id:44s} {f'{tp}x{gpu}':>10s} {model.linear_attention.state_bytes_per_gpu(tp, 2):14,d} "
              f"{plan.block_size:6d} {measured.step_time(DECODE) * 1e3:10.2f} "
              + " ".join(f"{terms.get(name, 0.0):{w}.2f}" for name, w in zip(TERMS, (7, 8, 6)))
              + f" {roofline.step_time(DECODE) * 1e3:9.2f} "
              f"{measured.step_time(PREFILL) * 1e3:16.1f} / {roofline.step_time(PREFILL) * 1e3:.1f}")


if __name__ == "__main__":
    main()
