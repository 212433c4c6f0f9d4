"""What one simulation runs: model, hardware, engine limits and the KV-cache size they leave."""
from __future__ import annotations

from dataclasses import dataclass

from engine.core.allocators import ALLOCATORS
from engine.core.config import SIM_BLOCK_SIZES, SchedulerConfig
from planner.catalog import GpuSpec, ModelSpec
from planner.errors import PlannerError
from planner.runs.memory import plan_memory

__all__ = ["SIM_BLOCK_SIZES", "SimConfig"]   # SIM_BLOCK_SIZES: engine.core.config's, re-exported


@dataclass
class SimConfig:
    model: ModelSpec
    gpu: GpuSpec
    tp: int = 1
    block_size: int = 16
    allocator: str = "paged"
    preemption_mode: str = "recompute"
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None     # default: max(max_model_len, 2048), as the scheduler's
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = False
    enable_chunked_prefill: bool = False   # vLLM v1's policy instead of the paper's
    num_gpu_blocks: int | None = None   # override the memory plan (validation uses the live engine's cache size)
    num_cpu_blocks: int | None = None
    max_model_len: int | None = None    # default: the model's max_position_embeddings
    seed: int = 0
    dtype_bytes: int = 2
    # Decode fast-forward (planner/sim/fast_forward.py); False steps one at a time
    # (--step-by-step). Same results either way, so it is not among params().
    fast_forward: bool = True

    def __post_init__(self) -> None:
        if self.block_size not in SIM_BLOCK_SIZES:
            raise PlannerError(f"block size {self.block_size} is not supported; choose one of "
                               f"{', '.join(map(str, SIM_BLOCK_SIZES))}")
        if self.allocator not in ALLOCATORS:
            raise PlannerError(f"unknown KV allocator {self.allocator!r}; choose one of {', '.join(ALLOCATORS)}")
        if self.max_model_len is None:
            self.max_model_len = self.model.max_position_embeddings
        if self.max_model_len > self.model.max_position_embeddings:
            raise PlannerError(f"max_model_len {self.max_model_len} exceeds {self.model.name}'s "
                               f"max_position_embeddings {self.model.max_position_embeddings}")
        if self.enable_chunked_prefill and self.allocator != "paged":
            raise PlannerError(f"chunked prefill needs the paged allocator, not {self.allocator}")
        if (not self.enable_chunked_prefill and self.max_num_batched_tokens is not None
                and 1 <= self.max_num_batched_tokens < self.max_model_len):
            raise PlannerError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) is below max_model_len "
                               f"({self.max_model_len}): a prompt that long could never run under the paper's "
                               f"policy; use --chunked-prefill or --max-model-len {self.max_num_batched_tokens}")
        try:   # the engine's own validation and defaults for the scheduling knobs
            self.max_num_batched_tokens = self.scheduler_config().max_num_batched_tokens
        except ValueError as e:
            raise PlannerError(str(e)) from None
        for name in ("num_gpu_blocks", "num_cpu_blocks"):
            value = getattr(self, name)
            if value is not None and value < (1 if name == "num_gpu_blocks" else 0):
                raise PlannerError(f"{name} must be {'>= 1' if name == 'num_gpu_blocks' else '>= 0'}, got {value}")

    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(max_model_len=self.max_model_len, max_num_seqs=self.max_num_seqs,
                               max_num_batched_tokens=self.max_num_batched_tokens,
                               preemption_mode=self.preemption_mode, block_size=self.block_size,
                               enable_prefix_caching=self.enable_prefix_caching,
                               enable_chunked_prefill=self.enable_chunked_prefill)

    def cache_size(self) -> tuple[int, int, dict | None]:
        """(GPU blocks, CPU blocks, memory-plan summary): from the plan unless both are overridden."""
        if self.num_gpu_blocks is not None and self.num_cpu_blocks is not None:
            return self.num_gpu_blocks, self.num_cpu_blocks, None
        if self.num_gpu_blocks is not None and self.enable_chunked_prefill:
            return self.num_gpu_blocks, 0, None         # recompute only: no swap space to plan
        plan = plan_memory(self.model, self.gpu, tp=self.tp, gpu_memory_utilization=self.gpu_memory_utilization,
                           block_size=self.block_size, dtype_bytes=self.dtype_bytes,
                           max_num_batched_tokens=self.max_num_batched_tokens, max_num_seqs=self.max_num_seqs)
        gpu_blocks = plan.num_gpu_blocks if self.num_gpu_blocks is None else self.num_gpu_blocks
        cpu_blocks = plan.num_cpu_blocks if self.num_cpu_blocks is None else self.num_cpu_blocks
        return gpu_blocks, cpu_blocks, plan.summary()

    def params(self) -> dict:
        """The run's parameters, JSON-ready, for result files."""
        return {"model": self.model.name, "gpu": self.gpu.name, "tp": self.tp, "block_size": self.block_size,
                "allocator": self.allocator, "preemption_mode": self.preemption_mode,
                "max_num_seqs": self.max_num_seqs, "max_num_batched_tokens": self.max_num_batched_tokens,
                "gpu_memory_utilization": self.gpu_memory_utilization,
                "enable_prefix_caching": self.enable_prefix_caching,
                "enable_chunked_prefill": self.enable_chunked_prefill, "max_model_len": self.max_model_len,
                "seed": self.seed, "dtype_bytes": self.dtype_bytes}
