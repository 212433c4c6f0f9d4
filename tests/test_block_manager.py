import os
import subprocess
import sys

import pytest

from engine.core.block_keys import ROOT_HASH, block_key, chained_hashes
from engine.core.block_manager import BlockManager
from engine.core.kv_allocator import AllocStatus
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence, SequenceGroup, SequenceStatus, next_seq_id


def group_of(tokens, **params):
    return SequenceGroup("r", list(tokens), SamplingParams(**params), 0.0)


def running(bm, tokens):
    g = group_of(tokens)
    bm.allocate(g)
    g.seqs[0].status = SequenceStatus.RUNNING
    return g.seqs[0]


def test_allocate_takes_ceil_blocks_and_fills_slots():
    bm = BlockManager(4, 10)
    seq = running(bm, range(10))
    assert len(bm.block_table(seq)) == 3
    assert bm.num_free_blocks() == 7
    assert bm.token_slots_used() == 10
    b = bm.memory_breakdown()
    assert (b.token_states, b.internal_fragmentation, b.free) == (10, 2, 28)


def test_append_slot_allocates_only_when_last_block_full():
    bm = BlockManager(4, 10)
    seq = running(bm, range(7))
    seq.num_computed_tokens = 7
    seq.append(1, 0.0)                       # 8 tokens: still fits in block 2
    assert bm.append_slots(seq) is None
    assert len(bm.block_table(seq)) == 2
    seq.num_computed_tokens = 8
    seq.append(2, 0.0)                       # 9 tokens: needs a third block
    assert bm.append_slots(seq) is None
    assert len(bm.block_table(seq)) == 3
    assert bm.token_slots_used() == 9


def test_fork_shares_blocks_and_copy_on_write_on_shared_last_block():
    bm = BlockManager(4, 10)
    parent = running(bm, range(6))
    child = parent.copy_as(next_seq_id())
    bm.fork(parent, child)
    table = list(bm.block_table(parent))
    assert bm.block_table(child) == table
    assert all(bm.gpu.ref_counts[b] == 2 for b in table)
    assert bm.num_used_blocks() == 2             # shared, not duplicated
    child.append(9, 0.0)
    src_dst = bm.append_slots(child)
    assert src_dst is not None and src_dst[0] == table[-1]
    assert bm.block_table(child)[-1] == src_dst[1] != table[-1]
    assert bm.block_table(child)[0] == table[0]  # full blocks stay shared
    assert bm.gpu.ref_counts[table[-1]] == 1
    parent.append(8, 0.0)
    assert bm.append_slots(parent) is None       # now the only holder: write in place
    bm.free(parent)
    bm.free(child)
    assert bm.num_free_blocks() == 10 and bm.token_slots_used() == 0


def test_can_allocate_never_later_ok_with_watermark():
    bm = BlockManager(4, 10, watermark=0.1)      # one block kept free
    assert bm.can_allocate(group_of(range(40))) is AllocStatus.NEVER
    assert bm.can_allocate(group_of(range(36))) is AllocStatus.OK
    running(bm, range(20))
    assert bm.can_allocate(group_of(range(17))) is AllocStatus.LATER
    assert bm.can_allocate(group_of(range(16))) is AllocStatus.OK


def test_swap_out_and_in_restores_contents_and_sharing():
    bm = BlockManager(4, 10, num_cpu_blocks=10)
    g = group_of(range(6))
    bm.allocate(g)
    parent = g.seqs[0]
    parent.status = SequenceStatus.RUNNING
    child = parent.copy_as(next_seq_id())
    g.seqs.append(child)
    bm.fork(parent, child)
    assert bm.can_swap_out(g)
    out = bm.swap_out(g)
    assert len(out) == 2                          # shared blocks are moved once
    assert bm.num_free_blocks() == 10 and bm.token_slots_used() == 0
    for s in g.seqs:
        s.status = SequenceStatus.SWAPPED
    assert bm.can_swap_in(g)
    back = bm.swap_in(g)
    assert sorted(back) == sorted(out.values())
    # Each logical block returns to a block holding the contents swapped out.
    restore = {gpu_old: back[cpu] for gpu_old, cpu in out.items()}
    assert bm.block_table(parent) == bm.block_table(child)
    assert bm.token_slots_used() == 6
    assert set(bm.block_table(parent)) == set(restore.values())
    assert bm.num_free_cpu_blocks() == 10


def test_prefix_cache_hit_reuses_blocks_and_never_covers_whole_prompt():
    bm = BlockManager(4, 10, enable_prefix_caching=True)
    a = running(bm, range(12))
    a.num_computed_tokens = 12
    bm.mark_computed(a)
    b = group_of(list(range(12)))
    bm.allocate(b)
    sb = b.seqs[0]
    # 12 tokens = 3 full blocks, but the last token must be computed: 2 hits.
    assert sb.num_computed_tokens == 8
    assert bm.block_table(sb)[:2] == bm.block_table(a)[:2]
    assert bm.block_table(sb)[2] != bm.block_table(a)[2]


def test_prefix_cache_survives_free_and_is_evicted_lru():
    bm = BlockManager(4, 4, enable_prefix_caching=True)
    a = running(bm, range(9))            # 3 blocks, 2 full
    a.num_computed_tokens = 9
    bm.mark_computed(a)
    cached = bm.block_table(a)[:2]
    bm.free(a)
    assert bm.num_free_blocks() == 4 and bm.token_slots_used() == 0
    b = running(bm, list(range(8)) + [99])   # hits the two cached blocks
    assert bm.block_table(b)[:2] == cached and b.num_computed_tokens == 8
    bm.free(b)
    # A prompt that needs all 4 blocks evicts the cached ones.
    c = running(bm, [7] * 16)
    assert c.num_computed_tokens == 0
    assert len(bm.gpu.cached) == 0 and bm.num_free_blocks() == 0


def test_free_unknown_sequence_is_harmless():
    bm = BlockManager(4, 4)
    bm.free(Sequence(next_seq_id(), [1], 1))
    assert bm.num_free_blocks() == 4


def test_bad_sizes_are_rejected():
    with pytest.raises(ValueError):
        BlockManager(0, 4)
    with pytest.raises(ValueError):
        BlockManager(16, 0)


def test_prefix_keys_are_a_digest_no_crafted_block_can_share():
    # Python's hash() of a tuple of ints is arithmetic modulo 2**61 - 1: these two blocks would share a key
    # and the second would be served the first's KV (vLLM's CVE-2025-25183); their digests differ
    honest, crafted = [5] * 16, [2**61 + 4] + [5] * 15
    assert hash((ROOT_HASH, tuple(honest))) == hash((ROOT_HASH, tuple(crafted)))
    assert block_key(ROOT_HASH, honest) != block_key(ROOT_HASH, crafted)
    # chained: the same block after different parents has different keys
    a, b = list(chained_hashes([1] * 16 + [2] * 16, 16, 2)), list(chained_hashes([3] * 16 + [2] * 16, 16, 2))
    assert a[1] != b[1]


def test_prefix_keys_are_the_same_in_every_process():
    # a live fleet's router computes the keys its replicas' caches hold, in another process
    code = "from engine.core.block_manager import chained_hashes; print(list(chained_hashes(list(range(64)), 16, 4)))"
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert runs == {f"{list(chained_hashes(list(range(64)), 16, 4))}\n"}
