"""A fake executor for core tests: it samples tokens from a seeded generator."""
from __future__ import annotations

import random

from engine.core.scheduler import Samples, SchedulerOutput


def fake_samples(out: SchedulerOutput, rng: random.Random, vocab: int = 50) -> Samples:
    samples: Samples = {}
    for group in out.groups:
        k = group.params.samples_per_sequence(group.first_step_pending)
        for seq in group.seqs:
            if seq in out.seqs:
                samples[seq.seq_id] = [(rng.randrange(vocab), -rng.random()) for _ in range(k)]
    return samples
