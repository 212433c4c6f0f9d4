"""Long-tailed token-length distributions, filtered the way vLLM's benchmarks filter.

No dataset ships with the project, so ShareGPT- and Alpaca-like lengths come
from a parametric stand-in: a length is ``round(exp(mu + sigma * Z))`` with Z
standard normal (a discretised lognormal), and a (prompt, output) pair is kept
only if it passes vLLM's ShareGPT filter (``benchmarks/benchmark_serving.py``):
prompt >= 4 and output >= 4 tokens, prompt <= 1024, prompt + output <= 2048.

The filter shifts the means, so ``mu`` is solved for the means AFTER the
filter.  ``solve_mus`` does that exactly (the discrete distribution has at most
2048 support points, so the filtered means are finite sums, not Monte Carlo);
it was run once and its results are the constants in ``generators.py``; a test
checks that they still agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# vLLM's benchmark filter (sample_sharegpt_requests): drop pairs that are too
# short to be meaningful or would not fit a 2048-token model.
MIN_LEN = 4
MAX_PROMPT_LEN = 1024
MAX_TOTAL_LEN = 2048


@dataclass(frozen=True)
class LengthFilter:
    min_len: int = MIN_LEN
    max_prompt_len: int = MAX_PROMPT_LEN
    max_total_len: int = MAX_TOTAL_LEN

    def keep(self, prompt: np.ndarray, output: np.ndarray) -> np.ndarray:
        """Boolean mask of the pairs the filter keeps (vectorised)."""
        return (
            (prompt >= self.min_len)
            & (output >= self.min_len)
            & (prompt <= self.max_prompt_len)
            & (prompt + output <= self.max_total_len)
        )


VLLM_FILTER = LengthFilter()


def lognormal_lengths(rng: np.random.Generator, mu: float, sigma: float, size: int) -> np.ndarray:
    """Integer lengths round(exp(mu + sigma Z)); huge draws are capped so the cast is safe."""
    x = np.exp(np.minimum(mu + sigma * rng.standard_normal(size), 30.0))
    return np.rint(x).astype(np.int64)


def sample_filtered_pairs(
    rng: np.random.Generator,
    n: int,
    prompt_mu: float,
    prompt_sigma: float,
    output_mu: float,
    output_sigma: float,
    lfilter: LengthFilter = VLLM_FILTER,
) -> tuple[np.ndarray, np.ndarray]:
    """n (prompt, output) pairs from independent lognormals, rejected by the filter.

    Draws in batches (with headroom for the rejection rate) until n pairs are
    kept, in draw order.  Prompts and outputs come from two child streams of
    ``rng``, so pair i is the same whatever the batch sizes: the first k pairs
    of a draw of n are a draw of k (a short trace is a prefix of a long one).
    """
    prompt_rng, output_rng = rng.spawn(2)
    prompts: list[np.ndarray] = []
    outputs: list[np.ndarray] = []
    have = 0
    while have < n:
        batch = max(64, int((n - have) * 1.25))
        p = lognormal_lengths(prompt_rng, prompt_mu, prompt_sigma, batch)
        o = lognormal_lengths(output_rng, output_mu, output_sigma, batch)
        keep = lfilter.keep(p, o)
        prompts.append(p[keep])
        outputs.append(o[keep])
        have += int(keep.sum())
    if not prompts:                       # n == 0
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    return np.concatenate(prompts)[:n], np.concatenate(outputs)[:n]


# --- exact filtered means, for calibration -----------------------------------

_erf = np.vectorize(math.erf, otypes=[float])


def _rounded_lognormal_pmf(mu: float, sigma: float, kmax: int) -> np.ndarray:
    """P(round(exp(mu + sigma Z)) = k) for k = 0..kmax."""
    edges = np.arange(0, kmax + 2) - 0.5  # k rounds from [k - .5, k + .5)
    log_edges = np.log(np.maximum(edges, 1e-300))
    cdf = 0.5 * (1.0 + _erf((log_edges - mu) / (sigma * math.sqrt(2.0))))
    cdf[0] = 0.0  # the lognormal has no mass below 0
    return np.diff(cdf)


def filtered_means(
    prompt_mu: float,
    prompt_sigma: float,
    output_mu: float,
    output_sigma: float,
    lfilter: LengthFilter = VLLM_FILTER,
) -> tuple[float, float, float]:
    """(mean prompt, mean output, acceptance rate) of sample_filtered_pairs, exactly."""
    kmax = lfilter.max_total_len
    a = _rounded_lognormal_pmf(prompt_mu, prompt_sigma, kmax)
    b = _rounded_lognormal_pmf(output_mu, output_sigma, kmax)
    k = np.arange(kmax + 1)
    out_cdf = np.cumsum(b)  # P(O <= m)
    out_partial_mean = np.cumsum(k * b)  # E[O; O <= m]
    lo = lfilter.min_len - 1
    hi = np.clip(lfilter.max_total_len - k, 0, kmax)  # largest output a prompt k allows
    prompt_ok = (k >= lfilter.min_len) & (k <= lfilter.max_prompt_len)
    weight = np.where(prompt_ok, a * np.maximum(out_cdf[hi] - out_cdf[lo], 0.0), 0.0)
    out_mass = np.where(prompt_ok, a * np.maximum(out_partial_mean[hi] - out_partial_mean[lo], 0.0), 0.0)
    accept = weight.sum()
    return float((k * weight).sum() / accept), float(out_mass.sum() / accept), float(accept)


def solve_mus(
    prompt_mean: float,
    prompt_sigma: float,
    output_mean: float,
    output_sigma: float,
    lfilter: LengthFilter = VLLM_FILTER,
    iterations: int = 100,
) -> tuple[float, float]:
    """The (prompt_mu, output_mu) whose filtered means are the targets.

    A multiplicative fixed-point iteration: each filtered mean rises
    monotonically with its mu, and the coupling through the total-length
    filter is weak, so mu += log(target / mean) converges in a few dozen steps.
    """
    mp, mo = math.log(prompt_mean), math.log(output_mean)
    for _ in range(iterations):
        ep, eo, _ = filtered_means(mp, prompt_sigma, mo, output_sigma, lfilter)
        mp += math.log(prompt_mean / ep)
        mo += math.log(output_mean / eo)
    return mp, mo
