"""OpenAI request bodies (the fields vLLM accepts) and their mapping to SamplingParams.

Unknown fields are ignored, as OpenAI-compatible servers do; fields this
engine cannot honour with a non-default value are refused with a 400 that
names them, never ignored silently.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from engine.core.sampling_params import SamplingParams


class RequestError(ValueError):
    """A request this server refuses: becomes an OpenAI-style error body with this status."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400,
                 kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.param = param
        self.status = status
        self.kind = kind


def error_body(message: str, kind: str = "BadRequestError", param: str | None = None, code: int = 400) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    n: int = 1
    best_of: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    use_beam_search: bool = False
    length_penalty: float = 1.0
    stream: bool = False
    stream_options: StreamOptions | None = None
    # Accepted only at their defaults (no penalties in this engine).
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[str, float] | None = None

    def sampling_params(self, max_tokens: int, logprobs: int | None) -> SamplingParams:
        for name, default in (("presence_penalty", 0.0), ("frequency_penalty", 0.0),
                              ("repetition_penalty", 1.0), ("logit_bias", None)):
            if getattr(self, name) not in (default, {}):
                raise RequestError(f"{name} is not supported by this engine (leave it at its default)",
                                   param=name)
        if self.stream and self.best_of is not None and self.best_of != self.n:
            raise RequestError("best_of must equal n when streaming", param="best_of")
        if self.stream and self.use_beam_search:
            raise RequestError("beam search cannot be streamed", param="stream")
        try:
            return SamplingParams(
                n=self.n, best_of=self.best_of, use_beam_search=self.use_beam_search,
                length_penalty=self.length_penalty,
                temperature=1.0 if self.temperature is None else self.temperature,
                top_p=1.0 if self.top_p is None else self.top_p,
                top_k=-1 if self.top_k in (None, 0) else self.top_k,
                seed=self.seed, max_tokens=max_tokens, ignore_eos=self.ignore_eos,
                stop_token_ids=self.stop_token_ids or [], stop=self.stop,
                include_stop_str_in_output=self.include_stop_str_in_output, logprobs=logprobs)
        except ValueError as exc:
            raise RequestError(str(exc)) from None


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None

    def single_prompt(self) -> str | list[int]:
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            if len(p) != 1:
                raise RequestError("send one prompt per request (batched prompts are not supported)",
                                   param="prompt")
            p = p[0]
        if self.echo or self.suffix:
            raise RequestError("echo and suffix are not supported", param="echo" if self.echo else "suffix")
        if not p:
            raise RequestError("the prompt is empty", param="prompt")
        return p


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):   # content parts: only text parts are supported
            parts = []
            for part in self.content:
                if part.get("type") != "text":
                    raise RequestError(f"message content of type {part.get('type')!r} is not supported",
                                       param="messages")
                parts.append(part.get("text", ""))
            return "".join(parts)
        return self.content or ""


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    chat_template: str | None = None

    def wanted_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def wanted_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


Role = Literal["system", "user", "assistant", "tool"]
