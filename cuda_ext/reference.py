"""Pure-torch reference of every paged-KV op (the ``torch`` backend).

These are written for clarity, not speed: they define what the compiled
kernels must compute, and tests hold the CPU and CUDA kernels to them. Like
vLLM's ops they write into the tensors they are given and return ``None``.

Layouts (``x = 16 // element_size`` of the cache's elements: 16 for FP8):
    key cache   [num_blocks, num_kv_heads, head_size // x, block_size, x]
    value cache [num_blocks, num_kv_heads, head_size, block_size]

FP8 KV cache (vLLM's ``kv_cache_dtype="fp8"``): caches of dtype
``torch.float8_e4m3fn`` hold ``x / scale`` rounded to nearest-even and
saturated at +-448 (E4M3's largest finite value), one scale per tensor for the
keys (``k_scale``) and one for the values (``v_scale``), 1.0 unless calibrated
scales are given, as vLLM stores them (csrc/quantization/fp8/nvidia/quant_utils.cuh:
``__nv_cvt_float_to_fp8(x / scale, __NV_SATFINITE, __NV_E4M3)``); reading
widens an element to fp32 and multiplies it by its scale.
"""

from __future__ import annotations

import torch

# Tokens per partition in paged_attention_v2 (the same constant as the kernels).
PARTITION_SIZE = 512
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0          # E4M3's largest finite value (OCP FP8 spec; torch.finfo(torch.float8_e4m3fn).max)


