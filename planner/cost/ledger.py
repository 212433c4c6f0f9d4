"""A step's cost ledger: every priced part of one engine step, with its seconds and where the price came from.

The measured cost model (planner/cost/measured.py) prices a step as a list of
`Term`s and its `step_time` is their sum: `MeasuredCostModel.ledger(shape)`
returns the same terms the step time adds up, so what `planner explain`
prints is what the simulator charges. Each term names its source:

- `table`: an operation NVIDIA timed inside vLLM (aiconfigurator-core's tables,
  planner/data/measured/), interpolated over the table's grid;
- `roofline`: bytes over the GPU's effective bandwidth plus a per-kernel floor
  (aiconfigurator's constant), for the memory-bound kernels no table covers,
  and the swap and copy-on-write traffic;
- `scaled`: the roofline at the efficiency a table shows for the shapes NVIDIA
  timed in the same format and split (a MoE's experts whose shape no table
  holds, planner/cost/measured_moe.py);
- `fitted`: a constant fitted to NVIDIA's measured end-to-end vLLM runs on
  H100 (aiconfigurator-core's systems/silicon_sample.csv), with its record in
  planner/data/measured_calibration.json (docs/calibration.md): vLLM's host
  time per step and per scheduled sequence;
- `published`: bytes over a rate a cited public benchmark measured outside
  vLLM (DeepEP's README for its all-to-all kernels, planner/cost/all2all.py);
- `schedule`: what a schedule vLLM runs takes off the other terms, priced from
  them (dual-batch overlap's hidden all-to-all, planner/cost/dbo.py: a
  negative term).

CUDA graphs. vLLM replays a captured graph for a step of at most
`max_cudagraph_capture_size` tokens, padded up to the next captured size, and
runs larger steps eagerly (the V1 GPU model runner pads the scheduled token
count to the capture size its CUDA-graph dispatcher picks; mixed and prefill
steps run piecewise graphs, attention outside them, under vLLM's default
FULL_AND_PIECEWISE mode, so they are padded too). The sizes are vLLM's own,
computed in vllm/config/vllm.py VllmConfig._set_cudagraph_sizes: the largest
is min(2 * max_num_seqs, 512), capped at max_num_batched_tokens, and the
sizes are 1, 2, 4, then every multiple of 8 below 256, then every multiple of
16 up to the largest. A decode batch of 9 runs as 16 tokens.
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

SOURCES = ("table", "scaled", "roofline", "fitted", "published", "schedule")
# The groups a term belongs to, in the order a step runs them (breakdown() sums by group).
GROUPS = ("embedding", "gemm", "moe", "attention", "elementwise", "collective", "lm_head", "sampler", "host",
          "memory")
# vLLM's default ceiling for the captured sizes (vllm/config/vllm.py: min(max_num_seqs * 2, 512)).
CUDAGRAPH_MAX_SIZE = 512


@dataclass(frozen=True, slots=True)
class Term:
    """One priced part of a step: `count` launches (per layer x layers, or once) costing `seconds` in all."""

    name: str
    group: str
    seconds: float
    source: str        # one of SOURCES
    detail: str        # what was looked up or assumed, in words
    count: int = 1


@dataclass(frozen=True)
class Ledger:
    """Every term of one step; `total` is the step's duration."""

    cost_model: str
    terms: tuple[Term, ...]
    tokens: int            # tokens the step computes
    padded_tokens: int     # as the GPU runs them (CUDA-graph padding)
    notes: tuple[str, ...] = ()

    @property
    def total(self) -> float:
        return sum(t.seconds for t in self.terms)

    def by_group(self) -> dict[str, float]:
        """Seconds per group (every group present, 0.0 where the step has none)."""
        parts = dict.fromkeys(GROUPS, 0.0)
        for t in self.terms:
            parts[t.group] += t.seconds
        return parts

    def rows(self) -> list[dict]:
        """The terms as rows: name, seconds, share of the step, source, what was priced."""
        total = self.total or 1.0
        return [{"term": t.name, "group": t.group, "seconds": t.seconds, "share": t.seconds / total,
                 "source": t.source, "detail": t.detail, "count": t.count} for t in self.terms]

    def as_dict(self) -> dict:
        return {"cost_model": self.cost_model, "total_seconds": self.total, "tokens": self.tokens,
                "padded_tokens": self.padded_tokens, "terms": self.rows(), "by_group": self.by_group(),
                "notes": list(self.notes)}


def cudagraph_capture_sizes(max_num_seqs: int = 256, max_num_batched_tokens: int | None = None,
                            max_size: int | None = None, interactivity: bool = False,
                            decode_query_len: int = 1) -> tuple[int, ...]:
    """vLLM's default CUDA-graph capture sizes (vllm/config/vllm.py VllmConfig._set_cudagraph_sizes, 0.17-0.19);
    `interactivity` (--performance-mode interactivity): every size from 1 to 32, then as by default. With
    speculation a decode step runs `decode_query_len` = 1 + K tokens a sequence: the largest size grows with
    it, and each size is rounded up to a multiple of it (vllm/config/compilation.py
    adjust_cudagraph_sizes_for_spec_decode, which vLLM's default FULL_AND_PIECEWISE graphs call)."""
    largest = max_size if max_size is not None else min(max_num_seqs * decode_query_len * 2, CUDAGRAPH_MAX_SIZE)
    if max_num_batched_tokens is not None:
        largest = min(largest, max_num_batched_tokens)
    small = range(1, min(largest, 32) + 1) if interactivity else (1, 2, 4)
    sizes = [s for s in small if s <= largest]
    if largest >= 8:
        sizes += range(8, min(largest + 1, 256), 8)
    if largest >= 256:
        sizes += range(256, largest + 1, 16)
    if decode_query_len > 1 and sizes:
        q = decode_query_len
        rounded = [-(-s // q) * q for s in sizes if -(-s // q) * q <= largest]
        sizes = rounded or ([q] if q <= largest else [])
    return tuple(sorted(set(sizes)))


@dataclass(frozen=True)
class CudaGraphs:
    """Which token counts run as a captured graph, and the size each is padded to."""

    sizes: tuple[int, ...]

    @property
    def largest(self) -> int:
        return self.sizes[-1] if self.sizes else 0

    def padded(self, tokens: int) -> int:
        """The tokens the GPU runs: the next captured size, or `tokens` itself when the step runs eagerly."""
        if tokens > self.largest:
            return tokens
        return self.sizes[bisect_left(self.sizes, tokens)]

    def captured(self, tokens: int) -> bool:
        return 0 < tokens <= self.largest
