"""The CPU KV tier (vLLM's native offloading, engine/core/kv_offload.py) and the scheduler's use of it."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from engine.core.chunked_scheduler import ChunkedScheduler, VllmBlockManager
from engine.core.kv_offload import CpuKvTier, offload_blocks
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import SchedulerConfig
from engine.core.sequence import FinishReason, SequenceGroup


def test_the_least_recently_used_ready_block_is_evicted_first():
    tier = CpuKvTier(3)
    tier.store([1, 2, 3])
    tier.complete_stores()
    tier.touch([1])
    placed = tier.store([4])
    assert [key for key, _ in placed] == [4]
    assert 2 not in tier.slots
    assert set(tier.slots) == {1, 3, 4}


def test_a_touch_makes_a_prefix_head_the_most_recent():
    # vLLM's LRU touches a request's keys in reverse: its first block ends most recent, its tail goes first
    tier = CpuKvTier(3)
    tier.store([1, 2, 3])
    tier.complete_stores()
    tier.touch([1, 2, 3])
    assert list(tier.slots) == [3, 2, 1]


def test_a_block_stored_this_step_is_neither_hit_nor_evicted_until_the_next():
    tier = CpuKvTier(2)
    tier.store([1, 2])
    assert tier.lookup([1, 2]) == 0
    assert tier.store([3]) is None
    tier.complete_stores()
    assert tier.lookup([1, 2, 3]) == 2


def test_a_block_being_loaded_is_not_evicted():
    tier = CpuKvTier(2)
    tier.store([1, 2])
    tier.complete_stores()
    tier.hold([1, 2])
    assert tier.store([3]) is None
    assert tier.stats.stores_refused == 1
    tier.release([1])
    assert [key for key, _ in tier.store([3])] == [3]
    assert list(tier.slots) == [2, 3]       # the released block went, the held one stayed


def test_keys_already_in_the_tier_are_not_stored_again():
    tier = CpuKvTier(4)
    first = tier.store([1, 2])
    again = tier.store([2, 3])
    assert [key for key, _ in again] == [3]
    assert {slot for _, slot in first + again} == {0, 1, 2}


def test_the_tier_holds_vllms_count_of_blocks():
    # 64 GiB over 2 GPUs whose blocks take 1 MiB each: 32,768 blocks (vLLM's CPUOffloadingSpec)
    assert offload_blocks(64, 2**20, 2) == 32768


def request(rid, tokens, max_tokens=2):
    return SequenceGroup(str(rid), tokens, SamplingParams(max_tokens=max_tokens, ignore_eos=True), 0.0)


def make(num_blocks, offload, *, budget=16, max_num_seqs=4, block_size=4):
    bm = VllmBlockManager(block_size, num_blocks, enable_prefix_caching=True, offload_blocks=offload)
    cfg = SchedulerConfig(max_model_len=64, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                          vllm_v1=True)
    return ChunkedScheduler(cfg, bm), bm


def drive(sched, steps=20):
    """Steps until nothing is left; each step's {request: tokens}, loads and stores."""
    seen = []
    for now in range(steps):
        if not sched.has_unfinished():
            break
        out = sched.schedule(float(now))
        seen.append(({g.request_id: n for g, n in zip(out.groups, out.num_scheduled_tokens)},
                     dict(out.kv_loads), dict(out.kv_stores)))
        sched.update(out, {s.seq_id: [(7, 0.0)] for s in out.sampling_part().seqs}, now + 1.0)
    return seen


SHARED = list(range(10, 22))         # 3 full blocks of 4


def evicted(num_blocks, offload, others=2):
    """A scheduler whose GPU cache has lost SHARED's blocks to `others` prompts run after it, its tier not."""
    sched, bm = make(num_blocks, offload)
    for rid, prompt in [("a", SHARED)] + [(f"o{k}", list(range(30 + 20 * k, 42 + 20 * k))) for k in range(others)]:
        sched.add(request(rid, prompt))
        drive(sched)
    return sched, bm


def test_a_prefix_lost_on_the_gpu_is_loaded_then_the_rest_computed():
    sched, bm = evicted(9, 16)       # 8 usable blocks of 4
    sched.add(request("again", SHARED + [99]))
    steps = drive(sched)
    # parked a step while its 3 blocks load (nothing computed), then its 13th token alone
    assert steps[0] == ({}, steps[0][1], {})
    assert len(steps[0][1]) == 3
    assert steps[1][0] == {"again": 1}
    assert bm.offload.stats.hit_tokens == 12


def test_a_whole_prompt_found_in_the_tier_recomputes_its_last_token():
    sched, bm = evicted(9, 16)
    sched.add(request("again", SHARED))
    steps = drive(sched)
    assert len(steps[0][1]) == 3                 # all 3 blocks loaded (vLLM looks up the last one too)
    assert steps[1][0] == {"again": 1}           # and the last token computed again, to sample from


def test_a_request_waits_while_another_loads_the_same_blocks():
    sched, bm = evicted(13, 32, others=3)
    sched.add(request("x", SHARED + [1]))
    sched.add(request("y", SHARED + [2]))
    steps = drive(sched)
    assert len(steps[0][1]) == 3                 # x loads; y waits, then hits x's blocks on the GPU
    assert sum(len(loads) for _, loads, _ in steps) == 3
    assert steps[1][0] == {"x": 1, "y": 1}


