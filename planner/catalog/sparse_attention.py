"""DeepSeek Sparse Attention (DSA): DeepSeek-V3.2 (model_type deepseek_v32) and GLM-5, GLM-5.1 (glm_moe_dsa).

Both keep DeepSeek-V3's multi-head latent attention and experts (planner/catalog/mla.py, moe_config.py)
and add a "lightning indexer" to every layer, which picks the index_topk (2,048) earlier tokens each
query attends to:

  wq_b          q_lora_rank -> index_n_heads x index_head_dim: the indexer's queries, from the q latent
  wk, k_norm    hidden -> index_head_dim, then a LayerNorm: one indexer key per token, shared by its heads
  weights_proj  hidden -> index_n_heads: a weight per head for summing the heads' scores

Per query the indexer scores every earlier key (ReLU of q.k per head, weighted and summed: 2 x heads x
head_dim FLOPs per (query, key), in FP8 on DeepGEMM's fp8_mqa_logits kernels), keeps the top index_topk
and latent attention then runs over those alone. So attention reads at most index_topk latents per
query, however long the context, while the indexer still reads every key of its own small cache.

The cache (vLLM's layout): per token and layer, the latent and rotary key as for MLA, bf16 (1,152 bytes)
or, with an FP8 KV cache, vLLM's "fp8_ds_mla" (656 bytes: 512 FP8 latent values, four fp32 scales, the 64
rotary values in bf16); beside it the indexer's key, always FP8 with one fp32 scale per 128 values (132
bytes). Both live in the same blocks of the same pool. vLLM holds the indexer's three projections whole
on every tensor-parallel rank (like MLA's down-projections).

GLM-5.2 shares one indexer's picks across four layers (index_topk_freq, indexer_types "shared"); that
pattern is refused rather than priced as an indexer on every layer.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from planner.errors import PlannerError

DSA_TYPES = ("deepseek_v32", "glm_moe_dsa")
# Bytes per token and layer of the latent cache in vLLM's FP8 format for sparse MLA (fp8_ds_mla):
# kv_lora_rank FP8 values, one fp32 scale per 128 of them, and the rotary key left in bf16.
_FP8_SCALE_GROUP = 128


@dataclass(frozen=True, slots=True)
class SparseIndexer:
    """The lightning indexer every layer of a DSA model runs: its heads, their width and how many
    keys it keeps per query."""

    heads: int
    head_dim: int
    topk: int

    def __post_init__(self) -> None:
        for field in ("heads", "head_dim", "topk"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PlannerError(f"sparse attention: {field} must be a positive integer, got {value!r}")

    def shapes(self, hidden: int, q_lora_rank: int) -> tuple[tuple[int, int], ...]:
        """(outputs, inputs) of one layer's indexer weights: wq_b, wk, weights_proj."""
        return ((self.heads * self.head_dim, q_lora_rank), (self.head_dim, hidden), (self.heads, hidden))

    @property
    def norm_params(self) -> int:
        """The LayerNorm over the indexer's key: weight and bias."""
        return 2 * self.head_dim

    @property
    def key_bytes(self) -> int:
        """One token's indexer key in the cache: FP8 values and an fp32 scale per 128 of them."""
        return self.head_dim + 4 * -(-self.head_dim // _FP8_SCALE_GROUP)

    @property
    def flops_per_pair(self) -> int:
        """FLOPs the indexer spends scoring one key for one query: q.k on each head and the weighted sum."""
        return 2 * self.heads * self.head_dim


def latent_cache_bytes(kv_lora_rank: int, rope_dims: int, kv_dtype_bytes: int) -> int:
    """One token's latent and rotary key in one layer: bf16, or vLLM's fp8_ds_mla with an FP8 cache."""
    if kv_dtype_bytes == 1:
        return kv_lora_rank + 4 * -(-kv_lora_rank // _FP8_SCALE_GROUP) + 2 * rope_dims
    return (kv_lora_rank + rope_dims) * kv_dtype_bytes


def sparse_indexer(get: Callable[..., Any], name: str) -> SparseIndexer:
    """The indexer of a deepseek_v32 or glm_moe_dsa config (`get(key, default=None)` reads it)."""
    kinds = get("indexer_types")
    if (get("index_topk_freq") or 1) > 1 or (isinstance(kinds, list) and "shared" in kinds):
        raise PlannerError(f"model {name!r}: an indexer shared across layers (index_topk_freq, GLM-5.2) is not "
                           f"modelled")
    return SparseIndexer(heads=get("index_n_heads"), head_dim=get("index_head_dim"), topk=get("index_topk"))
