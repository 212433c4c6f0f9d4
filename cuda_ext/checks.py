"""Argument checks shared by every backend.

The compiled kernels trust shapes, strides and block ids; a wrong one would
read out of bounds or silently produce garbage. So every public op validates
its arguments here first and raises a one-line ValueError naming what is wrong.
Messages are formatted only when a check fails (the checks run on every op
call, per layer and step). Checks that need the *values* of index tensors (block ids, slots, lengths) run
only when those tensors live on the CPU, so a CUDA call never forces a sync.
"""

from __future__ import annotations

import math

import numpy as np
import torch


SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# An FP8 KV cache (vLLM's kv_cache_dtype "fp8", E4M3 on CUDA) holds any of them in one byte per element.
FP8_CACHE_DTYPE = torch.float8_e4m3fn
CACHE_DTYPES = (*SUPPORTED_DTYPES, FP8_CACHE_DTYPE)
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")
# The compiled attention kernels are instantiated for these sizes only.
# The block sizes the kernels are instantiated for (the dispatch in csrc/); the engine's
# SUPPORTED_BLOCK_SIZES repeats them for the torch-free core (tests/test_kernels.py holds them equal).
COMPILED_BLOCK_SIZES = (8, 16, 32)
CUDA_HEAD_SIZES = (64, 80, 96, 112, 128, 256)


def _fail(message: str) -> None:
    raise ValueError(message)


def _require_int_tensor(name: str, tensor: torch.Tensor, dtype: torch.dtype, ndim: int) -> None:
    if not isinstance(tensor, torch.Tensor):
        _fail(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype != dtype:
        _fail(f"{name} must be {dtype}, got {tensor.dtype}")
    if tensor.dim() != ndim:
        _fail(f"{name} must have {ndim} dims, got shape {tuple(tensor.shape)}")


def check_kv_cache(key_cache: torch.Tensor, value_cache: torch.Tensor) -> None:
    """The cache pair has the documented layout, with x = 16 // element_size."""
    if key_cache.dim() != 5:
        _fail(f"key_cache must be [num_blocks, num_kv_heads, head_size//x, block_size, x], got shape {tuple(key_cache.shape)}")
    if value_cache.dim() != 4:
        _fail(f"value_cache must be [num_blocks, num_kv_heads, head_size, block_size], got shape {tuple(value_cache.shape)}")
    if key_cache.dtype not in CACHE_DTYPES:
        _fail(f"cache dtype must be one of float32/float16/bfloat16/float8_e4m3fn, got {key_cache.dtype}")
    if key_cache.dtype != value_cache.dtype:
        _fail(f"key_cache dtype {key_cache.dtype} != value_cache dtype {value_cache.dtype}")
    if key_cache.device != value_cache.device:
        _fail(f"key_cache on {key_cache.device} but value_cache on {value_cache.device}")
    x = 16 // key_cache.element_size()
    num_blocks, num_kv_heads, d_over_x, block_size, key_x = key_cache.shape
    if key_x != x:
        _fail(f"key_cache last dim must be x = 16 // element_size = {x} for {key_cache.dtype}, got {key_x}")
    expected_value = (num_blocks, num_kv_heads, d_over_x * x, block_size)
    if tuple(value_cache.shape) != expected_value:
        _fail(f"value_cache shape {tuple(value_cache.shape)} does not match key_cache (expected {expected_value})")
    if not (key_cache.is_contiguous() and value_cache.is_contiguous()):
        _fail("key_cache and value_cache must be contiguous")


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
    check_values: bool = True,
) -> None:
    check_kv_cache(key_cache, value_cache)
    _check_query(out, query, key_cache, value_cache, num_kv_heads, block_size)
    num_seqs = query.shape[0]
    _check_seq_tensors(block_tables, seq_lens, num_seqs, query.device, max_seq_len)
    if check_values and seq_lens.device.type == "cpu" and num_seqs > 0:
        _check_seq_values(block_tables, seq_lens, block_size, max_seq_len, key_cache.shape[0])


