"""LLM: the offline API vLLM users know: ``LLM(model=...).generate(prompts, params)``."""
from __future__ import annotations

import warnings
from dataclasses import fields
from collections.abc import Sequence
from typing import Any

from engine.llm_engine import LLMEngine, Prompt
from engine.outputs import RequestOutput
from engine.core.sampling_params import SamplingParams
from engine.deployment import Deployment
from engine.lora import LoRARequest

# vLLM keywords this engine accepts although they change nothing here, with the
# values it can honour (None: any value). Anything else is a clear error, not a
# TypeError or a silently ignored setting.
_SINGLE_DEVICE = "this engine runs a model on one device; the planner models parallelism (planner simulate --tp N)"
_COMPAT: dict[str, tuple[tuple | None, str]] = {
    "tensor_parallel_size": ((1,), _SINGLE_DEVICE),
    "pipeline_parallel_size": ((1,), _SINGLE_DEVICE),
    "data_parallel_size": ((1,), _SINGLE_DEVICE),
    "trust_remote_code": (None, "only built-in architectures load; no code from the folder ever runs"),
    "max_seq_len_to_capture": (None, "decode CUDA graphs cover every context up to max_model_len"),
    "disable_custom_all_reduce": (None, "single device"),
    "disable_log_stats": (None, "no periodic stats are logged"),
    "max_logprobs": (None, "logprobs are capped at 20"),
    "tokenizer_mode": (("auto",), "the folder's tokenizer is loaded with transformers' AutoTokenizer"),
    "skip_tokenizer_init": ((False,), "a folder without tokenizer files takes token-id prompts"),
    "load_format": (("auto", "safetensors"), "weights load from the folder's safetensors"),
    "revision": ((None,), "models load from a local folder; nothing is downloaded"),
    "tokenizer_revision": ((None,), "models load from a local folder; nothing is downloaded"),
    "download_dir": ((None,), "models load from a local folder; nothing is downloaded"),
    "cpu_offload_gb": ((0,), "weights are not offloaded"),
}


# Deployment settings by their keyword (vLLM's names).
DEPLOYMENT_KNOBS = {f.name for f in fields(Deployment)} - {"model"}


def _check_compat(kwargs: dict[str, Any]) -> None:
    for name, value in kwargs.items():
        if name not in _COMPAT:
            raise TypeError(f"LLM() got an unexpected keyword argument {name!r}")
        allowed, why = _COMPAT[name]
        if allowed is not None and value not in allowed:
            choices = " or ".join(repr(a) for a in allowed)
            raise ValueError(f"{name}={value!r} is not supported: {why} ({name} must be {choices})")


def _per_prompt_loras(lora_request, num_prompts: int) -> list[LoRARequest | None]:
    """generate()'s ``lora_request``, one per prompt: one request (or None) for all, or a list."""
    if lora_request is None or isinstance(lora_request, LoRARequest):
        return [lora_request] * num_prompts
    loras = list(lora_request)
    if len(loras) != num_prompts:
        raise ValueError(f"got {len(loras)} LoRA requests for {num_prompts} prompts")
    return loras


class LLM:
    """``LLM(model=folder, block_size=16, ...)``: the keywords are vLLM's engine arguments, and build a
    `Deployment`; or pass one built beforehand: ``LLM(folder, deployment=Deployment(block_size=32))``."""

    def __init__(self, model: str, tokenizer: str | None = None, *, deployment: Deployment | None = None,
                 device: str = "auto", seed: int | None = 0, **kwargs) -> None:
        runtime = {k: kwargs.pop(k) for k in ("clock", "step_observer", "enforce_eager", "speculative_config")
                   if k in kwargs}
        knobs = {k: kwargs.pop(k) for k in list(kwargs) if k in DEPLOYMENT_KNOBS}
        _check_compat(kwargs)
        self.engine = LLMEngine(model, deployment, device=device, seed=0 if seed is None else seed,
                                tokenizer=tokenizer, **runtime, **knobs)
        self._next_id = 0

    def get_tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True, priority: Sequence[int] | None = None,
                 lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in input order. `priority`: one per prompt,
        as vLLM's (read under scheduling_policy="priority": the lower value is served first).
        `lora_request`: vLLM's, the LoRA adapter every prompt runs with, or one per prompt (None: the
        base model); needs ``LLM(..., enable_lora=True)``.

        A prompt the model cannot serve (longer than its context or the whole
        KV cache) comes back with ``finish_reason == "rejected"`` and an
        ``error``; the others are unaffected. A malformed prompt (a token id
        outside the vocabulary, an empty prompt) raises ValueError naming the
        prompt, and nothing is run.
        """
        if isinstance(prompts, (str, dict)) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"got {len(params)} sampling params for {len(prompts)} prompts")
        priorities = [0] * len(prompts) if priority is None else list(priority)
        if len(priorities) != len(prompts):
            raise ValueError(f"got {len(priorities)} priorities for {len(prompts)} prompts")
        loras = _per_prompt_loras(lora_request, len(prompts))
        engine = self.engine
        ids = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for i, (prompt, p, rank, lora) in enumerate(zip(prompts, params, priorities, loras)):
                request_id = str(self._next_id)
                self._next_id += 1
                try:
                    engine.add_request(request_id, prompt, p, priority=rank, lora_request=lora)
                except ValueError as exc:
                    for added in ids:
                        engine.abort_request(added)
                    where = f"prompt {i}: " if len(prompts) > 1 else ""
                    raise ValueError(f"{where}{exc}") from None
                ids.append(request_id)
        if caught:   # one line for the batch, not one per prompt
            n = len(caught)
            warnings.warn(f"{n} of {len(prompts)} prompts: {caught[0].message}", stacklevel=2)

        results: dict[str, RequestOutput] = {}
        bar = None
        if use_tqdm and len(prompts) > 1:
            from tqdm.auto import tqdm
            bar = tqdm(total=len(prompts), desc="requests", unit="req", leave=False)
        while engine.has_unfinished_requests():
            for out in engine.step():
                results[out.request_id] = out
                if bar is not None:
                    bar.update(1)
        if bar is not None:
            bar.close()
        return [results[i] for i in ids]
