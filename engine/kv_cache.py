"""The paged KV cache: per-layer key/value block pools on the device plus a CPU swap pool.

Layout (the kernel ABI, ``x = 16 // element_size``):
    key   [num_blocks, num_kv_heads, head_size // x, block_size, x]
    value [num_blocks, num_kv_heads, head_size, block_size]
A block id means the same block in every layer, so the block manager's single
integer per block addresses all layers at once.

The cache's element type is the model's dtype, or FP8 (vLLM's
``--kv-cache-dtype fp8``: ``torch.float8_e4m3fn``, x = 16, values stored
divided by a per-tensor scale, 1.0 as vLLM uses without calibrated scales),
which costs a half (16-bit models) or a quarter (fp32 CPU runs) of the bytes
per block, so the same memory holds two or four times the blocks.
"""

from __future__ import annotations

import torch

import cuda_ext
from engine.host_memory import available_bytes

# vLLM's --kv-cache-dtype values and the cache element type each means ("auto": the model's dtype).
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")
FP8 = torch.float8_e4m3fn
GiB = 1 << 30


def cache_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The cache's element type for vLLM's --kv-cache-dtype (FP8 is E4M3, as vLLM's on CUDA)."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype {kv_cache_dtype!r} is not supported; choose one of "
                         f"{', '.join(KV_CACHE_DTYPES)}")
    return model_dtype if kv_cache_dtype == "auto" else FP8


