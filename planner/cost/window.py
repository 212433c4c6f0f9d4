"""Keys a sliding-window layer attends to in one step (gpt-oss's alternate layers, window 128).

A sliding-window layer's query sees at most the last `window` keys, so a decode sequence at context c
reads min(c, window) of them and a prefill token at position i attends to min(i + 1, window). The
decode contexts arrive as StepShape.decode_histogram's power-of-two buckets (bucket k holds contexts in
(2**(k-1), 2**k]); for a power-of-two window (128) every bucket lies wholly below or above it, so the
sum is exact; otherwise the straddling bucket is min(its sum, its count x window).
"""
from __future__ import annotations

from planner.cost.shape import StepShape


def windowed_decode_keys(s: StepShape, window: int) -> int:
    """sum over the step's decode sequences of min(context, window)."""
    hist = s.decode_histogram
    if not hist:
        return min(s.decode_context, s.decode_seqs * window)
    keys = 0
    for i in range(0, len(hist), 3):
        count, total = hist[i + 1], hist[i + 2]
        keys += min(total, count * window)
    return keys


def windowed_prefill_pairs(s: StepShape, window: int) -> int:
    """The step's prefill (query, key) pairs when each query sees at most `window` keys."""
    return min(s.prefill_attn_pairs, s.prefill_tokens * window)
