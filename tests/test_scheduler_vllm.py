"""The scheduler preempts exactly where vLLM v0.2.0 would (issue 13, defects 1, 3, 8, 9).

vLLM v0.2.0's ``BlockSpaceManager`` admits a decode step for a request only if
there is at least one free block per running sequence of it
(``can_append_slot``), and swaps a request back in only if its blocks plus one
block per swapped sequence fit above the watermark (``can_swap_in``). The
expected timelines below are derived by hand from those two rules.
"""
from __future__ import annotations

import pytest

from engine.core.allocators import make_allocator
from engine.core.block_manager import BlockManager
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import Scheduler, SchedulerConfig
from engine.core.sequence import FinishReason, SequenceGroup, SequenceStatus
from test_scheduler import replay, req


def ids(groups):
    return [g.request_id for g in groups]


def test_decode_check_preempts_where_vllm_does():
    # Block size 2, 6 blocks, no watermark. A, B, C: 3-token prompts, 2 blocks each.
    a, b, c = req("A", 0.0, 3, 4), req("B", 0.0, 3, 4), req("C", 0.0, 3, 4)
    r = replay([a, b, c], block_size=2, num_gpu_blocks=6, mode="recompute")
    log = r.log
    # Step 0: all three prompts fit exactly (6 - 2 - 2 - 2 = 0 >= watermark 0).
    assert log[0].is_prefill and ids(log[0].groups) == ["A", "B", "C"]
    # Step 1: each holds 4 tokens in 2 full-enough blocks (the 4th token's slot
    # exists), 0 blocks free. vLLM still wants 1 free block for A's one running
    # sequence: C, the newest, is preempted (recompute frees its 2 blocks). A
    # and B then decode without taking a block.
    assert not log[1].is_prefill and ids(log[1].preempted) == ["C"] and ids(log[1].groups) == ["A", "B"]
    # Step 2: nothing swapped, so C (4 tokens, 2 blocks, 2 free) is prefilled again.
    assert log[2].is_prefill and ids(log[2].groups) == ["C"]
    # Step 3: A (5 tokens) needs a 3rd block, 0 free: C is preempted again; A
    # takes a block (1 left), B takes the last one.
    assert ids(log[3].preempted) == ["C"] and ids(log[3].groups) == ["A", "B"]

    # The finer check counts only sequences that need a block: nobody is
    # preempted at step 1, and C goes first at step 2, when all three need one.
    a, b, c = req("A", 0.0, 3, 4), req("B", 0.0, 3, 4), req("C", 0.0, 3, 4)
    exact = replay([a, b, c], block_size=2, num_gpu_blocks=6, mode="recompute", reservation="exact").log
    assert ids(exact[1].groups) == ["A", "B", "C"] and not exact[1].preempted
    assert ids(exact[2].preempted) == ["C"] and ids(exact[2].groups) == ["A", "B"]


def test_decode_check_counts_every_running_sequence_of_the_group():
    bm = BlockManager(4, num_gpu_blocks=8, watermark=0.0)
    group = SequenceGroup("p", [1] * 5, SamplingParams(n=3), 0.0)     # 2 blocks, the last half full
    bm.allocate(group)
    parent = group.seqs[0]
    parent.status = SequenceStatus.RUNNING
    for i in range(2):
        child = parent.copy_as(1000 + i)
        bm.fork(parent, child)
        group.seqs.append(child)
    assert bm.num_free_blocks() == 6
    bm.gpu.free_list[:] = bm.gpu.free_list[-3:]          # leave exactly 3 free: one per sequence
    assert bm.can_append_slots(group)
    bm.gpu.free_list.pop()                                # 2 free for 3 sequences
    assert not bm.can_append_slots(group)


@pytest.mark.parametrize("watermark_blocks", [0, 2])
def test_swap_in_reserves_the_groups_blocks_plus_one_per_sequence(watermark_blocks):
    bm = BlockManager(4, num_gpu_blocks=20, num_cpu_blocks=20, watermark=watermark_blocks / 20)
    group = SequenceGroup("p", [1] * 6, SamplingParams(n=2), 0.0)     # 2 blocks
    bm.allocate(group)
    parent = group.seqs[0]
    parent.status = SequenceStatus.RUNNING
    child = parent.copy_as(2000)
    bm.fork(parent, child)
    group.seqs.append(child)
    bm.append_slots(parent)                               # copy-on-write: 3 distinct blocks now
    bm.swap_out(group)
    for seq in group.seqs:
        seq.status = SequenceStatus.SWAPPED
    # vLLM: free - (3 blocks + 2 sequences) >= watermark.
    bm.gpu.free_list[:] = bm.gpu.free_list[-(5 + watermark_blocks):]
    assert bm.can_swap_in(group)
    bm.gpu.free_list.pop()
    assert not bm.can_swap_in(group)