def bytes_per_block(num_layers: int, num_kv_heads: int, head_size: int, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block id costs: a key and a value block in every layer."""
    element_size = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * num_kv_heads * head_size * block_size * element_size


def num_blocks_for_budget(
    budget_bytes: int, num_layers: int, num_kv_heads: int, head_size: int, block_size: int, dtype: torch.dtype
) -> int:
    """How many whole blocks fit in ``budget_bytes`` (0 if not even one)."""
    return max(0, int(budget_bytes) // bytes_per_block(num_layers, num_kv_heads, head_size, block_size, dtype))


def _allocate(num_blocks, num_kv_heads, head_size, block_size, dtype, device, pin_memory=False):
    x = 16 // torch.empty((), dtype=dtype).element_size()
    if head_size % x:
        # (the key cache packs x elements, 16 bytes, per row: vLLM's layout and its kernels')
        raise ValueError(f"a KV cache of {str(dtype).removeprefix('torch.')} needs a head size that is a multiple of "
                         f"{x}; this model's is {head_size}")
    key = torch.zeros(num_blocks, num_kv_heads, head_size // x, block_size, x, dtype=dtype, device=device,
                      pin_memory=pin_memory)
    value = torch.zeros(num_blocks, num_kv_heads, head_size, block_size, dtype=dtype, device=device,
                        pin_memory=pin_memory)
    return key, value


def _check_fits(block_bytes: int, num_gpu_blocks: int, num_cpu_blocks: int, device: torch.device) -> None:
    """Refuse, in one line, pools the memory they go to cannot hold. An oversized request would otherwise end
    in the allocator's error or, on a host that overcommits, in zero-filling pages until the process is
    killed. The swap pool is host memory, and so is the device pool on the CPU."""
    device_bytes, swap_bytes = num_gpu_blocks * block_bytes, num_cpu_blocks * block_bytes
    if device.type == "cuda":
        checks = [(device_bytes, torch.cuda.mem_get_info(device)[0], str(device)),
                  (swap_bytes, available_bytes(), "the host")]
    else:
        checks = [(device_bytes + swap_bytes, available_bytes(), "the host")]
    for need, free, where in checks:
        if free is not None and need > free:
            raise ValueError(f"a KV cache of {num_gpu_blocks:,} blocks and {num_cpu_blocks:,} swap blocks "
                             f"({block_bytes:,} bytes each) needs {need / GiB:,.1f} GiB on {where}, more than its "
                             f"{free / GiB:,.1f} GiB free: give fewer blocks (num_gpu_blocks, num_cpu_blocks or "
                             f"swap_space)")


def _mapping(pairs, device: torch.device | str = "cpu") -> torch.Tensor:
    return torch.tensor(list(pairs), dtype=torch.int64, device=device).view(-1, 2)


class KVCache:
    """Device and CPU block pools for every layer, and the block moves the scheduler asks for."""

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_size: int,
        block_size: int,
        num_gpu_blocks: int,
        num_cpu_blocks: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        self.num_layers, self.num_kv_heads, self.head_size = num_layers, num_kv_heads, head_size
        self.block_size, self.dtype, self.device = block_size, dtype, torch.device(device)
        self.num_gpu_blocks, self.num_cpu_blocks = num_gpu_blocks, num_cpu_blocks
        _check_fits(bytes_per_block(num_layers, num_kv_heads, head_size, block_size, dtype), num_gpu_blocks,
                    num_cpu_blocks, self.device)
        # Zero-filled rather than empty: a kernel bug that reads an unwritten
        # slot then yields zeros, not NaNs from stale memory, and tests see it.
        self.gpu = [_allocate(num_gpu_blocks, num_kv_heads, head_size, block_size, dtype, self.device)
                    for _ in range(num_layers)]
        # Pinned host memory lets swaps run as asynchronous DMA; pinning needs CUDA.
        pin = torch.cuda.is_available() and self.device.type == "cuda"
        self.cpu = [_allocate(num_cpu_blocks, num_kv_heads, head_size, block_size, dtype, "cpu", pin)
                    for _ in range(num_layers)]

    @property
    def key_caches(self) -> list[torch.Tensor]:
        return [k for k, _ in self.gpu]

    @property
    def value_caches(self) -> list[torch.Tensor]:
        return [v for _, v in self.gpu]

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: device block src -> dst for each (src, dst), in every layer at once."""
        if not pairs:
            return
        cuda_ext.ops.copy_blocks(self.key_caches, self.value_caches, _mapping(pairs, self.device))

    def swap_out(self, mapping: dict[int, int]) -> None:
        """Device block -> CPU block for each {gpu_block: cpu_block}."""
        self._swap(self.gpu, self.cpu, mapping)

    def swap_in(self, mapping: dict[int, int]) -> None:
        """CPU block -> device block for each {cpu_block: gpu_block}."""
        self._swap(self.cpu, self.gpu, mapping)

    @staticmethod
    def _swap(src_pools, dst_pools, mapping: dict[int, int]) -> None:
        if not mapping:
            return
        # swap_blocks reads its mapping on the host, so it stays a CPU tensor.
        block_mapping = _mapping(mapping.items())
        ops = cuda_ext.ops
        for (src_key, src_value), (dst_key, dst_value) in zip(src_pools, dst_pools):
            ops.swap_blocks(src_key, dst_key, block_mapping)
            ops.swap_blocks(src_value, dst_value, block_mapping)


def profile_num_gpu_blocks(runner, gpu_memory_utilization: float, max_num_batched_tokens: int) -> int:
    """How many KV blocks fit on the GPU next to the model and its peak activations.

    Runs the largest step the scheduler may issue (``max_num_batched_tokens``
    prompt tokens, without a KV cache) and measures torch's peak allocation.
    The budget is the device's total memory times ``gpu_memory_utilization``
    minus (a) the peak the profile run reached (weights + activations), and
    (b) memory held outside torch's allocator (CUDA context, other processes),
    read from ``mem_get_info`` before the cache exists. Must run before the
    cache is allocated.
    """
    device = runner.device
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    runner.profile_run(max_num_batched_tokens)
    torch.cuda.synchronize(device)
    peak_torch = torch.cuda.max_memory_allocated(device)
    free, total = torch.cuda.mem_get_info(device)
    # Everything in use that torch's caching allocator does not hold.
    outside_torch = max(0, (total - free) - torch.cuda.memory_reserved(device))
    torch.cuda.empty_cache()
    budget = total * gpu_memory_utilization - peak_torch - outside_torch
    config = runner.cache_shape
    blocks = num_blocks_for_budget(budget, *config, runner.block_size, runner.cache_dtype)
    if blocks <= 0:
        raise RuntimeError(
            f"no memory left for the KV cache: total {total / 2**30:.2f} GiB x {gpu_memory_utilization} "
            f"< peak {peak_torch / 2**30:.2f} GiB + non-torch {outside_torch / 2**30:.2f} GiB; "
            "raise gpu_memory_utilization or lower max_num_batched_tokens"
        )
    return blocks
