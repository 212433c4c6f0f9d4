"""The running batch kept across steps: decode steps planned and taken with no work per request.

At production load a replica runs dozens of requests, takes a step every few
milliseconds, and some request arrives or finishes every few steps. A
fast-forward window (fast_forward.py) rebuilds its proof from every running
request at each such event, so a window of four steps cost about what four
steps did. `DecodeBatch` keeps that proof across events instead: per request,
the step at which it finishes, the residue (step mod block size) at which it
takes a new block and the steps at which its context moves to the next
histogram bucket, all in absolute step numbers, so nothing about a request is
read again until it finishes. Planning a step costs a few dictionary updates
and the cost model's price; an arrival or a finish costs the core's own work
for that one request.

Requests' tokens, block fills, computed counts and token times are written
lazily: a request is brought up to date when it finishes, or all of them when
the batch hands the scheduler back to step-by-step simulation (`release`).
In between, the block manager's tables, free blocks, reference counts and its
token-state count are exact at every step boundary, and the scheduler's
queues and statuses are always exact, which is everything the scheduler reads
when it admits a prompt. So an admission runs the core's own code: the
paper's prefill step is `scheduler.schedule` itself (it reads only waiting
requests, statuses and free blocks); vLLM v1's mixed step decodes the batch
here and admits through `ChunkedScheduler.schedule_waiting`, its own second pass.

Covered (else `build` returns None and the caller steps as before): the paged
block manager, requests of one sequence decoding plain tokens (no beams, stop
tokens or EOS), nothing swapped. Without prefix caching tokens are never read
and the simulated executor samples a constant, so nothing is drawn; vLLM v1's
policy also with prefix caching (as vLLM deploys it), where a member's sampled
tokens are the same constant in blocks only it can hit (private_blocks.py),
or the answer the trace gives, whose every block enters the prefix cache at
the step, and in the running order, step by step registers it. Under a
prefix-aware router, which reads the cache's KV events as each step published
them: the plan's steps are taken one by one, each step's events (the cached
blocks it took off the free queue, the blocks it registered) tagged with its
end, and the engine gives the router those of a
plan in flight as the batch foresees them (`plan_events`). With a CPU KV tier
too: every block a member fills is then keyed, and the batch takes each step's
blocks and writes the tier in the scheduler's own order (the last step's
stores made ready, the members' blocks, the waiting head's lookup, which
reorders the tier's LRU, then the stores, which price the step): as it plans
the step, or, where a router or a lockstep group may cut a plan short, as it
takes it, the plan having foreseen the stores (`_StoresAhead`).
Why each step is the one the scheduler would take is fast_forward.py's proof
(decode, admission and memory), restated in `plan`. Tests hold runs that use
it equal to step-by-step runs, record for record.
"""
from __future__ import annotations

import heapq
import math
from bisect import bisect_left
from collections import Counter, deque
from dataclasses import dataclass, field
from functools import reduce
from itertools import chain, repeat
from operator import add, attrgetter
from typing import NamedTuple

from engine.core.block_keys import block_key
from engine.core.block_manager import BlockManager, _blocks_for
from engine.core.chunked_scheduler import ChunkedScheduler, VllmBlockManager
from engine.core.kv_allocator import AllocStatus
from engine.core.metrics import StepRecord
from engine.core.scheduler import Scheduler, SchedulerOutput
from engine.core.sequence import SequenceGroup, SequenceStatus
from planner.cost.shape import StepShape
from planner.sim.decode_run import DecodeRun, price_run, run_pricer
from planner.sim.fast_forward import MAX_WINDOW, _admission_blocked
from planner.sim.private_blocks import PrivateBlockManager, private_key
from planner.sim.lazy_log import ShapeLog

_RUNNING = SequenceStatus.RUNNING
_order = attrgetter("order")
RUN_MIN_STEPS = 32     # plans likely shorter are priced step by step (DecodeBatch._long)


@dataclass(slots=True, eq=False)
class _Member:
    """One running request of the batch."""

    group: SequenceGroup
    table: list[int]      # its block table (the block manager's own list)
    order: int            # admission order: the batch's members run in this order
    synced: int           # its tokens, fill, computed count and times are written up to this batch step
    finish: int           # the batch step whose sampled token ends it
    residue: int          # it takes a new block at the batch steps s with s % block_size == residue
    base: int             # its context (keys read, the new token's included) at batch step s is base + s
    tokens_upto: int = 0  # its sequence holds the tokens sampled up to this step
    answer: list | None = None   # the trace's answer, when its tokens are that (else the executor's constant)
    keys: list | None = None     # with prefix caching: its sequence's block keys (the block manager's list)


@dataclass(slots=True)
class Plan:
    """Consecutive decode steps of the whole batch, proven and priced, not yet taken."""

    start: float
    source: list[StepShape] | DecodeRun   # the steps' shapes, or the priced run that builds them
    ends: list[float]
    takes: list[int]            # per step: blocks it takes (requests crossing a block boundary)
    blocks_used: int            # at the plan's start
    token_states: int           # at the plan's start
    finishing: bool             # the last step finishes a request
    first_step: int             # the batch step of the first step
    bins_after: Bins | None = None   # the histogram of the step after the last (None once truncated)
    prices: list[float] = field(default_factory=list)   # each step's duration (ends: their running sum)
    blocks_taken: bool = False  # its steps' blocks are taken and the CPU tier written already (never cut then)
    head_keys: list[int] | None = None   # a CPU tier's plan written when taken: the waiting head's lookup

    @property
    def last_step(self) -> int:
        return self.first_step + len(self.ends) - 1

    @property
    def steps(self) -> int:
        return len(self.ends)

    def contexts(self):
        """Each step's total decode context."""
        source, steps = self.source, len(self.ends)
        if isinstance(source, DecodeRun):
            return source.contexts(steps)
        return [shape.decode_context for shape in source[:steps]]

    def log_shapes(self, log: ShapeLog) -> None:
        """Add the steps' shapes to `log` (a priced run's as the run, built when read)."""
        if isinstance(self.source, DecodeRun):
            log.add_run(self.source, len(self.ends))
        else:
            log.extend(self.source[:len(self.ends)])

    def after(self, num: int, moves: dict, histogram: bool) -> tuple[int, Bins | None]:
        """The decode context and histogram of the step after the last (`num` members, each context one
        longer, and the buckets in `moves` for it moved on), as the batch keeps them."""
        steps, source = len(self.ends), self.source
        run = isinstance(source, DecodeRun)
        context = source.context + (steps - 1) * num if run else source[steps - 1].decode_context
        bins = self.bins_after
        if histogram and bins is None:
            flat = source.histogram(steps - 1) if run else source[steps - 1].decode_histogram
            bins = [list(flat[i:i + 3]) for i in range(0, len(flat), 3)]
            _advance(bins, moves.get(self.last_step + 1, ()))
        return context + num, bins

    def taken(self, steps: int) -> int:
        """Blocks the first `steps` steps take."""
        return sum(self.takes[:steps])

    def truncate(self, steps: int) -> None:
        """Keep the first `steps` steps (a request arrived; the rest is the next plan's business)."""
        if self.blocks_taken and steps < len(self.ends):
            raise AssertionError("decode batch: a plan whose blocks are taken was cut")
        if steps < len(self.ends):
            del self.ends[steps:], self.takes[steps:], self.prices[steps:]
            self.finishing = False
            self.bins_after = None


