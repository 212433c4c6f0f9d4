"""The measured model's Gated DeltaNet layers: NVIDIA's timed vLLM 0.24 GDN kernels.

Qwen3.5 and Qwen3-Next give 3 of 4 layers to Gated DeltaNet linear attention. The `gdn` table
(aiconfigurator-core's gdn_perf, scripts/extract_measured_tables.py) times one such layer's two
kernels per phase on one GPU, by the heads that GPU holds (a TP shard; head dims 128, conv width 4):

  prefill   causal_conv1d_fn + the chunked delta rule (FlashInfer's on Hopper and B200, Triton's on
            Ada and Blackwell RTX), over batch_size 1-64 sequences of seq_len 1-32768 tokens each
  decode    causal_conv1d_update + fused_recurrent_gated_delta_rule_packed_decode, over batch_size
            1-1024 (the packed decode at 1024 x 64 value heads was not timed: a CUDA-grid guard)

Each kernel is fitted monotone (planner/cost/tables.py: batch, then seq_len) and interpolated in
log-log space; a layer's time is its two kernels' sum. The recurrent state is fp32 (value heads x
128 x 128 x 4 bytes a sequence), read and written once a decode step: at 1024 sequences x 32 value
heads the packed decode takes 1.05 ms on H200, 4.1 TB/s of state traffic, so decode is state-bandwidth
bound once batches are large.

A head shape NVIDIA did not time is priced from the timed shape with the same key/value head ratio
nearest in value heads (else the nearest in value heads), and its how is "scaled". The kernels work per
(sequence, value head) pair, so its b sequences are priced as the timed shape's b x (value heads / timed
value heads) sequences, times key_dim x value_dim over the timed one's if the head dims differ. Scaling
the latency by the head ratio instead is right only where the kernels are bandwidth-bound: at small
batches they are launch-bound, and it is off by up to 2x. Leaving each timed shape out and pricing it
from the others (bench/bench_gdn_shapes.py; every neighbour is 2x away in value heads), as the factor
between priced and timed, mean / worst:

  system       decode 1-256 seqs   prefill 1k-8k tokens (1 and 8 seqs)   latency x heads (dec / pre)
  H100, H200   1.01 / 1.06         1.01 / 1.06                           1.52 / 2.05, 1.70 / 2.00
  B200         1.01 / 1.07         1.01 / 1.04                           1.57 / 2.05, 1.73 / 1.97
  L40S         1.01 / 1.08         1.05 / 1.69                           1.83 / 5.69, 1.45 / 1.88
  RTX PRO 6000 1.02 / 1.10         1.05 / 1.36                           1.68 / 2.85, 1.43 / 1.91

The worst prefill cases price the smallest shape of a ratio from one with twice its heads: one sequence
becomes half a sequence, below the grid (extrapolated, and flagged so).

Odd in the data: the packed decode's state traffic (2 x pairs x 64 KB) runs past DRAM while the state
fits in L2, since NVIDIA's timed repeats reuse one state buffer. Up to 1024 (sequence, value head)
pairs (64 MB): L40S 4.1 TB/s, RTX PRO 6000 5.8, H100 3.6 (DRAM 0.86, 1.8, 3.35); from 4096 pairs
0.66, 1.46 and 2.9-3.0. A served model's other layers would evict the state between steps, so those
tables' small-batch decode is optimistic (L40S and RTX PRO 6000 by up to ~6x and ~4x: 4.1/0.66,
5.8/1.46). H200 and B200 stay under their HBM peaks (4.3 and 6.6 TB/s at most).
"""
from __future__ import annotations

import math
from functools import lru_cache

from planner.cost import tables
from planner.errors import PlannerError

# (key heads, value heads, key head dim, value head dim) on one GPU.
Shape = tuple[int, int, int, int]
KERNELS = ("conv", "delta_rule")


def _shape(row: dict) -> Shape:
    return row["num_k_heads"], row["num_v_heads"], row["head_k_dim"], row["head_v_dim"]


@lru_cache(maxsize=None)
def timed_shapes(system: str) -> tuple[Shape, ...]:
    """The head shapes NVIDIA timed on the system (none without a gdn table)."""
    if not tables.has_table(system, "gdn"):
        return ()
    return tuple(sorted({_shape(r) for r in tables.load_rows(system, "gdn")}))


