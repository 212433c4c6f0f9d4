"""OpenAI request bodies (the fields vLLM accepts), the bounds vLLM puts on them, and their SamplingParams.

The body is parsed here, not by FastAPI: strict JSON (``NaN``, ``Infinity`` and
numbers too large for a float are refused), no lone surrogate in any string
(no tokenizer or encoder can take one), then the fields are checked. The bounds
are vLLM's (vllm/sampling_params.py ``SamplingParams._verify_args`` and the
request models of vllm/entrypoints/openai/): a seed within a signed 64-bit
integer (``Field(ge=_LONG_INFO.min, le=_LONG_INFO.max)``) and -1 meaning none;
temperature finite in [0, 2], raised to 0.01 when between 0 and 0.01 (vLLM's
``_MAX_TEMP``: smaller ones overflow the logits); top_p in (0, 1]; top_k -1, 0
(both: off) or at least 1; n and best_of at least 1; at most 20 logprobs
(``max_logprobs``); stop strings non-empty; n and best_of at most 16,384 (``VLLM_MAX_N_SEQUENCES``,
read from the same environment variable). Chat roles are OpenAI's.

Unknown fields are ignored, as OpenAI-compatible servers do; fields this engine
cannot honour with a non-default value are refused with a 400 naming them.
"""
from __future__ import annotations

import json
import math
import os
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from engine.core.block_keys import BAD_CACHE_SALT, bad_cache_salt
from engine.core.sampling_params import MAX_LOGPROBS, SamplingParams
from engine.entrypoints.openai.errors import RequestError, param_of
from engine.unicode_text import has_lone_surrogate

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
# vLLM's cap on n (and best_of), against a request fanning out into more sequences than a server can hold
# (vllm/envs.py VLLM_MAX_N_SEQUENCES, default 16,384); the same variable sets it here.
MAX_N_SEQUENCES = int(os.environ.get("VLLM_MAX_N_SEQUENCES", "16384"))
MIN_TEMPERATURE = 1e-2    # vLLM's _MAX_TEMP: a temperature in (0, 0.01) is raised to it
MAX_TEMPERATURE = 2.0
MAX_STOP_STRINGS = 64
MAX_NAME, MAX_PATH = 1024, 4096      # a LoRA adapter's name (a request's `model`) and folder, in characters
# Chat messages a request may hold, and content parts its messages may in all: far beyond any conversation, and
# what a body of a million parts (16 MiB) would otherwise hold the GIL for while each becomes a model (seconds).
MAX_MESSAGES = MAX_CONTENT_PARTS = 1 << 16
BATCHED = "send one prompt per request (batched prompts are not supported)"
ROLES = ("system", "developer", "user", "assistant", "tool", "function")   # OpenAI's message roles

# Fields of vLLM's requests that this engine does not honour, each with the values that ask nothing of it (vLLM's
# defaults): any other value is refused with a 400 naming the field, not served as if it had not been sent. (The
# penalties are declared fields, whose null is their default: `_Common`.)
NOT_HONOURED = {"presence_penalty": (0.0,), "frequency_penalty": (0.0,), "repetition_penalty": (1.0,),
                "logit_bias": (None, {}), "min_tokens": (0,), "min_p": (0.0,),
                "skip_special_tokens": (True,), "spaces_between_special_tokens": (True,),
                "allowed_token_ids": (None,), "bad_words": (None, []), "prompt_logprobs": (None,),
                "logits_processors": (None,), "return_tokens_as_token_ids": (None, False), "prompt_embeds": (None,),
                "structured_outputs": (None,), "guided_json": (None,), "guided_regex": (None,),
                "guided_choice": (None,), "guided_grammar": (None,), "guided_decoding_backend": (None,)}
NOT_HONOURED_IN_CHAT = {"echo": (None, False), "documents": (None,)}

Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
TokenId = Annotated[int, Field(ge=0, le=INT64_MAX)]