def to_cache(x: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """Values as a cache of `dtype` stores them: an FP8 cache holds x / scale, rounded and saturated."""
    if dtype == FP8:
        return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return x.to(dtype)


def from_cache(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Cached values widened: an FP8 element times its scale, in fp32; other dtypes as they are."""
    return x.float() * scale if x.dtype == FP8 else x


def _bytes(cache: torch.Tensor) -> torch.Tensor:
    """The cache as raw bytes' worth of elements (some index ops have no FP8 kernel on the CPU)."""
    return cache.view(torch.uint8) if cache.dtype == FP8 else cache


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Scatter new keys/values ([num_tokens, num_kv_heads, head_size]) into their slots.

    ``slot = block_id * block_size + offset``; a slot of -1 (padding) is skipped.
    An FP8 cache stores them divided by ``k_scale`` / ``v_scale``.
    """
    num_kv_heads, head_size = key.shape[1], key.shape[2]
    block_size, x = key_cache.shape[3], key_cache.shape[4]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].to(key_cache.device)
    blocks, offsets = slots // block_size, slots % block_size
    keep = keep.to(key.device)
    new_keys = key[keep].view(-1, num_kv_heads, head_size // x, x)
    # Advanced indices separated by slices move to the front: the indexed view
    # is [n, num_kv_heads, head_size // x, x], matching new_keys.
    key_cache[blocks, :, :, offsets, :] = to_cache(new_keys.to(key_cache.device), key_cache.dtype, k_scale)
    value_cache[blocks, :, :, offsets] = to_cache(value[keep].to(value_cache.device), value_cache.dtype, v_scale)


def gather_kv(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_len: int,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's keys and values as contiguous [num_kv_heads, seq_len, head_size] (an FP8 cache's
    widened to fp32 and scaled)."""
    num_kv_heads, block_size = key_cache.shape[1], key_cache.shape[3]
    head_size = value_cache.shape[2]
    num_blocks = (seq_len + block_size - 1) // block_size
    ids = block_table[:num_blocks].long()
    # [nb, H, d/x, bs, x] -> [H, nb, bs, d/x, x] -> [H, nb*bs, d]
    keys = key_cache[ids].permute(1, 0, 3, 2, 4).reshape(num_kv_heads, -1, head_size)
    # [nb, H, d, bs] -> [H, nb, bs, d] -> [H, nb*bs, d]
    values = value_cache[ids].permute(1, 0, 3, 2).reshape(num_kv_heads, -1, head_size)
    return from_cache(keys[:, :seq_len], k_scale), from_cache(values[:, :seq_len], v_scale)


def _group_logits(query: torch.Tensor, keys: torch.Tensor, scale: float) -> torch.Tensor:
    """Scaled q.k in fp32 for GQA: query [num_heads, d], keys [num_kv_heads, L, d] -> [num_heads, L]."""
    num_heads, head_size = query.shape
    num_kv_heads = keys.shape[0]
    q = query.float().view(num_kv_heads, num_heads // num_kv_heads, head_size)
    return torch.einsum("hgd,hld->hgl", q, keys.float()).reshape(num_heads, -1) * scale


def _expand_values(values: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[num_kv_heads, L, d] -> [num_heads, L, d]: each kv head serves its group of query heads."""
    return values.float().repeat_interleave(num_heads // values.shape[0], dim=0)


def paged_attention_v1(
    out: torch.Tensor,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    num_kv_heads: int,
    scale: float,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
    max_seq_len: int,
    sinks: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Decode attention: one query token per sequence over its paged context.

    A sequence of length 0 gets a zero output (there is nothing to attend to).
    An FP8 cache's keys and values are read times ``k_scale`` / ``v_scale``.
    ``sinks`` (fp32 [num_heads], optional): a learned logit per head that joins
    the softmax as one more, value-less token (gpt-oss's attention sinks): it
    takes probability mass from the real tokens and contributes nothing.
    """
    num_heads = query.shape[1]
    for i, seq_len in enumerate(seq_lens.tolist()):
        if seq_len == 0:
            out[i].zero_()
            continue
        keys, values = gather_kv(key_cache, value_cache, block_tables[i], seq_len, k_scale, v_scale)
        logits = _group_logits(query[i], keys, scale)  # [num_heads, L]
        if sinks is not None:
            logits = torch.cat([logits, sinks.float().view(num_heads, 1)], dim=-1)
        probs = torch.softmax(logits, dim=-1)[:, :seq_len]  # the sink's share is dropped
        result = torch.einsum("hl,hld->hd", probs, _expand_values(values, num_heads))
        out[i].copy_(result.to(out.dtype))


def paged_attention_v2(
    out: torch.Tensor,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    num_kv_heads: int,
    scale: float,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
    max_seq_len: int,
    sinks: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Same result as v1, computed the way the v2 kernels do.

    The context is cut into PARTITION_SIZE-token partitions; each partition
    yields its max logit, its sum of exp(logit - max) and its own normalized
    output; a reduction rescales the partitions to the global max and takes
    their weighted mean. Written out here so the reduction itself is tested.
    A sink belongs to no partition: the reduction adds its exp(sink - max) to
    the denominator once.
    """
    num_heads = query.shape[1]
    for i, seq_len in enumerate(seq_lens.tolist()):
        if seq_len == 0:
            out[i].zero_()
            continue
        keys, values = gather_kv(key_cache, value_cache, block_tables[i], seq_len, k_scale, v_scale)
        logits = _group_logits(query[i], keys, scale)  # [num_heads, L]
        values = _expand_values(values, num_heads)  # [num_heads, L, d]
        maxes, sums, partials = [], [], []
        for start in range(0, seq_len, PARTITION_SIZE):
            part = logits[:, start : start + PARTITION_SIZE]
            part_max = part.max(dim=-1, keepdim=True).values
            weights = torch.exp(part - part_max)
            part_sum = weights.sum(dim=-1, keepdim=True)
            partial = torch.einsum("hl,hld->hd", weights / part_sum, values[:, start : start + PARTITION_SIZE])
            maxes.append(part_max)
            sums.append(part_sum)
            partials.append(partial)
        max_logits = torch.cat(maxes, dim=-1)  # [num_heads, P]
        global_max = max_logits.max(dim=-1, keepdim=True).values
        rescaled = torch.cat(sums, dim=-1) * torch.exp(max_logits - global_max)
        total = rescaled.sum(dim=-1, keepdim=True)
        if sinks is not None:
            total = total + torch.exp(sinks.float().view(num_heads, 1) - global_max)
        weights = rescaled / total
        result = torch.einsum("hp,phd->hd", weights, torch.stack(partials))
        out[i].copy_(result.to(out.dtype))


def copy_blocks(
    key_caches: list[torch.Tensor],
    value_caches: list[torch.Tensor],
    block_mapping: torch.Tensor,
) -> None:
    """Copy block src -> dst (rows of block_mapping [n, 2]) in every layer's key and value cache."""
    if block_mapping.numel() == 0:
        return
    for cache in list(key_caches) + list(value_caches):
        cache = _bytes(cache)
        mapping = block_mapping.to(cache.device)
        # index_copy_ gathers every source before writing, so a block that is
        # both a source and a destination is read before it is overwritten.
        cache.index_copy_(0, mapping[:, 1], cache.index_select(0, mapping[:, 0]))


def swap_blocks(src: torch.Tensor, dst: torch.Tensor, block_mapping: torch.Tensor) -> None:
    """Copy whole blocks src[i] -> dst[j] for each row (i, j), across devices if needed."""
    if block_mapping.numel() == 0:
        return
    src_ids = block_mapping[:, 0].to(src.device)
    dst_ids = block_mapping[:, 1].to(dst.device)
    _bytes(dst).index_copy_(0, dst_ids, _bytes(src).index_select(0, src_ids).to(dst.device))
