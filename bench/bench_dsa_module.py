"""The roofline parts of a DeepSeek Sparse Attention layer against NVIDIA's timed vLLM DSA module (H100, H200, B200).

aiconfigurator-core 0.12.0 ships NVIDIA's timing of vLLM 0.24's whole DSA module (systems/data/<gpu>/
sparse_attention/vllm/0.24.0: dsa_generation_module_perf and dsa_context_module_perf: the projections, the
indexer with its FP8 logits and top-k, the sparse MLA kernel and o_proj of one layer, its input norm and
all-reduce excluded) by batch, context and heads per GPU, for DeepSeek-V3.2's and GLM-5's shapes. The
measured model reads those (scripts/extract_measured_tables.py: dsa_context, dsa_generation). For a DSA model
of other shapes it falls back to parts (planner/cost/sparse.py): the latent attention's and the indexer's
GEMMs from the GEMM table of the weights' format, the norms, rotary, quantization and cache write from their
bytes, and the sparse attention and the indexer's scores by the roofline on top of the attention tables'
floor. This bench prices the timed shapes by those parts (the tables hidden from the model) and sets them
beside NVIDIA's module, with FP8 block-scaled GEMMs (DeepSeek-V3.2's checkpoint format), for every TP the
tables cover and both cache dtypes: how far the fallback is from a measurement. Nothing is fitted to it.

    pip install pandas pyarrow      # to read the parquet files, only here
    .venv/bin/python bench/bench_dsa_module.py /tmp/aic/x     # the unzipped aiconfigurator-core wheel
"""
from __future__ import annotations

import os
import sys

import pandas as pd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from planner.catalog.quantization import format_from_config  # noqa: E402
from planner.cost import measured  # noqa: E402
from planner.cost.measured import MeasuredCostModel  # noqa: E402
from planner.cost.sparse import MODULE_GEMMS, MODULE_KERNELS  # noqa: E402

TABLES = "aiconfigurator_core/systems/data/{system}/sparse_attention/vllm/0.24.0"
SYSTEMS = {"h100_sxm": "h100", "h200_sxm": "h200", "b200_sxm": "b200"}
MODELS = {"deepseek-ai/DeepSeek-V3.2": "deepseek-v3.2", "zai-org/GLM-5": "glm-5"}
FP8_BLOCK = format_from_config({"quant_method": "fp8", "weight_block_size": [128, 128]})
DECODE_GRID = {"batch_size": (1, 8, 64, 256), "step": (512, 2048, 8192, 32768)}
PREFILL_GRID = {"batch_size": (1, 4, 16), "isl": (512, 2048, 8192)}


def ledger_layer(model: MeasuredCostModel, tokens: int, attention: float) -> float:
    """One layer's DSA parts as the measured model prices them for `tokens` tokens."""
    gemms = sum(model.layer_gemm(tokens, n, k) for name, (n, k), *_ in model._gemms if name in MODULE_GEMMS)
    kernels = sum(model.elementwise(k.bytes_per_token * tokens, 1) for k in model._kernels if k.name in MODULE_KERNELS)
    return gemms + kernels + attention


def errors_of(model: MeasuredCostModel, rows: pd.DataFrame, phase: str) -> list[float]:
    """ours / NVIDIA's - 1 at the grid's points the table holds."""
    grid = DECODE_GRID if phase == "decode" else PREFILL_GRID
    length = "step" if phase == "decode" else "isl"
    found = []
    for batch in grid["batch_size"]:
        for size in grid[length]:
            hit = rows[(rows.batch_size == batch) & (rows[length] == size)]
            if hit.empty:
                continue
            measured = float(hit.latency.median()) * 1e-3
            if phase == "decode":      # the table's step counts the cached tokens; the new one attends too
                ours = ledger_layer(model, batch, model.generation_attention(batch, size + 1))
            else:
                ours = ledger_layer(model, batch * size, model.context_attention(batch, size))
            found.append(ours / measured - 1)
    return found


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    measured.module_trees = lambda *args: None       # the parts the model falls back to, not the tables
    measured.MeasuredMoe = lambda *args: None        # the experts are not compared (B200 timed FP8 ones under EP only)
    print("One DSA layer's attention, FP8 block-scaled GEMMs: the measured model's roofline parts against "
          "NVIDIA's vLLM 0.24 DSA module (mean |error| / mean error over the grid's points)\n")
    print(f"{'GPU':5s} {'model':14s} {'TP':>3s} {'heads':>5s} {'KV':5s} | {'decode':>17s} | {'prefill':>17s}")
    every: dict[str, list[float]] = {"decode": [], "prefill": []}
    for system, gpu in SYSTEMS.items():
        folder = os.path.join(sys.argv[1], TABLES.format(system=system))
        tables = {phase: pd.read_parquet(os.path.join(folder, f"dsa_{name}_module_perf.parquet"))
                  for phase, name in (("decode", "generation"), ("prefill", "context"))}
        for hf_id, name in MODELS.items():
            for tp in (1, 2, 4, 8):
                for kv in ("bfloat16", "fp8"):
                    model = MeasuredCostModel(name, gpu, tp=tp, weight_format=FP8_BLOCK,
                                              kv_cache_dtype="fp8" if kv == "fp8" else "auto")
                    heads = model.model.num_heads // tp
                    cells = []
                    for phase, table in tables.items():
                        rows = table[(table.model == hf_id) & (table.num_heads == heads) & (table.kv_cache_dtype == kv)
                                     & (table.gemm_type == "fp8_block")]
                        if phase == "prefill":
                            rows = rows[rows.step == 0]
                        found = errors_of(model, rows, phase)
                        every[phase] += found
                        cells.append(f"{sum(map(abs, found)) / len(found):6.1%} / {sum(found) / len(found):+6.1%}"
                                     if found else f"{'-':>17s}")
                    print(f"{gpu:5s} {name:14s} {tp:3d} {heads:5d} {kv[:4]:5s} | {cells[0]} | {cells[1]}")
    print()
    for phase, found in every.items():
        print(f"{phase}: mean |error| {sum(map(abs, found)) / len(found):.1%}, mean {sum(found) / len(found):+.1%}, "
              f"worst {min(found):+.0%} / {max(found):+.0%} over {len(found)} points")


if __name__ == "__main__":
    main()
