"""A ramp-up run read as a load curve: what the engine served while the rate rose.

`vllm bench serve --ramp-up-strategy` raises the request rate over one run so an operator can watch where
a server stops keeping up. `ramp_profile` cuts the run into equal shares of its requests in sending order
(each a span of the ramp's rates) and gives each its offered rate (its arrivals over their span), its served
rate (the completions of any request over that span shifted by the share's median latency, per second) and
its requests' mean latencies;
`knee` finds the share from which completions fall behind arrivals for good.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right

import numpy as np

from engine.core.metrics import RequestRecord
from workloads import RampUp

PROFILE_BINS = 10          # shares of the requests, in sending order
BEHIND = 0.9               # served below this share of the offered rate: falling behind
LASTING = 2                # ... in this many shares or more, to the ramp's end (one share may be noise)


def ramp_profile(records: list[RequestRecord], ramp: RampUp, bins: int = PROFILE_BINS) -> list[dict]:
    """Per share of the requests (in sending order): the ramp's rates over it, offered and served req/s over its
    span, and its completed requests' mean TTFT, TPOT and E2E (seconds; None where there are none)."""
    sent = sorted(records, key=lambda r: r.arrival)
    if len(sent) < 2 * bins:
        return []
    rates = ramp.rates(len(sent))
    finishes = sorted(r.finish for r in sent if r.completed)
    profile = []
    for part in np.array_split(np.arange(len(sent)), bins):
        first, last = sent[part[0]].arrival, sent[part[-1]].arrival
        span = last - first
        done = [sent[i] for i in part if sent[i].completed]
        # completions over the same span, one median latency later: what an engine that keeps up finishes
        # of these arrivals (unshifted, a rising ramp would look behind by the latency alone)
        lag = float(np.median([r.e2e for r in done])) if done else 0.0
        served = bisect_right(finishes, last + lag) - bisect_left(finishes, first + lag)
        tpots = [r.tpot for r in done if r.tpot is not None]
        profile.append({
            "rate_from": float(rates[part[0]]), "rate_to": float(rates[part[-1]]), "requests": len(part),
            "offered_rate": (len(part) - 1) / span if span > 0 else None,
            "served_rate": served / span if span > 0 else None,
            "ttft_mean": _mean([r.ttft for r in done]), "tpot_mean": _mean(tpots),
            "e2e_mean": _mean([r.e2e for r in done]),
        })
    return profile


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def knee(profile: list[dict]) -> int | None:
    """The first share from which every later one, LASTING or more of them, served less than BEHIND of what it
    was offered (None: the engine kept up to the end of the ramp)."""
    first = None
    for k, part in enumerate(profile):
        offered, served = part["offered_rate"], part["served_rate"]
        behind = offered is not None and served is not None and served < BEHIND * offered
        first = (k if first is None else first) if behind else None
    return first if first is not None and len(profile) - first >= LASTING else None


def ramp_line(profile: list[dict]) -> str | None:
    """The load curve in one sentence, for the verdict: how the latencies grew and whether completions kept
    pace with arrivals."""
    if not profile:
        return None
    start, end = profile[0], profile[-1]
    moved = [f"{name} {_ms(start[key])} to {_ms(end[key])}" for name, key in
             (("TTFT", "ttft_mean"), ("TPOT", "tpot_mean")) if start[key] is not None and end[key] is not None]
    k = knee(profile)
    pace = (f"completions kept pace with arrivals to its end ({end['rate_to']:.3g} req/s)" if k is None else
            f"completions fell behind arrivals from about {profile[k]['rate_from']:.3g} req/s (its last tenth "
            f"served {end['served_rate']:.3g} of the {end['offered_rate']:.3g} req/s offered)")
    means = f" (mean {', '.join(moved)}, first tenth to last)" if moved else ""
    return f"Over the ramp{means} {pace}."


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"
