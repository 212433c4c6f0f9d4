"""A `Deployment` resolved against the catalogs: what one simulation runs.

`plan_deployment` resolves the model and GPU (with a "did you mean"), fills
in the limits vLLM derives (the context length, and the policy's defaults for
this GPU: the token budget, max_num_seqs and prefix caching, from
engine.deployment.resolve_batch_limits; the plan's `deployment` is the
resolved one, so every reader of it sees concrete values),
sizes the KV cache from the memory plan (or takes the blocks given), and with
`refuse=True` raises on what vLLM would refuse at start-up and collects
warnings for what it would run differently (planner/deploy/checks.py). It is
done once per run; the simulator and the cost model read the result.

Quantization. The weights' format is `--quantization` when given, else what a
model folder's config.json `quantization_config` (or ModelOpt's
hf_quant_config.json) declares, else what a Hugging Face id names
(nvidia/Llama-3.1-8B-Instruct-FP8: fp8), else 16-bit. A flag that contradicts
the checkpoint's config is refused, as vLLM refuses it. Where the GPU has no
tensor cores for the format, the plan warns what vLLM runs instead (FP8 and
NVFP4 weight-only through Marlin; MXFP4 leaves dense layers unquantized);
`gemm` says the kernel the cost models price.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace

from engine.core.config import SchedulerConfig
from engine.core.kv_offload import offload_blocks
from engine.deployment import ALL2ALL_BACKENDS, MOE_BACKENDS, BatchDevice, Deployment, resolve_batch_limits
from planner.catalog import GIB, GpuSpec, ModelSpec
from planner.catalog.quantization import (GemmPath, WeightFormat, catalog_checkpoint_format, checkpoint_format,
                                          format_from_id, gemm_path, recorded_format, weight_format)
from planner.deploy import checks
from planner.deploy.memory import MemoryPlan, kv_block_layout, offloaded_weight_bytes, plan_memory
from planner.cost.all2all import check_backend
from planner.cost.dbo import DualBatch
from planner.cost.deepgemm import check_moe_backend
from planner.cost.lora import lora_refusal, lora_slot_bytes
from planner.cost.moe import MoeParallel
from planner.cost.nodes import node_link
from planner.cost.sparse import as_cached_on, check_sparse_gpu
from planner.deploy.parallel import (MoeLayout, check_block_fp8, check_pipeline, largest_stage, moe_layout,
                                     parallel_warnings)
from planner.deploy.speculation import proposer_model, speculation_of
from planner.deploy.state_cache import cache_block_size, state_blocks
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
    weight_format: WeightFormat | None = None   # None: 16-bit weights
    gemm: GemmPath | None = None                # what vLLM runs the quantized linear layers with here
    moe: MoeLayout | None = None                # a MoE's experts over the tp x dp GPUs (None: dense)
    cache_block_size: int | None = None    # the block size vLLM sets for a hybrid or DSA model (state_cache.py)

    @property
    def block_size(self) -> int:
        """Tokens per block of the KV cache the scheduler allocates: the deployment's, or the larger size
        vLLM gives a Gated DeltaNet hybrid so a block holds a layer's recurrent state (the attention kernel
        still runs at the deployment's block size)."""
        return self.cache_block_size or self.deployment.block_size

    @property
    def state_blocks(self) -> int:
        """Blocks each running sequence holds beside its tokens': its recurrent states (linear attention,
        DeepSeek-V4), and under vLLM v1 its sliding layers' windows (the memory plan's)."""
        windows = self.memory.window_blocks_per_seq if self.memory is not None else 0
        return state_blocks(self.model) + windows

    @property
    def block_bytes_per_gpu(self) -> int:
        """One KV block's bytes on one GPU (its share of the heads and, with --pp, of the layers)."""
        if self.memory is not None:
            return self.memory.block_bytes_per_gpu
        d = self.deployment
        block, _ = kv_block_layout(self.model, d.tp, self.kv_dtype_bytes, self.block_size, 1)
        return -(-block * largest_stage(self.model.num_layers, d.pp) // self.model.num_layers)

    @property
    def offload_blocks(self) -> int:
        """The CPU tier's blocks (--kv-offloading-size; 0 without one), or --num-cpu-blocks when given with it
        (a validation replays the live engine's tier)."""
        d = self.deployment
        if not d.kv_offloading_size:
            return 0
        if d.num_cpu_blocks is not None:
            return d.num_cpu_blocks
        return offload_blocks(d.kv_offloading_size, self.block_bytes_per_gpu, d.tp * d.pp)

    @property
    def simulated_blocks(self) -> int:
        """The KV blocks a simulated replica keeps tables for: the GPU's, CPU swap's and the offloading tier's
        (what the memory guard counts before any engine is built: planner/sim/memory_guard.py)."""
        return self.num_gpu_blocks + self.num_cpu_blocks + self.offload_blocks

    @property
    def cpu_offload_bytes_per_gpu(self) -> int:
        """The weights --cpu-offload-gb keeps in host memory on each GPU, which every forward reads from there."""
        if self.memory is not None:
            return self.memory.cpu_offload_bytes_per_gpu
        d = self.deployment
        return offloaded_weight_bytes(self.model, d.tp, self.dtype_bytes, self.weight_format, d.dp,
                                      d.enable_expert_parallel and self.model.is_moe, d.num_redundant_experts, d.pp,
                                      int(d.cpu_offload_gb * GIB))

    @property
    def dtype_bytes(self) -> int:
        """Bytes per activation (and unquantized weight): 16-bit unless float32 is asked for (a CPU
        engine's float32 does not change the plan: its cache size is measured, not planned)."""
        return 4 if self.deployment.dtype == "float32" else 2

    @property
    def moe_parallel(self) -> MoeParallel | None:
        """The parallelism and routing skew a MoE's layers are priced at (None: a dense model)."""
        d = self.deployment
        if self.moe is None:
            return None
        dbo = DualBatch(d.dbo_decode_token_threshold, d.dbo_prefill_token_threshold) if d.enable_dbo else None
        return MoeParallel(tp=d.tp, dp=d.dp, expert_parallel=d.enable_expert_parallel, skew=d.moe_skew,
                           all2all=d.all2all_backend, dbo=dbo, moe_backend=d.moe_backend)

    @property
    def kv_dtype_bytes(self) -> int:
        """Bytes per KV-cache element: 1 for an FP8 cache, else the model's dtype."""
        return 1 if self.deployment.kv_cache_dtype == "fp8" else self.dtype_bytes

    def scheduler_config(self) -> SchedulerConfig:
        return self.deployment.scheduler_config(self.max_model_len, self.max_num_batched_tokens)

    def memory_summary(self) -> dict | None:
        """The memory plan for reports; a KV cache given in blocks is said beside what memory holds."""
        if self.memory is None:
            return None
        summary = self.memory.summary()
        if self.deployment.num_gpu_blocks is not None:
            summary["num_gpu_blocks_given"] = self.num_gpu_blocks
        if self.deployment.kv_cache_memory_bytes is not None:
            summary["kv_cache_memory_bytes_given"] = self.deployment.kv_cache_memory_bytes
        return summary

    def params(self) -> dict:
        """The run's settings, JSON-ready, for result files."""
        d = self.deployment
        return {"model": self.model.name, "gpu": self.gpu.name, "tp": d.tp, "block_size": self.block_size,
                "allocator": d.allocator, "preemption_mode": d.preemption_mode, "max_num_seqs": d.max_num_seqs,
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "gpu_memory_utilization": d.gpu_memory_utilization,
                "enable_prefix_caching": d.enable_prefix_caching, "policy": d.policy,
                "enable_chunked_prefill": d.chunked_prefill_on, "max_model_len": self.max_model_len,
                "dtype_bytes": self.dtype_bytes,
                "quantization": self.weight_format.method if self.weight_format else None,
                "kv_cache_dtype": d.kv_cache_dtype, "kv_dtype_bytes": self.kv_dtype_bytes,
                **({"dp": d.dp} if d.dp != 1 else {}),
                **({"pp": d.pp} if d.pp != 1 else {}),
                **({"moe_skew": d.moe_skew} if self.moe is not None else {}),
                **({"enable_expert_parallel": d.enable_expert_parallel, "moe_layout": self.moe.describe()}
                   if self.moe is not None else {}),
                **({"all2all_backend": d.all2all_backend} if d.all2all_backend != ALL2ALL_BACKENDS[0] else {}),
                **({"moe_backend": d.moe_backend} if d.moe_backend != MOE_BACKENDS[0] else {}),
                **({"enable_dbo": True, "dbo_decode_token_threshold": d.dbo_decode_token_threshold,
                    "dbo_prefill_token_threshold": d.dbo_prefill_token_threshold} if d.enable_dbo else {}),
                **({} if d.speculative is None else {"speculative": d.speculative, "acceptance": d.acceptance,
                                                     "draft_rates": d.draft_rates,
                                                     "draft_persistence": d.draft_persistence})}


def plan_deployment(deployment: Deployment, *, refuse: bool = True) -> DeploymentPlan:
    """Resolve `deployment`. `refuse=False` plans a cache vLLM would refuse (a validation replays a live
    engine that ran with it) and skips the warnings."""
    model, gpu = checks.model(deployment.model), checks.gpu(deployment.gpu)
    if refuse and deployment.speculative is not None:
        speculation_of(deployment)
    checks.check_tp(model, deployment.tp)
    check_pipeline(model, deployment)
    if deployment.enable_lora:
        _check_lora(model, deployment)
    if deployment.kv_offloading_size:
        _check_offloading(model)
    if deployment.cpu_offload_gb and gpu.kind != "gpu":
        raise PlannerError(f"--cpu-offload-gb on {gpu.name}: its weights are in host memory already")
    node_link(deployment.node_link)             # an unknown, or one node's, --node-link fails here
    check_sparse_gpu(model, gpu)
    model = as_cached_on(model, gpu, 1 if deployment.kv_cache_dtype == "fp8" else 2)   # what the cost models read
    layout = moe_layout(model, deployment)
    fmt = resolve_weight_format(deployment)
    block_notes = check_block_fp8(model, deployment, layout, fmt, gpu) if refuse else []
    gemm = gemm_path(fmt, gpu) if fmt is not None else None
    max_model_len = _max_model_len(deployment, model)
    deployment = resolve_batch_limits(deployment, batch_device(gpu), max_model_len)   # as resolved() does
    deployment, hybrid_notes = _hybrid_limits(deployment, model)
    budget = _token_budget(deployment, max_model_len)
    memory = None
    if deployment.num_gpu_blocks is None or (deployment.num_cpu_blocks is None
                                             and not deployment.vllm_v1):
        memory = _plan_memory(deployment, model, gpu, budget, refuse, fmt)
    gpu_blocks = deployment.num_gpu_blocks if deployment.num_gpu_blocks is not None else memory.num_gpu_blocks
    cpu_blocks = deployment.num_cpu_blocks
    if cpu_blocks is None:                        # recompute only under vllm-v1: no swap space to plan
        cpu_blocks = 0 if memory is None else memory.num_cpu_blocks
    plan = DeploymentPlan(deployment, model, gpu, max_model_len, budget, gpu_blocks, cpu_blocks, memory,
                          weight_format=fmt, gemm=gemm, moe=layout,
                          cache_block_size=_cache_block_size(deployment, model, gpu))
    if deployment.kv_offloading_size and not plan.offload_blocks:
        if deployment.num_cpu_blocks is not None:     # (which sets the tier's blocks when given with it)
            raise PlannerError(f"--num-cpu-blocks 0 leaves --kv-offloading-size "
                               f"{deployment.kv_offloading_size:g} GiB no block: give the tier's blocks, or leave "
                               f"--num-cpu-blocks out to take them from its size")
        raise PlannerError(f"--kv-offloading-size {deployment.kv_offloading_size:g} GiB holds no KV block of "
                           f"{model.name} ({plan.block_bytes_per_gpu * deployment.tp * deployment.pp / 2**20:,.2f} "
                           f"MiB over its GPUs): give more")
    all2all_note = check_backend(deployment.all2all_backend, plan.moe_parallel, gpu)
    kernel_note = check_moe_backend(model, fmt, gpu, plan.moe_parallel, deployment.moe_backend)
    if not refuse:
        return plan
    warnings = (checks.check_plan(plan) + _quantization_warnings(plan)
                + parallel_warnings(model, deployment, gpu.node_gpus)
                + block_notes + hybrid_notes + [note for note in (all2all_note, kernel_note) if note])
    return replace(plan, warnings=tuple(warnings))


def _check_lora(model: ModelSpec, deployment: Deployment) -> None:
    """What --enable-lora is modelled with: a dense transformer, without speculative decoding."""
    refusal = lora_refusal(model)
    if refusal is not None:
        raise PlannerError(refusal)
    if deployment.speculative is not None:
        raise PlannerError("--enable-lora with --speculative is not modelled (the drafts' adapters)")


def _check_offloading(model: ModelSpec) -> None:
    """What --kv-offloading-size is modelled with: a model whose every cached layer is full attention (a
    block then holds the same tokens of every layer, as the CPU tier's blocks do)."""
    if (model.sliding_layers or model.linear_attention is not None or model.compressed_attention is not None
            or model.sparse_indexer is not None):
        raise PlannerError(f"--kv-offloading-size on {model.name} is not modelled: its sliding-window, linear or "
                           f"compressed layers keep other blocks than its full-attention ones")


def _cache_block_size(deployment: Deployment, model: ModelSpec, gpu: GpuSpec) -> int | None:
    """The block size vLLM sets for a Gated DeltaNet hybrid's, a DSA model's or DeepSeek-V4's cache (the memory
    plan sets it alike); None for any other model."""
    if model.linear_attention is None and model.sparse_indexer is None and model.compressed_attention is None:
        return None
    dtype_bytes = 4 if deployment.dtype == "float32" else 2
    kv_dtype_bytes = 1 if deployment.kv_cache_dtype == "fp8" else dtype_bytes
    return cache_block_size(model, gpu, deployment.tp, dtype_bytes, kv_dtype_bytes, deployment.block_size)


def _hybrid_limits(deployment: Deployment, model: ModelSpec) -> tuple[Deployment, list[str]]:
    """A Gated DeltaNet hybrid runs under vLLM v1 only (V0, the paper's engine, is gone), and without
    prefix caching: its recurrent states are not cached per block here (vLLM's experimental "align" mode
    is not modelled), so a cached attention prefix would not spare the linear layers' prefill."""
    if model.compressed_attention is not None:
        return _compressed_limits(deployment, model)
    if model.linear_attention is None:
        return deployment, []
    if not deployment.vllm_v1:
        raise PlannerError(f"{model.name}'s Gated DeltaNet layers run only under vLLM v1 (--policy vllm-v1); "
                           f"the paper's policy has no recurrent-state cache")
    if not deployment.enable_prefix_caching:
        return deployment, []
    return replace(deployment, enable_prefix_caching=False), [
        f"{model.name}: prefix caching off, as vLLM runs a hybrid without it (mamba_cache_mode none); its "
        f"experimental cache of recurrent states at block boundaries is not modelled"]


def _compressed_limits(deployment: Deployment, model: ModelSpec) -> tuple[Deployment, list[str]]:
    """DeepSeek-V4 runs under vLLM v1 only, and always on an FP8 cache (vLLM asserts an fp8 cache dtype and
    stores DeepSeek's fp8_ds_mla rows), which the plan prices whatever --kv-cache-dtype says."""
    if not deployment.vllm_v1:
        raise PlannerError(f"{model.name} runs only under vLLM v1 (--policy vllm-v1); the paper's policy has no "
                           f"cache for its window and compressor states")
    if deployment.kv_cache_dtype == "fp8":
        return deployment, []
    return replace(deployment, kv_cache_dtype="fp8"), [
        f"{model.name}: its cache is FP8 (vLLM's fp8_ds_mla rows) whatever --kv-cache-dtype says; planned and "
        f"priced as --kv-cache-dtype fp8"]


def resolve_weight_format(deployment: Deployment) -> WeightFormat | None:
    """The weights' format: --quantization, the checkpoint's config (a local one, or a released checkpoint's on
    record by its id), the Hugging Face id's name, or None."""
    given, model = deployment.quantization, deployment.model
    declared = checkpoint_format(model) or recorded_format(model) or _catalog_checkpoint_format(model)
    if declared is not None:
        if given is not None and given != declared.method:
            # vLLM's words (vllm/config/model.py, ModelConfig._verify_quantization)
            raise PlannerError(f"Quantization method specified in the model config ({declared.method}) does not "
                               f"match the quantization method specified in the `quantization` argument ({given})")
        return declared
    if given is not None:
        return weight_format(given)
    return None if os.path.exists(model) else format_from_id(model)


def _catalog_checkpoint_format(model: str) -> WeightFormat | None:
    """The format a catalog model's released checkpoint is stored in (gpt-oss: MXFP4 experts), or None; not
    for a variant whose id names its own format (nvidia/MiniMax-M2.5-NVFP4 is not MiniMax's FP8 release)."""
    if os.path.exists(model) or format_from_id(model) is not None:
        return None
    spec = checks.model(model)
    if spec.checkpoint_quantization is None:
        return None
    return catalog_checkpoint_format(spec.checkpoint_quantization, source=f"{spec.hf_id or spec.name}'s checkpoint")


def _quantization_warnings(plan: DeploymentPlan) -> list[str]:
    """Where vLLM departs from the formats' native paths on this GPU."""
    found = [plan.gemm.warning] if plan.gemm is not None and plan.gemm.warning else []
    if plan.model.is_moe and plan.weight_format is not None and plan.weight_format.method == "mxfp4":
        found = []       # the warning is about dense layers; a MoE's experts are what MXFP4 quantizes
    if plan.deployment.kv_cache_dtype == "fp8" and plan.gpu.kind == "gpu" and plan.gpu.fp8_flops == 0:
        found.append(f"--kv-cache-dtype fp8 on {plan.gpu.name}: vLLM still stores the cache in FP8, but its "
                     f"FlashAttention backend takes an FP8 cache only as FlashAttention 3 on Hopper "
                     f"(fa_utils.flash_attn_supports_fp8), so vLLM attends with FlashInfer or Triton, which "
                     f"widen the keys and values inside the kernel")
    return found


def resolved(deployment: Deployment) -> Deployment:
    """`deployment` with its policy's defaults for its GPU and model filled in, as `plan_deployment` fills
    them, without the rest of the plan: what result files record as the deployment run."""
    model, gpu = checks.model(deployment.model), checks.gpu(deployment.gpu)
    return resolve_batch_limits(deployment, batch_device(gpu), _max_model_len(deployment, model))


def batch_device(gpu: GpuSpec) -> BatchDevice:
    """What vLLM's batch defaults read of the device, for a catalog GPU (its family names an A100)."""
    return BatchDevice(memory_bytes=gpu.memory_bytes, name=f"{gpu.family} {gpu.name}", is_cpu=gpu.kind == "cpu")


def _max_model_len(deployment: Deployment, model: ModelSpec) -> int:
    if deployment.max_model_len is None:
        return model.max_position_embeddings
    if deployment.max_model_len > model.max_position_embeddings:
        raise PlannerError(f"max_model_len {deployment.max_model_len} is greater than {model.name}'s "
                           f"{model.max_position_embeddings} positions; vLLM refuses it (lower --max-model-len)")
    return deployment.max_model_len


def _token_budget(deployment: Deployment, max_model_len: int) -> int:
    """The resolved deployment's token budget per step, checked as the scheduler checks it."""
    given = deployment.max_num_batched_tokens
    if not deployment.chunked_prefill_on and given < max_model_len:
        fix = "--enable-chunked-prefill" if deployment.vllm_v1 else "--policy vllm-v1"
        raise PlannerError(f"max_num_batched_tokens ({given}) is below max_model_len ({max_model_len}): a "
                           f"prompt that long could never run without chunked prefill (vLLM refuses it too); "
                           f"use {fix} or --max-model-len {given}")
    try:
        return deployment.scheduler_config(max_model_len).max_num_batched_tokens
    except ValueError as exc:
        raise PlannerError(str(exc)) from None




def _plan_memory(deployment: Deployment, model: ModelSpec, gpu: GpuSpec, budget: int, refuse: bool,
                 fmt: WeightFormat | None) -> MemoryPlan:
    dtype_bytes = 4 if deployment.dtype == "float32" else 2
    args = dict(gpu_memory_utilization=deployment.gpu_memory_utilization, block_size=deployment.block_size,
                dtype_bytes=dtype_bytes, max_num_batched_tokens=budget,
                max_num_seqs=deployment.max_num_seqs, swap_space_bytes=int(deployment.swap_space * GIB),
                weight_format=fmt, kv_dtype_bytes=1 if deployment.kv_cache_dtype == "fp8" else dtype_bytes,
                dp=deployment.dp, expert_parallel=deployment.enable_expert_parallel and model.is_moe,
                pp=deployment.pp, all2all=deployment.all2all_backend,
                shared_windows=deployment.vllm_v1,
                redundant_experts=deployment.num_redundant_experts,
                kv_cache_memory_bytes=deployment.kv_cache_memory_bytes,
                lora_bytes=(deployment.max_loras * lora_slot_bytes(model, deployment.tp, deployment.max_lora_rank,
                                                                   dtype_bytes) if deployment.enable_lora else 0),
                cpu_offload_bytes=int(deployment.cpu_offload_gb * GIB))
    proposer = proposer_model(deployment, model)      # a draft model or head: its weights and KV share the GPUs
    if proposer is not None:
        args.update(draft=proposer[0], draft_shares_vocab=proposer[1])
    try:
        return plan_memory(model, gpu, deployment.tp, **args)
    except PlannerError as exc:
        if not refuse or "does not fit" not in str(exc):
            raise
        raise PlannerError(f"{exc}{checks.fit_hint(model, gpu, deployment.tp, **args)}") from None
