"""Requests (sequence groups) and their sequences: pure Python, no clock.

Time always comes in from the caller (wall clock in the live engine, SimPy's
``env.now`` in the simulator), so both modes fill the same records.
"""
from __future__ import annotations

import enum
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

from engine.core.block_keys import adapter_name, cache_root
from engine.core.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    STOP = "stop"          # EOS or a stop token
    LENGTH = "length"      # max_tokens or the model's context limit
    REJECTED = "rejected"  # can never be served (too long for the model or the cache)
    PRUNED = "pruned"      # a beam that lost to better beams


@dataclass(slots=True)
class Sequence:
    """One token stream. ``num_computed_tokens`` of ``token_ids`` sit in the KV cache."""

    seq_id: int
    token_ids: list[int]
    prompt_len: int
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    cumulative_logprob: float = 0.0
    output_logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    # Speculative decoding: did the proposer's last lookup for this sequence draft? (Prompt-lookup
    # drafts come in runs: a sequence copying its context keeps matching; SpecDecodingStats counts it.)
    last_lookup_drafted: bool = False
    # The parent key of its first prompt block in the prefix cache (engine/core/block_keys.py
    # `cache_root`): 0 for the base model, one per LoRA adapter's name and cache salt, so no adapter or tenant
    # is served another's KV.
    cache_root: int = 0
    # Its LoRA adapter's root unsalted (0: none): the engine drops the adapter's blocks, salted or not, by it
    # (BlockManager.forget_adapter) when it unloads the adapter.
    lora_root: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len:]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append(self, token_id: int, logprob: float) -> None:
        self.token_ids.append(token_id)
        self.cumulative_logprob += logprob
        self.output_logprobs.append(logprob)

    def finish(self, reason: FinishReason, allocator=None) -> None:
        """End this sequence with ``reason``; frees its KV blocks in ``allocator`` if given."""
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
        if allocator is not None:
            allocator.free(self)

    def copy_as(self, seq_id: int) -> "Sequence":
        """A child with the same tokens and state (used by fork)."""
        return Sequence(seq_id, list(self.token_ids), self.prompt_len, self.status,
                        self.num_computed_tokens, self.cumulative_logprob,
                        list(self.output_logprobs), cache_root=self.cache_root, lora_root=self.lora_root)


@dataclass(slots=True)
class RequestTimes:
    """Per-request timestamps in seconds, written from the time passed in."""

    arrival: float
    first_scheduled: float | None = None
    first_token: float | None = None
    token_times: list[float] = field(default_factory=list)  # one per step that produced tokens
    finish: float | None = None
    # Tokens each of those steps gave, once a speculative step gave other than one (None: one each)
    token_counts: list[int] | None = None


@dataclass(slots=True)
class BeamHypothesis:
    score: float            # sum of log-probabilities / generated_length ** length_penalty
    token_ids: list[int]    # prompt + generated tokens (including the stop token)
    cumulative_logprob: float


_seq_ids = itertools.count()


def next_seq_id() -> int:
    return next(_seq_ids)


