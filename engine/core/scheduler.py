"""FCFS iteration-level scheduler (PagedAttention paper, section 4.5).

Each call to ``schedule(now)`` builds one engine step. Like the vLLM the paper
evaluated (v0.2.0), a step either prefills newly admitted prompts or decodes
one token for every running sequence. Waiting requests are admitted in arrival
order while memory and the batch budgets allow, and only when nothing is
swapped out. When a running request cannot get its slots, the most recently
arrived running request is preempted whole (all its sequences).

How a request is preempted (``SchedulerConfig.preemption_mode``):

- ``swap``: its blocks move to CPU swap space; it comes back (swapped in)
  before any waiting request is admitted.
- ``recompute``: a single-sequence request drops its KV cache and is queued
  first, to be prefilled again (prompt and tokens generated so far). A request
  with several sequences (parallel sampling, beam search) is swapped instead,
  as vLLM v0 does: recomputing would lose the blocks its sequences share.

When the swap space is exhausted (``can_swap_out`` fails) the request is
recomputed instead, whatever its width: vLLM v0.2.0 aborts the whole engine
there; here the request stays correct but loses its sharing, as each of its
sequences is prefilled again on its own. If the unshared sequences no longer
fit in the whole cache, the request ends early (truncated, finish reason
``length``) with the tokens it has.

A request too large for the whole cache ends early the same way, where it
stands, without preempting others for it.

The scheduler never reads a clock; ``now`` comes from the caller.
"""
from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

from engine.core.beam_search import beams_from_live, update_beams
from engine.core.config import PREEMPTION_MODES, SchedulerConfig
from engine.core.kv_allocator import AllocStatus, KVAllocator
from engine.core.sequence import FinishReason, Sequence, SequenceGroup, SequenceStatus, next_seq_id
from engine.core.speculative import NgramProposer, SpecDecodingStats
from engine.core.stopping import stop_reason

__all__ = ["PREEMPTION_MODES", "Samples", "Scheduler", "SchedulerConfig", "SchedulerOutput"]

Samples = dict[int, list[tuple[int, float]]]
"""Per sequence id, the sampled candidates ``(token_id, logprob)``: one for a
plain decode, ``best_of`` on a request's first step, ``2 * beam_width`` for
beam search (as ``SamplingParams.samples_per_sequence`` says)."""

_RUNNING = SequenceStatus.RUNNING
_SWAPPED = SequenceStatus.SWAPPED
_FINISHED = SequenceStatus.FINISHED
_STOP = FinishReason.STOP
_LENGTH = FinishReason.LENGTH


def stamp_step(group: SequenceGroup, now: float, finished: list[SequenceGroup], count: int = 1) -> bool:
    """Record that a step ending at `now` gave `group` `count` tokens; True, with `group` added to
    `finished`, when that step finished it."""
    times = group.times
    if times.first_token is None:
        times.first_token = now
    if count != 1 or times.token_counts is not None:     # a speculative step's: streamed times count them
        if times.token_counts is None:
            times.token_counts = [1] * len(times.token_times)
        times.token_counts.append(count)
    times.token_times.append(now)
    if group.finish_reason is None:
        return False
    times.finish = now
    finished.append(group)
    return True


