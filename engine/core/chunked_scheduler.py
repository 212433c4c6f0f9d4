"""vLLM v1's scheduling policy: a per-step token budget, chunked prefill, mixed steps.

The behaviour follows ``vllm/v1/core/sched/scheduler.py`` and
``vllm/v1/core/kv_cache_manager.py`` of vLLM 0.19.0 (the synchronous
``Scheduler``; async scheduling and speculative decoding are not modelled).
There is no prefill or decode phase: each request has tokens and computed
tokens, and every step hands out at most ``max_num_batched_tokens`` of them:

1. Running requests first, in running-list order: each gets its uncomputed
   tokens (one when decoding, the rest of its prompt when prefilling), capped
   by what is left of the budget. It holds KV blocks only for the tokens
   computed so far plus this step's; when a block cannot be had, the last
   request of the running list is preempted by recompute (freed, put back at
   the head of the waiting queue), until the request fits or was the victim
   itself, which ends the pass over the running list.
2. Then, only if nothing was preempted, waiting requests in order while the
   budget lasts and fewer than ``max_num_seqs`` run: a request takes its
   prefix-cache hits and the budget's worth of its (remaining) prompt. With
   ``reserve_full_isl`` (vLLM's ``scheduler_reserve_full_isl``, on by default)
   it is admitted only if its whole sequence fits in the free blocks, not just
   its first chunk; the first request that does not fit ends admission.

In both passes a request's tokens are first capped at
``long_prefill_token_threshold`` when it is set (vLLM's
``--long-prefill-token-threshold``; 0, the default, leaves the budget alone):
a long prompt then goes in chunks of at most that many tokens.

Without chunked prefill (vLLM's ``--no-enable-chunked-prefill``, still v1's
scheduler) a waiting request whose tokens (after its prefix-cache hits and
the threshold) exceed the budget left ends admission instead of taking a
chunk, and waits for a step with budget enough; the budget holds at least
``max_model_len`` tokens, so an emptier step always has room.

Under ``--scheduling-policy priority`` the waiting queue is ordered by each
request's priority (the lower value first), then arrival
(``engine/core/request_queue.py``), and a request that cannot have its blocks
preempts the running request of the lowest priority and latest arrival, not
the last one; if that one was scheduled earlier in the same step it is taken
out of the step again, its tokens returned to the budget.

Block 0 is vLLM's null block, never used, so N blocks hold N-1. Full blocks
enter the prefix cache as soon as they are scheduled (a request admitted later
in the same step can already hit them: the runner writes every new key and
value before any attention reads the cache). A preempted request comes back
through the waiting queue and recomputes its prompt and outputs, hitting its
own blocks in the prefix cache when caching is on. A step samples only for
requests whose computed tokens reach their length; a partial prompt chunk
samples nothing.

With a CPU tier behind the prefix cache (``--kv-offloading-size``, vLLM's
native offloading: engine/core/kv_offload.py), a request starting from nothing
also looks up its blocks after its GPU hits in the tier; with a hit it is
parked for one step while they load (blocks held, no budget, not counted in
``max_num_seqs``), then admitted with them computed. Every scheduled request's
newly full blocks are stored to the tier after the step. Where nothing runs and
the head of the queue cannot have its blocks because loaded requests behind it
hold them, those give them back (vLLM 0.19 would wait forever there).

One sequence per request: vLLM v1 turns ``n > 1`` into independent requests,
and has no beam search in its scheduler, so such requests are rejected here.
"""
from __future__ import annotations

from collections import OrderedDict
from operator import attrgetter

from engine.core.block_keys import chained_hashes
from engine.core.block_manager import BlockManager, _blocks_for, blocks_at_most
from engine.core.block_pool import BlockPool
from engine.core.config import SchedulerConfig
from engine.core.kv_offload import CpuKvTier, Load
from engine.core.request_queue import PriorityQueue
from engine.core.scheduler import Samples, Scheduler, SchedulerOutput
from engine.core.sequence import Sequence, SequenceGroup, SequenceStatus

