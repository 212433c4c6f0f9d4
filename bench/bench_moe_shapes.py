"""Experts of a shape NVIDIA never timed: how well the measured model prices them, leaving each timed shape out.

The measured model prices a MoE whose expert shape (hidden, width, top-k, experts) no fused-MoE table row
holds (GLM-4.5, a user's own config.json) by the roofline at the efficiency the table shows for the shapes it
did time in the same format and split (planner/cost/measured_moe.py). This bench checks that on the shapes
the tables hold: for each case it hides the model's own rows, prices its experts the way an untimed shape is
priced, and prints that price over the table's own at 1 to 8,192 tokens, beside the plain roofline (launch
floor + roofline at 60% of peak, no efficiency) over the table's.

    .venv/bin/python bench/bench_moe_shapes.py
"""
from __future__ import annotations

import math
import os
import sys
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from planner.catalog import resolve_model  # noqa: E402
from planner.catalog.quantization import weight_format  # noqa: E402
from planner.cost import tables  # noqa: E402
from planner.cost.measured import MeasuredCostModel  # noqa: E402
from planner.cost.moe import expert_roofline  # noqa: E402

TOKENS = (1, 8, 32, 128, 512, 2048, 8192)
# (model, GPU, TP, quantization): every format and split with at least two timed catalog shapes
CASES = (
    ("qwen3-30b-a3b", "h100-sxm", 1, None), ("qwen3-30b-a3b", "h100-sxm", 2, None),
    ("qwen3-235b-a22b", "h100-sxm", 4, None), ("qwen3-235b-a22b", "h100-sxm", 8, None),
    ("qwen3-235b-a22b", "h100-sxm", 8, "fp8"), ("qwen3-30b-a3b", "h100-sxm", 1, "fp8"),
    ("mixtral-8x7b", "h100-sxm", 2, None), ("gpt-oss-120b", "h100-sxm", 2, "mxfp4"),
    ("gpt-oss-20b", "h100-sxm", 1, "mxfp4"), ("llama-4-scout", "h100-sxm", 4, None),
    ("qwen3-30b-a3b", "h200-sxm", 1, None), ("qwen3-235b-a22b", "h200-sxm", 8, "fp8"),
    ("qwen3-30b-a3b", "b200", 1, None), ("qwen3-235b-a22b", "b200", 4, "fp8"),
)


def without_shape(shape):
    """tables.load_rows with one expert shape's MoE rows removed."""
    load = tables.load_rows

    def rows(system, kind):
        found = load(system, kind)
        if kind != "moe":
            return found
        return [r for r in found if (r["hidden_size"], r["inter_size"], r["topk"], r["num_experts"]) != shape]
    return rows


def main() -> None:
    print(f"{'case':42s} {'shapes':>6s}  scaled / table at {', '.join(map(str, TOKENS))} tokens"
          f"{'':6s}plain roofline / table")
    scaled_logs, plain_logs = [], []
    for name, gpu, tp, quantization in CASES:
        model = resolve_model(name)
        fmt = weight_format(quantization) if quantization else None
        own = MeasuredCostModel(model, gpu, tp=tp, weight_format=fmt)
        shape = (model.hidden_size, model.moe_intermediate_size, model.num_experts_per_tok, model.num_experts)
        with mock.patch.object(tables, "load_rows", without_shape(shape)):
            hidden = MeasuredCostModel(model, gpu, tp=tp, weight_format=fmt)
        efficiency = hidden._moe.efficiency
        rates, floor = efficiency.rates, efficiency.floor
        scaled, plain = [], []
        for tokens in TOKENS:
            table = own._moe.experts(tokens)
            roofline = floor + expert_roofline(model, own._moe.par, tokens, rates.flops_rate, rates.bandwidth,
                                               rates.bytes_per_expert)[0]
            scaled.append(hidden._moe.experts(tokens) / table)
            plain.append(roofline / table)
        scaled_logs += [abs(math.log(r)) for r in scaled]
        plain_logs += [abs(math.log(r)) for r in plain]
        label = f"{name}, {tp} x {gpu}, {quantization or model.checkpoint_quantization or 'bf16'}"
        print(f"{label:42s} {len(efficiency.timed):6d}  {' '.join(f'{r:5.2f}' for r in scaled)}"
              f"      {' '.join(f'{r:5.2f}' for r in plain)}")
    print(f"mean |log(price / table)|: scaled {sum(scaled_logs) / len(scaled_logs):.3f} "
          f"(a typical factor of {math.exp(sum(scaled_logs) / len(scaled_logs)):.2f}), plain roofline "
          f"{sum(plain_logs) / len(plain_logs):.3f} ({math.exp(sum(plain_logs) / len(plain_logs)):.2f})")


if __name__ == "__main__":
    main()
