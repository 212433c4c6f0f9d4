"""The decode batch's sampled tokens when they are real: drawn a plan at a time, written when read.

With prefix caching on, the simulated executor (planner/sim/synthetic.py) samples real token ids:
at every step each running sequence draws (id, log-probability) from the executor's one random
generator, in running order, and a block of generated tokens enters the prefix cache as soon as it
fills (its key hashes its tokens). The decode batch (batch.py) takes many steps at once, so
`TokenLog` draws all of a plan's values at once, in the order step by step draws them (steps, then
members in running order, two values a sample), and keeps the ids and log-probabilities in two
matrices, one row (slot) per drawing member and one column per batch step, until the member's
sequence is written up to date: when it finishes, when the batch is released, and every thousand
steps, when the matrices are full. A block a member fills enters the prefix cache with a key hashed
from its tokens read from the matrix (`key`). A plan costs a few array operations and no work per
member; a member costs one every `block_size` steps.

The values are the executor's own generator's: Python's `random.Random` and numpy's legacy
`RandomState` are the same Mersenne Twister, and `RandomState.random_sample` makes a double from two
32-bit outputs exactly as `Random.random` does. So while the batch lives the executor draws from a
`RandomState` started from its generator's state (its own draws for the prompts admitted meanwhile
included), drawn a block ahead (draws.py), which `close` hands back to the `Random`, where step by
step would have left it.

A conversation turn whose answer the trace gives (the next turn's prompt holds it, so that prompt
hits the cache) draws nothing: its tokens are the answer's, as `SyntheticExecutor.samples` gives them.
"""
from __future__ import annotations

from functools import reduce
from operator import add

import numpy as np

from planner.sim.draws import DrawnAhead

# Rows (batch steps) the matrices hold before every member is written up to date and they start
# again: each member's tokens are written once per ROWS steps at most (a call each), and with vLLM's
# 1,024 sequences the two matrices hold 16 MiB.
ROWS = 1024


