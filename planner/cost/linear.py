"""A what-if cost model: every step takes A + B x (tokens it schedules) seconds.

``--cost-model linear:A,B``. No hardware behind it: it is for checking the
scheduler against another simulator or a hand computation (the same trace,
cache size and step times must give the same decisions), and for asking how a
policy behaves when only the token count sets the pace.
"""
from __future__ import annotations

import math

from planner.cost.shape import StepShape
from planner.errors import PlannerError

PREFIX = "linear:"


class LinearCostModel:
    prices_each_context = False   # a step's time depends on its token count alone

    def __init__(self, base: float, per_token: float) -> None:
        if not (0 <= base < math.inf and 0 <= per_token < math.inf) or base + per_token <= 0:   # (NaN too)
            raise PlannerError(f"linear cost model: A and B must be finite, >= 0 and not both 0, got {base}, "
                               f"{per_token}")
        self.base, self.per_token = base, per_token
        self.name = f"linear({base:g},{per_token:g})"

    def step_time(self, shape: StepShape) -> float:
        if shape.is_empty:
            return 0.0
        return self.base + self.per_token * shape.total_tokens

    def describe(self) -> dict:
        return {"name": self.name, "source": "linear", "base_s": self.base, "per_token_s": self.per_token}


def parse_linear(option: str) -> LinearCostModel:
    """``linear:A,B`` -> LinearCostModel(A, B); a clear error for anything else."""
    if not option.startswith(PREFIX):
        raise PlannerError(f"--cost-model {option!r}: expected linear:A,B (seconds per step, seconds per token)")
    parts = option[len(PREFIX):].split(",")
    try:
        base, per_token = (float(p) for p in parts)
    except ValueError:
        raise PlannerError(f"--cost-model {option!r}: expected linear:A,B with two numbers, "
                           f"e.g. linear:0.005,0.0001") from None
    return LinearCostModel(base, per_token)