def parse_body(raw: bytes, model: type[BaseModel]) -> BaseModel:
    """The request body as `model`, or a RequestError (400) naming the field at fault."""
    try:
        doc = json.loads(raw, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RequestError:
        raise
    except (ValueError, RecursionError) as exc:   # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise RequestError(f"the request body is not valid JSON ({_short(exc)})") from None
    if not isinstance(doc, dict):
        raise RequestError("the request body must be a JSON object")
    # a decoded UTF-8 body holds a lone surrogate only through a \uD800-\uDFFF escape: look for one
    # before walking every value (a body of millions of token ids has none)
    where = _surrogate_at(doc) if _SURROGATE_ESCAPE.search(raw) else None
    if where is not None:
        raise RequestError(f"{where}: the string holds a lone UTF-16 surrogate (not valid Unicode)",
                           param=where)
    try:
        return model.model_validate(doc)
    except ValidationError as exc:
        # Of a union's errors the deepest is the member the value came closest to ([-1] as a prompt: a token
        # id below 0, not "Input should be a valid string" from its first member, str); at equal depth, one
        # that is not a mere type mismatch (too many content parts, not "should be a valid string").
        first = max(exc.errors(), key=lambda e: (len(e.get("loc", ())), not e.get("type", "").endswith("_type")))
        param = param_of(tuple(first.get("loc", ())))
        message = first.get("msg", "invalid value")
        raise RequestError(f"{param}: {message}" if param else message, param=param) from None


def _refuse_constant(name: str):
    raise RequestError(f"the request body holds {name}, which is not JSON (numbers must be finite)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise RequestError(f"the number {text[:40]} is too large (numbers must be finite)")
    return value


def _short(exc: Exception) -> str:
    return str(exc).splitlines()[0][:200]


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _surrogate_at(doc: Any, path: str = "") -> str | None:
    """The field holding a string with a lone surrogate (keys included), or None. A list's items are named
    only when one is a string at fault or a container to walk (a prompt of token ids costs one pass)."""
    stack = [(doc, path)]
    while stack:
        value, where = stack.pop()
        if isinstance(value, str):
            if has_lone_surrogate(value):
                return where or "body"
        elif isinstance(value, dict):
            for key, item in value.items():
                name = f"{where}.{key}" if where else str(key)
                if has_lone_surrogate(str(key)):
                    return where or "body"
                stack.append((item, name))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, (str, dict, list)):
                    stack.append((item, f"{where}[{i}]"))
    return None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: str | None = None
    n: int = Field(1, ge=1, le=MAX_N_SEQUENCES)
    best_of: int | None = Field(None, ge=1, le=MAX_N_SEQUENCES)
    temperature: float | None = Field(None, ge=0.0, le=MAX_TEMPERATURE)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: Int64 | None = Field(None, ge=-1)
    seed: Int64 | None = None
    stop: str | list[str] | None = Field(None)
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    use_beam_search: bool = False
    length_penalty: float = 1.0
    stream: bool = False
    stream_options: StreamOptions | None = None
    # vLLM's request priority: the lower value is served first when the server runs --scheduling-policy priority
    priority: int = Field(0, ge=-(1 << 31), lt=1 << 31)
    # vLLM's: the request shares prefix-cache blocks only with requests of the same salt (engine/core/block_keys.py)
    cache_salt: str | None = None
    # vLLM's: each choice also carries its generated ids (`token_ids`; streamed, each chunk's) and the answer the
    # prompt's ids (`prompt_token_ids`: a completion choice's, a chat answer's own; streamed, the first chunk's)
    return_token_ids: bool | None = None
    # Refused unless plain text: this engine does not constrain output to a format.
    response_format: dict[str, Any] | None = None
    # vLLM's: the prompt cut to its last k tokens before it is served (-1: the model's length)
    truncate_prompt_tokens: Int64 | None = Field(None, ge=-1)
    # Accepted only at their defaults (no penalties in this engine: NOT_HONOURED).
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[str, float] | None = None
    min_tokens: int = 0
    min_p: float = 0.0

    # vLLM declares these Optional (SamplingParams.from_optional gives None the default): a JSON null is the
    # default here too; the classes below add echo (completions) and logprobs (chat)
    @field_validator("stream", "echo", "logprobs", "presence_penalty", "frequency_penalty", "repetition_penalty",
                     "min_p", mode="before", check_fields=False)
    @classmethod
    def _null_is_default(cls, value, info: ValidationInfo):
        return cls.model_fields[info.field_name].default if value is None else value

    @field_validator("cache_salt", mode="before")
    @classmethod
    def _salt(cls, value):
        if bad_cache_salt(value):
            raise PydanticCustomError("cache_salt", BAD_CACHE_SALT)
        return value

    def _refuse_not_honoured(self, fields: dict[str, tuple]) -> None:
        declared, extra = type(self).model_fields, self.model_extra or {}
        for name, defaults in fields.items():
            value = getattr(self, name) if name in declared else extra.get(name, defaults[0])
            if not any(value == d and type(value) is type(d) for d in defaults):    # (1 == True: not a default)
                raise RequestError(f"{name} is not supported by this engine (leave it out or at its default, "
                                   f"{json.dumps(defaults[-1])})", param=name)

    def truncated(self, token_ids: list[int], max_model_len: int) -> list[int]:
        """The prompt's last `truncate_prompt_tokens` tokens, as vLLM keeps them (its bound and words)."""
        keep = self.truncate_prompt_tokens
        if keep is None:
            return token_ids
        if keep == 0:
            raise RequestError("truncate_prompt_tokens: 0 leaves an empty prompt (give -1 or at least 1)",
                               param="truncate_prompt_tokens")
        keep = max_model_len if keep == -1 else keep
        if keep > max_model_len:
            raise RequestError(f"truncate_prompt_tokens value ({keep}) is greater than max_model_len "
                               f"({max_model_len}). Please, select a smaller truncation size.",
                               param="truncate_prompt_tokens")
        return token_ids[-keep:]

    def stop_strings(self) -> list[str]:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stop) > MAX_STOP_STRINGS:
            raise RequestError(f"stop: at most {MAX_STOP_STRINGS} stop strings, got {len(stop)}", param="stop")
        if any(not s for s in stop):
            raise RequestError("stop: a stop string cannot be empty", param="stop")
        return stop

    def sampling_params(self, max_tokens: int, logprobs: int | None, vocab_size: int) -> SamplingParams:
        """The engine's parameters; every refusal names its field."""
        self._refuse_not_honoured(NOT_HONOURED)
        kind = (self.response_format or {}).get("type", "text")
        if kind != "text":
            raise RequestError(f"response_format {kind!r} (structured output) is not supported by this engine",
                               param="response_format")
        if self.stream_options is not None and self.stream_options.model_fields_set and not self.stream:
            raise RequestError("Stream options can only be defined when `stream=True`.",   # vLLM's words
                               param="stream_options")
        if self.best_of is not None and self.best_of < self.n:
            raise RequestError(f"best_of ({self.best_of}) must be at least n ({self.n})", param="best_of")
        if self.stream and self.best_of is not None and self.best_of != self.n:
            raise RequestError("best_of must equal n when streaming", param="best_of")
        if self.stream and self.use_beam_search:
            raise RequestError("beam search cannot be streamed", param="stream")
        if self.use_beam_search and self.temperature not in (None, 0.0, 1.0):
            raise RequestError("beam search is deterministic; leave temperature at its default",
                               param="temperature")
        temperature = 1.0 if self.temperature is None else self.temperature
        if 0.0 < temperature < MIN_TEMPERATURE:
            temperature = MIN_TEMPERATURE          # vLLM's rule (sampling_params.py, __post_init__)
        top_k = -1 if self.top_k in (None, 0) or self.top_k >= vocab_size else self.top_k
        stop = self.stop_strings()
        try:
            return SamplingParams(
                n=self.n, best_of=self.best_of, use_beam_search=self.use_beam_search,
                length_penalty=self.length_penalty, temperature=temperature,
                top_p=1.0 if self.top_p is None else self.top_p, top_k=top_k,
                seed=None if self.seed == -1 else self.seed, max_tokens=max_tokens, ignore_eos=self.ignore_eos,
                stop_token_ids=self.stop_token_ids or [], stop=stop,
                include_stop_str_in_output=self.include_stop_str_in_output, logprobs=logprobs)
        except ValueError as exc:      # the engine's own checks, should a bound above miss one
            raise RequestError(str(exc)) from None


