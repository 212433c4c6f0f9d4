"""FCFS iteration-level scheduler (PagedAttention paper, section 4.5).

Each call to ``schedule(now)`` builds one engine step. Like the vLLM the paper
evaluated, a step either prefills newly admitted prompts or decodes one token
for every running sequence. Waiting requests are admitted in arrival order
while memory and the batch budgets allow, and only when nothing is swapped
out. When a running sequence cannot get a slot, the most recently arrived
running request is preempted whole (all its sequences): by recompute (free
its blocks and queue it first) or by swap (move its blocks to CPU memory).

The scheduler never reads a clock; ``now`` comes from the caller.
"""
from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

from engine.core.kv_allocator import AllocStatus, KVAllocator
from engine.core.sequence import (BeamHypothesis, FinishReason, Sequence, SequenceGroup,
                             SequenceStatus, next_seq_id)

PREEMPTION_MODES = ("recompute", "swap")

Samples = dict[int, list[tuple[int, float]]]
"""Per sequence id, the sampled candidates ``(token_id, logprob)``: one for a
plain decode, ``best_of`` on a request's first step, ``2 * beam_width`` for
beam search (as ``SamplingParams.samples_per_sequence`` says)."""


@dataclass
class SchedulerConfig:
    max_model_len: int
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    preemption_mode: str = "recompute"
    # The policy: False is the paper's (this module); True is vLLM v1's chunked
    # prefill (engine/core/chunked_scheduler.py, built by its make_scheduler).
    enable_chunked_prefill: bool = False

    def __post_init__(self) -> None:
        if self.enable_chunked_prefill:
            from engine.core.chunked_scheduler import check_config
            check_config(self)
            return
        if self.max_num_batched_tokens is None:
            self.max_num_batched_tokens = max(self.max_model_len, 2048)
        if self.max_model_len < 1:
            raise ValueError(f"max_model_len must be positive, got {self.max_model_len}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be positive, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least "
                             f"max_model_len ({self.max_model_len}), or long prompts could never run")
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption mode must be one of {PREEMPTION_MODES}, got {self.preemption_mode!r}")


@dataclass(slots=True)
class SchedulerOutput:
    """One engine step. The executor applies, in this order: swap out, swap in,
    block copies, then computes ``seqs`` (the uncomputed tokens of each)."""

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

    def scheduled_tokens(self) -> list[int]:
        """Per sequence of ``seqs``, the tokens it computes this step."""
        if self.num_scheduled_tokens is not None:
            return self.num_scheduled_tokens
        return [s.num_tokens - s.num_computed_tokens for s in self.seqs]

    def sampling_part(self) -> "SchedulerOutput":
        """The step restricted to the groups that sample a token in it (all, unless
        some sequence computes only a partial prompt chunk)."""
        counts = self.num_scheduled_tokens
        if counts is None:
            return self
        seqs = [s for s, n in zip(self.seqs, counts) if s.num_computed_tokens + n == s.num_tokens]
        if len(seqs) == len(self.seqs):
            return self
        ids = {s.seq_id for s in seqs}
        groups = [g for g in self.groups if any(s.seq_id in ids for s in g.seqs)]
        return SchedulerOutput(self.is_prefill, groups, seqs, len(seqs))

    @property
    def finished_now(self) -> list[SequenceGroup]:
        """Groups the scheduler itself finished this step (rejected or truncated)."""
        return self.rejected + self.truncated

    @property
    def is_empty(self) -> bool:
        return not self.seqs


def _fcfs(group: SequenceGroup) -> tuple[float, int]:
    return group.fcfs_key


def _num_live(group: SequenceGroup) -> int:
    return sum(1 for s in group.seqs if s.status is not SequenceStatus.FINISHED)


