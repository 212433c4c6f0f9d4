"""The JSON documents the planner writes: their schema version, and values JSON can hold.

Every result file (result.json, sweep.json, capacity.json, search.json,
comparison.json) carries `schema_version`; docs/results.md documents each
field. Bump the major version when a field changes meaning or disappears,
the minor one when fields are added.
"""
from __future__ import annotations

import math

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