@dataclass(slots=True)
class SchedulerOutput:
    """One engine step. The executor applies, in this order: swap out, swap in,
    loads from the CPU tier, block copies, then computes ``seqs`` (the uncomputed
    tokens of each), then stores to the CPU tier.

    A step may carry swaps or copies and no sequences (``is_empty`` but
    ``has_memory_ops``): the executor must still apply them, or the KV of a
    swapped-out request is lost.
    """

    is_prefill: bool
    groups: list[SequenceGroup]
    seqs: list[Sequence]
    num_batched_tokens: int
    blocks_to_swap_out: dict[int, int] = field(default_factory=dict)
    blocks_to_swap_in: dict[int, int] = field(default_factory=dict)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)
    preempted: list[SequenceGroup] = field(default_factory=list)
    rejected: list[SequenceGroup] = field(default_factory=list)
    truncated: list[SequenceGroup] = field(default_factory=list)  # finished early: outgrew the whole cache
    # Tokens each sequence of ``seqs`` computes this step. None (the paper's
    # policy): all its uncomputed tokens. The chunked policy may compute a
    # prompt in several steps; a step samples only for sequences it completes.
    num_scheduled_tokens: list[int] | None = None
    # (prefill tokens, decode tokens) of a mixed step, counted when it was
    # scheduled (a decode is one token after a cached context); None: the
    # step is all prefill or all decode, as ``is_prefill`` says.
    token_split: tuple[int, int] | None = None
    # Speculative decoding: per sequence id, the draft tokens it verifies this step, computed after
    # its uncomputed tokens (and counted in ``num_scheduled_tokens`` and ``num_batched_tokens``);
    # None when nothing is speculated. Its sample is then the accepted drafts and one more token.
    spec_token_ids: dict[int, list[int]] | None = None
    # LoRA: the distinct adapters the step's requests run (vLLM's active LoRAs; 0 without LoRA), and of those
    # how many were not in the GPU's slots and are loaded into one for it
    lora_adapters: int = 0
    lora_loads: int = 0
    # CPU KV offloading (--kv-offloading-size): blocks loaded from the CPU tier before the step computes
    # ({tier slot: GPU block}) and stored to it after ({GPU block: tier slot})
    kv_loads: dict[int, int] = field(default_factory=dict)
    kv_stores: dict[int, int] = field(default_factory=dict)

    def scheduled_tokens(self) -> list[int]:
        """Per sequence of ``seqs``, the tokens it computes this step."""
        if self.num_scheduled_tokens is not None:
            return self.num_scheduled_tokens
        spec = self.spec_token_ids
        if spec:
            return [s.num_tokens - s.num_computed_tokens + len(spec.get(s.seq_id, ())) for s in self.seqs]
        return [s.num_tokens - s.num_computed_tokens for s in self.seqs]

    def sampling_part(self) -> "SchedulerOutput":
        """The step restricted to the groups that sample a token in it (all, unless
        some sequence computes only a partial prompt chunk)."""
        counts = self.num_scheduled_tokens
        if counts is None:
            return self
        spec = self.spec_token_ids
        if spec:   # a sequence with drafts computes them past its last token
            seqs = [s for s, n in zip(self.seqs, counts)
                    if s.num_computed_tokens + n - len(spec.get(s.seq_id, ())) == s.num_tokens]
        else:
            seqs = [s for s, n in zip(self.seqs, counts) if s.num_computed_tokens + n == s.num_tokens]
        if len(seqs) == len(self.seqs):
            return self
        ids = {s.seq_id for s in seqs}
        groups = [g for g in self.groups if any(s.seq_id in ids for s in g.seqs)]
        return SchedulerOutput(self.is_prefill, groups, seqs, len(seqs), spec_token_ids=spec)

    @property
    def finished_now(self) -> list[SequenceGroup]:
        """Groups the scheduler itself finished this step (rejected or truncated)."""
        return self.rejected + self.truncated

    @property
    def is_empty(self) -> bool:
        """No sequence computes anything this step."""
        return not self.seqs

    @property
    def has_memory_ops(self) -> bool:
        """Blocks to swap, copy, load or store, which the executor must apply even in an empty step."""
        return bool(self.blocks_to_swap_out or self.blocks_to_swap_in or self.blocks_to_copy or self.kv_loads
                    or self.kv_stores)


def _fcfs(group: SequenceGroup) -> tuple[float, int]:
    return group.fcfs_key


