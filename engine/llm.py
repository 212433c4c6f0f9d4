"""LLM: the offline API vLLM users know: ``LLM(model=...).generate(prompts, params)``."""
from __future__ import annotations

from collections.abc import Sequence

from engine.llm_engine import LLMEngine, Prompt
from engine.outputs import RequestOutput
from engine.core.sampling_params import SamplingParams


class LLM:
    def __init__(self, model: str, block_size: int = 16, num_gpu_blocks: int | None = None,
                 gpu_memory_utilization: float = 0.9, swap_space: float = 4,
                 preemption_mode: str = "recompute", enable_prefix_caching: bool = False,
                 max_num_seqs: int = 256, max_num_batched_tokens: int | None = None,
                 dtype: str = "auto", device: str = "auto", seed: int = 0, **kwargs) -> None:
        self.engine = LLMEngine(model, block_size=block_size, num_gpu_blocks=num_gpu_blocks,
                                gpu_memory_utilization=gpu_memory_utilization, swap_space=swap_space,
                                preemption_mode=preemption_mode, enable_prefix_caching=enable_prefix_caching,
                                max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                dtype=dtype, device=device, seed=seed, **kwargs)
        self._next_id = 0

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in input order.

        A prompt the model cannot serve (longer than its context or the whole
        KV cache) comes back with ``finish_reason == "rejected"`` and an
        ``error``; the others are unaffected.
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
        for prompt, p in zip(prompts, params):
            request_id = str(self._next_id)
            self._next_id += 1
            engine.add_request(request_id, prompt, p)
            ids.append(request_id)

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