class Scheduler:
    def __init__(self, config: SchedulerConfig, allocator: KVAllocator) -> None:
        self.config = config
        self.allocator = allocator
        self.waiting: deque[SequenceGroup] = deque()
        self.running: list[SequenceGroup] = []
        self.swapped: list[SequenceGroup] = []       # kept in FCFS order
        self.preemptions = {"recompute": 0, "swap": 0}
        self._mark_computed = getattr(allocator, "enable_prefix_caching", False)

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
        group.finish_reason = FinishReason.REJECTED
        group.times.finish = now
        for seq in group.seqs:
            seq.status = SequenceStatus.FINISHED
            seq.finish_reason = FinishReason.REJECTED
        rejected.append(group)

    def _schedule_prefill(self, now: float, rejected: list) -> SchedulerOutput | None:
        cfg = self.config
        admitted: list[SequenceGroup] = []
        seqs: list[Sequence] = []
        num_tokens = 0
        if not self.waiting:
            return None
        num_seqs = sum(_num_live(g) for g in self.running)
        while self.waiting:
            group = self.waiting[0]
            if group.max_num_seqs() > cfg.max_num_seqs:
                self.waiting.popleft()
                self._reject(group, f"asks for {group.max_num_seqs()} parallel sequences but the engine runs "
                                    f"at most {cfg.max_num_seqs}", now, rejected)
                continue
            if group.prompt_len > cfg.max_model_len:
                self.waiting.popleft()
                self._reject(group, f"prompt of {group.prompt_len} tokens exceeds the model's "
                                    f"limit of {cfg.max_model_len}", now, rejected)
                continue
            status = self.allocator.can_allocate(group)
            if status is AllocStatus.NEVER:
                self.waiting.popleft()
                self._reject(group, f"needs more KV cache than the whole cache holds "
                                    f"({self.allocator.num_gpu_blocks} blocks of {self.allocator.block_size})",
                             now, rejected)
                continue
            if status is AllocStatus.LATER:
                break
            live = group.live_seqs()
            new_tokens = sum(s.num_tokens for s in live)
            # The first group always fits, so a recomputed group wider than the
            # token budget still makes progress.
            if admitted and num_tokens + new_tokens > cfg.max_num_batched_tokens:
                break
            if num_seqs + group.max_num_seqs() > cfg.max_num_seqs:
                break
            self.waiting.popleft()
            self.allocator.allocate(group)
            for seq in live:
                seq.status = SequenceStatus.RUNNING
                num_tokens += seq.num_tokens - seq.num_computed_tokens
                seqs.append(seq)
            if group.times.first_scheduled is None:
                group.times.first_scheduled = now
            num_seqs += group.max_num_seqs()
            admitted.append(group)
        if not admitted:
            return None
        for group in admitted:   # keep running in FCFS order (recomputed groups are older)
            bisect.insort(self.running, group, key=_fcfs)
        return SchedulerOutput(True, admitted, seqs, num_tokens, rejected=rejected)

    def _schedule_decode(self, now: float, rejected: list) -> SchedulerOutput:
        allocator = self.allocator
        queue = deque(self.running)      # already in FCFS order
        scheduled: list[SequenceGroup] = []
        seqs: list[Sequence] = []
        copies: list[tuple[int, int]] = []
        swap_out: dict[int, int] = {}
        preempted: list[SequenceGroup] = []
        truncated: list[SequenceGroup] = []
        while queue:
            group = queue.popleft()
            while not allocator.can_append_slots(group):
                if not queue and not scheduled:
                    # It holds every used block and still cannot grow: the
                    # whole cache is too small for it. End it where it is.
                    self._truncate(group, now, truncated)
                    break
                victim = queue.pop() if queue else group   # the most recently arrived
                self._preempt(victim, swap_out)
                preempted.append(victim)
                if victim is group:
                    break
            else:
                self._append_slots(group, seqs, copies)
                scheduled.append(group)

        swap_in: dict[int, int] = {}
        if not preempted:  # bringing requests back while others are being evicted would thrash
            num_seqs = sum(_num_live(g) for g in scheduled)
            while self.swapped:
                group = self.swapped[0]
                if num_seqs + len(group.seqs) > self.config.max_num_seqs:
                    break
                if not allocator.can_swap_in(group):
                    break
                self.swapped.pop(0)
                swap_in.update(allocator.swap_in(group))
                for seq in group.seqs:
                    if seq.status is SequenceStatus.SWAPPED:
                        seq.status = SequenceStatus.RUNNING
                self._append_slots(group, seqs, copies)
                scheduled.append(group)
                num_seqs += len(group.seqs)
            if not scheduled and self.swapped and not allocator.can_swap_in(self.swapped[0]):
                # Nothing runs, yet the oldest swapped request cannot come back:
                # it outgrew the cache while swapped out. End it where it is.
                self._truncate(self.swapped.pop(0), now, truncated)
        # Swapped-in groups may be older than the ones that kept running.
        self.running = sorted(scheduled, key=_fcfs) if swap_in else scheduled
        return SchedulerOutput(False, scheduled, seqs, len(seqs), swap_out, swap_in, copies,
                               preempted, rejected, truncated)

    def _truncate(self, group: SequenceGroup, now: float, truncated: list) -> None:
        for seq in group.seqs:
            if seq.status is not SequenceStatus.FINISHED:
                self.allocator.free(seq)
                seq.status = SequenceStatus.FINISHED
                seq.finish_reason = FinishReason.LENGTH
        if group.params.use_beam_search and not group.beams:
            group.beams = [BeamHypothesis(s.cumulative_logprob, list(s.token_ids), s.cumulative_logprob)
                           for s in group.seqs]
        group.finish_reason = FinishReason.LENGTH
        group.times.finish = now
        truncated.append(group)

    def _append_slots(self, group: SequenceGroup, seqs: list, copies: list) -> None:
        append = self.allocator.append_slots
        for seq in group.seqs:
            if seq.status is SequenceStatus.RUNNING:
                cow = append(seq)
                if cow is not None:
                    copies.append(cow)
                seqs.append(seq)

    def _preempt(self, group: SequenceGroup, swap_out: dict[int, int]) -> None:
        group.num_preemptions += 1
        allocator = self.allocator
        if (self.config.preemption_mode == "swap" and allocator.supports_swap
                and allocator.can_swap_out(group)):
            swap_out.update(allocator.swap_out(group))
            for seq in group.seqs:
                if seq.status is SequenceStatus.RUNNING:
                    seq.status = SequenceStatus.SWAPPED
            bisect.insort(self.swapped, group, key=_fcfs)
            self.preemptions["swap"] += 1
            return
        # Recompute: drop the KV cache; the group is prefilled again (prompt and
        # the tokens generated so far) before any newer request.
        for seq in group.seqs:
            if seq.status is SequenceStatus.RUNNING:
                allocator.free(seq)
                seq.num_computed_tokens = 0
                seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(group)
        self.preemptions["recompute"] += 1

    # -- applying a step's results -------------------------------------------------
    def update(self, out: SchedulerOutput, samples: Samples, now: float) -> list[SequenceGroup]:
        """Apply the sampled tokens of a step; returns the groups that finished."""
        mark = self.allocator.mark_computed if self._mark_computed else None
        for seq in out.seqs:
            seq.num_computed_tokens = seq.num_tokens
            if mark is not None:
                mark(seq)
        finished = []
        for group in out.groups:
            if group.params.use_beam_search:
                self._update_beams(group, samples, now)
            else:
                self._update_samples(group, samples)
            times = group.times
            if times.first_token is None:
                times.first_token = now
            times.token_times.append(now)
            if group.finish_reason is not None:
                times.finish = now
                finished.append(group)
        if finished:
            self.running = [g for g in self.running if g.finish_reason is None]
        return finished

    def _stop_reason(self, group: SequenceGroup, seq_len: int, num_output: int,
                     token: int) -> FinishReason | None:
        params = group.params
        if (token == group.eos_token_id and not params.ignore_eos) or token in params._stop_set:
            return FinishReason.STOP
        if num_output >= params.max_tokens or seq_len >= self.config.max_model_len:
            return FinishReason.LENGTH
        return None

    def _update_samples(self, group: SequenceGroup, samples: Samples) -> None:
        live = [s for s in group.seqs if s.status is SequenceStatus.RUNNING]
        if group.first_step_pending and len(live) == 1 and group.params.best_of > 1:
            # Parallel sampling: the prompt was computed once; fork it into
            # best_of sequences that share its blocks.
            parent = live[0]
            picks = samples[parent.seq_id]
            for token, logprob in picks[1:]:
                child = parent.copy_as(next_seq_id())
                self.allocator.fork(parent, child)
                group.seqs.append(child)
                self._append(group, child, token, logprob)
            self._append(group, parent, *picks[0])
        else:
            for seq in live:
                token, logprob = samples[seq.seq_id][0]
                self._append(group, seq, token, logprob)
        if all(s.status is SequenceStatus.FINISHED for s in group.seqs):
            group.finish_reason = group.seqs[0].finish_reason

    def _append(self, group: SequenceGroup, seq: Sequence, token: int, logprob: float) -> None:
        seq.append(token, logprob)
        reason = self._stop_reason(group, len(seq.token_ids), len(seq.token_ids) - seq.prompt_len, token)
        if reason is not None:
            seq.status = SequenceStatus.FINISHED
            seq.finish_reason = reason
            self.allocator.free(seq)

    def _update_beams(self, group: SequenceGroup, samples: Samples, now: float) -> None:
        """One beam-search step, scored exactly as transformers' beam search.

        The top ``2k`` continuations over all beams are ranked by cumulative
        log-probability; those among the first ``k`` that end (stop token or
        length) become finished hypotheses scored sum_logprobs /
        generated_len ** length_penalty; the best ``k`` that do not end are the
        next beams (forking a beam chosen twice, freeing a beam not chosen).
        """
        params = group.params
        width = params.best_of
        live = [s for s in group.seqs if s.status is SequenceStatus.RUNNING]
        candidates = [(seq.cumulative_logprob + logprob, rank, seq, token, logprob)
                      for rank, seq in enumerate(live) for token, logprob in samples[seq.seq_id]]
        candidates.sort(key=lambda c: (-c[0], c[1]))
        candidates = candidates[:2 * width]
        gen_len = live[0].num_output_tokens + 1
        penalty = gen_len ** params.length_penalty
        chosen: list[tuple[Sequence, int, float]] = []
        for rank, (score, _, seq, token, logprob) in enumerate(candidates):
            if self._stop_reason(group, seq.num_tokens + 1, gen_len, token) is not None:
                if rank < width and group.beam_improvable:
                    group.beams.append(BeamHypothesis(score / penalty, seq.token_ids + [token], score))
            elif len(chosen) < width:
                chosen.append((seq, token, logprob))
        group.beams.sort(key=lambda h: -h.score)
        del group.beams[width:]

        # Fork beams chosen more than once, drop beams not chosen.
        picks: dict[int, list[tuple[int, float]]] = {}
        for seq, token, logprob in chosen:
            picks.setdefault(seq.seq_id, []).append((token, logprob))
        next_beams: list[Sequence] = []
        for seq in live:
            mine = picks.get(seq.seq_id)
            if not mine:
                seq.status = SequenceStatus.FINISHED
                seq.finish_reason = FinishReason.PRUNED
                self.allocator.free(seq)
                continue
            for token, logprob in mine[1:]:
                child = seq.copy_as(next_seq_id())
                self.allocator.fork(seq, child)
                child.append(token, logprob)
                next_beams.append(child)
            seq.append(*mine[0])
            next_beams.append(seq)
        # Keep the beams in rank order (best first), as transformers does.
        group.seqs = sorted(next_beams, key=lambda s: -s.cumulative_logprob)
        # Stop once no running beam can beat the worst kept hypothesis
        # (transformers' default early_stopping=False heuristic).
        if chosen and group.beam_improvable and len(group.beams) >= width:
            if group.seqs[0].cumulative_logprob / penalty <= group.beams[-1].score:
                group.beam_improvable = False
        if not chosen or not group.beam_improvable:
            for seq in group.seqs:
                seq.status = SequenceStatus.FINISHED
                seq.finish_reason = FinishReason.PRUNED
                self.allocator.free(seq)
            last = group.beams[0].token_ids[-1] if group.beams else None
            stopped = last is not None and (last == group.eos_token_id or last in params._stop_set)
            group.finish_reason = FinishReason.STOP if stopped else FinishReason.LENGTH
