"""DeepSeek Sparse Attention (DSA): DeepSeek-V3.2 (model_type deepseek_v32) and GLM-5 to GLM-5.3 (glm_moe_dsa).

Both keep DeepSeek-V3's multi-head latent attention and experts (planner/catalog/mla.py, moe_config.py)
and add a "lightning indexer" to the layers, which picks the index_topk (2,048) earlier tokens each
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
rotary values in bf16) on Hopper, where FlashMLA's sparse backend runs; on Blackwell vLLM picks FlashInfer's
sparse backend for an FP8 cache (platforms/cuda.py `_get_backend_priorities`), which keeps the 576 values
in plain FP8 (576 bytes; `SparseIndexer.fp8_ds_mla` False, planner/cost/sparse.py `as_cached_on`). Beside
it, the indexer's key, always FP8 with one fp32 scale per 128 values (132 bytes). Both live in the same
blocks of the same pool. vLLM holds the indexer's three projections whole on every tensor-parallel rank
(like MLA's down-projections).

GLM-5.2 and 5.3 share an indexer's picks ("IndexCache", arXiv 2603.12201): with index_topk_freq 4 and
index_skip_topk_offset 3, only 21 of their 78 layers run an indexer (0, 1, 2, then every fourth from 6;
the config's indexer_types marks them "full"), and the other 57 attend over the top-k the last of those
picked. vLLM builds the indexer, its three projections and its key cache on those layers alone
(DeepseekV2MLAAttention: a layer skips when max(layer - offset + 1, 0) % freq != 0, offset 2 by default),
and so does the plan: the indexer is its own role of weights (`ModelSpec.indexer_shapes`, on
`indexer_layers` layers), and a shared layer caches the latent alone.
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
    """The lightning indexer of a DSA model: its heads, their width and how many keys it keeps per query;
    and which layers run one (`every` and `offset`: the config's index_topk_freq and
    index_skip_topk_offset, 1 and 2 where every layer runs its own). `fp8_ds_mla`: an FP8 cache keeps the
    latent in vLLM's fp8_ds_mla rows (FlashMLA's sparse backend), or, False, in plain FP8 (FlashInfer's, which
    vLLM runs on Blackwell): what the GPU decides, not the checkpoint."""

    heads: int
    head_dim: int
    topk: int
    every: int = 1
    offset: int = 2
    fp8_ds_mla: bool = True

    def __post_init__(self) -> None:
        for field in ("heads", "head_dim", "topk", "every"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PlannerError(f"sparse attention: {field} must be a positive integer, got {value!r}")
        if isinstance(self.offset, bool) or not isinstance(self.offset, int) or self.offset < 0:
            raise PlannerError(f"sparse attention: offset must be an integer >= 0, got {self.offset!r}")

    def indexed_layers(self, layers: int) -> tuple[int, ...]:
        """The layers (of `layers`) that run their own indexer, as vLLM picks them; the others reuse the
        top-k of the last one before them."""
        return tuple(i for i in range(layers) if max(i - self.offset + 1, 0) % self.every == 0)

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


def latent_cache_bytes(kv_lora_rank: int, rope_dims: int, kv_dtype_bytes: int, fp8_ds_mla: bool = True) -> int:
    """One token's latent and rotary key in one layer: bf16, or with an FP8 cache vLLM's fp8_ds_mla rows, or
    plain FP8 values (`fp8_ds_mla` False)."""
    if kv_dtype_bytes == 1 and fp8_ds_mla:
        return kv_lora_rank + 4 * -(-kv_lora_rank // _FP8_SCALE_GROUP) + 2 * rope_dims
    return (kv_lora_rank + rope_dims) * kv_dtype_bytes


def sparse_indexer(get: Callable[..., Any], name: str) -> SparseIndexer:
    """The indexer of a deepseek_v32 or glm_moe_dsa config (`get(key, default=None)` reads it): vLLM reads
    index_topk_freq and index_skip_topk_offset, not indexer_types, which must agree with them."""
    if get("index_topk_pattern") is not None:
        raise PlannerError(f"model {name!r}: index_topk_pattern (a per-layer list of shared indexers) is not "
                           f"modelled; index_topk_freq and index_skip_topk_offset are")
    offset = get("index_skip_topk_offset")
    index = SparseIndexer(heads=get("index_n_heads"), head_dim=get("index_head_dim"), topk=get("index_topk"),
                          every=get("index_topk_freq") or 1, offset=2 if offset is None else offset)
    kinds, layers = get("indexer_types"), get("num_hidden_layers")
    if isinstance(kinds, list) and isinstance(layers, int):
        marked = tuple(i for i, kind in enumerate(kinds) if kind == "full")
        if len(kinds) != layers or marked != index.indexed_layers(layers):
            built = index.indexed_layers(layers)
            raise PlannerError(f"model {name!r}: indexer_types marks {len(marked)} layers full, but vLLM builds "
                               f"indexers on {len(built)} (index_topk_freq {index.every}, index_skip_topk_offset "
                               f"{index.offset}: layers {', '.join(map(str, built[:4]))}, ...)")
    return index
