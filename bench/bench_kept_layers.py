"""What the layers a quantized checkpoint keeps in 16 bits change: weights per GPU and step prices of NVIDIA's
NVFP4 releases planned all-NVFP4 (their exclude_modules ignored) and as released (planner/catalog/kept_layers.py),
side by side in one run, with both cost models.

    .venv/bin/python bench/bench_kept_layers.py
"""
from __future__ import annotations

import os
import sys
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from planner.catalog import resolve_gpu, resolve_model  # noqa: E402
from planner.catalog.quantization import recorded_format  # noqa: E402
from planner.cli.explain import step  # noqa: E402
from planner.cost.measured import MeasuredCostModel  # noqa: E402
from planner.cost.roofline import RooflineCostModel  # noqa: E402

# (checkpoint, GPU, TP): each on the fewest B200s its NVFP4 weights fit
RUNS = [("nvidia/DeepSeek-V3.1-NVFP4", "b200", 4), ("nvidia/DeepSeek-V3.2-NVFP4", "b200", 4),
        ("nvidia/GLM-5-NVFP4", "b200", 8), ("nvidia/MiniMax-M2.5-NVFP4", "b200", 2),
        ("nvidia/Qwen3.5-397B-A17B-NVFP4", "b200", 4), ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4", "b200", 1)]
# decode: 32 sequences at 2,048 tokens; prefill: one 4,096-token prompt
STEPS = {"decode": step(32, 2048), "prefill": step(0, 1, prefill_tokens=4096)}


def main() -> None:
    print(f"{'checkpoint (all-NVFP4 -> as released)':44s} {'weights/GPU GiB':>17s}  " + "  ".join(
        f"{cls.__name__[:-9].lower() + ' ' + name:>23s}" for cls in (MeasuredCostModel, RooflineCostModel)
        for name in STEPS))
    for model_id, gpu_name, tp in RUNS:
        model, gpu, released = resolve_model(model_id), resolve_gpu(gpu_name), recorded_format(model_id)
        uniform = replace(released, excluded=())
        weights = [model.weight_bytes_per_gpu(tp, weight_format=f) / 2**30 for f in (uniform, released)]
        cells = []
        for cls in (MeasuredCostModel, RooflineCostModel):
            before, after = (cls(model, gpu, tp, weight_format=f) for f in (uniform, released))
            for shape in STEPS.values():
                cells.append(f"{before.step_time(shape) * 1e3:8.2f} -> {after.step_time(shape) * 1e3:8.2f} ms")
        print(f"{model_id:44s} {weights[0]:6.1f} -> {weights[1]:6.1f}  " + "  ".join(cells))


if __name__ == "__main__":
    main()