class CompletionRequest(_Common):
    prompt: str | list[TokenId] | list[str] | list[list[TokenId]]
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    add_special_tokens: bool = True     # vLLM's: the tokenizer's BOS (and the like) added to a text prompt

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, value):
        """A batch of prompts is refused before its items are validated: the union's members would each fail
        on every item of millions of one-id lists first (seconds holding the GIL), to be refused anyway."""
        if isinstance(value, list) and len(value) > 1 and isinstance(value[0], (str, list)):
            raise PydanticCustomError("batched_prompt", BATCHED)
        return value

    def single_prompt(self) -> str | list[int]:
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            if len(p) != 1:
                raise RequestError(BATCHED, param="prompt")
            p = p[0]
        if self.echo or self.suffix:
            raise RequestError("echo and suffix are not supported", param="echo" if self.echo else "suffix")
        if not p:
            raise RequestError("the prompt is empty", param="prompt")
        return p


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal[ROLES]
    content: str | list[ContentPart] | None = None      # (their parts capped in all: ChatCompletionRequest)
    name: str | None = None

    def text(self, index: int) -> str:
        if isinstance(self.content, list):   # content parts: only text parts are supported
            parts = []
            for j, part in enumerate(self.content):
                if part.type != "text":
                    raise RequestError(f"message content of type {part.type!r} is not supported",
                                       param=f"messages[{index}].content[{j}].type")
                parts.append(part.text or "")
            return "".join(parts)
        return self.content or ""


