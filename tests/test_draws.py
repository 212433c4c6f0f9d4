"""DrawnAhead (planner/sim/draws.py) hands out the generator's own values in its order and hands the
generator back where drawing them one at a time leaves it."""
from __future__ import annotations

import random

import numpy as np
import pytest

from planner.sim import draws
from planner.sim.draws import DrawnAhead

VOCAB = 128_256


def ahead_of(rng: random.Random) -> DrawnAhead:
    _, state, _ = rng.getstate()
    return DrawnAhead(("MT19937", np.array(state[:-1], dtype=np.uint32), state[-1]), VOCAB)


@pytest.mark.parametrize("block", [draws.BLOCK, 6])
def test_values_and_state_equal_one_at_a_time(monkeypatch, block):
    monkeypatch.setattr(draws, "BLOCK", block)
    reference, source = random.Random(7), random.Random(7)
    ahead = ahead_of(source)
    # pairs within a block, across blocks, larger than a block, single values (an odd count
    # leaves the stream in the middle of a pair) and pairs after it
    for kind, count in [("pairs", 3), ("one", 2), ("pairs", 40), ("pairs", 2), ("one", 1), ("pairs", 5),
                        ("one", 1), ("pairs", 9000), ("pairs", 1)]:
        if kind == "one":
            for _ in range(count):
                assert ahead.random() == reference.random()
            continue
        ids, logprobs = ahead.pairs(count)
        expected = [(int(reference.random() * VOCAB), -reference.random()) for _ in range(count)]
        assert list(zip(ids.tolist(), logprobs.tolist())) == expected
    _, key, pos, _, _ = ahead.state()
    source.setstate((3, (*key.tolist(), int(pos)), None))
    assert [source.random() for _ in range(5)] == [reference.random() for _ in range(5)]


def test_a_running_sum_adds_in_order():
    # TokenLog.write sums a member's log-probabilities with numpy's accumulate, which must add them
    # one by one as the scheduler's update does (a pairwise sum would round differently).
    from functools import reduce
    from operator import add

    rng = np.random.RandomState(3)
    for count in (1, 2, 7, 250, 4000):
        values = -rng.random_sample(count)
        start = -rng.random_sample() * 100
        running = values.copy()
        running[0] += start
        assert float(np.add.accumulate(running)[-1]) == reduce(add, values.tolist(), start)
