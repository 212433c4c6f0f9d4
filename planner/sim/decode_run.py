"""A plan of the decode batch priced as one run: every step's contexts at once, one cost-model call a chunk.

A plan (planner/sim/batch.py) is a run of decode steps over a fixed set of
requests: each step decodes every member, and each member's context grows by
one token a step. So the context histogram of every step of the run follows
from the members' contexts, and a cost model that offers `decode_step_times`
(the measured model) prices a whole chunk of steps in a few array operations
instead of one `step_time` call per step, which was most of a fleet's event
loop (64 replicas at 200 req/s: six million steps, about twice as many
priced). The floats are step_time's: the model computes each step's terms in
step_time's order, and the ends are accumulated one step at a time from the
plan's start (numpy's cumsum is a sequential loop; tests hold both to the
step-by-step simulation). Chunks double in length from `FIRST_CHUNK` where an
arrival is known, so a plan cut short priced few steps past the cut; a chunk's
array operations cost what a few dozen steps do, so the first chunk is 64 steps
(16 took 10% longer over the DP2 x EP2 hour of bench/bench_moe_speed.py, 32 3%;
128 no less than 64). `StepShape`s
are built only for the steps a replica takes, and only when read
(`DecodeRun.shapes`, planner/sim/lazy_log.py).
"""
from __future__ import annotations

import math
from bisect import bisect_left
from itertools import chain

import numpy as np

from planner.cost.shape import StepShape, context_histogram

FIRST_CHUNK = 64      # steps priced at first; each further chunk twice the last


def run_pricer(cost_model):
    """The cost model's vectorized price of decode steps, or None (then priced step by step): a model
    offers it with `decode_step_times`; a wrapper (noise, speed factor, replayed durations) does not."""
    # The class's own method: a wrapper that forwards what it lacks to its base must not price a run
    # without its noise or factor.
    if getattr(type(cost_model), "decode_step_times", None) is None:
        return None
    return cost_model.decode_step_times


class DecodeRun:
    """The steps of one plan: each step's contexts, histogram and (when read) shape, from the members'."""

    __slots__ = ("bases", "context", "first", "num", "_array")

    def __init__(self, bases: list[int], first: int, context: int) -> None:
        # per member: its context at batch step s is base + s
        self.bases = bases.tolist() if isinstance(bases, np.ndarray) else bases
        self.num = len(bases)
        self.first = first            # the batch step of the run's first step
        self.context = context        # the first step's total decode context
        self._array = None            # the bases as an array, made at the first chunk (a short plan
                                      # priced step by step may never need one)

    def chunk(self, offset: int, count: int) -> tuple[int, np.ndarray, np.ndarray]:
        """Steps offset .. offset + count - 1 of the run: per step and context bucket from the lowest
        any of them reads, the sequences and their total context (StepShape.decode_histogram's)."""
        if self._array is None:
            self._array = np.array(self.bases)
        contexts = np.arange(self.first + offset, self.first + offset + count)[:, None] + self._array
        keys = np.frexp(contexts - 1)[1]            # context_bucket: (c - 1).bit_length()
        low = int(keys[0].min())                    # contexts only grow: the first step has the lowest
        width = int(keys[-1].max()) - low + 1
        keys += (np.arange(count) * width - low)[:, None]
        cells = keys.ravel()
        counts = np.bincount(cells, minlength=count * width).reshape(count, width)
        sums = np.bincount(cells, weights=contexts.ravel(), minlength=count * width).reshape(count, width)
        return low, counts, sums

    def contexts(self, steps: int) -> range:
        """The first `steps` steps' total decode contexts."""
        return range(self.context, self.context + steps * self.num, self.num)

    def histogram(self, index: int) -> tuple[int, ...]:
        """StepShape.decode_histogram of step `index` of the run (a few dozen members: no arrays)."""
        step = self.first + index
        return context_histogram([base + step for base in self.bases])

    def shapes(self, steps: int) -> list[StepShape]:
        """The first `steps` steps' shapes, as the scalar plan builds them: each histogram's (bucket,
        sequences, context) triples laid out by numpy, an empty bucket's left out."""
        if not steps:
            return []
        low, counts, sums = self.chunk(0, steps)
        width = counts.shape[1]
        triples = np.empty((steps, width, 3), dtype=np.int64)
        triples[:, :, 0] = np.arange(low, low + width)
        triples[:, :, 1] = counts
        triples[:, :, 2] = sums
        full = counts.all(axis=1).tolist()
        num, context, shapes = self.num, self.context, []
        for row, whole in zip(triples.reshape(steps, 3 * width).tolist(), full):
            histogram = tuple(row) if whole else tuple(chain.from_iterable(
                row[i:i + 3] for i in range(0, 3 * width, 3) if row[i + 1]))
            shapes.append(StepShape(0, 0, 0, num, context, 0, 0, histogram))
            context += num
        return shapes


def price_run(run: DecodeRun, cost_model, pricer, now: float, next_arrival: float, limit: int,
              crossings: list[int], step: int, spare: int, ahead: int = 0) -> tuple[list[float], list[int], list[float]]:
    """Each step's end, blocks taken and price, from the next one on: at most `limit` steps, none starting at or
    after `next_arrival` but the `ahead` first of those, while the blocks they take leave `spare`
    (crossings[r]: members taking a block at the batch steps s with s % block size == r). The scalar loop
    of DecodeBatch._price, chunked; one chunk when no arrival is known (a routed replica prices up to its
    next finish)."""
    ends: list[float] = []
    takes: list[int] = []
    prices: list[float] = []
    end, taken, bs = now, 0, len(crossings)
    size = limit if next_arrival == math.inf else FIRST_CHUNK
    while len(ends) < limit and (end < next_arrival or ahead):
        offset = len(ends)
        count = min(size, limit - offset) if end < next_arrival else 1      # else only the step ahead
        fit = []
        for s in range(step + offset + 1, step + offset + 1 + count):
            crossing = crossings[s % bs]
            if taken + crossing > spare:
                break
            taken += crossing
            fit.append(crossing)
        if not fit:
            break
        low, counts, sums = run.chunk(offset, len(fit))
        times = pricer(run.num, low, counts, sums)
        chunk_ends = np.cumsum(np.concatenate(((end,), times))).tolist()
        keep = len(fit)
        if next_arrival != math.inf:
            before = bisect_left(chunk_ends, next_arrival, 0, len(fit))     # steps starting before the arrival
            if before < len(fit):
                keep, ahead = min(len(fit), before + ahead), 0
        cost_model.flag_decode_buckets(run.num, low, counts[:keep])
        ends += chunk_ends[1:keep + 1]
        takes += fit[:keep]
        prices += times[:keep].tolist()
        end = ends[-1]
        if len(fit) < count:
            break                                  # the blocks ran out
        size *= 2
    return ends, takes, prices
