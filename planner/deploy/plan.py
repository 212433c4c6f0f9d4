"""A `Deployment` resolved against the catalogs: what one simulation runs.

`plan_deployment` resolves the model and GPU (with a "did you mean"), fills
in the limits vLLM derives (the context length, the policy's token budget),
sizes the KV cache from the memory plan (or takes the blocks given), and with
`refuse=True` raises on what vLLM would refuse at start-up and collects
warnings for what it would run differently (planner/deploy/checks.py). It is
done once per run; the simulator and the cost model read the result.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.core.config import SchedulerConfig
from engine.deployment import Deployment
from planner.catalog import GIB, GpuSpec, ModelSpec
from planner.deploy import checks
from planner.deploy.memory import MemoryPlan, plan_memory
from planner.errors import PlannerError


@dataclass(frozen=True)
class DeploymentPlan:
    deployment: Deployment
    model: ModelSpec
    gpu: GpuSpec
    max_model_len: int
    max_num_batched_tokens: int
    num_gpu_blocks: int
    num_cpu_blocks: int
    memory: MemoryPlan | None               # None: both cache sizes were given
    warnings: tuple[str, ...] = ()

    @property
    def dtype_bytes(self) -> int:
        """Bytes per weight and KV element: 16-bit unless float32 is asked for (a CPU engine's
        float32 does not change the plan: its cache size is measured, not planned)."""
        return 4 if self.deployment.dtype == "float32" else 2

    def scheduler_config(self) -> SchedulerConfig:
        return self.deployment.scheduler_config(self.max_model_len, self.max_num_batched_tokens)

    def memory_summary(self) -> dict | None:
        """The memory plan for reports; a KV cache given in blocks is said beside what memory holds."""
        if self.memory is None:
            return None
        summary = self.memory.summary()
        if self.deployment.num_gpu_blocks is not None:
            summary["num_gpu_blocks_given"] = self.num_gpu_blocks
        return summary

    def params(self) -> dict:
        """The run's settings, JSON-ready, for result files."""
        d = self.deployment
        return {"model": self.model.name, "gpu": self.gpu.name, "tp": d.tp, "block_size": d.block_size,
                "allocator": d.allocator, "preemption_mode": d.preemption_mode, "max_num_seqs": d.max_num_seqs,
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "gpu_memory_utilization": d.gpu_memory_utilization,
                "enable_prefix_caching": d.enable_prefix_caching, "policy": d.policy,
                "enable_chunked_prefill": d.enable_chunked_prefill, "max_model_len": self.max_model_len,
                "dtype_bytes": self.dtype_bytes}


def plan_deployment(deployment: Deployment, *, refuse: bool = True) -> DeploymentPlan:
    """Resolve `deployment`. `refuse=False` plans a cache vLLM would refuse (a validation replays a live
    engine that ran with it) and skips the warnings."""
    model, gpu = checks.model(deployment.model), checks.gpu(deployment.gpu)
    checks.check_tp(model, deployment.tp)
    max_model_len = _max_model_len(deployment, model)
    budget = _token_budget(deployment, max_model_len)
    memory = None
    if deployment.num_gpu_blocks is None or (deployment.num_cpu_blocks is None
                                             and not deployment.enable_chunked_prefill):
        memory = _plan_memory(deployment, model, gpu, budget, refuse)
    gpu_blocks = deployment.num_gpu_blocks if deployment.num_gpu_blocks is not None else memory.num_gpu_blocks
    cpu_blocks = deployment.num_cpu_blocks
    if cpu_blocks is None:                        # recompute only under vllm-v1: no swap space to plan
        cpu_blocks = 0 if memory is None else memory.num_cpu_blocks
    plan = DeploymentPlan(deployment, model, gpu, max_model_len, budget, gpu_blocks, cpu_blocks, memory)
    if not refuse:
        return plan
    return DeploymentPlan(deployment, model, gpu, max_model_len, budget, gpu_blocks, cpu_blocks, memory,
                          tuple(checks.check_plan(plan)))


def _max_model_len(deployment: Deployment, model: ModelSpec) -> int:
    if deployment.max_model_len is None:
        return model.max_position_embeddings
    if deployment.max_model_len > model.max_position_embeddings:
        raise PlannerError(f"max_model_len {deployment.max_model_len} is greater than {model.name}'s "
                           f"{model.max_position_embeddings} positions; vLLM refuses it (lower --max-model-len)")
    return deployment.max_model_len


def _token_budget(deployment: Deployment, max_model_len: int) -> int:
    """The policy's token budget per step (the scheduler's own defaults and checks)."""
    given = deployment.max_num_batched_tokens
    if not deployment.enable_chunked_prefill and given is not None and given < max_model_len:
        raise PlannerError(f"max_num_batched_tokens ({given}) is below max_model_len ({max_model_len}): a "
                           f"prompt that long could never run under the paper's policy; use --policy vllm-v1 "
                           f"or --max-model-len {given}")
    try:
        return deployment.scheduler_config(max_model_len).max_num_batched_tokens
    except ValueError as exc:
        raise PlannerError(str(exc)) from None


def _plan_memory(deployment: Deployment, model: ModelSpec, gpu: GpuSpec, budget: int, refuse: bool) -> MemoryPlan:
    args = dict(gpu_memory_utilization=deployment.gpu_memory_utilization, block_size=deployment.block_size,
                dtype_bytes=4 if deployment.dtype == "float32" else 2, max_num_batched_tokens=budget,
                max_num_seqs=deployment.max_num_seqs, swap_space_bytes=int(deployment.swap_space * GIB))
    try:
        return plan_memory(model, gpu, deployment.tp, **args)
    except PlannerError as exc:
        if not refuse or "does not fit" not in str(exc):
            raise
        raise PlannerError(f"{exc}{checks.fit_hint(model, gpu, deployment.tp, **args)}") from None
