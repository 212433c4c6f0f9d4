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

Reading is strict, so that a corrupt or mistaken file is refused rather than
simulated: the text must be UTF-8 (a BOM is skipped), a file must hold at
least one request, JSON booleans are not numbers, and times and sizes have
caps (MAX_ARRIVAL_TIME, MAX_TOKENS, MAX_SAMPLES) far above any real trace, so
a typo cannot make a run allocate without bound.  Every error is one line
naming the file, the line and the field.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any, Iterable, Iterator

from pydantic import ValidationError

from .errors import TraceError, where
from .schema import FIELDS, TraceRequest
from .text import ENCODING, text_lines

REQUIRED = ("arrival_time", "prompt_len", "output_len")   # request_id is optional

# Caps on what a file may ask for, far above real traces (the longest context
# windows are ~1e6 tokens; production traces span days), low enough that a
# typo is refused instead of exhausting memory or time.
MAX_ARRIVAL_TIME = 1e7       # seconds, ~115 days
MAX_TOKENS = 10_000_000      # prompt_len, output_len (prefix_len is at most prompt_len)
MAX_SAMPLES = 1024           # n, beam_width: sequences one request runs at once

_CAPS = (("arrival_time", MAX_ARRIVAL_TIME, "s"), ("prompt_len", MAX_TOKENS, "tokens"),
         ("output_len", MAX_TOKENS, "tokens"), ("n", MAX_SAMPLES, "sequences"),
         ("beam_width", MAX_SAMPLES, "sequences"), ("think_time", MAX_ARRIVAL_TIME, "s"))

# Fields that hold lists of integers: space-separated in a CSV cell.
ID_LIST_FIELDS = ("prompt_token_ids", "output_token_ids", "hash_ids")

# Fields for which pydantic's lax mode would take a JSON true/false as 1/0.
_NUMBER_FIELDS = {"arrival_time": "a number", "think_time": "a number"} | {
    name: "an integer" for name, info in TraceRequest.model_fields.items() if info.annotation is int
}


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


def json_text(value: Any) -> str:
    """A value as the file spells it: JSON for JSON scalars (true, null, 12.5, "ten"), else repr."""
    try:
        return json.dumps(value) if isinstance(value, (str, int, float, bool, type(None))) else repr(value)
    except ValueError:
        return repr(value)


# pydantic error types that get a plainer message than pydantic's own
_PLAIN = {
    "int_type": "must be an integer", "int_parsing": "must be an integer", "int_from_float": "must be an integer",
    "int_parsing_size": "must be an integer", "float_type": "must be a number", "float_parsing": "must be a number",
    "finite_number": "must be a finite number",
}


def validation_message(err: ValidationError) -> tuple[str, str]:
    """(field, message) of the first problem pydantic found."""
    first = err.errors()[0]
    field = ".".join(str(p) for p in first["loc"]) or "request"
    if first["type"] in _PLAIN:
        return field, f"{_PLAIN[first['type']]}, got {json_text(first['input'])}"
    msg = first["msg"].removeprefix("Value error, ")
    if "input" in first and first["type"] != "value_error" and not isinstance(first["input"], (dict, list)):
        msg = f"{msg} (got {first['input']!r})"
    return field, msg


def build_request(fields: dict, path: Path | str, line: int, names: dict[str, str] | None = None) -> TraceRequest:
    """The request of a file's line, or a TraceError naming the line and the field (by the file's own name for
    it: `names`, the schema's name -> the file's)."""
    names = names or {}
    try:
        req = TraceRequest.model_validate(fields)
    except ValidationError as err:
        field, msg = validation_message(err)
        raise TraceError(f"{where(path, line, names.get(field, field))}: {msg}") from None
    over = over_cap(req)
    if over is not None:
        field, problem = over
        raise TraceError(f"{where(path, line, names.get(field, field))}: {problem}")
    return req


def over_cap(req: TraceRequest) -> tuple[str, str] | None:
    """(field, '... is over the cap of ...') for the first of `req`'s fields past its cap, or None."""
    # one combined test on the hot path; the loop only runs to name the culprit
    if (req.arrival_time > MAX_ARRIVAL_TIME or req.prompt_len > MAX_TOKENS or req.output_len > MAX_TOKENS
            or req.n > MAX_SAMPLES or req.beam_width > MAX_SAMPLES or (req.think_time or 0.0) > MAX_ARRIVAL_TIME):
        for field, cap, unit in _CAPS:
            value = getattr(req, field)
            if value is not None and value > cap:
                shown = f"{value:g}" if isinstance(value, float) else f"{value:,}"
                return field, f"{shown} is over the cap of {cap:,.0f} {unit}"
    return None


