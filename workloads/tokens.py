"""Deterministic stand-in token ids for traces that carry only lengths.

A generated trace says how long a prompt is, not what it says.  The engine
still needs ids, and prefix caching only works if requests that share text
share ids, so ids are drawn from seeded streams keyed by what is shared:

- a stream per ``prefix_id`` for the shared few-shot prefix (position i of the
  prefix is the same id in every request that uses it);
- a stream per request for its unique part and per request for its answer;
- a stream per block hash of an imported Mooncake trace (``hash_block``);
- a chatbot turn's prompt is the previous turn's prompt + answer followed by
  the new user message, or, when the history was truncated, the last
  ``prompt_len`` tokens of that (see ``Trace.prompt_token_ids``).

Ids avoid the lowest ``RESERVED_IDS`` of the vocabulary, which are special
tokens (pad/bos/eos/unk) in the OPT and LLaMA vocabularies, so a stand-in
prompt never contains an end-of-sequence token.
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np

RESERVED_IDS = 4


def entropy(seed: int, *keys: object) -> int:
    """The 128-bit seed of the stream (seed, keys): a stable hash (not Python's hash())."""
    return int.from_bytes(hashlib.blake2b(repr((seed, *keys)).encode(), digest_size=16).digest(), "little")


def stream(seed: int, *keys: object) -> np.random.Generator:
    """A generator seeded from (seed, keys) by a stable hash (not Python's hash())."""
    # default_rng(seed) is this generator, less a few microseconds of argument checks (one a request)
    return np.random.Generator(np.random.PCG64(entropy(seed, *keys)))


def random_ids(vocab_size: int, length: int, seed: int, *keys: object) -> np.ndarray:
    """``length`` ids in [RESERVED_IDS, vocab_size) from the stream (seed, keys).

    Uses one double per id, so the first k ids of a longer draw equal a draw of
    k: every request of a prefix gets the same ids whatever its prefix_len.
    """
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    return _ids(stream(seed, *keys).random(length), vocab_size)


@functools.lru_cache(maxsize=4096)
def hash_block(vocab_size: int, size: int, seed: int, hash_id: int) -> np.ndarray:
    """The `size` ids of a Mooncake trace's block `hash_id` (TraceRequest.hash_ids), read-only: a block most
    prompts share (a system prompt's) is drawn once, and requests holding one block hold the same ids."""
    ids = random_ids(vocab_size, size, seed, "hash", hash_id)
    ids.flags.writeable = False
    return ids


def _ids(u: np.ndarray, vocab_size: int) -> np.ndarray:
    """Ids in [RESERVED_IDS, vocab_size) from doubles in [0, 1), one each."""
    low = RESERVED_IDS if vocab_size > 2 * RESERVED_IDS else 0
    # The cast truncates, which for these non-negative values is the floor: one array operation fewer.
    ids = (u * (vocab_size - low)).astype(np.int64)
    ids += low
    return ids


class Streams:
    """`random_ids` for many streams of one seed, named in advance (a trace's requests, in arrival
    order): seeding a PCG64 costs more than drawing a prompt's ids (numpy's SeedSequence, about 12 us),
    so the streams are seeded `STREAMS_AT_ONCE` at a time (`pcg64_states`), the two blocks used last
    kept, and one generator is set to each stream's state in turn. A stream of a block already seeded
    and since dropped is seeded alone: a turn sent long after its trace time (its users waited for
    slow answers) reads its history's streams far behind the others, and seeding their whole blocks
    again, turn after turn, cost 4,096 seeds each. The same ids as `random_ids`; a stream not named is
    drawn by `random_ids` itself."""

    def __init__(self, seed: int, names: list[tuple]) -> None:
        self.seed, self.names = seed, names
        self.position = {name: i for i, name in enumerate(names)}
        self.blocks: dict[int, list[tuple[int, int]]] = {}   # the blocks kept, the one used last at the end
        self.dropped: set[int] = set()
        self.bits = np.random.PCG64(0)
        self.generator = np.random.Generator(self.bits)

    def random_ids(self, vocab_size: int, length: int, *keys: object) -> np.ndarray:
        i = self.position.get(keys)
        if i is None or vocab_size < 1:
            return random_ids(vocab_size, length, self.seed, *keys)
        block, at = divmod(i, STREAMS_AT_ONCE)
        states = self.blocks.pop(block, None)
        if states is None:
            if block in self.dropped:
                return random_ids(vocab_size, length, self.seed, *keys)
            first = block * STREAMS_AT_ONCE
            states = pcg64_states([entropy(self.seed, *name) for name in self.names[first:first + STREAMS_AT_ONCE]])
            if len(self.blocks) == 2:                 # (a turn's history mostly lies in one of the two)
                oldest = next(iter(self.blocks))
                del self.blocks[oldest]
                self.dropped.add(oldest)
        self.blocks[block] = states                   # (the one used last)
        state, inc = states[at]
        self.bits.state = {"bit_generator": "PCG64", "state": {"state": state, "inc": inc}, "has_uint32": 0,
                           "uinteger": 0}
        return _ids(self.generator.random(length), vocab_size)


STREAMS_AT_ONCE = 4096

# numpy's SeedSequence (numpy/random/bit_generator.pyx) and PCG64 seeding (pcg64.c), written out
_INIT_A, _MULT_A, _INIT_B, _MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
_MIX_MULT_L, _MIX_MULT_R, _XSHIFT = np.uint32(0xCA01F9DD), np.uint32(0x4973F715), np.uint32(16)
_M32, _M128 = (1 << 32) - 1, (1 << 128) - 1
_PCG_MULT = (2549297995355413924 << 64) + 4865540595714422341


def pcg64_states(entropies: list[int]) -> list[tuple[int, int]]:
    """(state, inc) of `np.random.PCG64(e)` for each entropy e < 2**128, all seeded at once: SeedSequence's
    pool of four 32-bit words hashed and mixed on arrays (uint32 arithmetic wraps as its C code's
    does; its constants follow one sequence for every seed), its four 64-bit words of state, and
    PCG's two seeding steps on Python integers. tests/test_workloads_generators.py holds it to numpy."""
    words = np.array([[(e >> (32 * i)) & _M32 for i in range(4)] for e in entropies], dtype=np.uint32).T
    const = _INIT_A

    def hashmix(value: np.ndarray) -> np.ndarray:
        nonlocal const
        value = value ^ np.uint32(const)
        const = (const * _MULT_A) & _M32
        value = value * np.uint32(const)
        return value ^ (value >> _XSHIFT)

    pool = [hashmix(words[i]) for i in range(4)]     # an entropy of fewer words: the rest hash 0
    for src in range(4):
        for dst in range(4):
            if src != dst:
                mixed = _MIX_MULT_L * pool[dst] - _MIX_MULT_R * hashmix(pool[src])
                pool[dst] = mixed ^ (mixed >> _XSHIFT)
    const, out = _INIT_B, []
    for i in range(8):                               # generate_state(4, np.uint64): 8 words, little-endian pairs
        value = pool[i % 4] ^ np.uint32(const)
        const = (const * _MULT_B) & _M32
        value = value * np.uint32(const)
        out.append((value ^ (value >> _XSHIFT)).astype(np.uint64))
    seed_hi, seed_lo, inc_hi, inc_lo = ((out[2 * k] | (out[2 * k + 1] << np.uint64(32))).tolist() for k in range(4))
    states = []
    for hi, lo, ihi, ilo in zip(seed_hi, seed_lo, inc_hi, inc_lo):
        inc = ((((ihi << 64) | ilo) << 1) | 1) & _M128
        state = (((inc + ((hi << 64) | lo)) & _M128) * _PCG_MULT + inc) & _M128   # from 0: step, add, step
        states.append((state, inc))
    return states
