"""LoRA adapters as vLLM serves them (--enable-lora): their slots' memory and their kernels' time.

vLLM wraps every LoRA-able linear layer of a dense transformer (vllm/lora/layers): the merged q/k/v
projection (three slices), the attention output, the merged gate/up projection (two slices; OPT's and
GPT-2's single up projection, one) and the down projection. Each wrapper holds `max_loras` slots of
`max_lora_rank`, allocated when the model is built and so counted before the KV cache (LoRA A as
[slot, rank, inputs] per slice, B as [slot, outputs, rank], in the model's dtype). Tensor parallelism
splits a column-parallel layer's B and a row-parallel layer's A (and the inputs they read); the LoRA
product of a row-parallel layer's shard is summed by the layer's own all-reduce, so no collective is added
(the product is linear in the shard: vLLM's default, not --fully-sharded-loras).

A step in which some requests run an adapter runs, beside each wrapped layer, the punica "shrink"
(x @ A^T for each slice, into a float32 buffer of rank columns) and "expand" (that buffer @ B^T, added into
the layer's output) kernels (vllm/lora/ops/triton_ops: lora_shrink, lora_expand), each reading the A or B of
every adapter in the step. Each is priced as a roofline kernel: the larger of its bytes over the memory
bandwidth and its FLOPs over the 16-bit peak, plus a fixed time per kernel (the measured model's fitted
elementwise floor, aiconfigurator's mem_empirical_constant_latency). No vLLM LoRA run was measured for
this project: the terms are `roofline`, not fitted. A step that needs an adapter not in the GPU's slots
first copies it into one (vLLM keeps its adapters in a CPU cache, pinned, and its max_loras slots as an LRU):
a slot's bytes over the GPU's host link (`load_seconds`; the scheduler tracks the slots,
ChunkedScheduler.activate_loras). Not priced: reading an adapter from disk the first time and the per-step
LoRA metadata on the host.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from planner.catalog import GpuSpec, ModelSpec
from planner.cost.ledger import Ledger, Term
from planner.cost.wrappers import BuiltOn

SHRINK_BYTES = 4     # the shrink kernel's output buffer is float32 (vllm/lora/punica_wrapper)


@dataclass(frozen=True)
class LoraLayer:
    """One wrapped linear layer on one GPU: its slices (each with its own A), the inputs each A reads, and
    the outputs B writes (all slices together)."""

    name: str
    slices: int
    inputs: int
    outputs: int

    def slot_elements(self, rank: int) -> int:
        """One adapter slot's A and B elements at `rank`."""
        return rank * (self.slices * self.inputs + self.outputs)


def lora_layers(model: ModelSpec, tp: int) -> tuple[LoraLayer, ...]:
    """The wrapped layers of one transformer layer on one of `tp` GPUs (column-parallel: B split;
    row-parallel: A and its inputs split)."""
    (q, h), (k, _), (v, _), (_, o_in) = model.attention_shapes[:4]
    width = model.intermediate_size
    up_slices = 2 if model.gated_mlp else 1
    return (LoraLayer("qkv", 3, h, (q + k + v) // tp), LoraLayer("o", 1, o_in // tp, h),
            LoraLayer("gate_up" if up_slices == 2 else "up", up_slices, h, up_slices * width // tp),
            LoraLayer("down", 1, width // tp, h))


def lora_refusal(model: ModelSpec) -> str | None:
    """Why LoRA is not modelled for `model` (the layers above are a dense transformer's), or None."""
    special = (model.is_moe or model.is_mla or model.linear_attention is not None
               or model.compressed_attention is not None or model.attention_output_gate)
    if special:
        return (f"LoRA is modelled for dense transformers (q/k/v/o and MLP projections); {model.name}'s "
                f"architecture is not")
    return None


def lora_slot_bytes(model: ModelSpec, tp: int, rank: int, dtype_bytes: int) -> int:
    """One adapter slot's bytes on one GPU, every layer."""
    return model.num_layers * sum(layer.slot_elements(rank) for layer in lora_layers(model, tp)) * dtype_bytes


@dataclass(frozen=True)
class LoraPricer:
    """The seconds a step's LoRA kernels add, by its tokens and the adapters it runs (0: none, no kernel)."""

    model: ModelSpec
    gpu: GpuSpec
    tp: int
    rank: int
    floor_s: float
    dtype_bytes: int = 2

    def load_seconds(self, loads: int) -> float:
        """Copying `loads` adapters into GPU slots from the host (vLLM's CPU cache of adapters, pinned): a slot's
        bytes at the max rank (an adapter's own rank may be lower) over the GPU's host link."""
        if not loads:
            return 0.0
        slot = lora_slot_bytes(self.model, self.tp, self.rank, self.dtype_bytes)
        return loads * slot / self.gpu.host_link_bandwidth

    def seconds(self, tokens: int, adapters: int) -> float:
        """The shrink and expand kernels of a step of `tokens` tokens running `adapters` adapters."""
        if not adapters or not tokens:
            return 0.0
        bw, peak, r, b = self.gpu.memory_bandwidth, self.gpu.fp16_flops, self.rank, self.dtype_bytes
        total = 0.0
        for layer in lora_layers(self.model, self.tp):
            buffer = layer.slices * tokens * r * SHRINK_BYTES
            shrink_bytes = layer.slices * (tokens * layer.inputs * b + adapters * r * layer.inputs * b) + buffer
            shrink_flops = 2 * tokens * r * layer.slices * layer.inputs
            expand_bytes = buffer + adapters * layer.outputs * r * b + 2 * tokens * layer.outputs * b
            expand_flops = 2 * tokens * r * layer.outputs
            total += (max(shrink_bytes / bw, shrink_flops / peak) + max(expand_bytes / bw, expand_flops / peak)
                      + 2 * self.floor_s)
        return self.model.num_layers * total


def with_lora_term(ledger: Ledger, pricer: LoraPricer, tokens: int, adapters: int) -> Ledger:
    """`ledger` with the step's LoRA kernels as one more term (planner explain)."""
    term = Term("LoRA shrink + expand", "gemm", pricer.seconds(tokens, adapters), "roofline",
                f"{adapters} adapter{'s' if adapters != 1 else ''} of rank {pricer.rank} beside q/k/v, o, the MLP's "
                f"up and down projections: bytes and FLOPs at the GPU's peaks + {pricer.floor_s * 1e6:.1f} us a "
                f"kernel", count=2 * len(lora_layers(pricer.model, pricer.tp)) * pricer.model.num_layers)
    return replace(ledger, terms=(*ledger.terms, term))


class LoraCost(BuiltOn):
    """A cost model with the LoRA kernels of each step added (StepShape.lora_adapters, the adapters it runs)."""

    def __init__(self, inner, pricer: LoraPricer) -> None:
        super().__init__(inner)
        self.pricer = pricer
        self.name = f"{inner.name} + LoRA roofline (rank {pricer.rank})"

    def step_time(self, shape) -> float:
        return (self.inner.step_time(shape) + self.pricer.seconds(shape.total_tokens, shape.lora_adapters)
                + self.pricer.load_seconds(shape.lora_loads))

    def ledger(self, shape) -> Ledger:
        return with_lora_term(self.inner.ledger(shape), self.pricer, shape.total_tokens, shape.lora_adapters)