def check_no_requests(numbered: list, path: Path | str) -> None:
    # an empty trace would "run" as 0 requests and report nothing: almost
    # always the wrong file or a failed export
    if not numbered:
        raise TraceError(f"{path}: no requests in it")


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


def first_object(path: Path) -> dict:
    """The JSON object on a file's first line that is not blank; {} where there is none or it does not parse
    (parse_jsonl then says what is wrong)."""
    for raw in text_lines(path):
        if raw.strip():
            try:
                obj = json.loads(raw)
            except (ValueError, RecursionError):
                return {}
            return obj if isinstance(obj, dict) else {}
    return {}


def is_mooncake(first: dict) -> bool:
    """Whether a JSON Lines file whose first object is `first` is a Mooncake trace (workloads/mooncake.py), not
    one of ours."""
    return "input_length" in first and "prompt_len" not in first


def parse_jsonl(path: Path) -> tuple[list[TraceRequest], str | None, dict]:
    name, params = None, {}
    numbered: list[tuple[int, TraceRequest]] = []
    for line_no, raw in enumerate(text_lines(path), start=1):
        if not raw.strip():
            continue
        obj = json_object(raw, path, line_no)
        if "trace" in obj:
            if numbered or name is not None:
                raise TraceError(f"{where(path, line_no, 'trace')}: the metadata line must be the first line")
            name, params = _metadata(obj, path, line_no)
            continue
        if "true" in raw or "false" in raw:   # a cheap test first: most lines hold no literal
            _refuse_boolean(obj, path, line_no)
        if "request_id" not in obj:
            obj = {"request_id": default_request_id(path, len(numbered))} | obj
        numbered.append((line_no, build_request(obj, path, line_no)))
    check_no_requests(numbered, path)
    check_order(numbered, path)
    return [req for _, req in numbered], name, params


_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
               bool: "a boolean", type(None): "null"}


def json_object(raw: str, path: Path, line_no: int) -> dict:
    """The JSON object on one line."""
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as err:
        raise TraceError(f"{where(path, line_no)}: invalid JSON: {err.msg} (column {err.colno}){_json_hint(raw)}") from None
    except RecursionError:
        raise TraceError(f"{where(path, line_no)}: invalid JSON: nested too deeply") from None
    except ValueError as err:   # an integer of more than 4300 digits
        raise TraceError(f"{where(path, line_no)}: invalid JSON: {str(err).splitlines()[0]}") from None
    if not isinstance(obj, dict):
        hint = " (a JSON Lines trace holds one request object per line)"
        raise TraceError(f"{where(path, line_no)}: expected a JSON object, got {_JSON_TYPES[type(obj)]}{hint}")
    return obj


def _json_hint(raw: str) -> str:
    """Why a line might not parse, for the files users most often mistake for JSON Lines."""
    text = raw.strip()
    if text in ("[", "{"):
        return " (a JSON document over several lines? a JSON Lines trace holds one request per line)"
    if text.startswith("{") and text.endswith(","):
        return " (one object per line, with no comma after it)"
    if "{" not in text and "," in text:
        return " (a CSV file? name it .csv)"
    return ""


def _metadata(obj: dict, path: Path, line_no: int) -> tuple[str, dict]:
    """(name, params) of the ``{"trace": {"name": ..., "params": {...}}}`` line."""
    extra = sorted(set(obj) - {"trace"})
    if extra:
        raise TraceError(f"{where(path, line_no, extra[0])}: the metadata line holds only 'trace'")
    meta = obj["trace"]
    if not isinstance(meta, dict):
        raise TraceError(f"{where(path, line_no, 'trace')}: metadata must be an object")
    name, params = meta.get("name", ""), meta.get("params") or {}
    if not isinstance(name, str):
        raise TraceError(f"{where(path, line_no, 'trace.name')}: must be a string, got {json_text(name)}")
    if not isinstance(params, dict):
        raise TraceError(f"{where(path, line_no, 'trace.params')}: must be an object, got {json_text(params)}")
    return name, params