def _check_query(out: torch.Tensor, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 num_kv_heads: int, block_size: int) -> None:
    """The query and output match the cache: shape, dtype, device, heads, block size."""
    _, cache_kv_heads, _, cache_block_size, _ = key_cache.shape
    head_size = value_cache.shape[2]
    if query.dim() != 3:
        _fail(f"query must be [num_seqs, num_heads, head_size], got shape {tuple(query.shape)}")
    _, num_heads, query_head_size = query.shape
    if tuple(out.shape) != tuple(query.shape):
        _fail(f"out shape {tuple(out.shape)} != query shape {tuple(query.shape)}")
    if not out.is_contiguous():
        _fail("out must be contiguous (the kernels write it in place)")
    if not (query.dtype == out.dtype and key_cache.dtype in (query.dtype, FP8_CACHE_DTYPE)):
        _fail(f"query ({query.dtype}), out ({out.dtype}) and the caches ({key_cache.dtype}) must share one dtype "
              f"(or the caches be float8_e4m3fn)")
    if query.dtype not in SUPPORTED_DTYPES:
        _fail(f"query dtype must be one of float32/float16/bfloat16, got {query.dtype}")
    if not (query.device == out.device == key_cache.device):
        _fail("query, out and the caches must be on one device")
    if query_head_size != head_size:
        _fail(f"query head_size {query_head_size} != cache head_size {head_size}")
    if num_kv_heads != cache_kv_heads:
        _fail(f"num_kv_heads={num_kv_heads} but the cache holds {cache_kv_heads} kv heads")
    if not (num_kv_heads > 0 and num_heads % num_kv_heads == 0):
        _fail(f"num_heads={num_heads} must be a multiple of num_kv_heads={num_kv_heads}")
    if block_size != cache_block_size:
        _fail(f"block_size={block_size} but the cache's block size is {cache_block_size}")


def _check_seq_tensors(block_tables: torch.Tensor, seq_lens: torch.Tensor, num_seqs: int,
                       device: torch.device, max_seq_len: int) -> None:
    """Block tables and lengths: int32, one row per sequence, on the query's device."""
    _require_int_tensor("block_tables", block_tables, torch.int32, 2)
    _require_int_tensor("seq_lens", seq_lens, torch.int32, 1)
    if block_tables.shape[0] != num_seqs:
        _fail(f"block_tables has {block_tables.shape[0]} rows for {num_seqs} sequences")
    if seq_lens.shape[0] != num_seqs:
        _fail(f"seq_lens has {seq_lens.shape[0]} entries for {num_seqs} sequences")
    if not (block_tables.device == seq_lens.device == device):
        _fail("block_tables and seq_lens must be on the query's device")
    if not (max_seq_len >= 0):
        _fail(f"max_seq_len must be >= 0, got {max_seq_len}")


def _check_seq_values(block_tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int, max_seq_len: int,
                      num_blocks: int) -> None:
    """The values of host-side lengths and block ids: each length fits ``max_seq_len``
    and its row of the block table, and every block a sequence uses exists."""
    # numpy views (no copy): these run on every decode step of every layer,
    # and numpy's small-array reductions cost a fraction of torch's.
    lens = seq_lens.numpy()
    longest = int(lens.max())
    if not (int(lens.min()) >= 0):
        _fail("seq_lens must be >= 0")
    if not (longest <= max_seq_len):
        _fail(f"a sequence of length {longest} exceeds max_seq_len={max_seq_len}")
    capacity = block_tables.shape[1] * block_size
    if not (longest <= capacity):
        _fail(f"a sequence of length {longest} needs more blocks than block_tables holds ({block_tables.shape[1]} x {block_size})")
    # Only the blocks a sequence actually uses must be valid ids; the tail
    # of a block table row is padding and may hold anything.
    blocks_used = (lens.astype(np.int64) + block_size - 1) // block_size
    used_ids = block_tables.numpy()[np.arange(block_tables.shape[1]) < blocks_used[:, None]]
    if used_ids.size:
        if not (int(used_ids.min()) >= 0 and int(used_ids.max()) < num_blocks):
            _fail(f"block_tables holds a block id outside [0, {num_blocks})")