NULL_BLOCK = 0   # vLLM v1's null block: never handed out, so N blocks hold N-1


class VllmBlockPool(BlockPool):
    """h1's block pool with vLLM v1's free-block order.

    vLLM keeps every free block, cached or not, in one queue: a block freed
    goes to the back, a new block comes from the front (the oldest freed
    first), and a cached block taken that way loses its cache entry. So a
    freed prompt stays hittable until the queue comes round to it, even while
    never-used blocks remain (the paper's pool hands those out first). The
    order decides which prefixes survive, so matching vLLM's prefix-cache hits
    needs it. Here ``evictor`` is that one queue and ``free_list`` stays empty.
    """

    __slots__ = ()

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self.free_list = []
        self.evictor = OrderedDict.fromkeys(range(num_blocks))
        if num_blocks:
            self.take()              # the null block: held by no sequence, so never released

    def take(self, filled: int = 0) -> int:
        block, _ = self.evictor.popitem(last=False)
        h = self.block_hash[block]
        if h is not None:
            self._forget(block, h)
        self.ref_counts[block] = 1
        self.num_token_states += filled
        self.fill[block] = filled
        return block

    def take_many(self, count: int, filled: int) -> list[int]:
        """`count` blocks as `take(filled)` hands them out one after another (one call for a step's
        or a prompt's blocks: the simulator's busiest call)."""
        popitem, hashes, refs, fill = self.evictor.popitem, self.block_hash, self.ref_counts, self.fill
        blocks = []
        for _ in range(count):
            block = popitem(False)[0]
            h = hashes[block]
            if h is not None:
                self._forget(block, h)
            refs[block] = 1
            fill[block] = filled
            blocks.append(block)
        self.num_token_states += count * filled
        return blocks

    def release(self, block: int) -> None:
        refs = self.ref_counts[block] - 1
        self.ref_counts[block] = refs
        if refs == 0:
            self.num_token_states -= self.fill[block]
            if self.block_hash[block] is None:
                self.fill[block] = 0
            self.evictor[block] = None

    def uncache(self, block: int) -> None:
        """Take ``block`` out of the prefix cache; a free one keeps its place in the free queue (vLLM's)."""
        self._forget(block, self.block_hash[block])
        if self.ref_counts[block] == 0:
            self.fill[block] = 0

    def release_all(self, blocks) -> None:
        """``release`` each of ``blocks`` in order (one call for a freed sequence's table)."""
        refs, fill, hashes, evictor = self.ref_counts, self.fill, self.block_hash, self.evictor
        tokens = self.num_token_states
        for block in blocks:
            count = refs[block] - 1
            refs[block] = count
            if count == 0:
                tokens -= fill[block]
                if hashes[block] is None:
                    fill[block] = 0
                evictor[block] = None
        self.num_token_states = tokens