class SequenceGroup:
    """A request: one prompt, the sequences sampled from it, and its records.

    It starts with a single sequence; ``best_of > 1`` and beam search fork it
    after the prompt step, so the prompt's KV blocks are computed once and
    shared.
    """

    __slots__ = ("request_id", "params", "seqs", "times", "output_len_hint",
                 "eos_token_ids", "finish_reason", "reject_reason", "beams",
                 "beam_improvable", "num_preemptions", "priority", "lora_id", "lora_name", "cache_salt",
                 "num_cached_tokens", "_order", "_prompt")

    _counter = itertools.count()

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 arrival_time: float, *, eos_token_ids: Iterable[int] | int | None = None,
                 eos_token_id: int | None = None, output_len_hint: int | None = None,
                 priority: int = 0, lora_id: int = 0, lora_name: str | None = None,
                 cache_salt: str | None = None) -> None:
        if not prompt_token_ids:
            raise ValueError(f"request {request_id}: the prompt is empty")
        self.request_id = request_id
        self.params = params
        self._prompt = list(prompt_token_ids)
        # vLLM's LoRARequest: the adapter the request runs with (id 0: the base model alone), and the name its
        # prefix-cache blocks are keyed by (an adapter given by id alone: adapter_name's); vLLM's cache_salt
        self.lora_id = lora_id
        self.lora_name = adapter_name(lora_id) if lora_name is None else lora_name
        self.cache_salt = cache_salt
        lora_root = cache_root(self.lora_name)
        root = cache_root(self.lora_name, cache_salt) if cache_salt else lora_root
        self.seqs = [Sequence(next_seq_id(), list(self._prompt), len(self._prompt), cache_root=root,
                              lora_root=lora_root)]
        self.times = RequestTimes(arrival=arrival_time)
        # The true output length when it is known ahead (simulation); only the
        # contiguous ORCA baselines use it, to size their reservations.
        self.output_len_hint = output_len_hint
        # Every id that ends a sequence (configs may list several); eos_token_id
        # is the single-id spelling.
        ids = eos_token_ids if eos_token_ids is not None else eos_token_id
        self.eos_token_ids = frozenset([ids] if isinstance(ids, int) else ids or ())
        self.finish_reason: FinishReason | None = None
        self.reject_reason: str | None = None
        self.beams: list[BeamHypothesis] = []   # finished beam hypotheses, best first
        self.beam_improvable = True
        self.num_preemptions = 0
        # vLLM's Request.num_cached_tokens: the prompt tokens its first admission found computed (prefix cache and
        # CPU tier); -1 until then
        self.num_cached_tokens = -1
        # vLLM's request priority: under --scheduling-policy priority the lower value is served first
        self.priority = priority
        self._order = next(SequenceGroup._counter)  # FCFS tie-break among equal arrival times

    # -- views -------------------------------------------------------------
    @property
    def prompt_token_ids(self) -> list[int]:
        return self._prompt

    @property
    def prompt_len(self) -> int:
        return len(self._prompt)

    @property
    def arrival_time(self) -> float:
        return self.times.arrival

    @property
    def fcfs_key(self) -> tuple[float, int]:
        return (self.times.arrival, self._order)

    @property
    def priority_key(self) -> tuple[int, float, int]:
        """vLLM v1's order under its priority policy (vllm/v1/request.py, Request.__lt__): priority, then
        arrival. vLLM stamps arrivals with the clock as requests come in, so two never tie there; here
        simultaneous arrivals (a batch at t = 0) are told apart the same way, by the order they were added."""
        return (self.priority, self.times.arrival, self._order)

    def live_seqs(self) -> list[Sequence]:
        return [s for s in self.seqs if s.status is not SequenceStatus.FINISHED]

    def num_seqs(self, status: SequenceStatus) -> int:
        return sum(1 for s in self.seqs if s.status is status)

    def finish(self, reason: FinishReason, now: float, allocator=None) -> None:
        """End the request at ``now``: every sequence still live ends with ``reason``
        (freeing its blocks in ``allocator`` if given)."""
        for seq in self.seqs:
            if seq.status is not SequenceStatus.FINISHED:
                seq.finish(reason, allocator)
        self.finish_reason = reason
        self.times.finish = now

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def first_step_pending(self) -> bool:
        """True until the prompt has produced its first token(s)."""
        return self.times.first_token is None

    def max_num_seqs(self) -> int:
        """Sequences this group will hold at its widest (for admission budgets)."""
        return max(self.params.best_of, len(self.live_seqs()))

    def num_output_tokens(self) -> int:
        """Generated tokens over all returned sequences (what throughput counts)."""
        if self.params.use_beam_search:
            return sum(len(h.token_ids) - self.prompt_len for h in self.beams[:self.params.n])
        return sum(s.num_output_tokens for s in self.seqs)

    def outputs(self) -> list[tuple[list[int], float, FinishReason | None, list[float] | None]]:
        """The ``n`` results, best first: (output token ids, cumulative logprob,
        finish reason, per-token logprobs or None for beam hypotheses)."""
        prompt_len = self.prompt_len
        if self.params.use_beam_search:
            return [(h.token_ids[prompt_len:], h.cumulative_logprob, self.finish_reason, None)
                    for h in self.beams[:self.params.n]]
        seqs = self.seqs
        if self.params.best_of > self.params.n:
            seqs = sorted(seqs, key=lambda s: s.cumulative_logprob, reverse=True)[:self.params.n]
        return [(s.output_token_ids, s.cumulative_logprob, s.finish_reason, s.output_logprobs) for s in seqs]
