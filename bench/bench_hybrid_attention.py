"""Models whose full-attention layers have their own shape, Gemma 4 (planner/catalog/gemma4.py) and MiMo-V2-Flash
(planner/catalog/mimo_config.py): one step of 64 decodes at 4,096 tokens and one 4,096-token prefill on each cost
model, the measured model's attention, expert and all-reduce terms, and what each plan holds: weights per GPU, KV
bytes per token and the KV cache's token slots. The figures in docs/models.md.

    .venv/bin/python bench/bench_hybrid_attention.py [gemma4|mimo]
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.deployment import Deployment  # noqa: E402
from planner.catalog import GIB, resolve_model  # noqa: E402
from planner.catalog.quantization import recorded_format  # noqa: E402
from planner.cli.explain import step  # noqa: E402
from planner.cost.measured import MeasuredCostModel  # noqa: E402
from planner.cost.roofline import RooflineCostModel  # noqa: E402
from planner.deploy.plan import plan_deployment  # noqa: E402

# (model or checkpoint id, GPU, TP); an id's recorded release sets its format, a catalog name is bf16
RUNS = {"gemma4": [("gemma-4-26b-a4b", "h100-sxm", 1), ("gemma-4-26b-a4b", "h100-sxm", 2),
                   ("nvidia/Gemma-4-26B-A4B-NVFP4", "b200", 1), ("gemma-4-31b", "h100-sxm", 2),
                   ("gemma-4-31b", "h200", 1), ("nvidia/Gemma-4-31B-IT-NVFP4", "b200", 1)],
        # its one release, FP8 in 128 x 128 blocks, on the GPUs whose tables time its 192-wide heads
        "mimo": [("XiaomiMiMo/MiMo-V2-Flash", "h100-sxm", 8), ("XiaomiMiMo/MiMo-V2-Flash", "h200", 4),
                 ("XiaomiMiMo/MiMo-V2-Flash", "h200", 8)]}
DECODE, PREFILL = step(64, 4096), step(0, 1, prefill_tokens=4096)
TERMS = ("attention (decode)", "experts (fused MoE)", "all-reduce")
MAX_MODEL_LEN = 32768       # the full 262,144-token context does not fit one GPU's cache beside the 31B's weights


def main(families: list[str]) -> None:
    print(f"{'model':30s} {'GPU':>10s} {'weights GiB':>12s} {'KV B/token':>11s} {'slots':>8s} {'decode ms':>10s} "
          f"{'attn':>6s} {'experts':>8s} {'allred':>7s} {'roofline':>9s} {'prefill ms (measured / roofline)':>33s}")
    for model_id, gpu, tp in (run for family in families for run in RUNS[family]):
        model, fmt = resolve_model(model_id), recorded_format(model_id)
        measured = MeasuredCostModel(model, gpu, tp, weight_format=fmt)
        roofline = RooflineCostModel(model, gpu, tp, weight_format=fmt)
        terms = {t.name: t.seconds * 1e3 for t in measured.ledger(DECODE).terms}
        plan = plan_deployment(Deployment(model=model_id, gpu=gpu, tp=tp, max_model_len=MAX_MODEL_LEN))
        print(f"{model_id:30s} {f'{tp}x{gpu}':>10s} {plan.memory.weight_bytes_per_gpu / GIB:12.1f} "
              f"{model.kv_bytes_per_token(plan.kv_dtype_bytes):11,d} {plan.num_gpu_blocks * plan.block_size:8,d} "
              f"{measured.step_time(DECODE) * 1e3:10.2f} "
              + " ".join(f"{terms.get(name, 0.0):{w}.2f}" for name, w in zip(TERMS, (6, 8, 7)))
              + f" {roofline.step_time(DECODE) * 1e3:9.2f} "
              f"{measured.step_time(PREFILL) * 1e3:16.1f} / {roofline.step_time(PREFILL) * 1e3:.1f}")


if __name__ == "__main__":
    main(sys.argv[1:] or list(RUNS))
