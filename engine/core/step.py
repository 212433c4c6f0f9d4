"""One engine step's bookkeeping, shared by the live engine, the simulator and the profiler.

A step is: schedule at ``now``; snapshot memory as it stands while the step
runs (its new tokens included); build each sequence's input (its uncomputed
tokens, how many it already has cached, its block table); then, once the
executor has sampled, apply the tokens and record the step. Under chunked
prefill a sequence's input is only its scheduled chunk
(``out.num_scheduled_tokens``), and only ``out.sampling_part()`` samples. ``LLMEngine.step``,
the simulator's engine process and the profiler's host timing all go through
``begin_step`` and ``end_step``, so the profiler times exactly what the engine
runs and the simulator records exactly what the engine records.

Between the two calls the executor must apply the step's swaps and copies
(``out.has_memory_ops``) even when no sequence runs (``out.is_empty``).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.core.kv_allocator import MemoryBreakdown
from engine.core.metrics import StepRecord
from engine.core.scheduler import Samples, Scheduler, SchedulerOutput
from engine.core.sequence import SequenceGroup

MakeInput = Callable[[list[int], int, list[int]], Any]
"""Builds one sequence's model input from (new token ids, tokens already cached,
block table); the live engine passes ``engine.model_runner.SequenceInput``."""


@dataclass(slots=True)
class Step:
    out: SchedulerOutput
    start: float
    breakdown: MemoryBreakdown     # KV memory while the step runs
    blocks_used: int
    inputs: list | None            # one per ``out.seqs``, when begin_step was given make_input

    @property
    def has_work(self) -> bool:
        """Anything for the executor to do: sequences to compute, or blocks to move."""
        return bool(self.out.seqs) or self.out.has_memory_ops


def begin_step(scheduler: Scheduler, now: float, make_input: MakeInput | None = None) -> Step:
    """Schedule one step at ``now`` and gather what the executor needs."""
    out = scheduler.schedule(now)
    allocator = scheduler.allocator
    inputs = None
    if make_input is not None and out.seqs and out.spec_token_ids:
        inputs = _inputs_with_drafts(out, allocator.block_table, make_input)
    elif make_input is not None and out.seqs:
        table = allocator.block_table
        if out.num_scheduled_tokens is None:     # the paper's policy: every uncomputed token
            inputs = [make_input(s.token_ids[s.num_computed_tokens:], s.num_computed_tokens, table(s))
                      for s in out.seqs]
        else:                                    # chunked prefill: this step's chunk of each
            inputs = [make_input(s.token_ids[s.num_computed_tokens:s.num_computed_tokens + n],
                                 s.num_computed_tokens, table(s))
                      for s, n in zip(out.seqs, out.num_scheduled_tokens)]
    return Step(out, now, allocator.memory_breakdown(), allocator.num_used_blocks(), inputs)


def _inputs_with_drafts(out: SchedulerOutput, table, make_input: MakeInput) -> list:
    """Model inputs of a step that verifies drafts: a sequence's scheduled tokens are its own
    uncomputed ones followed by its draft tokens (in the KV slots the scheduler reserved)."""
    spec = out.spec_token_ids
    inputs = []
    for s, n in zip(out.seqs, out.scheduled_tokens()):
        drafts = spec.get(s.seq_id, [])
        own = s.token_ids[s.num_computed_tokens:s.num_computed_tokens + n - len(drafts)]
        inputs.append(make_input(own + drafts, s.num_computed_tokens, table(s)))
    return inputs


def end_step(scheduler: Scheduler, step: Step, samples: Samples,
             end: float) -> tuple[list[SequenceGroup], StepRecord]:
    """Apply the step's sampled tokens at ``end``; returns the groups that finished
    in it (the scheduler's own rejections and truncations first) and its record."""
    out = step.out
    finished = out.finished_now
    if out.groups:
        finished += scheduler.update(out, samples, end)
    return finished, StepRecord.from_output(out, step.start, end, step.breakdown, step.blocks_used)