class Scheduler:
    def __init__(self, config: SchedulerConfig, allocator: KVAllocator) -> None:
        self.config = config
        self.allocator = allocator
        self.waiting: deque[SequenceGroup] = deque()
        self.running: list[SequenceGroup] = []       # kept in FCFS order
        self.swapped: list[SequenceGroup] = []       # kept in FCFS order
        self.preemptions = {"recompute": 0, "swap": 0}
        self._mark_computed = allocator.enable_prefix_caching
        # Speculative decoding (engine/core/speculative.py): off unless enable_speculation is called.
        self.proposer = None
        self.spec_stats = None

    def enable_speculation(self, config) -> None:
        """Draft tokens with ``config``'s proposer for every decoding sequence that can take them
        (``speculative.can_speculate``), and count their acceptance in ``spec_stats``."""
        self.spec_stats = SpecDecodingStats(config.num_speculative_tokens)
        self.proposer = NgramProposer(config, self.config.max_model_len, self.spec_stats)

    def reset_spec_stats(self) -> None:
        """Start the acceptance counters afresh (after a warm-up request that must not count)."""
        if self.spec_stats is not None:
            self.spec_stats = SpecDecodingStats(self.spec_stats.num_spec_tokens)
            self.proposer.stats = self.spec_stats

    # -- queue -------------------------------------------------------------
    def add(self, group: SequenceGroup) -> None:
        self.waiting.append(group)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.swapped)

    # -- scheduling ------------------------------------------------------------
    def schedule(self, now: float) -> SchedulerOutput:
        rejected: list[SequenceGroup] = []
        if not self.swapped:
            out = self._schedule_prefill(now, rejected)
            if out is not None:
                return out
        return self._schedule_decode(now, rejected)

    def _reject(self, group: SequenceGroup, reason: str, now: float, rejected: list) -> None:
        group.reject_reason = reason
        group.finish(FinishReason.REJECTED, now)
        rejected.append(group)

    def _schedule_prefill(self, now: float, rejected: list) -> SchedulerOutput | None:
        if not self.waiting:
            return None
        cfg = self.config
        admitted: list[SequenceGroup] = []
        seqs: list[Sequence] = []
        truncated: list[SequenceGroup] = []
        num_tokens = 0
        num_seqs = None      # the running requests' live sequences, counted once a group could be admitted
        while self.waiting:
            group = self.waiting[0]
            status = self._admission(group, now, rejected, truncated)
            if status is AllocStatus.NEVER:
                continue
            if status is AllocStatus.LATER:
                break
            if num_seqs is None:
                num_seqs = len([1 for g in self.running for s in g.seqs if s.status is not _FINISHED])
            live = group.live_seqs()
            new_tokens = sum(s.num_tokens for s in live)
            # The first group always fits, so a recomputed group wider than the
            # token budget still makes progress.
            if admitted and num_tokens + new_tokens > cfg.max_num_batched_tokens:
                break
            if num_seqs + group.max_num_seqs() > cfg.max_num_seqs:
                break
            num_tokens += self._admit(group, live, seqs, now)
            num_seqs += group.max_num_seqs()
            admitted.append(group)
        if not admitted:
            if truncated:
                return SchedulerOutput(False, [], [], 0, rejected=rejected, truncated=truncated)
            return None
        for group in admitted:   # keep running in FCFS order (recomputed groups are older)
            bisect.insort(self.running, group, key=_fcfs)
        return SchedulerOutput(True, admitted, seqs, num_tokens, rejected=rejected, truncated=truncated)

    def _admission(self, group: SequenceGroup, now: float, rejected: list, truncated: list) -> AllocStatus:
        """Whether the head of the waiting queue can have its blocks now (OK) or later
        (LATER). NEVER: it can never run, so it is taken off the queue and ended here,
        rejected, or truncated if it already generated tokens."""
        cfg = self.config
        reason = None
        if group.max_num_seqs() > cfg.max_num_seqs:
            reason = (f"asks for {group.max_num_seqs()} parallel sequences but the engine runs "
                      f"at most {cfg.max_num_seqs}")
        elif group.prompt_len > cfg.max_model_len:
            reason = f"prompt of {group.prompt_len} tokens exceeds the model's limit of {cfg.max_model_len}"
        else:
            status = self.allocator.can_allocate(group)
            if status is not AllocStatus.NEVER:
                return status
        self.waiting.popleft()
        if reason is None and not group.first_step_pending:
            # A wide request recomputed without its sharing (swap space
            # exhausted) that no longer fits: it keeps what it generated.
            self._truncate(group, now, truncated)
        else:
            allocator = self.allocator
            reason = reason or (f"needs more KV cache than the whole cache holds "
                                f"({allocator.num_gpu_blocks} blocks of {allocator.block_size})")
            self._reject(group, reason, now, rejected)
        return AllocStatus.NEVER

    def _admit(self, group: SequenceGroup, live: list[Sequence], seqs: list, now: float) -> int:
        """Takes the head of the waiting queue into the step: allocates its blocks and
        runs its live sequences (collected into ``seqs``); returns the tokens they compute."""
        self.waiting.popleft()
        self.allocator.allocate(group)
        if group.num_cached_tokens < 0:
            group.num_cached_tokens = group.seqs[0].num_computed_tokens
        num_tokens = 0
        for seq in live:
            seq.status = _RUNNING
            num_tokens += seq.num_tokens - seq.num_computed_tokens
            seqs.append(seq)
        if group.times.first_scheduled is None:
            group.times.first_scheduled = now
        return num_tokens

    def _schedule_decode(self, now: float, rejected: list) -> SchedulerOutput:
        allocator = self.allocator
        can_append = allocator.can_append_slots
        append = allocator.append_slots
        queue = deque(self.running)      # already in FCFS order
        scheduled: list[SequenceGroup] = []
        seqs: list[Sequence] = []
        copies: list[tuple[int, int]] = []
        swap_out: dict[int, int] = {}
        preempted: list[SequenceGroup] = []
        truncated: list[SequenceGroup] = []
        spec: dict[int, list[int]] | None = {} if self.proposer is not None else None
        while queue:
            group = queue.popleft()
            if not can_append(group):
                if not allocator.can_append_slots_alone(group):
                    # Even with every other request gone it could not grow: the
                    # whole cache is too small for it. End it where it stands
                    # rather than evict others for nothing.
                    self._truncate(group, now, truncated)
                    continue
                if not self._preempt_for(group, queue, swap_out, preempted):
                    continue
            for seq in group.seqs:
                if seq.status is _RUNNING:
                    cow = append(seq)
                    if cow is not None:
                        copies.append(cow)
                    seqs.append(seq)
            scheduled.append(group)
            if spec is not None:
                self._add_drafts(group, spec)

        swap_in: dict[int, int] = {}
        # As vLLM v0.2.0: no swapping in while this step swaps out (it would thrash).
        if self.swapped and not swap_out:
            swap_in = self._swap_in(now, scheduled, seqs, copies, truncated)
        # Swapped-in groups may be older than the ones that kept running. (A copy:
        # the step's own list must not change when later steps admit requests.)
        self.running = sorted(scheduled, key=_fcfs) if swap_in else scheduled[:]
        if spec:
            return SchedulerOutput(False, scheduled, seqs, len(seqs) + sum(map(len, spec.values())), swap_out,
                                   swap_in, copies, preempted, rejected, truncated, spec_token_ids=spec)
        return SchedulerOutput(False, scheduled, seqs, len(seqs), swap_out, swap_in, copies,
                               preempted, rejected, truncated)

    def _add_drafts(self, group: SequenceGroup, spec: dict[int, list[int]]) -> None:
        """The paper's policy with speculation: a decoding group that can take drafts gets as many
        of its proposer's as free blocks hold, after its own slot is appended (lookahead slots come
        from free blocks only; they never preempt in this policy)."""
        seq = group.seqs[0]
        if seq.status is not _RUNNING or seq.num_tokens - seq.num_computed_tokens != 1:
            return
        drafts = self.proposer.propose(group, seq)
        if not drafts:
            return
        allocator = self.allocator
        free = allocator.num_free_blocks()
        while drafts and allocator.blocks_to_grow(seq, seq.num_tokens + len(drafts)) > free:
            drafts = drafts[:-1]
        if drafts:
            allocator.grow(seq, seq.num_tokens + len(drafts))
            spec[seq.seq_id] = drafts

    def _preempt_for(self, group: SequenceGroup, queue: deque, swap_out: dict[int, int],
                     preempted: list) -> bool:
        """Preempts running groups, the most recently arrived first (the back of
        ``queue``, else ``group`` itself), until ``group`` can append its slots.
        False when ``group`` was the victim and does not run this step."""
        while True:
            victim = queue.pop() if queue else group
            self._preempt(victim, swap_out)
            preempted.append(victim)
            if victim is group:
                return False
            if self.allocator.can_append_slots(group):
                return True

    def _swap_in(self, now: float, scheduled: list, seqs: list, copies: list, truncated: list) -> dict[int, int]:
        """Brings swapped-out groups back, oldest first, while their blocks fit and the
        batch has room; they join ``scheduled`` and decode in this step. Returns the
        step's swap-in block map."""
        allocator = self.allocator
        max_num_seqs = self.config.max_num_seqs
        num_seqs = len(seqs)
        swap_in: dict[int, int] = {}
        while self.swapped:
            group = self.swapped[0]
            if not allocator.can_swap_in(group):
                break
            num_new = group.num_seqs(_SWAPPED)
            if num_seqs + num_new > max_num_seqs:
                break
            self.swapped.pop(0)
            swap_in.update(allocator.swap_in(group))
            for seq in group.seqs:
                if seq.status is _SWAPPED:
                    seq.status = _RUNNING
            self._append_slots(group, seqs, copies)
            scheduled.append(group)
            num_seqs += num_new
        if not scheduled and self.swapped and not allocator.can_swap_in(self.swapped[0]):
            # Nothing runs, yet the oldest swapped request cannot come back:
            # it outgrew the cache while swapped out. End it where it stands.
            self._truncate(self.swapped.pop(0), now, truncated)
        return swap_in

    def _append_slots(self, group: SequenceGroup, seqs: list, copies: list) -> None:
        """Slots for the group's running sequences' new tokens; collects them and
        any copy-on-write pairs. (The decode loop inlines this: hot path.)"""
        append = self.allocator.append_slots
        for seq in group.seqs:
            if seq.status is _RUNNING:
                cow = append(seq)
                if cow is not None:
                    copies.append(cow)
                seqs.append(seq)

    def _truncate(self, group: SequenceGroup, now: float, truncated: list) -> None:
        beams_from_live(group)
        group.finish(_LENGTH, now, self.allocator)
        truncated.append(group)

    def _preempt(self, group: SequenceGroup, swap_out: dict[int, int]) -> None:
        group.num_preemptions += 1
        allocator = self.allocator
        swap = self.config.preemption_mode == "swap" or group.num_seqs(_RUNNING) > 1
        if swap and allocator.supports_swap and allocator.can_swap_out(group):
            swap_out.update(allocator.swap_out(group))
            for seq in group.seqs:
                if seq.status is _RUNNING:
                    seq.status = _SWAPPED
            bisect.insort(self.swapped, group, key=_fcfs)
            self.preemptions["swap"] += 1
            return
        # Recompute: drop the KV cache; the group is prefilled again (prompt and
        # the tokens generated so far) before any newer request. Usually that is
        # the front of the queue (as vLLM's insert(0)); a group swapped in and
        # then recomputed (swap space exhausted) may be newer than one waiting.
        for seq in group.seqs:
            if seq.status is _RUNNING:
                allocator.free(seq)
                seq.num_computed_tokens = 0
                seq.status = SequenceStatus.WAITING
        waiting = self.waiting
        if not waiting or _fcfs(group) < waiting[0].fcfs_key:
            waiting.appendleft(group)
        else:
            waiting.insert(bisect.bisect_left(waiting, _fcfs(group), key=_fcfs), group)
        self.preemptions["recompute"] += 1

    # -- applying a step's results -------------------------------------------------
    def update(self, out: SchedulerOutput, samples: Samples, now: float) -> list[SequenceGroup]:
        """Apply the sampled tokens of a step; returns the groups that finished."""
        if out.spec_token_ids:
            return self._update_speculative(out, samples, now)
        if self._mark_computed:
            mark = self.allocator.mark_computed
            for seq in out.seqs:
                seq.num_computed_tokens = seq.num_tokens
                mark(seq)
        else:
            for seq in out.seqs:
                seq.num_computed_tokens = len(seq.token_ids)
        finished = []
        max_model_len = self.config.max_model_len
        for group in out.groups:
            params = group.params
            if params.use_beam_search:
                update_beams(group, samples, self.allocator, max_model_len)
            elif len(group.seqs) == 1 and params.best_of == 1:
                # The common case, kept lean: one sequence, one token (Sequence.append
                # and stopping.stop_reason, inlined).
                seq = group.seqs[0]
                token, logprob = samples[seq.seq_id][0]
                tokens = seq.token_ids
                tokens.append(token)
                seq.cumulative_logprob += logprob
                seq.output_logprobs.append(logprob)
                if ((token in group.eos_token_ids and not params.ignore_eos) or token in params._stop_set):
                    seq.finish(_STOP, self.allocator)
                    group.finish_reason = _STOP
                elif len(tokens) - seq.prompt_len >= params.max_tokens or len(tokens) >= max_model_len:
                    seq.finish(_LENGTH, self.allocator)
                    group.finish_reason = _LENGTH
            else:
                self._update_samples(group, samples, max_model_len)
            stamp_step(group, now, finished)
        if finished:
            self.running = [g for g in self.running if g.finish_reason is None]
        return finished

    def _update_samples(self, group: SequenceGroup, samples: Samples, max_model_len: int | None = None) -> None:
        max_model_len = max_model_len or self.config.max_model_len
        live = [s for s in group.seqs if s.status is _RUNNING]
        if group.first_step_pending and len(live) == 1 and group.params.best_of > 1:
            # Parallel sampling: the prompt was computed once; fork it into
            # best_of sequences that share its blocks.
            parent = live[0]
            picks = samples[parent.seq_id]
            for token, logprob in picks[1:]:
                child = parent.copy_as(next_seq_id())
                self.allocator.fork(parent, child)
                group.seqs.append(child)
                self._append(group, child, token, logprob, max_model_len)
            self._append(group, parent, *picks[0], max_model_len)
        else:
            for seq in live:
                token, logprob = samples[seq.seq_id][0]
                self._append(group, seq, token, logprob, max_model_len)
        if all(s.status is _FINISHED for s in group.seqs):
            group.finish_reason = group.seqs[0].finish_reason

    def _append(self, group: SequenceGroup, seq: Sequence, token: int, logprob: float,
                max_model_len: int | None = None) -> None:
        seq.append(token, logprob)
        reason = stop_reason(group, token, len(seq.token_ids), len(seq.token_ids) - seq.prompt_len,
                             max_model_len or self.config.max_model_len)
        if reason is not None:
            seq.finish(reason, self.allocator)

    def _update_speculative(self, out: SchedulerOutput, samples: Samples, now: float) -> list[SequenceGroup]:
        """``update`` for a step that verified drafts. A sequence with drafts gets its accepted
        drafts and the executor's next token, appended one by one until a stop; its computed
        tokens then end before that last token, as after a plain decode, and the blocks past
        them (the rejected drafts' slots) go back to the pool. The other groups update as usual."""
        spec = out.spec_token_ids
        plain_groups = [g for g in out.groups if g.seqs[0].seq_id not in spec]
        finished: list[SequenceGroup] = []
        if plain_groups:
            plain_seqs = [s for s in out.seqs if s.seq_id not in spec]
            finished = Scheduler.update(self, SchedulerOutput(out.is_prefill, plain_groups, plain_seqs,
                                                              len(plain_seqs)), samples, now)
        allocator = self.allocator
        max_model_len = self.config.max_model_len
        stats = self.spec_stats
        done = False
        for group in out.groups:
            seq = group.seqs[0]
            drafts = spec.get(seq.seq_id)
            if drafts is None:
                continue
            tokens = samples[seq.seq_id]
            if stats is not None:
                stats.observe_draft(len(drafts), len(tokens) - 1)
            before = len(seq.token_ids)
            for token, logprob in tokens:
                seq.append(token, logprob)
                reason = stop_reason(group, token, len(seq.token_ids), len(seq.token_ids) - seq.prompt_len,
                                     max_model_len)
                if reason is not None:
                    seq.finish(reason, allocator)
                    group.finish_reason = reason
                    break
            if group.finish_reason is None:
                seq.num_computed_tokens = seq.num_tokens - 1
                allocator.trim(seq, seq.num_computed_tokens)
                if self._mark_computed:
                    allocator.mark_computed(seq)
            done = stamp_step(group, now, finished, len(seq.token_ids) - before) or done
        if done:
            self.running = [g for g in self.running if g.finish_reason is None]
        return finished
