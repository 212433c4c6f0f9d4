"""How KV block size changes decode-attention time, from our own kernel measurements.

The paged-attention kernel walks a sequence's block table one block at a time:
small blocks mean more table lookups and shorter contiguous reads, large ones
more wasted work in the last, partly filled block. bench/bench_block_size.py
times our paged_attention_v1 at block sizes 8, 16 and 32 on the same keys and
values and stores each time relative to block 16 in
planner/data/block_size_factors.json, with where and how it was measured.

The cost models multiply their decode-attention term (time per context key)
by ``decode_attention_factor(block_size, reference)``: the roofline relative
to block 16 (its bandwidth figure is a block-16 kernel's), a calibrated
profile relative to the block size it was profiled at. Block sizes between or
beyond the measured ones are interpolated linearly in log2(block size) and held
flat outside the range.
"""
from __future__ import annotations

import json
import math
from functools import lru_cache
from importlib import resources
from pathlib import Path

DATA = Path(str(resources.files("planner").joinpath("data/block_size_factors.json")))


@lru_cache(maxsize=None)
def _table(backend: str) -> tuple[tuple[tuple[int, float], ...], str] | None:
    if not DATA.is_file():
        return None
    backends = json.loads(DATA.read_text()).get("backends", {})
    entry = backends.get(backend) or backends.get("cpu")
    if entry is None:
        return None
    points = tuple(sorted((int(k), float(v)) for k, v in entry["factors"].items()))
    return points, entry.get("source", "unknown")


def _at(points: tuple[tuple[int, float], ...], block_size: int) -> float:
    x = math.log2(block_size)
    xs = [math.log2(b) for b, _ in points]
    if x <= xs[0]:
        return points[0][1]
    if x >= xs[-1]:
        return points[-1][1]
    for (x0, (_, y0)), (x1, (_, y1)) in zip(zip(xs, points), zip(xs[1:], points[1:])):
        if x0 <= x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return 1.0


def decode_attention_factor(block_size: int, reference: int = 16, backend: str = "cpu") -> float:
    """Decode-attention time at `block_size` relative to `reference` (1.0 without data)."""
    found = _table(backend)
    if found is None or block_size == reference:
        return 1.0
    points, _ = found
    return _at(points, block_size) / _at(points, reference)


def factor_source(backend: str = "cpu") -> str | None:
    """Where the factors came from (the bench command, date, machine), or None without data."""
    found = _table(backend)
    return None if found is None else found[1]
