"""The measured model's MLA parts against NVIDIA's timed vLLM MLA module on B200 (DeepSeek-V3's shapes).

Where NVIDIA never timed a model's MLA shapes (DeepSeek-V2), the measured model prices one layer's attention
as parts: the q_a + kv_a, q_b, kv_b and o GEMMs from the GEMM table of the weights' format, the latent norms,
rotary and cache write from their bytes, and MLA attention by the roofline (docs/moe.md). aiconfigurator-core
0.12.0 ships NVIDIA's timing of vLLM 0.24's whole MLA module (systems/data/<system>/mla/vllm/0.24.0:
mla_generation_module_perf and mla_context_module_perf: the projections, norms, rotary, cache write and
attention of one layer, its input norm and all-reduce excluded) by batch, context and heads per GPU, which
the planner reads for DeepSeek-V3's and Kimi-K2's shapes. This bench sets the parts beside B200's module at
16 heads per GPU (TP 8), NVFP4 GEMMs and a bf16 cache: how well the parts hold where only they price MLA.

    pip install pandas pyarrow      # to read the parquet files, only here
    .venv/bin/python bench/bench_mla_module.py /tmp/aic/x     # the unzipped aiconfigurator-core wheel
"""
from __future__ import annotations

import os
import sys

import pandas as pd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from planner.catalog import resolve_model  # noqa: E402
from planner.catalog.quantization import format_from_config  # noqa: E402
from planner.cost.elementwise import step_kernels  # noqa: E402
from planner.cost.measured import MeasuredCostModel  # noqa: E402

TABLES = "aiconfigurator_core/systems/data/b200_sxm/mla/vllm/0.24.0"
MLA_KERNELS = ("q and KV latent RMSNorms", "rotary embedding", "KV-cache write")


def ledger_layer(model: MeasuredCostModel, tokens: int, attention: float) -> float:
    """One layer's MLA parts as the measured model prices them, where it has no timed module, for `tokens`
    tokens."""
    spec = model.model
    gemms = sum(model.layer_gemm(tokens, n, k) for _, (n, k), *_ in MeasuredCostModel._mla_gemms(spec, model.tp))
    kernels = sum(model.elementwise(k.bytes_per_token * tokens, 1) for k in step_kernels(spec, model.tp, 2)
                  if k.name in MLA_KERNELS)
    return gemms + kernels + attention


def roofline_attention(prices: dict, batch: int, context: int, prefill: bool) -> float:
    """One layer's MLA attention by the roofline (MeasuredCostModel._set_up_latent_attention's formulas)."""
    if prefill:
        return prices["prefill_floor"] + batch * max(context * (context + 1) // 2 * prices["prefill_per_pair"],
                                                     context * prices["write_per_token"])
    return prices["decode_floor"] + batch * context * prices["decode_per_key"]


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    folder = os.path.join(sys.argv[1], TABLES)
    model = MeasuredCostModel(resolve_model("deepseek-v3"), "b200", tp=8,
                              weight_format=format_from_config({"quant_method": "modelopt", "quant_algo": "NVFP4"}))
    prices = model._latent_prices()
    print(f"DeepSeek-V3 MLA, one layer, 16 heads per GPU (TP 8), NVFP4 GEMMs, bf16 cache, B200: "
          f"the measured model's parts against NVIDIA's vLLM 0.24 MLA module ({TABLES})\n")
    errors = []
    for phase, file, length in (("decode", "mla_generation_module_perf.parquet", "step"),
                                ("prefill", "mla_context_module_perf.parquet", "isl")):
        table = pd.read_parquet(os.path.join(folder, file))
        rows = table[(table.num_heads == 16) & (table.kv_cache_dtype == "bfloat16") & (table.gemm_type == "nvfp4")
                     & (table.mla_dtype == "bfloat16")]
        rows = rows.groupby(["batch_size", length], as_index=False)["latency"].median()
        print(f"{phase}: batch x {'context' if phase == 'decode' else 'prompt'} -> ledger us / NVIDIA us (error)")
        for batch in (1, 4, 16, 64, 256):
            cells = []
            for size in (512, 2048, 8192):
                hit = rows[(rows.batch_size == batch) & (rows[length] == size)]
                if hit.empty:
                    continue
                measured = float(hit.latency.iloc[0]) * 1e-3
                if phase == "decode":
                    ours = ledger_layer(model, batch, roofline_attention(prices, batch, size + 1, False))
                else:
                    ours = ledger_layer(model, batch * size, roofline_attention(prices, batch, size, True))
                errors.append((phase, ours / measured - 1))
                cells.append(f"{size:5d}: {ours * 1e6:7.1f} / {measured * 1e6:7.1f} ({ours / measured - 1:+4.0%})")
            if cells:
                print(f"  {batch:4d}  " + "   ".join(cells))
        print()
    for phase in ("decode", "prefill"):
        values = [e for p, e in errors if p == phase]
        print(f"{phase}: mean |error| {sum(map(abs, values)) / len(values):.1%}, mean {sum(values) / len(values):+.1%} "
              f"over {len(values)} points")


if __name__ == "__main__":
    main()
