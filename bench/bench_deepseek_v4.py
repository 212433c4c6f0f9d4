"""DeepSeek-V4 deployments as the planner sees them: memory plan, how many sequences the cache holds, and the
step times of the roofline and of the measured model, side by side for V4-Flash and V4-Pro (docs/models.md,
DeepSeek-V4).

Per deployment (vLLM's defaults for the GPU, the released checkpoint: FP8 in 128 x 128 blocks, experts in
MXFP4): weights per GPU, the cache's blocks of 256 tokens, what one sequence holds whatever its length
(every layer's window rows and each compressor's state) beside aiconfigurator-core 0.12.0's count of the
same bytes without vLLM's pages (its `get_kvcache_bytes_per_sequence`: the state and window bytes exactly,
21 x 40,960 + 20 x 524,288 + 43 x 128 x 512 for V4-Flash), how many 8,192-token sequences fit, and one step
of 64 decodes at 4,096 tokens and one 4,096-token prefill with their parts, first by the roofline, then by
the measured model (NVIDIA's timed vLLM 0.24 attention modules, mHC kernels and fused MoE, as `auto` picks it:
planner/cost/measured_compressed.py).

    .venv/bin/python bench/bench_deepseek_v4.py
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.deployment import Deployment  # noqa: E402
from planner.catalog.deepseek_v4 import CSA  # noqa: E402
from planner.cost.roofline import RooflineCostModel  # noqa: E402
from planner.runs.pipeline import build_cost_model  # noqa: E402
from planner.cost.shape import StepShape, prefill_attn_pairs  # noqa: E402
from planner.deploy.plan import plan_deployment  # noqa: E402

DEPLOYMENTS = (("deepseek-v4-flash", "h200", 2), ("deepseek-v4-flash", "h200", 4), ("deepseek-v4-flash", "b200", 2),
               ("deepseek-v4-pro", "h200", 8), ("deepseek-v4-pro", "b200", 8))
GIB = 2 ** 30


def aiconfigurator_sequence_bytes(model) -> int:
    """aiconfigurator's bytes of one sequence at one token: the window's first row on every layer (512 bytes)
    and each compressor's state without pages (CSA 2 x 4 x 2 x 512 x 4 + the indexer's 2 x 4 x 2 x 128 x 4,
    HCA 2 x 128 x 512 x 4)."""
    ca, head = model.compressed_attention, model.head_size
    return (model.num_layers * head + ca.csa_layers * (2 * CSA * 2 * head * 4 + 2 * CSA * 2 * ca.indexer.head_dim * 4)
            + ca.hca_layers * 2 * 128 * head * 4)


def main() -> None:
    print(f"{'deployment':30} {'weights/GPU':>11} {'blocks':>8} {'seq MB':>7} {'aic MB':>7} {'8K seqs':>8} "
          f"{'decode ms':>9} {'attn':>6} {'comp':>6} {'moe':>6} {'linear':>6} {'ar':>5} {'prefill ms':>10}")
    measured = []
    for name, gpu, tp in DEPLOYMENTS:
        plan = plan_deployment(Deployment(model=name, gpu=gpu, tp=tp))
        model, memory = plan.model, plan.memory
        sequence = model.kv_bytes_per_context(0)          # the window rows and states alone
        per_8k = plan.state_blocks + 8192 // plan.block_size
        cost = RooflineCostModel(model, gpu, tp=tp, block_size=plan.block_size, weight_format=plan.weight_format,
                                 kv_cache_dtype="fp8")
        decode = StepShape(decode_seqs=64, decode_context=64 * 4096)
        prefill = StepShape(prefill_seqs=1, prefill_tokens=4096, prefill_attn_pairs=prefill_attn_pairs(4096))
        parts = cost.breakdown(decode)
        print(f"{f'{name} {tp} x {gpu}':30} {memory.weight_bytes_per_gpu / GIB:9.1f} G {plan.num_gpu_blocks:8,} "
              f"{sequence / 1e6:7.1f} {aiconfigurator_sequence_bytes(model) / 1e6:7.1f} "
              f"{plan.num_gpu_blocks // per_8k:8,} {cost.step_time(decode) * 1e3:9.2f} "
              f"{parts['decode_attention'] * 1e3:6.2f} {parts['compressors'] * 1e3:6.2f} {parts['moe'] * 1e3:6.2f} "
              f"{parts['linear'] * 1e3:6.2f} {parts['allreduce'] * 1e3:5.2f} {cost.step_time(prefill) * 1e3:10.1f}")
        measured.append((f"{name} {tp} x {gpu}", build_cost_model(plan), decode, prefill))
    print(f"\nmeasured model\n{'deployment':30} {'decode ms':>9} {'attn':>6} {'mhc':>6} {'moe':>6} {'ar':>5} "
          f"{'prefill ms':>10} {'attn':>6} {'moe':>6}")
    for label, cost, decode, prefill in measured:
        terms = {t.name: t.seconds for t in cost.ledger(decode).terms}
        filled = {t.name: t.seconds for t in cost.ledger(prefill).terms}
        print(f"{label:30} {cost.step_time(decode) * 1e3:9.2f} {terms['attention (decode)'] * 1e3:6.2f} "
              f"{terms['hyper-connections (mHC pre + post)'] * 1e3:6.2f} {terms['experts (fused MoE)'] * 1e3:6.2f} "
              f"{terms['all-reduce'] * 1e3:5.2f} {cost.step_time(prefill) * 1e3:10.1f} "
              f"{filled['attention (prefill)'] * 1e3:6.2f} {filled['experts (fused MoE)'] * 1e3:6.2f}")


if __name__ == "__main__":
    main()
