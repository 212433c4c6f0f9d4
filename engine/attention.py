"""Attention over a packed batch whose keys and values live in the paged KV cache.

A step's tokens are packed with no padding: first every prefill sequence's
new tokens (a prompt, or the uncached rest of one), then one token per decode
sequence. Each layer

1. writes the step's new keys/values into their cache slots
   (``ops.reshape_and_cache``) before anything reads the cache, so a prefill
   that continues a cached prefix and every decode find their own token there;
2. runs prefill attention per sequence with torch's scaled_dot_product_attention
   (on the new K/V directly when nothing was cached, otherwise on the sequence's
   whole context gathered from the cache, with a causal mask shifted by the
   number of cached tokens);
3. runs decode attention with the paged-attention kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

import cuda_ext

# paged_attention_v2 splits each context into partitions of this many tokens.
V2_PARTITION_SIZE = 512


@dataclass
class AttentionMetadata:
    """Where each token of the packed batch goes in the cache and what it attends to.

    Built once per step by the model runner and shared by every layer.
    """

    slot_mapping: torch.Tensor  # int64 [num_tokens]: cache slot of each new token, -1 = do not store
    num_prefill_tokens: int  # the packed batch's first tokens belong to prefills
    # Prefill part, in Python ints because the loop over sequences runs on the host.
    prefill_cu_seqlens: list[int]  # query start offsets, len = num_prefills + 1
    prefill_context_lens: list[int]  # tokens of each sequence already in the cache
    prefill_block_tables: torch.Tensor | None  # int32 [num_prefills, max_blocks] on the device
    # Decode part.
    decode_block_tables: torch.Tensor | None  # int32 [num_decodes, max_blocks]
    decode_seq_lens: torch.Tensor | None  # int32 [num_decodes]: context length including the new token
    decode_max_seq_len: int = 0
    # Causal masks of prefills that continue a cached prefix, built by the
    # first layer and reused by the others.
    _masks: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)

    @property
    def num_prefills(self) -> int:
        return len(self.prefill_context_lens)

    def prefix_mask(self, i: int, device: torch.device) -> torch.Tensor:
        """Bool [new, context + new] for prefill i: query j (at position context + j) sees keys 0..context + j."""
        if i not in self._masks:
            context = self.prefill_context_lens[i]
            new = self.prefill_cu_seqlens[i + 1] - self.prefill_cu_seqlens[i]
            self._masks[i] = torch.ones(new, context + new, dtype=torch.bool, device=device).tril(context)
        return self._masks[i]


def gather_context(
    key_cache: torch.Tensor, value_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A sequence's first seq_len keys and values as [num_kv_heads, seq_len, head_size]."""
    block_size = key_cache.shape[3]
    num_kv_heads, head_size = value_cache.shape[1], value_cache.shape[2]
    blocks = block_table[: (seq_len + block_size - 1) // block_size].long()
    # key [nb, H, d/x, bs, x] -> [H, nb, bs, d/x, x]; value [nb, H, d, bs] -> [H, nb, bs, d]
    keys = key_cache[blocks].permute(1, 0, 3, 2, 4).reshape(num_kv_heads, -1, head_size)
    values = value_cache[blocks].permute(1, 0, 3, 2).reshape(num_kv_heads, -1, head_size)
    return keys[:, :seq_len], values[:, :seq_len]


def use_v2(device: torch.device, max_seq_len: int, num_seqs: int, num_heads: int) -> bool:
    """Whether decode should use the partitioned kernel.

    v2 only pays off on a GPU when there are too few (sequence, head) pairs to
    fill it and contexts are long enough to split (the same rule vLLM uses).
    On the CPU the kernels already parallelize over sequences and heads, and
    the extra reduction is pure overhead, so v1 is always chosen there.
    """
    if device.type != "cuda" or max_seq_len <= V2_PARTITION_SIZE:
        return False
    return num_seqs * num_heads <= 512


class PagedAttention(nn.Module):
    """Multi-head / grouped-query attention of one layer over the paged cache (no weights)."""

    def __init__(self, num_heads: int, head_size: int, num_kv_heads: int, scale: float):
        super().__init__()
        assert num_heads % num_kv_heads == 0, "query heads must be a multiple of kv heads"
        self.num_heads, self.head_size, self.num_kv_heads = num_heads, head_size, num_kv_heads
        self.scale = scale

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor] | None,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """query [T, num_heads*d], key/value [T, num_kv_heads*d] -> [T, num_heads*d].

        ``kv_cache`` None is the memory-profiling pass: nothing is stored and
        every sequence must be a prefill without cached context.
        """
        num_tokens = query.shape[0]
        query = query.view(num_tokens, self.num_heads, self.head_size)
        key = key.view(num_tokens, self.num_kv_heads, self.head_size)
        value = value.view(num_tokens, self.num_kv_heads, self.head_size)
        if kv_cache is not None:
            # Looked up per call (not bound at import) so the kernel backend can
            # be chosen or switched after this module is imported.
            cuda_ext.ops.reshape_and_cache(key, value, kv_cache[0], kv_cache[1], meta.slot_mapping)
        out = torch.empty_like(query)
        num_prefill = meta.num_prefill_tokens
        if meta.num_prefills:
            self._prefill(query, key, value, kv_cache, meta, out)
        if num_prefill < num_tokens:
            assert kv_cache is not None, "decode needs the KV cache"
            ops = cuda_ext.ops
            v2 = use_v2(query.device, meta.decode_max_seq_len, num_tokens - num_prefill, self.num_heads)
            decode = ops.paged_attention_v2 if v2 else ops.paged_attention_v1
            decode(
                out[num_prefill:],
                query[num_prefill:],
                kv_cache[0],
                kv_cache[1],
                self.num_kv_heads,
                self.scale,
                meta.decode_block_tables,
                meta.decode_seq_lens,
                kv_cache[0].shape[3],
                meta.decode_max_seq_len,
            )
        return out.view(num_tokens, self.num_heads * self.head_size)

    def _prefill(self, query, key, value, kv_cache, meta: AttentionMetadata, out: torch.Tensor) -> None:
        cu = meta.prefill_cu_seqlens
        for i, context_len in enumerate(meta.prefill_context_lens):
            start, end = cu[i], cu[i + 1]
            q = query[start:end].transpose(0, 1)  # [H, n, d]
            if context_len == 0:
                # The whole sequence is new: its K/V are right here, no gather.
                k, v = key[start:end].transpose(0, 1), value[start:end].transpose(0, 1)
                mask, causal = None, True
            else:
                assert kv_cache is not None, "a cached prefix needs the KV cache"
                total = context_len + end - start
                k, v = gather_context(kv_cache[0], kv_cache[1], meta.prefill_block_tables[i], total)
                mask, causal = meta.prefix_mask(i, q.device), False
            result = F.scaled_dot_product_attention(
                q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0),
                attn_mask=mask, is_causal=causal, scale=self.scale,
                enable_gqa=self.num_kv_heads != self.num_heads,
            )
            out[start:end] = result[0].transpose(0, 1)
