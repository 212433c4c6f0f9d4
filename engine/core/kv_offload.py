"""vLLM's native CPU KV-cache offloading (`vllm serve --kv-offloading-size GIB`): a second prefix cache in
host memory behind the GPU's.

vLLM turns `--kv-offloading-size` into its OffloadingConnector (vLLM 0.11 and later) with a CPU medium
(vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py and its scheduler half;
vllm/v1/kv_offload/cpu.py and lru_manager.py). What it does, and what this tier does the same way:

- **Write-through.** Each step, every scheduled request's blocks that have become full since it last
  offered any (from its first block, GPU prefix hits included; after its loaded ones for a request that
  loaded) are offered to the CPU tier by their prefix-cache keys. Keys already there are skipped; the
  others take free slots, evicting the least recently used ready block that no load holds. When not enough
  can be evicted the request's blocks are not stored this step and are offered again at its next one.
- **Ready a step later.** A stored block's copy runs beside the next step; until then a lookup stops at it.
  (vLLM submits the store at the next step's start and sees it done at a later step's end; a block that
  young is still on the GPU, so the step of difference changes no hit.)
- **Lookup at admission.** A waiting request that starts from nothing (a new one, or one preempted by
  recompute) first takes its GPU prefix-cache hits, then asks the tier for the keys of its full blocks
  after them (the whole prompt's full blocks, its last one included): all its keys are touched, most
  recent first for the first block (so a prefix's tail is evicted before its head), and the run of
  consecutive ready keys after the GPU hit is the hit. One whose hit keys another request is loading waits
  (vLLM's `_blocks_being_loaded`: the next step finds them in the GPU's prefix cache instead).
- **Asynchronous load.** A request with a hit takes GPU blocks for its GPU hit and the loaded blocks
  (admitted only if its whole sequence fits, as any waiting request), is parked while the copy runs in
  this step (vLLM's WAITING_FOR_REMOTE_KVS: no budget, not in max_num_seqs), and at the next step joins
  the waiting pass again with those tokens computed (less one if that is all of them: the last token is
  recomputed to sample from), its loaded blocks in the GPU's prefix cache.

This module is the tier's bookkeeping: keys, slots and their LRU order, with no tensors; the block manager
(chunked_scheduler.VllmBlockManager) drives it and the runner copies the blocks it names.
"""
from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, fields

GiB = 1 << 30


def offload_blocks(size_gib: float, block_bytes_per_gpu: float, world_size: int) -> int:
    """The CPU tier's blocks for `--kv-offloading-size size_gib`: vLLM's CPUOffloadingSpec divides the
    size (summed over the ranks) by a block's bytes on every rank (vllm/v1/kv_offload/cpu.py)."""
    return int(size_gib * GiB // (block_bytes_per_gpu * world_size))


@dataclass(slots=True)
class Load:
    """A parked request's load from the CPU tier."""

    keys: list[int]          # the blocks loaded (their prefix-cache keys)
    tokens: int              # its computed tokens once they are in: the GPU hit's and the loaded blocks'
    done: bool = False       # the copy has run (the step it was issued in is over)


@dataclass
class OffloadStats:
    """The tier's counters, for a run's results."""

    queried_tokens: int = 0       # tokens of the lookups (admissions from nothing) that asked the tier
    hit_tokens: int = 0           # of those, tokens loaded from it
    blocks_loaded: int = 0
    blocks_stored: int = 0
    stores_refused: int = 0       # offers of a request's new blocks the full tier could not take

    @classmethod
    def total(cls, many) -> OffloadStats:
        """The counters of several tiers (a fleet's replicas) summed."""
        return cls(*(sum(getattr(s, f.name) for s in many) for f in fields(cls)))

    def as_dict(self) -> dict:
        """The counters and the hit rate (of the prompt tokens looked up), for result files."""
        return {"hit_tokens": self.hit_tokens,
                "hit_rate": self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0,
                "blocks_loaded": self.blocks_loaded, "blocks_stored": self.blocks_stored,
                "stores_refused": self.stores_refused}


class CpuKvTier:
    """The CPU tier's keys in LRU order (least recent first), their slots, and the keys not yet ready
    (stored this step) or held (being loaded)."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"the CPU KV tier needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.slots: OrderedDict[int, int] = OrderedDict()   # key -> slot
        self.free: list[int] = list(range(num_blocks - 1, -1, -1))   # slot 0 first
        self.pending: list[int] = []                           # stored this step: ready at the next
        self.not_ready: set[int] = set()
        self.held: Counter[int] = Counter()                    # keys being loaded, by how many loads
        self.stats = OffloadStats()

    def lookup(self, keys) -> int:
        """How many of `keys`, from the first, are in the tier and ready."""
        slots, not_ready = self.slots, self.not_ready
        count = 0
        for key in keys:
            if key not in slots or key in not_ready:
                break
            count += 1
        return count

    def touch(self, keys) -> None:
        """Mark `keys` recently used, the first the most recent (vLLM's LRU touches them in reverse)."""
        slots = self.slots
        for key in reversed(keys):
            if key in slots:
                slots.move_to_end(key)

    def store(self, keys) -> list[tuple[int, int]] | None:
        """Take `keys` in (those not already in): [(key, slot)] to copy, or None when the tier cannot
        evict enough ready, unheld blocks for them (then nothing is stored)."""
        slots = self.slots
        new = [k for k in dict.fromkeys(keys) if k not in slots]
        short = len(new) - len(self.free)
        if short > 0:
            held, not_ready = self.held, self.not_ready
            victims = []
            for key in slots:
                if key not in held and key not in not_ready:
                    victims.append(key)
                    if len(victims) == short:
                        break
            else:
                self.stats.stores_refused += 1
                return None
            for key in victims:
                self.free.append(slots.pop(key))
        placed = []
        for key in new:
            slot = slots[key] = self.free.pop()
            self.not_ready.add(key)
            self.pending.append(key)
            placed.append((key, slot))
        self.stats.blocks_stored += len(placed)
        return placed

    def complete_stores(self) -> None:
        """The copies of the last step's stores are done: their blocks are ready."""
        if self.pending:
            self.not_ready.difference_update(self.pending)
            self.pending.clear()

    def drop(self, keys) -> None:
        """Forget those of `keys` the tier holds (an unloaded adapter's blocks): their slots are free again.
        None is being loaded (the adapter's requests have all finished)."""
        slots, dropped = self.slots, set()
        for key in keys:
            slot = slots.pop(key, None)
            if slot is not None:
                self.free.append(slot)
                dropped.add(key)
        if dropped & self.not_ready:
            self.not_ready -= dropped
            self.pending = [key for key in self.pending if key not in dropped]

    def hold(self, keys) -> None:
        self.held.update(keys)

    def release(self, keys) -> None:
        held = self.held
        for key in keys:
            held[key] -= 1
            if not held[key]:
                del held[key]

