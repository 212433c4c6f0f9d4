"""Reading how much of each head a config's rotary embedding turns."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from planner.errors import PlannerError


def partial_rotary_dims(get: Callable[..., Any], head_size: Any, name: str) -> int:
    """The rotary dims per head a config's partial_rotary_factor gives (Phi-4-mini's 0.75, GLM-4.5's 0.5), or 0
    when the whole head turns. transformers 5 keeps the factor in rope_parameters; a config.json on the Hub
    has it at the top level."""
    rope = get("rope_parameters") or {}
    factor = (rope.get("partial_rotary_factor") if isinstance(rope, dict) else None) \
        or get("partial_rotary_factor") or 1.0
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise PlannerError(f"model {name!r}: partial_rotary_factor must be in (0, 1], got {factor!r}")
    return int(head_size * factor) if factor < 1 and isinstance(head_size, int) else 0