def test_issue_reproduction_no_empty_step_loses_a_swap():
    """Defect 1: 4 blocks of 2, swap mode, a 4-way parallel request and a single one.
    The wide request can never decode (4 sequences need a block each beyond their
    shared prompt block: 5 > 4), so it is refused up front (issue 27: never cut
    short for lack of blocks) without evicting the other, and no step carries a
    swap the executor would skip."""
    wide = SequenceGroup("wide", [5, 6], SamplingParams(n=4, max_tokens=6, ignore_eos=True), 0.0)
    single = req("single", 0.1, 2, 6)
    r = replay([wide, single], block_size=2, num_gpu_blocks=4, num_cpu_blocks=8, mode="swap")
    assert ids(r.rejected) == ["wide"] and wide.finish_reason is FinishReason.REJECTED and not r.truncated
    assert "whole cache" in wide.reject_reason
    assert single.num_preemptions == 0 and single.seqs[0].num_output_tokens == 6
    assert all(out.seqs or not out.has_memory_ops for out in r.log)
    assert r.alloc.num_free_blocks() == 4


def test_wide_groups_are_swapped_under_recompute():
    """Defect 3: recompute would lose the blocks the sequences share, so a group
    with several running sequences is swapped, as vLLM v0 does; a single
    sequence is still recomputed."""
    first = req("first", 0.0, 3, 8)
    wide = SequenceGroup("wide", [5, 6, 7], SamplingParams(n=2, max_tokens=4, ignore_eos=True), 0.5)
    r = replay([first, wide], block_size=2, num_gpu_blocks=7, num_cpu_blocks=16, mode="recompute")
    # Step 3: "first" takes a block (1 left); "wide" wants one per sequence (2),
    # is the newest request, and so preempts itself: by swap.
    assert ids(r.log[3].groups) == ["first"] and ids(r.log[3].preempted) == ["wide"]
    assert r.log[3].blocks_to_swap_out and r.sched.preemptions["swap"] >= 1
    assert all(s.num_output_tokens == 4 for s in wide.seqs) and first.seqs[0].num_output_tokens == 8
    assert not r.truncated and r.alloc.num_free_blocks() == 7


def test_exhausted_swap_space_falls_back_to_recompute_and_stays_correct():
    first = req("first", 0.0, 3, 8)
    wide = SequenceGroup("wide", [5, 6, 7], SamplingParams(n=2, max_tokens=4, ignore_eos=True), 0.5)
    r = replay([first, wide], block_size=2, num_gpu_blocks=7, num_cpu_blocks=0, mode="swap")
    assert r.sched.preemptions["swap"] == 0 and r.sched.preemptions["recompute"] >= 1
    for g in (wide, first):
        assert g.finish_reason is FinishReason.LENGTH
    # Recomputed without sharing, the wide one still ends with every token, or
    # is cut short only if its unshared sequences outgrew the cache.
    if wide not in r.truncated:
        assert all(s.num_output_tokens == 4 for s in wide.seqs)
    assert r.alloc.num_free_blocks() == 7


def test_every_eos_id_stops_a_sequence():
    """Defect 8: configs may list several EOS ids; any of them ends a sequence."""
    alloc = make_allocator("paged", block_size=4, num_gpu_blocks=16, max_model_len=64)
    sched = Scheduler(SchedulerConfig(max_model_len=64), alloc)
    groups = [SequenceGroup(str(i), [1, 2, 3], SamplingParams(max_tokens=10), 0.0, eos_token_ids=[7, 9])
              for i in range(3)]
    for g in groups:
        sched.add(g)
    out = sched.schedule(0.0)
    finished = sched.update(out, {g.seqs[0].seq_id: [(tok, 0.0)] for g, tok in zip(groups, (7, 9, 8))}, 1.0)
    assert ids(finished) == ["0", "1"] and all(g.finish_reason is FinishReason.STOP for g in finished)
    assert groups[2].finish_reason is None
    assert SequenceGroup("x", [1], SamplingParams(), 0.0, eos_token_id=7).eos_token_ids == {7}

