"""Synthetic conversations, generated as vLLM's multi-turn benchmark generates them from its JSON config.

benchmarks/multi_turn/benchmark_serving_multi_turn.py takes, instead of a file of conversations, a config
such as its generate_multi_turn.json: {"filetype": "generate_conversations", "num_conversations": C,
"text_files": [...], "prompt_input": {"num_turns", "common_prefix_num_tokens" (optional),
"prefix_num_tokens", "num_tokens"}, "prompt_output": {"num_tokens"}}, each count a distribution
(constant, uniform, lognormal, zipf, poisson; benchmarks/multi_turn/README.md). Its bench_dataset.py
draws them with numpy's global generator seeded by the benchmark's --seed, before anything else draws from
it, and cuts the user messages' text from the text files' tokens. Here the same draws come from a
RandomState of that seed taken in the same order, and the same text from the same tokenizer, so a config
gives the conversations the benchmark sends, message for message:

- per conversation: its message count (at least 2, rounded up to even), then its own prefix's tokens; then
  one common prefix for all (the text files' first tokens, cut 2 short and ended with ".");
- a user message: "{i} is a nice number... " (the common prefix before it in a first turn), in a first
  turn "{i}, " and the conversation's prefix text, then "Please rewrite the following text and add more
  content: " and text up to the turn's token count (the words before it count against that number, the
  conversation's prefix does not);
- an assistant message: the text files' first tokens, the answer's count of them (the benchmark sends
  the server's own answers as history; this one only sets the request's max_tokens).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .errors import TraceError
from .text import read_text
from .trace_files import MAX_TOKENS

FILETYPE = "generate_conversations"
QUESTION = "Please rewrite the following text and add more content: "
# bench_dataset.LognormalDistribution's median / mean when a config gives the average alone
DEFAULT_MEDIAN_RATIO = 0.85
DISTRIBUTIONS = ("constant", "uniform", "lognormal", "zipf", "poisson")


def is_generation_config(data) -> bool:
    """Whether a conversations file is the benchmark's generation config rather than conversations."""
    return isinstance(data, dict) and "filetype" in data


class _Counts:
    """One field's distribution (bench_dataset.py's classes): `sample(rng, n)` draws n integers."""

    def __init__(self, conf, where: str):
        def number(key: str, test=lambda v: True, rule: str = "a number", *, default=None):
            value = conf.get(key)
            if value is None:
                if default is None:
                    raise TraceError(f"{where}: {self.kind} needs {key!r}")
                return default
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not test(value):
                raise TraceError(f"{where}: {key}: must be {rule}, got {value!r}")
            if abs(value) > MAX_TOKENS:        # (a count, or a parameter of one: none is past the trace's cap)
                raise TraceError(f"{where}: {key}: {value:g} is over the cap of {MAX_TOKENS:,}")
            return value

        if not isinstance(conf, dict):
            raise TraceError(f"{where}: expected an object with a 'distribution', got {conf!r}")
        self.where = where
        self.kind = conf.get("distribution")
        if self.kind not in DISTRIBUTIONS:
            raise TraceError(f"{where}: distribution: expected one of {', '.join(DISTRIBUTIONS)}, "
                             f"got {self.kind!r}")
        whole = (lambda v: v == int(v) and v >= 0, "a whole number >= 0")
        # a cap of 0 or none caps nothing, as the benchmark tests it (`if self.max_val`)
        self.cap = number("max", *whole, default=0) if self.kind in ("lognormal", "zipf", "poisson") else 0
        self.average = None
        if self.kind == "constant":
            self.value = int(number("value", *whole))
        elif self.kind == "uniform":
            # (the benchmark asserts min > 0; float bounds would draw token counts it cannot slice text by)
            low = number("min", lambda v: v == int(v) and v > 0, "a whole number > 0")
            high = number("max", lambda v: v == int(v) and v >= low, f"a whole number >= min ({low})")
            self.low, self.high = int(low), int(high)
        elif self.kind in ("zipf", "poisson"):
            self.alpha = number("alpha", *((lambda v: v > 1, "> 1") if self.kind == "zipf" else
                                           (lambda v: v >= 0, ">= 0")))
        elif "average" in conf:
            if "mean" in conf or "sigma" in conf:
                raise TraceError(f"{where}: lognormal takes 'average' (and 'median_ratio') or 'mean' and "
                                 f"'sigma', not both")
            self.average = number("average", lambda v: v >= 1, ">= 1")
            ratio = number("median_ratio", lambda v: 0 < v < 1, "between 0 and 1", default=DEFAULT_MEDIAN_RATIO)
            # a lognormal's median / mean is exp(-sigma^2 / 2); its median is exp(mu)
            self.mu, self.sigma = math.log(self.average * ratio), math.sqrt(2 * math.log(1 / ratio))
        else:
            self.mu = number("mean", lambda v: v > 0, "> 0")
            self.sigma = number("sigma", lambda v: v >= 0, ">= 0")

    def sample(self, rng: np.random.RandomState, n: int) -> np.ndarray:
        if self.kind == "constant":
            return np.full(n, self.value)
        if self.kind == "uniform":
            return rng.randint(self.low, self.high + 1, size=n)
        if self.kind == "lognormal":
            values = rng.lognormal(mean=self.mu, sigma=self.sigma, size=n)
            if self.average is not None:       # scaled so the draws' own mean is the average
                values *= self.average / values.mean()
        else:
            values = rng.zipf(self.alpha, size=n) if self.kind == "zipf" else rng.poisson(self.alpha, size=n)
        if self.cap:
            values = np.minimum(values, self.cap)
        with np.errstate(invalid="ignore", over="ignore"):
            largest = float(np.max(values, initial=0))
        if not largest <= MAX_TOKENS:           # (a lognormal of a large mean or sigma draws infinities)
            raise TraceError(f"{self.where}: a {self.kind} draw of {largest:g}, over the cap of {MAX_TOKENS:,}: "
                             f"give smaller parameters or a 'max'")
        return np.round(values).astype(int)


