"""Text that no encoder takes."""
from __future__ import annotations


def has_lone_surrogate(text: str) -> bool:
    """Whether `text` holds a lone UTF-16 surrogate (U+D800-U+DFFF on its own): a JSON escape can put one in a
    Python string, but no UTF-8 encoder, tokenizer or file takes it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
