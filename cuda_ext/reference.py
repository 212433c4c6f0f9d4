"""Pure-torch reference of every paged-KV op (the ``torch`` backend).

These are written for clarity, not speed: they define what the compiled
kernels must compute, and tests hold the CPU and CUDA kernels to them. Like
vLLM's ops they write into the tensors they are given and return ``None``.

Layouts (``x = 16 // element_size``):
    key cache   [num_blocks, num_kv_heads, head_size // x, block_size, x]
    value cache [num_blocks, num_kv_heads, head_size, block_size]
"""

from __future__ import annotations

import torch

# Tokens per partition in paged_attention_v2 (the same constant as the kernels).
PARTITION_SIZE = 512


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter new keys/values ([num_tokens, num_kv_heads, head_size]) into their slots.

    ``slot = block_id * block_size + offset``; a slot of -1 (padding) is skipped.
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
    key_cache[blocks, :, :, offsets, :] = new_keys.to(key_cache.device, key_cache.dtype)
    value_cache[blocks, :, :, offsets] = value[keep].to(value_cache.device, value_cache.dtype)


def gather_kv(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_len: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's keys and values as contiguous [num_kv_heads, seq_len, head_size]."""
    num_kv_heads, block_size = key_cache.shape[1], key_cache.shape[3]
    head_size = value_cache.shape[2]
    num_blocks = (seq_len + block_size - 1) // block_size
    ids = block_table[:num_blocks].long()
    # [nb, H, d/x, bs, x] -> [H, nb, bs, d/x, x] -> [H, nb*bs, d]
    keys = key_cache[ids].permute(1, 0, 3, 2, 4).reshape(num_kv_heads, -1, head_size)
    # [nb, H, d, bs] -> [H, nb, bs, d] -> [H, nb*bs, d]
    values = value_cache[ids].permute(1, 0, 3, 2).reshape(num_kv_heads, -1, head_size)
    return keys[:, :seq_len], values[:, :seq_len]


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
) -> None:
    """Decode attention: one query token per sequence over its paged context.

    A sequence of length 0 gets a zero output (there is nothing to attend to).
    ``sinks`` (fp32 [num_heads], optional): a learned logit per head that joins
    the softmax as one more, value-less token (gpt-oss's attention sinks): it
    takes probability mass from the real tokens and contributes nothing.
    """
    num_heads = query.shape[1]
    for i, seq_len in enumerate(seq_lens.tolist()):
        if seq_len == 0:
            out[i].zero_()
            continue
        keys, values = gather_kv(key_cache, value_cache, block_tables[i], seq_len)
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
        keys, values = gather_kv(key_cache, value_cache, block_tables[i], seq_len)
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
    dst.index_copy_(0, dst_ids, src.index_select(0, src_ids).to(dst.device))