def _text_tokens(files, config_path: Path, tokenizer) -> list[int]:
    """The text files' tokens, in order: each path as the benchmark opens it (from the working folder),
    else beside the config."""
    if not isinstance(files, list) or not files or not all(isinstance(f, str) for f in files):
        raise TraceError(f"{config_path}: text_files: expected a list of at least one file name")
    tokens: list[int] = []
    for name in files:
        path = Path(name)
        if not path.is_file() and (config_path.parent / path).is_file():
            path = config_path.parent / path
        if not path.is_file():
            raise TraceError(f"{config_path}: text_files: {name}: no such file (looked in the working folder and "
                             f"beside the config)")
        tokens += tokenizer.encode(read_text(path), add_special_tokens=False)
    return tokens


def generate_conversations(config: dict, config_path: Path, tokenizer, seed: int) -> list[dict]:
    """The benchmark's conversations for `config`, as its OpenAI-style entries ({"id", "messages"})."""
    where = str(config_path)
    if config.get("filetype") != FILETYPE:
        raise TraceError(f"{where}: filetype: the multi-turn benchmark generates {FILETYPE!r}, got "
                         f"{config.get('filetype')!r}")
    count = config.get("num_conversations")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise TraceError(f"{where}: num_conversations: expected a whole number >= 1, got {count!r}")
    sections = {}
    for name in ("prompt_input", "prompt_output"):
        if not isinstance(config.get(name), dict):
            raise TraceError(f"{where}: {name}: missing or not an object")
        sections[name] = config[name]

    def counts(section: str, field: str, optional: bool = False) -> _Counts:
        conf = sections[section].get(field)
        if conf is None:
            if optional:
                return _Counts({"distribution": "constant", "value": 0}, "")
            raise TraceError(f"{where}: {section}: {field}: missing")
        return _Counts(conf, f"{where}: {section}.{field}")

    turns_of, tokens_of = counts("prompt_input", "num_turns"), counts("prompt_input", "num_tokens")
    common_of = counts("prompt_input", "common_prefix_num_tokens", optional=True)
    prefix_of, answer_of = counts("prompt_input", "prefix_num_tokens"), counts("prompt_output", "num_tokens")
    text = _text_tokens(config.get("text_files"), config_path, tokenizer)

    def cut(start: int, n: int, what: str) -> str:
        if start + n >= len(text):             # (the benchmark asserts the text reaches past the cut)
            raise TraceError(f"{where}: text_files: {len(text)} tokens, too few for {what} ({n} tokens from token "
                             f"{start}): give a longer text")
        return tokenizer.decode(text[start:start + n])

    def length(s: str) -> int:
        return len(tokenizer.encode(s, add_special_tokens=False))

    # the benchmark's draws, in its order, from its seeded generator
    rng = np.random.RandomState(seed)
    messages_of = np.maximum(turns_of.sample(rng, count), 2)
    messages_of = messages_of + messages_of % 2
    prefixes = prefix_of.sample(rng, count)
    common_len = int(common_of.sample(rng, 1)[0])
    offset, common = 0, ""
    if common_len > 0:
        # (cut 2 short as the benchmark cuts it: a length of 1 slices to the text's end but one token)
        common = tokenizer.decode(text[:common_len - 2]) + "."
        offset += common_len
    question_len = length(QUESTION)
    entries = []
    for i in range(count):
        n = int(messages_of[i])
        asked = np.maximum(tokens_of.sample(rng, n), question_len)
        answered = np.maximum(answer_of.sample(rng, n), 1)
        messages = []
        for k in range(n):
            if k % 2:
                if answered[k] >= len(text):
                    raise TraceError(f"{where}: text_files: {len(text)} tokens, too few for an answer of "
                                     f"{answered[k]}: give a longer text")
                messages.append({"role": "assistant", "content": tokenizer.decode(text[:answered[k]])})
                continue
            content = f"{i} is a nice number... "
            if common and k == 0:
                content = common + content
            left = int(asked[k]) - length(content)
            if k == 0 and prefixes[i] > 0:
                content += f"{i}, " + cut(offset, int(prefixes[i]), f"conversation {i}'s prefix")
                offset += int(prefixes[i])
            content += QUESTION
            left -= question_len
            if left > 0:
                content += cut(offset + k * int(asked.max()), left, f"conversation {i}'s message {k}")
            messages.append({"role": "user", "content": content})
        entries.append({"id": f"CONV_ID_{i}", "messages": messages})
        offset += n
    return entries
