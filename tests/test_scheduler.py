import random
from typing import NamedTuple

import pytest
from hypothesis import given, settings, strategies as st

from core_helpers import fake_samples
from engine.core.allocators import make_allocator
from engine.core.metrics import RequestRecord, StepRecord, compute_metrics
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import Scheduler, SchedulerConfig
from engine.core.sequence import FinishReason, SequenceGroup


class Replay(NamedTuple):
    sched: Scheduler
    alloc: object
    steps: list
    log: list
    rejected: list
    truncated: list


def replay(requests, *, block_size=2, num_gpu_blocks=4, num_cpu_blocks=8, mode="recompute",
           max_model_len=16, allocator="paged", step_time=1.0, seed=0, reservation="vllm", **cfg):
    """Drive the scheduler with a fake executor whose every step takes ``step_time``
    (a step that only swaps or copies blocks counts as a step too)."""
    alloc = make_allocator(allocator, block_size=block_size, num_gpu_blocks=num_gpu_blocks,
                           num_cpu_blocks=num_cpu_blocks, max_model_len=max_model_len, watermark=0.0,
                           slot_reservation=reservation)
    sched = Scheduler(SchedulerConfig(max_model_len=max_model_len, preemption_mode=mode, **cfg), alloc)
    pending = sorted(requests, key=lambda g: g.arrival_time)
    rng = random.Random(seed)
    now, steps, log, rejected, truncated = 0.0, [], [], [], []
    while pending or sched.has_unfinished():
        while pending and pending[0].arrival_time <= now:
            sched.add(pending.pop(0))
        out = sched.schedule(now)
        rejected.extend(out.rejected)
        truncated.extend(out.truncated)
        if out.is_empty and not out.has_memory_ops:
            now = pending[0].arrival_time if pending else now
            continue
        log.append(out)
        sched.update(out, fake_samples(out, rng), now + step_time)
        steps.append(StepRecord.from_output(out, now, now + step_time, alloc.memory_breakdown(),
                                            alloc.num_used_blocks()))
        now += step_time
    return Replay(sched, alloc, steps, log, rejected, truncated)


def req(rid, arrival, prompt_len, max_tokens, **params):
    return SequenceGroup(rid, [1] * prompt_len, SamplingParams(max_tokens=max_tokens, ignore_eos=True, **params),
                         arrival, output_len_hint=max_tokens)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_small_trace_matches_hand_computed_timeline(mode):
    a, b, c = req("A", 0.0, 3, 3), req("B", 0.0, 2, 4), req("C", 0.5, 2, 1)
    sched, alloc, steps, log, rejected, truncated = replay([a, b, c], mode=mode)

    # FCFS admission: A and B in the first prefill, C in the second.
    assert [g.request_id for g in log[0].groups] == ["A", "B"] and log[0].is_prefill
    assert [g.request_id for g in log[1].groups] == ["C"] and log[1].is_prefill
    # At t=3, A needs a third block and none is free: B, the most recently
    # arrived running request, is preempted (not A, which asked).
    assert not log[2].preempted and [g.request_id for g in log[2].groups] == ["A", "B"]
    assert [g.request_id for g in log[3].preempted] == ["B"]
    assert [g.request_id for g in log[3].groups] == ["A"]
    assert sched.preemptions[mode] == 1
    # B comes back at t=4: re-prefilled (recompute) or swapped in for a decode.
    assert log[4].is_prefill == (mode == "recompute") and log[4].groups == [b]

    assert (a.times.first_token, a.times.token_times, a.times.finish) == (1, [1, 3, 4], 4)
    assert (b.times.first_token, b.times.token_times, b.times.finish) == (1, [1, 3, 5, 6], 6)
    assert (c.times.first_token, c.times.finish) == (2, 2)
    assert alloc.num_free_blocks() == 4

    m = compute_metrics([RequestRecord.from_group(g) for g in (a, b, c)], steps, sched.preemptions)
    assert m["num_completed"] == 3 and m["num_rejected"] == 0
    assert m["request_throughput"] == pytest.approx(3 / 6)
    assert m["output_token_throughput"] == pytest.approx(8 / 6)
    assert m["ttft_mean"] == pytest.approx((1 + 1 + 1.5) / 3)
    assert m["tpot_mean"] == pytest.approx((1.5 + 5 / 3) / 2)
    assert m["e2e_mean"] == pytest.approx((4 + 6 + 1.5) / 3)
    assert m["e2e_median"] == pytest.approx(4)
    assert m["normalized_latency"] == pytest.approx((4 / 3 + 6 / 4 + 1.5) / 3)
    assert m["mean_step_batch_size"] == pytest.approx(8 / 6)   # all steps; decode-only: tests/test_metrics.py
    assert m["preemptions"][mode] == 1 and m["preemptions"]["total"] == 1