def _parts_in_all(data):
    """MAX_CONTENT_PARTS over all the messages together, counted before any part becomes a model: spread over
    many messages, a body's million parts would hold the GIL as long as in one."""
    messages = data.get("messages") if isinstance(data, dict) else None
    if isinstance(messages, list):
        parts = sum(len(m["content"]) for m in messages if isinstance(m, dict) and isinstance(m.get("content"), list))
        if parts > MAX_CONTENT_PARTS:
            raise PydanticCustomError("too_many_parts", f"the messages hold {parts:,} content parts in all; "
                                                        f"at most {MAX_CONTENT_PARTS:,}")
    return data


def message_dicts(messages: list[ChatMessage]) -> list[dict]:
    """The messages as a chat template takes them (only text content)."""
    return [{"role": m.role, "content": m.text(i), **({"name": m.name} if m.name else {})}
            for i, m in enumerate(messages)]


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    add_generation_prompt: bool = True
    add_special_tokens: bool = False    # vLLM's: the chat template writes them
    chat_template: str | None = None
    # Refused unless off: this engine does not parse tool calls.
    tools: list[Any] | None = None
    tool_choice: Any = None
    # vLLM's: the last message is continued, not answered; variables for the chat template
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _parts(cls, data):
        return _parts_in_all(data)

    def sampling_params(self, max_tokens: int, logprobs: int | None, vocab_size: int) -> SamplingParams:
        if self.tool_choice not in (None, "none") and self.tools is None:      # vLLM's words
            raise RequestError("When using `tool_choice`, `tools` must be set.", param="tool_choice")
        # vLLM's default choice is "auto" with tools, "none" without; it refuses "auto" without
        # --enable-auto-tool-choice and a --tool-call-parser, even over an empty list of tools
        choice = self.tool_choice if self.tool_choice is not None else "auto" if self.tools else "none"
        if choice != "none":
            raise RequestError("tool calling is not supported by this server (send tool_choice \"none\" or no "
                               "tools)", param="tools")
        self._refuse_not_honoured(NOT_HONOURED_IN_CHAT)
        return super().sampling_params(max_tokens, logprobs, vocab_size)

    def wanted_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def wanted_logprobs(self) -> int | None:
        if self.top_logprobs and not self.logprobs:   # vLLM: top_logprobs needs logprobs
            raise RequestError("top_logprobs needs logprobs set to true", param="top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None

    def message_dicts(self) -> list[dict]:
        return message_dicts(self.messages)


class TokenizeRequest(BaseModel):
    """/tokenize's body: vLLM's TokenizeCompletionRequest (a `prompt`) or TokenizeChatRequest (`messages`)."""
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, max_length=MAX_MESSAGES)
    add_special_tokens: bool | None = None     # vLLM's defaults: on for a prompt, off for messages
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool | None = False

    @model_validator(mode="before")
    @classmethod
    def _parts(cls, data):
        return _parts_in_all(data)

    @model_validator(mode="after")
    def _one_input(self):
        if (self.prompt is None) == (self.messages is None):
            raise PydanticCustomError("one_input", "give either prompt or messages")
        if (self.model_extra or {}).get("tools"):
            raise PydanticCustomError("tools", "tools are not supported by this server")
        return self


class DetokenizeRequest(BaseModel):
    """/detokenize's body (vLLM's DetokenizeRequest)."""
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    tokens: list[TokenId]


class LoadLoRAAdapterRequest(BaseModel):
    """/v1/load_lora_adapter's body (vLLM's LoadLoRAAdapterRequest; its other fields are taken and unused)."""
    model_config = ConfigDict(extra="allow")

    lora_name: str = Field("", max_length=MAX_NAME)
    lora_path: str = Field("", max_length=MAX_PATH)
    load_inplace: bool = False


class UnloadLoRAAdapterRequest(BaseModel):
    """/v1/unload_lora_adapter's body (vLLM's; `lora_int_id` is taken and unused, the name says which)."""
    model_config = ConfigDict(extra="allow")

    lora_name: str = Field("", max_length=MAX_NAME)
    lora_int_id: Int64 | None = None