def publish_events(log: deque, events: list, end: float) -> None:
    """The block pool's KV events so far into `log`, tagged with `end`: the end of the step that made them, when a
    prefix-aware router may read them."""
    if events:
        log.append((end, events[:]))
        events.clear()


class _StoresAhead:
    """The blocks a cuttable plan's steps store in the CPU tier, foreseen without writing it (the steps are
    written when taken, `DecodeBatch._write_tier`): each member that fills a block offers that one block (none
    is behind), and the tier takes it when the block's key is new to it, as it must while the step's blocks
    fit beside the blocks being loaded (the last step's stores are ready by then, so every other block can
    be evicted; the plan parks no load). `at` gives None from the first step it cannot foresee so."""

    def __init__(self, batch: DecodeBatch) -> None:
        tier = batch.tier
        self.batch = batch
        self.room = tier.num_blocks - len(tier.held)     # the blocks one step can store
        self.keys: dict[_Member, list[int]] = {}     # member -> the keys the plan's steps give it so far
        self.new: set[int] = set()

    def at(self, step: int) -> int | None:
        """The blocks batch step `step` stores (the steps before it foreseen already)."""
        batch = self.batch
        fillers, bs, slots = batch.by_residue[(step + 1) % batch.bs], batch.bs, batch.tier.slots
        if len(fillers) > self.room:
            return None
        keys = []
        for member in fillers:
            ahead = self.keys.get(member)
            index = len(member.keys) + (len(ahead) if ahead else 0)
            if index != (member.base + step) // bs - 1:       # (`_grow` asks the block manager then)
                return None
            key = batch._filled_key(member, index, ahead[-1] if ahead else None)
            if key in slots or key in self.new:
                return None
            keys.append(key)
        for member, key in zip(fillers, keys):
            self.keys.setdefault(member, []).append(key)
            self.new.add(key)
        return len(keys)


@dataclass(slots=True)
class MixedStep:
    """vLLM v1's step that decodes the batch and admits waiting prompts, between its start and end."""

    shape: StepShape
    record: StepRecord          # its end is filled in at the end
    groups: list                # the prompts admitted, their sequences and scheduled tokens
    seqs: list
    counts: list
    ended: list                 # requests the admission pass rejected or truncated
    num_running: int            # requests in the running list during the step


def covers(scheduler: Scheduler, executor, events: bool = True) -> bool:
    """The scheduler and block manager a batch is proven for: either policy with tokens nobody reads,
    or vLLM v1's with prefix caching over private blocks (`events`: also when a router reads the cache's
    events, which the engine gives it from the batch's plans)."""
    allocator = scheduler.allocator
    if allocator.enable_prefix_caching:
        return (type(scheduler) is ChunkedScheduler and type(allocator) is PrivateBlockManager
                and not executor.draws_samples and (events or allocator.gpu.events is None))
    if executor.draws_samples:
        return False
    chunked = type(scheduler) is ChunkedScheduler and type(allocator) is VllmBlockManager
    paper = type(scheduler) is Scheduler and type(allocator) is BlockManager
    return (paper and allocator.slot_reservation == "vllm") or chunked


# A decode-context histogram as the batch keeps it: [bucket, sequences, sum of contexts] per
# occupied bucket, buckets ascending (StepShape.decode_histogram, unflattened).
Bins = list[list[int]]


def _histogram(bins: Bins) -> tuple[int, ...]:
    return tuple(chain.from_iterable(bins))


def _entry(bins: Bins, k: int) -> list[int]:
    """Bucket k's entry, inserted in order if it has none."""
    for i, entry in enumerate(bins):
        if entry[0] >= k:
            if entry[0] == k:
                return entry
            bins.insert(i, [k, 0, 0])
            return bins[i]
    bins.append([k, 0, 0])
    return bins[-1]


def _take_out(bins: Bins, k: int, context: int) -> None:
    """One context leaves bucket k."""
    entry = _entry(bins, k)
    entry[1] -= 1
    entry[2] -= context
    if not entry[1]:
        bins.remove(entry)