def test_requests_that_can_never_fit_are_rejected_not_lost():
    too_long = req("long", 0.0, 20, 2)          # longer than max_model_len 16
    too_big = req("big", 0.0, 12, 2)            # fits the model but not the 4-block cache
    ok = req("ok", 0.0, 2, 2)
    sched, alloc, steps, log, rejected, truncated = replay([too_long, too_big, ok], block_size=2, num_gpu_blocks=4)
    assert too_long.finish_reason is FinishReason.REJECTED and "exceeds" in too_long.reject_reason
    assert too_big.finish_reason is FinishReason.REJECTED and "KV cache" in too_big.reject_reason
    assert ok.finish_reason is FinishReason.LENGTH
    assert {g.request_id for g in rejected} == {"long", "big"}
    m = compute_metrics([RequestRecord.from_group(g) for g in (too_long, too_big, ok)], steps)
    assert m["num_completed"] + m["num_rejected"] == m["num_submitted"] == 3


def test_max_num_seqs_budget_serializes_admission_in_arrival_order():
    groups = [req(str(i), i * 0.1, 2, 2) for i in range(4)]
    sched, alloc, steps, log, rejected, truncated = replay(groups, num_gpu_blocks=16, max_num_seqs=1)
    prefills = [out.groups[0].request_id for out in log if out.is_prefill]
    assert prefills == ["0", "1", "2", "3"]
    assert max(len(out.groups) for out in log) == 1


def test_parallel_sampling_shares_prompt_blocks():
    g = req("p", 0.0, 8, 3, n=3)
    alloc = make_allocator("paged", block_size=4, num_gpu_blocks=16, max_model_len=64)
    sched = Scheduler(SchedulerConfig(max_model_len=64), alloc)
    sched.add(g)
    out = sched.schedule(0.0)
    sched.update(out, fake_samples(out, random.Random(0)), 1.0)
    assert len(g.seqs) == 3
    tables = [alloc.block_table(s) for s in g.seqs]
    assert tables[0] == tables[1] == tables[2]      # the prompt's 2 blocks are shared
    assert alloc.num_used_blocks() == 2
    out = sched.schedule(1.0)                       # each sample needs its own third block
    assert alloc.num_used_blocks() == 5 and not out.blocks_to_copy


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), mode=st.sampled_from(["recompute", "swap"]),
       allocator=st.sampled_from(["paged", "orca-max", "orca-pow2", "orca-oracle"]),
       num_gpu_blocks=st.integers(4, 24))
def test_preemption_storms_finish_every_request_exactly_once(seed, mode, allocator, num_gpu_blocks):
    rng = random.Random(seed)
    groups = []
    for i in range(rng.randint(1, 14)):
        kind = rng.random()
        params = {"n": 2} if kind < 0.2 else {"use_beam_search": True, "best_of": 2} if kind < 0.35 else {}
        groups.append(req(str(i), rng.random() * 3, rng.randint(1, 12), rng.randint(1, 10), **params))
    sched, alloc, steps, log, rejected, truncated = replay(groups, block_size=2, num_gpu_blocks=num_gpu_blocks,
                                      num_cpu_blocks=rng.choice([0, 4, 32]), mode=mode,
                                      allocator=allocator, seed=seed, max_model_len=24)
    done = [g for g in groups if g.finish_reason not in (None, FinishReason.REJECTED)]
    # Rejected requests are reported once each, never lost.
    assert len({g.request_id for g in rejected}) == len(rejected)
    assert {g.request_id for g in rejected} == {g.request_id for g in groups
                                                if g.finish_reason is FinishReason.REJECTED}
    assert len(done) + len(rejected) == len(groups)
    truncated = {g.request_id for g in truncated}
    for g in done:
        assert g.times.finish is not None and g.times.first_token <= g.times.finish
        if g.request_id in truncated:
            # Outgrew the whole cache: ended early, with what it had generated.
            assert g.finish_reason is FinishReason.LENGTH
            assert sum(len(t) for t, *_ in g.outputs()) < g.params.max_tokens * g.params.best_of
        elif not g.params.use_beam_search:
            assert all(s.num_output_tokens == g.params.max_tokens for s in g.seqs)
        else:
            assert g.beams and all(len(h.token_ids) - g.prompt_len == g.params.max_tokens for h in g.beams)
    assert alloc.num_free_blocks() == num_gpu_blocks
    assert alloc.memory_breakdown().token_states == 0
    assert not sched.has_unfinished()


def test_request_wider_than_max_num_seqs_is_rejected():
    wide = req("wide", 0.0, 4, 3, n=4)
    ok = req("ok", 0.0, 4, 3)
    sched, alloc, steps, log, rejected, truncated = replay([wide, ok], num_gpu_blocks=16, max_num_seqs=2)
    assert [g.request_id for g in rejected] == ["wide"] and "parallel sequences" in wide.reject_reason
    assert ok.finish_reason is FinishReason.LENGTH
