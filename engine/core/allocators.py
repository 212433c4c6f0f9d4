"""Build a KV allocation policy by name (the simulator's ``--allocator``)."""
from __future__ import annotations

from engine.core.block_manager import BlockManager
from engine.core.contiguous_allocator import ContiguousAllocator
from engine.core.kv_allocator import KVAllocator

ALLOCATORS = ("paged", "orca-max", "orca-pow2", "orca-oracle")


def make_allocator(name: str, *, block_size: int, num_gpu_blocks: int, num_cpu_blocks: int = 0,
                   max_model_len: int, enable_prefix_caching: bool = False,
                   watermark: float = 0.01, slot_reservation: str = "vllm") -> KVAllocator:
    """Build the allocation policy called ``name`` over the same amount of KV memory."""
    if name == "paged":
        return BlockManager(block_size, num_gpu_blocks, num_cpu_blocks, watermark=watermark,
                            enable_prefix_caching=enable_prefix_caching, slot_reservation=slot_reservation,
                            max_model_len=max_model_len)
    if name in ("orca-max", "orca-pow2", "orca-oracle"):
        # Contiguous chunks are never shared, so prefix caching does not apply to them.
        return ContiguousAllocator(name.split("-", 1)[1], block_size, num_gpu_blocks,
                                   max_model_len=max_model_len)
    raise ValueError(f"unknown KV allocator {name!r}; choose one of {', '.join(ALLOCATORS)}")
