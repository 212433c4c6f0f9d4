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
   number of cached tokens: a "lower-right" causal mask);
3. runs decode attention with the paged-attention kernel.

Attention sinks (gpt-oss): a learned logit per head that joins every softmax
as one more token without a value, so a head can attend to "nothing". Decode
passes them to the kernels (which add exp(sink - max) to the softmax
denominator); prefill and the windowed decode rows use ``sink_attention``,
which writes the softmax out, because SDPA has no way to add a term to the
denominator.

The kernels are those of the tensors' device (``cuda_ext.ops_for``), looked up
per call so a CPU runner and a CUDA runner can share one process.

An FP8 cache (float8_e4m3fn, vLLM's ``--kv-cache-dtype fp8``) is written and
read by the kernels with the layer's per-tensor ``k_scale`` / ``v_scale`` (1.0,
as vLLM without calibrated scales); where prefill reads cached context it is
widened back to the model's dtype here. A prompt's own new keys and values
are attended to as computed, before rounding, and its cached context as
stored.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.bias import causal_lower_right

import cuda_ext

# paged_attention_v2 splits each context into partitions of this many tokens.
V2_PARTITION_SIZE = 512
# v1 keeps a whole context's logits in one thread block's shared memory; past
# this length vLLM always partitions (v1's occupancy drops, and near 56K
# tokens the shared memory runs out).
V1_MAX_SEQ_LEN = 8192


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
    # True when the runner has checked the block ids and slots of this step
    # once, so the kernels skip their per-layer value checks.
    checked: bool = False

    @property
    def num_prefills(self) -> int:
        return len(self.prefill_context_lens)


