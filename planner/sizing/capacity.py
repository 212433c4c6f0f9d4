"""The capacity search of one configuration: bracket the highest rate that meets the SLOs, then bisect.

Without a hint it is `planner capacity`'s search (planner/sizing/bracket.py): from
`start`, double (or halve) the rate until the verdict flips, then bisect until
the bracket [good, bad) is within `rel_tol` of bad.

With a hint, the bracket a similar configuration ended with (same GPU and TP,
a neighbouring block size or batch limit), the search starts there: probe the
hint's good rate, then its bad one. When the capacity has not moved, two
probes close the bracket instead of the six to ten a search from scratch
takes. When it has, the step away from the hint doubles (in log-rate) each
time, then bisection closes the bracket as before. The hint only decides
where to probe, never the answer: every bracket end is a probe of this
configuration, so the result is as sound as the search from scratch, and
where the verdict is monotone in the rate both lie within `rel_tol` of the
same capacity.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat
from typing import Callable, Iterator

from planner.errors import PlannerError
from planner.runs.seeds import slo_probability
from planner.runs.spec import RunSpec
from planner.sizing.bracket import bracket, check_rates
from planner.sizing.probe import Probe


@dataclass(frozen=True)
class Hint:
    good: float | None          # the hinting configuration's capacity (None: it met the SLOs at no rate)
    bad: float | None           # its lowest failing rate above that (None: it met them at its highest rate)


@dataclass
class Capacity:
    rate: float | None          # the highest rate found to meet the SLOs (None: not even the lowest)
    bad: float | None           # the lowest rate above it found to miss them (None: none did)
    probes: list[Probe]
    bounded: bool               # False: the SLOs still held at max_rate

    @property
    def doc(self) -> dict | None:
        """The document of the probe at the capacity rate."""
        return next((p.doc for p in self.probes if p.ok and p.rate == self.rate), None)

    def hint(self) -> Hint:
        return Hint(self.rate, self.bad)


def search_capacity(probe: Callable[[float], Probe], *, start: float, min_rate: float, max_rate: float,
                    rel_tol: float, hint: Hint | None = None) -> Capacity:
    check_rates(start, min_rate, max_rate, rel_tol)
    probes: list[Probe] = []

    def ok(rate: float) -> bool:
        probes.append(probe(rate))
        return probes[-1].ok

    first, steps = _plan(start, min_rate, max_rate, rel_tol, hint)
    good, bad, bounded = bracket(ok, first=first, steps=steps, min_rate=min_rate, max_rate=max_rate,
                                 rel_tol=rel_tol)
    return Capacity(good, bad, probes, bounded=bounded)


def _plan(start: float, min_rate: float, max_rate: float, rel_tol: float,
          hint: Hint | None) -> tuple[float, Iterator[float]]:
    """The first rate to probe and the factors of the successive steps away from it."""
    if hint is None:
        return start, repeat(2.0)
    if hint.good is None:                  # the neighbour met the SLOs at no rate: start at the bottom
        return min_rate, repeat(2.0)
    first = min(max(hint.good, min_rate), max_rate)
    ratio = hint.bad / hint.good if hint.bad is not None and hint.bad > hint.good else 1 + rel_tol
    return first, _doubling(ratio)


def _doubling(ratio: float) -> Iterator[float]:
    """ratio, ratio^2, ratio^4, ...: the first step lands on the hint's bad rate, later ones gallop."""
    while True:
        yield ratio
        ratio = min(ratio * ratio, 2.0 ** 16)


@dataclass
class CapacityResult:
    rate: float | None            # the highest rate found to meet the SLOs (None: not even the lowest)
    doc: dict | None              # its result document
    probes: list[tuple[float, bool, dict]]   # (rate, met, result document) in the order simulated
    bounded: bool                 # False: the SLOs still held at max_rate


def find_capacity(spec: RunSpec, slos: dict[str, float], *, start: float = 1.0, min_rate: float = 0.01,
                  max_rate: float = 256.0, rel_tol: float = 0.02,
                  on_probe: Callable[[float, bool, dict], None] | None = None, seeds: int = 1,
                  confidence: float = 0.9) -> CapacityResult:
    """Bracket the capacity by doubling or halving the rate from `start`, then bisect
    until the bracket is within `rel_tol`. Every probe replays the same seeded trace
    (same lengths, same arrival pattern) at its rate, so only the rate changes.
    With `seeds` > 1 each probe runs that many seeds, and a rate meets the SLOs
    when at least a fraction `confidence` of them do (planner/runs/seeds.py)."""
    check_rates(start, min_rate, max_rate, rel_tol)
    if not 0 < confidence <= 1:
        raise PlannerError(f"confidence must be in (0, 1], got {confidence}")
    spec.check()
    probes: list[tuple[float, bool, dict]] = []

    def probe(rate: float) -> bool:
        probability, docs = slo_probability(spec, rate, slos, seeds)
        doc = {**docs[0], "slo_probability": probability, "seeds": seeds}
        ok = probability >= confidence
        probes.append((rate, ok, doc))
        if on_probe is not None:
            on_probe(rate, ok, doc)
        return ok

    good, _, bounded = bracket(probe, first=start, steps=repeat(2.0), min_rate=min_rate, max_rate=max_rate,
                               rel_tol=rel_tol)
    if good is None or not bounded:
        return CapacityResult(good, probes[-1][2] if good is not None else None, probes, bounded=bounded)
    best = next(doc for r, ok, doc in probes if r == good and ok)
    return CapacityResult(good, best, probes, bounded=True)
