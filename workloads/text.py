"""A trace file's text: UTF-8, a leading byte-order mark skipped, anything else refused by line.

Spreadsheets save CSV with a BOM (accepted) or in Latin-1 / UTF-16 (refused:
the ids and lengths would be read wrong or not at all); a binary file given
by mistake is refused too.  Python's own codec error names neither the file
nor the line, so the first bad line is found again here, on the slow path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from .errors import TraceError, where

ENCODING = "utf-8-sig"   # UTF-8 that drops a leading BOM (and reads files without one unchanged)
NOT_TEXT = "not UTF-8 text"
_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def text_lines(path: Path | str, newline: str | None = None) -> Iterator[str]:
    """The file's lines, decoded; TraceError names the first line that is not UTF-8 text.

    ``newline`` as for ``open`` ("" for the csv module).  A NUL byte is refused
    though UTF-8 allows it: no trace holds one, and binary files and UTF-16 do.
    """
    with open(path, encoding=ENCODING, newline=newline) as fh:
        try:
            for line_no, line in enumerate(fh, start=1):
                if "\x00" in line:
                    raise TraceError(f"{where(path, line_no)}: {NOT_TEXT} (a NUL byte: a binary file?)")
                yield line
        except UnicodeDecodeError:
            # the codec decodes in blocks, so its position does not give the line
            raise not_text_error(path) from None


def read_text(path: Path | str) -> str:
    """The whole file, decoded (for JSON documents); errors as in ``text_lines``."""
    try:
        with open(path, encoding=ENCODING) as fh:
            text = fh.read()
    except UnicodeDecodeError:
        raise not_text_error(path) from None
    nul = text.find("\x00")
    if nul >= 0:
        raise TraceError(f"{where(path, text.count(chr(10), 0, nul) + 1)}: {NOT_TEXT} (a NUL byte: a binary file?)")
    return text


def not_text_error(path: Path | str) -> TraceError:
    """The error for the first line that has a NUL byte or is not UTF-8 (read again, in bytes).

    Lines can be decoded one by one: a newline byte never occurs inside a
    UTF-8 multi-byte sequence.
    """
    with open(path, "rb") as fh:
        for line_no, raw in enumerate(fh, start=1):
            if line_no == 1 and raw.startswith(_UTF16_BOMS):
                return TraceError(f"{where(path, 1)}: {NOT_TEXT} (UTF-16; save the file as UTF-8)")
            if b"\x00" in raw:
                return TraceError(f"{where(path, line_no)}: {NOT_TEXT} (a NUL byte: a binary file?)")
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as err:
                byte = raw[err.start]
                return TraceError(
                    f"{where(path, line_no)}: {NOT_TEXT} (byte 0x{byte:02x} at byte {err.start + 1} of the line; "
                    f"Latin-1 or a binary file? save the file as UTF-8)"
                )
    return TraceError(f"{path}: {NOT_TEXT}")
