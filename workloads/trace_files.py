"""Reading and writing traces: JSONL (the native format) and CSV.

JSONL: an optional first line ``{"trace": {"name": ..., "params": {...}}}``
with the metadata, then one request per line (fields left at their default
are omitted).  CSV: a header of TraceRequest field names (any subset that
includes the required ones, in any order), one request per row; token ids,
if any, are space-separated in one cell; an empty cell means the default.
In both, ``request_id`` may be left out: a request without one is named
``<file stem>-<position>`` (position from 0).  A CSV whose header has the
production columns (TIMESTAMP, ContextTokens, GeneratedTokens, as in Azure's
LLM inference traces) is read by ``importers.import_csv_trace`` instead.

Output is canonical (fixed key order, compact separators, times rounded to
the microsecond by the generators), so the same trace gives the same bytes.
Errors name the file, line and field.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any, Iterable

from pydantic import ValidationError

from .errors import TraceError, where
from .schema import FIELDS, TraceRequest

REQUIRED = ("arrival_time", "prompt_len", "output_len")   # request_id is optional


def default_request_id(path: Path | str, index: int) -> str:
    """The id of a request a file gives none: the file's stem and the request's position (from 0)."""
    return f"{Path(path).stem}-{index}"


def _plain(value: Any) -> Any:
    """Metadata made JSON-safe: non-finite floats become strings ('inf')."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def validation_message(err: ValidationError) -> tuple[str, str]:
    """(field, message) of the first problem pydantic found."""
    first = err.errors()[0]
    field = ".".join(str(p) for p in first["loc"]) or "request"
    msg = first["msg"].removeprefix("Value error, ")
    if "input" in first and first["type"] != "value_error" and not isinstance(first["input"], (dict, list)):
        msg = f"{msg} (got {first['input']!r})"
    return field, msg


def build_request(fields: dict, path: Path | str, line: int) -> TraceRequest:
    try:
        return TraceRequest.model_validate(fields)
    except ValidationError as err:
        field, msg = validation_message(err)
        raise TraceError(f"{where(path, line, field)}: {msg}") from None


def check_order(requests: Iterable[tuple[int, TraceRequest]], path: Path | str) -> None:
    """Arrival times must not decrease and request ids must be unique."""
    prev = -math.inf
    seen: set[str] = set()
    for line, req in requests:
        if req.arrival_time < prev:
            raise TraceError(
                f"{where(path, line, 'arrival_time')}: {req.arrival_time} is before the previous "
                f"request's {prev} (timestamps must not decrease)"
            )
        if req.request_id in seen:
            raise TraceError(f"{where(path, line, 'request_id')}: duplicate id {req.request_id!r}")
        prev = req.arrival_time
        seen.add(req.request_id)


# --- JSONL ---------------------------------------------------------------------


def dump_jsonl(requests: list[TraceRequest], name: str, params: dict) -> str:
    lines = [json.dumps({"trace": {"name": name, "params": _plain(params)}}, separators=(",", ":"), allow_nan=False)]
    for req in requests:
        lines.append(json.dumps(req.model_dump(exclude_defaults=True), separators=(",", ":")))
    return "\n".join(lines) + "\n"


def parse_jsonl(path: Path) -> tuple[list[TraceRequest], str | None, dict]:
    name, params = None, {}
    numbered: list[tuple[int, TraceRequest]] = []
    with open(path, encoding="utf-8") as fh:
        for line_no, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as err:
                raise TraceError(f"{where(path, line_no)}: invalid JSON: {err.msg} (column {err.colno})") from None
            if not isinstance(obj, dict):
                raise TraceError(f"{where(path, line_no)}: expected a JSON object, got {type(obj).__name__}")
            if "trace" in obj and not numbered and name is None:
                meta = obj["trace"]
                if not isinstance(meta, dict):
                    raise TraceError(f"{where(path, line_no, 'trace')}: metadata must be an object")
                name, params = str(meta.get("name", "")), dict(meta.get("params") or {})
                continue
            if "request_id" not in obj:
                obj = {"request_id": default_request_id(path, len(numbered))} | obj
            numbered.append((line_no, build_request(obj, path, line_no)))
    check_order(numbered, path)
    return [req for _, req in numbered], name, params


# --- CSV -----------------------------------------------------------------------


def dump_csv(requests: list[TraceRequest]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(FIELDS)
    for req in requests:
        row = []
        for field in FIELDS:
            value = getattr(req, field)
            if value is None:
                row.append("")
            elif field == "prompt_token_ids":
                row.append(" ".join(map(str, value)))
            else:
                row.append(repr(value) if isinstance(value, float) else str(value))
        writer.writerow(row)
    return buf.getvalue()


def read_csv_header(path: Path) -> list[str]:
    """The header cells of a CSV file, stripped (empty for an empty file)."""
    with open(path, newline="", encoding="utf-8") as fh:
        return [h.strip() for h in next(csv.reader(fh), [])]


def parse_csv(path: Path) -> list[TraceRequest]:
    numbered: list[tuple[int, TraceRequest]] = []
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = [h.strip() for h in next(reader, [])]
        for col in REQUIRED:
            if col not in header:
                raise TraceError(f"{where(path, 1, col)}: missing column (header has {', '.join(header) or 'nothing'})")
        unknown = [c for c in header if c not in FIELDS]
        if unknown:
            raise TraceError(f"{where(path, 1, unknown[0])}: unknown column")
        for cells in reader:
            line_no = reader.line_num
            if not any(c.strip() for c in cells):
                continue  # a blank line
            if len(cells) != len(header):
                raise TraceError(f"{where(path, line_no)}: row has {len(cells)} cells, header has {len(header)}")
            fields: dict[str, Any] = {}
            for col, cell in zip(header, cells):
                cell = cell.strip()
                if cell == "":
                    continue  # the default (or a missing required field, which pydantic names)
                if col == "prompt_token_ids":
                    try:
                        fields[col] = [int(tok) for tok in cell.split()]
                    except ValueError:
                        raise TraceError(f"{where(path, line_no, col)}: not space-separated integers") from None
                else:
                    fields[col] = cell
            fields.setdefault("request_id", default_request_id(path, len(numbered)))
            numbered.append((line_no, build_request(fields, path, line_no)))
    check_order(numbered, path)
    return [req for _, req in numbered]
