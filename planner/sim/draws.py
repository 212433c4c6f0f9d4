"""The executor's random generator while a decode batch lives, its values drawn a block ahead.

The decode batch (batch.py) draws every member's sample of a plan at once (batch_tokens.py), and
the executor draws for the prompts admitted in between, all from one Mersenne Twister. A call to
the generator and the arithmetic that turns its doubles into ids and log-probabilities cost a few
microseconds each however few values they make, and a plan is only a few steps, so `DrawnAhead`
draws a block of some thousands of doubles in one call and computes the block's ids and
log-probabilities once for all its pairs: a plan's draw is then a slice.

Nothing changes but when the values are computed: they are the generator's, handed out in its
order (`pairs` to the batch, `random` one at a time to the executor), and `state` replays the
block's consumed part from the state it began at, so the generator is handed back exactly where
drawing the values one at a time would have left it. A sample is a pair of doubles (an id from the
first, minus the second as its log-probability: SyntheticExecutor.samples), and every consumer
takes whole pairs, so a block (of an even count) starts at a pair; `pairs` still takes the slow way
should a consumer ever leave it in the middle of one.
"""
from __future__ import annotations

import numpy as np

BLOCK = 1 << 14     # doubles drawn at a time (even)


class DrawnAhead:
    """A RandomState's stream of doubles, drawn `BLOCK` at a time, handed out in order."""

    def __init__(self, state: tuple, vocab: int) -> None:
        self.rng = np.random.RandomState()
        self.rng.set_state(state)
        self.vocab = vocab
        self._next_block(BLOCK)

    def _next_block(self, size: int) -> None:
        self.block_state = self.rng.get_state()       # where the block begins (`state` replays from it)
        self.raw = self.rng.random_sample(size)
        self.ids = (self.raw[0::2] * self.vocab).astype(np.int64)   # each pair's id and log-probability
        self.logprobs = -self.raw[1::2]
        self.pos = 0

    def random(self) -> float:
        """The next double (what `random.Random.random` would return)."""
        if self.pos == len(self.raw):
            self._next_block(BLOCK)
        value = float(self.raw[self.pos])
        self.pos += 1
        return value

    def pairs(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """The ids and log-probabilities of the next `count` samples (two doubles each)."""
        pos, end = self.pos, self.pos + 2 * count
        if pos % 2 == 0 and end <= len(self.raw):
            self.pos = end
            return self.ids[pos // 2:end // 2], self.logprobs[pos // 2:end // 2]
        if end <= len(self.raw):                       # in the middle of a pair
            values = self.raw[pos:end]
            self.pos = end
        else:                                          # the block's end, then a new block
            rest = self.raw[pos:]
            needed = end - len(self.raw)
            self._next_block(max(BLOCK, needed + needed % 2))
            values = np.concatenate([rest, self.raw[:needed]])
            self.pos = needed
        return (values[0::2] * self.vocab).astype(np.int64), -values[1::2]

    def state(self) -> tuple:
        """The generator's state after the values handed out (RandomState.get_state's)."""
        rng = np.random.RandomState()
        rng.set_state(self.block_state)
        rng.random_sample(self.pos)
        return rng.get_state()
