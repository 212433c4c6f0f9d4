"""Service-level objectives: their one syntax, and whether a run meets them.

`--slo` takes '0.2' (normalized latency, s/token) or 'METRIC=SECONDS', several
separated by commas or given again ('ttft_p99=2,tpot_p99=0.1'), the same way
on every command.
"""
from __future__ import annotations

import math

from engine.core.metrics import failed_requests, slo_attainment
from planner.errors import PlannerError

SLO_METRICS = ("normalized_latency", *(f"{latency}_{statistic}" for latency in ("ttft", "tpot", "e2e")
                                       for statistic in ("mean", "median", "p90", "p95", "p99")),
               "itl_p90", "itl_p95", "itl_p99")


def parse_slos(texts: list[str]) -> dict[str, float]:
    """'0.2' (normalized latency, s/token) or 'METRIC=SECONDS', e.g. 'ttft_p99=2'; each text may hold
    several, comma-separated ('ttft_p99=2,tpot_p99=0.1')."""
    slos: dict[str, float] = {}
    for text in (part for given in texts for part in given.split(",") if part.strip()):
        name, sep, value = text.partition("=")
        if not sep:
            name, value = "normalized_latency", text
        name = name.strip()
        if name not in SLO_METRICS:
            statistics = [m for m in SLO_METRICS if m.startswith(name + "_")] if name else []
            choose = (f"say which statistic: {', '.join(statistics)}" if statistics
                      else f"choose one of {', '.join(SLO_METRICS)}")
            raise PlannerError(f"--slo {text!r}: unknown metric {name!r}; {choose}")
        try:
            limit = float(value)
        except ValueError:
            raise PlannerError(f"--slo {text!r}: {value!r} is not a number of seconds") from None
        if not 0 < limit < math.inf:
            raise PlannerError(f"--slo {text!r}: the limit must be a finite number of seconds > 0")
        slos[name] = limit
    if not slos:
        raise PlannerError("give at least one --slo, e.g. --slo 0.2 or --slo ttft_p99=2")
    return slos


def check_attainment(share: float | None) -> None:
    if share is not None and not 0 < share <= 1:
        raise PlannerError(f"--slo-attainment {share:g}: give the share of requests that must meet every SLO, "
                           f"in (0, 1], e.g. 0.9")


def meets(doc: dict, slos: dict[str, float], attainment: float | None = None) -> bool:
    """Every SLO holds, nothing was left undone (a run that rejected or truncated requests fails),
    and the engine keeps up: requests that keep piling up mean the SLOs hold only because the trace ends, and
    so may requests piling up on a window too short to tell (planner/analysis/verdict.py, `judge_growth`).

    With `attainment` (DistServe's SLO attainment), each SLO is a limit on every request instead (its statistic
    unused: ttft_p99=0.5 bounds each request's TTFT): at least that share of the submitted requests must be
    within all of them (a rejected or truncated request is not), and the engine must keep up."""
    verdict = doc.get("verdict") or {}
    if verdict.get("overloaded") or verdict.get("inconclusive"):
        return False
    if attainment is not None:
        share = slo_attainment(doc)
        return share is not None and share >= attainment
    if failed_requests(doc):
        return False
    return all(doc.get(name) is not None and doc[name] <= limit for name, limit in slos.items())
