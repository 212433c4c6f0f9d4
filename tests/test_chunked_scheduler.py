"""The chunked-prefill policy (vLLM v1's scheduler), step by step.

Expected step sequences are derived by hand from vLLM 0.19.0's
``vllm/v1/core/sched/scheduler.py`` and ``kv_cache_manager.py`` (the rules in
engine/core/chunked_scheduler.py's docstring). A step is written as
{request id: tokens scheduled}.
"""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from engine.core.block_manager import BlockManager
from engine.core.chunked_scheduler import ChunkedScheduler, VllmBlockManager, make_scheduler, split_tokens
from engine.core.metrics import StepRecord
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import Scheduler, SchedulerConfig
from engine.core.sequence import FinishReason, SequenceGroup


def request(rid, prompt_len, max_tokens, arrival=0.0, tokens=None, priority=0, lora=0):
    prompt = tokens if tokens is not None else [(hash((rid, i)) % 90) + 10 for i in range(prompt_len)]
    return SequenceGroup(str(rid), prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True), arrival,
                         priority=priority, lora_id=lora)


def make(num_blocks, *, block_size=4, budget=8, max_num_seqs=8, caching=False, max_model_len=256, threshold=0,
         chunked=True, policy="fcfs", max_loras=None, **kw):
    bm = VllmBlockManager(block_size, num_blocks, enable_prefix_caching=caching)
    cfg = SchedulerConfig(max_model_len=max_model_len, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                          vllm_v1=True, enable_chunked_prefill=chunked, long_prefill_token_threshold=threshold,
                          scheduling_policy=policy, max_loras=max_loras)
    return ChunkedScheduler(cfg, bm, **kw), bm


def run(sched, requests, max_steps=200):
    """Drive the scheduler (each step takes 1 s, token 7 sampled); the steps as dicts."""
    pending = sorted(requests, key=lambda g: g.arrival_time)
    steps, now = [], 0.0
    while (pending or sched.has_unfinished()) and len(steps) < max_steps:
        while pending and pending[0].arrival_time <= now:
            sched.add(pending.pop(0))
        out = sched.schedule(now)
        if out.is_empty:
            if out.preempted:
                steps.append({"preempted": [g.request_id for g in out.preempted]})
            elif not out.finished_now:
                now = pending[0].arrival_time
            continue
        steps.append({g.request_id: n for g, n in zip(out.groups, out.num_scheduled_tokens)}
                     | ({"preempted": [g.request_id for g in out.preempted]} if out.preempted else {}))
        sampling = out.sampling_part()
        now += 1.0
        sched.update(out, {s.seq_id: [(7, 0.0)] for s in sampling.seqs}, now)
    return steps


def test_prompt_is_computed_in_budget_sized_chunks_and_samples_once_done():
    sched, _ = make(64, budget=8)
    a = request("a", 20, 3)
    steps = run(sched, [a])
    assert steps == [{"a": 8}, {"a": 8}, {"a": 4}, {"a": 1}, {"a": 1}]
    # The two partial chunks sampled nothing: the first token came with the third step.
    assert a.times.first_token == 3.0
    assert a.times.token_times == [3.0, 4.0, 5.0]
    assert a.seqs[0].output_token_ids == [7, 7, 7]


def test_long_prefill_token_threshold_caps_each_requests_tokens_in_a_step():
    # vLLM's --long-prefill-token-threshold 6 under a 16-token budget: each prompt goes 6 tokens at a time, in
    # the running pass and the waiting pass alike, and the budget left goes to the next request
    sched, _ = make(64, budget=16, threshold=6)
    a, b = request("a", 20, 2), request("b", 10, 2)
    assert run(sched, [a, b]) == [
        {"a": 6, "b": 6},       # both admitted with a capped first chunk (4 tokens of budget left over)
        {"a": 6, "b": 4},       # b's prompt ends: its first token
        {"a": 6, "b": 1},       # b's second token ends it
        {"a": 2},               # a's prompt ends (6 + 6 + 6 + 2)
        {"a": 1},
    ]
    uncapped, _ = make(64, budget=16)
    assert run(uncapped, [request("a", 20, 2), request("b", 10, 2)])[0] == {"a": 16}


