"""GLM-5.2's shared indexers against GLM-5's indexer on every layer, on 8 x H200 and 8 x B200 (block FP8).

GLM-5.2 (and 5.3, the same config) has GLM-5's shapes, but only 21 of its 78 layers run a DSA indexer
(index_topk_freq 4, index_skip_topk_offset 3); the others reuse its top-k (planner/catalog/sparse_attention.py).
The plan holds and caches only those indexers; the measured model prices a sharing layer as NVIDIA's timed
GLM-5 module less its indexer's GEMMs, kernel and scoring (planner/cost/measured.py _index_credit). This prints,
side by side, the KV tokens each GPU holds, a decode step at 64 sequences and several contexts, and one layer's
price with and without its indexer.

With the unzipped aiconfigurator-core 0.12.0 wheel as an argument (and pandas), it also sets the credit beside
what NVIDIA timed for SGLang 0.5.14 on H200: GLM-5-FP8's module against GLM-5.2-FP8's module with the indexer
skipped (dsa_generation_module_perf.parquet; 8 heads per GPU, bf16 cache, block-FP8 GEMMs). Another framework's
kernels, so a check of size, not a target; nothing is fitted to it.

    .venv/bin/python bench/bench_shared_indexer.py [/tmp/aic/x]
"""
from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from planner.catalog import resolve_model  # noqa: E402
from planner.catalog.quantization import format_from_config  # noqa: E402
from planner.cost.measured import MeasuredCostModel  # noqa: E402
from planner.cost.shape import StepShape  # noqa: E402
from planner.deploy.memory import plan_memory  # noqa: E402

FP8_BLOCK = format_from_config({"quant_method": "fp8", "weight_block_size": [128, 128]})
CONTEXTS = (8192, 32768, 131072)
SGLANG = "aiconfigurator_core/systems/data/h200_sxm/sparse_attention/sglang/0.5.14/dsa_generation_module_perf.parquet"


def sharing_layer(model: MeasuredCostModel, batch: int, context: int) -> tuple[float, float]:
    """(one layer's module with its indexer, a sharing layer's price) in seconds."""
    share = model._index_share
    credit = model._index_credit(batch, batch * context, model._sparse.index_per_key)
    average = model.generation_attention(batch, context)
    return average + credit, average + credit - credit / share


def main() -> None:
    glm5, glm52 = resolve_model("glm-5"), resolve_model("glm-5.2")
    for gpu in ("h200", "b200"):
        print(f"\n8 x {gpu.upper()}, block FP8, bf16 cache, measured model")
        models = {m.name: MeasuredCostModel(m, gpu, tp=8, weight_format=FP8_BLOCK) for m in (glm5, glm52)}
        for m in (glm5, glm52):
            memory = plan_memory(m, gpu, tp=8, weight_format=FP8_BLOCK, block_size=64)
            print(f"  {m.name:8s} {m.indexer_layers} indexers, {m.kv_bytes_per_token(2):,} KV bytes a token, "
                  f"{memory.num_gpu_blocks * 64:,} tokens per GPU")
        print("  decode step of 64 sequences (ms): " + ", ".join(
            f"{c // 1024}K: " + " / ".join(f"{models[m.name].step_time(StepShape(decode_seqs=64, decode_context=64 * c)) * 1e3:.1f}"
                                          for m in (glm5, glm52)) for c in CONTEXTS) + "  (GLM-5 / GLM-5.2)")
        for c in CONTEXTS:
            full, sharing = sharing_layer(models["glm-5.2"], 64, c)
            print(f"  one layer at 64 x {c // 1024}K: module {full * 1e6:.0f} us, sharing layer {sharing * 1e6:.0f} us")
    if len(sys.argv) > 1:
        sglang_check(sys.argv[1], MeasuredCostModel(glm52, "h200", tp=8, weight_format=FP8_BLOCK))


def sglang_check(wheel: str, model: MeasuredCostModel) -> None:
    import pandas as pd
    rows = pd.read_parquet(os.path.join(wheel, SGLANG))
    rows = rows[(rows.num_heads == 8) & (rows.kv_cache_dtype == "bfloat16") & (rows.gemm_type == "fp8_block")]
    timed = rows.pivot_table(index=["batch_size", "step"], columns="model", values="latency")
    print("\nthe indexer's cost per layer (us): SGLang 0.5.14 timed on H200 (GLM-5 module - GLM-5.2 skip-indexer "
          "module) vs the credit priced here (vLLM 0.24's GLM-5 module)")
    for batch, step in ((1, 1), (8, 4096), (8, 32768), (64, 1), (64, 4096), (256, 1024)):
        full, skip = timed.loc[(batch, step), ["zai-org/GLM-5-FP8", "zai-org/GLM-5.2-FP8"]]
        credit = model._index_credit(batch, batch * (step + 1), model._sparse.index_per_key) / model._index_share
        print(f"  {batch:3d} x {step:5d}: SGLang {(full - skip) * 1e3:5.1f}, here {credit * 1e6:5.1f}")


if __name__ == "__main__":
    main()
