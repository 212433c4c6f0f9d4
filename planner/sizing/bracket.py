"""The capacity search `planner capacity` and `planner search` share: bracket the highest request
rate that meets the SLOs, then bisect.

From the first rate, step up (while the SLOs hold) or down (while they fail)
by the factors `steps` yields until the verdict flips, within [min_rate,
max_rate]; then bisect until the bracket [good, bad) is within `rel_tol` of
bad. `planner capacity` steps by 2; `planner search` may start from a similar
configuration's bracket and gallop away from it (planner/sizing/capacity.py).
"""
from __future__ import annotations

import math
from typing import Callable, Iterator

from planner.errors import PlannerError


MAX_RATE = 1e6                   # req/s: the highest rate a capacity search may try
MIN_RATE = 0.01                  # req/s: the lowest (or the start, if lower)


def lowest_rate(start: float) -> float:
    return min(MIN_RATE, start)


def check_rates(start: float, min_rate: float, max_rate: float, rel_tol: float) -> None:
    if not 0 < min_rate <= start <= max_rate < math.inf:      # an infinite rate is a burst, not a rate to find
        raise PlannerError(f"need 0 < min rate ({min_rate}) <= start ({start}) <= max rate ({max_rate}), all "
                           f"finite")
    if max_rate > MAX_RATE:      # a search doubling its way up to 1e308 probes a thousand rates
        raise PlannerError(f"max rate {max_rate:g} req/s: give at most {MAX_RATE:,.0f}, beyond any one deployment's "
                           f"or fleet's load")
    if not 0 < rel_tol < 1:
        raise PlannerError(f"tolerance must be in (0, 1), got {rel_tol}")


def bracket(ok: Callable[[float], bool], *, first: float, steps: Iterator[float], min_rate: float,
            max_rate: float, rel_tol: float) -> tuple[float | None, float | None, bool]:
    """(good, bad, bounded): the highest rate found to meet the SLOs (None: not even min_rate),
    the lowest found above it to miss them (None: none did), and False when they still held
    at max_rate. `ok(rate)` probes one rate."""
    good = bad = None
    rate = first
    if ok(rate):
        good = rate
        while bad is None:
            if rate >= max_rate:
                return good, None, False
            rate = min(rate * next(steps), max_rate)
            if ok(rate):
                good = rate
            else:
                bad = rate
    else:
        bad = rate
        while good is None:
            if rate <= min_rate:
                return None, bad, True
            rate = max(rate / next(steps), min_rate)
            if ok(rate):
                good = rate
            else:
                bad = rate
    while (bad - good) / bad > rel_tol:
        mid = (good + bad) / 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good, bad, True