def test_decodes_go_first_and_waiting_prompts_fill_the_rest_in_chunks():
    sched, _ = make(64, budget=8)
    a, b, c = request("a", 6, 4), request("b", 10, 2, arrival=1.0), request("c", 5, 2, arrival=1.0)
    steps = run(sched, [a, b, c])
    assert steps == [
        {"a": 6},                       # t=0: a's whole prompt
        {"a": 1, "b": 7},               # t=1: a decodes, b takes the rest of the budget
        {"a": 1, "b": 3, "c": 4},       # running first (a, then b's last chunk), then c's first chunk
        {"a": 1, "b": 1, "c": 1},       # a's 4th token, b's 2nd; c's prompt had 1 token left
        {"c": 1},
    ]


def test_without_chunked_prefill_a_prompt_larger_than_the_budget_left_waits_whole():
    # vLLM's --no-enable-chunked-prefill under a 16-token budget: b's 14 tokens fit the 15 that a's decode
    # leaves, c's 3 do not fit the 1 left after b, so admission ends there (chunked prefill would give c 1)
    a, b, c = request("a", 6, 4), request("b", 14, 2, arrival=1.0), request("c", 3, 2, arrival=1.0)
    sched, _ = make(64, budget=16, max_model_len=16, chunked=False)
    assert run(sched, [a, b, c]) == [{"a": 6}, {"a": 1, "b": 14}, {"a": 1, "b": 1, "c": 3}, {"a": 1, "c": 1}]
    a, b, c = request("a", 6, 4), request("b", 14, 2, arrival=1.0), request("c", 3, 2, arrival=1.0)
    chunked, _ = make(64, budget=16, max_model_len=16)
    assert run(chunked, [a, b, c])[1] == {"a": 1, "b": 14, "c": 1}


def test_without_chunked_prefill_the_budget_holds_max_model_len():
    # vllm/config/scheduler.py: the budget defaults to max(max_model_len, 2048) and may not be below it
    assert SchedulerConfig(max_model_len=64, vllm_v1=True, enable_chunked_prefill=False).max_num_batched_tokens \
        == 2048
    assert SchedulerConfig(max_model_len=4096, vllm_v1=True,
                           enable_chunked_prefill=False).max_num_batched_tokens == 4096
    with pytest.raises(ValueError, match="without chunked prefill a prompt that long could never run"):
        SchedulerConfig(max_model_len=4096, vllm_v1=True, enable_chunked_prefill=False, max_num_batched_tokens=2048)


def test_priority_policy_admits_the_lowest_priority_value_first_then_the_earliest():
    # vLLM's --scheduling-policy priority, one request at a time: priority 0 first, then 1 by arrival
    reqs = [request("a", 4, 1, priority=1), request("b", 4, 1, arrival=0.0, priority=0),
            request("c", 4, 1, priority=2), request("d", 4, 1, arrival=0.0, priority=1)]
    sched, _ = make(64, budget=16, max_num_seqs=1, policy="priority")
    assert [list(step) for step in run(sched, reqs)] == [["b"], ["a"], ["d"], ["c"]]
    fcfs, _ = make(64, budget=16, max_num_seqs=1)
    reqs = [request(r.request_id, 4, 1, priority=r.priority) for r in reqs]
    assert [list(step) for step in run(fcfs, reqs)] == [["a"], ["b"], ["c"], ["d"]]
    with pytest.raises(ValueError, match="priority scheduling is vLLM v1's"):
        SchedulerConfig(max_model_len=64, scheduling_policy="priority")


def test_max_num_seqs_caps_the_running_requests():
    sched, _ = make(64, budget=32, max_num_seqs=2)
    steps = run(sched, [request("a", 4, 2), request("b", 4, 2), request("c", 4, 2)])
    assert steps == [{"a": 4, "b": 4}, {"a": 1, "b": 1}, {"c": 4}, {"c": 1}]


def test_block_zero_is_a_null_block():
    sched, bm = make(5, block_size=4)          # 5 blocks hold 4 usable ones
    assert bm.num_free_blocks() == 4
    ok, too_big = request("ok", 16, 1), request("big", 17, 1)
    run(sched, [ok, too_big])
    assert ok.finish_reason is FinishReason.LENGTH
    assert too_big.finish_reason is FinishReason.REJECTED
    assert "4 usable blocks" in too_big.reject_reason
    assert all(0 not in table for table in bm.tables.values())


