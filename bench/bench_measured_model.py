"""How good is the measured cost model's interpolation, and how far is it from the roofline?

Prints three tables, side by side in one run:
  1. leave-one-out interpolation error per table and system: each interior
     point of a table's innermost axis (GEMM m, context-attention isl,
     generation-attention cached tokens, all-reduce message size) is predicted
     by log-log interpolation from its two neighbours; median and p90 of
     |predicted / measured - 1| over all such points (on the monotone envelope
     the model uses);
  2. per GPU, the decode-step time of --model (default llama-3.1-8b) predicted
     by the roofline and the measured models at batch 1/32/128 and context
     512/2048;
  3. step_time per call (microseconds) of both models over a mixed set of
     shapes, after the lookups are cached (issue 9's bound: at most 20 us).

    .venv/bin/python bench/bench_measured_model.py [--model llama-3.1-8b]
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from planner.cost import StepShape, prefill_attn_pairs, tables  # noqa: E402
from planner.cost.measured import MeasuredCostModel, covered_gpus  # noqa: E402
from planner.cost.roofline import RooflineCostModel  # noqa: E402

AXES = {
    "gemm": ("n", "k", "m"),
    "context_attention": ("num_heads", "num_kv_heads", "head_dim", "batch_size", "isl"),
    "generation_attention": ("num_heads", "num_kv_heads", "head_dim", "batch_size", "step"),
    "allreduce": ("backend", "num_gpus", "message_size"),
}


def quantile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def leave_one_out_table() -> None:
    print("1. leave-one-out interpolation error (|pred/meas - 1| along the innermost axis)")
    print(f"{'system':22s} {'table':22s} {'points':>7s} {'median':>8s} {'p90':>8s}")
    for system in tables.systems():
        for table, axes in AXES.items():
            tree = tables.build_tree(tables.load_rows(system, table), axes)
            depth = len(axes)
            # the model interpolates the monotone envelope of each (k, m), (batch, length) or size sub-table
            errors = tables.leave_one_out(_envelope(tree, depth, ENVELOPE_LEVELS[table]), depth)
            if errors:
                print(f"{system:22s} {table:22s} {len(errors):7d} {statistics.median(errors):8.1%} "
                      f"{quantile(errors, 0.9):8.1%}")
    print()


ENVELOPE_LEVELS = {"gemm": 3, "context_attention": 2, "generation_attention": 2, "allreduce": 1}


def _envelope(tree: dict, depth: int, levels: int) -> dict:
    if depth <= levels:
        return tables.monotone(tree, depth)
    return {k: _envelope(v, depth - 1, levels) for k, v in tree.items()}


def decode_table(model: str) -> None:
    print(f"2. decode-step time of {model}, ms: roofline / measured (ratio)")
    cells = [(b, c) for b in (1, 32, 128) for c in (512, 2048)]
    print(f"{'gpu':14s} " + " ".join(f"{f'b{b} c{c}':>22s}" for b, c in cells))
    for gpu in covered_gpus():
        roof, meas = RooflineCostModel(model, gpu), MeasuredCostModel(model, gpu)
        row = []
        for b, c in cells:
            shape = StepShape(decode_seqs=b, decode_context=b * c)
            r, m = roof.step_time(shape) * 1e3, meas.step_time(shape) * 1e3
            row.append(f"{r:6.2f} / {m:6.2f} ({r / m:4.2f})")
        print(f"{gpu:14s} " + " ".join(f"{cell:>22s}" for cell in row))
    print()


def speed_table(model: str) -> None:
    rng = random.Random(0)
    shapes = [StepShape(decode_seqs=b, decode_context=b * rng.randint(64, 4096))
              for b in (rng.randint(1, 256) for _ in range(300))]
    shapes += [StepShape(prefill_seqs=1, prefill_tokens=n, prefill_attn_pairs=prefill_attn_pairs(n))
               for n in (rng.randint(8, 2048) for _ in range(100))]
    print(f"3. step_time per call, {model} on h100-sxm, {len(shapes)} shapes, cached lookups (target <= 20 us)")
    for cost in (RooflineCostModel(model, "h100-sxm"), MeasuredCostModel(model, "h100-sxm")):
        for s in shapes:
            cost.step_time(s)                     # fill the caches
        runs = []
        for _ in range(7):
            t0 = time.perf_counter()
            for _ in range(20):
                for s in shapes:
                    cost.step_time(s)
            runs.append((time.perf_counter() - t0) / (20 * len(shapes)) * 1e6)
        print(f"  {cost.name:70s} median {statistics.median(runs):6.2f} us, best {min(runs):6.2f} us")
    cold = MeasuredCostModel(model, "h100-sxm")
    t0 = time.perf_counter()
    for s in shapes:
        cold.step_time(s)
    print(f"  first call per shape (cache miss): {(time.perf_counter() - t0) / len(shapes) * 1e6:.0f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama-3.1-8b")
    args = parser.parse_args()
    leave_one_out_table()
    decode_table(args.model)
    speed_table(args.model)


if __name__ == "__main__":
    main()
