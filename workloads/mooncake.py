"""Mooncake traces: Moonshot AI's production request logs (kvcache-ai/Mooncake, FAST25-release/traces:
conversation, tool-agent and synthetic), which aiperf replays as its `mooncake_trace` dataset and Dynamo's
KV-aware routing is benchmarked on.

One JSON object a line (FAST25-release/README.md): `timestamp` (ms since the log's start; a file may leave it
out of every line, and its requests then all arrive at once, as aiperf replays such a file), `input_length`
and `output_length` (tokens), and `hash_ids`, the prompt's blocks remapped to ids ("The block size is 512
tokens"; the last block shorter): two requests whose hash ids agree up to block k shared their first k
blocks' text. The trace keeps them (TraceRequest.hash_ids), so the prompts a run sends share exactly those
blocks, and a prefix cache, a prefix-aware router or a KV tier meets the log's reuse.
"""
from __future__ import annotations

import math
from pathlib import Path

from .arrivals import TIME_DECIMALS
from .errors import TraceError, where
from .schema import MAX_HASH_BLOCK
from .text import text_lines
from .trace import Trace
from .trace_files import MAX_ARRIVAL_TIME, MAX_TOKENS, build_request, json_object, json_text

MOONCAKE_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")
MOONCAKE_BLOCK = 512          # the tokens a hash id covers: ceil(input_length / 512) ids a request
# the file's names for the schema's fields (for the errors)
FILE_NAMES = {"arrival_time": "timestamp", "prompt_len": "input_length", "output_len": "output_length"}


def import_mooncake(path: str | Path, *, num_requests: int | None = None, duration: float | None = None,
                    drop_zero: bool = False, block_size: int = MOONCAKE_BLOCK, name: str | None = None) -> Trace:
    """A trace of the first `num_requests` lines of a Mooncake trace (or those in its first `duration` s),
    arrivals relative to the first line's timestamp. Each line is checked as it is read: its keys, its
    lengths (a zero one refused, or with `drop_zero` skipped and counted), timestamps that do not decrease,
    and hash ids that cover its prompt at `block_size` tokens each."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such file")
    if not 1 <= block_size <= MAX_HASH_BLOCK:      # (the trace's own field's bounds: TraceRequest.hash_block_size)
        raise TraceError(f"--hash-block-size: must be 1 to {MAX_HASH_BLOCK:,} tokens, got {block_size:,}")
    stem = name or path.stem
    requests = []
    dropped = 0
    first_time = timed = None
    previous = -math.inf
    for line, raw in enumerate(text_lines(path), start=1):
        if not raw.strip():
            continue
        if num_requests is not None and len(requests) >= num_requests:
            break
        obj = json_object(raw, path, line)
        unknown = next((key for key in obj if key not in MOONCAKE_KEYS), None)
        if unknown is not None:
            raise TraceError(f"{where(path, line, unknown)}: not a Mooncake trace field (they are "
                             f"{', '.join(MOONCAKE_KEYS)})")
        _check_lengths(obj, path, line, drop_zero)
        stamp = _timestamp(obj, path, line, timed)
        timed = stamp is not None
        if timed:
            if stamp < previous:
                raise TraceError(f"{where(path, line, 'timestamp')}: {json_text(obj['timestamp'])} is before the "
                                 f"previous line's (timestamps must not decrease)")
            previous = stamp
            first_time = stamp if first_time is None else first_time
            arrival = (stamp - first_time) / 1000.0
            if duration is not None and arrival >= duration:
                break                           # a long log's later lines are neither needed nor checked
            if arrival > MAX_ARRIVAL_TIME:
                raise TraceError(f"{where(path, line, 'timestamp')}: {arrival:g} s after the first line, over "
                                 f"the cap of {MAX_ARRIVAL_TIME:,.0f} s")
        if obj["input_length"] == 0 or obj["output_length"] == 0:
            dropped += 1
            continue
        fields = {"request_id": f"{stem}-{len(requests)}",
                  "arrival_time": round(arrival, TIME_DECIMALS) if timed else 0.0,
                  "prompt_len": obj["input_length"], "output_len": obj["output_length"]}
        if "hash_ids" in obj:
            if not isinstance(obj["hash_ids"], list):
                raise TraceError(f"{where(path, line, 'hash_ids')}: must be a list of block ids, got "
                                 f"{json_text(obj['hash_ids'])}")
            fields |= {"hash_ids": obj["hash_ids"], "hash_block_size": block_size}
        requests.append(build_request(fields, path, line, FILE_NAMES))
    if not requests:
        raise TraceError(f"{path}: no requests in it" + (f" ({dropped} lines with a zero length skipped)"
                                                         if dropped else ""))
    params = {"source": str(path), "format": "mooncake", "hash_block_size": block_size, "dropped_rows": dropped}
    return Trace(requests, name=stem, params=params)


def _check_lengths(obj: dict, path: Path, line: int, drop_zero: bool) -> None:
    """A TraceError naming the line's length that is missing, not a whole number, zero (unless `drop_zero`),
    negative or over the cap."""
    for key in ("input_length", "output_length"):
        if key not in obj:
            raise TraceError(f"{where(path, line, key)}: missing")
        value = obj[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise TraceError(f"{where(path, line, key)}: must be a whole number of tokens, got {json_text(value)}")
        if value < 0 or (value == 0 and not drop_zero):
            hint = " (planner workload import --format mooncake --drop-zero skips such lines)" if value == 0 else ""
            raise TraceError(f"{where(path, line, key)}: must be >= 1, got {value}{hint}")
        if value > MAX_TOKENS:
            raise TraceError(f"{where(path, line, key)}: {value:,} is over the cap of {MAX_TOKENS:,} tokens")


def _timestamp(obj: dict, path: Path, line: int, timed: bool | None) -> float | None:
    """The line's timestamp in ms (None where the file gives none), checked: a number >= 0, and given on
    every line or on none (`timed`: whether the lines before had one; None on the first)."""
    if "timestamp" not in obj:
        if timed:
            raise TraceError(f"{where(path, line, 'timestamp')}: missing (the lines before have one)")
        return None
    if timed is False:
        raise TraceError(f"{where(path, line, 'timestamp')}: the lines before have none (give every line one, "
                         f"or none)")
    value = obj["timestamp"]
    # (an integer of 400 digits is no float: as infinite, refused)
    ms = value if isinstance(value, float) or isinstance(value, int) and value.bit_length() < 1000 else math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(ms) or ms < 0:
        raise TraceError(f"{where(path, line, 'timestamp')}: must be finite milliseconds >= 0, got "
                         f"{json_text(value)[:40]}")
    return float(ms)