@pytest.mark.parametrize("reserve_full_isl, expected", [
    # b's whole 16-token prompt (4 blocks) does not fit next to a's 3: b waits for a.
    (True, [{"a": 8}, {"a": 1}, {"a": 1}, {"b": 8}, {"b": 8}, {"b": 1}]),
    # Without the reservation only b's first chunk (2 blocks) is checked: admitted
    # at once; its next chunk needs 2 more blocks, 1 is free, so b, the last of
    # the running list, preempts itself.
    (False, [{"a": 8}, {"a": 1, "b": 7}, {"a": 1, "preempted": ["b"]}, {"b": 8}, {"b": 8}, {"b": 1}]),
])
def test_reserve_full_isl_admits_a_prompt_only_if_all_of_it_fits(reserve_full_isl, expected):
    sched, _ = make(7, block_size=4, budget=8, reserve_full_isl=reserve_full_isl)   # 6 usable blocks
    steps = run(sched, [request("a", 8, 3), request("b", 16, 2, arrival=1.0)])
    assert steps == expected


def test_preemption_takes_the_last_running_request_and_admits_nothing_that_step():
    sched, bm = make(7, block_size=4, budget=16, reserve_full_isl=False)  # 6 usable blocks
    a, b, c = request("a", 8, 6), request("b", 8, 6), request("c", 2, 1, arrival=2.0)
    steps = run(sched, [a, b, c])
    assert steps == [
        {"a": 8, "b": 8},               # 2 blocks each
        {"a": 1, "b": 1},               # a third block each: the cache is full, c cannot come in
        {"a": 1, "b": 1}, {"a": 1, "b": 1}, {"a": 1, "b": 1},
        {"a": 1, "preempted": ["b"]},   # a needs a 4th block: b, last in the list, goes; c waits
        {"b": 13, "c": 2},              # b back first, recomputing prompt + 5 outputs (its 6th
    ]                                   # and last token comes out of it); then c
    assert b.num_preemptions == 1 and sched.preemptions["recompute"] == 1
    assert b.seqs[0].num_output_tokens == 6
    assert bm.num_free_blocks() == 6


@pytest.mark.parametrize("caching", [False, True])
def test_a_preempted_request_recomputes_with_hits_on_its_own_blocks(caching):
    sched, bm = make(7, block_size=4, budget=16, caching=caching, reserve_full_isl=False)
    a, b = request("a", 8, 6), request("b", 8, 6)
    seen = []
    schedule = sched.schedule

    def spy(now):
        out = schedule(now)
        seen.extend((g.request_id, g.seqs[0].num_computed_tokens, n)
                    for g, n in zip(out.groups, out.num_scheduled_tokens))
        return out
    sched.schedule = spy
    run(sched, [a, b])
    assert b.num_preemptions == 1
    # b's readmission: without caching it recomputes all 13 tokens; with caching
    # its first blocks still hold its prompt (they were freed, not overwritten).
    _, computed, n = [e for e in seen if e[0] == "b" and e[2] > 1][-1]
    assert (computed, n) == ((8, 5) if caching else (0, 13))


def test_mixed_step_splits_into_prefill_and_decode_tokens():
    sched, bm = make(64, budget=8)
    sched.add(request("a", 3, 3))
    out = sched.schedule(0.0)
    sched.update(out, {out.seqs[0].seq_id: [(7, 0.0)]}, 1.0)
    sched.add(request("b", 20, 1))
    out = sched.schedule(1.0)
    assert split_tokens(out) == (7, 1)
    assert not out.is_prefill
    assert [g.request_id for g in out.sampling_part().groups] == ["a"]
    # The step's record counts both parts itself, even once update has moved the counts.
    sched.update(out, {out.seqs[0].seq_id: [(7, 0.0)]}, 2.0)
    record = StepRecord.from_output(out, 1.0, 2.0, bm.memory_breakdown(), bm.num_used_blocks())
    assert (record.prefill_tokens, record.decode_tokens) == (7, 1)


def test_paper_policy_stays_the_default():
    bm = BlockManager(4, 16)
    assert type(make_scheduler(SchedulerConfig(max_model_len=64), bm)) is Scheduler
    assert SchedulerConfig(max_model_len=64, enable_chunked_prefill=True).max_num_batched_tokens == 2048


@pytest.mark.parametrize("kwargs, message", [
    ({"preemption_mode": "swap"}, "recompute only"),
    ({"max_num_batched_tokens": 4, "max_num_seqs": 8}, "at least max_num_seqs"),
    ({"long_prefill_token_threshold": -1}, "0 \\(off\\) or more tokens"),
])
def test_bad_chunked_configs_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SchedulerConfig(max_model_len=64, enable_chunked_prefill=True, **kwargs)


