"""Core overhead per engine step: schedule + update with no model, 256 decoding sequences.

Target (issue 2): median at most 2 ms on the 2-core CI machine. The simulator
runs this code millions of times, so this is its inner loop. Prints the
median and p90 for paged with and without prefix caching and for orca-oracle,
side by side in one run.

    .venv/bin/python bench/bench_core_step.py [--steps 2000]
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

NUM_SEQS = 256


def measure(allocator: str, prefix_caching: bool, steps: int) -> list[float]:
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
    times = []
    now = 0.0
    for _ in range(steps):
        t0 = time.perf_counter()
        out = sched.schedule(now)
        samples = {s.seq_id: [(7, -0.1)] for s in out.seqs}   # what an executor hands back
        t1 = time.perf_counter()
        now += 0.02
        sched.update(out, samples, now)
        t2 = time.perf_counter()
        times.append((t1 - t0) + (t2 - t1))
        assert len(out.seqs) == NUM_SEQS and not out.is_prefill
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    print(f"core step overhead, {NUM_SEQS} decoding sequences, {args.steps} steps (target: median <= 2 ms)")
    print(f"{'allocator':<22}{'median ms':>10}{'p90 ms':>10}{'median/target':>15}")
    for name, prefix in (("paged", False), ("paged", True), ("orca-oracle", False)):
        times = sorted(measure(name, prefix, args.steps))
        med = statistics.median(times) * 1e3
        p90 = times[int(0.9 * len(times))] * 1e3
        label = name + (" +prefix-cache" if prefix else "")
        print(f"{label:<22}{med:>10.3f}{p90:>10.3f}{med / 2.0:>15.2f}")


if __name__ == "__main__":
    main()
