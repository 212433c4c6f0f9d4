"""Speculative decoding, the core's part: the config, the n-gram proposer, the acceptance counters.

Pure Python (the simulator imports it). The scheduler asks the proposer for draft tokens when it
schedules a decoding sequence, reserves KV slots for them and counts them in the step's token
budget; the executor verifies them in one forward pass over the (1 + k) tokens and returns the
accepted drafts followed by one token of its own (the correction, or the bonus when every draft
was accepted); ``Scheduler.update`` appends those and rolls the slots of the rejected drafts back.

The names are vLLM's (``vllm/config/speculative.py``, ``vllm/v1/spec_decode/metrics.py``).
"""
from __future__ import annotations

from array import array
from dataclasses import asdict, dataclass, field, fields

from engine.core.sampling_params import SamplingParams
from engine.core.sequence import SequenceGroup

METHODS = ("ngram", "draft_model")
DEFAULT_PROMPT_LOOKUP = 5     # vLLM's default for both bounds when neither is given


@dataclass
class SpeculativeConfig:
    """vLLM's ``speculative_config`` for the n-gram (prompt lookup) and draft-model methods.

    num_speculative_tokens: k, the most draft tokens proposed per sequence and step.
    prompt_lookup_min / prompt_lookup_max: the n-gram lengths matched; as vLLM, both default
        to 5 when neither is given, and one given alone sets the other.
    model: the draft model's folder (method "draft_model"; as vLLM, a config with a model and no
        method is a draft-model config).
    """

    method: str | None = None
    num_speculative_tokens: int = 4
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    model: str | None = None

    def __post_init__(self) -> None:
        if self.method in (None, "[ngram]"):
            self.method = "draft_model" if self.model is not None and self.method is None else "ngram"
        if self.method not in METHODS:
            raise ValueError(f"speculative method {self.method!r} is not supported by this engine; "
                             f"choose one of {', '.join(METHODS)}")
        if (self.method == "draft_model") != (self.model is not None):
            raise ValueError("speculative_config: method 'draft_model' takes the draft model's folder as 'model'"
                             if self.model is None else "speculative_config: 'model' is a draft model's folder, "
                                                        f"not a setting of method {self.method!r}")
        if not isinstance(self.num_speculative_tokens, int) or self.num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be a positive integer, got {self.num_speculative_tokens!r}")
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if lo is None and hi is None:
            lo = hi = DEFAULT_PROMPT_LOOKUP
        elif lo is None:
            lo = hi
        elif hi is None:
            hi = lo
        if lo < 1 or hi < 1:
            raise ValueError(f"prompt_lookup_min and prompt_lookup_max must be > 0, got {lo} and {hi}")
        if lo > hi:
            raise ValueError(f"prompt_lookup_min={lo} must be <= prompt_lookup_max={hi}")
        self.prompt_lookup_min, self.prompt_lookup_max = lo, hi

    @classmethod
    def of(cls, value: "SpeculativeConfig | dict | None") -> "SpeculativeConfig | None":
        """A config from what a caller gave: None (off), a config, or vLLM's dict form."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, dict):
            known = {"method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "model"}
            unknown = sorted(set(value) - known)
            if unknown:
                raise ValueError(f"speculative_config: unknown or unsupported key {unknown[0]!r} "
                                 f"(this engine takes {', '.join(sorted(known))})")
            return cls(**value)
        raise TypeError(f"speculative_config must be a dict or SpeculativeConfig, not {type(value).__name__}")

    def as_dict(self) -> dict:
        return asdict(self)


def propose_ngram(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """Prompt-lookup drafts: up to ``k`` tokens that followed an earlier occurrence of the
    longest suffix n-gram of ``tokens`` (n in [min_n, max_n]).

    The rule is vLLM's (``vllm/v1/spec_decode/ngram_proposer.py``,
    ``_find_longest_matched_ngram_and_propose_tokens``): the longest n wins; among the
    occurrences of that n-gram other than the suffix itself (they may overlap it), the
    EARLIEST in the sequence is used (vLLM's KMP over the reversed tokens keeps the last
    position it reaches, which is the first one in the original order); the drafts are the
    tokens right after it, fewer than ``k`` when the sequence ends sooner. Written here
    with ``bytes.find`` over the packed ids instead of vLLM's KMP: same result.
    """
    total = len(tokens)
    if k <= 0 or total < min_n + 1:
        return []
    packed = array("i", tokens).tobytes()
    width = 4                                   # bytes per packed id
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        suffix = packed[(total - n) * width:]
        # Occurrences must end before the last token (start <= total - n - 1).
        limit = (total - 1) * width
        at = packed.find(suffix, 0, limit)
        while at != -1 and at % width:          # a match across id boundaries: look further
            at = packed.find(suffix, at + 1, limit)
        if at != -1:
            start = at // width + n
            return tokens[start:start + k]
    return []


@dataclass
class SpecDecodingStats:
    """Acceptance counters with vLLM's names (``SpecDecodingStats``): a draft is one sequence's
    proposals in one step; ``num_accepted_tokens_per_pos[i]`` counts drafts whose first i + 1
    tokens were all accepted, so it never increases with i.

    More counters, not vLLM's, say how often the proposer drafts at all, which a model of n-gram
    speculation needs (prompt lookup drafts only where the context repeats itself, and in runs):
    ``num_lookups`` counts the times the proposer was asked for drafts (a decoding sequence that
    could take some), ``num_proposed_tokens_per_pos[i]`` the lookups whose proposal had at least
    i + 1 tokens before any cap (the request's remaining tokens, the step's budget, free blocks),
    ``num_lookups_after_draft`` / ``num_drafts_after_draft`` the lookups (and those that drafted)
    whose sequence's previous lookup drafted, and ``num_verified_tokens_per_pos[i]`` the drafts
    whose token i was verified (the draft reached position i and tokens 0..i-1 were accepted): the
    denominators of the per-position rates."""

    num_spec_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    num_lookups: int = 0
    num_proposed_tokens_per_pos: list[int] = field(default_factory=list)
    num_verified_tokens_per_pos: list[int] = field(default_factory=list)
    num_lookups_after_draft: int = 0
    num_drafts_after_draft: int = 0

    def __post_init__(self) -> None:
        for name in ("num_accepted_tokens_per_pos", "num_proposed_tokens_per_pos", "num_verified_tokens_per_pos"):
            if not getattr(self, name):
                setattr(self, name, [0] * self.num_spec_tokens)

    def observe_lookup(self, num_proposed_tokens: int, after_draft: bool = False) -> None:
        """The proposer was asked and proposed this many tokens (before caps); `after_draft`: the
        sequence's previous lookup drafted."""
        self.num_lookups += 1
        if after_draft:
            self.num_lookups_after_draft += 1
            self.num_drafts_after_draft += num_proposed_tokens > 0
        per_pos = self.num_proposed_tokens_per_pos
        for i in range(min(num_proposed_tokens, self.num_spec_tokens)):
            per_pos[i] += 1

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        accepted, verified = self.num_accepted_tokens_per_pos, self.num_verified_tokens_per_pos
        for i in range(num_accepted_tokens):
            accepted[i] += 1
        for i in range(min(num_draft_tokens, num_accepted_tokens + 1)):
            verified[i] += 1

    def merged(self, others: list["SpecDecodingStats"]) -> "SpecDecodingStats":
        """These counters summed with ``others``' (a fleet's replicas)."""
        every = [self, *others]
        total = SpecDecodingStats(self.num_spec_tokens)
        for f in fields(self)[1:]:
            values = [getattr(s, f.name) for s in every]
            setattr(total, f.name, [sum(pos) for pos in zip(*values)] if isinstance(values[0], list) else sum(values))
        return total

    def draft_rates(self) -> list[float]:
        """Per position i, the share of lookups whose proposal reached token i among those that
        reached token i - 1 (position 0: among the lookups after one that did not draft, or a
        sequence's first): the proposer's drafting curve."""
        rates = _conditional(self.num_lookups, self.num_proposed_tokens_per_pos)
        fresh = self.num_lookups - self.num_lookups_after_draft
        if rates:
            rates[0] = (self.num_proposed_tokens_per_pos[0] - self.num_drafts_after_draft) / fresh if fresh else 0.0
        return rates

    def draft_persistence(self) -> float | None:
        """The share of lookups that drafted right after one that drafted (None: none did)."""
        after = self.num_lookups_after_draft
        return self.num_drafts_after_draft / after if after else None

    def acceptance_rates(self) -> list[float]:
        """Per position i, the share of verified draft tokens i that were accepted: the conditional
        acceptance curve the simulator draws from."""
        return [a / v if v else 0.0 for a, v in zip(self.num_accepted_tokens_per_pos, self.num_verified_tokens_per_pos)]

    def curves(self) -> dict:
        """The measured curves as a deployment's speculation settings, for a simulation to draw from:
        `acceptance` and `draft_rates` ("P1,P2,...") and, once a draft followed a draft, `draft_persistence`."""
        curves = {"acceptance": _rates_text(self.acceptance_rates()), "draft_rates": _rates_text(self.draft_rates())}
        persistence = self.draft_persistence()
        if persistence is not None:
            curves["draft_persistence"] = round(persistence, 6)
        return curves

    @classmethod
    def from_dict(cls, doc: dict) -> "SpecDecodingStats":
        """The counters back from `as_dict`'s document (its derived figures are recomputed)."""
        return cls(**{f.name: doc[f.name] for f in fields(cls)})

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / drafted tokens (vLLM's "draft acceptance rate")."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @property
    def mean_acceptance_length(self) -> float | None:
        """1 + accepted tokens per draft: tokens a verify step yields per sequence, the bonus
        token included (vLLM's convention)."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else None

    def acceptance_rate_per_pos(self) -> list[float | None]:
        """Per draft position, the share of drafts accepted that far."""
        return [n / self.num_drafts if self.num_drafts else None for n in self.num_accepted_tokens_per_pos]

    def as_dict(self) -> dict:
        return {"num_spec_tokens": self.num_spec_tokens, "num_drafts": self.num_drafts,
                "num_draft_tokens": self.num_draft_tokens, "num_accepted_tokens": self.num_accepted_tokens,
                "num_accepted_tokens_per_pos": list(self.num_accepted_tokens_per_pos),
                "acceptance_rate": self.acceptance_rate,
                "acceptance_rate_per_pos": self.acceptance_rate_per_pos(),
                "mean_acceptance_length": self.mean_acceptance_length,
                "num_lookups": self.num_lookups,
                "num_proposed_tokens_per_pos": list(self.num_proposed_tokens_per_pos),
                "num_verified_tokens_per_pos": list(self.num_verified_tokens_per_pos),
                "num_lookups_after_draft": self.num_lookups_after_draft,
                "num_drafts_after_draft": self.num_drafts_after_draft,
                "draft_rates": self.draft_rates(), "draft_persistence": self.draft_persistence(),
                "acceptance_rates": self.acceptance_rates()}


def _rates_text(rates: list[float]) -> str:
    return ",".join(f"{r:.6g}" for r in rates)


def _conditional(total: int, reach: list[int]) -> list[float]:
    """Conditional rates from counts that reached each position: reach[i] / reach[i - 1] (reach[0] / total)."""
    before = [total, *reach[:-1]]
    return [r / b if b else 0.0 for r, b in zip(reach, before)]


def can_speculate(group) -> bool:
    """Requests the proposer drafts for: one sequence, no beam search or parallel sampling, no
    logprobs and no stop strings (the engine checks those per token, which a multi-token step
    would skip past). Others decode one token per step as before."""
    p = group.params
    return (p.best_of == 1 and not p.use_beam_search and p.logprobs is None and not p.stop
            and len(group.seqs) == 1)


def draft_limit(group, seq, k: int, max_model_len: int) -> int:
    """How many drafts `seq` may take this step (0: none): at most k, and no more than leaves room for the
    bonus token within the request's max_tokens and within max_model_len - 1, as vLLM v1 caps them."""
    if not can_speculate(group):
        return 0
    n = seq.num_tokens
    return min(k, max_model_len - 1 - n, group.params.max_tokens - (n - seq.prompt_len) - 1)


class NgramProposer:
    """Drafts for a sequence, capped so that no draft is wasted by construction: at most k, none
    beyond the request's ``max_tokens`` (the token after the last draft always comes from the
    target model), and the sequence with its drafts at most ``max_model_len - 1`` tokens, as vLLM
    v1's scheduler caps a step's tokens (``max_model_len - 1 - num_computed_tokens``). So a
    sequence with its drafts never holds more slots than at its last plain decode, and a request
    that fits the cache alone still fits it while speculating."""

    def __init__(self, config: SpeculativeConfig, max_model_len: int,
                 stats: SpecDecodingStats | None = None) -> None:
        self.config = config
        self.k = config.num_speculative_tokens
        self.min_n = config.prompt_lookup_min
        self.max_n = config.prompt_lookup_max
        self.max_model_len = max_model_len
        self.stats = stats

    def propose(self, group, seq) -> list[int]:
        limit = draft_limit(group, seq, self.k, self.max_model_len)
        if limit <= 0:
            return []
        # The full k-token proposal is counted (``observe_lookup``), then capped: the drafting curve
        # is the workload's, not the caps'.
        drafts = propose_ngram(seq.token_ids, self.min_n, self.max_n, self.k)
        if self.stats is not None:
            self.stats.observe_lookup(len(drafts), seq.last_lookup_drafted)
        seq.last_lookup_drafted = bool(drafts)
        return drafts[:limit]


def replay_ngram(prompt: list[int], answer: list[int], config: SpeculativeConfig,
                 stats: SpecDecodingStats) -> None:
    """Count in ``stats`` what the n-gram proposer drafts, and greedy verification accepts, while
    ``answer`` is generated after ``prompt``: the engine's own proposer and caps, and a draft token
    accepted while it equals the answer's next token (greedy decoding's rule), the answer's first
    token coming from the prefill. Measures a workload's n-gram acceptance from its text alone."""
    if not answer:
        return
    group = SequenceGroup("replay", list(prompt), SamplingParams(max_tokens=len(answer), ignore_eos=True), 0.0)
    seq = group.seqs[0]
    proposer = NgramProposer(config, len(prompt) + len(answer) + 1, stats)
    seq.append(answer[0], 0.0)
    while seq.num_output_tokens < len(answer):
        done = seq.num_output_tokens
        drafts = proposer.propose(group, seq)
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == answer[done + accepted]:
            accepted += 1
        if drafts:
            stats.observe_draft(len(drafts), accepted)
        for token in answer[done:done + accepted + 1]:
            seq.append(token, 0.0)
