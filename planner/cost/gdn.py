"""The Gated DeltaNet layers' own kernels (Qwen3-Next, Qwen3.5): their convolution and recurrent update.

Their projections are GEMMs, priced with the other linear layers. What is left per layer is the causal
convolution over q, k and v and the delta rule on each value head's key_head_dim x value_head_dim state
(planner/catalog/linear_attention.py):

  decode    each sequence's state is read and written once a step (its convolution window too): memory
            bound, 2 x the state's bytes per sequence over the bandwidth
  prefill   vLLM's chunked delta rule (FLA's algorithm, chunks of 64 tokens) spends per token and value
            head about 6 C dk + 4 C dv + 6 dk dv FLOPs (the chunk's K K^T and Q K^T, its WY transform's
            products, and the state's read by Q and W, its update and the intra-chunk P V), or reads the
            token's q, k, v, z and writes its output, and passes the state once a chunk, whichever binds

Where NVIDIA timed the kernels on the GPU (`gdn` table: H100, H200, B200, L40S, RTX PRO 6000), the
measured model reads them instead (planner/cost/measured_gdn.py); the roofline model and a GPU without
the table use the formulas above at the roofline's efficiencies. The formulas are optimistic for
prefill: on H200 the chunked kernel reaches about a fifth of the compute they assume (1.57 ms for
32,768 tokens of Qwen3.5-35B-A3B's 32 value heads, against 0.3 ms).
"""
from __future__ import annotations

from planner.catalog import GpuSpec, ModelSpec
from planner.cost.measured_gdn import GdnKernels

CHUNK = 64       # tokens per chunk of the chunked delta rule (FLA's chunk_gated_delta_rule, FlashInfer's)
ACT_BYTES = 2


class GdnPrice:
    """Seconds all Gated DeltaNet layers of `model` spend on a step's decodes and prompt chunks, on one of
    `tp` GPUs: NVIDIA's timed kernels where `system` has them, else the roofline."""

    what, module = "conv + delta rule", "planner/cost/gdn.py"

    def __init__(self, model: ModelSpec, gpu: GpuSpec, tp: int, dtype_bytes: int, system: str | None,
                 compute_efficiency: float, memory_efficiency: float) -> None:
        linear = model.linear_attention
        self.layers = linear.layers
        key_heads, value_heads = linear.heads_per_gpu(tp)
        self.kernels = (GdnKernels.load(system, key_heads, value_heads, linear.key_head_dim, linear.value_head_dim)
                        if system is not None else None)
        self.source = self.kernels.how if self.kernels is not None else "roofline"
        if self.source == "measured":
            self.source = "table"
        bw = gpu.memory_bandwidth * memory_efficiency
        state = linear.state_bytes_per_gpu(tp, dtype_bytes)
        self._decode_per_seq = 2 * state / bw
        dk, dv = linear.key_head_dim, linear.value_head_dim
        flops = value_heads * (6 * CHUNK * dk + 4 * CHUNK * dv + 6 * dk * dv)
        traffic = (2 * key_heads * dk + 3 * value_heads * dv) * ACT_BYTES + 2 * state / CHUNK
        self._prefill_per_token = max(flops / (gpu.peak_flops(dtype_bytes) * compute_efficiency), traffic / bw)
        self.extrapolated = False          # a timed kernel read outside its grid (the caller flags it)
        self._decode_cache: dict[int, float] = {}
        self._prefill_cache: dict[tuple[int, int], float] = {}

    def decode(self, seqs: int) -> float:
        """All GDN layers' time on `seqs` decoding sequences; cached."""
        value = self._decode_cache.get(seqs)
        if value is None:
            if self.kernels is not None:
                per_layer, outside = self.kernels.decode(seqs)
                self.extrapolated |= outside
            else:
                per_layer = seqs * self._decode_per_seq
            value = self._decode_cache[seqs] = self.layers * per_layer
        return value

    def prefill(self, seqs: int, tokens: int) -> float:
        """All GDN layers' time on the prompt chunks of `seqs` sequences holding `tokens` tokens in all; cached
        (a chunked prefill's steps repeat their chunk sizes)."""
        if self.kernels is None:
            return self.layers * tokens * self._prefill_per_token
        value = self._prefill_cache.get((seqs, tokens))
        if value is None:
            per_layer, outside = self.kernels.prefill(seqs, tokens)
            self.extrapolated |= outside
            value = self._prefill_cache[seqs, tokens] = self.layers * per_layer
        return value

    def describe(self) -> str:
        if self.kernels is not None:
            scaled = f", priced from the timed shape {self.kernels.timed}" if self.source == "scaled" else ""
            return f"{self.kernels.system} gdn{scaled}"
        return (f"roofline: {self._decode_per_seq * 1e6:.2f} us per decoding sequence, "
                f"{self._prefill_per_token * 1e9:.1f} ns per prompt token, per layer")
