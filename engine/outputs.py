"""What the engine returns for a request, with the field names vLLM users know."""
from __future__ import annotations

from dataclasses import dataclass

from engine.core.metrics import RequestRecord


@dataclass(frozen=True, slots=True)
class Logprob:
    """One candidate at one position, as vLLM reports it."""

    logprob: float
    rank: int | None = None              # 1 = the most likely token at this position
    decoded_token: str | None = None     # the token's text (None without a tokenizer)


# Per generated position: token id -> Logprob, holding the sampled token and the
# ``SamplingParams.logprobs`` most likely ones.
PositionLogprobs = dict[int, Logprob]


@dataclass
class CompletionOutput:
    index: int
    token_ids: list[int]
    text: str | None
    cumulative_logprob: float
    logprobs: list[PositionLogprobs] | None   # one dict per generated token, when asked for
    finish_reason: str | None           # "stop", "length", "rejected"
    stop_reason: int | str | None = None   # the stop token id or stop string that ended it


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestRecord
    error: str | None = None            # why a rejected request could not be served
    # vllm-v1 with n > 1: each child request's own record, in child order (engine/core/parallel_sampling.py);
    # the server's metrics observe each one, as vLLM's do. None: the request ran as one.
    child_metrics: list[RequestRecord] | None = None
    # vLLM's: the prompt tokens found computed when it was first scheduled (prefix cache, CPU tier); None before
    num_cached_tokens: int | None = None
