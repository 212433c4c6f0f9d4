"""Incremental detokenization and stop strings, one sequence at a time (as vLLM does).

Each step decodes only a short window: the few tokens before the new ones
(context the tokenizer needs for leading spaces and multi-byte characters)
plus the new ones, so a step costs O(new tokens), not O(output length). Text
that ends in U+FFFD is an incomplete UTF-8 character: it waits for the next
token.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

Decode = Callable[[list[int]], str]

_CONTEXT_TOKENS = 5   # prompt tokens decoded with the first output token, for spacing


class IncrementalDetokenizer:
    __slots__ = ("prefix_offset", "read_offset", "text", "stop_reason")

    def __init__(self, prompt_len: int) -> None:
        self.prefix_offset = max(prompt_len - _CONTEXT_TOKENS, 0)
        self.read_offset = prompt_len
        self.text = ""
        self.stop_reason: str | None = None   # the stop string that ended the sequence

    @property
    def stopped(self) -> bool:
        return self.stop_reason is not None

    def update(self, decode: Decode, token_ids: Sequence[int], final: bool = False) -> int:
        """Append the text of tokens not yet decoded; returns how many characters were added.

        ``final``: the sequence has ended, so an incomplete character is emitted as is.
        """
        if self.read_offset >= len(token_ids) or self.stopped:
            return 0
        prefix = decode(list(token_ids[self.prefix_offset:self.read_offset]))
        full = decode(list(token_ids[self.prefix_offset:]))
        if len(full) <= len(prefix) or (full.endswith("\ufffd") and not final):
            return 0
        new = full[len(prefix):]
        self.text += new
        self.prefix_offset, self.read_offset = self.read_offset, len(token_ids)
        return len(new)

    def check_stop(self, stops: Sequence[str], num_new_chars: int, include_stop: bool) -> bool:
        """Cut the text at the earliest stop string that the new characters completed."""
        if not stops or not num_new_chars:
            return False
        text = self.text
        best: tuple[int, str] | None = None
        for stop in stops:
            i = text.find(stop, max(0, len(text) - num_new_chars - len(stop) + 1))
            if i != -1 and (best is None or i < best[0]):
                best = (i, stop)
        if best is None:
            return False
        i, stop = best
        self.text = text[:i + len(stop)] if include_stop else text[:i]
        self.stop_reason = stop
        return True


def stream_holdback(stops: Sequence[str], include_stop: bool) -> int:
    """Characters a stream must hold back: a stop string may be completing across them."""
    return 0 if not stops or include_stop else max(len(s) for s in stops) - 1