def test_the_paper_policy_refuses_a_chunk_cap():
    with pytest.raises(ValueError, match="the paper's policy prefills each prompt whole"):
        SchedulerConfig(max_model_len=64, long_prefill_token_threshold=8)


def test_parallel_sampling_is_rejected_on_its_own():
    sched, _ = make(64)
    wide = SequenceGroup("wide", [5] * 4, SamplingParams(n=2, max_tokens=2, ignore_eos=True), 0.0)
    plain = request("plain", 4, 2)
    run(sched, [wide, plain])
    assert wide.finish_reason is FinishReason.REJECTED and "separate requests" in wide.reject_reason
    assert plain.finish_reason is FinishReason.LENGTH


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.integers(1, 12), st.integers(0, 6)), min_size=1, max_size=10),
       st.integers(6, 40), st.integers(4, 24), st.integers(1, 6), st.booleans(), st.booleans(),
       st.sampled_from([0, 1, 3, 7]), st.booleans(), st.sampled_from(["fcfs", "priority"]),
       st.sampled_from([None, 1, 2]))
def test_invariants_hold_on_random_traces(reqs, num_blocks, budget, max_num_seqs, caching, full_isl, threshold,
                                          chunked, policy, max_loras):
    budget = max(budget, max_num_seqs) if chunked else 52     # unchunked: the budget holds max_model_len
    sched, bm = make(num_blocks, block_size=4, budget=budget, max_num_seqs=max_num_seqs, caching=caching,
                     reserve_full_isl=full_isl, threshold=threshold, chunked=chunked,
                     max_model_len=256 if chunked else 52, policy=policy, max_loras=max_loras)
    rng = random.Random(0)
    groups = [request(i, p, o, arrival=float(t),
                      tokens=[rng.randrange(3) for _ in range(p)] if caching else None, priority=rng.randrange(3),
                      lora=rng.randrange(4) if max_loras else 0)
              for i, (p, o, t) in enumerate(reqs)]
    pending = sorted(groups, key=lambda g: g.arrival_time)
    now, steps, truncated = 0.0, 0, set()
    while pending or sched.has_unfinished():
        steps += 1
        assert steps < 2000, "the scheduler stalled"
        while pending and pending[0].arrival_time <= now:
            sched.add(pending.pop(0))
        out = sched.schedule(now)
        truncated.update(g.request_id for g in out.truncated)
        if out.is_empty:
            if not out.finished_now and not out.preempted:
                assert pending, "nothing runs and nothing will arrive"
                now = pending[0].arrival_time
            continue
        counts = out.num_scheduled_tokens
        assert sum(counts) <= budget and all(n > 0 for n in counts)
        assert not threshold or max(counts) <= threshold     # vLLM's long_prefill_token_threshold
        if not chunked and not threshold:                   # every request's tokens whole
            assert all(n == seq.num_tokens - seq.num_computed_tokens for seq, n in zip(out.seqs, counts))
        assert len(sched.running) <= max_num_seqs
        if max_loras:          # vLLM's --max-loras: never more distinct adapters in one step
            assert len({g.lora_id for g in out.groups} - {0}) <= max_loras
        for seq, n in zip(out.seqs, counts):
            assert len(bm.tables[seq.seq_id]) * 4 >= seq.num_computed_tokens + n
        if out.preempted:      # a step that preempts admits nobody: everything in it was running
            assert all(g.times.first_scheduled < now for g in out.groups)
        in_use = {b for t in bm.tables.values() for b in t}
        assert 0 not in in_use
        assert len(in_use) + bm.num_free_blocks() + 1 == num_blocks
        now += 1.0
        sched.update(out, {s.seq_id: [(7, 0.0)] for s in out.sampling_part().seqs}, now)
    for g in groups:
        assert g.finish_reason is not None
        if g.request_id in truncated:   # outgrew the whole cache: ended where it was
            assert (g.prompt_len + g.params.max_tokens + 3) // 4 > num_blocks - 1
        elif g.finish_reason is not FinishReason.REJECTED:
            assert g.seqs[0].num_output_tokens == g.params.max_tokens
            assert len(g.times.token_times) == g.params.max_tokens
    assert bm.num_free_blocks() == num_blocks - 1
