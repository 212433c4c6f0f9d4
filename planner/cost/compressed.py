"""DeepSeek-V4's attention at its roofline (planner/catalog/deepseek_v4.py), per step, on one of `tp` GPUs.

As vLLM runs it (layers/deepseek_v4_attention.py, v1/attention/backends/mla/flashmla_sparse.py):

- Attention is one FlashMLA call per layer over a list of slots per query: the window's 128 rows on every
  layer, on a CSA layer the index_topk rows the indexer picked, on an HCA layer every compressed row (the
  list padded to a multiple of 128, at least 128). As for DeepSeek Sparse Attention (planner/cost/sparse.py),
  the kernel pays for every slot of the list, so a decoding query is priced at its list's length whatever
  its context below it; an HCA layer's rows add context / 128 slots. Per slot one 584-byte row is read
  (decode) and each padded head spends QK^T and PV over the 512-wide head (K is V): the heads are padded to
  64 (decode; 128 above 64) or to the prefill kernel's 64 (Hopper) or 128 (B200).
- A CSA layer's indexer scores every compressed row (one per 4 tokens of context) for each query in FP8
  (DeepGEMM's fp8_fp4_paged_mqa_logits) and a top-k kernel reads the fp32 logits back: planner/cost/sparse.py's
  per-key price.
- The compressors' projections and the indexer's head weights are unquantized and replicated: read once per
  step, 2 FLOPs per weight per token at the 16-bit peak. The hyper-connections read their fp32 projections
  once per step and, per token and layer, read and write the residual's hc_mult copies twice (around
  attention and around the experts): the traffic a four-wide residual adds.
- Each prompt token writes its window row on every layer and its share of the compressed rows.

The window slots of a query early in its sequence are masked, not skipped, so they are priced too.
"""
from __future__ import annotations

from dataclasses import dataclass

from planner.catalog import GpuSpec, ModelSpec
from planner.catalog.deepseek_v4 import CSA, HCA
from planner.cost.shape import StepShape
from planner.cost.sparse import DECODE_PADDED_HEADS, LOGIT_BYTES, PREFILL_PADDED_HEADS

HCA_SLOT_ALIGNMENT = 128      # an HCA layer's list of compressed rows is padded to a multiple of this
_FP32 = 4


@dataclass(frozen=True, slots=True)
class CompressedPrice:
    """Seconds of one step's DeepSeek-V4 attention, compressors and hyper-connections, all layers."""

    decode_slots_per_query: int     # window, CSA top-k and HCA padding slots of one decoding query, all layers
    prefill_slots_per_query: int
    hca_layers: int
    csa_layers: int
    decode_per_slot: float
    prefill_per_slot: float
    index_per_key: float            # one CSA layer's indexer score of one compressed row for a decoding query
    index_per_pair: float           # ... for a prompt token
    weights: float                  # compressor and hyper-connection weights read once per step
    per_token: float                # their FLOPs and the residual copies' traffic per token
    write_per_token: float          # a prompt token's window rows and share of compressed rows

    @classmethod
    def of(cls, model: ModelSpec, gpu: GpuSpec, tp: int, bandwidth: float, flops16: float,
           flops8: float) -> "CompressedPrice":
        """Prices at `bandwidth` B/s and `flops16` / `flops8` FLOP/s (achieved)."""
        ca, h, head = model.compressed_attention, model.hidden_size, model.head_size
        heads = model.num_heads // tp
        decode_heads = DECODE_PADDED_HEADS if heads <= DECODE_PADDED_HEADS else 2 * DECODE_PADDED_HEADS
        prefill_heads = max(heads, PREFILL_PADDED_HEADS.get(gpu.family, DECODE_PADDED_HEADS))
        per_head = 4 * head                                    # QK^T and PV over one 512-wide row
        row = model.kv_cache_bytes(tp)
        window = model.num_layers * ca.window + ca.csa_layers * ca.indexer.topk
        projections = sum(layers * sum(n * k for n, k in ca.compressor_shapes(spec.compress_ratio, h, head))
                          for layers, spec in model.attention_kinds)
        hc_weights = model.num_layers * 2 * ca.hc_mix * ca.hc_mult * h
        hc_traffic = model.num_layers * 2 * 2 * ca.hc_mult * h * 2          # read + write 4 copies, twice a layer
        index_flops = ca.indexer.flops_per_pair / (flops8 or flops16)
        return cls(
            decode_slots_per_query=window + ca.hca_layers * HCA_SLOT_ALIGNMENT,
            prefill_slots_per_query=window, hca_layers=ca.hca_layers, csa_layers=ca.csa_layers,
            decode_per_slot=max(row / bandwidth, decode_heads * per_head / flops16),
            prefill_per_slot=prefill_heads * per_head / flops16,
            index_per_key=max(ca.indexer.key_bytes / bandwidth, index_flops) + LOGIT_BYTES / bandwidth,
            index_per_pair=index_flops + LOGIT_BYTES / bandwidth,
            weights=(2 * projections + _FP32 * hc_weights) / bandwidth,
            per_token=2 * (projections + hc_weights) / flops16 + hc_traffic / bandwidth,
            write_per_token=(model.num_layers * row + model.kv_cache_bytes_per_token(tp)) / bandwidth)

    def decode(self, s: StepShape) -> float:
        """The step's decoding queries: their slots, the HCA rows past the padding, the indexer's scores."""
        if not s.decode_seqs:
            return 0.0
        slots = s.decode_seqs * self.decode_slots_per_query + self.hca_layers * s.decode_context // HCA
        return slots * self.decode_per_slot + self.csa_layers * (s.decode_context // CSA) * self.index_per_key

    def prefill(self, s: StepShape) -> float:
        """The step's prompt tokens: their slots and HCA rows, the indexer's scores, their cache writes."""
        if not s.prefill_tokens:
            return 0.0
        slots = s.prefill_tokens * self.prefill_slots_per_query + self.hca_layers * s.prefill_attn_pairs // HCA
        return (slots * self.prefill_per_slot + self.csa_layers * (s.prefill_attn_pairs // CSA) * self.index_per_pair
                + s.prefill_tokens * self.write_per_token)

    def tokens(self, tokens: int) -> float:
        """The compressors' and hyper-connections' weights and work for the step's `tokens` tokens."""
        return max(self.weights, tokens * self.per_token) if tokens else 0.0