@lru_cache(maxsize=None)
def _trees(system: str, shape: Shape) -> tuple[tuple[dict, dict], tuple[dict, dict]]:
    """One timed shape's monotone fits: ((context conv, context delta rule) as tree[batch][seq_len],
    (generation conv, generation delta rule) as tree[batch])."""
    rows = [r for r in tables.load_rows(system, "gdn") if _shape(r) == shape]
    context = tuple(tables.monotone(tables.build_tree(rows, ("batch_size", "seq_len"),
                                                      {"phase": "context", "kernel": k}), 2) for k in KERNELS)
    generation = tuple(tables.monotone(tables.build_tree(rows, ("batch_size",),
                                                         {"phase": "generation", "kernel": k}), 1)
                       for k in KERNELS)
    return context, generation


def nearest(shape: Shape, timed: tuple[Shape, ...]) -> Shape:
    """The timed shape to scale from: the same key/value head ratio first, then the nearest value-head
    count (by ratio, so 16 is as near 32 as 64 is), the smaller on a tie (its lookups then sit at more
    sequences, inside the grid from batch 1 on)."""
    kh, vh = shape[0], shape[1]

    def distance(t: Shape) -> tuple:
        return kh * t[1] != vh * t[0], abs(math.log(t[1] / vh)), t[1]
    return min(timed, key=distance)


class GdnKernels:
    """NVIDIA's timed GDN kernels on one system for one per-GPU head shape: one linear-attention layer's
    short conv and delta rule, decoding and prefilling, read from the `gdn` table (scaled from the
    nearest timed shape when this one was not timed; see the module docstring)."""

    def __init__(self, system: str, shape: Shape, timed: Shape) -> None:
        self.system, self.shape, self.timed = system, shape, timed
        self.how = "measured" if shape == timed else "scaled"
        # The kernels work per (sequence, value head) pair: this shape's b sequences cost what the timed
        # shape's b x heads cost; a head's state and work then scale with key_dim x value_dim.
        self.heads = shape[1] / timed[1]
        self.scale = (shape[2] * shape[3]) / (timed[2] * timed[3])
        self._context, self._generation = _trees(system, timed)

    @classmethod
    def load(cls, system: str, key_heads: int, value_heads: int, key_dim: int, value_dim: int
             ) -> "GdnKernels | None":
        """None when the system has no gdn table."""
        return cls._from(system, _checked(key_heads, value_heads, key_dim, value_dim), timed_shapes(system))

    @classmethod
    def without_own(cls, system: str, key_heads: int, value_heads: int, key_dim: int, value_dim: int
                    ) -> "GdnKernels | None":
        """The shape priced from the other timed shapes only, as if NVIDIA had not timed it (leave-one-out
        checks: bench/bench_gdn_shapes.py, the tests)."""
        shape = _checked(key_heads, value_heads, key_dim, value_dim)
        return cls._from(system, shape, tuple(t for t in timed_shapes(system) if t != shape))

    @classmethod
    def _from(cls, system: str, shape: Shape, timed: tuple[Shape, ...]) -> "GdnKernels | None":
        if not timed:
            return None
        return cls(system, shape, shape if shape in timed else nearest(shape, timed))

    def decode(self, seqs: int) -> tuple[float, bool]:
        """Seconds one GDN layer spends on `seqs` decoding sequences (conv update + recurrent update);
        True when outside the grid (extrapolated)."""
        if seqs < 0:
            raise PlannerError(f"GDN decode of {seqs} sequences: the count must be >= 0")
        if seqs == 0:
            return 0.0, False
        return self._sum(self._generation, (seqs * self.heads,))

    def prefill(self, seqs: int, tokens: int) -> tuple[float, bool]:
        """Seconds one GDN layer spends on the prompt chunks of `seqs` sequences holding `tokens` tokens in
        all (conv + chunked delta rule), priced as `seqs` chunks of tokens/seqs each."""
        if seqs < 0 or tokens < seqs or (seqs == 0 and tokens):
            raise PlannerError(f"GDN prefill of {tokens} tokens in {seqs} sequences: each sequence needs a token")
        if seqs == 0:
            return 0.0, False
        return self._sum(self._context, (seqs * self.heads, tokens / seqs))

    def _sum(self, trees: tuple[dict, dict], query: tuple[float, ...]) -> tuple[float, bool]:
        total, outside = 0.0, False
        for tree in trees:
            latency, extrapolated = tables.interpolate(tree, query)
            total, outside = total + latency, outside or extrapolated
        return total * self.scale, outside


def _checked(key_heads: int, value_heads: int, key_dim: int, value_dim: int) -> Shape:
    shape = (key_heads, value_heads, key_dim, value_dim)
    if min(shape) < 1:
        raise PlannerError(f"GDN head shape {shape} (key heads, value heads, key dim, value dim): each must be >= 1")
    return shape