@dataclass(eq=False)
class DecodeBatch:
    scheduler: Scheduler
    executor: object
    histogram: bool                       # give shapes their decode-context histogram (the model reads it)
    step: int = 0                         # batch steps taken: steps in which every member decoded
    ends: list[float] = field(default_factory=list)       # each batch step's end time
    members: list[_Member] = field(default_factory=list)  # in running order
    context: int = 0                      # the next step's total decode context
    bins: Bins = field(default_factory=list)              # its histogram
    moves: dict[int, list[int]] = field(default_factory=dict)    # step -> buckets a context leaves then
    finishes: list = field(default_factory=list)          # heap of (finish step, order, member)
    counter: int = 0
    cost_model: object = None             # prices a plan as one run when it offers decode_step_times
    bases: list[int] | None = None        # the members' bases in running order (None: to list again)
    loras: Counter | None = None          # with LoRA: the members' adapters and how many run each (None: off)

    def __post_init__(self) -> None:
        self.allocator = self.scheduler.allocator
        self.pool = self.allocator.gpu
        self.bs = self.allocator.block_size
        self.v1 = self.scheduler.config.vllm_v1
        self.by_residue: list[list[_Member]] = [[] for _ in range(self.bs)]
        self.caching = self.allocator.enable_prefix_caching    # answers' full blocks enter the prefix cache
        self.answers = self.executor.answers                     # request id -> the trace's answer
        self.answering = 0                                       # members sampling an answer
        # With caching, per residue r: the members that take a block in a step s with s % block_size
        # == r and those sampling an answer that fill one then, in running order (`_grow`); made again
        # when a member joins or leaves.
        self.turns: list[list[_Member] | None] = [None] * self.bs
        # With a CPU KV tier (--kv-offloading-size) every block a member fills is keyed and offered to it, so the
        # blocks are taken and the tier written as each step is planned (`_tier_step`), and a plan is never cut;
        # unless a router or a lockstep group may cut it (`cuttable`): then the plan foresees its stores and
        # stops where it cannot, and the steps are written to the tier as they are taken (`_StoresAhead`).
        self.tier = getattr(self.allocator, "offload", None)
        self.behind: list[_Member] = []       # members with full blocks the tier has not taken yet, in order
        self.cuttable = False
        # With a prefix-aware router reading the cache's KV events (the engine's, by step end): each step's events
        # are tagged with its end when the plan is taken, and those of a plan in flight foreseen (`plan_events`).
        self.kv_events: deque | None = None
        if self.scheduler.config.max_loras is not None:
            self.loras = Counter()

    @classmethod
    def build(cls, scheduler: Scheduler, executor, histogram: bool, cost_model=None,
              cuttable: bool = False, kv_events: deque | None | bool = None) -> DecodeBatch | None:
        """The batch of the scheduler's running requests, or None when it is outside the proof.
        `cost_model`: plans are priced as runs (decode_run.py) when it can and histograms are kept.
        `cuttable`: a plan may be cut short after it was planned (a routed engine, a lockstep group's).
        `kv_events`: the engine's KV events by step end, when a prefix-aware router reads them (False: it
        does, and this engine cannot give them to it from plans in flight)."""
        if not scheduler.running or scheduler.swapped or not covers(scheduler, executor, kv_events is not False):
            return None
        batch = cls(scheduler, executor, histogram, cost_model=cost_model if histogram else None)
        batch.cuttable = cuttable
        batch.kv_events = None if kv_events is False else kv_events
        for group in scheduler.running:
            if not batch.decoding(group):
                return None
        for group in scheduler.running:
            batch.add(group)
        return batch

    def decoding(self, group: SequenceGroup) -> bool:
        """One sequence, decoding plain tokens, its blocks exactly its computed tokens, none shared."""
        params = group.params
        if (len(group.seqs) != 1 or params.use_beam_search or params.best_of != 1 or params.stop_token_ids
                or not params.ignore_eos or group.times.first_token is None):
            return False
        seq = group.seqs[0]
        n = len(seq.token_ids)
        table = self.allocator.tables.get(seq.seq_id)
        return (seq.status is _RUNNING and seq.num_computed_tokens == n - 1 and table is not None
                and len(table) == _blocks_for(n - 1, self.bs) and self.pool.ref_counts[table[-1]] == 1
                and self._finish_in(group, n) >= 1)

    def _finish_in(self, group: SequenceGroup, n: int) -> int:
        """Steps from the next one until the one whose sampled token ends the request (by length)."""
        seq = group.seqs[0]
        finish = group.params.max_tokens - n + seq.prompt_len
        return min(finish, self.scheduler.config.max_model_len - n)

    def add(self, group: SequenceGroup) -> None:
        """A decoding request joins the batch at the next step (its state written up to now)."""
        seq = group.seqs[0]
        n = len(seq.token_ids)
        table = self.allocator.tables[seq.seq_id]
        self.counter += 1
        first = len(table) * self.bs - n + 2            # the step (from the next, 1-based) it takes a block
        member = _Member(group, table, self.counter, self.step, self.step + self._finish_in(group, n),
                         (self.step + first) % self.bs, n - self.step - 1, self.step)
        if self.answers:
            member.answer = self.answers.get(group.request_id)
            self.answering += member.answer is not None
        if self.caching:
            member.keys = self.allocator.seq_hashes.setdefault(seq.seq_id, [])
            self._turns_changed(member)
        self.members.append(member)
        if self.tier is not None and self.allocator.offered.get(seq.seq_id, 0) < len(member.keys):
            self.behind.append(member)
        self.bases = None
        if self.loras is not None and group.lora_id:
            self.loras[group.lora_id] += 1
        self.by_residue[member.residue].append(member)
        heapq.heappush(self.finishes, (member.finish, member.order, member))
        self.context += n
        if self.histogram:
            k = (n - 1).bit_length()
            entry = _entry(self.bins, k)
            entry[1] += 1
            entry[2] += n
            step = self.step + (1 << k) - n + 2
            while step <= member.finish:          # the steps its context enters the next bucket
                self.moves.setdefault(step, []).append(k)
                k += 1
                step = self.step + (1 << k) - n + 2

    # -- planning --------------------------------------------------------------------------------

    def waiting_blocked(self) -> bool:
        """The next steps admit nothing: the waiting head stays where it is while the batch decodes
        (the running set is fixed and free blocks only shrink until the next finish)."""
        scheduler = self.scheduler
        if not self.v1:       # (the running requests are the members, one sequence each)
            return _admission_blocked(scheduler, len(self.members))
        head = self._admission_head()
        if head is None:
            return True
        if scheduler.never_fits(head) is not None:
            return False                                   # the next step rejects or truncates it
        cfg = scheduler.config
        budget = cfg.max_num_batched_tokens - len(self.members)
        if budget <= 0 or len(scheduler.running) >= cfg.max_num_seqs:
            return True
        tokens = head.seqs[0].num_tokens
        # A prefix-cache hit spares blocks, and the blocks the members fill meanwhile may lengthen it:
        # count the longest hit there could be (none without caching).
        free = self.allocator.num_free_blocks() + ((tokens - 1) // self.bs if self.caching else 0)
        free -= self.allocator.state_blocks           # what a hybrid's sequence holds for its states
        if scheduler.reserve_full_isl and _blocks_for(tokens, self.bs) > free:
            return True
        return _blocks_for(min(tokens, scheduler.chunk_cap(budget)), self.bs) > free

    def _admission_head(self):
        """The waiting request the next waiting pass tries first: the queue's head, or with LoRA the first
        the max_loras check does not pass over (while the batch decodes, its adapters stay the same, so those
        passed over stay so); a request that never fits stops the search (the pass rejects it). None: none."""
        scheduler = self.scheduler
        if not scheduler.waiting:
            return None
        loras = scheduler.running_loras()
        if loras is None:
            return scheduler.waiting[0]
        return next((group for group in scheduler.waiting if scheduler.never_fits(group) is not None
                     or not scheduler.lora_passes_over(group, loras)), None)

    def plan(self, now: float, next_arrival: float, step_time, max_steps: int = MAX_WINDOW,
             ahead: int = 0) -> Plan | None:
        """The decode steps from `now` that provably each decode the whole batch, none starting at or
        after `next_arrival` but the `ahead` first of those (async scheduling's step already scheduled
        when the request arrives), up to the first that finishes a request; None when not even one."""
        members = self.members
        if not members or now >= next_arrival or self.scheduler.swapped or not self.waiting_blocked():
            return None
        num = len(members)
        if self.v1 and num > self.scheduler.config.max_num_batched_tokens:
            return None
        if self.tier is not None and (self.allocator.loads or self.cuttable and self.behind):
            return None            # a request parked while its blocks load joins the next waiting pass
        if self.kv_events is not None and self.answering and not self._in_step():
            return None            # (an answer's block registered the block manager's way: events not foreseen)
        first_finish = self.finishes[0][0]
        last = min(first_finish, self.step + max_steps)
        # Paper: a request appends only with a free block for it (vLLM v0.2.0's check), so a
        # step's blocks must leave one; vLLM v1 only needs the blocks it takes.
        spare = self.allocator.num_free_blocks() - (0 if self.v1 else 1)
        # (a tier's stores price each step's shape: no run prices them)
        pricer = run_pricer(self.cost_model) if self.tier is None else None
        head_keys = self._head_keys() if self.tier is not None else None
        if pricer is not None and self._long(now, next_arrival, last):
            run = self._run()
            crossings = [len(members) for members in self.by_residue]
            ends, takes, prices = price_run(run, self.cost_model, pricer, now, next_arrival, last - self.step,
                                            crossings, self.step, spare, ahead)
            source, bins = run, None
        else:
            # A model that prices runs prices a step from the batch's own histogram too (no StepShape).
            decode_time = self.cost_model.decode_pricer(num) if pricer is not None and self.histogram else None
            source, ends, takes, prices, bins = self._price(now, next_arrival, step_time, last, spare, decode_time,
                                                            ahead, head_keys)
        if not ends:
            return None
        written = self.tier is not None and not self.cuttable
        taken = sum(takes) if written else 0      # (a tier's plan took its blocks already, unless cuttable)
        return Plan(now, source, ends, takes, self.allocator.num_used_blocks() - taken,
                    self.pool.num_token_states - taken, self.step + len(ends) == first_finish, self.step + 1, bins,
                    prices, written, head_keys if self.cuttable else None)

    def _run(self) -> DecodeRun:
        """The run of decode steps from the next one (its members' bases listed once per membership)."""
        if self.bases is None:
            self.bases = [m.base for m in self.members]
        return DecodeRun(self.bases, self.step + 1, self.context)

    def _long(self, now: float, next_arrival: float, last: int) -> bool:
        """Is the plan likely long enough to price as one run? Its array operations cost a few dozen
        steps priced one by one: a plan of a few steps (a finish or, at the last step's pace, an
        arrival close by) is priced step by step."""
        if last - self.step < RUN_MIN_STEPS:
            return False
        if next_arrival == math.inf:
            return True
        ends = self.ends
        return len(ends) > 1 and next_arrival - now > RUN_MIN_STEPS * (ends[-1] - ends[-2])

    def _price(self, now: float, next_arrival: float, step_time, last: int, spare: int, decode_time=None,
               ahead: int = 0, head_keys: list[int] | None = None):
        """The steps' shapes (a list, or with `decode_time`, the model's price of a decode step of the
        batch from the histogram's triples, the run that builds them), ends, blocks taken and prices,
        from the next step to `last` at most, none starting at or after `next_arrival` but `ahead`.
        With a CPU tier each step's stores are priced: written as it is planned, or foreseen (`cuttable`)."""
        shapes: list[StepShape] = []
        ends: list[float] = []
        takes: list[int] = []
        prices: list[float] = []
        num, context, bs, by_residue = len(self.members), self.context, self.bs, self.by_residue
        histogram = self.histogram
        bins = [entry[:] for entry in self.bins] if histogram else None
        moves = self.moves
        step, end, taken, stored = self.step, now, 0, 0
        foreseen = _StoresAhead(self) if self.tier is not None and self.cuttable else None
        while step < last:
            if end >= next_arrival:
                if not ahead:
                    break
                ahead -= 1
            crossing = len(by_residue[(step + 1) % bs])
            if taken + crossing > spare:
                break
            if foreseen is not None:
                stored = foreseen.at(step + 1)
                if stored is None:
                    break
            taken += crossing
            step += 1
            if self.tier is not None and foreseen is None:
                stored = self._tier_step(step, head_keys)
            if decode_time is not None:
                price = decode_time(bins)
            else:
                shape = StepShape(0, 0, 0, num, context, decode_histogram=_histogram(bins) if histogram else (),
                                  lora_adapters=len(self.loras) if self.loras else 0, offload_blocks=stored)
                price = step_time(shape)
                shapes.append(shape)
            end = end + price
            prices.append(price)
            ends.append(end)
            takes.append(crossing)
            context += num
            if histogram:
                _advance(bins, moves.get(step + 1, ()))
        source = shapes if decode_time is None else self._run()
        return source, ends, takes, prices, bins

    # -- taking steps ----------------------------------------------------------------------------

    def apply(self, plan: Plan) -> list[SequenceGroup]:
        """Take the plan's steps: the blocks, the token-state count; finish the requests its last step
        ends, and return them (the steps' records: `PlanTaken.records`)."""
        steps = plan.steps
        if not steps:
            return []
        pool, step = self.pool, self.step
        if not plan.blocks_taken:    # (a CPU tier's plan took them as it was made, unless cuttable)
            if self.tier is not None:
                self._write_tier(step + 1, plan)
            elif self.kv_events is not None:
                self._take_published(step + 1, plan)
            elif self.caching and self.answering:
                self._grow(step + 1, step + steps)
            else:
                self._take(step + 1, plan.takes)
        num = len(self.members)
        if self.loras:       # each step ran the members' adapters: in the slots, most recently used
            self.scheduler.activate_loras([m.group for m in self.members])
        pool.num_token_states = plan.token_states + steps * num
        self._advance_to(step + steps, *plan.after(num, self.moves, self.histogram))
        self.ends.extend(plan.ends)
        finished = self._finish(self.step, plan.ends[-1]) if plan.finishing else []
        if self.kv_events is not None:         # (the finishing update's, at the last step's end)
            publish_events(self.kv_events, self.pool.events, plan.ends[-1])
        return finished

    def _take(self, first: int, takes) -> None:
        """The blocks batch steps first, first + 1, ... take (takes[j] at step first + j): members
        crossing a block boundary, step by step, each step's in running order."""
        fill, bs, by_residue = self.pool.fill, self.bs, self.by_residue
        fresh = iter(self.pool.take_many(sum(takes), 1))      # in the order the steps take them
        for step, count in enumerate(takes, first):
            if count:
                for member in by_residue[step % bs]:
                    table = member.table
                    fill[table[-1]] = bs         # the old last block is full; a fresh one holds one token
                    table.append(next(fresh))

    def _take_published(self, first: int, plan: Plan) -> None:
        """The plan's steps taken one by one (`_take`, or `_grow` with members sampling answers), each
        step's KV events (the cached blocks it took, the answers' blocks it registered) tagged with its end."""
        events, log, grow = self.pool.events, self.kv_events, self.caching and self.answering
        for step, count, end in zip(range(first, first + plan.steps), plan.takes, plan.ends):
            if grow:
                self._grow(step, step)
            elif count:
                self._take(step, (count,))
            publish_events(log, events, end)

    def plan_events(self, plan: Plan, steps: int) -> tuple[set[int], set[int]]:
        """What the first `steps` steps of `plan`, not yet taken, will do to the prefix cache, as `_grow`
        and `_take` will do it: the keys they drop (a cached block taken off the front of the free queue)
        and those they add (an answer's block registered, or with a CPU tier every block filled, unless its
        key is cached already), each as the last event of its key leaves it."""
        pool, bs, turns, keyed = self.pool, self.bs, self.turns, self.tier is not None
        hashes, cached = pool.block_hash, pool.cached
        queue = iter(pool.evictor)
        dropped: set[int] = set()
        added: set[int] = set()
        keys: dict[_Member, int] = {}     # member -> its last key so far, registered in these steps

        def take() -> None:
            h = hashes[next(queue)]
            if h is not None:
                dropped.add(h)
                added.discard(h)

        for step in range(plan.first_step, plan.first_step + steps):
            if not (self.caching and (self.answering or keyed)):
                for _ in range(plan.takes[step - plan.first_step]):
                    take()
                continue
            r = step % bs
            turn = turns[r]
            if turn is None:
                turn = self._turn(r)
            for member in turn:
                if member.residue == r:
                    take()
                    if bs > 1 or not (keyed or member.answer is not None):
                        continue
                if not keyed and member.answer is None:
                    continue
                index = (member.base + step) // bs - 1
                key = self._filled_key(member, index, keys.get(member))
                keys[member] = key
                if key in added or key in cached and key not in dropped:
                    continue                            # (`register` keeps the block it has)
                added.add(key)
                dropped.discard(key)
        return dropped, added

    def _turn(self, r: int) -> list[_Member]:
        """Who acts, in running order, in the steps s with s % block_size == r (`_grow`): the members that take
        a block then, and those that fill one and register it (sampling an answer, or any with a CPU tier)."""
        keyed, takers = self.tier is not None, self.by_residue[r]
        fillers = [m for m in self.by_residue[(r + 1) % self.bs] if keyed or m.answer is not None]
        turn = self.turns[r] = sorted(takers + fillers, key=_order) if self.bs > 1 else takers
        return turn

    def _grow(self, first: int, last: int) -> None:
        """With prefix caching and members sampling an answer, batch steps first .. last's blocks as
        `_schedule_running` grows them: step by step, member by member in running order, a fresh block
        for one crossing a boundary, and the block one sampling an answer has just filled (its tokens up
        to the step before) registered in the prefix cache (the others' blocks are private; with a CPU
        tier every member's block is registered, a private one under its private key). The order
        matters where a block taken drops a key that a block registered holds too. One call a plan,
        with everything it reads bound once."""
        bs, turns, keyed = self.bs, self.turns, self.tier is not None
        take, fill, register = self.pool.take, self.pool.fill, self.pool.register
        for step in range(first, last + 1):
            r = step % bs
            turn = turns[r]
            if turn is None:
                turn = self._turn(r)
            for member in turn:
                if member.residue == r:
                    table = member.table
                    fill[table[-1]] = bs
                    table.append(take(1))
                    if bs > 1 or not (keyed or member.answer is not None):
                        continue
                if member.answer is None:       # (a tier's) a private block: no token of it is read
                    keys, seq_id = member.keys, member.group.seqs[0].seq_id
                    if len(keys) == (member.base + step) // bs - 1:
                        keys.append(private_key(seq_id, len(keys)))
                        register(member.table[len(keys) - 1], keys[-1])
                    else:
                        self.allocator.mark_computed(member.group.seqs[0], member.base + step)
                    continue
                self._write(member, step - 1)
                keys, tokens = member.keys, member.group.seqs[0].token_ids
                if len(keys) == (member.base + step) // bs - 1:      # the one block it filled: its key
                    keys.append(block_key(keys[-1] if keys else member.group.seqs[0].cache_root,
                                          tokens[len(tokens) - bs:]))
                    register(member.table[len(keys) - 1], keys[-1])
                else:                                                 # else the block manager's own way
                    self.allocator.mark_computed(member.group.seqs[0], member.base + step)

    # -- the CPU tier (--kv-offloading-size) ---------------------------------------------------------

    def _head_keys(self) -> list[int] | None:
        """The keys the next steps' waiting pass looks up in the tier, and so touches, each step: its head's
        (the same whatever the GPU holds of them); None when no waiting pass runs (`waiting_blocked`: the head
        has neither the blocks to start nor, so, to load its prefix)."""
        scheduler = self.scheduler
        if (len(self.members) >= scheduler.config.max_num_batched_tokens
                or len(scheduler.running) >= scheduler.config.max_num_seqs):
            return None
        head = self._admission_head()
        if head is None:
            return None
        seq = head.seqs[0]
        return self.allocator.tier_keys(seq, self.allocator.cached_prefix(seq))

    def _tier_step(self, step: int, head_keys: list[int] | None) -> int:
        """Batch step `step` as the scheduler would schedule it, on the blocks and the CPU tier: last step's
        stores ready, the members' blocks taken and filled ones registered (`_grow`), the waiting head's
        lookup, and the members' full blocks offered to the tier (`offload_stores`: in running order, those
        that filled one and those still behind). Returns the blocks stored, which the step copies."""
        tier, allocator = self.tier, self.allocator
        tier.complete_stores()
        self.scheduler.kv_loads = {}
        self._grow(step, step)
        if head_keys is not None:
            tier.touch(head_keys)
        fillers = self.by_residue[(step + 1) % self.bs]
        storers = sorted({*fillers, *self.behind}, key=_order) if self.behind else fillers
        refused = tier.stats.stores_refused
        stored = len(allocator.offload_stores([m.group.seqs[0] for m in storers]))
        if self.behind or tier.stats.stores_refused != refused:      # a store refused leaves its member behind
            self._find_behind(storers)
        return stored

    def _write_tier(self, first: int, plan: Plan) -> None:
        """A cuttable plan's steps taken, from batch step `first`: each step's blocks and tier writes as
        `_tier_step` makes them, which must store the blocks the plan foresaw and priced (and its KV events
        tagged with its end, under a prefix-aware router)."""
        events, log = self.pool.events, self.kv_events
        for step, shape, end in zip(range(first, first + plan.steps), plan.source, plan.ends):
            if self._tier_step(step, plan.head_keys) != shape.offload_blocks:
                raise AssertionError("decode batch: a plan's step stored other blocks than it foresaw")
            if log is not None:
                publish_events(log, events, end)

    def _in_step(self) -> bool:
        """Every member sampling an answer registers its next full block `_grow`'s own way (its keys so far
        are those of its full blocks), so `plan_events` can foresee the key."""
        bs, step = self.bs, self.step
        return all(len(m.keys) == (m.base + step + ((m.residue - 1 - step) % bs or bs)) // bs - 1
                   for m in self.members if m.answer is not None)

    def _filled_key(self, member: _Member, index: int, parent: int | None) -> int:
        """The key of the member's block `index` once full (`_grow`'s), its parent's key given when known:
        private, or (a member sampling the trace's answer) hashed from the tokens it will hold."""
        seq = member.group.seqs[0]
        if member.answer is None:
            return private_key(seq.seq_id, index)
        if parent is None:
            parent = member.keys[index - 1] if index else seq.cache_root
        bs, tokens, prompt = self.bs, seq.token_ids, seq.prompt_len
        low, high = index * bs, (index + 1) * bs
        return block_key(parent, [*tokens[low:high], *member.answer[max(low, len(tokens)) - prompt:high - prompt]])

    def _find_behind(self, members) -> None:
        """Of `members` (in running order), those the tier has not taken every full block of are behind."""
        offered, checked = self.allocator.offered, set(members)
        behind = [m for m in self.behind if m not in checked]
        behind += [m for m in members if offered.get(m.group.seqs[0].seq_id, 0) < len(m.keys)]
        behind.sort(key=_order)
        self.behind = behind

    def _turns_changed(self, member: _Member) -> None:
        """A member joined or left: the turns of the steps it takes or fills a block in change."""
        self.turns[member.residue] = self.turns[(member.residue - 1) % self.bs] = None

    def _advance_to(self, step: int, context: int, bins: Bins | None) -> None:
        """The batch after `step`: the next step's context and histogram."""
        moves = self.moves
        for s in range(self.step + 1, step + 1):
            moves.pop(s, None)
        self.step = step
        self.context = context
        if self.histogram:
            self.bins = bins

    def _finish(self, step: int, end: float, others: tuple = (), counts: list | None = None) -> list:
        """The scheduler's own update of `step` for the members it finishes (and `others`, the
        groups admitted in it, with their scheduled `counts`); they leave the batch."""
        done = []
        while self.finishes and self.finishes[0][0] == step:
            done.append(heapq.heappop(self.finishes)[2])
        done.sort(key=_order)
        for member in done:
            self.sync(member, step - 1)
            seq, table = member.group.seqs[0], member.table
            self.pool.fill[table[-1]] = len(seq.token_ids) - (len(table) - 1) * self.bs   # as of `step`
            self._remove(member)
        groups = [m.group for m in done] + list(others)
        if not groups:
            return []
        seqs = [g.seqs[0] for g in groups]
        out = SchedulerOutput(False, groups, seqs, len(seqs),
                              num_scheduled_tokens=None if counts is None else [1] * len(done) + counts)
        finished = self.scheduler.update(out, self.executor.samples(out.sampling_part()), end)
        if done and any(m.group.finish_reason is None for m in done):
            raise AssertionError("decode batch: a request did not finish where the batch said it would")
        return finished

    def _remove(self, member: _Member) -> None:
        """A member that finishes at the batch's last step leaves it (its contribution to the next)."""
        self.answering -= member.answer is not None
        if self.caching:
            self._turns_changed(member)
        self.members.remove(member)
        self.bases = None
        if self.loras is not None and member.group.lora_id:
            self.loras[member.group.lora_id] -= 1
            if not self.loras[member.group.lora_id]:
                del self.loras[member.group.lora_id]
        self.by_residue[member.residue].remove(member)
        if self.behind and member in self.behind:
            self.behind.remove(member)
        n = len(member.group.seqs[0].token_ids)         # its context in its last step
        self.context -= n + 1
        if self.histogram:
            _take_out(self.bins, (n - 1).bit_length(), n + 1)   # no move was planned past its last step

    def sync(self, member: _Member, upto: int) -> None:
        """Write a member's tokens, log-probabilities, computed count, last block's fill and token
        times as of batch step `upto` (what step-by-step simulation would have written)."""
        k = upto - member.synced
        if k <= 0:
            return
        seq = member.group.seqs[0]
        self._write(member, upto)
        computed = len(seq.token_ids) - 1
        seq.num_computed_tokens = computed
        table = member.table
        self.pool.fill[table[-1]] = computed - (len(table) - 1) * self.bs
        member.group.times.token_times.extend(self.ends[member.synced:upto])
        member.synced = upto

    def _write(self, member: _Member, upto: int) -> None:
        """Append the member's tokens and log-probabilities sampled up to batch step `upto`: the trace's
        answer, or the executor's constant (0, 0.0), as the scheduler's update appends them."""
        count = upto - member.tokens_upto
        if count <= 0:
            return
        seq = member.group.seqs[0]
        if member.answer is None:
            seq.token_ids.extend(repeat(0, count))
            seq.output_logprobs.extend(repeat(0.0, count))
        else:
            done = len(seq.token_ids) - seq.prompt_len
            seq.token_ids.extend(member.answer[done:done + count])
            seq.output_logprobs.extend(repeat(-1.0, count))
            seq.cumulative_logprob = reduce(add, repeat(-1.0, count), seq.cumulative_logprob)  # one by one
        member.tokens_upto = upto

    def release(self) -> None:
        """Write every member up to date: the scheduler is step-by-step's again."""
        for member in self.members:
            self.sync(member, self.step)

    # -- admissions --------------------------------------------------------------------------------

    def can_prefill(self) -> bool:
        """Paper: the next step is a prefill step that admits the waiting head (so `schedule` reads
        nothing of the batch but statuses), which its own checks say it will."""
        scheduler = self.scheduler
        if self.v1 or scheduler.swapped or not scheduler.waiting:
            return False
        cfg, head = scheduler.config, scheduler.waiting[0]
        width = head.max_num_seqs()
        return (width <= cfg.max_num_seqs and head.prompt_len <= cfg.max_model_len
                and self.allocator.can_allocate(head) is AllocStatus.OK
                and len(self.members) + width <= cfg.max_num_seqs)

    def joined(self, groups: list[SequenceGroup]) -> bool:
        """After a prefill step: its requests that now decode join the batch. False when they did not
        land at the end of the running list in admission order, or one is outside the proof."""
        running = self.scheduler.running
        new = [g for g in groups if g.finish_reason is None]
        if len(running) != len(self.members) + len(new) or running[len(self.members):] != new:
            return False
        if not all(self.decoding(g) for g in new):
            return False
        for group in new:
            self.add(group)
        return True

    def can_mix(self) -> bool:
        """vLLM v1: the next step decodes every member (budget and blocks allow) and then runs the
        admission pass, nothing swapped or waiting to be recomputed in a way the batch cannot see."""
        scheduler = self.scheduler
        if not self.v1 or not scheduler.waiting or not self.members:
            return False
        num = len(self.members)
        if num >= scheduler.config.max_num_batched_tokens:
            return False
        return len(self.by_residue[(self.step + 1) % self.bs]) <= self.allocator.num_free_blocks()

    def mix(self, now: float) -> MixedStep:
        """The start of a vLLM v1 step: the batch's decodes take their blocks, then the scheduler's
        own admission pass; its shape and record (memory as it stands while the step runs)."""
        step, pool, tier = self.step + 1, self.pool, self.tier
        token_states = pool.num_token_states
        if tier is not None:               # the last step's copies are done (ChunkedScheduler.schedule)
            tier.complete_stores()
            self.allocator.loads_done()
            self.scheduler.kv_loads = {}
        if self.caching and (self.answering or tier is not None):
            self._grow(step, step)
        else:
            self._take(step, (len(self.by_residue[step % self.bs]),))
        num = len(self.members)
        pool.num_token_states = token_states + num
        groups, seqs, counts, ended, truncated = [], [], [], [], []
        self.scheduler.schedule_waiting(now, self.scheduler.config.max_num_batched_tokens - num, groups, seqs,
                                        counts, ended, truncated)
        ended += truncated
        shape = self._mixed_shape(seqs, counts)
        if tier is not None:               # the step's loads, and the stores of every sequence it schedules
            stores = self.allocator.offload_stores([m.group.seqs[0] for m in self.members] + seqs)
            shape.offload_blocks = len(self.scheduler.kv_loads) + len(stores)
            self._find_behind(self.members)
        if self.loras is not None:       # the members' adapters and the admitted requests'
            shape.lora_adapters, shape.lora_loads = self.scheduler.activate_loras(
                [m.group for m in self.members] + groups)
        memory = self.allocator.memory_breakdown()
        record = StepRecord(now, now, False, num + len(groups), num + len(seqs), shape.prefill_tokens,
                            shape.decode_seqs,
                            self.allocator.num_used_blocks(), memory.token_states, memory.reserved,
                            memory.internal_fragmentation, memory.external_fragmentation, memory.free, 0, 0)
        return MixedStep(shape, record, groups, seqs, counts, ended, len(self.scheduler.running))

    def _mixed_shape(self, seqs: list, counts: list[int]) -> StepShape:
        """A mixed step's shape (mixed_step_shape's): the members' decodes, and the prompts admitted. A
        prompt left one token by a prefix-cache hit (a recomputed request's own blocks) is a decode."""
        prefill = tokens = pairs = prefill_context = 0
        num, context, bins = len(self.members), self.context, self.bins
        for seq, new in zip(seqs, counts):
            cached = seq.num_computed_tokens
            if new == 1 and cached > 0:
                if self.histogram:
                    bins = [entry[:] for entry in bins] if bins is self.bins else bins
                    entry = _entry(bins, cached.bit_length())      # its context: cached + 1
                    entry[1] += 1
                    entry[2] += cached + 1
                num += 1
                context += cached + 1
                continue
            prefill += 1
            tokens += new
            prefill_context += cached
            pairs += new * cached + new * (new + 1) // 2
        return StepShape(prefill, tokens, pairs, num, context,
                         decode_histogram=_histogram(bins) if self.histogram else (), prefill_context=prefill_context)

    def mixed(self, step: MixedStep, end: float) -> tuple[list[SequenceGroup], bool]:
        """The end of a mixed step: members decode, admitted prompts sample (or go on prefilling), the
        requests it ends finish. Returns those and whether the batch can go on (every running
        request now decodes)."""
        step.record.end = end
        self.ends.append(end)
        self.step += 1
        self.context += len(self.members)
        self.moves.pop(self.step, None)
        if self.histogram:
            _advance(self.bins, self.moves.get(self.step + 1, ()))
        finished = step.ended + self._finish(self.step, end, step.groups, step.counts)
        ok = True
        for group in step.groups:
            if group.finish_reason is None:
                if self.decoding(group):
                    self.add(group)
                else:
                    ok = False                      # a prompt chunk still to compute
        return finished, ok


def _advance(bins: Bins, moving) -> None:
    """A histogram one step on: every context one longer, those in `moving` buckets into the next."""
    for entry in bins:
        entry[2] += entry[1]
    for k in moving:
        moved = (1 << k) + 1
        _take_out(bins, k, moved)
        entry = _entry(bins, k + 1)
        entry[1] += 1
        entry[2] += moved


class PlanTaken(NamedTuple):
    """What `plan_columns` needs of a plan whose first `len(ends)` steps an engine took at step `first`."""

    first: int
    start: float
    ends: list[float]
    takes: list[int]
    members: int
    blocks_used: int
    token_states: int

    @classmethod
    def of(cls, plan: Plan, first: int, steps: int, members: int) -> "PlanTaken":
        ends, takes = (plan.ends, plan.takes) if steps == len(plan.ends) else (plan.ends[:steps], plan.takes[:steps])
        return cls(first, plan.start, ends, takes, members, plan.blocks_used, plan.token_states)

    def records(self, block_size: int, num_gpu_blocks: int) -> list[StepRecord]:
        """Each step's record, its memory as step-by-step simulation snapshots it (the step's blocks
        taken). `plan_columns` computes the same fields for many plans at once."""
        records = []
        num, bs, total = self.members, block_size, num_gpu_blocks * block_size
        used, tokens, start = self.blocks_used, self.token_states, self.start
        for taken, end in zip(self.takes, self.ends):
            used += taken
            tokens += num
            records.append(StepRecord(start, end, False, num, num, 0, num, used, tokens, 0, used * bs - tokens, 0,
                                      total - used * bs, 0, 0))
            start = end
        return records

    def last_before(self, t: float) -> tuple[float, int] | None:
        """(end, KV blocks used) of the last of its steps that ended before `t`; None if none did."""
        k = bisect_left(self.ends, t)
        return (self.ends[k - 1], self.blocks_used + sum(self.takes[:k])) if k else None


def plan_columns(plans: list[PlanTaken], allocator: BlockManager) -> tuple:
    """The engine's step indices the plans' steps hold, and metrics.step_columns of the records
    `PlanTaken.records` makes for them, in that order: from the plans themselves in a few array operations
    (most of a busy replica's steps are a plan's: reading them back one attribute at a time was a tenth of
    a fleet's hour)."""
    import numpy as np
    lens = np.array([len(p.ends) for p in plans], dtype=np.int64)
    offsets = np.cumsum(lens) - lens
    at = np.repeat(np.array([p.first for p in plans], dtype=np.int64) - offsets, lens) + np.arange(int(lens.sum()))

    def per_step(values: list[int]):
        return np.repeat(np.array(values, dtype=np.int64), lens)

    ends = np.array(list(chain.from_iterable(p.ends for p in plans)), dtype=np.float64)
    takes = np.array(list(chain.from_iterable(p.takes for p in plans)), dtype=np.int64)
    starts = np.empty_like(ends)
    starts[1:] = ends[:-1]
    starts[offsets] = [p.start for p in plans]
    index = np.arange(len(ends)) - np.repeat(offsets, lens)            # step within its plan
    num = per_step([p.members for p in plans])
    tokens = per_step([p.token_states for p in plans]) + num * (index + 1)
    taken = np.cumsum(takes)
    used = per_step([p.blocks_used for p in plans]) + taken - np.repeat(taken[offsets] - takes[offsets], lens)
    bs = allocator.block_size
    zeros = np.zeros(len(ends), dtype=np.int64)
    return at, {"start": starts, "end": ends, "batch_size": num, "prefill_tokens": zeros, "decode_tokens": num,
                "token_states": tokens, "reserved": zeros, "internal_fragmentation": used * bs - tokens,
                "external_fragmentation": zeros, "free": allocator.num_gpu_blocks * bs - used * bs}
