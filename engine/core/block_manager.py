"""The paged KV-cache block manager (PagedAttention, SOSP 2023, section 4.2-4.4).

Integers only: physical block ids, per-sequence block tables, reference
counts (two ``BlockPool`` objects, GPU cache and CPU swap space). The runner
turns the returned copy pairs and swap maps into tensor operations. Prefix
caching identifies a full block by a chained key, a cryptographic digest of
(parent block's key, the block's token ids), so equal prefixes map to equal
keys and no prompt can be made to collide with another's (``block_key``).

Admission checks follow vLLM v0.2.0's ``BlockSpaceManager`` (the version the
paper evaluated), so the simulator preempts exactly where it would:

- ``can_allocate``: the prompt's blocks fit and leave ``watermark`` of the cache free;
  and, given ``max_model_len``, a request not yet started could grow to its
  largest (``max_blocks_alone``) with the cache to itself, else it is refused
  up front (NEVER) instead of being cut short later;
- ``can_append_slots``: at least one free block per running sequence of the
  group, whether or not that sequence needs a new block this step;
- ``can_swap_in``: the group's blocks plus one block per swapped sequence
  fit, leaving the watermark free.

``slot_reservation="exact"`` replaces the last two by finer checks that count
only the sequences that really need a block this step (full last block, or a
shared one that copy-on-write must copy). It admits more and preempts later;
it is kept to measure how much vLLM's conservative heuristic costs.
"""
from __future__ import annotations


from engine.core.block_keys import ROOT_HASH, block_key, chained_hashes
from engine.core.block_pool import BlockPool
from engine.core.kv_allocator import AllocStatus, MemoryBreakdown
from engine.core.sequence import Sequence, SequenceGroup, SequenceStatus

SLOT_RESERVATIONS = ("vllm", "exact")

_RUNNING = SequenceStatus.RUNNING
_SWAPPED = SequenceStatus.SWAPPED


def _blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def blocks_at_most(prompt_len: int, max_tokens: int, width: int, block_size: int,
                   max_model_len: int | None = None, reserve_per_seq: int = 0) -> int:
    """KV blocks a request needs at its largest: its ``width`` sequences share the
    prompt's full blocks, and each holds its own up to its last computed token (the
    last sampled token is never computed); before its last decode, each also wants
    ``reserve_per_seq`` free blocks (vLLM v0's rule) beside what it holds. Until the
    first decode writes to it the samples share the prompt's last block too (copy on
    write), so a request whose last decode is its first needs no copy of it."""
    total = prompt_len + max_tokens
    if max_model_len is not None:
        total = min(total, max_model_len)
    computed = total - 1                       # tokens in the cache after the last decode
    if computed <= prompt_len:                 # no decode: the prompt's blocks alone
        return _blocks_for(prompt_len, block_size)
    shared = prompt_len // block_size if width > 1 else 0

    def held(tokens: int) -> int:
        if tokens == prompt_len:               # nothing written since the prompt: every block still shared
            return _blocks_for(prompt_len, block_size)
        return shared + width * (_blocks_for(tokens, block_size) - shared)
    return max(held(computed), held(computed - 1) + width * reserve_per_seq)