def check_sinks(sinks: torch.Tensor | None, query: torch.Tensor) -> None:
    """Attention sinks are None or one fp32 logit per query head, on the query's device."""
    if sinks is None:
        return
    if not isinstance(sinks, torch.Tensor):
        _fail(f"sinks must be a torch.Tensor or None, got {type(sinks).__name__}")
    if sinks.dtype != torch.float32:
        _fail(f"sinks must be torch.float32, got {sinks.dtype}")
    if tuple(sinks.shape) != (query.shape[1],):
        _fail(f"sinks must be [num_heads] = [{query.shape[1]}], got shape {tuple(sinks.shape)}")
    if sinks.device != query.device:
        _fail(f"sinks on {sinks.device} but query on {query.device}")
    if not sinks.is_contiguous():
        _fail("sinks must be contiguous")


def kv_scales(kv_cache_dtype: str | None, key_cache: torch.Tensor, k_scale, v_scale) -> tuple[float, float]:
    """The per-tensor FP8 scales as floats, after checking that ``kv_cache_dtype`` (vLLM's name; None:
    read from the cache) says what the cache holds: "auto" a cache of the model's dtype, "fp8" or
    "fp8_e4m3" a float8_e4m3fn one. Scales are positive finite numbers (or one-element tensors)."""
    fp8 = key_cache.dtype == FP8_CACHE_DTYPE
    if kv_cache_dtype is not None:
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            _fail(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}")
        if (kv_cache_dtype != "auto") != fp8:
            _fail(f"kv_cache_dtype={kv_cache_dtype!r} but the cache is {key_cache.dtype}")
    if type(k_scale) is float and type(v_scale) is float and k_scale == 1.0 and v_scale == 1.0:
        return 1.0, 1.0       # the common case (vLLM's default scales), checked per layer and step: at once
    scales = []
    for name, value in (("k_scale", k_scale), ("v_scale", v_scale)):
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                _fail(f"{name} must be one number (a per-tensor scale), got shape {tuple(value.shape)}")
            value = value.item()
        try:
            value = float(value)
        except (TypeError, ValueError):
            _fail(f"{name} must be a number, got {type(value).__name__}")
        if not (math.isfinite(value) and value > 0):
            _fail(f"{name} must be a positive finite number, got {value}")
        if not fp8 and value != 1.0:
            _fail(f"{name}={value}: scales apply to an FP8 cache only, this one is {key_cache.dtype}")
        scales.append(value)
    return scales[0], scales[1]


def check_backend_device(backend: str, tensor: torch.Tensor) -> None:
    """The compiled kernels run on one kind of device; say so instead of failing deep in C++."""
    if backend == "cpu":
        if tensor.device.type != "cpu":
            _fail(f"the cpu kernels got {tensor.device} tensors; use load_ops('torch') or the cuda backend (see cuda_ext.describe())")
    elif backend == "cuda":
        if tensor.device.type != "cuda":
            _fail(f"the cuda kernels got {tensor.device} tensors; move them to the GPU or use load_ops('cpu')")


def check_compiled_shapes(backend: str, block_size: int, head_size: int) -> None:
    """Block and head sizes the compiled kernels were instantiated for (the torch reference takes any)."""
    if backend == "torch":
        return
    if block_size not in COMPILED_BLOCK_SIZES:
        _fail(f"the {backend} kernels support block_size in {COMPILED_BLOCK_SIZES}, got {block_size}")
    if backend == "cuda":
        if head_size not in CUDA_HEAD_SIZES:
            _fail(f"the cuda kernels support head_size in {CUDA_HEAD_SIZES}, got {head_size}")


