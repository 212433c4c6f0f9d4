"""Step prices against the live engine for prompts after a cached context and for mixed steps (docs/architecture.md,
the calibrated model).

Times the engine's forward pass (`ModelRunner.execute`, opt-125m with random weights, the profile's dtype and
block size) for one prompt of 16, 64 or 256 new tokens after 0 to 1,000 cached ones, and for a chunk of 44-64
tokens after a 336-token prefix beside 0-4 decodes at context 385, in interleaved rounds (the machine's speed
drifts by 10% over minutes: compare within a run, not across runs), and prints each shape's price by the
profile against its median:

    python bench/bench_prefill_context.py [--profile profiles/cpu/opt-125m.json] [--rounds 9]

With a profile that timed prompts after a cached context and `mixed_decode` the errors are flat across the
cached context and the decode rows; with one that did not, they fall with both.
"""
from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time

import torch

from engine.model_runner import ModelRunner, SequenceInput
from planner.catalog import resolve_model
from planner.cost.calibrated import CalibratedCostModel
from planner.cost.shape import StepShape, prefill_attn_pairs
from planner.profile.checkpoints import build_checkpoint

PROMPTS = [(new, cached, 0) for new in (16, 64, 256) for cached in (0, 128, 512, 1000)]
MIXED = [(new, 336, decodes) for new in (44, 52, 64) for decodes in range(5)]
DECODE_CONTEXT = 385


def inputs(new: int, cached: int, decodes: int, rng: random.Random, block_size: int) -> list[SequenceInput]:
    """One prompt of `new` tokens after `cached`, then `decodes` decode rows, each in blocks of its own."""
    blocks = -(-(new + cached) // block_size)
    seqs = [SequenceInput([rng.randrange(1000) for _ in range(new)], cached, list(range(blocks)))]
    per_row = -(-DECODE_CONTEXT // block_size)
    for i in range(decodes):
        first = blocks + i * per_row
        seqs.append(SequenceInput([rng.randrange(1000)], DECODE_CONTEXT - 1, list(range(first, first + per_row))))
    return seqs


def shape(new: int, cached: int, decodes: int) -> StepShape:
    return StepShape(prefill_seqs=1, prefill_tokens=new, prefill_attn_pairs=prefill_attn_pairs(new, cached),
                     prefill_context=cached, decode_seqs=decodes, decode_context=decodes * DECODE_CONTEXT)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="profiles/cpu/opt-125m.json")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    model = CalibratedCostModel.from_file(args.profile)
    profile = model.profile
    torch.set_num_threads(profile.device.threads)
    with tempfile.TemporaryDirectory() as tmp:
        folder = build_checkpoint("opt-125m", resolve_model("opt-125m"), f"{tmp}/model")
        runner = ModelRunner(folder, block_size=profile.block_size, num_gpu_blocks=600, num_cpu_blocks=4,
                             dtype=getattr(torch, profile.dtype), device=torch.device("cpu"))
        rng = random.Random(0)
        cases = PROMPTS + MIXED
        batches = {c: inputs(*c, rng, profile.block_size) for c in cases}
        for c in cases:                                  # warm-up, untimed
            runner.execute(batches[c])
        samples: dict[tuple, list[float]] = {c: [] for c in cases}
        for _ in range(args.rounds):
            for c in cases:
                start = time.perf_counter()
                runner.execute(batches[c])
                samples[c].append(time.perf_counter() - start)
    print(f"forward pass priced by {args.profile} against the engine's median of {args.rounds} rounds\n")
    print("| new tokens | cached | decodes | measured (ms) | priced (ms) | error |\n|---|---|---|---|---|---|")
    for c in cases:
        measured = statistics.median(samples[c])
        priced = model.breakdown(shape(*c))["forward"]
        error = priced / measured - 1
        print(f"| {c[0]} | {c[1]} | {c[2]} | {measured * 1e3:.1f} | {priced * 1e3:.1f} | {error:+.1%} |")


if __name__ == "__main__":
    main()
