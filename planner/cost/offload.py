"""Host memory on a GPU's steps: the CPU KV tier's copies (--kv-offloading-size), and the weights
--cpu-offload-gb keeps there.

The CPU tier's copies run on the copy engine, beside the step.

vLLM's native offloading runs its loads and stores as asynchronous copies on a stream of their own (the
CPU-GPU transfer handlers under vllm/v1/kv_offload/), so a step's compute does not wait for them; a request
loading its prefix waits for its own copy, and the tier's blocks wait for their stores. What a step can move
is bounded by the host link: each GPU copies its share of a block, all GPUs at once, at the catalog's
`host_link_bandwidth` (pinned copies, effective). So a step that loads or stores lasts at least its copies'
time: max(compute, blocks x a block's bytes per GPU / the link's rate). Only when the copies outlast the
compute (prompts of many cached blocks arriving at once, or a busy link) do they show. A calibrated profile
prices them otherwise: the profiled engine copies them in the step, as its swaps (calibrated.py).

The offloaded weights are read by every forward: vLLM's UVA offloader maps them into the GPU's address space
(vllm/model_executor/offloader/uva.py), so each layer that holds them reads them over the host link instead of
from its memory. A step that computes anything takes that read in series: the offloaded bytes over the link's
effective rate (what the same bytes take from HBM, a few percent of it, is left in the inner price).
"""
from __future__ import annotations

from dataclasses import replace

from planner.cost.ledger import Ledger, Term
from planner.cost.wrappers import BuiltOn


class OffloadCost(BuiltOn):
    """A cost model with each step's CPU-tier copies overlapped with its compute (StepShape.offload_blocks)."""

    def __init__(self, inner, seconds_per_block: float) -> None:
        super().__init__(inner)
        self.seconds_per_block = seconds_per_block
        self.name = f"{inner.name} + CPU KV offloading"

    def step_time(self, shape) -> float:
        compute = self.inner.step_time(shape)
        return max(compute, shape.offload_blocks * self.seconds_per_block) if shape.offload_blocks else compute

    def ledger(self, shape) -> Ledger:
        ledger = self.inner.ledger(shape)
        if not shape.offload_blocks:
            return ledger
        copies = shape.offload_blocks * self.seconds_per_block
        hidden = min(copies, ledger.total)
        term = Term("CPU KV tier copies", "memory", copies - hidden, "roofline",
                    f"{shape.offload_blocks} blocks to or from the CPU tier over the host link, "
                    f"{copies * 1e3:.3f} ms, {hidden * 1e3:.3f} ms of them beside the compute")
        return replace(ledger, terms=(*ledger.terms, term))


class WeightStreamCost(BuiltOn):
    """A cost model whose every forward also reads `offloaded` bytes of weights over the host link
    (--cpu-offload-gb)."""

    def __init__(self, inner, offloaded: int, host_link_bandwidth: float) -> None:
        super().__init__(inner)
        self.offloaded, self.seconds = offloaded, offloaded / host_link_bandwidth
        self.name = f"{inner.name} + {offloaded / 2**30:.1f} GiB of weights over the host link"

    def step_time(self, shape) -> float:
        compute = self.inner.step_time(shape)
        return compute + self.seconds if shape.total_tokens else compute

    def ledger(self, shape) -> Ledger:
        ledger = self.inner.ledger(shape)
        if not shape.total_tokens:
            return ledger
        term = Term("weights from host memory", "memory", self.seconds, "roofline",
                    f"{self.offloaded / 2**30:.2f} GiB of --cpu-offload-gb's weights a forward, over the host link")
        return replace(ledger, terms=(*ledger.terms, term))
