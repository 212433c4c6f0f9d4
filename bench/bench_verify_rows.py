"""A verify step's rows against as many independent decode rows, on this engine's runner, side by side.

The calibrated cost model prices a sequence verifying d drafts as d + 1 decode rows, each over its own
context (planner/cost/calibrated.py), because that is how engine/llm_engine.py's _execute_speculative
runs it. This bench checks that on the CPU: for each shape (B sequences, d drafts, context c) it times,
alternating, one `runner.execute` of the B x (d + 1) verify rows (consecutive positions over each
sequence's block table), one of as many independent decode rows at the mean context, and one of the B
plain decode rows, and prints the median ratios per repeat (the machine is shared: only ratios taken
side by side mean anything).

    python bench/bench_verify_rows.py [--repeats 25] [--model opt-125m]
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.model_runner import ModelRunner, SequenceInput  # noqa: E402
from planner.profile.checkpoints import model_folder  # noqa: E402

SHAPES = ((4, 4, 96), (8, 4, 96), (4, 4, 400), (2, 4, 200), (8, 2, 200))   # (sequences, drafts, context)


def independent(rows: int, context: int, vocab: int, rng: random.Random) -> list[SequenceInput]:
    """`rows` sequences each decoding one token after `context - 1` cached ones, on distinct blocks."""
    per = -(-(context + 8) // 16)
    return [SequenceInput([rng.randrange(vocab)], context - 1, list(range(i * per, (i + 1) * per)))
            for i in range(rows)]


def verifying(seqs: int, drafts: int, context: int, vocab: int, rng: random.Random) -> list[SequenceInput]:
    """`seqs` sequences each verifying `drafts` drafts: d + 1 one-token rows over one block table."""
    per = -(-(context + drafts + 8) // 16)
    rows = []
    for i in range(seqs):
        table = list(range(i * per, (i + 1) * per))
        rows += [SequenceInput([rng.randrange(vocab)], context - 1 + j, table) for j in range(drafts + 1)]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=25)
    ap.add_argument("--model", default="opt-125m")
    args = ap.parse_args()
    folder, _ = model_folder(args.model)
    runner = ModelRunner(folder, block_size=16, num_gpu_blocks=None, num_cpu_blocks=0, dtype="auto", device="cpu",
                         max_num_batched_tokens=512, max_num_seqs=256)
    rng, vocab = random.Random(0), runner.vocab_size

    def timed(rows) -> float:
        start = time.perf_counter()
        runner.execute(rows)
        return time.perf_counter() - start

    print("| sequences | drafts | context | verify / independent rows | verify / plain decode | verify ms |")
    print("|---:|---:|---:|---:|---:|---:|")
    for b, d, c in SHAPES:
        verify, rows, plain = verifying(b, d, c, vocab, rng), independent(b * (d + 1), c + d // 2, vocab, rng), \
            independent(b, c, vocab, rng)
        for batch in (verify, rows, plain):      # warm-up
            timed(batch)
        ratios_rows, ratios_plain, times = [], [], []
        for _ in range(args.repeats):
            v, r, p = timed(verify), timed(rows), timed(plain)
            ratios_rows.append(v / r)
            ratios_plain.append(v / p)
            times.append(v)
        print(f"| {b} | {d} | {c} | {statistics.median(ratios_rows):.3f} | {statistics.median(ratios_plain):.3f} "
              f"| {statistics.median(times) * 1e3:.1f} |", flush=True)


if __name__ == "__main__":
    main()