def _refuse_boolean(obj: dict, path: Path, line_no: int) -> None:
    """JSON true/false in a number field: pydantic would read it as 1/0."""
    for field, value in obj.items():
        if isinstance(value, bool) and field in _NUMBER_FIELDS:
            raise TraceError(f"{where(path, line_no, field)}: must be {_NUMBER_FIELDS[field]}, got {json_text(value)}")


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
            elif field in ID_LIST_FIELDS:
                row.append(" ".join(map(str, value)))
            else:
                row.append(repr(value) if isinstance(value, float) else str(value))
        writer.writerow(row)
    return buf.getvalue()


def csv_rows(path: Path | str) -> Iterator[tuple[int, list[str]]]:
    """(line number, cells) of each row that is not blank; the number is the line the row starts on.

    strict: a stray or unterminated quote is an error, not a silently merged row.
    """
    reader = csv.reader(text_lines(path, newline=""), strict=True)
    start = 1
    while True:
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            raise TraceError(f"{where(path, start)}: not valid CSV: {err}{_csv_hint(path, err)}") from None
        if any(c.strip() for c in cells):
            yield start, cells
        start = reader.line_num + 1


def _csv_hint(path: Path | str, err: csv.Error) -> str:
    """Why the csv module gave up, for the usual mistakes (read again: this is the error path)."""
    with open(path, encoding=ENCODING, errors="replace") as fh:
        if fh.readline().lstrip().startswith("{"):
            return " (a JSON Lines file? name it .jsonl)"
    return " (a quote that is never closed?)" if "end of data" in str(err) else ""


def csv_header(path: Path | str, rows: Iterator[tuple[int, list[str]]], required: Iterable[str],
               all_named: bool = True) -> tuple[list[str], int]:
    """The header (stripped cells) and its line; refuses a missing, repeated or (all_named) unnamed column."""
    line, header = next(rows, (1, []))
    header = [h.strip() for h in header]
    if not header:
        raise TraceError(f"{path}: no requests in it")
    for col in required:
        if col not in header:
            raise TraceError(f"{where(path, line, col)}: missing column (header has {', '.join(header)}){_header_hint(header)}")
    for i, col in enumerate(header):
        if all_named and not col:
            raise TraceError(f"{where(path, line)}: column {i + 1} has no name (an index column? a trailing comma?)")
        if col and (col in required or all_named) and header.index(col) != i:
            raise TraceError(f"{where(path, line, col)}: column appears twice (columns {header.index(col) + 1} and {i + 1})")
    return header, line


def _header_hint(header: list[str]) -> str:
    """Why a header lacks a column, for the usual mistakes."""
    if header[0].startswith("{"):
        return " (a JSON Lines file? name it .jsonl)"
    if len(header) == 1 and any(sep in header[0] for sep in ";\t|"):
        return " (columns are separated by commas)"
    try:
        float(header[0])
    except ValueError:
        return ""
    return " (the first line must be the header, e.g. arrival_time,prompt_len,output_len)"


def read_csv_header(path: Path) -> list[str]:
    """The header cells of a CSV file, stripped (empty for a file with no rows)."""
    _, header = next(csv_rows(path), (1, []))
    return [h.strip() for h in header]


def parse_csv(path: Path) -> list[TraceRequest]:
    numbered: list[tuple[int, TraceRequest]] = []
    rows = csv_rows(path)
    header, header_line = csv_header(path, rows, REQUIRED)
    unknown = [c for c in header if c not in FIELDS]
    if unknown:
        raise TraceError(f"{where(path, header_line, unknown[0])}: unknown column (known: {', '.join(FIELDS)})")
    for line_no, cells in rows:
        if len(cells) != len(header):
            raise TraceError(f"{where(path, line_no)}: row has {len(cells)} cells, header has {len(header)}")
        fields: dict[str, Any] = {}
        for col, cell in zip(header, cells):
            cell = cell.strip()
            if cell == "":
                continue  # the default (or a missing required field, which pydantic names)
            if col in ID_LIST_FIELDS:
                try:
                    fields[col] = [int(tok) for tok in cell.split()]
                except ValueError:
                    raise TraceError(f"{where(path, line_no, col)}: not space-separated integers") from None
            else:
                fields[col] = cell
        fields.setdefault("request_id", default_request_id(path, len(numbered)))
        numbered.append((line_no, build_request(fields, path, line_no)))
    check_no_requests(numbered, path)
    check_order(numbered, path)
    return [req for _, req in numbered]
