"""Arrival processes: when requests reach the server.

The first request arrives at t = 0 and each later one a gap after the one
before.  Gaps are:

- ``poisson``: exponential with mean 1/rate (the PagedAttention paper's set-up);
- ``gamma``: gamma with mean 1/rate and coefficient of variation ``cv``
  (shape 1/cv^2): cv > 1 is burstier than Poisson, cv < 1 more regular, and
  cv = 1 is Poisson again;
- ``constant``: exactly 1/rate.

vLLM's benchmark names the gamma process by its shape, ``--burstiness B``
(gaps gamma with shape B and mean 1/rate: cv = 1/sqrt(B)); ``burstiness_arrival``
turns B into these keywords.

``rate = inf`` puts every request at t = 0 (an offline batch).  A trace is
bounded by a request count, a duration, or both (whichever ends it first).

A trace of N requests (no duration) is timed as ``vllm bench serve`` has timed
its N prompts since vLLM 0.10 (vllm/benchmarks/serve.py, ``get_request``): N
gaps drawn, their running sum scaled so that the last request goes at exactly
N/rate ("to close the gap for stabilizing the throughput data from different
random seeds"), here shifted by the first gap so the first goes at t = 0.  The
load's mean rate is then the rate asked for, not a draw 1/sqrt(N) around it.
A trace bounded by a duration is the process itself, cut at the duration.

``vllm bench serve --ramp-up-strategy linear|exponential --ramp-up-start-rps A
--ramp-up-end-rps B`` (``RampUp``) sends request i of N at a rate that grows
with i / (N - 1) from A to B, straight or geometrically; each gap is drawn at
its request's rate (with the burstiness's shape), and vLLM leaves these gaps
unscaled.  It needs a request count and no rate of its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .errors import TraceError

PROCESSES = ("poisson", "gamma", "constant")

# Times are stored to the microsecond: plenty for a serving trace, and it keeps
# trace files short and identical across platforms.
TIME_DECIMALS = 6
MIN_CV, MAX_CV = 1e-6, 1e6      # a gamma process's coefficient of variation: near-constant to wildly bursty
MIN_BURSTINESS, MAX_BURSTINESS = 1 / MAX_CV**2, 1 / MIN_CV**2    # the gamma's shape 1 / cv^2 over that range


def burstiness_arrival(burstiness: float, rate: float | None) -> dict:
    """vllm bench serve's ``--burstiness B`` at ``rate`` as the arrival keywords of ``arrival_times`` and
    ``make_trace``: gaps gamma-distributed with shape B and mean 1/rate (vLLM draws gamma(B, 1/(rate B))), so
    1 is Poisson (no keywords: the default), below 1 burstier and above 1 more regular. Any B but 1 needs a
    finite rate to shape."""
    if (isinstance(burstiness, bool) or not isinstance(burstiness, (int, float))
            or not MIN_BURSTINESS <= burstiness <= MAX_BURSTINESS):
        raise TraceError(f"burstiness: must be a number from {MIN_BURSTINESS:g} to {MAX_BURSTINESS:g} (the gamma "
                         f"shape of the gaps between arrivals; 1 is Poisson), got {burstiness!r}")
    if burstiness == 1:
        return {}
    if rate is None or not math.isfinite(rate):
        raise TraceError(f"burstiness: {burstiness:g} shapes the gaps between arrivals at a finite request rate; "
                         f"give one (a closed loop alone, every request at once and a trace file's own times "
                         f"have none)")
    return {"arrival": "gamma", "cv": 1.0 / math.sqrt(burstiness)}


RAMP_UP_STRATEGIES = ("linear", "exponential")


@dataclass(frozen=True)
class RampUp:
    """vllm bench serve's ramp-up (vllm/benchmarks/serve.py, ``_get_current_request_rate``): request i of N is
    sent at ``start + (end - start) p`` (linear) or ``start (end / start)^p`` (exponential) req/s, p = i / (N - 1)."""

    strategy: str
    start_rps: float
    end_rps: float

    def check(self) -> None:
        """vLLM bench's own refusals, in one line each (a rate of 0 it would divide by, so refused here too)."""
        if self.strategy not in RAMP_UP_STRATEGIES:
            raise TraceError(f"ramp-up strategy: expected one of {', '.join(RAMP_UP_STRATEGIES)}, got "
                             f"{self.strategy!r}")
        for name, rps in (("start", self.start_rps), ("end", self.end_rps)):
            if isinstance(rps, bool) or not isinstance(rps, (int, float)) or not 0 < rps < math.inf:
                raise TraceError(f"ramp-up {name} rps: must be a number > 0 requests/s, got {rps!r}")
        if self.start_rps > self.end_rps:
            raise TraceError(f"ramp-up: the start rate ({self.start_rps:g} req/s) must not be above the end rate "
                             f"({self.end_rps:g} req/s)")

    def rates(self, count: int) -> np.ndarray:
        """The rate (req/s) each of `count` requests is sent at, in order."""
        progress = np.arange(count) / max(count - 1, 1)
        if self.strategy == "linear":
            return self.start_rps + (self.end_rps - self.start_rps) * progress
        return self.start_rps * (self.end_rps / self.start_rps) ** progress

    def describe(self) -> str:
        return f"{self.strategy} ramp-up from {self.start_rps:g} to {self.end_rps:g} req/s"

    def record(self) -> dict:
        """vllm bench's result keys for it."""
        return {"ramp_up_strategy": self.strategy, "ramp_up_start_rps": self.start_rps,
                "ramp_up_end_rps": self.end_rps}


