"""Arrival processes: rates, burstiness, bounds."""

import math

import numpy as np
import pytest

from workloads import TraceError, arrival_times, make_trace


def rng(seed=0):
    return np.random.default_rng(seed)


def measured_rate(times):
    return (len(times) - 1) / (times[-1] - times[0])


@pytest.mark.parametrize("rate", [0.5, 4.0, 30.0])
def test_poisson_mean_rate_within_3_percent(rate):
    times = arrival_times(rng(), arrival="poisson", rate=rate, num_requests=20_000)
    assert times[0] == 0.0 and np.all(np.diff(times) >= 0)
    assert measured_rate(times) == pytest.approx(rate, rel=0.03)
    gaps = np.diff(times)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # exponential gaps: cv 1


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_rate_and_burstiness(cv):
    times = arrival_times(rng(1), arrival="gamma", rate=5.0, cv=cv, num_requests=50_000)
    gaps = np.diff(times)
    assert measured_rate(times) == pytest.approx(5.0, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.1)


@pytest.mark.parametrize("arrival,cv", [("poisson", 1.0), ("gamma", 2.0)])
def test_n_requests_span_what_vllm_bench_gives_them(arrival, cv):
    # vllm bench serve scales its N gaps so the last request goes at N/rate: every seed's load has the rate
    # asked for (an unscaled Poisson sum of 1,000 gaps strays by about sqrt(1000) = 32 gaps)
    for seed in range(20):
        times = arrival_times(rng(seed), arrival=arrival, rate=4.0, cv=cv, num_requests=1000)
        assert times[0] == 0.0 and np.all(np.diff(times) >= 0)
        assert 1000 / 4.0 - 10 / 4.0 < times[-1] < 1000 / 4.0     # N/rate less the first gap


def test_constant_and_all_at_once():
    times = arrival_times(rng(), arrival="constant", rate=4.0, num_requests=9)
    assert times.tolist() == [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0]
    assert arrival_times(rng(), rate=math.inf, num_requests=5).tolist() == [0.0] * 5


def test_duration_bounds_the_trace():
    times = arrival_times(rng(), arrival="constant", rate=5.0, duration=10.0)
    assert len(times) == 50 and times[-1] == 9.8
    hour = arrival_times(rng(), arrival="poisson", rate=2.0, duration=3600.0)
    assert hour[-1] < 3600.0 and len(hour) == pytest.approx(7200, rel=0.03)
    both = arrival_times(rng(), arrival="poisson", rate=2.0, duration=3600.0, num_requests=100)
    assert len(both) == 100


def test_trace_level_rate():
    trace = make_trace("alpaca", duration=3600.0, rate=3.0, seed=2)
    assert trace.stats()["arrival_rate"] == pytest.approx(3.0, rel=0.03)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(rate=-1.0, num_requests=5), "rate"),
        (dict(rate=0.0, num_requests=5), "rate"),
        (dict(rate=float("nan"), num_requests=5), "rate"),
        (dict(rate=1.0, arrival="gamma", cv=0.0, num_requests=5), "cv"),
        (dict(rate=1.0, arrival="weibull", num_requests=5), "arrival"),
        (dict(rate=math.inf, duration=10.0), "num_requests"),
        (dict(rate=1.0), "num_requests/duration"),
        (dict(rate=1.0, duration=-1.0), "duration"),
    ],
)
def test_bad_arguments(kwargs, field):
    with pytest.raises(TraceError, match=f"^{field}:"):
        arrival_times(rng(), **kwargs)
