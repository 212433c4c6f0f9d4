"""What the engine returns for a request, with the field names vLLM users know."""
from __future__ import annotations

from dataclasses import dataclass

from engine.core.metrics import RequestRecord


@dataclass
class CompletionOutput:
    index: int
    token_ids: list[int]
    text: str | None
    cumulative_logprob: float
    logprobs: list[float] | None        # log-probability of each chosen token, when asked for
    finish_reason: str | None           # "stop", "length", "rejected"


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestRecord
    error: str | None = None            # why a rejected request could not be served
