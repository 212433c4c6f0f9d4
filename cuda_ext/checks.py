"""Argument checks shared by every backend.

The compiled kernels trust shapes, strides and block ids; a wrong one would
read out of bounds or silently produce garbage. So every public op validates
its arguments here first and raises a one-line ValueError naming what is wrong.
Checks that need the *values* of index tensors (block ids, slots, lengths) run
only when those tensors live on the CPU, so a CUDA call never forces a sync.
"""

from __future__ import annotations

import numpy as np
import torch

from engine.core.config import SUPPORTED_BLOCK_SIZES

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# The compiled attention kernels are instantiated for these sizes only.
COMPILED_BLOCK_SIZES = SUPPORTED_BLOCK_SIZES
CUDA_HEAD_SIZES = (64, 80, 96, 112, 128, 256)


def _fail(message: str) -> None:
    raise ValueError(message)


def _require(condition: bool, message: str) -> None:
    if not condition:
        _fail(message)


def _require_int_tensor(name: str, tensor: torch.Tensor, dtype: torch.dtype, ndim: int) -> None:
    _require(isinstance(tensor, torch.Tensor), f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    _require(tensor.dtype == dtype, f"{name} must be {dtype}, got {tensor.dtype}")
    _require(tensor.dim() == ndim, f"{name} must have {ndim} dims, got shape {tuple(tensor.shape)}")


def check_kv_cache(key_cache: torch.Tensor, value_cache: torch.Tensor) -> None:
    """The cache pair has the documented layout, with x = 16 // element_size."""
    _require(key_cache.dim() == 5, f"key_cache must be [num_blocks, num_kv_heads, head_size//x, block_size, x], got shape {tuple(key_cache.shape)}")
    _require(value_cache.dim() == 4, f"value_cache must be [num_blocks, num_kv_heads, head_size, block_size], got shape {tuple(value_cache.shape)}")
    _require(key_cache.dtype in SUPPORTED_DTYPES, f"cache dtype must be one of float32/float16/bfloat16, got {key_cache.dtype}")
    _require(key_cache.dtype == value_cache.dtype, f"key_cache dtype {key_cache.dtype} != value_cache dtype {value_cache.dtype}")
    _require(key_cache.device == value_cache.device, f"key_cache on {key_cache.device} but value_cache on {value_cache.device}")
    x = 16 // key_cache.element_size()
    num_blocks, num_kv_heads, d_over_x, block_size, key_x = key_cache.shape
    _require(key_x == x, f"key_cache last dim must be x = 16 // element_size = {x} for {key_cache.dtype}, got {key_x}")
    expected_value = (num_blocks, num_kv_heads, d_over_x * x, block_size)
    _require(tuple(value_cache.shape) == expected_value, f"value_cache shape {tuple(value_cache.shape)} does not match key_cache (expected {expected_value})")
    _require(key_cache.is_contiguous() and value_cache.is_contiguous(), "key_cache and value_cache must be contiguous")


def check_paged_attention(
    out: torch.Tensor,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    num_kv_heads: int,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
    max_seq_len: int,
) -> None:
    check_kv_cache(key_cache, value_cache)
    num_blocks, cache_kv_heads, _, cache_block_size, _ = key_cache.shape
    head_size = value_cache.shape[2]
    _require(query.dim() == 3, f"query must be [num_seqs, num_heads, head_size], got shape {tuple(query.shape)}")
    num_seqs, num_heads, query_head_size = query.shape
    _require(tuple(out.shape) == tuple(query.shape), f"out shape {tuple(out.shape)} != query shape {tuple(query.shape)}")
    _require(out.is_contiguous(), "out must be contiguous (the kernels write it in place)")
    _require(query.dtype == out.dtype == key_cache.dtype, f"query ({query.dtype}), out ({out.dtype}) and the caches ({key_cache.dtype}) must share one dtype")
    _require(query.device == out.device == key_cache.device, "query, out and the caches must be on one device")
    _require(query_head_size == head_size, f"query head_size {query_head_size} != cache head_size {head_size}")
    _require(num_kv_heads == cache_kv_heads, f"num_kv_heads={num_kv_heads} but the cache holds {cache_kv_heads} kv heads")
    _require(num_kv_heads > 0 and num_heads % num_kv_heads == 0, f"num_heads={num_heads} must be a multiple of num_kv_heads={num_kv_heads}")
    _require(block_size == cache_block_size, f"block_size={block_size} but the cache's block size is {cache_block_size}")
    _require_int_tensor("block_tables", block_tables, torch.int32, 2)
    _require_int_tensor("seq_lens", seq_lens, torch.int32, 1)
    _require(block_tables.shape[0] == num_seqs, f"block_tables has {block_tables.shape[0]} rows for {num_seqs} sequences")
    _require(seq_lens.shape[0] == num_seqs, f"seq_lens has {seq_lens.shape[0]} entries for {num_seqs} sequences")
    _require(block_tables.device == seq_lens.device == query.device, "block_tables and seq_lens must be on the query's device")
    _require(max_seq_len >= 0, f"max_seq_len must be >= 0, got {max_seq_len}")
    if seq_lens.device.type == "cpu" and num_seqs > 0:
        # numpy views (no copy): these run on every decode step of every layer,
        # and numpy's small-array reductions cost a fraction of torch's.
        lens = seq_lens.numpy()
        longest = int(lens.max())
        _require(int(lens.min()) >= 0, "seq_lens must be >= 0")
        _require(longest <= max_seq_len, f"a sequence of length {longest} exceeds max_seq_len={max_seq_len}")
        capacity = block_tables.shape[1] * block_size
        _require(longest <= capacity, f"a sequence of length {longest} needs more blocks than block_tables holds ({block_tables.shape[1]} x {block_size})")
        # Only the blocks a sequence actually uses must be valid ids; the tail
        # of a block table row is padding and may hold anything.
        blocks_used = (lens.astype(np.int64) + block_size - 1) // block_size
        used_ids = block_tables.numpy()[np.arange(block_tables.shape[1]) < blocks_used[:, None]]
        if used_ids.size:
            _require(int(used_ids.min()) >= 0 and int(used_ids.max()) < num_blocks, f"block_tables holds a block id outside [0, {num_blocks})")


def check_backend_device(backend: str, tensor: torch.Tensor) -> None:
    """The compiled kernels run on one kind of device; say so instead of failing deep in C++."""
    if backend == "cpu":
        _require(tensor.device.type == "cpu", f"the cpu kernels got {tensor.device} tensors; use load_ops('torch') or the cuda backend (see cuda_ext.describe())")
    elif backend == "cuda":
        _require(tensor.device.type == "cuda", f"the cuda kernels got {tensor.device} tensors; move them to the GPU or use load_ops('cpu')")


def check_compiled_shapes(backend: str, block_size: int, head_size: int) -> None:
    """Block and head sizes the compiled kernels were instantiated for (the torch reference takes any)."""
    if backend == "torch":
        return
    _require(block_size in COMPILED_BLOCK_SIZES, f"the {backend} kernels support block_size in {COMPILED_BLOCK_SIZES}, got {block_size}")
    if backend == "cuda":
        _require(head_size in CUDA_HEAD_SIZES, f"the cuda kernels support head_size in {CUDA_HEAD_SIZES}, got {head_size}")


def check_reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    check_kv_cache(key_cache, value_cache)
    num_blocks, num_kv_heads, _, block_size, _ = key_cache.shape
    head_size = value_cache.shape[2]
    _require(key.dim() == 3, f"key must be [num_tokens, num_kv_heads, head_size], got shape {tuple(key.shape)}")
    _require(tuple(value.shape) == tuple(key.shape), f"value shape {tuple(value.shape)} != key shape {tuple(key.shape)}")
    _require(tuple(key.shape[1:]) == (num_kv_heads, head_size), f"key is [*, {key.shape[1]}, {key.shape[2]}] but the cache holds [*, {num_kv_heads}, {head_size}]")
    _require(key.dtype == value.dtype == key_cache.dtype, f"key ({key.dtype}), value ({value.dtype}) and the caches ({key_cache.dtype}) must share one dtype")
    _require(key.device == value.device == key_cache.device, "key, value and the caches must be on one device")
    _require_int_tensor("slot_mapping", slot_mapping, torch.int64, 1)
    _require(slot_mapping.shape[0] == key.shape[0], f"slot_mapping has {slot_mapping.shape[0]} entries for {key.shape[0]} tokens")
    _require(slot_mapping.device == key.device, "slot_mapping must be on the key's device")
    if slot_mapping.device.type == "cpu" and slot_mapping.numel():
        _require(int(slot_mapping.min()) >= -1, "slot_mapping entries must be >= -1 (-1 means skip)")
        _require(int(slot_mapping.max()) < num_blocks * block_size, f"slot_mapping holds a slot >= num_blocks * block_size = {num_blocks * block_size}")


def _check_block_mapping(block_mapping: torch.Tensor, num_src: int, num_dst: int) -> None:
    _require_int_tensor("block_mapping", block_mapping, torch.int64, 2)
    _require(block_mapping.shape[1] == 2, f"block_mapping must be [n, 2] (src, dst), got shape {tuple(block_mapping.shape)}")
    if block_mapping.device.type == "cpu" and block_mapping.numel():
        _require(int(block_mapping.min()) >= 0, "block_mapping holds a negative block id")
        _require(int(block_mapping[:, 0].max()) < num_src, f"block_mapping holds a source block id >= {num_src}")
        _require(int(block_mapping[:, 1].max()) < num_dst, f"block_mapping holds a destination block id >= {num_dst}")


def check_copy_blocks(key_caches: list[torch.Tensor], value_caches: list[torch.Tensor], block_mapping: torch.Tensor) -> None:
    _require(len(key_caches) == len(value_caches), f"{len(key_caches)} key caches but {len(value_caches)} value caches")
    _require(len(key_caches) > 0, "copy_blocks needs at least one layer")
    for layer, (key_cache, value_cache) in enumerate(zip(key_caches, value_caches)):
        check_kv_cache(key_cache, value_cache)
        _require(key_cache.shape == key_caches[0].shape and key_cache.dtype == key_caches[0].dtype, f"layer {layer}'s cache differs in shape or dtype from layer 0's")
        _require(key_cache.device == key_caches[0].device, f"layer {layer}'s cache is on another device than layer 0's")
    _check_block_mapping(block_mapping, key_caches[0].shape[0], key_caches[0].shape[0])
    if block_mapping.device.type == "cpu" and block_mapping.numel():
        # The kernels copy all pairs in parallel, so a block that is written
        # and also read (or written twice) would give an order-dependent result.
        sources, destinations = block_mapping[:, 0].tolist(), block_mapping[:, 1].tolist()
        _require(len(set(destinations)) == len(destinations), "block_mapping writes the same destination block twice")
        _require(not set(sources) & set(destinations), "block_mapping uses a block as both source and destination")


def check_swap_blocks(src: torch.Tensor, dst: torch.Tensor, block_mapping: torch.Tensor) -> None:
    _require(src.dtype == dst.dtype, f"src dtype {src.dtype} != dst dtype {dst.dtype}")
    _require(tuple(src.shape[1:]) == tuple(dst.shape[1:]), f"src blocks {tuple(src.shape[1:])} differ from dst blocks {tuple(dst.shape[1:])}")
    _require(src.is_contiguous() and dst.is_contiguous(), "src and dst must be contiguous")
    _require(block_mapping.device.type == "cpu", "block_mapping must be a CPU tensor (it is read on the host)")
    _check_block_mapping(block_mapping, src.shape[0], dst.shape[0])
    destinations = block_mapping[:, 1].tolist()
    _require(len(set(destinations)) == len(destinations), "block_mapping writes the same destination block twice")
