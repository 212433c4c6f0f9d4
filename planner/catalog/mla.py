"""Multi-head latent attention (DeepSeek-V2/V3/R1, Kimi-K2): its weights, its KV cache and its work.

Per layer (DeepSeek-V3: hidden 7168, 128 heads, q_lora_rank 1536, kv_lora_rank 512, q/k heads of
128 + 64 rotary dims, v heads of 128):

  q_a_proj    hidden -> q_lora_rank, then an RMSNorm; q_b_proj: q_lora_rank -> heads x head_size
              (q_lora_rank 0, DeepSeek-V2-Lite: q_proj straight from hidden -> heads x head_size)
  kv_a_proj   hidden -> kv_lora_rank + qk_rope_head_dim (the latent and the one rotary key all heads
              share), then an RMSNorm over the latent
  kv_b_proj   kv_lora_rank -> heads x (qk_nope + v_head_dim): each head's K (its non-rotary part) and V
  o_proj      heads x v_head_dim -> hidden

The KV cache holds the latent and the rotary key: kv_lora_rank + qk_rope_head_dim values per token and
layer (576 for V3, 1,152 bytes in bf16, where per-head K and V would take 98 KB). vLLM does not split
the down-projections under tensor parallelism (DeepSeek's `fused_qkv_a_proj` is built with
`disable_tp`, vllm/model_executor/models/deepseek_v2.py), so every TP rank holds them, their norms and
the whole latent cache; q_b, kv_b and o split by heads.

Attention FLOPs per query head and key (vllm/v1/attention/backends/mla/common.py runs two paths):

  decode   kv_b is absorbed into the query and the output (W_UK, W_UV), so attention runs over the
           latent as multi-query attention with one (kv_lora + rope)-wide key and a kv_lora-wide
           value: 2 (kv_lora + rope) + 2 kv_lora FLOPs, on the cache's 576 values per key
  prefill  K and V are expanded per head (kv_b over the prompt's tokens, priced as a linear layer)
           and attention runs as usual with head_size-wide q/k and v_head_dim-wide v:
           2 head_size + 2 v_head_dim FLOPs

Left out: a prefill over a cached prefix (a later chunk, a prefix-cache hit) also expands the cached
tokens' latents through kv_b, chunk by chunk; that GEMM is not priced.
"""
from __future__ import annotations

from typing import Any


def attention_shapes(m: Any) -> tuple[tuple[int, int], ...]:
    """(outputs, inputs) of one layer's attention weights: the split ones (q_b or q, kv_b, o) first,
    then the ones every TP rank holds whole (`replicated_shapes`)."""
    h, heads, hd = m.hidden_size, m.num_heads, m.head_size
    nope = hd - m.qk_rope_head_dim
    q = ((heads * hd, m.q_lora_rank),) if m.q_lora_rank else ((heads * hd, h),)
    return (*q, (heads * (nope + m.v_head_dim), m.kv_lora_rank), (h, heads * m.v_head_dim)) + replicated_shapes(m)


def replicated_shapes(m: Any) -> tuple[tuple[int, int], ...]:
    """The down-projections vLLM keeps whole on every TP rank: q_a (with a q_lora_rank) and kv_a. (A DSA
    model's indexer, whole on every rank too, is its own role: ModelSpec.indexer_shapes.)"""
    kv_a = (m.kv_lora_rank + m.qk_rope_head_dim, m.hidden_size)
    return ((m.q_lora_rank, m.hidden_size), kv_a) if m.q_lora_rank else (kv_a,)


def norm_params(m: Any) -> int:
    """The norms inside one layer's attention: RMSNorms over the q latent and over the KV latent."""
    return m.q_lora_rank + m.kv_lora_rank


def cache_width(m: Any) -> int:
    """Values the KV cache holds per token and layer, on every TP rank: the latent and the rotary key."""
    return m.kv_lora_rank + m.qk_rope_head_dim


def decode_flops_per_key(m: Any) -> int:
    """FLOPs one query head spends on one cached key at decode (absorbed weights: MQA over the latent)."""
    return 2 * (m.kv_lora_rank + m.qk_rope_head_dim) + 2 * m.kv_lora_rank


def prefill_flops_per_pair(m: Any) -> int:
    """FLOPs one query head spends on one (query, key) pair in prefill (K and V expanded per head)."""
    return 2 * m.head_size + 2 * m.v_head_dim
