"""How good is the measured cost model's interpolation, and how far is it from the roofline?

Prints three tables, side by side in one run:
  1. leave-one-out interpolation error per table and system: each interior
     point of a table's innermost axis (GEMM m, context-attention isl,
     generation-attention cached tokens, all-reduce message size) is predicted
     by log-log interpolation from its two neighbours; median and p90 of
     |predicted / measured - 1| over all such points (on the monotone fit the
     model uses, log-log; generation attention also linear in context, which
     is how the model interpolates it);
  2. per GPU, the decode-step time of --model (default llama-3.1-8b) predicted
     by the roofline and the measured models at batch 1/32/128 and context
     512/2048;
  3. step_time per call (microseconds) of both models over a mixed set of
     shapes, after the lookups are cached (issue 9's bound: at most 20 us):
     decode steps priced at their mean context and, the simulator's case,
     with each sequence's own context (StepShape.decode_histogram);
  4. how far the monotone fit moves the raw grid values, per table and
     system: share of points moved, median, p90 and max of |fit / raw - 1|,
     for the isotonic fit the model uses and the running-minimum envelope it
     replaced.

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

from engine.core.metrics import percentile  # noqa: E402
from planner.cost import StepShape, prefill_attn_pairs, tables  # noqa: E402
from planner.cost.shape import context_histogram  # noqa: E402
from planner.cost.measured import MeasuredCostModel, covered_gpus  # noqa: E402
from planner.cost.roofline import RooflineCostModel  # noqa: E402

AXES = {
    "gemm": ("n", "k", "m"),
    "context_attention": ("num_heads", "num_kv_heads", "head_dim", "batch_size", "isl"),
    "generation_attention": ("num_heads", "num_kv_heads", "head_dim", "batch_size", "step"),
    "allreduce": ("backend", "num_gpus", "message_size"),
}


def leave_one_out_table() -> None:
    print("1. leave-one-out interpolation error (|pred/meas - 1| along the innermost axis)")
    print(f"{'system':22s} {'table':22s} {'points':>7s} {'median':>8s} {'p90':>8s}")
    for system in tables.systems():
        for table, axes in AXES.items():
            tree = tables.build_tree(tables.load_rows(system, table), axes)
            depth = len(axes)
            # the model interpolates the monotone envelope of each (k, m), (batch, length) or size sub-table
            fitted = _envelope(tree, depth, ENVELOPE_LEVELS[table])
            errors = tables.leave_one_out(fitted, depth)
            if errors:
                print(f"{system:22s} {table:22s} {len(errors):7d} {statistics.median(errors):8.1%} "
                      f"{percentile(errors, 90):8.1%}")
            if table == "generation_attention":
                errors = _leave_one_out_linear(fitted, depth)
                print(f"{system:22s} {'  linear in context':22s} {len(errors):7d} {statistics.median(errors):8.1%} "
                      f"{percentile(errors, 90):8.1%}")
    print()


def _leave_one_out_linear(tree: dict, depth: int) -> list[float]:
    """leave_one_out, but interpolating linearly in context (step + 1) as the model does for decode attention."""
    if depth > 1:
        return [e for sub in tree.values() for e in _leave_one_out_linear(sub, depth - 1)]
    xs = sorted(tree)
    errors = []
    for j in range(1, len(xs) - 1):
        (c0, c, c1), (y0, y1) = (x + 1 for x in xs[j - 1:j + 2]), (tree[xs[j - 1]], tree[xs[j + 1]])
        errors.append(abs((y0 + (y1 - y0) * (c - c0) / (c1 - c0)) / tree[xs[j]] - 1))
    return errors


ENVELOPE_LEVELS = {"gemm": 3, "context_attention": 2, "generation_attention": 2, "allreduce": 1}


def _envelope(tree: dict, depth: int, levels: int, fit=tables.monotone) -> dict:
    if depth <= levels:
        return fit(tree, depth)
    return {k: _envelope(v, depth - 1, levels, fit) for k, v in tree.items()}


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
    # decode batches of 1..256 sequences, each at its own context (64..4096 tokens), and prompts
    batches = [[rng.randint(64, 4096) for _ in range(rng.randint(1, 256))] for _ in range(300)]
    per_seq = [StepShape(decode_seqs=len(c), decode_context=sum(c), decode_histogram=context_histogram(c))
               for c in batches]
    mean = [StepShape(decode_seqs=s.decode_seqs, decode_context=s.decode_context) for s in per_seq]
    prompts = [StepShape(prefill_seqs=1, prefill_tokens=n, prefill_attn_pairs=prefill_attn_pairs(n))
               for n in (rng.randint(8, 2048) for _ in range(100))]
    print(f"3. step_time per call, {model} on h100-sxm, 300 decode + 100 prefill shapes, cached lookups "
          f"(target <= 20 us)")
    buckets = statistics.mean(len(s.decode_histogram) // 3 for s in per_seq)
    cases = [("roofline", RooflineCostModel(model, "h100-sxm"), mean + prompts),
             ("measured, decode at the mean context", MeasuredCostModel(model, "h100-sxm"), mean + prompts),
             (f"measured, decode per sequence ({buckets:.1f} buckets/step)", MeasuredCostModel(model, "h100-sxm"),
              per_seq + prompts)]
    for label, cost, shapes in cases:
        for s in shapes:
            cost.step_time(s)                     # fill the caches
    runs: dict[str, list[float]] = {}
    for _ in range(7):                            # interleaved rounds: the cases share the machine's noise
        for label, cost, shapes in cases:
            t0 = time.perf_counter()
            for _ in range(20):
                for s in shapes:
                    cost.step_time(s)
            runs.setdefault(label, []).append((time.perf_counter() - t0) / (20 * len(shapes)) * 1e6)
    for label, _, _ in cases:
        print(f"  {label:48s} median {statistics.median(runs[label]):6.2f} us, best {min(runs[label]):6.2f} us")
    cold = MeasuredCostModel(model, "h100-sxm")
    t0 = time.perf_counter()
    for s in per_seq + prompts:
        cold.step_time(s)
    print(f"  first call per shape (cache miss): {(time.perf_counter() - t0) / 400 * 1e6:.0f} us")
    print()


def distortion_table() -> None:
    print("4. monotone fit: how far it moves the raw grid values (|fit/raw - 1|)")
    print(f"{'system':22s} {'table':22s} {'points':>7s} {'isotonic: moved':>16s} {'median':>7s} {'p90':>7s} "
          f"{'max':>7s} {'envelope: moved':>16s} {'median':>7s} {'p90':>7s} {'max':>7s}")
    for system in tables.systems():
        for table, axes in AXES.items():
            tree = tables.build_tree(tables.load_rows(system, table), axes)
            depth, levels = len(axes), ENVELOPE_LEVELS[table]
            raw = list(_leaves(tree, depth))
            cells = []
            for fit in (tables.monotone, _running_min):
                fitted = dict(_leaves(_envelope(tree, depth, levels, fit), depth))
                changes = [abs(fitted[key] / y - 1) for key, y in raw]
                moved = sum(c > 0 for c in changes) / len(changes)
                cells.append(f"{moved:16.1%} {statistics.median(changes):7.2%} {percentile(changes, 90):7.2%} "
                             f"{max(changes):7.1%}")
            print(f"{system:22s} {table:22s} {len(raw):7d} {cells[0]} {cells[1]}")
    print()


def _leaves(tree, depth: int, path: tuple = ()):
    if depth == 0:
        yield path, tree
        return
    for key, sub in tree.items():
        yield from _leaves(sub, depth - 1, path + (key,))


def _running_min(tree: dict, depth: int) -> dict:
    """The envelope the model used before the isotonic fit: each latency lowered to the least
    measured at any larger size, along the innermost axis and then the outer one."""
    if depth == 1:
        out, least = {}, float("inf")
        for x in sorted(tree, reverse=True):
            least = min(least, tree[x])
            out[x] = least
        return out
    if depth > 2:
        return {k: _running_min(v, depth - 1) for k, v in tree.items()}
    rows = {k: _running_min(v, 1) for k, v in tree.items()}
    larger: dict = {}
    for key in sorted(rows, reverse=True):
        row = rows[key]
        for x, y in row.items():
            if x in larger and larger[x] < y:
                row[x] = larger[x]
        for x, y in row.items():
            larger[x] = min(y, larger.get(x, y))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama-3.1-8b")
    args = parser.parse_args()
    leave_one_out_table()
    decode_table(args.model)
    speed_table(args.model)
    distortion_table()


if __name__ == "__main__":
    main()
