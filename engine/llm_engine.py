"""LLMEngine: the online engine. One step is schedule -> execute -> update.

The clock is read here and passed to the core, so a trace can be replayed
against the wall clock with its real arrival times (``arrival_time``), and the
same per-request and per-step records come out as in the simulator.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from engine.core.block_manager import BlockManager
from engine.core.config import SUPPORTED_BLOCK_SIZES, check_block_size
from engine.core.metrics import RequestRecord, StepRecord
from engine.model_runner import ModelRunner, SequenceInput
from engine.outputs import CompletionOutput, RequestOutput
from engine.sampler import Sampler
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import SchedulerConfig, SchedulerOutput
from engine.core.chunked_scheduler import VllmBlockManager, make_scheduler
from engine.core.sequence import FinishReason, SequenceGroup
from engine.core.step import begin_step, end_step

__all__ = ["LLMEngine", "SUPPORTED_BLOCK_SIZES"]
GiB = 1 << 30

Prompt = str | dict | list[int]


def _load_tokenizer(model: str):
    """The model folder's tokenizer, if it has one (never downloads)."""
    folder = Path(model)
    if not any((folder / name).exists() for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
        return None
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(model, local_files_only=True)


class LLMEngine:
    def __init__(self, model: str, *, block_size: int = 16, num_gpu_blocks: int | None = None,
                 gpu_memory_utilization: float = 0.9, swap_space: float = 4,
                 preemption_mode: str = "recompute", enable_prefix_caching: bool = False,
                 max_num_seqs: int = 256, max_num_batched_tokens: int | None = None,
                 max_model_len: int | None = None, enable_chunked_prefill: bool = False,
                 dtype: str = "auto", device: str = "auto",
                 seed: int = 0, kv_cache_memory_bytes: int | None = None,
                 clock: Callable[[], float] = time.perf_counter,
                 step_observer: Callable[[SchedulerOutput], None] | None = None) -> None:
        check_block_size(block_size, SUPPORTED_BLOCK_SIZES)   # what the kernels are built for
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        if swap_space < 0:
            raise ValueError(f"swap_space must be non-negative GiB, got {swap_space}")
        if not Path(model, "config.json").exists():
            raise ValueError(f"{model}: not a model folder (no config.json); give a local Hugging Face "
                             f"checkpoint folder")
        self.clock = clock
        self.step_observer = step_observer
        self.runner = ModelRunner(model, block_size=block_size, num_gpu_blocks=num_gpu_blocks,
                                  # Chunked prefill preempts by recompute only: no swap pool.
                                  swap_space_bytes=0 if enable_chunked_prefill else int(swap_space * GiB),
                                  dtype=dtype, device=device,
                                  kv_cache_memory_bytes=kv_cache_memory_bytes, seed=seed, gpu_memory_utilization=gpu_memory_utilization,
                                  max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
                                  max_num_seqs=max_num_seqs)
        self.max_model_len = min(max_model_len or self.runner.max_model_len, self.runner.max_model_len)
        if enable_chunked_prefill:     # vLLM v1's block order, so prefix hits match vLLM's
            self.allocator = VllmBlockManager(block_size, self.runner.num_gpu_blocks,
                                              enable_prefix_caching=enable_prefix_caching)
        else:
            self.allocator = BlockManager(block_size, self.runner.num_gpu_blocks, self.runner.num_cpu_blocks,
                                          enable_prefix_caching=enable_prefix_caching)
        self.scheduler = make_scheduler(SchedulerConfig(max_model_len=self.max_model_len, max_num_seqs=max_num_seqs,
                                                        max_num_batched_tokens=max_num_batched_tokens,
                                                        preemption_mode=preemption_mode, block_size=block_size,
                                                        enable_prefix_caching=enable_prefix_caching,
                                                        enable_chunked_prefill=enable_chunked_prefill),
                                        self.allocator)
        self.sampler = Sampler(self.runner.device, seed)
        self.tokenizer = _load_tokenizer(model)
        self.groups: dict[str, SequenceGroup] = {}
        self.prompts: dict[str, str | None] = {}
        self.steps: list[StepRecord] = []

    # -- requests -------------------------------------------------------------
    def _tokenize(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" not in prompt:
                raise ValueError("a dict prompt needs 'prompt_token_ids'")
            return prompt.get("prompt"), list(prompt["prompt_token_ids"])
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model folder has no tokenizer; pass {'prompt_token_ids': [...]}")
            return prompt, self.tokenizer(prompt)["input_ids"]
        return None, list(prompt)

    def add_request(self, request_id: str, prompt: Prompt, params: SamplingParams | None = None,
                    arrival_time: float | None = None, *, output_len_hint: int | None = None) -> None:
        if request_id in self.groups:
            raise ValueError(f"request id {request_id!r} is already in use")
        text, token_ids = self._tokenize(prompt)
        if any(not 0 <= t < self.runner.vocab_size for t in token_ids):
            raise ValueError(f"request {request_id}: token ids must be in [0, {self.runner.vocab_size})")
        group = SequenceGroup(request_id, token_ids, params or SamplingParams(),
                              self.clock() if arrival_time is None else arrival_time,
                              eos_token_ids=self.runner.eos_token_ids, output_len_hint=output_len_hint)
        self.groups[request_id] = group
        self.prompts[request_id] = text
        self.scheduler.add(group)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- one step ---------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one engine step; returns the requests that finished in it."""
        step = begin_step(self.scheduler, self.clock(), SequenceInput)
        out, samples = step.out, {}
        if step.has_work:
            if self.step_observer is not None:
                self.step_observer(out)
            runner = self.runner
            # Swaps and copies apply even when no sequence runs, or a swapped-out
            # request's KV is lost. Order matters: a block swapped out may be
            # reused in this very step.
            if out.blocks_to_swap_out:
                runner.swap_out(out.blocks_to_swap_out)
            if out.blocks_to_swap_in:
                runner.swap_in(out.blocks_to_swap_in)
            if out.blocks_to_copy:
                runner.copy_blocks(out.blocks_to_copy)
            if step.inputs:
                logits = runner.execute(step.inputs)
                sampling = out.sampling_part()   # a partial prompt chunk samples nothing
                if sampling is not out:
                    rows = {s.seq_id: i for i, s in enumerate(out.seqs)}
                    logits = logits[[rows[s.seq_id] for s in sampling.seqs]]
                if sampling.seqs:
                    samples = self.sampler.sample(sampling, logits)
        finished, record = end_step(self.scheduler, step, samples, self.clock())
        if step.has_work:
            self.steps.append(record)
        return [self._finish(g) for g in finished]

    def _finish(self, group: SequenceGroup) -> RequestOutput:
        self.sampler.forget(group)
        del self.groups[group.request_id]
        return self.output_of(group, self.prompts.pop(group.request_id))

    def output_of(self, group: SequenceGroup, prompt: str | None = None) -> RequestOutput:
        rejected = group.finish_reason is FinishReason.REJECTED
        outputs = []
        if not rejected:
            for i, (tokens, cumulative, reason, logprobs) in enumerate(group.outputs()):
                outputs.append(CompletionOutput(i, tokens, self._detokenize(tokens), cumulative,
                                                logprobs if group.params.logprobs else None,
                                                reason.value if reason else None))
        else:
            outputs.append(CompletionOutput(0, [], "" if self.tokenizer else None, 0.0, None,
                                            FinishReason.REJECTED.value))
        return RequestOutput(group.request_id, prompt, group.prompt_token_ids, outputs, group.is_finished,
                             RequestRecord.from_group(group), group.reject_reason)

    def _detokenize(self, tokens: list[int]) -> str | None:
        if self.tokenizer is None:
            return None
        return self.tokenizer.decode(tokens, skip_special_tokens=True)