def check_reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    check_values: bool = True,
) -> None:
    check_kv_cache(key_cache, value_cache)
    num_blocks, num_kv_heads, _, block_size, _ = key_cache.shape
    head_size = value_cache.shape[2]
    if key.dim() != 3:
        _fail(f"key must be [num_tokens, num_kv_heads, head_size], got shape {tuple(key.shape)}")
    if tuple(value.shape) != tuple(key.shape):
        _fail(f"value shape {tuple(value.shape)} != key shape {tuple(key.shape)}")
    if tuple(key.shape[1:]) != (num_kv_heads, head_size):
        _fail(f"key is [*, {key.shape[1]}, {key.shape[2]}] but the cache holds [*, {num_kv_heads}, {head_size}]")
    if not (key.dtype == value.dtype and key_cache.dtype in (key.dtype, FP8_CACHE_DTYPE)):
        _fail(f"key ({key.dtype}), value ({value.dtype}) and the caches ({key_cache.dtype}) must share one dtype "
              f"(or the caches be float8_e4m3fn)")
    if key.dtype not in SUPPORTED_DTYPES:
        _fail(f"key dtype must be one of float32/float16/bfloat16, got {key.dtype}")
    if not (key.device == value.device == key_cache.device):
        _fail("key, value and the caches must be on one device")
    _require_int_tensor("slot_mapping", slot_mapping, torch.int64, 1)
    if slot_mapping.shape[0] != key.shape[0]:
        _fail(f"slot_mapping has {slot_mapping.shape[0]} entries for {key.shape[0]} tokens")
    if slot_mapping.device != key.device:
        _fail("slot_mapping must be on the key's device")
    if check_values and slot_mapping.device.type == "cpu" and slot_mapping.numel():
        if not (int(slot_mapping.min()) >= -1):
            _fail("slot_mapping entries must be >= -1 (-1 means skip)")
        if not (int(slot_mapping.max()) < num_blocks * block_size):
            _fail(f"slot_mapping holds a slot >= num_blocks * block_size = {num_blocks * block_size}")


def _check_block_mapping(block_mapping: torch.Tensor, num_src: int, num_dst: int) -> None:
    _require_int_tensor("block_mapping", block_mapping, torch.int64, 2)
    if block_mapping.shape[1] != 2:
        _fail(f"block_mapping must be [n, 2] (src, dst), got shape {tuple(block_mapping.shape)}")
    if block_mapping.device.type == "cpu" and block_mapping.numel():
        if not (int(block_mapping.min()) >= 0):
            _fail("block_mapping holds a negative block id")
        if not (int(block_mapping[:, 0].max()) < num_src):
            _fail(f"block_mapping holds a source block id >= {num_src}")
        if not (int(block_mapping[:, 1].max()) < num_dst):
            _fail(f"block_mapping holds a destination block id >= {num_dst}")


def check_copy_blocks(key_caches: list[torch.Tensor], value_caches: list[torch.Tensor], block_mapping: torch.Tensor) -> None:
    if len(key_caches) != len(value_caches):
        _fail(f"{len(key_caches)} key caches but {len(value_caches)} value caches")
    if not (len(key_caches) > 0):
        _fail("copy_blocks needs at least one layer")
    for layer, (key_cache, value_cache) in enumerate(zip(key_caches, value_caches)):
        check_kv_cache(key_cache, value_cache)
        if not (key_cache.shape == key_caches[0].shape and key_cache.dtype == key_caches[0].dtype):
            _fail(f"layer {layer}'s cache differs in shape or dtype from layer 0's")
        if key_cache.device != key_caches[0].device:
            _fail(f"layer {layer}'s cache is on another device than layer 0's")
    _check_block_mapping(block_mapping, key_caches[0].shape[0], key_caches[0].shape[0])
    if block_mapping.device.type == "cpu" and block_mapping.numel():
        # The kernels copy all pairs in parallel, so a block that is written
        # and also read (or written twice) would give an order-dependent result.
        sources, destinations = block_mapping[:, 0].tolist(), block_mapping[:, 1].tolist()
        if len(set(destinations)) != len(destinations):
            _fail("block_mapping writes the same destination block twice")
        if set(sources) & set(destinations):
            _fail("block_mapping uses a block as both source and destination")


def check_swap_blocks(src: torch.Tensor, dst: torch.Tensor, block_mapping: torch.Tensor) -> None:
    if src.dtype != dst.dtype:
        _fail(f"src dtype {src.dtype} != dst dtype {dst.dtype}")
    if tuple(src.shape[1:]) != tuple(dst.shape[1:]):
        _fail(f"src blocks {tuple(src.shape[1:])} differ from dst blocks {tuple(dst.shape[1:])}")
    if not (src.is_contiguous() and dst.is_contiguous()):
        _fail("src and dst must be contiguous")
    if block_mapping.device.type != "cpu":
        _fail("block_mapping must be a CPU tensor (it is read on the host)")
    _check_block_mapping(block_mapping, src.shape[0], dst.shape[0])
    destinations = block_mapping[:, 1].tolist()
    if len(set(destinations)) != len(destinations):
        _fail("block_mapping writes the same destination block twice")
