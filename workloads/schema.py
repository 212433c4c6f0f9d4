"""One request of a trace: the schema shared by the engine and the planner."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationInfo, field_validator

from engine.core.sampling_params import SamplingParams

MAX_TOKEN_ID = 1 << 31      # ids are below it: every vocabulary is smaller, and the prefix keys pack ids in 64 bits
MAX_HASH_BLOCK = 1 << 20    # tokens a hash id covers, at most


class TraceRequest(BaseModel):
    """A request as a workload describes it (lengths in tokens, times in seconds).

    ``prefix_len`` counts the prompt's leading tokens that are shared: with the
    other requests of the same ``prefix_id`` (few-shot prompts), or, for a
    chatbot turn, with the previous turn's prompt and answer (0 when the
    history had to be truncated, because then the window slides and nothing
    lines up any more).
    """

    # frozen: traces are shared between the engine and the simulator, so a
    # request must not change under one of them.  extra=forbid catches typos
    # in hand-written trace files.
    model_config = ConfigDict(frozen=True, extra="forbid")

    request_id: str = Field(min_length=1)
    arrival_time: float = Field(ge=0.0, allow_inf_nan=False)
    prompt_len: int = Field(ge=1)
    output_len: int = Field(ge=1)
    # StrictInt: a JSON true/false or 7.0 is not a token id (checked in pydantic's core, so
    # long id lists cost nothing extra)
    prompt_token_ids: list[StrictInt] | None = None
    # The reference answer's ids (an imported real trace): what n-gram speculation is measured on
    # (planner profile ngram); the engine still generates its own output.
    output_token_ids: list[StrictInt] | None = None
    n: int = Field(default=1, ge=1)
    beam_width: int = Field(default=1, ge=1)  # > 1: beam search of that width
    prefix_id: str | None = None
    prefix_len: int = Field(default=0, ge=0)
    conversation_id: str | None = None
    turn: int = Field(default=0, ge=0)
    # A conversation's later turn: the seconds its user takes after the previous turn's answer has ended before
    # sending it (reading, typing); read only with turns_after_answers (workloads/sessions.py), which then sends
    # the turn that long after the answer, its arrival_time being an open loop's estimate. None: not known.
    think_time: float | None = Field(default=None, ge=0.0, allow_inf_nan=False)
    # vLLM's request priority (the lower value first under --scheduling-policy priority; fcfs ignores it)
    priority: int = Field(default=0, ge=-(1 << 31), lt=1 << 31)
    # The LoRA adapter the request runs with (vLLM's lora_int_id: 1, 2, ...; 0: the base model alone)
    lora: int = Field(default=0, ge=0, lt=1 << 31)
    # vLLM's cache_salt: the request's prefix-cache blocks are shared only with requests of the same salt (one
    # tenant's prompts never hit another's cached blocks); None: unsalted, as vLLM's default
    cache_salt: str | None = Field(default=None, min_length=1)
    # A Mooncake trace's block hashes (kvcache-ai/Mooncake's FAST'25 traces, which aiperf replays as its
    # mooncake_trace): the prompt is made of blocks of `hash_block_size` tokens (the last one shorter), block i
    # drawn from hash_ids[i]'s own stream, so requests whose hash ids begin alike share those blocks' tokens as
    # the production requests shared them. None: the prompt as the fields above make it.
    hash_block_size: int = Field(default=512, ge=1, le=MAX_HASH_BLOCK)
    hash_ids: list[StrictInt] | None = None

    # Field validators (not a model validator) so that an error names the
    # field; prompt_len is declared before both, so info.data holds it.
    @field_validator("prompt_token_ids", "output_token_ids")
    @classmethod
    def _ids_match_length(cls, ids: list[int] | None, info: ValidationInfo) -> list[int] | None:
        if ids is None:
            return ids
        length = "prompt_len" if info.field_name == "prompt_token_ids" else "output_len"
        expected = info.data.get(length)
        if expected is not None and len(ids) != expected:
            raise ValueError(f"has {len(ids)} ids but {length} is {expected}")
        if any(t < 0 for t in ids):
            raise ValueError("holds a negative token id")
        if any(t >= MAX_TOKEN_ID for t in ids):
            raise ValueError(f"holds a token id of {max(ids):,}, past any vocabulary (ids are below {MAX_TOKEN_ID:,})")
        return ids

    @field_validator("hash_ids")
    @classmethod
    def _hash_ids_cover_the_prompt(cls, ids: list[int] | None, info: ValidationInfo) -> list[int] | None:
        if ids is None:
            return ids
        prompt_len, size = info.data.get("prompt_len"), info.data.get("hash_block_size")
        if prompt_len is not None and size is not None and len(ids) != -(-prompt_len // size):
            hashes = f"{len(ids)} block hash{'' if len(ids) == 1 else 'es'}"
            raise ValueError(f"has {hashes} but a prompt of {prompt_len} tokens is {-(-prompt_len // size)} "
                             f"blocks of {size}")
        if any(not 0 <= h < 1 << 63 for h in ids):
            raise ValueError("holds a hash id that is negative or not below 2**63")
        for field in ("prompt_token_ids", "prefix_id", "conversation_id"):
            if info.data.get(field) is not None:
                raise ValueError(f"a prompt made of block hashes has no {field} (its hashes say what it shares)")
        return ids

    def sampling_params(self, **overrides):
        """The engine's SamplingParams for this request: the one mapping from a trace to the
        engine, used by the live engine, the simulator, validation and the benchmarks.

        A trace fixes the output length, so EOS is ignored and max_tokens is
        output_len; ``n`` parallel samples, or a beam search of ``beam_width``.
        Greedy by default (temperature 0), so a live replay is deterministic;
        ``overrides`` replace any field (e.g. ``seed``).
        """
        fields = {"n": self.n, "best_of": max(self.n, self.beam_width), "use_beam_search": self.beam_width > 1,
                  "max_tokens": self.output_len, "ignore_eos": True, "temperature": 0.0}
        return SamplingParams(**(fields | overrides))

    def engine_prompt(self, token_ids: list[int]) -> dict:
        """The engine's prompt for this request made of `token_ids` (the trace's ids for it), with its salt."""
        prompt: dict = {"prompt_token_ids": token_ids}
        if self.cache_salt is not None:
            prompt["cache_salt"] = self.cache_salt
        return prompt

    @field_validator("think_time")
    @classmethod
    def _think_time_of_a_turn(cls, think_time: float | None, info: ValidationInfo) -> float | None:
        if think_time is not None and info.data.get("conversation_id") is None:
            raise ValueError("is a conversation turn's (the time after the previous turn's answer): give its "
                             "conversation_id")
        return think_time

    @field_validator("prefix_len")
    @classmethod
    def _prefix_within_prompt(cls, prefix_len: int, info: ValidationInfo) -> int:
        prompt_len = info.data.get("prompt_len")
        if prompt_len is not None and prefix_len > prompt_len:
            raise ValueError(f"{prefix_len} exceeds prompt_len {prompt_len}")
        return prefix_len


FIELDS = list(TraceRequest.model_fields)
