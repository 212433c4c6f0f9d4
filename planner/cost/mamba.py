"""The Mamba-2 mixers' own kernels (Nemotron-H): their causal convolution and selective-scan update.

Their projections are GEMMs, priced with the other linear layers. What is left per layer
(planner/catalog/mamba.py):

  decode    each sequence's convolution window and recurrent states are read and written once a step
            (vLLM's causal_conv1d_update and selective_state_update): memory bound, 2 x the state's bytes
            per sequence over the bandwidth
  prefill   vLLM's chunked scan (mamba_chunk_scan_combined, chunks of chunk_size 128 tokens) spends per
            token and head about 2 C N (the chunk's C B^T), 2 C P (its intra-chunk product with x) and
            3 x 2 N P (the states each chunk passes on, their read-out by C and the update) FLOPs, P the
            head dim and N the state size; or reads the token's x, B, C, dt and z and writes its output
            and passes the states once a chunk, whichever binds

NVIDIA's tables time no Mamba-2 kernel under vLLM (their mamba2 table is TensorRT-LLM's), so every cost
model prices these by the formulas above at the roofline's efficiencies and says so.
"""
from __future__ import annotations

from planner.catalog import GpuSpec, ModelSpec
from planner.catalog.mamba import Mamba2
from planner.cost.gdn import GdnPrice

CHUNK = 128      # tokens per chunk of the chunked scan (Nemotron-H's chunk_size)
ACT_BYTES = 2


class Mamba2Price:
    """Seconds all Mamba-2 mixers of `model` spend on a step's decodes and prompt chunks, on one of `tp`
    GPUs, by the roofline (the interface of planner/cost/gdn.py's GdnPrice)."""

    source = "roofline"
    extrapolated = False
    what, module = "conv + selective scan", "planner/cost/mamba.py"

    def __init__(self, model: ModelSpec, gpu: GpuSpec, tp: int, dtype_bytes: int, compute_efficiency: float,
                 memory_efficiency: float) -> None:
        mixer = model.linear_attention
        self.layers = mixer.layers
        heads, groups = mixer.heads_per_gpu(tp), mixer.groups_per_gpu(tp)
        bw = gpu.memory_bandwidth * memory_efficiency
        state = mixer.state_bytes_per_gpu(tp, dtype_bytes)
        self._decode_per_seq = 2 * state / bw
        p, n = mixer.head_dim, mixer.state_size
        flops = heads * (2 * CHUNK * n + 2 * CHUNK * p + 6 * n * p)
        traffic = (3 * heads * p + 2 * groups * n + heads) * ACT_BYTES + 2 * state / CHUNK
        self._prefill_per_token = max(flops / (gpu.peak_flops(dtype_bytes) * compute_efficiency), traffic / bw)

    def decode(self, seqs: int) -> float:
        """All Mamba-2 layers' time on `seqs` decoding sequences."""
        return self.layers * seqs * self._decode_per_seq

    def prefill(self, seqs: int, tokens: int) -> float:
        """All Mamba-2 layers' time on the prompt chunks of `seqs` sequences holding `tokens` tokens."""
        return self.layers * tokens * self._prefill_per_token

    def describe(self) -> str:
        return (f"roofline: {self._decode_per_seq * 1e6:.2f} us per decoding sequence, "
                f"{self._prefill_per_token * 1e9:.1f} ns per prompt token, per layer")


def recurrent_price(model: ModelSpec, gpu: GpuSpec, tp: int, dtype_bytes: int, system: str | None,
                    compute_efficiency: float, memory_efficiency: float) -> GdnPrice | Mamba2Price | None:
    """The pricing of `model`'s recurrent layers (Gated DeltaNet: NVIDIA's tables where `system` has them;
    Mamba-2: the roofline); None without them."""
    if model.linear_attention is None:
        return None
    if isinstance(model.linear_attention, Mamba2):
        return Mamba2Price(model, gpu, tp, dtype_bytes, compute_efficiency, memory_efficiency)
    return GdnPrice(model, gpu, tp, dtype_bytes, system, compute_efficiency, memory_efficiency)
