"""Sampling parameters of a request, with the names users of vLLM know."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

MAX_LOGPROBS = 20   # vLLM's default max_logprobs
SEED_RANGE = (-(1 << 63), (1 << 63) - 1)     # a signed 64-bit integer, as vLLM's API bounds it


@dataclass
class SamplingParams:
    """How to decode one request.

    ``temperature == 0`` means greedy. ``n`` outputs are returned; ``best_of``
    (>= n) sequences are generated and the ``n`` with the highest cumulative
    log-probability kept. With ``use_beam_search`` the request runs a beam
    search of width ``best_of`` (default ``n``) scored as transformers does
    (sum of log-probabilities / generated_length ** length_penalty).
    """

    n: int = 1
    best_of: int | None = None
    use_beam_search: bool = False
    length_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    max_tokens: int | None = 16     # None: up to the model's context (vLLM's meaning), set when the request is added
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    # Text that ends a sequence, checked as the output is detokenized (in
    # LLMEngine, as vLLM does); the stop string is cut from the text unless
    # include_stop_str_in_output.
    stop: str | list[str] | None = None
    include_stop_str_in_output: bool = False
    # None: no logprobs. k >= 0: per generated position the sampled token's
    # log-probability and the k most likely alternatives (vLLM's meaning);
    # True is taken as 0 (the sampled token only), False as None.
    logprobs: int | None = None

    def __post_init__(self) -> None:
        if self.best_of is None:
            self.best_of = self.n
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}")
        if self.best_of < self.n:
            raise ValueError(f"best_of ({self.best_of}) must be at least n ({self.n})")
        for name in ("n", "best_of", "max_tokens", "top_k", "seed"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):     # (NaN compares False)
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.seed is not None and not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]:
            raise ValueError(f"seed must be a signed 64-bit integer, got {self.seed}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (disabled) or at least 1, got {self.top_k}")
        if self.use_beam_search and self.temperature not in (0.0, 1.0):
            raise ValueError("beam search is deterministic; leave temperature at its default")
        self.stop_token_ids = list(self.stop_token_ids)
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop strings must be non-empty strings, got {self.stop!r}")
        if self.stop and self.use_beam_search:
            raise ValueError("stop strings are not supported with beam search")
        if isinstance(self.logprobs, bool):
            self.logprobs = 0 if self.logprobs else None
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs must be between 0 and {MAX_LOGPROBS}, got {self.logprobs}")
        self._stop_set = frozenset(self.stop_token_ids)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 and not self.use_beam_search

    @property
    def beam_width(self) -> int:
        return self.best_of if self.use_beam_search else 1

    def samples_per_sequence(self, first_step: bool) -> int:
        """How many candidate tokens the executor must return for one sequence.

        Beam search needs the top ``2 * width`` continuations of every beam
        (as transformers keeps); the first step of a ``best_of > 1`` request
        draws ``best_of`` samples from the prompt, which the scheduler turns
        into forked sequences; everything else needs one token.
        """
        if self.use_beam_search:
            return 2 * self.best_of
        return self.best_of if first_step else 1
