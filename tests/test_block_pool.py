"""Block pools: `take_many` hands out exactly the blocks, and leaves exactly the state, that as many
`take` calls would (the simulator's decode batch and the block manager take a step's or a prompt's
blocks in one call; the order decides which cached prefixes survive)."""
import copy

from hypothesis import given, settings, strategies as st

from engine.core.block_pool import BlockPool
from engine.core.chunked_scheduler import VllmBlockPool

NUM_BLOCKS = 16

# A history: take a block holding some tokens, release a held block, or register a held one's prefix.
ops = st.lists(st.tuples(st.sampled_from(("take", "release", "register")), st.integers(0, 1000)),
               max_size=60)


def _state(pool):
    return (pool.ref_counts, pool.fill, pool.free_list, pool.num_token_states, pool.block_hash,
            pool.cached, list(pool.evictor), pool.events)


def _replay(pool, history):
    held = []
    for op, x in history:
        if op == "take" and pool.num_free():
            held.append(pool.take(x % 5))
        elif op == "release" and held:
            pool.release(held.pop(x % len(held)))
        elif op == "register" and held:
            pool.register(held[x % len(held)], x)
    return pool


@settings(max_examples=150, deadline=None)
@given(paper=st.booleans(), history=ops, count=st.integers(0, NUM_BLOCKS), filled=st.integers(0, 4))
def test_take_many_is_takes_in_turn(paper, history, count, filled):
    pool = BlockPool(NUM_BLOCKS) if paper else VllmBlockPool(NUM_BLOCKS)
    pool.events = []
    pool = _replay(pool, history)
    count = min(count, pool.num_free())
    one_by_one = copy.deepcopy(pool)
    expected = [one_by_one.take(filled) for _ in range(count)]
    assert pool.take_many(count, filled) == expected
    assert _state(pool) == _state(one_by_one)
