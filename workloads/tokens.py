"""Deterministic stand-in token ids for traces that carry only lengths.

A generated trace says how long a prompt is, not what it says.  The engine
still needs ids, and prefix caching only works if requests that share text
share ids, so ids are drawn from seeded streams keyed by what is shared:

- a stream per ``prefix_id`` for the shared few-shot prefix (position i of the
  prefix is the same id in every request that uses it);
- a stream per request for its unique part and per request for its answer;
- a chatbot turn's prompt is the previous turn's prompt + answer followed by
  the new user message, or, when the history was truncated, the last
  ``prompt_len`` tokens of that (see ``Trace.prompt_token_ids``).

Ids avoid the lowest ``RESERVED_IDS`` of the vocabulary, which are special
tokens (pad/bos/eos/unk) in the OPT and LLaMA vocabularies, so a stand-in
prompt never contains an end-of-sequence token.
"""

from __future__ import annotations

import hashlib

import numpy as np

RESERVED_IDS = 4


def stream(seed: int, *keys: object) -> np.random.Generator:
    """A generator seeded from (seed, keys) by a stable hash (not Python's hash())."""
    digest = hashlib.blake2b(repr((seed, *keys)).encode(), digest_size=16).digest()
    # default_rng(seed) is this generator, less a few microseconds of argument checks (one a request)
    return np.random.Generator(np.random.PCG64(int.from_bytes(digest, "little")))


def random_ids(vocab_size: int, length: int, seed: int, *keys: object) -> np.ndarray:
    """``length`` ids in [RESERVED_IDS, vocab_size) from the stream (seed, keys).

    Uses one double per id, so the first k ids of a longer draw equal a draw of
    k: every request of a prefix gets the same ids whatever its prefix_len.
    """
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    low = RESERVED_IDS if vocab_size > 2 * RESERVED_IDS else 0
    u = stream(seed, *keys).random(length)
    # The cast truncates, which for these non-negative values is the floor: one array operation fewer.
    ids = (u * (vocab_size - low)).astype(np.int64)
    ids += low
    return ids
