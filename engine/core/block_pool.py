"""One pool of physical KV blocks: reference counts, fill counts, free blocks.

The block manager keeps two, one for the GPU cache and one for the CPU swap
space. A block whose prompt prefix is registered in the prefix cache is not
forgotten when its last user frees it: it waits in an LRU order (the
"evictor") and is handed out again only when no plain free block is left, so a
later request with the same prefix can still reuse it. Only the GPU pool ever
registers hashes.
"""
from __future__ import annotations

from collections import OrderedDict


class BlockPool:
    __slots__ = ("num_blocks", "ref_counts", "fill", "free_list", "num_token_states",
                 "block_hash", "cached", "evictor", "events")

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self.fill = [0] * num_blocks                  # slots holding a token, per block
        self.free_list = list(range(num_blocks - 1, -1, -1))   # pop() gives block 0 first
        self.num_token_states = 0                     # sum of fill over blocks in use
        self.block_hash: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}              # prefix hash -> block
        self.evictor: OrderedDict[int, None] = OrderedDict()   # free cached blocks, LRU first
        # None, or a list that receives (True, hash) when a block enters the prefix cache
        # and (False, hash) when one leaves it: vLLM's KV events (BlockStored,
        # BlockRemoved), which a prefix-aware router reads (planner/sim/router.py).
        self.events: list | None = None

    def num_free(self) -> int:
        return len(self.free_list) + len(self.evictor)

    def num_used(self) -> int:
        return self.num_blocks - len(self.free_list) - len(self.evictor)

    def take(self, filled: int = 0) -> int:
        """A block with one reference holding ``filled`` tokens; plain free blocks
        first, then the least recently used cached one (dropping its hash)."""
        if self.free_list:
            block = self.free_list.pop()
        else:
            block, _ = self.evictor.popitem(last=False)
            self._forget(block, self.block_hash[block])
            self.fill[block] = 0
        self.ref_counts[block] = 1
        self.num_token_states += filled
        self.fill[block] = filled
        return block

    def _forget(self, block: int, prefix_hash: int) -> None:
        """A cached block is handed out again: its prefix leaves the cache (a KV event says so)."""
        del self.cached[prefix_hash]
        self.block_hash[block] = None
        if self.events is not None:
            self.events.append((False, prefix_hash))

    def take_many(self, count: int, filled: int) -> list[int]:
        """`count` blocks as `take(filled)` hands them out one after another (from the free list's
        end in one slice when it holds them all: a step's or a prompt's blocks, the paper's busiest call)."""
        free = self.free_list
        if count > len(free):
            return [self.take(filled) for _ in range(count)]
        rest = len(free) - count
        blocks = free[rest:]
        blocks.reverse()                           # the order pop() gives them
        del free[rest:]
        refs, fill = self.ref_counts, self.fill
        for block in blocks:
            refs[block] = 1
            fill[block] = filled
        self.num_token_states += count * filled
        return blocks

    def share(self, block: int) -> None:
        """One more reference; revives a block waiting in the evictor."""
        if self.ref_counts[block] == 0:
            del self.evictor[block]
            self.num_token_states += self.fill[block]
        self.ref_counts[block] += 1

    def set_fill(self, block: int, filled: int) -> None:
        self.num_token_states += filled - self.fill[block]
        self.fill[block] = filled

    def release(self, block: int) -> None:
        refs = self.ref_counts[block] - 1
        self.ref_counts[block] = refs
        if refs == 0:
            self.num_token_states -= self.fill[block]
            if self.block_hash[block] is not None:
                self.evictor[block] = None   # keep its contents for a later prefix hit
            else:
                self.fill[block] = 0
                self.free_list.append(block)

    def release_all(self, blocks) -> None:
        """``release`` each of ``blocks`` in order (a sequence's table when it is freed; one
        call instead of one per block)."""
        refs, fill, hashes, free_list = self.ref_counts, self.fill, self.block_hash, self.free_list
        tokens = self.num_token_states
        for block in blocks:
            count = refs[block] - 1
            refs[block] = count
            if count == 0:
                tokens -= fill[block]
                if hashes[block] is not None:
                    self.evictor[block] = None
                else:
                    fill[block] = 0
                    free_list.append(block)
        self.num_token_states = tokens

    def uncache(self, block: int) -> None:
        """Take ``block`` out of the prefix cache (a KV event says so); a free one becomes a plain free block."""
        self._forget(block, self.block_hash[block])
        if self.ref_counts[block] == 0:
            del self.evictor[block]
            self.fill[block] = 0
            self.free_list.append(block)

    def register(self, block: int, prefix_hash: int) -> None:
        """Record that ``block`` holds the full block whose chained prefix hash is given."""
        if self.block_hash[block] is None and prefix_hash not in self.cached:
            self.block_hash[block] = prefix_hash
            self.cached[prefix_hash] = block
            if self.events is not None:
                self.events.append((True, prefix_hash))
