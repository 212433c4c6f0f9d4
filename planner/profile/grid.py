"""The grid of shapes a profile measures.

default (GPU): prefill 1..2048 tokens as 1, 4 or 16 prompts, and one prompt of 16 tokens
  and up after 128, 512, 1024 or 2048 cached tokens (a prefix-cache hit or an earlier chunk:
  its keys are read back from the paged cache); decode batch 1..256
  x context 16..2048; host side and sampling at batch 1..256; block moves 1..256.
  Small token counts are dense because CPU matmul times are not monotone
  there (3 rows can cost more than 4). Decode batches sample both sides of
  the first multiples of 4: the runner pads CPU decode batches to a multiple
  of 4, so the time steps up right after each one.
default on CPU: the same axes capped at prefill 1024 tokens (and cached context), decode batch 64 and
  context 1024 (a CPU forward of 256 x 2048 keys takes seconds, and the engine's
  default 1 GiB CPU KV cache could not hold it anyway).
--quick: a handful of points per axis and 5 repetitions: a few minutes for
  opt-125m on a 2-core CPU; good enough to fit, not to study.
Decode points whose sequences do not fit in the runner's KV cache are skipped
(the notes say which).
"""

from __future__ import annotations

from planner.profile.schema import Grid

MIN_PROMPT = 1
MAX_REPEATS = 1000     # timed repetitions per point: beyond it a profile takes days, not a better fit

_DEFAULT = dict(
    prefill_tokens=[1, 2, 3, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048], prefill_seqs=[1, 4, 16],
    prefill_context=[128, 512, 1024, 2048],
    decode_batch=[1, 2, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 32, 48, 64, 128, 256],
    decode_context=[16, 64, 256, 512, 1024, 2048],
    host_batch=[1, 2, 4, 8, 16, 32, 64, 128, 256], block_counts=[1, 4, 16, 64, 256], warmup=2, repeats=7,
)
# The quick grid keeps 32 and 128 prompt tokens, where a quick validation's prompts lie: between 16
# and 64 (64 and 256) a CPU prefill bends, and interpolation missed the full grid's 32 and 128 by 3-6%.
_QUICK = dict(
    prefill_tokens=[1, 2, 3, 4, 8, 16, 32, 64, 128, 256, 512], prefill_seqs=[1, 4], prefill_context=[128, 1024],
    decode_batch=[1, 2, 4, 5, 8, 9, 12, 13, 16, 17, 24, 32, 64], decode_context=[32, 256, 1024],
    host_batch=[1, 4, 16, 64, 256], block_counts=[1, 8, 64], warmup=1, repeats=5,
)
_CPU_CAPS = dict(prefill_tokens=1024, prefill_context=1024, decode_batch=64, decode_context=1024)
# Prompts shorter than this are not timed after a cached context: the cached term is fitted where it
# shows above the prompt's own cost, and a chunk that short after a cache hit is rare.
MIN_CONTEXT_PROMPT = 16


def make_grid(*, quick: bool, on_cpu: bool, max_model_len: int, kv_cache_blocks: int,
              repeats: int | None = None, **overrides) -> Grid:
    """The grid for this run; `overrides` replace whole axes (tests use a tiny grid)."""
    axes = dict(_QUICK if quick else _DEFAULT)
    notes = []
    if on_cpu and not quick:
        for axis, cap in _CPU_CAPS.items():
            axes[axis] = [v for v in axes[axis] if v <= cap]
        notes.append("CPU: prefill capped at 1024 tokens and 1024 cached, decode at batch 64 and context 1024")
    axes.update(overrides)
    if repeats is not None:
        axes["repeats"] = repeats
    if not 1 <= axes["repeats"] <= MAX_REPEATS or axes["warmup"] < 0:
        raise ValueError(f"repeats must be 1 to {MAX_REPEATS:,} and warmup >= 0")
    long = [c for c in axes["decode_context"] if c > max_model_len]
    if long:
        notes.append(f"decode contexts {long} exceed the model's {max_model_len} positions: skipped")
        axes["decode_context"] = [c for c in axes["decode_context"] if c <= max_model_len]
    return Grid(quick=quick, kv_cache_blocks=kv_cache_blocks, notes=notes, **axes)


def prefill_points(grid: Grid, max_model_len: int) -> list[tuple[int, int]]:
    """(tokens, seqs) pairs: `seqs` prompts of tokens // seqs tokens each."""
    return [(t, s) for t in grid.prefill_tokens for s in grid.prefill_seqs
            if t % s == 0 and MIN_PROMPT <= t // s <= max_model_len]


def prefill_context_points(grid: Grid, max_model_len: int) -> list[tuple[int, int]]:
    """(tokens, context) pairs: one prompt of `tokens` new tokens after `context` cached ones."""
    return [(t, c) for t in grid.prefill_tokens for c in grid.prefill_context
            if t >= MIN_CONTEXT_PROMPT and t + c <= max_model_len]


def decode_points(grid: Grid, block_size: int) -> tuple[list[tuple[int, int]], list[str]]:
    """(batch, context) pairs that fit the KV cache, and a note on those that did not."""
    points, skipped = [], []
    for b in grid.decode_batch:
        for c in grid.decode_context:
            if b * -(-c // block_size) <= grid.kv_cache_blocks:
                points.append((b, c))
            else:
                skipped.append(f"{b}x{c}")
    notes = [f"decode points beyond the {grid.kv_cache_blocks}-block KV cache skipped: {', '.join(skipped)}"] \
        if skipped else []
    return points, notes
