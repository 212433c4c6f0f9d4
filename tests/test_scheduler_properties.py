"""Scheduler invariants after every step, on random workloads (hypothesis).

Requests of every kind (single, parallel sampling, beam search, shared
prefixes) arrive at random times into caches of random sizes, under both
preemption modes and both slot-reservation rules. After every step:

- every request submitted is in exactly one place: waiting, running, swapped or finished;
- no sequence is both on the GPU and swapped out; running requests hold GPU
  tables only, swapped ones CPU tables only;
- blocks never leak: free + used = total in both pools, and every block's
  reference count equals the number of tables holding it;
- requests are first admitted in arrival order (FCFS), and every queue stays in that order.
"""
from __future__ import annotations

import random
from collections import Counter

from hypothesis import example, given, settings, strategies as st

from core_helpers import fake_samples
from engine.core.allocators import make_allocator
from engine.core.block_manager import BlockManager
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import Scheduler, SchedulerConfig
from engine.core.sequence import FinishReason, SequenceGroup, SequenceStatus

RUNNING, SWAPPED, WAITING = SequenceStatus.RUNNING, SequenceStatus.SWAPPED, SequenceStatus.WAITING


def make_requests(rng: random.Random, count: int) -> list[SequenceGroup]:
    shared = [rng.randrange(50) for _ in range(6)]
    groups = []
    for i in range(count):
        kind = rng.random()
        if kind < 0.2:
            params = SamplingParams(n=rng.choice([2, 3]), max_tokens=rng.randint(1, 8), ignore_eos=True)
        elif kind < 0.3:
            params = SamplingParams(use_beam_search=True, best_of=2, max_tokens=rng.randint(1, 6), ignore_eos=True)
        else:
            params = SamplingParams(max_tokens=rng.randint(1, 10), ignore_eos=True)
        prompt = [rng.randrange(50) for _ in range(rng.randint(1, 10))]
        if rng.random() < 0.3:
            prompt = shared + prompt
        groups.append(SequenceGroup(str(i), prompt, params, round(rng.random() * 4, 1),
                                    output_len_hint=params.max_tokens))
    return sorted(groups, key=lambda g: g.arrival_time)


def check_pools(alloc: BlockManager) -> None:
    for pool, tables in ((alloc.gpu, alloc.tables), (alloc.cpu, alloc.cpu_tables)):
        holders = Counter(b for table in tables.values() for b in table)
        assert all(pool.ref_counts[b] == holders.get(b, 0) for b in range(pool.num_blocks)), "leaked block"
        used = sum(1 for r in pool.ref_counts if r > 0)
        assert pool.num_free() + used == pool.num_blocks
        assert not set(pool.free_list) & set(holders) and not set(pool.evictor) & set(holders)


def check_places(sched: Scheduler, submitted: list[SequenceGroup], alloc) -> None:
    places = Counter()
    for where, groups in (("waiting", sched.waiting), ("running", sched.running), ("swapped", sched.swapped)):
        for g in groups:
            places[g.request_id] += 1
            assert g.finish_reason is None, f"finished request still {where}"
            live = g.live_seqs()
            expected = {"waiting": WAITING, "running": RUNNING, "swapped": SWAPPED}[where]
            assert live and all(s.status is expected for s in live)
            if isinstance(alloc, BlockManager):
                for s in live:
                    on_gpu, on_cpu = s.seq_id in alloc.tables, s.seq_id in alloc.cpu_tables
                    assert (on_gpu, on_cpu) == {"waiting": (False, False), "running": (True, False),
                                                "swapped": (False, True)}[where]
    for g in submitted:
        assert places[g.request_id] + (g.finish_reason is not None) == 1, f"request {g.request_id} lost or doubled"
    for queue in (sched.running, sched.swapped, sched.waiting):
        keys = [g.fcfs_key for g in queue]
        assert keys == sorted(keys), "a queue left FCFS order"


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 100_000), mode=st.sampled_from(["recompute", "swap"]),
       reservation=st.sampled_from(["vllm", "exact"]), prefix=st.booleans(),
       num_gpu_blocks=st.integers(3, 30), num_cpu_blocks=st.sampled_from([0, 3, 40]))
# Found by this test: a wide request swapped in, then recomputed (swap space
# exhausted), was queued ahead of an older request already waiting.
@example(seed=1706, mode="recompute", reservation="vllm", prefix=False, num_gpu_blocks=12, num_cpu_blocks=3)
def test_invariants_hold_after_every_step(seed, mode, reservation, prefix, num_gpu_blocks, num_cpu_blocks):
    rng = random.Random(seed)
    pending = make_requests(rng, rng.randint(1, 12))
    alloc = make_allocator("paged", block_size=rng.choice([1, 2, 4]), num_gpu_blocks=num_gpu_blocks,
                           num_cpu_blocks=num_cpu_blocks, max_model_len=32, watermark=rng.choice([0.0, 0.1]),
                           enable_prefix_caching=prefix, slot_reservation=reservation)
    sched = Scheduler(SchedulerConfig(max_model_len=32, preemption_mode=mode,
                                      max_num_seqs=rng.choice([4, 256])), alloc)
    submitted: list[SequenceGroup] = []
    first_admitted: list[SequenceGroup] = []
    now = 0.0
    for _ in range(2000):
        while pending and pending[0].arrival_time <= now:
            submitted.append(pending.pop(0))
            sched.add(submitted[-1])
        if not pending and not sched.has_unfinished():
            break
        out = sched.schedule(now)
        if out.is_prefill:
            first_admitted += [g for g in out.groups if g.times.first_scheduled == now and g not in first_admitted]
        check_pools(alloc)
        check_places(sched, submitted, alloc)
        seq_ids = [s.seq_id for s in out.seqs]
        assert len(seq_ids) == len(set(seq_ids)) and all(s.status is RUNNING for s in out.seqs)
        if out.is_empty and not out.has_memory_ops:
            now = pending[0].arrival_time if pending else now + 1
            continue
        now += 1.0
        sched.update(out, fake_samples(out, rng), now)
        check_pools(alloc)
        check_places(sched, submitted, alloc)
    else:
        raise AssertionError("the scheduler did not finish the workload")
    # FCFS: requests are first admitted in arrival order.
    admitted_order = [g.fcfs_key for g in first_admitted]
    assert admitted_order == sorted(admitted_order)
    assert all(g.finish_reason is not None for g in submitted)
    assert alloc.num_used_blocks() == 0 and alloc.num_free_cpu_blocks() == num_cpu_blocks
    assert all(g.finish_reason is not FinishReason.REJECTED or g.reject_reason for g in submitted)
