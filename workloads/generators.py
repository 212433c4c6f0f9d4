"""Built-in workloads: name -> request lengths (and sharing) for a given count.

Each generator takes a numpy Generator and a count and returns one dict of
TraceRequest fields per request (everything but id and arrival time).
``make_trace`` (in ``make.py``) adds the arrivals.  Where a number comes from
is written next to it; the targets are the generated means, which the tests
hold to within 3% over 10,000 requests.
"""

from __future__ import annotations

import numpy as np

from .errors import TraceError
from .lengths import lognormal_lengths, sample_filtered_pairs

# --- ShareGPT / Alpaca ----------------------------------------------------------
# Targets: PagedAttention paper (Kwon et al., SOSP'23), Sec. 6.1 and Fig. 11:
# ShareGPT mean input 161.31 / output 337.99 tokens (long tail, high variance);
# Alpaca mean input 19.31 / output 58.45.  The paper gives means, not shapes,
# so each length is a discretised lognormal (lengths.py) whose sigma is our
# assumption, picked for the long right tail of Fig. 11, and whose mu was
# solved by lengths.solve_mus so that the means AFTER vLLM's filter (prompt,
# output >= 4; prompt <= 1024; prompt + output <= 2048) hit the targets:
#   solve_mus(161.31, 1.2, 337.99, 1.0) -> sharegpt mus below (keeps 95.2%)
#   solve_mus(19.31, 0.6, 58.45, 1.0)   -> alpaca mus below   (keeps 98.4%)
# Resulting medians: ShareGPT prompt ~96, output ~230; Alpaca 16 and 36.
SHAREGPT_TARGETS = (161.31, 337.99)
SHAREGPT_SIGMAS = (1.2, 1.0)
SHAREGPT_MUS = (4.601981420908086, 5.4557138234237605)
ALPACA_TARGETS = (19.31, 58.45)
ALPACA_SIGMAS = (0.6, 1.0)
ALPACA_MUS = (2.775858217561652, 3.5591285942242825)