def check_ramp_up(ramp_up: RampUp, rate: float, num_requests: int | None, duration: float | None) -> None:
    ramp_up.check()
    if math.isfinite(rate):
        raise TraceError(f"rate: a ramp-up sets the request rate; give no rate of its own (got {rate:g} req/s)")
    if num_requests is None or duration is not None:
        raise TraceError("ramp-up: it raises the rate request by request towards the last of N; give a request "
                         "count and no duration")


def check_arrival_args(arrival: str, rate: float, cv: float, num_requests: int | None, duration: float | None) -> None:
    if arrival not in PROCESSES:
        raise TraceError(f"arrival: unknown process {arrival!r}; expected one of {', '.join(PROCESSES)} or 'trace'")
    if math.isnan(rate) or rate <= 0:
        raise TraceError(f"rate: must be > 0 requests/s (inf for all at once), got {rate}")
    if arrival == "gamma" and not MIN_CV <= cv <= MAX_CV:     # (the gamma's shape 1 / cv^2 must stay a number)
        raise TraceError(f"cv: must be a number from {MIN_CV:g} to {MAX_CV:g}, got {cv}")
    if num_requests is None and duration is None:
        raise TraceError("num_requests/duration: give a request count, a duration, or both")
    if num_requests is not None and num_requests < 0:
        raise TraceError(f"num_requests: must be >= 0, got {num_requests}")
    if duration is not None and not (duration >= 0 and math.isfinite(duration)):
        raise TraceError(f"duration: must be a finite number >= 0 s, got {duration}")
    if math.isinf(rate) and num_requests is None:
        raise TraceError("num_requests: rate=inf puts every request at t=0, so a duration cannot bound the trace")


def _gaps(rng: np.random.Generator, arrival: str, rate: float | np.ndarray, cv: float, size: int) -> np.ndarray:
    """`size` gaps at `rate` (one rate, or each gap's own)."""
    if arrival == "poisson":
        return rng.exponential(1.0 / rate, size)
    if arrival == "gamma":
        shape = 1.0 / (cv * cv)
        return rng.gamma(shape, 1.0 / (rate * shape), size)
    return np.broadcast_to(1.0 / rate, (size,)).astype(float)


def arrival_times(
    rng: np.random.Generator,
    *,
    arrival: str = "poisson",
    rate: float = math.inf,
    cv: float = 1.0,
    num_requests: int | None = None,
    duration: float | None = None,
    ramp_up: RampUp | None = None,
) -> np.ndarray:
    """Sorted arrival times (s) starting at 0, bounded by num_requests and/or duration.

    With a duration, only arrivals strictly before it are kept; without, the
    count's gaps are scaled as vllm bench scales them (the module docstring).
    A ramp-up (no rate of its own) draws each gap at its request's rate, unscaled.
    """
    if ramp_up is not None:
        check_ramp_up(ramp_up, rate, num_requests, duration)
        check_arrival_args(arrival, ramp_up.start_rps, cv, num_requests, duration)
        sent = np.cumsum(_gaps(rng, arrival, ramp_up.rates(num_requests), cv, num_requests))
        return np.round(sent - sent[0], TIME_DECIMALS) if num_requests else np.zeros(0)
    check_arrival_args(arrival, rate, cv, num_requests, duration)
    if math.isinf(rate):
        return np.zeros(num_requests, dtype=float)
    if duration is None:
        if num_requests == 0:
            return np.zeros(0)
        sent = np.cumsum(_gaps(rng, arrival, rate, cv, num_requests))
        if sent[-1] > 0:         # (a very bursty gamma's gaps can all underflow to 0: vLLM skips the scaling too)
            sent *= (num_requests / rate) / sent[-1]
        return np.round(sent - sent[0], TIME_DECIMALS)
    limit = num_requests if num_requests is not None else math.inf
    # draw in chunks: the whole count when it is known, else a bit more than
    # the expected count in the duration, so one chunk almost always suffices
    chunk = int(min(limit, (duration or 0.0) * rate * 1.2 + 16))
    parts = [np.zeros(1)]  # t_0 = 0
    count, last = 1, 0.0
    while count < limit and (duration is None or last < duration):
        stamps = last + np.cumsum(_gaps(rng, arrival, rate, cv, max(chunk, 1)))
        parts.append(stamps)
        count += len(stamps)
        last = float(stamps[-1])
    # round before bounding, so a stamp that prints as the duration is not kept
    times = np.round(np.concatenate(parts), TIME_DECIMALS)
    if duration is not None:
        times = times[times < duration]
    if num_requests is not None:
        times = times[:num_requests]
    return times
