"""The PagedAttention paper's contiguous baselines (section 6.1, "Orca").

Each request reserves one contiguous chunk of KV slots when it is admitted,
big enough for every token it may ever hold, and keeps it until it finishes:

- ``max``: the model's maximum sequence length per sequence;
- ``pow2``: the next power of two of prompt + true output length (at most 2x over);
- ``oracle``: exactly prompt + true output length (knows the future).

Chunks are placed first-fit in one linear slot space as large as the paged
cache, so the baselines suffer the external fragmentation a real contiguous
allocator would. Sequences of one request (parallel samples, beams) cannot
share memory here: each gets its own part of the request's chunk.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

from engine.core.kv_allocator import AllocStatus, MemoryBreakdown
from engine.core.sequence import Sequence, SequenceGroup, SequenceStatus


@dataclass(slots=True)
class _Chunk:
    start: int
    size: int
    per_seq: int            # slots reserved for each sequence of the request
    useful_per_seq: int     # slots each sequence will really fill (prompt + true output)
    group: SequenceGroup


class ContiguousAllocator:
    supports_swap = False
    enable_prefix_caching = False   # chunks are never shared

    def __init__(self, policy: str, block_size: int, num_gpu_blocks: int, *, max_model_len: int) -> None:
        if policy not in ("max", "pow2", "oracle"):
            raise ValueError(f"unknown contiguous policy {policy!r}")
        self.policy = policy
        self.block_size = block_size
        self.num_gpu_blocks = num_gpu_blocks
        self.capacity = block_size * num_gpu_blocks   # the same memory the paged cache gets
        self.max_model_len = max_model_len
        self.free_extents: list[tuple[int, int]] = [(0, self.capacity)]  # (start, size), sorted
        self.chunks: dict[str, _Chunk] = {}       # by request id
        self.live: dict[str, int] = {}            # live sequences per request
        self.owner: dict[int, str] = {}           # seq id -> request id

    # -- sizing --------------------------------------------------------------
    def _useful_len(self, group: SequenceGroup) -> int:
        if group.output_len_hint is None:
            if self.policy != "max":
                raise ValueError(f"orca-{self.policy} needs the request's true output length "
                                 f"(request {group.request_id} has none)")
            return self.max_model_len
        return min(group.prompt_len + group.output_len_hint, self.max_model_len)

    def _reservation(self, group: SequenceGroup) -> tuple[int, int]:
        useful = self._useful_len(group)
        if self.policy == "max":
            per_seq = self.max_model_len
        elif self.policy == "pow2":
            per_seq = min(1 << (useful - 1).bit_length(), self.max_model_len)
        else:
            per_seq = useful
        return per_seq, useful

    def _first_fit(self, size: int) -> int | None:
        for i, (_, extent) in enumerate(self.free_extents):
            if extent >= size:
                return i
        return None

    # -- interface -----------------------------------------------------------
    def can_allocate(self, group: SequenceGroup) -> AllocStatus:
        per_seq, _ = self._reservation(group)
        size = per_seq * group.max_num_seqs()
        if size > self.capacity:
            return AllocStatus.NEVER
        return AllocStatus.OK if self._first_fit(size) is not None else AllocStatus.LATER

    def allocate(self, group: SequenceGroup) -> None:
        per_seq, useful = self._reservation(group)
        size = per_seq * group.max_num_seqs()
        i = self._first_fit(size)
        if i is None:
            raise RuntimeError(f"no contiguous space for request {group.request_id}")
        start, extent = self.free_extents[i]
        if extent == size:
            del self.free_extents[i]
        else:
            self.free_extents[i] = (start + size, extent - size)
        self.chunks[group.request_id] = _Chunk(start, size, per_seq, useful, group)
        self.live[group.request_id] = len(group.live_seqs())
        for seq in group.live_seqs():
            seq.num_computed_tokens = 0
            self.owner[seq.seq_id] = group.request_id

    def can_append_slots(self, group: SequenceGroup) -> bool:
        return True   # the reservation already covers every future token

    def can_append_slots_alone(self, group: SequenceGroup) -> bool:
        return True

    def append_slots(self, seq: Sequence) -> tuple[int, int] | None:
        return None

    def fork(self, parent: Sequence, child: Sequence) -> None:
        request_id = self.owner[parent.seq_id]
        self.owner[child.seq_id] = request_id
        self.live[request_id] += 1

    def free(self, seq: Sequence) -> None:
        request_id = self.owner.pop(seq.seq_id, None)
        if request_id is None:
            return
        self.live[request_id] -= 1
        if self.live[request_id] == 0:   # the request's last sequence: give the chunk back
            self._release(request_id)

    def _release(self, request_id: str) -> None:
        chunk = self.chunks.pop(request_id)
        del self.live[request_id]
        extents = self.free_extents
        i = bisect.bisect_left(extents, (chunk.start, 0))
        extents.insert(i, (chunk.start, chunk.size))
        # Merge with the neighbours so free space stays maximal.
        if i + 1 < len(extents) and extents[i][0] + extents[i][1] == extents[i + 1][0]:
            extents[i] = (extents[i][0], extents[i][1] + extents[i + 1][1])
            del extents[i + 1]
        if i > 0 and extents[i - 1][0] + extents[i - 1][1] == extents[i][0]:
            extents[i - 1] = (extents[i - 1][0], extents[i - 1][1] + extents[i][1])
            del extents[i]

    def mark_computed(self, seq: Sequence) -> None:
        pass

    def forget_adapter(self, root: int) -> None:
        pass                     # (no prefix cache)

    def can_swap_out(self, group: SequenceGroup) -> bool:
        return False

    def swap_out(self, group: SequenceGroup) -> dict[int, int]:
        raise ValueError("contiguous (orca) allocators do not swap")

    def can_swap_in(self, group: SequenceGroup) -> bool:
        return False

    def swap_in(self, group: SequenceGroup) -> dict[int, int]:
        raise ValueError("contiguous (orca) allocators do not swap")

    def block_table(self, seq: Sequence) -> list[int]:
        raise ValueError("contiguous (orca) allocators have no block tables; the engine runs 'paged'")

    # -- accounting ----------------------------------------------------------
    def num_free_blocks(self) -> int:
        return sum(size for _, size in self.free_extents) // self.block_size

    def num_used_blocks(self) -> int:
        return self.num_gpu_blocks - self.num_free_blocks()

    def token_slots_used(self) -> int:
        return sum(s.num_tokens for c in self.chunks.values() for s in c.group.seqs
                   if s.status is not SequenceStatus.FINISHED)

    def memory_breakdown(self) -> MemoryBreakdown:
        tokens = reserved = internal = 0
        for chunk in self.chunks.values():
            seqs = [s for s in chunk.group.seqs if s.status is not SequenceStatus.FINISHED]
            held = sum(s.num_tokens for s in seqs)
            will_hold = max(chunk.useful_per_seq * chunk.group.max_num_seqs(), held)
            tokens += held
            reserved += will_hold - held
            internal += chunk.size - will_hold
        free = sum(size for _, size in self.free_extents)
        largest = max((size for _, size in self.free_extents), default=0)
        # Free space outside the largest hole is stranded between reservations.
        return MemoryBreakdown(token_states=tokens, reserved=reserved, internal_fragmentation=internal,
                               external_fragmentation=free - largest, free=largest)