class VllmBlockManager(BlockManager):
    """The paged block manager over a ``VllmBlockPool``: GPU blocks only (the
    chunked policy preempts by recompute), no watermark (vLLM v1 has none).

    ``state_blocks``: blocks each sequence also holds from admission to its end for a hybrid model's
    recurrent states (Qwen3.5's Gated DeltaNet layers: vLLM's MambaManager gives a running request one
    block per group of those layers, from the same pool, whatever its length)."""

    supports_swap = False

    def __init__(self, block_size: int, num_gpu_blocks: int, *, enable_prefix_caching: bool = False,
                 state_blocks: int = 0, offload_blocks: int = 0) -> None:
        super().__init__(block_size, num_gpu_blocks, 0, watermark=0.0, enable_prefix_caching=enable_prefix_caching)
        self.gpu = VllmBlockPool(num_gpu_blocks)
        if state_blocks < 0:
            raise ValueError(f"state_blocks must be >= 0, got {state_blocks}")
        self.state_blocks = state_blocks
        self.states: dict[int, list[int]] = {}      # seq id -> its state blocks
        # --kv-offloading-size: the CPU tier behind the prefix cache (engine/core/kv_offload.py)
        if offload_blocks and not enable_prefix_caching:
            raise ValueError("KV offloading stores prefix-cache blocks: it needs prefix caching on")
        self.offload = CpuKvTier(offload_blocks) if offload_blocks else None
        self.offered: dict[int, int] = {}           # seq id -> how many of its first blocks it offered the tier
        self.loads: dict[int, Load] = {}            # seq id -> its load from the tier, until it runs

    def blocks_to_admit(self, hit: list[tuple[int, int]], num_tokens: int) -> int:
        return super().blocks_to_admit(hit, num_tokens) + self.state_blocks

    def admit(self, seq: Sequence, hit: list[tuple[int, int]], num_tokens: int) -> None:
        super().admit(seq, hit, num_tokens)
        if self.state_blocks:
            self.states[seq.seq_id] = self.gpu.take_many(self.state_blocks, 0)

    def free(self, seq: Sequence) -> None:
        super().free(seq)
        state = self.states.pop(seq.seq_id, None)
        if state is not None:
            self.gpu.release_all(state)
        if self.offload is not None:
            self.offered.pop(seq.seq_id, None)
            load = self.loads.pop(seq.seq_id, None)
            if load is not None and not load.done:       # (an abort while parked)
                self.offload.release(load.keys)

    # -- the CPU tier (--kv-offloading-size) -------------------------------------
    def offload_hit(self, seq: Sequence, hit: list[tuple[int, int]]) -> list[int] | None:
        """The keys of the sequence's full blocks after its GPU `hit` (cached_prefix's) that the CPU tier holds
        ready, in order ([] for none; vLLM counts the prompt's last block too), or None when another request
        is loading some of them (this one waits a step). Touches all its full blocks' keys."""
        tier, local = self.offload, len(hit)
        keys = self.tier_keys(seq, hit)
        tier.touch(keys)
        hit = keys[local:local + tier.lookup(keys[local:])]
        if any(key in tier.held for key in hit):
            return None
        return hit

    def tier_keys(self, seq: Sequence, hit: list[tuple[int, int]]) -> list[int]:
        """The keys of the sequence's full blocks (its whole tokens'), the GPU `hit`'s first: the chain goes on
        from the hit's last key."""
        bs, local = self.block_size, len(hit)
        keys = [h for _, h in hit]
        keys += chained_hashes(seq.token_ids[local * bs:], bs, seq.num_tokens // bs - local,
                               keys[-1] if keys else seq.cache_root)
        return keys

    def park(self, seq: Sequence, hit: list[tuple[int, int]], keys: list[int]) -> dict[int, int]:
        """Blocks for the GPU `hit` and fresh ones for the `keys` loaded from the tier, the load recorded
        (the sequence stays waiting); returns {tier slot: GPU block} to copy."""
        local = len(hit)
        self.admit(seq, hit, (local + len(keys)) * self.block_size)
        table, tier = self.tables[seq.seq_id], self.offload
        tier.hold(keys)
        tier.stats.blocks_loaded += len(keys)
        self.loads[seq.seq_id] = Load(keys, (local + len(keys)) * self.block_size)
        self.offered[seq.seq_id] = local + len(keys)     # (vLLM stores from after the loaded blocks)
        return {tier.slots[key]: table[local + i] for i, key in enumerate(keys)}

    def loads_done(self) -> None:
        """The loads issued in the last step have run: their keys are free to evict again."""
        for load in self.loads.values():
            if not load.done:
                load.done = True
                self.offload.release(load.keys)

    def offload_stores(self, seqs) -> dict[int, int]:
        """Offer the tier each scheduled sequence's blocks full since it last offered any; returns
        {GPU block: tier slot} to copy after the step computes them."""
        tier, copies = self.offload, {}
        for seq in seqs:
            hashes = self.seq_hashes.get(seq.seq_id)
            start = self.offered.get(seq.seq_id, 0)
            if not hashes or len(hashes) <= start:
                continue
            placed = tier.store(hashes[start:])
            if placed is None:
                continue                                  # offered again at its next step
            self.offered[seq.seq_id] = len(hashes)
            if placed:
                tier.touch(hashes)
                table = self.tables[seq.seq_id]
                index = {key: i for i, key in enumerate(hashes[start:], start)}
                for key, slot in placed:
                    copies[table[index[key]]] = slot
        return copies