def sharegpt_pairs(rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
    (pm, om), (ps, os_) = SHAREGPT_MUS, SHAREGPT_SIGMAS
    return sample_filtered_pairs(rng, count, pm, ps, om, os_)


def alpaca_pairs(rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
    (pm, om), (ps, os_) = ALPACA_MUS, ALPACA_SIGMAS
    return sample_filtered_pairs(rng, count, pm, ps, om, os_)


def _plain(prompts: np.ndarray, outputs: np.ndarray, **extra) -> list[dict]:
    return [{"prompt_len": int(p), "output_len": int(o), **extra} for p, o in zip(prompts, outputs)]


def gen_sharegpt(rng: np.random.Generator, count: int) -> list[dict]:
    return _plain(*sharegpt_pairs(rng, count))


def gen_alpaca(rng: np.random.Generator, count: int) -> list[dict]:
    return _plain(*alpaca_pairs(rng, count))


# --- parallel sampling and beam search --------------------------------------------
# Paper Sec. 6.3 / Fig. 14: Alpaca requests with parallel size or beam width
# 2, 4 or 6 on OPT-13B; the default 4 is the middle of that sweep.  n = 1 for
# beam search: the request returns its best beam, the width says how many
# candidates are kept while decoding.


def gen_parallel(rng: np.random.Generator, count: int, n: int = 4) -> list[dict]:
    if n < 1:
        raise TraceError(f"n: must be >= 1, got {n}")
    return _plain(*alpaca_pairs(rng, count), n=int(n))


def gen_beam(rng: np.random.Generator, count: int, beam_width: int = 4) -> list[dict]:
    if beam_width < 1:
        raise TraceError(f"beam_width: must be >= 1, got {beam_width}")
    return _plain(*alpaca_pairs(rng, count), beam_width=int(beam_width))


# --- shared prefix ----------------------------------------------------------------------
# Paper Sec. 6.4 / Fig. 16: LLaMA-13B translating WMT16 English->German with a
# 1-shot (80-token) or 5-shot (341-token) example prefix shared by all
# requests.  The unique part is the sentence to translate plus the template
# around it; the paper gives no sentence lengths, so these are our estimates:
# WMT16 news sentences average ~22 words, ~30 LLaMA tokens (lognormal,
# sigma 0.5, at least 4), the template ("English: ... German:") adds 6 tokens,
# and the German output is ~1.2x the English tokens (ratio lognormal, sigma 0.15).
PREFIX_LENS = {1: 80, 5: 341}
SOURCE_MEAN, SOURCE_SIGMA = 30.0, 0.5
TEMPLATE_TOKENS = 6
OUTPUT_RATIO_MEAN, OUTPUT_RATIO_SIGMA = 1.2, 0.15
PREFIX_TARGETS = (TEMPLATE_TOKENS + SOURCE_MEAN, OUTPUT_RATIO_MEAN * SOURCE_MEAN)  # (unique part, output)


def _lognormal_mu(mean: float, sigma: float) -> float:
    """mu of the lognormal with this mean: mean = exp(mu + sigma^2 / 2)."""
    return float(np.log(mean) - sigma * sigma / 2)


def gen_prefix(
    rng: np.random.Generator, count: int, shots: int = 1, prefix_len: int | None = None, num_prefixes: int = 1
) -> list[dict]:
    if prefix_len is None:
        if shots not in PREFIX_LENS:
            raise TraceError(f"shots: the paper's prefixes are 1-shot or 5-shot, got {shots} (or give prefix_len)")
        prefix_len = PREFIX_LENS[shots]
    if prefix_len < 0 or num_prefixes < 1:
        raise TraceError(f"prefix_len/num_prefixes: need prefix_len >= 0 and num_prefixes >= 1, got {prefix_len}, {num_prefixes}")
    # one child stream per quantity, so request i is the same whatever the count
    source_rng, ratio_rng, which_rng = rng.spawn(3)
    source = np.maximum(4, lognormal_lengths(source_rng, _lognormal_mu(SOURCE_MEAN, SOURCE_SIGMA), SOURCE_SIGMA, count))
    ratio = np.exp(_lognormal_mu(OUTPUT_RATIO_MEAN, OUTPUT_RATIO_SIGMA) + OUTPUT_RATIO_SIGMA * ratio_rng.standard_normal(count))
    output = np.maximum(4, np.rint(source * ratio)).astype(np.int64)
    which = which_rng.integers(0, num_prefixes, count)
    return [
        {
            "prompt_len": int(prefix_len + TEMPLATE_TOKENS + s),
            "output_len": int(o),
            "prefix_id": f"prefix-{prefix_len}-{k}",
            "prefix_len": int(prefix_len),
        }
        for s, o, k in zip(source, output, which)
    ]


# --- synthetic sweeps ---------------------------------------------------------------------


def gen_fixed(rng: np.random.Generator, count: int, prompt_len: int = 128, output_len: int = 128) -> list[dict]:
    if prompt_len < 1 or output_len < 1:
        raise TraceError(f"prompt_len/output_len: must be >= 1, got {prompt_len}, {output_len}")
    return [{"prompt_len": int(prompt_len), "output_len": int(output_len)} for _ in range(count)]


def gen_uniform(
    rng: np.random.Generator,
    count: int,
    prompt_min: int = 4,
    prompt_max: int = 1024,
    output_min: int = 4,
    output_max: int = 1024,
) -> list[dict]:
    """Integers uniform on [min, max] inclusive: mean (min + max) / 2."""
    if not (1 <= prompt_min <= prompt_max and 1 <= output_min <= output_max):
        raise TraceError(
            f"prompt_min/prompt_max/output_min/output_max: need 1 <= min <= max, got "
            f"{prompt_min}..{prompt_max}, {output_min}..{output_max}"
        )
    prompt_rng, output_rng = rng.spawn(2)  # request i independent of the count
    prompts = prompt_rng.integers(prompt_min, prompt_max, count, endpoint=True)
    outputs = output_rng.integers(output_min, output_max, count, endpoint=True)
    return _plain(prompts, outputs)


def gen_random(
    rng: np.random.Generator,
    count: int,
    input_len: int = 1024,
    output_len: int = 128,
    range_ratio: float = 0.0,
    prefix_len: int = 0,
) -> list[dict]:
    """`vllm bench serve --dataset-name random`'s lengths: integers uniform on
    [len x (1 - range_ratio), len x (1 + range_ratio)] (range_ratio 0: every request the same), each prompt
    after one prefix of `prefix_len` tokens that every request shares (`--random-prefix-len`: the prompt is
    prefix_len + its input length, and the prefix cache serves the prefix to all but the first)."""
    if input_len < 1 or output_len < 1 or not 0 <= range_ratio < 1 or prefix_len < 0:
        raise TraceError(f"input_len/output_len/range_ratio/prefix_len: need lengths >= 1, 0 <= range_ratio < 1 "
                         f"and prefix_len >= 0, got {input_len}, {output_len}, {range_ratio}, {prefix_len}")
    prompt_rng, output_rng = rng.spawn(2)  # request i independent of the count

    def lengths(rng_: np.random.Generator, length: int) -> np.ndarray:
        low, high = max(1, int(length * (1 - range_ratio))), int(length * (1 + range_ratio))
        return rng_.integers(low, max(low, high), count, endpoint=True)

    shared = {"prefix_id": "random-prefix", "prefix_len": int(prefix_len)} if prefix_len else {}
    return _plain(prefix_len + lengths(prompt_rng, input_len), lengths(output_rng, output_len), **shared)


def gen_prefix_repetition(
    rng: np.random.Generator,
    count: int,
    prefix_len: int = 256,
    suffix_len: int = 256,
    num_prefixes: int = 10,
    output_len: int = 128,
) -> list[dict]:
    """`vllm bench serve --dataset-name prefix_repetition`'s requests (vllm/benchmarks/datasets,
    PrefixRepetitionRandomDataset, its defaults): `num_prefixes` prefixes of `prefix_len` tokens, each
    request one of them + `suffix_len` tokens of its own, `output_len` tokens out; every prefix takes an
    equal share of the requests, in shuffled order. vLLM drops the count's remainder past a multiple of
    `num_prefixes`; here it goes to the first prefixes, one request each."""
    if prefix_len < 0 or suffix_len < 0 or prefix_len + suffix_len < 1 or output_len < 1 or num_prefixes < 1:
        raise TraceError(f"prefix_len/suffix_len/num_prefixes/output_len: need lengths >= 0 with a prompt of at "
                         f"least 1 token, output_len >= 1 and num_prefixes >= 1, got {prefix_len}, {suffix_len}, "
                         f"{num_prefixes}, {output_len}")
    which = rng.permutation(np.arange(count) % num_prefixes)
    shared = prefix_len > 0
    return [{"prompt_len": prefix_len + suffix_len, "output_len": output_len,
             **({"prefix_id": f"prefix_repetition-{prefix_len}-{k}", "prefix_len": prefix_len} if shared else {})}
            for k in which.tolist()]
