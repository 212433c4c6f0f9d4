"""The one core step helper (engine/core/step.py) that the engine, the simulator and
the profiler share, and the simulator's pricing of a step that only swaps."""
from __future__ import annotations

import random

from core_helpers import fake_samples
from engine.core.allocators import make_allocator
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from engine.core.sequence import SequenceGroup
from engine.core.step import begin_step, end_step
from planner.catalog import resolve_gpu, resolve_model
from planner.cost import StepShape
from planner.sim import simulate
from sim_helpers import sim_plan
from workloads import Trace, TraceRequest


def test_step_builds_inputs_snapshots_memory_and_records():
    alloc = make_allocator("paged", block_size=4, num_gpu_blocks=16, max_model_len=64)
    sched = Scheduler(SchedulerConfig(max_model_len=64), alloc)
    sched.add(SequenceGroup("a", list(range(6)), SamplingParams(max_tokens=2, ignore_eos=True), 0.0))
    step = begin_step(sched, 0.0, lambda tokens, cached, table: (tokens, cached, list(table)))
    seq = step.out.seqs[0]
    assert step.inputs == [(list(range(6)), 0, alloc.block_table(seq))]
    assert step.blocks_used == 2 and step.breakdown.token_states == 6 and step.has_work
    finished, record = end_step(sched, step, fake_samples(step.out, random.Random(0)), 1.0)
    assert finished == [] and (record.start, record.end, record.prefill_tokens, record.kv_blocks_used) == (0.0, 1.0, 6, 2)
    step = begin_step(sched, 1.0, lambda tokens, cached, table: (tokens, cached))
    assert step.inputs == [([seq.token_ids[-1]], 6)] and not step.out.is_prefill
    finished, record = end_step(sched, step, fake_samples(step.out, random.Random(0)), 2.0)
    assert [g.request_id for g in finished] == ["a"] and record.decode_tokens == 1
    assert alloc.num_used_blocks() == 0


class SwapPricedCost:
    """A step computing tokens takes 1 s; each block swapped adds 0.25 s."""

    name = "swap-priced"

    def step_time(self, shape: StepShape) -> float:
        return (1.0 if shape.total_tokens else 0.0) + 0.25 * shape.swap_blocks


def test_simulator_charges_time_for_a_step_that_only_swaps(monkeypatch):
    original = Scheduler.schedule
    calls = []

    def schedule(self, now):
        calls.append(now)
        if len(calls) == 1:   # a step that moves 2 blocks and computes nothing
            return SchedulerOutput(False, [], [], 0, blocks_to_swap_out={0: 0, 1: 1})
        return original(self, now)

    monkeypatch.setattr(Scheduler, "schedule", schedule)
    trace = Trace([TraceRequest(request_id="a", arrival_time=0.0, prompt_len=3, output_len=2)], name="one")
    config = sim_plan(resolve_model("opt-125m"), resolve_gpu("a100-40g"), block_size=2, num_gpu_blocks=8,
                       num_cpu_blocks=8, max_model_len=16)
    result = simulate(trace, config, SwapPricedCost())
    first = result.steps[0]
    assert (first.num_seqs, first.swapped_blocks, first.duration) == (0, 2, 0.5)
    # The request's prefill waits for the swap: its first token comes at 0.5 + 1.
    assert result.requests[0].first_token == 1.5 and result.requests[0].finish == 2.5
