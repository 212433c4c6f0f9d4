"""Decode fast-forward: many decode steps at once while nothing can change the scheduler's mind.

Between arrivals and completions the paper's scheduler does the same thing
step after step: decode one token for every running sequence, preempt
nothing, admit nothing, swap nothing in. `plan_window` proves, from the state
at a step boundary, for how many steps that stays true (the question "how many
decode steps can this running set take without a preemption or an admission
change?"); `apply_window` then advances the engine core through all of them in
one go. It leaves the core exactly as step-by-step simulation would (same block
ids in the same tables, same prefix-cache registrations, same tokens) and
returns the step records those steps would have produced.

Why a window is safe (derived from engine/core/scheduler.py and block_manager.py):
- Decode: every running group must pass the append check. The finer rule
  (free >= the group's sequences that need a new block) and vLLM v0.2.0's rule
  (free >= the group's running sequences) both hold while the free blocks left
  after each step's appends are at least the widest group's width, so the
  window ends before that could fail. Block-boundary crossings inside the
  window are allocated by the window, in the order the scheduler allocates them.
- Admission (nothing swapped): the oldest waiting request must stay where it
  is. It does if the sequence budget blocks it now (the running set does not
  change inside a window) or memory does (free blocks only shrink inside a
  window, so a check of the form "free - needed >= watermark" that fails now
  fails throughout). A request the scheduler would admit or reject gets no window.
- Swap-in (something swapped): likewise, the oldest swapped group must be
  blocked now, by the sequence budget or by memory.
- Finishing: a simulated request stops by length only (EOS ignored, no stop
  tokens), so the first step at which any group finishes is known; the window
  ends with it, and the scheduler's own update finishes those groups (the
  freed blocks and the smaller running set are the next window's business).
- Arrivals: a step belongs to the window only if no request arrives before it starts.
- Copy-on-write: no window while a running sequence's next token would go into
  a shared block (just after a fork, or a swap-in of a forked group).

What the proof does not cover (beam search, other scheduling policies, the
contiguous allocators, stop tokens) gets no window and runs one step at a
time, so correctness never depends on this module. Tests hold fast-forwarded
runs equal to step-by-step runs, record for record.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from engine.core.block_manager import BlockManager
from engine.core.kv_allocator import AllocStatus
from engine.core.metrics import StepRecord
from engine.core.scheduler import Scheduler, SchedulerOutput
from engine.core.sequence import Sequence, SequenceGroup, SequenceStatus
from planner.cost.shape import StepShape

_RUNNING = SequenceStatus.RUNNING
MAX_WINDOW = 4096   # steps per window at most: bounds the per-window lists

SampledTokens = list[tuple[list[int], list[float]]]   # per window sequence: (token ids, logprobs), one per step


@dataclass(slots=True)
class Window:
    """Consecutive plain decode steps, proven to run exactly so, ready to apply."""

    groups: list[SequenceGroup]   # the running groups, in the scheduler's (FCFS) order
    seqs: list[Sequence]          # their running sequences, in the order a step lists them
    first_crossing: list[int]     # per sequence: the step (1-based) at which it takes its next block
    crossings: list[int]          # per step (index 1..steps): sequences that take a new block in it
    shapes: list[StepShape]       # per step, as the cost model priced it
    start: float                  # the first step's start time
    ends: list[float]             # per step, its end time (the next one's start)
    finishing: list[SequenceGroup]  # groups with a sequence that finishes at the last step

    @property
    def steps(self) -> int:
        return len(self.shapes)

    def taken(self, steps: int) -> int:
        """Blocks the first `steps` steps take."""
        return sum(self.crossings[1:steps + 1])

    def truncate(self, steps: int) -> None:
        """Keep the first `steps` steps (a request arrived; the rest is the next window's business)."""
        if steps < len(self.shapes):
            del self.shapes[steps:], self.ends[steps:], self.crossings[steps + 1:]
            self.finishing = []

    def split(self, steps: int, block_size: int) -> Window:
        """The first `steps` steps as a window of their own, to take now; this one keeps the rest
        (each sequence's next block boundary counted from its new start)."""
        head = Window(self.groups, self.seqs, self.first_crossing, self.crossings[:steps + 1],
                      self.shapes[:steps], self.start, self.ends[:steps], [])
        self.first_crossing = [first - steps if first > steps
                               else first + block_size * ((steps - first) // block_size + 1) - steps
                               for first in self.first_crossing]
        self.crossings = [0] + self.crossings[steps + 1:]
        self.start = self.ends[steps - 1]
        del self.shapes[:steps], self.ends[:steps]
        return head


def covers(scheduler: Scheduler) -> bool:
    """The paper's policy over the paged block manager: what the window's proof is about."""
    return type(scheduler) is Scheduler and type(scheduler.allocator) is BlockManager


def _gpu_pool(allocator: BlockManager):
    """Where the block manager keeps the GPU blocks' reference counts, fills and token count."""
    return getattr(allocator, "gpu", allocator)


def _block_taker(allocator: BlockManager) -> Callable[[], int]:
    """The block manager's own way of taking a fresh block holding one token."""
    pool = getattr(allocator, "gpu", None)
    if pool is not None and hasattr(pool, "take"):
        return lambda: pool.take(1)

    def take() -> int:
        block = allocator._take_block()
        allocator._set_fill(block, 1)
        return block
    return take


def _num_running(running: list[SequenceGroup]) -> int:
    return sum([1 for group in running for seq in group.seqs if seq.status is _RUNNING])


def _admission_blocked(scheduler: Scheduler, num_running: int | None = None) -> bool:
    """schedule() leaves the waiting queue alone now and, since the running set is
    fixed and free blocks only shrink inside a window, at every step of it.
    `num_running`: the running sequences, where the caller keeps their count."""
    if not scheduler.waiting:
        return True
    cfg = scheduler.config
    group = scheduler.waiting[0]
    if group.max_num_seqs() > cfg.max_num_seqs or group.prompt_len > cfg.max_model_len:
        return False   # the next step rejects it: let that step run normally
    status = scheduler.allocator.can_allocate(group)
    if status is AllocStatus.NEVER:
        return False
    if status is AllocStatus.LATER:
        return True
    if num_running is None:
        num_running = _num_running(scheduler.running)
    return num_running + group.max_num_seqs() > cfg.max_num_seqs


def _swap_in_blocked(scheduler: Scheduler) -> bool:
    """Likewise for the oldest swapped group (no admission is tried while one is swapped)."""
    group = scheduler.swapped[0]
    if not scheduler.allocator.can_swap_in(group):
        return True
    return _num_running(scheduler.running) + len(group.seqs) > scheduler.config.max_num_seqs


def _context_bins(seqs: list[Sequence], last: int) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """The first step's decode-context histogram (planner.cost.shape.context_histogram,
    as {bucket: [sequences, sum of contexts]}) and, per later step up to `last`,
    the buckets that a sequence leaves for the next one: a context c at step 1
    is c + j - 1 at step j, and leaves bucket k when it reaches 2**k + 1."""
    bins: dict[int, list[int]] = {}
    moves: dict[int, list[int]] = {}
    for seq in seqs:
        n = len(seq.token_ids)
        k = (n - 1).bit_length()
        entry = bins.setdefault(k, [0, 0])
        entry[0] += 1
        entry[1] += n
        step = (1 << k) - n + 2
        while step <= last:
            moves.setdefault(step, []).append(k)
            k += 1
            step = (1 << k) - n + 2
    return bins, moves


def plan_window(scheduler: Scheduler, step_time: Callable[[StepShape], float], now: float,
                next_arrival: float, max_steps: int = MAX_WINDOW, histogram: bool = True) -> Window | None:
    """The decode steps starting at `now` that provably each run as one plain decode
    of the whole running set; None when not even the first one does. ``histogram``:
    give each step's shape its decode-context histogram (step_shape's flag)."""
    running = scheduler.running
    if not running or now >= next_arrival or not covers(scheduler):
        return None
    # Cheap refusals first: the next step admits, rejects or swaps something in.
    if not (_swap_in_blocked(scheduler) if scheduler.swapped else _admission_blocked(scheduler)):
        return None
    decodes = _RunningDecodes.of(scheduler, max_steps)
    if decodes is None or decodes.last < 1:    # < 1: the stop rule is not the one this module assumes
        return None
    shapes, ends = _price_steps(decodes, step_time, now, next_arrival, histogram)
    crossings = _trim_to_memory(decodes, scheduler.allocator, shapes, ends)
    if crossings is None:
        return None
    finishing = [g for g, f in zip(running, decodes.finish_at) if f == len(shapes)]
    return Window(list(running), decodes.seqs, decodes.first_crossing, crossings, shapes, now, ends, finishing)


@dataclass(slots=True)
class _RunningDecodes:
    """What a window needs to know of the running set: its sequences, when each takes its next
    block and when each group finishes, the widest group and the last step the window may take."""

    seqs: list[Sequence]
    first_crossing: list[int]
    finish_at: list[int]           # per group: the step whose sampled token finishes it
    widest: int
    last: int
    context: int                   # the first step's total decode context

    @classmethod
    def of(cls, scheduler: Scheduler, max_steps: int) -> _RunningDecodes | None:
        """None when a running group could do something else than decode one plain token (beam
        search, stop tokens, EOS, no first token yet, a copy-on-write of its next token)."""
        allocator: BlockManager = scheduler.allocator
        bs, max_model_len = allocator.block_size, scheduler.config.max_model_len
        ref_counts, tables = _gpu_pool(allocator).ref_counts, allocator.tables
        found = cls([], [], [], 0, max_steps, 0)
        for group in scheduler.running:
            params = group.params
            if (params.use_beam_search or params.stop_token_ids or not params.ignore_eos
                    or group.times.first_token is None):
                return None
            width = 0
            group_finish = max_steps + 1
            for seq in group.seqs:
                if seq.status is not _RUNNING:
                    continue
                n = len(seq.token_ids)        # the last one is sampled but not yet in the cache
                # The step whose sampled token reaches max_tokens or the model's length.
                finish = params.max_tokens - n + seq.prompt_len
                if max_model_len - n < finish:
                    finish = max_model_len - n
                if finish < group_finish:
                    group_finish = finish
                table = tables[seq.seq_id]
                capacity = len(table) * bs
                if capacity >= n and ref_counts[table[-1]] > 1:
                    return None                # its next token would be copied-on-write
                found.first_crossing.append(capacity - n + 2)
                found.context += n
                found.seqs.append(seq)
                width += 1
            found.finish_at.append(group_finish)
            if group_finish < found.last:
                found.last = group_finish
            if width > found.widest:
                found.widest = width
        return found


def _price_steps(decodes: _RunningDecodes, step_time: Callable[[StepShape], float], now: float,
                 next_arrival: float, histogram: bool) -> tuple[list[StepShape], list[float]]:
    """Each step's shape and end time, starting none at or after the next arrival (SimPy adds the
    durations one at a time, exactly as here)."""
    shapes: list[StepShape] = []
    ends: list[float] = []
    end = now
    num_seqs, context, last = len(decodes.seqs), decodes.context, decodes.last
    bins, moves = _context_bins(decodes.seqs, last) if histogram else ({}, {})   # empty: no-op updates below
    while end < next_arrival:
        if histogram:
            flat: list[int] = []
            for k in sorted(bins):
                flat += (k, *bins[k])
            shape = StepShape(0, 0, 0, num_seqs, context, decode_histogram=tuple(flat))
        else:
            shape = StepShape(0, 0, 0, num_seqs, context)
        end = end + step_time(shape)
        shapes.append(shape)
        ends.append(end)
        if len(shapes) == last:
            break
        context += num_seqs
        # the next step: every context one longer, some into the next bucket
        for entry in bins.values():
            entry[1] += entry[0]
        for k in moves.get(len(shapes) + 1, ()):
            moved = (1 << k) + 1
            entry = bins[k]
            entry[0] -= 1
            entry[1] -= moved
            if not entry[0]:
                del bins[k]
            entry = bins.setdefault(k + 1, [0, 0])
            entry[0] += 1
            entry[1] += moved
    return shapes, ends


def _trim_to_memory(decodes: _RunningDecodes, allocator: BlockManager, shapes: list[StepShape],
                    ends: list[float]) -> list[int] | None:
    """Cut the window where the free blocks left after a step's appends would fall below the widest
    group; the blocks taken per step (index 1..steps), or None when not even one step fits."""
    steps, bs = len(shapes), allocator.block_size
    crossings = [0] * (steps + 1)
    for step in decodes.first_crossing:
        if step <= steps:
            for j in range(step, steps + 1, bs):
                crossings[j] += 1
    spare = allocator.num_free_blocks() - decodes.widest
    if sum(crossings) > spare:
        taken = 0
        for j in range(1, steps + 1):
            taken += crossings[j]
            if taken > spare:
                steps = j - 1
                break
        if steps == 0:
            return None
        del shapes[steps:], ends[steps:], crossings[steps + 1:]
    return crossings


def apply_window(window: Window, scheduler: Scheduler, tokens: SampledTokens,
                 after_step: Callable[[int], None] | None = None) -> tuple[list[StepRecord], list]:
    """Advance the core through the window's steps; returns their step records and
    the groups that finished (at the last step).

    `tokens` holds each sequence's sampled tokens, one per step. Blocks are
    taken, and full blocks registered in the prefix cache, in step-by-step
    order: at each step the appends in running order, then the marks. Between
    those events only the fill of each sequence's last block changes; it is
    written once, at the end. Groups that finish at the last step get that
    step's tokens from the scheduler's own update, as step by step. `after_step(j)`
    is called once step j's blocks are taken and marked (a router reads the prefix
    cache's events step by step).
    """
    allocator: BlockManager = scheduler.allocator
    used, token_states = allocator.num_used_blocks(), allocator.token_slots_used()
    base = [len(s.token_ids) for s in window.seqs]      # tokens at the window's start
    _take_blocks(window, allocator, tokens, base, after_step)
    finishing_seqs = {s.seq_id for g in window.finishing for s in g.seqs}
    _write_tokens(window, allocator, tokens, base, finishing_seqs)
    _gpu_pool(allocator).num_token_states = token_states + window.steps * len(window.seqs)
    for group in window.groups:
        group.times.token_times.extend(window.ends)
    finished = _finish(window, scheduler, tokens, finishing_seqs) if window.finishing else []
    return _records(window, allocator, used, token_states), finished


def _take_blocks(window: Window, allocator: BlockManager, tokens: SampledTokens, base: list[int],
                 after_step: Callable[[int], None] | None) -> None:
    """Each step's new blocks, in running order, then (with prefix caching) the blocks its computed
    tokens just filled, registered: the order step-by-step simulation takes and marks them in."""
    bs, steps, seqs, tables = allocator.block_size, window.steps, window.seqs, allocator.tables
    fill = _gpu_pool(allocator).fill
    crossing_at: list[list[int]] = [[] for _ in range(steps + 1)]
    for i, first in enumerate(window.first_crossing):
        for j in range(first, steps + 1, bs):
            crossing_at[j].append(i)
    marking_at: list[list[int]] | None = None
    if allocator.enable_prefix_caching:
        marking_at = [[] for _ in range(steps + 1)]
        for i, n in enumerate(base):
            # At step j the update marks n + j - 1 tokens computed.
            for j in range((1 - n) % bs or bs, steps + 1, bs):
                marking_at[j].append(i)
    take = _block_taker(allocator)
    for j in range(1, steps + 1):
        for i in crossing_at[j]:
            # What append_slots does when a token outgrows the last block: the old
            # block is full, a fresh one (free list first, then the LRU cached one) holds 1.
            table = tables[seqs[i].seq_id]
            fill[table[-1]] = bs
            table.append(take())
        if marking_at is not None:
            for i in marking_at[j]:
                seq = seqs[i]
                have = len(seq.token_ids) - base[i]
                if have < j - 1:               # give it the first j - 1 of its window tokens
                    seq.token_ids.extend(tokens[i][0][have:j - 1])
                seq.num_computed_tokens = base[i] + j - 1
                allocator.mark_computed(seq)
        if after_step is not None:
            after_step(j)


def _write_tokens(window: Window, allocator: BlockManager, tokens: SampledTokens, base: list[int],
                  finishing_seqs) -> None:
    """Every sequence's window tokens, log-probabilities and last block's fill as of the last step;
    a finishing group's last token comes from the scheduler's update."""
    bs, steps, tables = allocator.block_size, window.steps, allocator.tables
    fill = _gpu_pool(allocator).fill
    for i, seq in enumerate(window.seqs):
        ids, logprobs = tokens[i]
        take = steps - 1 if seq.seq_id in finishing_seqs else steps
        token_ids = seq.token_ids
        have = len(token_ids) - base[i]
        token_ids.extend(ids[have:take])
        computed = base[i] + steps - 1
        seq.num_computed_tokens = computed
        table = tables[seq.seq_id]
        fill[table[-1]] = computed - (len(table) - 1) * bs   # the last block as of the last step
        logprobs = logprobs[:take]
        seq.output_logprobs.extend(logprobs)
        if any(logprobs):
            cumulative = seq.cumulative_logprob
            for logprob in logprobs:           # one at a time, as Sequence.append adds them
                cumulative += logprob
            seq.cumulative_logprob = cumulative


def _finish(window: Window, scheduler: Scheduler, tokens: SampledTokens, finishing_seqs) -> list:
    """The scheduler's own update of the last step for the groups that finish in it."""
    steps = window.steps
    last_seqs = [s for g in window.finishing for s in g.seqs if s.status is _RUNNING]
    for group in window.finishing:
        group.times.token_times.pop()      # the update appends the last step's time
    samples = {}
    for i, seq in enumerate(window.seqs):
        if seq.seq_id in finishing_seqs:
            ids, logprobs = tokens[i]
            samples[seq.seq_id] = [(ids[steps - 1], logprobs[steps - 1])]
    finished = scheduler.update(SchedulerOutput(False, window.finishing, last_seqs, len(last_seqs)), samples,
                                window.ends[-1])
    if not finished:
        raise AssertionError("fast-forward: no request finished where the window predicted one would")
    return finished


def _records(window: Window, allocator: BlockManager, used: int, token_states: int) -> list[StepRecord]:
    """Each step's record, with its memory as the step-by-step simulator snapshots it (appends done)."""
    records = []
    bs, num_seqs, num_groups = allocator.block_size, len(window.seqs), len(window.groups)
    total_slots = allocator.num_gpu_blocks * bs
    start = window.start
    for j in range(1, window.steps + 1):
        used += window.crossings[j]
        token_states += num_seqs
        end = window.ends[j - 1]
        records.append(StepRecord(start=start, end=end, is_prefill=False, batch_size=num_groups, num_seqs=num_seqs,
                                  prefill_tokens=0, decode_tokens=num_seqs, kv_blocks_used=used,
                                  token_states=token_states, reserved=0,
                                  internal_fragmentation=used * bs - token_states, external_fragmentation=0,
                                  free=total_slots - used * bs, preempted=0, swapped_blocks=0))
        start = end
    return records