def gather_context(
    key_cache: torch.Tensor, value_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int,
    dtype: torch.dtype | None = None, k_scale: float = 1.0, v_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A sequence's first seq_len keys and values as [num_kv_heads, seq_len, head_size]; an FP8 cache's
    widened to `dtype` and multiplied by their scales."""
    block_size = key_cache.shape[3]
    num_kv_heads, head_size = value_cache.shape[1], value_cache.shape[2]
    blocks = block_table[: (seq_len + block_size - 1) // block_size].long()
    # key [nb, H, d/x, bs, x] -> [H, nb, bs, d/x, x]; value [nb, H, d, bs] -> [H, nb, bs, d]
    keys = key_cache[blocks].permute(1, 0, 3, 2, 4).reshape(num_kv_heads, -1, head_size)[:, :seq_len]
    values = value_cache[blocks].permute(1, 0, 3, 2).reshape(num_kv_heads, -1, head_size)[:, :seq_len]
    if key_cache.dtype == torch.float8_e4m3fn:
        keys, values = (keys.float() * k_scale).to(dtype), (values.float() * v_scale).to(dtype)
    return keys, values


def use_v2(device: torch.device, max_seq_len: int, num_seqs: int, num_heads: int) -> bool:
    """Whether decode should use the partitioned kernel: vLLM's rule on a GPU.

    v1 when ``max_seq_len <= 8192`` and either one partition covers every
    context or there are more than 512 (sequence, head) pairs to fill the GPU
    with; v2 otherwise. On the CPU the kernels already parallelize over
    sequences and heads and keep logits in heap memory, so the extra reduction
    is pure overhead and v1 is always chosen there.
    """
    if device.type != "cuda":
        return False
    max_partitions = (max_seq_len + V2_PARTITION_SIZE - 1) // V2_PARTITION_SIZE
    v1 = max_seq_len <= V1_MAX_SEQ_LEN and (max_partitions == 1 or num_seqs * num_heads > 512)
    return not v1


def window_mask(new: int, total: int, window: int | None, device) -> torch.Tensor:
    """Bool [new, total]: query j (at position total - new + j) sees key i when i <= its position
    and, with a sliding window, i > its position - window (the window counts the token itself)."""
    rows = torch.arange(total - new, total, device=device)[:, None]
    cols = torch.arange(total, device=device)[None, :]
    mask = cols <= rows
    if window is not None:
        mask &= cols > rows - window
    return mask


def prefix_prefill_attention(query, key, value, scale: float, window: int | None = None) -> torch.Tensor:
    """Attention of ``new`` query tokens over ``context + new`` keys, causal from the lower right.

    query [H, new, d]; key/value [H_kv, context + new, d] -> [H, new, d].
    On CUDA the lower-right causal bias keeps SDPA on its flash or
    memory-efficient kernel; an explicit mask (or GQA with a mask) would send
    it to the MATH kernel, whose memory is quadratic in the context. Those
    kernels want equal head counts, so grouped K/V heads are expanded first
    (memory linear in the context). On the CPU, and for a sliding window, a
    boolean mask is used.
    """
    num_heads, new = query.shape[0], query.shape[1]
    total = key.shape[1]
    if num_heads != key.shape[0]:
        group = num_heads // key.shape[0]
        key, value = key.repeat_interleave(group, dim=0), value.repeat_interleave(group, dim=0)
    if query.device.type == "cuda" and (window is None or window >= total):
        mask = causal_lower_right(new, total)
    else:
        mask = window_mask(new, total, window, query.device)
    return F.scaled_dot_product_attention(query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0),
                                          attn_mask=mask, scale=scale)[0]


# sink_attention works on query rows in chunks whose fp32 logits fit in this many bytes.
SINK_LOGITS_BYTES = 256 << 20


def sink_attention(query, key, value, scale: float, mask: torch.Tensor | None, sinks: torch.Tensor) -> torch.Tensor:
    """Attention whose softmax also counts one value-less sink logit per head.

    query [H, n, d]; key/value [H_kv, L, d]; mask bool [n, L] (True = may
    attend) or None; sinks [H] -> [H, n, d]. Logits are computed in the
    inputs' dtype and the softmax in fp32, as transformers' eager gpt-oss
    attention does. The logits are materialized, so query rows go in chunks
    of at most SINK_LOGITS_BYTES of them: a long prompt costs time, not
    memory quadratic in its length.
    """
    num_heads, new, context = query.shape[0], query.shape[1], key.shape[1]
    if num_heads != key.shape[0]:
        group = num_heads // key.shape[0]
        key, value = key.repeat_interleave(group, dim=0), value.repeat_interleave(group, dim=0)
    sink_column = sinks.float().view(num_heads, 1, 1)
    rows = max(1, SINK_LOGITS_BYTES // (4 * num_heads * (context + 1)))
    out = torch.empty_like(query)
    for start in range(0, new, rows):
        end = min(start + rows, new)
        logits = torch.matmul(query[:, start:end], key.transpose(1, 2)).float() * scale   # [H, rows, L]
        if mask is not None:
            logits = logits.masked_fill(~mask[start:end], float("-inf"))
        logits = torch.cat([logits, sink_column.expand(num_heads, end - start, 1)], dim=-1)
        probs = torch.softmax(logits, dim=-1)[..., :-1]   # the sink's share is dropped
        out[:, start:end] = torch.matmul(probs.to(value.dtype), value)
    return out


class PagedAttention(nn.Module):
    """Multi-head / grouped-query attention of one layer over the paged cache (no weights)."""

    def __init__(self, num_heads: int, head_size: int, num_kv_heads: int, scale: float,
                 sliding_window: int | None = None):
        super().__init__()
        assert num_heads % num_kv_heads == 0, "query heads must be a multiple of kv heads"
        self.num_heads, self.head_size, self.num_kv_heads = num_heads, head_size, num_kv_heads
        self.scale = scale
        # Mistral-style local attention: a token sees itself and the window - 1 tokens before it.
        self.sliding_window = sliding_window
        # An FP8 cache's per-tensor scales (vLLM's layer._k_scale / _v_scale): 1.0 without calibrated ones.
        self.k_scale = self.v_scale = 1.0

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor] | None,
        meta: AttentionMetadata,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """query [T, num_heads*d], key/value [T, num_kv_heads*d] -> [T, num_heads*d].

        ``kv_cache`` None is the memory-profiling pass: nothing is stored and
        every sequence must be a prefill without cached context. ``sinks``
        [num_heads]: the layer's attention-sink logits, or None.
        """
        num_tokens = query.shape[0]
        query = query.view(num_tokens, self.num_heads, self.head_size)
        key = key.view(num_tokens, self.num_kv_heads, self.head_size)
        value = value.view(num_tokens, self.num_kv_heads, self.head_size)
        ops = cuda_ext.ops_for(query.device)
        if kv_cache is not None:
            kv = self._kv_arguments(kv_cache)
            ops.reshape_and_cache(key, value, kv_cache[0], kv_cache[1], meta.slot_mapping, **kv,
                                  check_values=not meta.checked)
        out = torch.empty_like(query)
        num_prefill = meta.num_prefill_tokens
        if sinks is not None:
            sinks = sinks.float().contiguous()   # the kernels take fp32 sinks whatever the model's dtype
        if meta.num_prefills:
            self._prefill(query, key, value, kv_cache, meta, out, sinks)
        if num_prefill < num_tokens:
            assert kv_cache is not None, "decode needs the KV cache"
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
                sinks=sinks,
                **kv,
                check_values=not meta.checked,
            )
            if self.sliding_window is not None and meta.decode_max_seq_len > self.sliding_window:
                self._windowed_decode(query[num_prefill:], kv_cache, meta, out[num_prefill:], sinks)
        return out.view(num_tokens, self.num_heads * self.head_size)

    def _kv_arguments(self, kv_cache) -> dict:
        """The kernels' kv_cache_dtype and scales for this layer's cache (vLLM's names)."""
        fp8 = kv_cache[0].dtype == torch.float8_e4m3fn
        return {"kv_cache_dtype": "fp8" if fp8 else "auto", "k_scale": self.k_scale, "v_scale": self.v_scale}

    def _gather(self, kv_cache, block_table: torch.Tensor, seq_len: int, dtype: torch.dtype):
        return gather_context(kv_cache[0], kv_cache[1], block_table, seq_len, dtype, self.k_scale, self.v_scale)

    def _prefill(self, query, key, value, kv_cache, meta: AttentionMetadata, out: torch.Tensor,
                 sinks: torch.Tensor | None = None) -> None:
        cu = meta.prefill_cu_seqlens
        gqa = self.num_kv_heads != self.num_heads
        for i, context_len in enumerate(meta.prefill_context_lens):
            start, end = cu[i], cu[i + 1]
            q = query[start:end].transpose(0, 1)  # [H, n, d]
            total = context_len + end - start
            window = self.sliding_window if self.sliding_window is not None and total > self.sliding_window else None
            if context_len == 0:
                # The whole sequence is new: its K/V are right here, no gather.
                k, v = key[start:end].transpose(0, 1), value[start:end].transpose(0, 1)
            else:
                assert kv_cache is not None, "a cached prefix needs the KV cache"
                k, v = self._gather(kv_cache, meta.prefill_block_tables[i], total, q.dtype)
            if sinks is not None:
                result = sink_attention(q, k, v, self.scale, window_mask(end - start, total, window, q.device), sinks)
            elif context_len == 0 and window is None:
                result = F.scaled_dot_product_attention(
                    q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), is_causal=True, scale=self.scale,
                    enable_gqa=gqa)[0]
            else:
                result = prefix_prefill_attention(q, k, v, self.scale, window)
            out[start:end] = result.transpose(0, 1)

    def _windowed_decode(self, query, kv_cache, meta: AttentionMetadata, out: torch.Tensor,
                         sinks: torch.Tensor | None = None) -> None:
        """Redo the decode rows whose context is longer than the sliding window, over its last tokens only.

        The paged kernels attend to a whole context; a window that starts
        inside a block cannot be expressed by trimming the block table, so
        these rows gather their window and run SDPA (one small call per row).
        """
        window = self.sliding_window
        for row, seq_len in enumerate(meta.decode_seq_lens.tolist()):
            if seq_len <= window:
                continue
            k, v = self._gather(kv_cache, meta.decode_block_tables[row], seq_len, query.dtype)
            k, v = k[:, seq_len - window:], v[:, seq_len - window:]
            q = query[row].unsqueeze(1)   # [H, 1, d]
            if sinks is not None:
                out[row] = sink_attention(q, k, v, self.scale, None, sinks)[:, 0]
                continue
            result = F.scaled_dot_product_attention(
                q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), scale=self.scale,
                enable_gqa=self.num_kv_heads != self.num_heads)[0]
            out[row] = result[:, 0]