def make_scheduler(config: SchedulerConfig, allocator) -> Scheduler:
    """The scheduler of the policy the config names (the paper's by default)."""
    if config.vllm_v1:
        return ChunkedScheduler(config, allocator)
    return Scheduler(config, allocator)


class ChunkedScheduler(Scheduler):
    """The chunked-prefill policy over the paper's block manager (queues and updates are shared)."""

    def __init__(self, config: SchedulerConfig, allocator: VllmBlockManager, *,
                 reserve_full_isl: bool = True) -> None:
        if not config.vllm_v1:
            raise ValueError("ChunkedScheduler needs a SchedulerConfig with vllm_v1=True")
        if not isinstance(allocator, VllmBlockManager):
            raise ValueError("chunked prefill needs the paged VllmBlockManager (vLLM v1's block order "
                             "and null block), not " + type(allocator).__name__)
        super().__init__(config, allocator)
        self.by_priority = config.scheduling_policy == "priority"
        if self.by_priority:
            self.waiting = PriorityQueue()
        self.reserve_full_isl = reserve_full_isl
        self.null_block = NULL_BLOCK
        self.usable_blocks = allocator.num_gpu_blocks - 1 - allocator.state_blocks   # (a sequence's states aside)
        # Prefix-cache statistics as vLLM keeps them (vllm/v1/metrics/stats.py, PrefixCacheStats): tokens of
        # admitted sequences, and of those, tokens found in the cache; a preempted request's return is counted
        # apart, as vLLM's preempted_queries and preempted_hits, and is not in its hit rate.
        self.prefix_queried_tokens = self.prefix_hit_tokens = 0
        self.preempted_queried_tokens = self.preempted_hit_tokens = 0
        # LoRA: the adapters in the GPU's slots, least recently used first (activate_loras)
        self.lora_slots: OrderedDict[int, None] = OrderedDict()
        self.kv_loads: dict[int, int] = {}      # the step's loads from the CPU tier: {tier slot: GPU block}

    def schedule(self, now: float) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        offload = self.allocator.offload
        if offload is not None:         # the last step's copies are done
            offload.complete_stores()
            self.allocator.loads_done()
            self.kv_loads = {}
        groups: list[SequenceGroup] = []
        seqs = []
        counts: list[int] = []
        preempted: list[SequenceGroup] = []
        rejected: list[SequenceGroup] = []
        truncated: list[SequenceGroup] = []
        spec: dict[int, list[int]] | None = {} if self.proposer is not None else None
        budget = self._schedule_running(budget, groups, seqs, counts, preempted, spec)
        if not preempted:
            budget = self.schedule_waiting(now, budget, groups, seqs, counts, rejected, truncated)
        num_tokens = self.config.max_num_batched_tokens - budget
        # A step is a "prefill" one only when it decodes nothing (kept for the
        # paper-era consumers that classify steps as a whole).
        if spec:    # a sequence verifying drafts decodes: its drafts are not prompt tokens
            is_prefill = all(not _is_decode(s, n - len(spec.get(s.seq_id, ()))) for s, n in zip(seqs, counts))
        else:
            is_prefill = bool(seqs) and all(not _is_decode(s, n) for s, n in zip(seqs, counts))
        out = SchedulerOutput(is_prefill, groups, seqs, num_tokens, preempted=preempted,
                              rejected=rejected, truncated=truncated, num_scheduled_tokens=counts,
                              spec_token_ids=spec or None)
        if self.config.max_loras is not None:
            out.lora_adapters, out.lora_loads = self.activate_loras(groups)
        if offload is not None:
            out.kv_loads, out.kv_stores = self.kv_loads, self.allocator.offload_stores(seqs)
        out.token_split = split_tokens(out)      # before update moves the computed counts
        return out

    def _schedule_running(self, budget: int, groups: list, seqs: list, counts: list, preempted: list,
                          spec: dict[int, list[int]] | None = None) -> int:
        """Pass 1: running requests in running order, each given its uncomputed tokens
        capped by the budget, preempting from the back of the running list when its
        blocks cannot be had. Collects the step's entries; returns the budget left.

        With speculation (``spec`` a dict), a decoding request's draft tokens join its new
        tokens, as vLLM v1's ``num_tokens_with_spec``: they count in the budget (drafts past
        it are dropped) and their KV slots are allocated with the rest, preempting as any
        growth does. The drafts scheduled are collected into ``spec``."""
        allocator = self.allocator
        running = self.running
        i = 0
        while i < len(running) and budget > 0:
            group = running[i]
            seq = group.seqs[0]
            cap = self.chunk_cap(budget)
            num_new = min(seq.num_tokens - seq.num_computed_tokens, cap)
            if num_new <= 0:
                i += 1
                continue
            drafts = None
            if spec is not None and seq.num_tokens - seq.num_computed_tokens == 1 and seq.num_tokens > seq.prompt_len:
                drafts = self.proposer.propose(group, seq)[:cap - 1]
                num_new += len(drafts)
            total = seq.num_computed_tokens + num_new
            while allocator.blocks_to_grow(seq, total) > allocator.num_free_blocks():
                if self.by_priority:
                    victim, budget, i = self._take_victim(budget, i, groups, seqs, counts, spec)
                else:
                    victim = running.pop()       # the last request of the running list
                self._preempt(victim, {})
                preempted.append(victim)
                if victim is group:
                    break
            if group in preempted:
                break                        # it could not fit even alone: stop here, as vLLM does
            allocator.grow(seq, total)
            self._cache(seq, total)
            groups.append(group)
            seqs.append(seq)
            counts.append(num_new)
            if drafts:
                spec[seq.seq_id] = drafts
            budget -= num_new
            i += 1
        return budget

    def _take_victim(self, budget: int, i: int, groups: list, seqs: list, counts: list,
                     spec: dict | None) -> tuple[SequenceGroup, int, int]:
        """Priority policy: the running request of the lowest priority, latest arrival (the last added of
        simultaneous ones: `SequenceGroup.priority_key`), taken out of the running list, and out of this
        step if it was scheduled earlier in it, its tokens back in the budget and the pass's index one back
        (vllm/v1/core/sched/scheduler.py: only then, as there). Returns it, the budget and the index."""
        running = self.running
        victim = max(running, key=attrgetter("priority_key"))
        running.remove(victim)
        if victim in groups:
            k = groups.index(victim)
            budget += counts.pop(k)
            del groups[k]
            seq = seqs.pop(k)
            if spec is not None:
                spec.pop(seq.seq_id, None)
            i -= 1
        return victim, budget, i

    def schedule_waiting(self, now: float, budget: int, groups: list, seqs: list, counts: list,
                         rejected: list, truncated: list) -> int:
        """Pass 2 (only in a step that preempted nothing): waiting requests in order,
        while the budget lasts and fewer than ``max_num_seqs`` run, each with its
        prefix-cache hits and a chunk of its prompt; the first that does not fit ends
        admission. Collects the step's entries; returns the budget left. (Public for the
        simulator's fast path, which decodes the running requests itself and then
        admits through this very pass.)"""
        allocator = self.allocator
        max_num_seqs = self.config.max_num_seqs
        loras = self.running_loras()
        passed_over: list[SequenceGroup] = []
        offload = allocator.offload
        while self.waiting and budget > 0 and len(self.running) < max_num_seqs:
            group = self.waiting[0]
            load = allocator.loads.get(group.seqs[0].seq_id) if offload is not None else None
            if load is not None:        # parked: its KV is loading from the CPU tier, or has just come in
                if not load.done or self.lora_passes_over(group, loras):
                    passed_over.append(self.waiting.popleft())
                    continue
                num_new = self._admit_loaded(group, load, budget, now)
                if num_new is None:
                    if self._unpark_behind(group, passed_over):
                        continue
                    break
                self._admitted(group, num_new, groups, seqs, counts, loras)
                budget -= num_new
                continue
            problem = self.never_fits(group)
            if problem is not None:
                self.waiting.popleft()
                if group.times.first_token is None:
                    self._reject(group, problem, now, rejected)
                else:   # preempted after it outgrew the whole cache: end it where it is
                    self._truncate(group, now, truncated)
                continue
            if self.lora_passes_over(group, loras):
                passed_over.append(self.waiting.popleft())
                continue
            seq = group.seqs[0]
            hit = allocator.cached_prefix(seq)
            if offload is not None:
                keys = allocator.offload_hit(seq, hit)
                if keys is None:        # another request is loading its blocks: next step they are on the GPU
                    passed_over.append(self.waiting.popleft())
                    continue
                if keys:
                    if not self._park(group, hit, keys):
                        if self._unpark_behind(group, passed_over):
                            continue
                        break
                    passed_over.append(self.waiting.popleft())
                    continue
            computed = len(hit) * allocator.block_size
            num_new = self.admitted_tokens(seq.num_tokens - computed, budget)
            if num_new is None:
                break
            free = allocator.num_free_blocks()
            if ((self.reserve_full_isl and allocator.blocks_to_admit(hit, seq.num_tokens) > free)
                    or allocator.blocks_to_admit(hit, computed + num_new) > free):
                if offload is not None and self._unpark_behind(group, passed_over):
                    continue
                break
            self._admit_chunk(group, hit, computed, num_new, now)
            self._admitted(group, num_new, groups, seqs, counts, loras)
            budget -= num_new
        if passed_over:                 # back at the head, in their order, as vLLM's skipped requests
            self.waiting.extendleft(reversed(passed_over))
        return budget

    @staticmethod
    def _admitted(group: SequenceGroup, num_new: int, groups: list, seqs: list, counts: list,
                  loras: set[int] | None) -> None:
        """A request admitted from the waiting queue joins the step's entries."""
        groups.append(group)
        seqs.append(group.seqs[0])
        counts.append(num_new)
        if loras is not None and group.lora_id:
            loras.add(group.lora_id)

    def _park(self, group: SequenceGroup, hit: list[tuple[int, int]], keys: list[int]) -> bool:
        """A request whose blocks after its GPU `hit` the CPU tier holds (`keys`): blocks for both, if its
        whole sequence fits (as any admission), and their load issued in this step; it stays waiting, with no
        budget spent (vLLM's WAITING_FOR_REMOTE_KVS). False when the blocks cannot be had."""
        seq, allocator = group.seqs[0], self.allocator
        loaded = (len(hit) + len(keys)) * allocator.block_size
        free = allocator.num_free_blocks()
        if self.reserve_full_isl and allocator.blocks_to_admit(hit, seq.num_tokens) > free:
            return False
        if allocator.blocks_to_admit(hit, loaded) > free:
            return False
        self.count_lookup(group, seq.num_tokens, len(hit) * allocator.block_size,
                          len(keys) * allocator.block_size)
        self.kv_loads.update(allocator.park(seq, hit, keys))
        return True

    def _unpark_behind(self, head: SequenceGroup, passed_over: list[SequenceGroup]) -> bool:
        """Nothing runs and the `head` of the queue cannot have its blocks: the other waiting requests whose
        loads from the CPU tier are in give their blocks back (their loaded blocks stay in the prefix cache)
        and look their prefix up again at their turn. Else the queue would wait forever, every block held by
        requests behind its head (vLLM 0.19's scheduler would). True if any gave blocks back."""
        if self.running:
            return False
        allocator, freed = self.allocator, False
        for group in (*passed_over, *self.waiting):
            seq = group.seqs[0]
            load = allocator.loads.get(seq.seq_id)
            if group is not head and load is not None and load.done:
                self._cache(seq, load.tokens)       # (as loaded blocks enter it when their request goes on)
                allocator.free(seq)
                seq.num_computed_tokens = 0
                freed = True
        return freed

    def _admit_loaded(self, group: SequenceGroup, load: Load, budget: int, now: float) -> int | None:
        """A request whose load from the CPU tier has run: its tokens computed (less one if that is all of
        them), its loaded blocks in the prefix cache, and a chunk of the rest admitted as any waiting
        request's. The chunk's tokens, or None when it must wait (it keeps its blocks)."""
        seq, allocator = group.seqs[0], self.allocator
        computed = min(load.tokens, seq.num_tokens)
        if computed == seq.num_tokens:
            computed -= 1               # the last token is computed again, to sample from
        seq.num_computed_tokens = computed
        self._cache(seq, computed)
        num_new = self.admitted_tokens(seq.num_tokens - computed, budget)
        if num_new is None:
            return None
        free = allocator.num_free_blocks()
        if self.reserve_full_isl and allocator.blocks_to_grow(seq, seq.num_tokens) > free:
            return None
        if allocator.blocks_to_grow(seq, computed + num_new) > free:
            return None
        self.waiting.popleft()
        del allocator.loads[seq.seq_id]
        allocator.grow(seq, computed + num_new)
        self._cache(seq, computed + num_new)
        self._run(group, now)
        return num_new

    def running_loras(self) -> set[int] | None:
        """The adapters of the running requests (which all run in a step that reaches the waiting pass), or
        None without LoRA."""
        if self.config.max_loras is None:
            return None
        return {group.lora_id for group in self.running if group.lora_id}

    def activate_loras(self, groups) -> tuple[int, int]:
        """The step's adapters into the GPU's max_loras slots, as the engine holds them (vLLM's LRU of active
        adapters; engine/lora.py LoRAManager): the step's adapters in id order, each one not in a slot loaded
        into it, the least recently used evicted. (adapters in the step, adapters loaded for it)."""
        ids = sorted({group.lora_id for group in groups if group.lora_id})
        slots, loads = self.lora_slots, 0
        for lora_id in ids:
            if lora_id in slots:
                slots.move_to_end(lora_id)
                continue
            if len(slots) >= self.config.max_loras:
                slots.popitem(last=False)
            slots[lora_id] = None
            loads += 1
        return len(ids), loads

    def lora_passes_over(self, group: SequenceGroup, loras: set[int] | None) -> bool:
        """vLLM's max_loras check: a waiting request of an adapter not yet in the step, when max_loras adapters
        already are, is passed over (left waiting; the requests behind it may go first)."""
        return (loras is not None and group.lora_id != 0 and group.lora_id not in loras
                and len(loras) >= self.config.max_loras)

    def admitted_tokens(self, wanted: int, budget: int) -> int | None:
        """The tokens a waiting request that wants `wanted` more takes with `budget` left, or None when
        it must wait: without chunked prefill a request takes all it wants (threshold aside) or nothing
        (vllm/v1/core/sched/scheduler.py, Scheduler.schedule: "If chunked_prefill is disabled, we can
        stop the scheduling here")."""
        threshold = self.config.long_prefill_token_threshold
        if not self.config.enable_chunked_prefill and min(wanted, threshold or wanted) > budget:
            return None
        return min(wanted, self.chunk_cap(budget))

    def chunk_cap(self, budget: int) -> int:
        """The most tokens one request may take in this step: the budget left, or less under vLLM's
        long_prefill_token_threshold (applied to a request's new tokens, drafts included, before the budget)."""
        threshold = self.config.long_prefill_token_threshold
        return min(threshold, budget) if threshold > 0 else budget

    def _admit_chunk(self, group: SequenceGroup, hit: list[tuple[int, int]], computed: int, num_new: int,
                     now: float) -> None:
        """Moves the head of the waiting queue to the running list, holding blocks for
        its ``computed`` prefix-cache hits and the ``num_new`` tokens of its first chunk."""
        seq = group.seqs[0]
        self.waiting.popleft()
        self.count_lookup(group, seq.num_tokens, computed)
        self.allocator.admit(seq, hit, computed + num_new)
        self._cache(seq, computed + num_new)
        self._run(group, now)

    def _run(self, group: SequenceGroup, now: float) -> None:
        """An admitted request (its blocks had, its tokens marked) joins the running list."""
        group.seqs[0].status = SequenceStatus.RUNNING
        if group.times.first_scheduled is None:
            group.times.first_scheduled = now
        self.running.append(group)

    def never_fits(self, group: SequenceGroup) -> str | None:
        """Why the request can never run (it would be rejected or truncated at the head of
        the queue), or None."""
        cfg = self.config
        if group.params.best_of > 1 or group.params.use_beam_search:
            return ("parallel sampling (best_of > 1) and beam search are not supported with chunked "
                    "prefill; send n separate requests instead")
        if group.prompt_len > cfg.max_model_len:
            return f"prompt of {group.prompt_len} tokens exceeds the model's limit of {cfg.max_model_len}"
        seq = group.seqs[0]
        bs = self.allocator.block_size
        if _blocks_for(seq.num_tokens, bs) > self.usable_blocks or (
                group.first_step_pending   # refused up front, not cut short when it outgrows the cache
                and blocks_at_most(group.prompt_len, group.params.max_tokens, 1, bs, cfg.max_model_len)
                > self.usable_blocks):
            return (f"needs more KV cache than the whole cache holds ({self.usable_blocks} usable blocks "
                    f"of {bs})")
        return None

    def _preempt(self, group: SequenceGroup, swap_out: dict[int, int]) -> None:
        # vLLM v1 puts a preempted request at the head of the waiting queue,
        # whatever its arrival (the paper's policy keeps FCFS order instead).
        group.num_preemptions += 1
        seq = group.seqs[0]
        self.allocator.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(group)
        self.preemptions["recompute"] += 1

    def count_lookup(self, group: SequenceGroup, queried: int, hit: int, loaded: int = 0) -> None:
        """One admission's prefix-cache lookup in vLLM's counters: a preempted request's return apart; with a
        CPU tier, also its lookups and the tokens `loaded` from it."""
        if group.num_cached_tokens < 0:
            group.num_cached_tokens = hit + loaded
        if group.num_preemptions:
            self.preempted_queried_tokens += queried
            self.preempted_hit_tokens += hit
        else:
            self.prefix_queried_tokens += queried
            self.prefix_hit_tokens += hit
        offload = self.allocator.offload
        if offload is not None:
            offload.stats.queried_tokens += queried
            offload.stats.hit_tokens += loaded

    def _cache(self, seq, num_tokens: int) -> None:
        # vLLM caches full blocks when they are scheduled, capped at the sequence's tokens.
        if self._mark_computed:
            self.allocator.mark_computed(seq, min(num_tokens, seq.num_tokens))

    def update(self, out: SchedulerOutput, samples: Samples, now: float) -> list[SequenceGroup]:
        """Advance partial chunks; the groups that complete sample through the shared update."""
        counts = out.num_scheduled_tokens
        if counts is None:
            return super().update(out, samples, now)
        sampling = out.sampling_part()      # before any count moves
        for seq, n in zip(out.seqs, counts):
            if seq.num_computed_tokens + n < seq.num_tokens:    # (a sequence with drafts is never partial)
                seq.num_computed_tokens += n
        return super().update(sampling, samples, now)


def _is_decode(seq, num_new: int) -> bool:
    """One new token after a cached context: what the runner sends through paged attention."""
    return num_new == 1 and seq.num_computed_tokens > 0


def split_tokens(out: SchedulerOutput) -> tuple[int, int]:
    """(prefill tokens, decode tokens) of a step: decodes compute one token after a cached context."""
    prefill = decode = 0
    spec = out.spec_token_ids
    if spec:   # a decode verifying k drafts computes 1 + k decode tokens
        for seq, n in zip(out.seqs, out.scheduled_tokens()):
            if _is_decode(seq, n - len(spec.get(seq.seq_id, ()))):
                decode += n
            else:
                prefill += n
        return prefill, decode
    for seq, n in zip(out.seqs, out.scheduled_tokens()):
        if _is_decode(seq, n):
            decode += 1
        else:
            prefill += n
    return prefill, decode
