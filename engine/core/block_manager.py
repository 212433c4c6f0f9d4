"""The paged KV-cache block manager (PagedAttention, SOSP 2023, section 4.2-4.4).

Integers only: physical block ids, per-sequence block tables, reference
counts. The runner turns the returned copy pairs and swap maps into tensor
operations. Prefix caching identifies a full block by a chained hash of
(parent block's hash, the block's token ids), so equal prefixes map to equal
hashes; free blocks that still hold a cached prefix wait in an LRU order and
are reused (evicted) only when no plain free block is left.
"""
from __future__ import annotations

from collections import OrderedDict

from engine.core.kv_allocator import AllocStatus, MemoryBreakdown
from engine.core.sequence import Sequence, SequenceGroup, SequenceStatus


def _blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class BlockManager:
    supports_swap = True

    def __init__(self, block_size: int, num_gpu_blocks: int, num_cpu_blocks: int = 0, *,
                 watermark: float = 0.01, enable_prefix_caching: bool = False) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be positive, got {block_size}")
        if num_gpu_blocks < 1:
            raise ValueError(f"the KV cache needs at least one block, got {num_gpu_blocks}")
        self.block_size = block_size
        self.num_gpu_blocks = num_gpu_blocks
        self.num_cpu_blocks = num_cpu_blocks
        # A few blocks kept free when admitting prompts, so running sequences
        # can still grow without an immediate preemption.
        self.watermark_blocks = int(watermark * num_gpu_blocks)
        self.enable_prefix_caching = enable_prefix_caching

        self.ref_counts = [0] * num_gpu_blocks
        self.fill = [0] * num_gpu_blocks          # slots holding a token, per block
        self.free_list = list(range(num_gpu_blocks - 1, -1, -1))  # pop() gives block 0 first
        self.tables: dict[int, list[int]] = {}
        self.num_token_states = 0                 # sum of fill over blocks in use

        self.block_hash: list[int | None] = [None] * num_gpu_blocks
        self.cached: dict[int, int] = {}          # hash -> block
        self.evictor: OrderedDict[int, None] = OrderedDict()  # free cached blocks, LRU first
        self.seq_hashes: dict[int, list[int]] = {}  # hashes of a sequence's full computed blocks

        self.cpu_ref_counts = [0] * num_cpu_blocks
        self.cpu_fill = [0] * num_cpu_blocks
        self.cpu_free_list = list(range(num_cpu_blocks - 1, -1, -1))
        self.cpu_tables: dict[int, list[int]] = {}

    # -- pool ----------------------------------------------------------------
    def num_free_blocks(self) -> int:
        return len(self.free_list) + len(self.evictor)

    def num_used_blocks(self) -> int:
        return self.num_gpu_blocks - self.num_free_blocks()

    def num_free_cpu_blocks(self) -> int:
        return len(self.cpu_free_list)

    def token_slots_used(self) -> int:
        return self.num_token_states

    def block_table(self, seq: Sequence) -> list[int]:
        return self.tables[seq.seq_id]

    def _take_block(self) -> int:
        if self.free_list:
            block = self.free_list.pop()
        else:  # reuse the least recently used cached block
            block, _ = self.evictor.popitem(last=False)
            del self.cached[self.block_hash[block]]
            self.block_hash[block] = None
            self.fill[block] = 0
        self.ref_counts[block] = 1
        return block

    def _set_fill(self, block: int, filled: int) -> None:
        self.num_token_states += filled - self.fill[block]
        self.fill[block] = filled

    def _release(self, block: int) -> None:
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self.num_token_states -= self.fill[block]
            if self.block_hash[block] is not None:
                self.evictor[block] = None   # keep its contents for a later prefix hit
            else:
                self.fill[block] = 0
                self.free_list.append(block)

    # -- prompts -------------------------------------------------------------
    def _blocks_needed(self, group: SequenceGroup) -> int:
        return sum(_blocks_for(s.num_tokens, self.block_size) for s in group.live_seqs())

    def can_allocate(self, group: SequenceGroup) -> AllocStatus:
        needed = self._blocks_needed(group)
        if needed > self.num_gpu_blocks - self.watermark_blocks:
            return AllocStatus.NEVER
        if self.num_free_blocks() - needed >= self.watermark_blocks:
            return AllocStatus.OK
        return AllocStatus.LATER

    def allocate(self, group: SequenceGroup) -> None:
        """Give every waiting sequence of the group a block table for all its tokens."""
        for seq in group.live_seqs():
            self._allocate_seq(seq)

    def _allocate_seq(self, seq: Sequence) -> None:
        bs = self.block_size
        n = seq.num_tokens
        table: list[int] = []
        hashes: list[int] = []
        if self.enable_prefix_caching:
            # A hit never covers the whole prompt: the last token is always
            # computed, so there are logits to sample from.
            parent = None
            tokens = seq.token_ids
            for i in range((n - 1) // bs):
                h = hash((parent, tuple(tokens[i * bs:(i + 1) * bs])))
                block = self.cached.get(h)
                if block is None:
                    break
                if self.ref_counts[block] == 0:
                    del self.evictor[block]
                    self.num_token_states += self.fill[block]
                self.ref_counts[block] += 1
                table.append(block)
                hashes.append(h)
                parent = h
            self.seq_hashes[seq.seq_id] = hashes
        seq.num_computed_tokens = len(table) * bs
        for i in range(len(table), _blocks_for(n, bs)):
            block = self._take_block()
            self._set_fill(block, min(bs, n - i * bs))
            table.append(block)
        self.tables[seq.seq_id] = table

    def mark_computed(self, seq: Sequence, num_tokens: int | None = None) -> None:
        """Register the sequence's newly computed full blocks in the prefix cache
        (those within its first ``num_tokens`` tokens, default: its computed ones)."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        hashes = self.seq_hashes.setdefault(seq.seq_id, [])
        table = self.tables[seq.seq_id]
        tokens = seq.token_ids
        upto = seq.num_computed_tokens if num_tokens is None else num_tokens
        for i in range(len(hashes), upto // bs):
            h = hash((hashes[-1] if hashes else None, tuple(tokens[i * bs:(i + 1) * bs])))
            hashes.append(h)
            block = table[i]
            if self.block_hash[block] is None and h not in self.cached:
                self.block_hash[block] = h
                self.cached[h] = block

    # -- chunked prefill (engine/core/chunked_scheduler.py) ----------------------
    # vLLM v1 holds only the blocks of the tokens computed so far: a prompt's
    # blocks arrive chunk by chunk, so admission and growth count blocks for a
    # token total rather than for the whole sequence.

    def reserve_null_block(self) -> int:
        """Take one block out of use for good (vLLM v1's null block): N blocks then hold N-1."""
        return self._take_block()            # held by no sequence, so never released

    def cached_prefix(self, seq: Sequence) -> list[tuple[int, int]]:
        """(block, hash) of the longest cached prefix of the sequence, without taking
        it; never the whole sequence (its last token is always computed)."""
        if not self.enable_prefix_caching:
            return []
        bs = self.block_size
        tokens = seq.token_ids
        hit: list[tuple[int, int]] = []
        parent = None
        for i in range((seq.num_tokens - 1) // bs):
            h = hash((parent, tuple(tokens[i * bs:(i + 1) * bs])))
            block = self.cached.get(h)
            if block is None:
                break
            hit.append((block, h))
            parent = h
        return hit

    def blocks_to_admit(self, hit: list[tuple[int, int]], num_tokens: int) -> int:
        """Free blocks that admitting a sequence with prefix ``hit`` and ``num_tokens``
        slots would use: new blocks, plus hit blocks that are free but cached."""
        new = max(_blocks_for(num_tokens, self.block_size) - len(hit), 0)
        return new + sum(1 for block, _ in hit if self.ref_counts[block] == 0)

    def admit(self, seq: Sequence, hit: list[tuple[int, int]], num_tokens: int) -> None:
        """Give a waiting sequence its cached prefix and blocks for its first ``num_tokens`` tokens."""
        table: list[int] = []
        for block, _ in hit:
            if self.ref_counts[block] == 0:
                del self.evictor[block]
                self.num_token_states += self.fill[block]
            self.ref_counts[block] += 1
            table.append(block)
        if self.enable_prefix_caching:
            self.seq_hashes[seq.seq_id] = [h for _, h in hit]
        seq.num_computed_tokens = len(hit) * self.block_size
        self.tables[seq.seq_id] = table
        self.grow(seq, num_tokens)

    def blocks_to_grow(self, seq: Sequence, num_tokens: int) -> int:
        return max(_blocks_for(num_tokens, self.block_size) - len(self.tables[seq.seq_id]), 0)

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        """Extend the sequence's blocks to hold ``num_tokens`` tokens (the caller checked they are free)."""
        bs = self.block_size
        table = self.tables[seq.seq_id]
        if table and self.fill[table[-1]] < bs:
            self._set_fill(table[-1], min(bs, num_tokens - (len(table) - 1) * bs))
        for i in range(len(table), _blocks_for(num_tokens, bs)):
            block = self._take_block()
            self._set_fill(block, min(bs, num_tokens - i * bs))
            table.append(block)

    # -- decoding ------------------------------------------------------------
    def _needs_block(self, seq: Sequence) -> bool:
        table = self.tables[seq.seq_id]
        return (len(table) * self.block_size < seq.num_tokens
                or self.ref_counts[table[-1]] > 1)

    def can_append_slots(self, group: SequenceGroup) -> bool:
        needed = 0
        for seq in group.seqs:
            if seq.status is SequenceStatus.RUNNING and self._needs_block(seq):
                needed += 1
        return needed <= self.num_free_blocks()

    def append_slots(self, seq: Sequence) -> tuple[int, int] | None:
        """Make room for the sequence's uncomputed tokens (one, when decoding).

        Returns ``(src, dst)`` when the last block was shared and had to be
        copied before writing (copy-on-write), else None.
        """
        bs = self.block_size
        table = self.tables[seq.seq_id]
        n = seq.num_tokens
        if len(table) * bs < n:
            block = self._take_block()
            self._set_fill(block, n - len(table) * bs)
            table.append(block)
            return None
        last = table[-1]
        filled = n - (len(table) - 1) * bs
        if self.ref_counts[last] == 1:
            self._set_fill(last, filled)
            return None
        copy = self._take_block()
        self.ref_counts[last] -= 1
        self._set_fill(copy, filled)
        table[-1] = copy
        return last, copy

    def fork(self, parent: Sequence, child: Sequence) -> None:
        table = self.tables[parent.seq_id]
        for block in table:
            self.ref_counts[block] += 1
        self.tables[child.seq_id] = list(table)
        if self.enable_prefix_caching:
            self.seq_hashes[child.seq_id] = list(self.seq_hashes.get(parent.seq_id, ()))

    def free(self, seq: Sequence) -> None:
        table = self.tables.pop(seq.seq_id, None)
        if table is not None:
            # Tail blocks first, so the LRU order evicts the ends of prefixes
            # before their shared beginnings.
            for block in reversed(table):
                self._release(block)
        cpu_table = self.cpu_tables.pop(seq.seq_id, None)
        if cpu_table is not None:
            for block in cpu_table:
                self._release_cpu(block)
        self.seq_hashes.pop(seq.seq_id, None)

    # -- swapping ------------------------------------------------------------
    def _unique_blocks(self, tables: dict[int, list[int]], group: SequenceGroup,
                       status: SequenceStatus) -> set[int]:
        return {b for s in group.seqs if s.status is status for b in tables[s.seq_id]}

    def can_swap_out(self, group: SequenceGroup) -> bool:
        return len(self._unique_blocks(self.tables, group, SequenceStatus.RUNNING)) <= len(self.cpu_free_list)

    def swap_out(self, group: SequenceGroup) -> dict[int, int]:
        """Move the group's running sequences to CPU blocks; returns {gpu_block: cpu_block}."""
        mapping: dict[int, int] = {}
        for seq in group.seqs:
            if seq.status is not SequenceStatus.RUNNING:
                continue
            cpu_table = []
            for block in self.tables.pop(seq.seq_id):
                cpu = mapping.get(block)
                if cpu is None:
                    cpu = self.cpu_free_list.pop()
                    mapping[block] = cpu
                    self.cpu_fill[cpu] = self.fill[block]
                self.cpu_ref_counts[cpu] += 1
                cpu_table.append(cpu)
                self._release(block)
            self.cpu_tables[seq.seq_id] = cpu_table
        return mapping

    def can_swap_in(self, group: SequenceGroup) -> bool:
        blocks = self._unique_blocks(self.cpu_tables, group, SequenceStatus.SWAPPED)
        # Room for the blocks plus a new block for each sequence whose next
        # token will not fit in its last block (full, or shared: copy-on-write).
        cpu_refs = self.cpu_ref_counts
        growing = sum(1 for s in group.seqs if s.status is SequenceStatus.SWAPPED and (
            len(self.cpu_tables[s.seq_id]) * self.block_size < s.num_tokens
            or cpu_refs[self.cpu_tables[s.seq_id][-1]] > 1))
        return self.num_free_blocks() - len(blocks) - growing >= self.watermark_blocks

    def swap_in(self, group: SequenceGroup) -> dict[int, int]:
        """Bring the group's swapped sequences back; returns {cpu_block: gpu_block}."""
        mapping: dict[int, int] = {}
        for seq in group.seqs:
            if seq.status is not SequenceStatus.SWAPPED:
                continue
            table = []
            for cpu in self.cpu_tables.pop(seq.seq_id):
                block = mapping.get(cpu)
                if block is None:
                    block = self._take_block()
                    mapping[cpu] = block
                    self._set_fill(block, self.cpu_fill[cpu])
                else:
                    self.ref_counts[block] += 1
                table.append(block)
                self._release_cpu(cpu)
            self.tables[seq.seq_id] = table
        return mapping

    def _release_cpu(self, block: int) -> None:
        self.cpu_ref_counts[block] -= 1
        if self.cpu_ref_counts[block] == 0:
            self.cpu_fill[block] = 0
            self.cpu_free_list.append(block)

    # -- accounting ----------------------------------------------------------
    def memory_breakdown(self) -> MemoryBreakdown:
        used = self.num_used_blocks()
        bs = self.block_size
        # Paged waste is the unfilled tail of blocks in use: at most one block per sequence.
        return MemoryBreakdown(token_states=self.num_token_states, reserved=0,
                               internal_fragmentation=used * bs - self.num_token_states,
                               external_fragmentation=0, free=self.num_free_blocks() * bs)
