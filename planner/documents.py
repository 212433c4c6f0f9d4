"""The JSON documents the planner writes: their schema version, and values JSON can hold.

Every result file (result.json, sweep.json, capacity.json, search.json,
comparison.json) carries `schema_version`; docs/results.md documents each
field. Bump the major version when a field changes meaning or disappears,
the minor one when fields are added.
"""
from __future__ import annotations

import json
import math
import sys

SCHEMA_VERSION = "1.1"


def json_safe(value):
    """NaN and infinity -> None, recursively (JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def read_json(text: str):
    """`text` as JSON, or a ValueError saying in one line why not (the decoder's words and line, a document
    nested too deeply, an integer of more than 4,300 digits), for the caller to name its file."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON (line {exc.lineno}: {exc.msg})") from None
    except RecursionError:
        raise ValueError("not valid JSON (nested too deeply)") from None
    except ValueError:      # (the only other refusal of json.loads: Python's cap on an integer's digits)
        raise ValueError(f"not valid JSON (an integer of more than {sys.get_int_max_str_digits():,} digits)") \
            from None