def test_an_abort_while_parked_lets_go_of_its_blocks_and_keys():
    sched, bm = evicted(9, 16)
    group = request("again", SHARED + [99])
    sched.add(group)
    out = sched.schedule(100.0)
    assert out.kv_loads and bm.offload.held
    sched.waiting.remove(group)
    bm.free(group.seqs[0])
    assert not bm.offload.held
    assert bm.num_free_blocks() == 8


def test_loaded_requests_behind_a_head_that_cannot_fit_give_their_blocks_back():
    # (found by the property test below) a preempted request parks with a load and holds blocks; the request
    # that then runs is preempted in turn and waits ahead of it, unable to fit while it holds them: with nothing
    # running, the parked one gives its blocks back, and both finish
    sched, bm = make(8, 3, budget=12, max_num_seqs=2)
    rng = random.Random(0)
    prefixes = [[rng.randrange(3) for _ in range(8)] for _ in range(2)]
    first, second = prefixes[0] + [rng.randrange(3)], prefixes[0] + [rng.randrange(3)]
    third = prefixes[1] + [rng.randrange(3) for _ in range(6)]
    groups = [request("0", first, 5), request("2", third, 4)]
    late = request("1", second, 5)
    for g in groups:
        sched.add(g)
    for now in range(40):
        if now == 1:
            sched.add(late)
        if not sched.has_unfinished():
            break
        out = sched.schedule(float(now))
        sched.update(out, {s.seq_id: [(7, 0.0)] for s in out.sampling_part().seqs}, now + 1.0)
    assert all(g.finish_reason is FinishReason.LENGTH for g in (*groups, late))
    assert bm.offload.stats.blocks_loaded > 0
    assert sched.preemptions["recompute"] >= 2


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 14), st.integers(1, 8), st.integers(0, 5)),
                min_size=1, max_size=12),
       st.integers(8, 30), st.integers(1, 24), st.integers(4, 24), st.integers(1, 4))
def test_invariants_hold_with_a_cpu_tier(reqs, num_blocks, offload, budget, max_num_seqs):
    """Random prompts over 4 shared prefixes, arriving over time: every request ends; the tier never holds
    more blocks than it has, each in a slot of its own; no step loads into a block a request already computed
    from or stores a block no scheduled request holds; every block is free at the end."""
    budget = max(budget, max_num_seqs)
    sched, bm = make(num_blocks, offload, budget=budget, max_num_seqs=max_num_seqs)
    rng = random.Random(0)
    prefixes = [[rng.randrange(3) for _ in range(8)] for _ in range(4)]
    groups = [SequenceGroup(str(i), prefixes[p] + [rng.randrange(3) for _ in range(n)],
                            SamplingParams(max_tokens=o, ignore_eos=True), float(t))
              for i, (p, n, o, t) in enumerate(reqs)]
    pending = sorted(groups, key=lambda g: g.arrival_time)
    now, steps = 0.0, 0
    tier = bm.offload
    while pending or sched.has_unfinished():
        steps += 1
        assert steps < 2000, "the scheduler stalled"
        while pending and pending[0].arrival_time <= now:
            sched.add(pending.pop(0))
        out = sched.schedule(now)
        if out.is_empty and not out.has_memory_ops:
            if not out.finished_now and not out.preempted:
                assert pending, "nothing runs and nothing will arrive"
                now = pending[0].arrival_time
            continue
        assert len(tier.slots) <= tier.num_blocks
        assert len(set(tier.slots.values())) == len(tier.slots)
        assert set(tier.held) <= set(tier.slots)
        assert set(out.kv_loads) <= set(tier.slots.values())
        scheduled = {b for s in out.seqs for b in bm.tables[s.seq_id]}
        assert set(out.kv_stores) <= scheduled
        assert not set(out.kv_loads.values()) & scheduled      # a load's blocks wait a step before they are read
        now += 1.0
        sched.update(out, {s.seq_id: [(7, 0.0)] for s in out.sampling_part().seqs}, now)
    for g in groups:
        assert g.finish_reason is FinishReason.LENGTH or g.finish_reason is FinishReason.REJECTED
    assert bm.num_free_blocks() == num_blocks - 1
    assert not tier.held


@pytest.mark.parametrize("flags, message", [
    (["--policy", "paper"], "is vLLM v1's"),
    (["--no-enable-prefix-caching"], "needs prefix caching on"),
    (["--kv-offloading-backend", "lmcache"], "'lmcache' is not modelled"),
    (["--model", "gpt-oss-20b"], "on gpt-oss-20b is not modelled"),
    (["--pd", "1:1"], "with --pd is not modelled"),
])
def test_what_the_tier_is_not_modelled_with_is_refused_in_one_line(flags, message):
    from typer.testing import CliRunner
    from planner.cli import app

    args = ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100", "--requests", "20", "--kv-offloading-size", "8"]
    result = CliRunner().invoke(app, args + flags)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines


@pytest.mark.parametrize("args, message", [(["-1"], "must be a positive number of GiB"),
                                           (["0.000001"], "holds no KV block of llama-3.1-8b"),
                                           (["1", "--num-cpu-blocks", "0"], "--num-cpu-blocks 0 leaves "
                                                                             "--kv-offloading-size 1 GiB no block")])
def test_a_tier_that_holds_nothing_is_refused_in_one_line(args, message):
    from typer.testing import CliRunner
    from planner.cli import app

    result = CliRunner().invoke(app, ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100", "--requests", "20",
                                      "--kv-offloading-size", *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr, result.stderr
