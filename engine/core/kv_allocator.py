"""The interface every KV-cache allocation policy implements, and its shared types.

``paged`` is the block manager of the PagedAttention paper; ``orca-max``,
``orca-pow2`` and ``orca-oracle`` are the paper's contiguous baselines. The
scheduler talks to all of them through this interface, so the simulator can
compare them under exactly the same scheduling decisions. ``make_allocator``
(in ``engine.core.allocators``) builds one by name.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from engine.core.sequence import Sequence, SequenceGroup


class AllocStatus(enum.Enum):
    OK = "ok"          # fits now
    LATER = "later"    # fits once memory is freed
    NEVER = "never"    # larger than the whole cache


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """KV-cache slots by use at one instant (they add up to ``total``).

    token_states: slots holding a real token's keys and values.
    reserved: slots held for tokens the request will still produce.
    internal_fragmentation: allocated slots that will never hold a token.
    external_fragmentation: free slots stranded between allocations (too small to use).
    free: the rest.
    """

    token_states: int
    reserved: int
    internal_fragmentation: int
    external_fragmentation: int
    free: int

    @property
    def total(self) -> int:
        return (self.token_states + self.reserved + self.internal_fragmentation
                + self.external_fragmentation + self.free)

    def as_dict(self) -> dict[str, int]:
        return {"token_states": self.token_states, "reserved": self.reserved,
                "internal_fragmentation": self.internal_fragmentation,
                "external_fragmentation": self.external_fragmentation, "free": self.free}


class KVAllocator(Protocol):
    block_size: int
    num_gpu_blocks: int
    supports_swap: bool
    enable_prefix_caching: bool   # whether update() must call mark_computed

    def can_allocate(self, group: SequenceGroup) -> AllocStatus: ...
    def allocate(self, group: SequenceGroup) -> None: ...
    def can_append_slots(self, group: SequenceGroup) -> bool: ...
    def can_append_slots_alone(self, group: SequenceGroup) -> bool: ...
    def append_slots(self, seq: Sequence) -> tuple[int, int] | None: ...
    def fork(self, parent: Sequence, child: Sequence) -> None: ...
    def free(self, seq: Sequence) -> None: ...
    def mark_computed(self, seq: Sequence) -> None: ...
    def forget_adapter(self, root: int) -> None: ...
    def can_swap_out(self, group: SequenceGroup) -> bool: ...
    def swap_out(self, group: SequenceGroup) -> dict[int, int]: ...
    def can_swap_in(self, group: SequenceGroup) -> bool: ...
    def swap_in(self, group: SequenceGroup) -> dict[int, int]: ...
    def block_table(self, seq: Sequence) -> list[int]: ...
    def num_free_blocks(self) -> int: ...
    def num_used_blocks(self) -> int: ...
    def token_slots_used(self) -> int: ...
    def memory_breakdown(self) -> MemoryBreakdown: ...
