"""LLM: the offline API vLLM users know: ``LLM(model=...).generate(prompts, params)``."""
from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from engine.llm_engine import LLMEngine, Prompt
from engine.outputs import RequestOutput
from engine.core.sampling_params import SamplingParams

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
    "quantization": ((None,), "weights run in the dtype given (no quantization)"),
    "kv_cache_dtype": (("auto",), "the KV cache uses the model's dtype"),
    "load_format": (("auto", "safetensors"), "weights load from the folder's safetensors"),
    "revision": ((None,), "models load from a local folder; nothing is downloaded"),
    "tokenizer_revision": ((None,), "models load from a local folder; nothing is downloaded"),
    "download_dir": ((None,), "models load from a local folder; nothing is downloaded"),
    "cpu_offload_gb": ((0,), "weights are not offloaded"),
}


def _check_compat(kwargs: dict[str, Any]) -> None:
    for name, value in kwargs.items():
        if name not in _COMPAT:
            raise TypeError(f"LLM() got an unexpected keyword argument {name!r}")
        allowed, why = _COMPAT[name]
        if allowed is not None and value not in allowed:
            choices = " or ".join(repr(a) for a in allowed)
            raise ValueError(f"{name}={value!r} is not supported: {why} ({name} must be {choices})")


class LLM:
    def __init__(self, model: str, tokenizer: str | None = None, *, block_size: int = 16,
                 num_gpu_blocks: int | None = None, gpu_memory_utilization: float = 0.9,
                 swap_space: float = 4, preemption_mode: str = "recompute",
                 enable_prefix_caching: bool = False, max_num_seqs: int = 256,
                 max_num_batched_tokens: int | None = None, max_model_len: int | None = None,
                 dtype: str = "auto", device: str = "auto", seed: int | None = 0,
                 **kwargs) -> None:
        engine_kwargs = {k: kwargs.pop(k) for k in ("kv_cache_memory_bytes", "clock", "step_observer",
                                                    "enable_chunked_prefill", "enforce_eager") if k in kwargs}
        _check_compat(kwargs)
        self.engine = LLMEngine(model, block_size=block_size, num_gpu_blocks=num_gpu_blocks,
                                gpu_memory_utilization=gpu_memory_utilization, swap_space=swap_space,
                                preemption_mode=preemption_mode, enable_prefix_caching=enable_prefix_caching,
                                max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                max_model_len=max_model_len, dtype=dtype, device=device,
                                seed=0 if seed is None else seed, tokenizer=tokenizer, **engine_kwargs)
        self._next_id = 0

    def get_tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in input order.

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
        engine = self.engine
        ids = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for i, (prompt, p) in enumerate(zip(prompts, params)):
                request_id = str(self._next_id)
                self._next_id += 1
                try:
                    engine.add_request(request_id, prompt, p)
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
