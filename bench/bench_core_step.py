"""Core overhead per engine step, no model, 256 decoding sequences.

Target (issue 13): at most 1 ms per step. The simulator runs this code
millions of times, so this is its inner loop. Two measurements, side by side in
one run, for paged with and without prefix caching and for orca-oracle:

- ``sched+update``: ``Scheduler.schedule`` and ``Scheduler.update`` alone;
- ``full step``: the core step helper the engine, simulator and profiler all run
  (``begin_step`` with model inputs built, ``end_step`` with its StepRecord).

Each is run ``--repeats`` times; the table gives the min and median over the
repeats of each repeat's median step time.

    .venv/bin/python bench/bench_core_step.py [--steps 1000] [--repeats 5]
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.core.allocators import make_allocator  # noqa: E402
from engine.core.sampling_params import SamplingParams  # noqa: E402
from engine.core.scheduler import Scheduler, SchedulerConfig  # noqa: E402
from engine.core.sequence import SequenceGroup  # noqa: E402
from engine.core.step import begin_step, end_step  # noqa: E402

NUM_SEQS = 256
TARGET_MS = 1.0


def _decoding_scheduler(allocator: str, prefix_caching: bool, steps: int) -> Scheduler:
    alloc = make_allocator(allocator, block_size=16, num_gpu_blocks=40_000, max_model_len=4096,
                           enable_prefix_caching=prefix_caching)
    sched = Scheduler(SchedulerConfig(max_model_len=4096, max_num_seqs=NUM_SEQS,
                                      max_num_batched_tokens=NUM_SEQS * 200), alloc)
    rng = random.Random(0)
    for i in range(NUM_SEQS):
        prompt = [rng.randrange(32000) for _ in range(rng.randint(50, 150))]
        sched.add(SequenceGroup(str(i), prompt, SamplingParams(max_tokens=steps + 10, ignore_eos=True),
                                0.0, output_len_hint=steps + 10))
    out = sched.schedule(0.0)                 # one prefill admits everybody
    sched.update(out, {s.seq_id: [(1, 0.0)] for s in out.seqs}, 0.0)
    return sched


def measure(allocator: str, prefix_caching: bool, steps: int, full: bool) -> float:
    """Median seconds per step over ``steps`` decode steps."""
    sched = _decoding_scheduler(allocator, prefix_caching, steps)
    make_input = (lambda tokens, cached, table: (tokens, cached, table)) if allocator == "paged" else None
    times = []
    now = 0.0
    clock = time.perf_counter
    for _ in range(steps):
        t0 = clock()
        if full:
            step = begin_step(sched, now, make_input)
            out = step.out
        else:
            out = sched.schedule(now)
        samples = {s.seq_id: [(7, -0.1)] for s in out.seqs}   # what an executor hands back
        now += 0.02
        if full:
            end_step(sched, step, samples, now)
        else:
            sched.update(out, samples, now)
        times.append(clock() - t0)
        assert len(out.seqs) == NUM_SEQS and not out.is_prefill
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"core step overhead, {NUM_SEQS} decoding sequences, {args.steps} steps x {args.repeats} repeats "
          f"(target: <= {TARGET_MS} ms)")
    print(f"{'allocator':<22}{'measured':<14}{'min ms':>8}{'median ms':>11}{'median/target':>15}")
    for name, prefix in (("paged", False), ("paged", True), ("orca-oracle", False)):
        for full in (False, True):
            runs = [measure(name, prefix, args.steps, full) * 1e3 for _ in range(args.repeats)]
            med = statistics.median(runs)
            label = name + (" +prefix-cache" if prefix else "")
            print(f"{label:<22}{'full step' if full else 'sched+update':<14}{min(runs):>8.3f}{med:>11.3f}"
                  f"{med / TARGET_MS:>15.2f}")


if __name__ == "__main__":
    main()