class TokenLog:
    """The values drawn for the batch's members, by batch step and slot, not yet written to them."""

    def __init__(self, executor, step: int) -> None:
        self.executor = executor
        self.vocab = executor.vocab_size
        self.answers = executor.answers
        self.python_rng = executor.rng
        _, state, gauss = executor.rng.getstate()
        self.gauss = gauss
        self.rng = DrawnAhead(("MT19937", np.array(state[:-1], dtype=np.uint32), state[-1]), self.vocab)
        executor.rng = self.rng               # its draws for admitted prompts continue the same stream
        # [slot, batch step - first_row]: a member's tokens lie together, for the keys and writes that read them
        self.ids = np.zeros((8, ROWS), dtype=np.int64)
        self.logprobs = np.zeros((8, ROWS))
        self.first_row = step + 1
        self.drawing: list = []               # the members that draw, in running order
        self.slots: list[int] = []            # their slots, in that order
        self.columns: np.ndarray | None = None  # the same as an array (None: to be made again)
        self.free_slots: list[int] = []
        self.num_slots = 0

    def close(self) -> None:
        """Hand the executor back its generator, in the state the draws so far leave it."""
        _, key, pos, _, _ = self.rng.state()
        self.python_rng.setstate((3, (*key.tolist(), int(pos)), self.gauss))
        self.executor.rng = self.python_rng

    def join(self, member) -> None:
        """A member joins at the next batch step: a slot when it draws, its answer when the trace has one."""
        member.answer = self.answers.get(member.group.request_id) if self.answers else None
        if member.answer is None:
            member.slot = self.free_slots.pop() if self.free_slots else self._new_slot()
            self.drawing.append(member)
            self.slots.append(member.slot)
            self.columns = None

    def leave(self, member) -> None:
        if member.answer is None:
            self.drawing.remove(member)
            self.slots.remove(member.slot)
            self.free_slots.append(member.slot)
            self.columns = None

    def _new_slot(self) -> int:
        slot = self.num_slots
        self.num_slots += 1
        if slot >= len(self.ids):
            self.ids, self.logprobs = (np.concatenate([m, np.zeros_like(m)]) for m in (self.ids, self.logprobs))
        return slot

    def draw(self, first: int, count: int) -> None:
        """The samples of batch steps first .. first + count - 1: every drawing member's, step by step."""
        drawing = self.drawing
        if not drawing:
            return
        self._make_room(first, first + count)
        if self.columns is None:
            self.columns = np.array(self.slots)
        ids, logprobs = self.rng.pairs(count * len(drawing))
        rows = slice(first - self.first_row, first - self.first_row + count)
        self.ids[self.columns, rows] = ids.reshape(count, len(drawing)).T
        self.logprobs[self.columns, rows] = logprobs.reshape(count, len(drawing)).T

    def _make_room(self, first: int, end: int) -> None:
        """Rows for batch steps first .. end - 1. When the matrices are full, every member's sequence is
        written up to step `first - 1` and the rows start again at `first`: they hold ROWS steps (more
        only for a longer plan) however long a member runs."""
        if end - self.first_row <= self.ids.shape[1]:
            return
        for member in self.drawing:
            self.write(member, first - 1)
        self.first_row = first
        if end - first > self.ids.shape[1]:
            self.ids = np.zeros((len(self.ids), 2 * (end - first)), dtype=np.int64)
            self.logprobs = np.zeros(self.ids.shape)

    def write(self, member, upto: int) -> None:
        """Append the member's tokens (and log-probabilities) up to batch step `upto` to its sequence."""
        count = upto - member.tokens_upto
        if count <= 0:
            return
        seq = member.group.seqs[0]
        if member.answer is not None:
            done = len(seq.token_ids) - seq.prompt_len
            seq.token_ids.extend(member.answer[done:done + count])
            logprobs = [-1.0] * count
        else:
            row = member.tokens_upto + 1 - self.first_row
            seq.token_ids.extend(self.ids[member.slot, row:row + count].tolist())
            values = self.logprobs[member.slot, row:row + count]
            seq.output_logprobs.extend(values.tolist())
            # Added one by one, as update adds them: a running sum adds in order (numpy's accumulate is
            # not pairwise), from the sum so far (added to the first: the same addition)
            running = values.copy()
            running[0] += seq.cumulative_logprob
            seq.cumulative_logprob = float(np.add.accumulate(running)[-1])
            member.tokens_upto = upto
            return
        seq.output_logprobs.extend(logprobs)
        seq.cumulative_logprob = reduce(add, logprobs, seq.cumulative_logprob)   # added one by one, as update does
        member.tokens_upto = upto

    def key(self, member, upto: int, parent: int, count: int) -> int:
        """The prefix-cache key of the block of the member's last `count` tokens as of batch step `upto`
        (at or after the step its sequence is written up to), chained from `parent` as
        engine.core.block_manager.chained_hashes keys it, its tokens read from the sequence and the matrix."""
        unwritten = upto - member.tokens_upto
        if unwritten >= count and member.answer is None:          # the common case: all in the matrix
            end = upto + 1 - self.first_row
            return hash((parent, tuple(self.ids[member.slot, end - count:end].tolist())))
        if member.answer is not None:
            self.write(member, upto)              # an answer's tokens cost nothing to write
            unwritten = 0
        tokens = member.group.seqs[0].token_ids
        if unwritten <= 0:
            return hash((parent, tuple(tokens[len(tokens) - count:])))
        end = upto + 1 - self.first_row
        return hash((parent, tuple(tokens[len(tokens) - (count - unwritten):]
                                   + self.ids[member.slot, end - unwritten:end].tolist())))

    def sample(self, member, step: int) -> tuple[int, float]:
        """What the member sampled at batch step `step` (its sequence written up to the step before)."""
        if member.answer is not None:
            seq = member.group.seqs[0]
            return member.answer[len(seq.token_ids) - seq.prompt_len], -1.0
        row = step - self.first_row
        return int(self.ids[member.slot, row]), float(self.logprobs[member.slot, row])
