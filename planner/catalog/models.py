"""Model catalog: the true shapes of the models the planner knows, and what follows from them.

Parameter counts, weight bytes, KV bytes per token and FLOPs per token are
computed from the architecture (not copied from model cards), so a user's own
config.json gets the same treatment as a catalog entry. The catalog data lives
in planner/data/models.json.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from planner.documents import read_json
from planner.catalog import mla
from planner.catalog.base import Catalog
from planner.catalog.deepseek_v4 import (COMPRESSED_BLOCK, CSA, DEEPSEEK_V4_TYPES, HCA, SLIDING, CompressedAttention,
                                         deepseek_v4_fields, deepseek_v4_hf_config)
from planner.catalog.gemma4 import GEMMA4_CONFIG_TYPES, GEMMA4_TYPES, GlobalAttention, gemma4_fields, gemma4_hf_config
from planner.catalog.gemma_config import GEMMA_CONFIG_TYPES, GEMMA_TYPES, gemma_fields, gemma_hf_config
from planner.catalog.kept_layers import format_shares, stored_as
from planner.catalog.linear_attention import (LINEAR_ATTENTION_MOE_TYPES, LINEAR_ATTENTION_TYPES, LinearAttention,
                                              linear_attention_fields, linear_attention_hf_config)
from planner.catalog.llama4_config import LLAMA4_CONFIG_TYPES, llama4_fields
from planner.catalog.mamba import Mamba2
from planner.catalog.mimo_config import MIMO_TYPES, mimo_fields, mimo_hf_config
from planner.catalog.moe_config import MOE_TYPES, moe_fields, moe_hf_config
from planner.catalog.multimodal import MULTIMODAL_TYPES, multimodal_parts
from planner.catalog.nemotron_h import NEMOTRON_H_TYPES, nemotron_h_fields, nemotron_h_hf_config
from planner.catalog.nemotron_nas import DROPPED, NEMOTRON_NAS_TYPES, nemotron_nas_fields, nemotron_nas_hf_config
from planner.catalog.quantization import WeightFormat
from planner.catalog.rope import partial_rotary_dims
from planner.catalog.sparse_attention import DSA_TYPES, SparseIndexer, latent_cache_bytes
from planner.errors import PlannerError

# model_type -> how its layers are built. OPT and GPT-2 are the same decoder
# block (biased linears, LayerNorm with weight+bias, learned positions; OPT
# keeps 2 extra position rows, an offset inherited from fairseq). LLaMA and
# Mistral use bias-free linears, RMSNorm (weight only), RoPE and a gated MLP; Phi-3 and Phi-4 (phi3) are that
# block with its q/k/v and gate/up matrices fused in the checkpoint, as vLLM fuses Llama's.
_GPT_LIKE = {"opt": 2, "gpt2": 0}          # model_type -> learned position-table offset
_LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3", "phi3")
# Mixtures of experts (MOE_TYPES): Llama's block with the MLP replaced by a router and num_experts gated
# MLPs, each token sent to its top num_experts_per_tok (planner/catalog/moe_config.py reads their configs).
# Gated DeltaNet hybrids (LINEAR_ATTENTION_TYPES): three of four layers keep a fixed recurrent state instead
# of attention (planner/catalog/linear_attention.py); Qwen3-Next's and Qwen3.5-MoE's MLPs are experts.
# Nemotron-H (NEMOTRON_H_TYPES): blocks of one Mamba-2 mixer, attention, MLP or MoE each
# (planner/catalog/nemotron_h.py), with or without experts. Llama-Nemotron Super (NEMOTRON_NAS_TYPES): Llama's layers
# with some attention dropped and MLPs of their own widths, counted as Nemotron-H's blocks
# (planner/catalog/nemotron_nas.py). Gemma 4 (GEMMA4_TYPES): Gemma 3's block with wider
# heads on its full-attention layers, and on the 26B-A4B experts beside every dense MLP (planner/catalog/gemma4.py).
# MiMo-V2-Flash (MIMO_TYPES): sliding and full layers with their own KV heads, value heads narrower than the
# keys, experts on every layer but the first (planner/catalog/mimo_config.py). DeepSeek-V4 (DEEPSEEK_V4_TYPES):
# one shared key/value head over a sliding window and compressed rows, four copies of the residual stream
# (planner/catalog/deepseek_v4.py); its layers' kinds are its attention_kinds.
_FLEXIBLE_EXPERTS = (*NEMOTRON_H_TYPES, *GEMMA4_TYPES)     # model_types with and without experts
_BLOCK_TYPES = (*NEMOTRON_H_TYPES, *NEMOTRON_NAS_TYPES)     # blocks of one thing each, behind one norm
KNOWN_TYPES = (*_GPT_LIKE, *_LLAMA_LIKE, *GEMMA_TYPES, *GEMMA4_TYPES, *MOE_TYPES, *LINEAR_ATTENTION_TYPES,
               *NEMOTRON_H_TYPES, *NEMOTRON_NAS_TYPES, *MIMO_TYPES, *DEEPSEEK_V4_TYPES)
_EXPERT_TYPES = (*MOE_TYPES, *LINEAR_ATTENTION_MOE_TYPES, *MIMO_TYPES, *DEEPSEEK_V4_TYPES)
_OWN_FULL_LAYERS = (*GEMMA4_TYPES, *MIMO_TYPES)     # model_types whose full-attention layers have their own shape
# The config fields `from_hf_config` computes other shapes from (head size = hidden / heads), per family.
_DIVISORS = {"gpt2": ("n_embd", "n_head"), "opt": ("hidden_size", "num_attention_heads"),
             **dict.fromkeys(_LLAMA_LIKE, ("hidden_size", "num_attention_heads")),
             "moe": ("hidden_size", "num_attention_heads", "num_hidden_layers"),
             **dict.fromkeys(LINEAR_ATTENTION_TYPES, ("hidden_size", "num_attention_heads", "num_hidden_layers")),
             **dict.fromkeys(_BLOCK_TYPES, ("hidden_size", "num_attention_heads"))}


# ModelSpec's integer fields: sizes every model has (> 0), and counts a dense model leaves at 0.
_SIZES = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_size", "intermediate_size", "vocab_size",
          "max_position_embeddings")
_MOE_COUNTS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "dense_layers", "sliding_layers",
               "shared_experts", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "v_head_dim", "ffn_layers",
               "moe_latent_size")


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer's shape. Sizes are counts, not bytes, unless named *_bytes."""

    name: str
    model_type: str                 # one of KNOWN_TYPES: "opt", "llama", ..., "qwen3_moe", "mixtral", "gpt_oss", ...
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    rope_theta: float | None = None
    norm_eps: float = 1e-5
    sliding_window: int | None = None
    hf_id: str | None = None
    published_params: int | None = None
    source: str = ""
    aliases: tuple[str, ...] = ()
    # Mixture of experts (0: a dense model). moe_intermediate_size is one expert's width; dense_layers
    # counts the layers that keep a dense MLP of intermediate_size (Qwen3-MoE's mlp_only_layers).
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    dense_layers: int = 0
    # gpt-oss: layers that attend only to the last sliding_window tokens (the others attend to all),
    # learned attention sinks (one logit per head) and biased q/k/v/o, router and experts.
    sliding_layers: int = 0
    attention_sinks: bool = False
    published_active_params: int | None = None
    checkpoint_quantization: str | None = None   # the released weights' format (mxfp4, fp8-block)
    # A multimodal checkpoint's vision encoder and projector (Gemma 3's SigLIP): loaded and held with the
    # weights (sharded like them), never run by a text request.
    vision_params: int = 0
    # Experts every token goes through beside its routed ones (DeepSeek's one shared expert), each
    # moe_intermediate_size wide: a dense gated MLP of shared_experts x that width on every MoE layer.
    shared_experts: int = 0
    # Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2; kv_lora_rank 0: none). head_size is the q/k
    # head (qk_nope + qk_rope dims) and v_head_dim the value head; K and V are projected up from one
    # kv_lora_rank latent per token, which the KV cache holds with the qk_rope_head_dim rotary key, shared
    # by every head (planner/catalog/mla.py). q_lora_rank 0: q comes straight from the hidden state.
    # Without MLA, a v_head_dim is the value heads' width where it differs from the keys' (MiMo-V2-Flash).
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # Attention switches a config sets where its architecture leaves them open (GLM-4.5: attention_bias, q/k
    # norms only on the 355B model, rotary on half of each head). partial_rotary_dims 0: the whole head rotates.
    attention_bias: bool = False
    use_qk_norm: bool = False
    partial_rotary_dims: int = 0
    # Qwen3-Next and Qwen3.5: q_proj twice as wide, half of it a sigmoid gate on the attention output; and
    # the Gated DeltaNet layers that replace attention in three of four layers (None: every layer attends).
    attention_output_gate: bool = False
    linear_attention: LinearAttention | Mamba2 | None = None
    # DeepSeek-V3.2 and GLM-5: the indexer that picks the keys latent attention reads (None: every key;
    # planner/catalog/sparse_attention.py)
    sparse_indexer: SparseIndexer | None = None
    # Nemotron-H: its MLP and MoE blocks, apart from the num_layers mixer blocks (attention and Mamba-2;
    # 0: every layer holds both), and the latent width its routed experts work in (0: the hidden size)
    ffn_layers: int = 0
    moe_latent_size: int = 0
    # Nemotron-H's blocks in order: M (Mamba-2), * (attention), - (MLP), E (MoE); a DeciLM's, two characters
    # a decoder layer ("." where it dropped one: planner/catalog/nemotron_nas.py)
    block_pattern: str = ""
    # a DeciLM's dense MLP blocks' widths in order, where they differ (intermediate_size is the widest);
    # (): every dense MLP is intermediate_size wide
    mlp_widths: tuple[int, ...] = ()
    # Gemma 4, MiMo-V2-Flash: the full-attention layers' head size and KV heads where they differ from the
    # sliding layers' (the fields above); None: every layer attends alike
    global_attention: GlobalAttention | None = None
    # DeepSeek-V4: its layers' kinds, window, grouped output, hyper-connections and indexer; None otherwise
    compressed_attention: CompressedAttention | None = None

    def __post_init__(self) -> None:
        if self.model_type not in KNOWN_TYPES:
            raise PlannerError(f"unsupported model_type {self.model_type!r}; known: {', '.join(KNOWN_TYPES)}")
        # a config.json missing a field gives None here, not a traceback
        for field in (*_SIZES, *_MOE_COUNTS, "vision_params"):
            value = getattr(self, field)
            if not _is_count(value) or (value == 0 and field in _SIZES):
                raise PlannerError(f"model {self.name!r}: {field} must be a positive integer, got {value!r}")
        for field in ("norm_eps", "rope_theta"):
            value = getattr(self, field)
            if (value is not None or field == "norm_eps") and not (
                    isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf):
                raise PlannerError(f"model {self.name!r}: {field} must be a positive number, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise PlannerError(f"model {self.name!r}: num_heads {self.num_heads} is not a multiple of "
                               f"num_kv_heads {self.num_kv_heads}")
        if self.is_moe and not (0 < self.num_experts_per_tok <= self.num_experts and self.moe_intermediate_size > 0):
            raise PlannerError(f"model {self.name!r}: a mixture of experts needs 0 < num_experts_per_tok "
                               f"({self.num_experts_per_tok}) <= num_experts ({self.num_experts}) and a "
                               f"positive moe_intermediate_size ({self.moe_intermediate_size})")
        if self.is_moe != (self.model_type in _EXPERT_TYPES) and self.model_type not in _FLEXIBLE_EXPERTS:
            raise PlannerError(f"model {self.name!r}: model_type {self.model_type} "
                               f"{'needs' if self.model_type in _EXPERT_TYPES else 'has no'} experts")
        if self.linear_attention is not None:      # (an MTP head of Qwen3.5 is one attention layer: none)
            if self.model_type not in (*LINEAR_ATTENTION_TYPES, *NEMOTRON_H_TYPES) or self.sliding_layers:
                raise PlannerError(f"model {self.name!r}: model_type {self.model_type} with sliding-window "
                                   f"layers has no linear attention" if self.sliding_layers else
                                   f"model {self.name!r}: model_type {self.model_type} has no linear attention")
            if self.linear_attention.layers >= self.num_layers:
                raise PlannerError(f"model {self.name!r}: {self.linear_attention.layers} linear-attention layers "
                                   f"leave none of {self.num_layers} to attend")
        if (self.sparse_indexer is not None) != (self.model_type in DSA_TYPES) or (
                self.sparse_indexer is not None and not self.q_lora_rank):
            raise PlannerError(f"model {self.name!r}: an indexer (sparse attention) belongs to a DSA model_type "
                               f"({', '.join(DSA_TYPES)}) with latent attention and a q_lora_rank")
        if self.sliding_window is not None and (not _is_count(self.sliding_window) or self.sliding_window == 0):
            raise PlannerError(f"model {self.name!r}: sliding_window must be a positive integer or null, "
                               f"got {self.sliding_window!r}")
        if self.block_pattern and sorted(self.block_pattern.replace(DROPPED, "")) != sorted(
                "M" * self.linear_attention_layers + "*" * self.attention_layers
                + "-" * self.dense_mlp_layers + "E" * self.moe_layers):
            raise PlannerError(f"model {self.name!r}: block_pattern {self.block_pattern!r} does not hold its "
                               f"{self.linear_attention_layers} Mamba-2, {self.attention_layers} attention, "
                               f"{self.dense_mlp_layers} MLP and {self.moe_layers} MoE blocks")
        if (self.ffn_layers or self.block_pattern) and self.model_type not in _BLOCK_TYPES or (
                self.moe_latent_size and self.model_type not in NEMOTRON_H_TYPES):
            raise PlannerError(f"model {self.name!r}: separate MLP blocks are Nemotron-H's and DeciLM's "
                               f"({', '.join(_BLOCK_TYPES)}), latent experts Nemotron-H's")
        if self.model_type in NEMOTRON_NAS_TYPES and (self.is_moe or {
                self.block_pattern[i:i + 2] for i in range(0, len(self.block_pattern), 2)} - {"*-", "*.", ".-", ".."}):
            raise PlannerError(f"model {self.name!r}: a DeciLM block_pattern spells each layer as its attention "
                               f"(* or .) and its MLP (- or .), and the model has no experts")
        if DROPPED in self.block_pattern and self.model_type not in NEMOTRON_NAS_TYPES:
            raise PlannerError(f"model {self.name!r}: only a DeciLM block_pattern marks dropped blocks ({DROPPED})")
        if self.mlp_widths and (self.model_type not in NEMOTRON_NAS_TYPES
                                or len(self.mlp_widths) != self.dense_mlp_layers
                                or not all(_is_count(w) and w for w in self.mlp_widths)
                                or max(self.mlp_widths) != self.intermediate_size):
            raise PlannerError(f"model {self.name!r}: mlp_widths must give each of its {self.dense_mlp_layers} "
                               f"dense MLPs a positive width, the widest intermediate_size, in a DeciLM model")
        if self.dense_layers > self.mlp_layers:
            raise PlannerError(f"model {self.name!r}: {self.dense_layers} dense layers of {self.mlp_layers}")
        if self.kv_lora_rank and not (0 < self.qk_rope_head_dim < self.head_size and self.v_head_dim > 0):
            raise PlannerError(f"model {self.name!r}: latent attention needs 0 < qk_rope_head_dim "
                               f"({self.qk_rope_head_dim}) < head_size ({self.head_size}) and a positive "
                               f"v_head_dim ({self.v_head_dim})")
        if not 0 <= self.partial_rotary_dims <= self.head_size or self.partial_rotary_dims % 2:
            raise PlannerError(f"model {self.name!r}: partial_rotary_dims must be an even count of at most "
                               f"head_size ({self.head_size}) dims, got {self.partial_rotary_dims!r}")
        if self.sliding_layers and not self.sliding_window or self.sliding_layers > self.num_layers:
            raise PlannerError(f"model {self.name!r}: {self.sliding_layers} sliding-window layers need a "
                               f"sliding_window and at most {self.num_layers} layers")
        ca = self.compressed_attention
        if (ca is not None) != (self.model_type in DEEPSEEK_V4_TYPES) or ca is not None and (
                ca.layers != self.num_layers or self.num_kv_heads != 1 or self.num_heads % ca.o_groups
                or not self.q_lora_rank or self.sliding_layers or self.is_mla):
            raise PlannerError(f"model {self.name!r}: compressed attention belongs to DeepSeek-V4 "
                               f"({', '.join(DEEPSEEK_V4_TYPES)}), with a kind for each of its layers, one KV head, "
                               f"output groups that divide its heads and a q_lora_rank")
        if self.global_attention is not None and (self.model_type not in _OWN_FULL_LAYERS
                                                  or not self.full_attention_layers
                                                  or self.num_heads % self.global_attention.kv_heads):
            raise PlannerError(f"model {self.name!r}: full-attention layers of their own shape need a model_type "
                               f"that has them ({', '.join(_OWN_FULL_LAYERS)}), some full-attention layers and KV "
                               f"heads that divide the {self.num_heads} attention heads")

    # ---- shapes -------------------------------------------------------------

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_size

    @property
    def kv_size(self) -> int:
        """Width of K for one token in one layer."""
        return self.num_kv_heads * self.head_size

    @property
    def value_head_size(self) -> int:
        """Width of each head's value and attention output: head_size, or v_head_dim where it differs (MLA,
        MiMo-V2-Flash)."""
        return self.v_head_dim or self.head_size

    @property
    def v_size(self) -> int:
        """Width of V for one token in one layer."""
        return self.num_kv_heads * self.value_head_size

    @property
    def full_layer_spec(self) -> "ModelSpec":
        """The model with its full-attention layers' attention shape (global_attention: Gemma 4, MiMo), whose
        per-layer attention properties (attention_shapes, kv_cache_bytes, q_size, ...) describe those layers;
        the model itself when every layer attends alike. Its other properties mean nothing."""
        return self if self.global_attention is None else _full_layer_twin(self)

    @property
    def attention_kinds(self) -> tuple[tuple[int, "ModelSpec"], ...]:
        """(layers, the spec whose per-layer attention properties describe them): every attention layer, or
        Gemma 4's full-attention layers and its sliding ones apart, or DeepSeek-V4's window-only, CSA and HCA
        layers (each twin's `compress_ratio`)."""
        ca = self.compressed_attention
        if ca is not None and ca.ratio is None:
            return tuple((layers, _compressed_kind(self, ratio)) for ratio, layers in ca.kinds)
        if self.global_attention is None:
            return ((self.attention_layers, self),)
        return ((self.full_attention_layers, self.full_layer_spec), (self.sliding_layers, self))

    @property
    def compress_ratio(self) -> int:
        """The kind of DeepSeek-V4 layer this spec describes (one of attention_kinds' twins; SLIDING for the
        model itself); SLIDING for every other model."""
        ca = self.compressed_attention
        return ca.ratio or SLIDING if ca is not None else SLIDING

    def attention_kind_label(self, spec: "ModelSpec") -> str:
        """What a ledger term adds to name one kind of attention layer: nothing when every layer attends alike."""
        if len(self.attention_kinds) == 1:
            return ""
        if self.compressed_attention is not None:
            return {SLIDING: " (window-only layers)", CSA: " (CSA layers)", HCA: " (HCA layers)"}[spec.compress_ratio]
        return " (full layers)" if spec is not self else " (sliding layers)"

    def kv_cache_bytes_per_token(self, tp: int = 1, kv_dtype_bytes: int = 2) -> int:
        """Bytes one of `tp` GPUs caches per token over every attention layer (each kind at its own shape);
        DeepSeek-V4's compressed rows and indexer keys (its window and compressor states are a sequence's
        whatever its length: `kv_bytes_per_context`), in whole pages per block, rounded up."""
        ca = self.compressed_attention
        if ca is not None:
            return -(-ca.block_bytes(self.head_size, self.rotary_dims) // COMPRESSED_BLOCK)
        return (sum(layers * spec.kv_cache_bytes(tp, kv_dtype_bytes) for layers, spec in self.attention_kinds)
                - self.uncached_index_key_bytes)

    @property
    def uncached_index_key_bytes(self) -> int:
        """Per token, the indexer keys `kv_cache_bytes` counts on layers that run no indexer of their own and
        so cache none (GLM-5.2's 57 sharing layers: vLLM gives only an indexer a key cache); 0 otherwise."""
        index = self.sparse_indexer
        return (self.attention_layers - self.indexer_layers) * index.key_bytes if index is not None else 0

    @property
    def copied_value_params(self) -> int:
        """Gemma 4's K=V full layers: the V projection vLLM fills with the key's weights, held and multiplied
        but not in the checkpoint (planner/catalog/gemma4.py)."""
        g = self.global_attention
        return self.full_attention_layers * g.kv_heads * g.head_size * self.hidden_size if g and g.k_eq_v else 0

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention: the cache holds a latent per token, not per-head K and V."""
        return self.kv_lora_rank > 0

    def kv_cache_width(self, tp: int = 1) -> int:
        """Values one of `tp` GPUs caches per token and layer: its KV heads' K and V (side by side where V is
        narrower: vLLM's FlashAttentionDiffKVBackend), or MLA's latent and rotary key, which every rank holds
        whole."""
        if self.is_mla:
            return mla.cache_width(self)
        if self.compressed_attention is not None:      # one head that is both key and value, on every rank
            return self.head_size
        return self.kv_heads_per_gpu(tp) * (self.head_size + self.value_head_size)

    def kv_cache_bytes(self, tp: int = 1, kv_dtype_bytes: int = 2) -> int:
        """Bytes one of `tp` GPUs caches per token and attention layer with `kv_dtype_bytes`-byte values:
        kv_cache_width values, or a DSA model's latent in vLLM's format and its indexer key (a layer that runs
        its own indexer: planner/catalog/sparse_attention.py; the model's totals leave out the others' keys,
        `uncached_index_key_bytes`), or a DeepSeek-V4 window row (FP8 whatever the dtype asked)."""
        if self.compressed_attention is not None:     # one fp8_ds_mla row, whatever kv_dtype_bytes
            return self.compressed_attention.row_bytes(self.head_size, self.rotary_dims)
        if self.sparse_indexer is None:
            return self.kv_cache_width(tp) * kv_dtype_bytes
        index = self.sparse_indexer
        latent = latent_cache_bytes(self.kv_lora_rank, self.qk_rope_head_dim, kv_dtype_bytes, index.fp8_ds_mla)
        return latent + index.key_bytes

    @property
    def attention_flops_per_key(self) -> int:
        """FLOPs one decoding query spends per key it attends to in one layer, all heads: QK^T and PV
        (MLA: its absorbed decode path, planner/catalog/mla.py)."""
        if self.is_mla:
            return self.num_heads * mla.decode_flops_per_key(self)
        return 2 * self.q_size + 2 * self.num_heads * self.value_head_size

    @property
    def prefill_flops_per_pair(self) -> int:
        """FLOPs one prompt token spends per (query, key) pair in one layer, all heads (MLA: K and V
        expanded per head; otherwise the decode figure)."""
        if self.is_mla:
            return self.num_heads * mla.prefill_flops_per_pair(self)
        return self.attention_flops_per_key

    @property
    def rotary_dims(self) -> int:
        """Dims of each q/k head that rotary embedding rotates (MLA: its one rotary key's; 0: none, learned
        positions)."""
        if self.is_gpt_like or self.model_type in NEMOTRON_H_TYPES:     # Nemotron-H attends without rotary
            return 0
        if self.is_mla:
            return self.qk_rope_head_dim
        return self.partial_rotary_dims or self.head_size

    @property
    def is_gpt_like(self) -> bool:
        return self.model_type in _GPT_LIKE

    # ---- parameter counts ---------------------------------------------------

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def mlp_layers(self) -> int:
        """Layers (Nemotron-H: blocks) with an MLP or experts."""
        return self.ffn_layers or self.num_layers

    @property
    def moe_layers(self) -> int:
        """Layers whose MLP is the sparse expert block."""
        return self.mlp_layers - self.dense_layers if self.is_moe else 0

    @property
    def dense_mlp_layers(self) -> int:
        """Layers whose MLP is dense: all of a dense model's, a MoE's dense_layers."""
        return self.dense_layers if self.is_moe else self.mlp_layers

    @property
    def gated_mlp(self) -> bool:
        """Whether the MLPs multiply an activated gate into an up projection (SwiGLU, GeGLU): not OPT's and
        GPT-2's, nor Nemotron-H's squared ReLU."""
        return not (self.is_gpt_like or self.model_type in NEMOTRON_H_TYPES)

    def _mlp_shapes(self, hidden: int, width: int) -> tuple[tuple[int, int], ...]:
        """(outputs, inputs) of an MLP `width` wide on `hidden`: gate, up, down; or up, down without a gate."""
        up, down = (width, hidden), (hidden, width)
        return (up, up, down) if self.gated_mlp else (up, down)

    @property
    def attention_shapes(self) -> tuple[tuple[int, int], ...]:
        """(outputs, inputs) of q, k, v and o (MLA: its projections, planner/catalog/mla.py)."""
        if self.is_mla:
            return mla.attention_shapes(self)
        if self.compressed_attention is not None:
            return self._compressed_shapes()
        h, q = self.hidden_size, self.q_size
        return ((2 * q if self.attention_output_gate else q, h), (self.kv_size, h), (self.v_size, h),
                (h, self.num_heads * self.value_head_size))

    def _compressed_shapes(self) -> tuple[tuple[int, int], ...]:
        """DeepSeek-V4's quantized attention weights (planner/catalog/deepseek_v4.py): wq_b, wo_a (the groups'
        blocks side by side), wo_b; then the ones every rank holds whole (replicated_linear_shapes)."""
        ca, h = self.compressed_attention, self.hidden_size
        grouped = ca.o_groups * ca.o_lora_rank
        return ((self.q_size, self.q_lora_rank), (grouped, self.q_size // ca.o_groups), (h, grouped),
                *self.replicated_linear_shapes)

    @property
    def replicated_linear_shapes(self) -> tuple[tuple[int, int], ...]:
        """Attention weights every TP rank holds whole, the last of attention_shapes: MLA's down-projections;
        DeepSeek-V4's wq_a and wkv, and on a CSA layer the indexer's wq_b; none otherwise."""
        if self.is_mla:
            return mla.replicated_shapes(self)
        if self.compressed_attention is None:
            return ()
        h, index = self.hidden_size, self.compressed_attention.indexer
        own = ((self.q_lora_rank, h), (self.head_size, h))
        return own + (((index.heads * index.head_dim, self.q_lora_rank),) if self.compress_ratio == CSA else ())

    @property
    def shared_expert_width(self) -> int:
        """The width of the dense MLP every token of a MoE layer goes through beside its routed experts: its
        shared experts', or Gemma 4's MLP of intermediate_size; 0 without."""
        if self.model_type in GEMMA4_TYPES and self.is_moe:
            return self.intermediate_size
        return self.shared_experts * self.moe_intermediate_size

    @property
    def shared_expert_shapes(self) -> tuple[tuple[int, int], ...]:
        """The shared experts of one MoE layer as one MLP (gate, up, down; Nemotron-H's up, down); () when it
        has none."""
        if not self.shared_expert_width:
            return ()
        return self._mlp_shapes(self.hidden_size, self.shared_expert_width)

    @property
    def mlp_shapes(self) -> tuple[tuple[int, int], ...]:
        """The dense MLP of intermediate_size: gate, up, down (fc1, fc2 for OPT/GPT-2; up, down for Nemotron-H)."""
        return self._mlp_shapes(self.hidden_size, self.intermediate_size)

    @property
    def dense_mlp_kinds(self) -> tuple[tuple[int, int, tuple[tuple[int, int], ...]], ...]:
        """(layers, width, shapes) of the dense MLPs by width, widest first: one kind of intermediate_size, or
        a DeciLM's (mlp_widths); () without dense MLPs."""
        if not self.mlp_widths:
            return ((self.dense_mlp_layers, self.intermediate_size, self.mlp_shapes),) if self.dense_mlp_layers else ()
        widths = sorted(set(self.mlp_widths), reverse=True)
        return tuple((self.mlp_widths.count(w), w, self._mlp_shapes(self.hidden_size, w)) for w in widths)

    @property
    def qk_norm(self) -> str | None:
        """How the model RMS-normalizes q and k before rotary: "per head" (Qwen3: one head_size weight each),
        "across heads" (MiniMax-M2: over all heads at once, so under TP vLLM all-reduces each token's
        variances), or None."""
        if self.use_qk_norm:
            return "per head"
        if self.model_type in ("qwen3", "qwen3_moe", "gemma3_text", *GEMMA4_TYPES, *LINEAR_ATTENTION_TYPES):
            return "per head"
        return "across heads" if self.model_type == "minimax_m2" else None

    @property
    def expert_shapes(self) -> tuple[tuple[int, int], ...]:
        """One expert's gate, up and down weights (moe_intermediate_size wide; Nemotron-H's up and down, in
        its latent space when it has one)."""
        return self._mlp_shapes(self.expert_hidden, self.moe_intermediate_size)

    @property
    def expert_hidden(self) -> int:
        """The width the routed experts take in and give back: the hidden size, or Nemotron-H's latent."""
        return self.moe_latent_size or self.hidden_size

    @property
    def expert_weights(self) -> int:
        """One expert's weights, biases apart."""
        return sum(n * k for n, k in self.expert_shapes)

    @property
    def indexer_shapes(self) -> tuple[tuple[int, int], ...]:
        """A DSA indexer's projections (wq_b, wk, weights_proj: planner/catalog/sparse_attention.py), whole on
        every TP rank, on each of `indexer_layers`; () without one."""
        index = self.sparse_indexer
        return index.shapes(self.hidden_size, self.q_lora_rank) if index is not None else ()

    @property
    def indexer_layers(self) -> int:
        """The layers that run a DSA indexer of their own (GLM-5.2: 21 of 78; the others reuse its picks)."""
        index = self.sparse_indexer
        return len(index.indexed_layers(self.num_layers)) if index is not None else 0

    @property
    def indexer_norm_params(self) -> int:
        """The LayerNorms over the indexers' keys, all layers (replicated, like the latent norms)."""
        index = self.sparse_indexer
        return self.indexer_layers * index.norm_params if index is not None else 0

    @property
    def latent_shapes(self) -> tuple[tuple[int, int], ...]:
        """Nemotron-H's projections into and out of the experts' latent space, on every MoE layer; () without."""
        h, latent = self.hidden_size, self.moe_latent_size
        return ((latent, h), (h, latent)) if latent else ()

    @property
    def expert_params(self) -> int:
        """One expert's weights, its biases included (gpt-oss biases its gate/up and down)."""
        bias = 2 * self.moe_intermediate_size + self.hidden_size if self.model_type == "gpt_oss" else 0
        return self.expert_weights + bias

    @property
    def router_params(self) -> int:
        """One MoE layer's router (a 16-bit linear layer every GPU holds whole; gpt-oss's has a bias, Gemma 4's
        a scale per input dimension and one per expert)."""
        if self.model_type in GEMMA4_TYPES:
            return self.router_weights + self.hidden_size + self.num_experts
        return self.router_weights + (self.num_experts if self.model_type == "gpt_oss" else 0)

    @property
    def router_weights(self) -> int:
        """One MoE layer's router weights, with Qwen3-Next's and Qwen3.5's gate on the shared expert (a
        hidden x 1 linear layer, also whole on every GPU)."""
        shared_gate = self.hidden_size if self.model_type in LINEAR_ATTENTION_MOE_TYPES else 0
        return self.num_experts * self.hidden_size + shared_gate

    @property
    def linear_shapes(self) -> tuple[tuple[int, int], ...]:
        """(outputs, inputs) of each dense linear weight of one block: q, k, v, o, then gate, up, down (fc1,
        fc2); a MoE layer's experts and router are apart (expert_shapes, router_params)."""
        return self.attention_shapes + (() if self.is_moe else self.mlp_shapes)

    @property
    def dense_linear_params(self) -> int:
        """Attention of every layer plus the dense MLPs (all layers of a dense model, dense_layers of a MoE)
        and the MoE layers' shared experts (and Nemotron-H's latent projections)."""
        return (sum(layers * sum(n * k for n, k in spec.attention_shapes) for layers, spec in self.attention_kinds)
                + self.linear_attention_layers * sum(n * k for n, k in self.linear_attention_shapes)
                + sum(layers * sum(n * k for n, k in shapes) for layers, _, shapes in self.dense_mlp_kinds)
                + self.moe_layers * sum(n * k for n, k in self.shared_expert_shapes + self.latent_shapes)
                + self.indexer_layers * sum(n * k for n, k in self.indexer_shapes))

    @property
    def attention_layers(self) -> int:
        """Layers that attend over a KV cache (all but the Gated DeltaNet layers)."""
        return self.num_layers - self.linear_attention_layers

    @property
    def linear_attention_layers(self) -> int:
        """Gated DeltaNet layers, which hold a fixed state per sequence instead of a KV cache."""
        return self.linear_attention.layers if self.linear_attention is not None else 0

    @property
    def linear_attention_shapes(self) -> tuple[tuple[int, int], ...]:
        """(outputs, inputs) of a Gated DeltaNet layer's linear weights; () without them."""
        return self.linear_attention.shapes(self.hidden_size) if self.linear_attention is not None else ()

    @property
    def linear_params(self) -> int:
        """Linear-layer weights of all blocks, every expert and router included (what memory holds)."""
        experts = self.moe_layers * (self.num_experts * self.expert_weights + self.router_weights)
        return self.dense_linear_params + experts

    @property
    def active_linear_params(self) -> int:
        """Linear-layer weights of all blocks one token multiplies against (top-k experts per MoE layer)."""
        experts = self.moe_layers * (self.num_experts_per_tok * self.expert_weights + self.router_weights)
        return self.dense_linear_params + experts

    @property
    def other_params_per_layer(self) -> int:
        """Biases and norm weights of one attention block (small, but part of the published counts); a MoE
        layer's expert and router biases are counted with the experts and the router."""
        h, i = self.hidden_size, self.intermediate_size
        if self.is_gpt_like:
            biases = self.q_size + 2 * self.kv_size + h + i + h
            return biases + 2 * (2 * h)                       # two LayerNorms, weight + bias
        qk_norms = {"per head": 2 * self.head_size, "across heads": self.q_size + self.kv_size}.get(self.qk_norm, 0)
        # Qwen2 and a config's attention_bias (GLM-4.5): biased q, k, v
        qkv_bias = self.q_size + self.kv_size + self.v_size if self.model_type == "qwen2" or self.attention_bias else 0
        if self.model_type == "gpt_oss":                      # biased q, k, v, o
            qkv_bias = self.q_size + self.kv_size + self.v_size + h
        sinks = self.num_heads if self.attention_sinks else 0     # one sink logit per head
        latent_norms = mla.norm_params(self) if self.is_mla else 0
        return (self.norms_per_layer * h + qk_norms + qkv_bias + sinks + latent_norms    # RMSNorms, weight only
                + self.compressed_other_params)

    @property
    def compressed_other_params(self) -> int:
        """A DeepSeek-V4 layer's parameters beside its quantized weights, all replicated: the q and kv norms,
        the two hyper-connections, and its kind's unquantized compressor and indexer projections, position
        biases and norms (planner/catalog/deepseek_v4.py); 0 for any other model."""
        ca = self.compressed_attention
        if ca is None:
            return 0
        h, head, ratio = self.hidden_size, self.head_size, self.compress_ratio
        projections = sum(n * k for n, k in ca.compressor_shapes(ratio, h, head))
        return (self.q_lora_rank + head + ca.hc_params_per_layer(h) + projections
                + ca.compressor_other_params(ratio, head))

    @property
    def block_other_params(self) -> int:
        """Biases and norm weights of all blocks: a Gated DeltaNet layer has its two RMSNorms and its own
        small weights (planner/catalog/linear_attention.py) in place of attention's."""
        linear = self.linear_attention
        mlp_blocks = self.ffn_layers * self.hidden_size       # Nemotron-H's MLP blocks: one RMSNorm each
        if linear is None:
            return (sum(layers * spec.other_params_per_layer for layers, spec in self.attention_kinds) + mlp_blocks
                    + self.indexer_norm_params)
        return (self.attention_layers * self.other_params_per_layer + mlp_blocks
                + linear.layers * (self.norms_per_layer * self.hidden_size + linear.other_params))

    @property
    def tp_allreduces(self) -> int:
        """All-reduces of one forward pass under tensor parallelism: after each attention layer or mixer and each
        MLP (Nemotron-H: each block), after Gemma 4's experts apart from its MLP (vLLM reduces each branch
        itself), and the vocab-parallel embedding's."""
        return self.num_layers + self.mlp_layers + (self.moe_layers if self.is_gemma else 0) + 1

    @property
    def is_gemma(self) -> bool:
        """Gemma's block (2, 3 and 4): RMSNorms after attention and after the MLP too, a GELU-tanh gated MLP,
        the embedding scaled by sqrt(hidden)."""
        return self.model_type in (*GEMMA_TYPES, *GEMMA4_TYPES)

    @property
    def norms_per_layer(self) -> int:
        """RMSNorms of one block: before attention and before the MLP, and Gemma's two more after each;
        Nemotron-H's and DeciLM's block holds one thing behind one norm (their MLP blocks count theirs apart)."""
        if self.model_type in _BLOCK_TYPES:
            return 1
        if self.model_type in GEMMA4_TYPES:       # and a MoE layer's three: pre-feedforward 2, post-feedforward 1, 2
            return 7 if self.is_moe else 4
        return 4 if self.model_type in GEMMA_TYPES else 2

    @property
    def position_params(self) -> int:
        if not self.is_gpt_like:
            return 0                                          # RoPE has no parameters
        return (self.max_position_embeddings + _GPT_LIKE[self.model_type]) * self.hidden_size

    @property
    def final_norm_params(self) -> int:
        """The final norm (LayerNorm: weight and bias), and DeepSeek-V4's last hyper-connection before it."""
        if self.compressed_attention is not None:
            return self.hidden_size + self.compressed_attention.hc_head_params(self.hidden_size)
        return 2 * self.hidden_size if self.is_gpt_like else self.hidden_size

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """Separate output-projection weights; 0 when tied to the input embedding."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def expert_bias_params(self) -> int:
        """Every expert's biases (gpt-oss) and the routers' parameters beside their weights (gpt-oss's biases,
        Gemma 4's scales), which the linear counts leave out."""
        return self.moe_layers * (self.num_experts * (self.expert_params - self.expert_weights)
                                  + self.router_params - self.router_weights)

    def _non_linear_params(self) -> int:
        return (self.block_other_params + self.embedding_params + self.position_params
                + self.final_norm_params + self.lm_head_params + self.vision_params)

    @property
    def num_params(self) -> int:
        """The checkpoint's parameters (Gemma 4's K=V layers without the V projection vLLM adds)."""
        return self.linear_params + self.expert_bias_params + self._non_linear_params() - self.copied_value_params

    @property
    def active_params(self) -> int:
        """Parameters one token uses: the top-k experts of each MoE layer, everything else whole
        (the embedding included, as Mixtral's 12.9B and Qwen3's 3.3B count it; gpt-oss's card leaves
        the embedding out). A dense model's active parameters are all of them."""
        if not self.is_moe:
            return self.num_params
        k_share = self.num_experts_per_tok / self.num_experts
        routers = self.moe_layers * (self.router_params - self.router_weights)
        return (self.active_linear_params + round((self.expert_bias_params - routers) * k_share) + routers
                + self._non_linear_params() - self.copied_value_params)

    @property
    def replicated_params(self) -> int:
        """Parameters every tensor-parallel rank holds in full (Megatron-style sharding).

        Norms, position tables and the biases added after a row-parallel layer
        (attention output, MLP down projection) are not split; nor are the MoE routers
        (vLLM's ReplicatedLinear) and MLA's down-projections with their norms; everything else
        (column/row-parallel weights, vocab-parallel embedding and LM head, experts) is.
        """
        h = self.hidden_size
        per_layer = (2 * (2 * h) + 2 * h) if self.is_gpt_like else self.norms_per_layer * h
        if self.is_mla:
            per_layer += mla.norm_params(self)
        routers = self.moe_layers * self.router_params
        compressed = sum(layers * spec.compressed_other_params for layers, spec in self.attention_kinds)
        return (self.num_layers * per_layer + compressed + self.whole_linear_params + self.ffn_layers * h
                + self.indexer_norm_params
                + self.position_params + self.final_norm_params + routers)

    @property
    def replicated_linear_params_per_layer(self) -> int:
        return sum(n * k for n, k in self.replicated_linear_shapes)

    @property
    def whole_linear_params(self) -> int:
        """Dense linear weights every tensor-parallel rank holds whole: MLA's and DeepSeek-V4's down-projections
        and Nemotron-H's latent projections (vLLM's ReplicatedLinear)."""
        return (sum(layers * spec.replicated_linear_params_per_layer for layers, spec in self.attention_kinds)
                + self.moe_layers * sum(n * k for n, k in self.latent_shapes)
                + self.indexer_layers * sum(n * k for n, k in self.indexer_shapes))

    # ---- bytes and FLOPs ----------------------------------------------------

    def weight_bytes(self, dtype_bytes: int = 2) -> int:
        return self.num_params * dtype_bytes

    def expert_bytes(self, dtype_bytes: int = 2, weight_format: WeightFormat | None = None) -> int:
        """Every expert of every MoE layer, biases included: in `weight_format` when it quantizes experts
        (all the formats do; MXFP4 only them), else at `dtype_bytes`."""
        if not self.is_moe:
            return 0
        weights = self.expert_weights
        weight_format = weight_format.experts if weight_format is not None else None
        per_expert = (sum(weight_format.matrix_bytes(n, k) for n, k in self.expert_shapes)
                      if weight_format is not None else weights * dtype_bytes)
        per_expert += (self.expert_params - weights) * dtype_bytes
        return self.moe_layers * self.num_experts * per_expert

    def expert_bytes_per_gpu(self, tp: int = 1, dp: int = 1, expert_parallel: bool = False, dtype_bytes: int = 2,
                             weight_format: WeightFormat | None = None, redundant_experts: int = 0) -> int:
        """The experts' bytes on the most loaded of tp x dp GPUs: 1/(tp x dp) of each expert's width, or
        with expert parallelism ceil((E + R) / (tp x dp)) whole experts (vLLM gives the remainder to the first
        ranks; R: EPLB's redundant copies of the busiest experts)."""
        experts = self.expert_bytes(dtype_bytes, weight_format)
        if expert_parallel and self.is_moe:
            return experts * -(-(self.num_experts + redundant_experts) // (tp * dp)) // self.num_experts
        return -(-experts // (tp * dp))

    def weight_bytes_per_gpu(self, tp: int = 1, dtype_bytes: int = 2, weight_format: WeightFormat | None = None,
                             dp: int = 1, expert_parallel: bool = False, redundant_experts: int = 0) -> int:
        """Weights one of `tp` tensor-parallel GPUs holds: its shard plus the replicated parts.

        With a `weight_format`, the blocks' linear layers are stored in it (scales included) and the
        rest (embedding, LM head, norms, biases) stays at `dtype_bytes`, as vLLM keeps them
        (planner/catalog/quantization.py); the linear layers and their scales shard by 1/tp.
        A MoE's experts split over all tp x dp GPUs: each expert's width (vLLM's FusedMoE without
        expert parallelism) or whole experts (with it, the largest rank holding ceil(E / (tp x dp)));
        its routers are replicated.
        """
        if tp < 1 or dp < 1:
            raise PlannerError(f"tensor and data parallel sizes must be >= 1, got {tp} and {dp}")
        experts_here = self.expert_bytes_per_gpu(tp, dp, expert_parallel, dtype_bytes, weight_format, redundant_experts)
        dense = self._non_linear_params() + self.dense_linear_params
        sharded = dense - self.replicated_params + self.moe_layers * self.router_params
        if weight_format is None or not weight_format.quantizes_linear:
            return (-(-sharded // tp) + self.replicated_params) * dtype_bytes + experts_here
        replicated_linear = self.whole_linear_params
        rest = sharded - (self.dense_linear_params - replicated_linear)
        head = 0
        if weight_format.head is not None and self.lm_head_params:     # a mixed checkpoint's quantized LM head
            rest -= self.lm_head_params
            head = -(-weight_format.head.matrix_bytes(self.vocab_size, self.hidden_size) // tp)
        return (self.linear_bytes_per_gpu(weight_format, tp) + head
                + (-(-rest // tp) + self.replicated_params - replicated_linear) * dtype_bytes + experts_here)

    def linear_params_per_gpu(self, tp: int = 1) -> float:
        """The layers' dense linear weights one of `tp` GPUs holds and multiplies: a 1/tp share of each,
        MLA's down-projections whole (vLLM replicates them)."""
        whole = self.whole_linear_params
        return (self.dense_linear_params - whole) / tp + whole

    def linear_bytes_per_gpu(self, weight_format: WeightFormat, tp: int = 1) -> int:
        """The layers' dense linear weights (attention, dense MLPs, shared experts) in `weight_format` on one of
        `tp` GPUs: a 1/tp share of each, MLA's down-projections whole (vLLM replicates them); the weights
        the checkpoint keeps in 16 bits at 2 bytes, a mixed checkpoint's each in its own format
        (planner/catalog/kept_layers.py)."""
        shares = format_shares(self, weight_format)

        def size(role: str, index: int, n: int, k: int) -> int:
            stored = stored_as(shares, weight_format, role, index)
            if len(stored) == 1 and stored[0][0] is not None:
                return stored[0][0].matrix_bytes(n, k)
            return round(sum(fraction * (f.matrix_bytes(n, k) if f is not None else 2 * n * k)
                             for f, fraction in stored))

        return self._linear_per_gpu(tp, size)

    def linear_params_by_format(self, weight_format: WeightFormat, tp: int = 1) -> dict[WeightFormat | None, int]:
        """`linear_params_per_gpu` by the format each is stored and multiplied in (None: 16 bits)."""
        shares = format_shares(self, weight_format)
        formats = {f for per_role in shares.values() for stored in per_role for f, _ in stored}
        formats.add(None if weight_format.is_mixed else weight_format)      # the roles format_shares leaves out

        def params_in(fmt: WeightFormat | None):
            return lambda role, index, n, k: round(sum(fraction * n * k for f, fraction in
                                                       stored_as(shares, weight_format, role, index) if f == fmt))

        by_format = {fmt: self._linear_per_gpu(tp, params_in(fmt)) for fmt in formats}
        return {fmt: params for fmt, params in by_format.items() if params}

    def _linear_per_gpu(self, tp: int, size) -> int:
        """The sum of `size(role, index, n, k)` (one layer's weight `index` of the role's shape tuple) over
        the layers' dense linear weights one of `tp` GPUs holds: a 1/tp share, MLA's down-projections whole."""
        def layers_of(role: str, shapes, layers: int, first: int = 0) -> int:
            return layers * sum(size(role, first + i, n, k) for i, (n, k) in enumerate(shapes))

        def split_of(spec: ModelSpec) -> int:      # attention weights the ranks split (replicated ones are last)
            return len(spec.attention_shapes) - len(spec.replicated_linear_shapes)

        kinds = self.attention_kinds
        whole = (sum(layers_of("attention", spec.replicated_linear_shapes, layers, split_of(spec))
                     for layers, spec in kinds)
                 + layers_of("latent", self.latent_shapes, self.moe_layers)
                 + layers_of("indexer", self.indexer_shapes, self.indexer_layers))
        split = (sum(layers_of("attention", spec.attention_shapes[:split_of(spec)], layers) for layers, spec in kinds)
                 + layers_of("linear_attention", self.linear_attention_shapes, self.linear_attention_layers)
                 + sum(layers_of("mlp", shapes, layers) for layers, _, shapes in self.dense_mlp_kinds)
                 + layers_of("shared_experts", self.shared_expert_shapes, self.moe_layers))
        return -(-split // tp) + whole

    def kv_heads_per_gpu(self, tp: int) -> int:
        """KV heads one GPU stores: a 1/tp share, or one replicated head when tp exceeds the KV heads (GQA)."""
        if tp < 1:
            raise PlannerError(f"tensor parallel size must be >= 1, got {tp}")
        if self.num_heads % tp:
            raise PlannerError(f"tensor parallel size {tp} does not divide {self.name}'s {self.num_heads} "
                               f"attention heads")
        if self.num_kv_heads % tp and tp % self.num_kv_heads:
            raise PlannerError(f"tensor parallel size {tp} and {self.name}'s {self.num_kv_heads} KV heads "
                               f"do not divide")
        return max(1, self.num_kv_heads // tp)

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """K and V of one token across all layers (the paper's 800 KB for OPT-13B in fp16; MLA's latent); a
        Gated DeltaNet layer keeps none."""
        return self.kv_cache_bytes_per_token(1, dtype_bytes)

    def flops_per_token(self, context_len: int = 0) -> int:
        """Forward FLOPs for one token that attends to `context_len` keys, LM head included.

        2 FLOPs per weight per token for the linear layers and the LM head, plus
        QK^T and PV: 2 * 2 * head_size FLOPs per (query head, key) pair per layer (MLA: its decode path),
        and a Gated DeltaNet layer's recurrent update whatever the context (recurrent_flops_per_token).
        """
        linear = 2 * (self.active_linear_params + self.vocab_size * self.hidden_size)
        ca = self.compressed_attention
        if ca is not None:          # the window on every layer, CSA's top-k rows and its indexer, HCA's rows
            keys = (self.num_layers * min(context_len, ca.window) + ca.csa_layers * min(context_len // CSA,
                                                                                       ca.indexer.topk)
                    + ca.hca_layers * (context_len // HCA))
            return (linear + self.attention_flops_per_key * keys
                    + ca.csa_layers * (context_len // CSA) * ca.indexer.flops_per_pair)
        attention = (self.full_layer_spec.attention_flops_per_key * self.full_attention_layers * context_len
                     + self.attention_flops_per_key * self.sliding_layers * min(context_len, self.window))
        return linear + attention + self.linear_attention_layers * self.recurrent_flops

    @property
    def recurrent_flops(self) -> int:
        """FLOPs a Gated DeltaNet or Mamba-2 layer spends on one token's recurrent step (0 without them)."""
        return self.linear_attention.recurrent_flops if self.linear_attention is not None else 0

    @property
    def full_attention_layers(self) -> int:
        """Layers whose KV grows with the context (all but gpt-oss's sliding-window layers and the Gated
        DeltaNet layers)."""
        return self.attention_layers - self.sliding_layers

    @property
    def window(self) -> int:
        """The sliding-window layers' window in tokens (0 when the model has none)."""
        return self.sliding_window or 0 if self.sliding_layers else 0

    def kv_bytes_per_context(self, tokens: int, dtype_bytes: int = 2) -> int:
        """K and V one sequence of `tokens` holds across all layers: a sliding-window layer keeps at most
        its window (vLLM's hybrid KV cache manager frees the blocks that leave it); DeepSeek-V4's window rows
        and compressor states, and its compressed rows in whole blocks."""
        ca = self.compressed_attention
        if ca is not None:
            head, rope = self.head_size, self.rotary_dims
            return ca.sequence_bytes(head, rope) + -(-tokens // COMPRESSED_BLOCK) * ca.block_bytes(head, rope)
        return (tokens * (self.full_attention_layers * self.full_layer_spec.kv_cache_bytes(1, dtype_bytes)
                          - self.uncached_index_key_bytes)
                + self.sliding_layers * min(tokens, self.window) * self.kv_cache_bytes(1, dtype_bytes))


    # ---- Hugging Face configs ----------------------------------------------

    def to_hf_config(self, **overrides: Any):
        """A transformers config with this model's true shapes; overrides are set afterwards.

        Overrides use config attribute names (e.g. num_hidden_layers=1 to build a
        one-layer model for per-layer profiling); an unknown name is an error, not
        a silently ignored extra attribute.
        """
        import transformers  # slow import; only the profiler and engine need configs

        if self.model_type == "opt":
            config = transformers.OPTConfig(
                vocab_size=self.vocab_size, hidden_size=self.hidden_size, num_hidden_layers=self.num_layers,
                ffn_dim=self.intermediate_size, num_attention_heads=self.num_heads,
                max_position_embeddings=self.max_position_embeddings, word_embed_proj_dim=self.hidden_size,
                do_layer_norm_before=True, enable_bias=True, tie_word_embeddings=self.tie_word_embeddings,
            )
            config.architectures = ["OPTForCausalLM"]
        elif self.model_type == "gpt2":
            config = transformers.GPT2Config(
                vocab_size=self.vocab_size, n_positions=self.max_position_embeddings, n_embd=self.hidden_size,
                n_layer=self.num_layers, n_head=self.num_heads, n_inner=self.intermediate_size,
                layer_norm_epsilon=self.norm_eps, tie_word_embeddings=self.tie_word_embeddings,
            )
            config.architectures = ["GPT2LMHeadModel"]
        elif self.model_type in NEMOTRON_H_TYPES:
            config = nemotron_h_hf_config(self)
        elif self.model_type in NEMOTRON_NAS_TYPES:
            config = nemotron_nas_hf_config(self)
        elif self.model_type in GEMMA4_TYPES:
            config = gemma4_hf_config(self)
        elif self.model_type in MIMO_TYPES:
            config = mimo_hf_config(self)
        elif self.model_type in DEEPSEEK_V4_TYPES:
            config = deepseek_v4_hf_config(self)
        else:
            common = dict(
                vocab_size=self.vocab_size, hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
                num_hidden_layers=self.num_layers, num_attention_heads=self.num_heads,
                num_key_value_heads=self.num_kv_heads, head_dim=self.head_size,
                max_position_embeddings=self.max_position_embeddings, rms_norm_eps=self.norm_eps,
                tie_word_embeddings=self.tie_word_embeddings,
                rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta or 10000.0},
            )
            if self.partial_rotary_dims:
                common["rope_parameters"]["partial_rotary_factor"] = self.partial_rotary_dims / self.head_size
            if self.linear_attention is not None:
                config = linear_attention_hf_config(self, common)
            elif self.is_moe:
                config = moe_hf_config(self, common)
            elif self.model_type in GEMMA_TYPES:
                config = gemma_hf_config(self, common)
            elif self.model_type == "mistral":
                config = transformers.MistralConfig(sliding_window=self.sliding_window, **common)
                config.architectures = ["MistralForCausalLM"]
            elif self.model_type == "qwen3":
                config = transformers.Qwen3Config(**common)
                config.architectures = ["Qwen3ForCausalLM"]
            elif self.model_type == "qwen2":
                config = transformers.Qwen2Config(**common)
                config.architectures = ["Qwen2ForCausalLM"]
            elif self.model_type == "phi3":
                config = transformers.Phi3Config(sliding_window=self.sliding_window, pad_token_id=None, **common)
                config.architectures = ["Phi3ForCausalLM"]
            else:
                config = transformers.LlamaConfig(**common)
                config.architectures = ["LlamaForCausalLM"]
        for key, value in overrides.items():
            if not hasattr(config, key):
                raise PlannerError(f"unknown config field {key!r} for {type(config).__name__}")
            setattr(config, key, value)
        return config

    @classmethod
    def from_hf_config(cls, config: Any, name: str | None = None) -> "ModelSpec":
        """Describe a model from its transformers config (or the dict of its config.json). A field of a type
        or value the readers below do not check (a list where a count belongs, a word for a number) is named
        by its value in one line, not a traceback."""
        try:
            return cls._read_hf_config(config, name)
        except PlannerError:
            raise
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError, OverflowError) as exc:
            label = f"model {name!r}" if name else "a model config"
            raise PlannerError(f"{label}: a field holds a value of the wrong type or range "
                               f"({type(exc).__name__}: {exc})") from None

    @classmethod
    def _read_hf_config(cls, config: Any, name: str | None) -> "ModelSpec":
        get = config.get if isinstance(config, dict) else (lambda k, d=None: getattr(config, k, d))
        model_type = get("model_type")
        if not isinstance(model_type, str):
            raise PlannerError(f"model {name or '(unnamed)'!r}: config field model_type must be a string, "
                               f"got {model_type!r}")
        # Xiaomi's MiMo-7B is Qwen2's architecture with a multi-token-prediction layer vLLM loads only to draft
        # (vllm/model_executor/models/mimo.py: MiMoForCausalLM subclasses Qwen2ForCausalLM)
        model_type = "qwen2" if model_type == "mimo" else model_type
        if name is None:
            path = get("_name_or_path") or get("name_or_path") or ""
            name = os.path.basename(str(path).rstrip("/")) or str(model_type)
        # the fields the shapes below are computed from: a missing or bad one is named, not a TypeError
        for key in _DIVISORS["moe"] if model_type in _EXPERT_TYPES else _DIVISORS.get(model_type, ()):
            if not _is_count(get(key)) or get(key) == 0:
                raise PlannerError(f"model {name!r}: config field {key} must be a positive integer, "
                                   f"got {get(key)!r}")
        if model_type == "gpt2":
            hidden = get("n_embd")
            return cls(name=name, model_type="gpt2", num_layers=get("n_layer"), hidden_size=hidden,
                       num_heads=get("n_head"), num_kv_heads=get("n_head"), head_size=hidden // get("n_head"),
                       intermediate_size=get("n_inner") or 4 * hidden, vocab_size=get("vocab_size"),
                       max_position_embeddings=get("n_positions"),
                       tie_word_embeddings=bool(get("tie_word_embeddings", True)),
                       norm_eps=get("layer_norm_epsilon", 1e-5))
        if model_type == "opt":
            hidden = get("hidden_size")
            proj = get("word_embed_proj_dim") or hidden
            if proj != hidden or not get("do_layer_norm_before", True):
                # opt-350m: embedding projections and post-LayerNorm, a shape this catalog does not model
                raise PlannerError(f"OPT variant {name!r} (word_embed_proj_dim={proj}, post-LayerNorm) is not supported")
            heads = get("num_attention_heads")
            return cls(name=name, model_type="opt", num_layers=get("num_hidden_layers"), hidden_size=hidden,
                       num_heads=heads, num_kv_heads=heads, head_size=hidden // heads,
                       intermediate_size=get("ffn_dim"), vocab_size=get("vocab_size"),
                       max_position_embeddings=get("max_position_embeddings"),
                       tie_word_embeddings=bool(get("tie_word_embeddings", True)))
        if model_type in MULTIMODAL_TYPES and isinstance(config, dict):
            text, vision = multimodal_parts(config, name)
            return dataclasses.replace(cls.from_hf_config(text, name), vision_params=vision)
        if model_type in LLAMA4_CONFIG_TYPES:
            return cls(**llama4_fields(config, name))
        if model_type in LINEAR_ATTENTION_TYPES:
            return cls(**linear_attention_fields(get, model_type, name))
        if model_type in NEMOTRON_H_TYPES:
            return cls(**nemotron_h_fields(get, model_type, name))
        if model_type in NEMOTRON_NAS_TYPES:
            return cls(**nemotron_nas_fields(get, model_type, name))
        if model_type in MOE_TYPES:
            return cls(**moe_fields(get, model_type, name))
        if model_type in GEMMA_CONFIG_TYPES:
            return cls(**gemma_fields(config, name))
        if model_type in MIMO_TYPES:
            return cls(**mimo_fields(get, name))
        if model_type in DEEPSEEK_V4_TYPES:
            return cls(**deepseek_v4_fields(get, name))
        if model_type in GEMMA4_CONFIG_TYPES:     # transformers 5's Gemma4TextConfig reads as its config.json
            return cls(**gemma4_fields(config if isinstance(config, dict) else config.to_dict(), name))
        if model_type in _LLAMA_LIKE:
            hidden, heads = get("hidden_size"), get("num_attention_heads")
            rope = get("rope_parameters") or {}
            # transformers 5 keeps rope_theta in rope_parameters; config.json files on the Hub, at the top level
            theta = (rope.get("rope_theta") if isinstance(rope, dict) else None) or get("rope_theta")
            # Qwen3 configs carry a sliding_window that is off unless use_sliding_window is set
            window = get("sliding_window") if get("use_sliding_window", True) else None
            head_size = get("head_dim") or hidden // heads
            return cls(name=name, model_type=model_type, num_layers=get("num_hidden_layers"), hidden_size=hidden,
                       num_heads=heads, num_kv_heads=get("num_key_value_heads") or heads,
                       head_size=head_size, partial_rotary_dims=partial_rotary_dims(get, head_size, name),
                       intermediate_size=get("intermediate_size"), vocab_size=get("vocab_size"),
                       max_position_embeddings=get("max_position_embeddings"),
                       tie_word_embeddings=bool(get("tie_word_embeddings", False)),
                       rope_theta=float(theta or get("rope_theta") or 10000.0),
                       norm_eps=get("rms_norm_eps", 1e-6), sliding_window=window)
        known = dict.fromkeys([*KNOWN_TYPES, *GEMMA_CONFIG_TYPES, *GEMMA4_CONFIG_TYPES, *LLAMA4_CONFIG_TYPES,
                               *MULTIMODAL_TYPES])
        raise PlannerError(f"unsupported model_type {model_type!r}; known: {', '.join(known)}")

    @classmethod
    def from_model_dir(cls, path: str | os.PathLike) -> "ModelSpec":
        """Describe a local model folder from its config.json (no weights are read)."""
        config_path = os.path.join(path, "config.json")
        if not os.path.isfile(config_path):
            raise PlannerError(f"no config.json in model folder {str(path)!r}")
        return cls.from_config_file(config_path, name=os.path.basename(os.path.abspath(path)))

    @classmethod
    def from_config_file(cls, config_path: str | os.PathLike, name: str) -> "ModelSpec":
        """Describe a model from a config.json file; a damaged one is named with what is wrong."""
        try:
            with open(config_path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise PlannerError(f"{config_path}: cannot be read ({exc})") from None
        try:
            config = read_json(text)
        except ValueError as exc:
            raise PlannerError(f"{config_path}: {exc}") from None
        if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
            raise PlannerError(f"{config_path}: not a model config (a JSON object with a model_type)")
        return cls.from_hf_config(config, name=name)


@lru_cache(maxsize=64)
def _compressed_kind(spec: ModelSpec, ratio: int) -> ModelSpec:
    """DeepSeek-V4 with its attention of one kind of layer (SLIDING, CSA, HCA): its per-layer attention
    properties describe those layers."""
    return dataclasses.replace(spec, compressed_attention=dataclasses.replace(spec.compressed_attention, ratio=ratio))


@lru_cache(maxsize=64)
def _full_layer_twin(spec: ModelSpec) -> ModelSpec:
    g = spec.global_attention
    # (MiMo-V2-Flash's sinks are its sliding layers' alone)
    return dataclasses.replace(spec, head_size=g.head_size, num_kv_heads=g.kv_heads, global_attention=None,
                               attention_sinks=False)


@lru_cache(maxsize=1)
def model_catalog() -> Catalog[ModelSpec]:
    """The model catalog (planner/data/models.json), indexed by name, aliases and Hugging Face id."""
    text = resources.files("planner").joinpath("data/models.json").read_text(encoding="utf-8")
    specs = []
    for entry in json.loads(text)["models"]:
        entry = dict(entry)
        entry["aliases"] = tuple(entry.get("aliases", ()))
        entry["mlp_widths"] = tuple(entry.get("mlp_widths", ()))
        mixer = entry.get("linear_attention")
        if mixer is not None:        # a Mamba-2 mixer names its state size, a Gated DeltaNet its key heads
            entry["linear_attention"] = (Mamba2 if "state_size" in mixer else LinearAttention)(**mixer)
        if entry.get("sparse_indexer") is not None:
            entry["sparse_indexer"] = SparseIndexer(**entry["sparse_indexer"])
        if entry.get("global_attention") is not None:
            entry["global_attention"] = GlobalAttention(**entry["global_attention"])
        if entry.get("compressed_attention") is not None:
            compressed = dict(entry["compressed_attention"])
            compressed["indexer"] = SparseIndexer(**compressed["indexer"])
            entry["compressed_attention"] = CompressedAttention(**compressed)
        if entry.get("published_params") is not None:
            entry["published_params"] = int(entry["published_params"])
        specs.append(ModelSpec(**entry))

    def keys(spec: ModelSpec) -> list[str]:
        # every Hugging Face id also by its name without the organisation (a re-published checkpoint,
        # nvidia/DeepSeek-R1-0528-FP4, keeps the name of the one it quantizes)
        ids = [spec.hf_id] if spec.hf_id else []
        ids += [alias for alias in spec.aliases if "/" in alias]
        return list(dict.fromkeys([spec.name, *spec.aliases, *ids, *(i.split("/")[-1] for i in ids)]))

    return Catalog("model", specs, keys=keys)


def list_models() -> list[ModelSpec]:
    """All catalog entries, in file order."""
    return list(model_catalog())


# Fine-tunes and checkpoint variants keep their base model's shapes: a Hugging Face id with these words
# resolves to the catalog entry of the id without them (Mistral-7B-Instruct-v0.3 -> Mistral-7B-v0.3,
# Llama-3.1-8B-Instruct-FP8 -> Llama-3.1-8B; Meta's first repository names, Meta-Llama-3.1-405B ->
# Llama-3.1-405B). A quantization the id names is the deployment's business (--quantization), not the
# model's shape.
VARIANT_WORDS = frozenset(("instruct", "chat", "it", "base", "hf", "fp8", "dynamic", "fp4", "nvfp4", "mxfp4", "awq",
                           "gptq", "int4", "int8", "w8a8", "w4a16", "2507", "2407", "meta"))


def resolve_model(name: str | ModelSpec) -> ModelSpec:
    """A catalog model by name, alias or Hugging Face id (a fine-tuned or quantized variant of a catalog
    id included), or a local model folder or its config.json file."""
    if isinstance(name, ModelSpec):
        return name
    text = os.path.expanduser(str(name))
    if os.path.isfile(text) and text.endswith(".json"):      # config.json, or a config saved under another name
        file = os.path.basename(text)
        label = os.path.basename(os.path.dirname(os.path.abspath(text))) if file == "config.json" else file[:-5]
        return ModelSpec.from_config_file(text, name=label)
    if os.path.isdir(text):
        return ModelSpec.from_model_dir(text)
    if text.endswith(".json") or text.startswith(("/", "./", "../", "~")):
        raise PlannerError(f"model {text!r}: no such config file or model folder")
    catalog = model_catalog()
    base = text.rsplit("/", 1)[-1]
    without_variant = "-".join(w for w in base.lower().split("-") if w not in VARIANT_WORDS)
    spec = catalog.find(text) or catalog.find(base) or catalog.find(without_variant)
    if spec is not None:
        return spec
    lowered = base.lower()
    if "distill" in lowered:      # DeepSeek-R1-Distill-Qwen-1.5B is a Qwen2.5 model, not DeepSeek-V3
        return catalog.get(text, hint=" (a distilled model has its base model's architecture: give its model "
                                      "folder or config.json)")
    return catalog.get(text, hint=" (planner list models shows them with their Hugging Face ids; or give a model "
                                  "folder or its config.json)")


def model_ids(spec: ModelSpec) -> list[str]:
    """Every name `resolve_model` finds `spec` by: its name, aliases and Hugging Face id."""
    return list(dict.fromkeys([spec.name, *spec.aliases, *([spec.hf_id] if spec.hf_id else [])]))