class BlockManager:
    supports_swap = True
    state_blocks = 0     # blocks a running sequence holds beside its tokens' (VllmBlockManager: recurrent states)
    offload = None       # the CPU tier behind the prefix cache (VllmBlockManager, --kv-offloading-size)

    def __init__(self, block_size: int, num_gpu_blocks: int, num_cpu_blocks: int = 0, *,
                 watermark: float = 0.01, enable_prefix_caching: bool = False,
                 slot_reservation: str = "vllm", max_model_len: int | None = None) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be positive, got {block_size}")
        if num_gpu_blocks < 1:
            raise ValueError(f"the KV cache needs at least one block, got {num_gpu_blocks}")
        if slot_reservation not in SLOT_RESERVATIONS:
            raise ValueError(f"slot_reservation must be one of {', '.join(SLOT_RESERVATIONS)}, "
                             f"got {slot_reservation!r}")
        self.block_size = block_size
        self.num_gpu_blocks = num_gpu_blocks
        self.num_cpu_blocks = num_cpu_blocks
        # A few blocks kept free when admitting prompts and swapping in, so
        # running sequences can still grow without an immediate preemption.
        self.watermark_blocks = int(watermark * num_gpu_blocks)
        self.enable_prefix_caching = enable_prefix_caching
        self.slot_reservation = slot_reservation
        # The context limit, when known, bounds how far a request can grow
        # (can_allocate refuses up front one that could never finish).
        self.max_model_len = max_model_len
        self.gpu = BlockPool(num_gpu_blocks)
        self.cpu = BlockPool(num_cpu_blocks)
        self.tables: dict[int, list[int]] = {}       # seq id -> GPU blocks
        self.cpu_tables: dict[int, list[int]] = {}   # seq id -> CPU blocks (swapped out)
        self.seq_hashes: dict[int, list[int]] = {}   # hashes of a sequence's full computed blocks
        # The keys LoRA adapters' blocks were registered under (salted or not), by the adapter's unsalted root
        # (forget_adapter drops them when the engine unloads it). Keys since evicted are pruned once there are
        # twice as many as the caches hold.
        self.adapter_keys: dict[int, list[int]] = {}
        self.adapter_keys_count = 0

    # -- pool ----------------------------------------------------------------
    def num_free_blocks(self) -> int:
        return self.gpu.num_free()

    def num_used_blocks(self) -> int:
        return self.gpu.num_used()

    def num_free_cpu_blocks(self) -> int:
        return self.cpu.num_free()

    def token_slots_used(self) -> int:
        return self.gpu.num_token_states

    def block_table(self, seq: Sequence) -> list[int]:
        return self.tables[seq.seq_id]

    # -- prompts -------------------------------------------------------------
    def _blocks_needed(self, group: SequenceGroup) -> int:
        return sum(_blocks_for(s.num_tokens, self.block_size) for s in group.live_seqs())

    def max_blocks_alone(self, group: SequenceGroup) -> int:
        """Blocks the request needs at its largest with the cache to itself, by the rules
        its steps are checked by: vLLM's one free block per running sequence before a
        decode, and the watermark kept free when it is admitted or swapped in."""
        params = group.params
        reserve = 1 if self.slot_reservation == "vllm" else 0
        return self.watermark_blocks + blocks_at_most(group.prompt_len, params.max_tokens, params.best_of,
                                                      self.block_size, self.max_model_len, reserve)

    def max_seq_len(self) -> int:
        """The longest sequence one request can hold (vLLM refuses a max_model_len above it)."""
        return max(self.num_gpu_blocks - 1 - self.watermark_blocks, 0) * self.block_size

    def can_allocate(self, group: SequenceGroup) -> AllocStatus:
        needed = self._blocks_needed(group)
        if needed > self.num_gpu_blocks - self.watermark_blocks:
            return AllocStatus.NEVER
        if (self.max_model_len is not None and group.first_step_pending
                and self.max_blocks_alone(group) > self.num_gpu_blocks):
            return AllocStatus.NEVER   # it could never finish: refused now, not cut short later
        if self.gpu.num_free() - needed >= self.watermark_blocks:
            return AllocStatus.OK
        return AllocStatus.LATER

    def allocate(self, group: SequenceGroup) -> None:
        """Give every waiting sequence of the group a block table for all its tokens."""
        for seq in group.live_seqs():
            self._allocate_seq(seq)

    def _allocate_seq(self, seq: Sequence) -> None:
        bs = self.block_size
        n = seq.num_tokens
        gpu = self.gpu
        table: list[int] = []
        if self.enable_prefix_caching:
            # A hit never covers the whole prompt: the last token is always
            # computed, so there are logits to sample from.
            hashes: list[int] = []
            parent = seq.cache_root
            tokens = seq.token_ids
            for i in range((n - 1) // bs):
                h = block_key(parent, tokens[i * bs:(i + 1) * bs])
                block = gpu.cached.get(h)
                if block is None:
                    break
                gpu.share(block)
                table.append(block)
                hashes.append(h)
                parent = h
            self.seq_hashes[seq.seq_id] = hashes
        seq.num_computed_tokens = len(table) * bs
        for i in range(len(table), _blocks_for(n, bs)):
            table.append(gpu.take(min(bs, n - i * bs)))
        self.tables[seq.seq_id] = table

    def mark_computed(self, seq: Sequence, num_tokens: int | None = None) -> None:
        """Register the sequence's newly computed full blocks in the prefix cache
        (those within its first ``num_tokens`` tokens, default: its computed ones)."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        hashes = self.seq_hashes.setdefault(seq.seq_id, [])
        start, end = len(hashes), (seq.num_computed_tokens if num_tokens is None else num_tokens) // bs
        if end <= start:                  # (most calls: a decode step fills a block once in block_size)
            return
        table = self.tables[seq.seq_id]
        tokens = seq.token_ids
        for i in range(start, end):
            h = block_key(hashes[-1] if hashes else seq.cache_root, tokens[i * bs:(i + 1) * bs])
            hashes.append(h)
            self.gpu.register(table[i], h)
        if seq.lora_root != ROOT_HASH:
            self._track_adapter(seq.lora_root, hashes[start:])

    # -- LoRA adapters' blocks ---------------------------------------------------
    def _track_adapter(self, root: int, keys: list[int]) -> None:
        self.adapter_keys.setdefault(root, []).extend(keys)
        self.adapter_keys_count += len(keys)
        held = self.num_gpu_blocks + (self.offload.num_blocks if self.offload is not None else 0)
        if self.adapter_keys_count > 2 * held:
            cached, tier = self.gpu.cached, self.offload.slots if self.offload is not None else {}
            self.adapter_keys = {r: kept for r, keys in self.adapter_keys.items()
                                 if (kept := [k for k in dict.fromkeys(keys) if k in cached or k in tier])}
            self.adapter_keys_count = sum(map(len, self.adapter_keys.values()))

    def forget_adapter(self, root: int) -> None:
        """Take the blocks of the adapter whose unsalted root is `root` out of the prefix cache and the CPU tier,
        its salted requests' too (an unloaded adapter's: a later one of its name must compute its own)."""
        keys = self.adapter_keys.pop(root, [])
        self.adapter_keys_count -= len(keys)
        for key in keys:
            block = self.gpu.cached.get(key)
            if block is not None:
                self.gpu.uncache(block)
        if self.offload is not None:
            self.offload.drop(keys)

    # -- chunked prefill (engine/core/chunked_scheduler.py) ----------------------
    # vLLM v1 holds only the blocks of the tokens computed so far: a prompt's
    # blocks arrive chunk by chunk, so admission and growth count blocks for a
    # token total rather than for the whole sequence.

    def cached_prefix(self, seq: Sequence) -> list[tuple[int, int]]:
        """(block, hash) of the longest cached prefix of the sequence, without taking
        it; never the whole sequence (its last token is always computed)."""
        if not self.enable_prefix_caching:
            return []
        cached = self.gpu.cached
        hit: list[tuple[int, int]] = []
        for h in chained_hashes(seq.token_ids, self.block_size, (seq.num_tokens - 1) // self.block_size,
                                seq.cache_root):
            block = cached.get(h)
            if block is None:
                break
            hit.append((block, h))
        return hit

    def blocks_to_admit(self, hit: list[tuple[int, int]], num_tokens: int) -> int:
        """Free blocks that admitting a sequence with prefix ``hit`` and ``num_tokens``
        slots would use: new blocks, plus hit blocks that are free but cached."""
        new = max(_blocks_for(num_tokens, self.block_size) - len(hit), 0)
        refs = self.gpu.ref_counts
        return new + sum(1 for block, _ in hit if refs[block] == 0)

    def admit(self, seq: Sequence, hit: list[tuple[int, int]], num_tokens: int) -> None:
        """Give a waiting sequence its cached prefix and blocks for its first ``num_tokens`` tokens."""
        table: list[int] = []
        for block, _ in hit:
            self.gpu.share(block)
            table.append(block)
        if self.enable_prefix_caching:
            self.seq_hashes[seq.seq_id] = [h for _, h in hit]
        seq.num_computed_tokens = len(hit) * self.block_size
        self.tables[seq.seq_id] = table
        self._extend(table, num_tokens)      # a hit is of full blocks: nothing to fill, only blocks to take

    def blocks_to_grow(self, seq: Sequence, num_tokens: int) -> int:
        return max(_blocks_for(num_tokens, self.block_size) - len(self.tables[seq.seq_id]), 0)

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        """Extend the sequence's blocks to hold ``num_tokens`` tokens (the caller checked they are free)."""
        bs = self.block_size
        gpu = self.gpu
        table = self.tables[seq.seq_id]
        if table and gpu.fill[table[-1]] < bs:
            gpu.set_fill(table[-1], min(bs, num_tokens - (len(table) - 1) * bs))
        self._extend(table, num_tokens)

    def _extend(self, table: list[int], num_tokens: int) -> None:
        """Fresh blocks after a table's full ones, to hold ``num_tokens`` tokens: full blocks, then the last
        (full or not). A hit's blocks are never read for their fill here: a running request's last one may
        be written lazily by the simulator's decode batch (planner/sim/batch.py)."""
        bs = self.block_size
        new = _blocks_for(num_tokens, bs) - len(table)
        if new > 0:
            table += self.gpu.take_many(new - 1, bs)
            table.append(self.gpu.take(num_tokens - len(table) * bs))

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Keep only the slots of the sequence's first ``num_tokens`` tokens: blocks past them go
        back to the pool (speculative decoding gives back its rejected drafts' slots this way;
        the next step's tokens overwrite what they hold)."""
        bs = self.block_size
        table = self.tables[seq.seq_id]
        keep = _blocks_for(num_tokens, bs)
        gpu = self.gpu
        while len(table) > keep:
            gpu.release(table.pop())
        if table and gpu.ref_counts[table[-1]] == 1:
            gpu.set_fill(table[-1], num_tokens - (keep - 1) * bs)

    # -- decoding ------------------------------------------------------------
    def _needs_block(self, table: list[int], num_tokens: int, ref_counts: list[int]) -> bool:
        """The sequence's next token needs a fresh block: its last block is full,
        or shared (copy-on-write)."""
        return len(table) * self.block_size < num_tokens or ref_counts[table[-1]] > 1

    def can_append_slots(self, group: SequenceGroup) -> bool:
        gpu = self.gpu
        free = len(gpu.free_list) + len(gpu.evictor)    # gpu.num_free(), inlined: hot path
        if self.slot_reservation == "vllm":
            # vLLM v0.2.0: "if there is at least one free block for each sequence".
            seqs = group.seqs
            if len(seqs) == 1:    # a running group's only sequence is running
                return free >= 1
            return group.num_seqs(_RUNNING) <= free
        tables, refs = self.tables, self.gpu.ref_counts
        needed = sum(1 for s in group.seqs if s.status is _RUNNING
                     and self._needs_block(tables[s.seq_id], s.num_tokens, refs))
        return needed <= free

    def can_append_slots_alone(self, group: SequenceGroup) -> bool:
        """Whether the group could grow if every other request left the GPU:
        if not, preempting others for it is useless (the cache is too small)."""
        held = {b for s in group.seqs if s.status is _RUNNING for b in self.tables[s.seq_id]}
        free = self.num_gpu_blocks - len(held)
        if self.slot_reservation == "vllm":
            return group.num_seqs(_RUNNING) <= free
        refs = self.gpu.ref_counts
        needed = sum(1 for s in group.seqs if s.status is _RUNNING
                     and self._needs_block(self.tables[s.seq_id], s.num_tokens, refs))
        return needed <= free

    def append_slots(self, seq: Sequence) -> tuple[int, int] | None:
        """Make room for the sequence's uncomputed tokens (one, when decoding).

        Returns ``(src, dst)`` when the last block was shared and had to be
        copied before writing (copy-on-write), else None.
        """
        bs = self.block_size
        gpu = self.gpu
        table = self.tables[seq.seq_id]
        n = len(seq.token_ids)
        held = len(table) * bs
        if held < n:
            table.append(gpu.take(n - held))
            return None
        last = table[-1]
        filled = n - held + bs
        if gpu.ref_counts[last] == 1:
            gpu.set_fill(last, filled)
            return None
        copy = gpu.take(filled)
        gpu.ref_counts[last] -= 1
        table[-1] = copy
        return last, copy

    def fork(self, parent: Sequence, child: Sequence) -> None:
        table = self.tables[parent.seq_id]
        refs = self.gpu.ref_counts
        for block in table:
            refs[block] += 1
        self.tables[child.seq_id] = list(table)
        if self.enable_prefix_caching:
            self.seq_hashes[child.seq_id] = list(self.seq_hashes.get(parent.seq_id, ()))

    def free(self, seq: Sequence) -> None:
        table = self.tables.pop(seq.seq_id, None)
        if table is not None:
            # Tail blocks first, so the LRU order evicts the ends of prefixes
            # before their shared beginnings.
            self.gpu.release_all(reversed(table))
        cpu_table = self.cpu_tables.pop(seq.seq_id, None)
        if cpu_table is not None:
            for block in cpu_table:
                self.cpu.release(block)
        if self.seq_hashes:
            self.seq_hashes.pop(seq.seq_id, None)

    # -- swapping ------------------------------------------------------------
    @staticmethod
    def _unique_blocks(tables: dict[int, list[int]], group: SequenceGroup,
                       status: SequenceStatus) -> set[int]:
        return {b for s in group.seqs if s.status is status for b in tables[s.seq_id]}

    def can_swap_out(self, group: SequenceGroup) -> bool:
        return len(self._unique_blocks(self.tables, group, _RUNNING)) <= self.cpu.num_free()

    def swap_out(self, group: SequenceGroup) -> dict[int, int]:
        """Move the group's running sequences to CPU blocks; returns {gpu_block: cpu_block}."""
        return self._move(group, _RUNNING, self.tables, self.cpu_tables, self.gpu, self.cpu)

    def can_swap_in(self, group: SequenceGroup) -> bool:
        blocks = len(self._unique_blocks(self.cpu_tables, group, _SWAPPED))
        if self.slot_reservation == "vllm":
            # vLLM v0.2.0: conservatively, every sequence allocates a block right after.
            growing = group.num_seqs(_SWAPPED)
        else:
            tables, refs = self.cpu_tables, self.cpu.ref_counts
            growing = sum(1 for s in group.seqs if s.status is _SWAPPED
                          and self._needs_block(tables[s.seq_id], s.num_tokens, refs))
        return self.gpu.num_free() - blocks - growing >= self.watermark_blocks

    def swap_in(self, group: SequenceGroup) -> dict[int, int]:
        """Bring the group's swapped sequences back; returns {cpu_block: gpu_block}."""
        return self._move(group, _SWAPPED, self.cpu_tables, self.tables, self.cpu, self.gpu)

    @staticmethod
    def _move(group: SequenceGroup, status: SequenceStatus, src_tables: dict[int, list[int]],
              dst_tables: dict[int, list[int]], src: BlockPool, dst: BlockPool) -> dict[int, int]:
        """Copy the tables of the group's ``status`` sequences from one pool to the
        other, keeping blocks shared between them shared; returns {src: dst}."""
        mapping: dict[int, int] = {}
        for seq in group.seqs:
            if seq.status is not status:
                continue
            table = []
            for block in src_tables.pop(seq.seq_id):
                moved = mapping.get(block)
                if moved is None:
                    moved = mapping[block] = dst.take(src.fill[block])
                else:
                    dst.ref_counts[moved] += 1
                table.append(moved)
                src.release(block)
            dst_tables[seq.seq_id] = table
        return mapping

    # -- accounting ----------------------------------------------------------
    def memory_breakdown(self) -> MemoryBreakdown:
        used = self.gpu.num_used()
        bs = self.block_size
        tokens = self.gpu.num_token_states
        # Paged waste is the unfilled tail of blocks in use: at most one block per sequence.
        return MemoryBreakdown(token_states=tokens, reserved=0, internal_fragmentation=used * bs - tokens,
                               external_fragmentation=0, free=self.gpu.num_free() * bs)
