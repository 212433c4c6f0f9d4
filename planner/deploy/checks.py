"""Configurations vLLM would refuse, caught before a simulation runs; hints that name a fix.

Errors (PlannerError, one line) for what vLLM refuses at start-up:
- a KV cache smaller than one sequence at the context limit ("The model's max
  seq len (N) is larger than the maximum number of tokens that can be stored in
  KV cache (M)");
- a tensor parallel size that does not divide the attention heads;
- max_num_batched_tokens < max_num_seqs, max_model_len beyond the model's positions;
- a model that does not fit: the error names the smallest --tp, or a GPU, that fits.
Warnings (strings in result.json and on stderr) for what vLLM would run
differently or that only the simulator can run. Misspelled names get a
"did you mean" (difflib).
"""
from __future__ import annotations

import difflib
import os

from engine.core.config import SUPPORTED_BLOCK_SIZES as VLLM_BLOCK_SIZES   # vLLM's CUDA kernels' and ours
from planner.catalog import GpuSpec, ModelSpec, list_gpus, list_models, model_ids, resolve_gpu, resolve_model
from planner.cost.nodes import NODE_GPUS
from planner.errors import PlannerError
from planner.deploy.memory import plan_memory
from workloads import WORKLOADS
from workloads.make import is_trace_file



def did_you_mean(name: str, choices: list[str]) -> str:
    """' (did you mean X?)' for the closest choice, or '' when none is close."""
    close = difflib.get_close_matches(str(name).lower(), [c.lower() for c in choices], n=1, cutoff=0.6)
    if not close:
        return ""
    original = next(c for c in choices if c.lower() == close[0])
    return f" (did you mean {original}?)"


def gpu(name: str | GpuSpec) -> GpuSpec:
    try:
        return resolve_gpu(name)
    except PlannerError as exc:
        names = [n for g in list_gpus() for n in (g.name, *g.aliases)]
        raise PlannerError(f"{exc}{did_you_mean(str(name), names)}") from None


def model(name: str | ModelSpec) -> ModelSpec:
    try:
        return resolve_model(name)
    except PlannerError as exc:
        if "unknown model" not in str(exc):
            raise
        names = [n for m in list_models() for n in model_ids(m)]   # what `planner list models` shows
        raise PlannerError(f"{exc}{did_you_mean(str(name), names)}") from None


def workload(name: str) -> None:
    """Fail on an unknown built-in workload name (trace files are checked when read)."""
    if is_trace_file(name) or name in WORKLOADS:
        return
    if os.path.isdir(name):
        raise PlannerError(f"{name} is a folder; give a .jsonl or .csv trace file in it")
    raise PlannerError(f"unknown workload {name!r}{did_you_mean(name, list(WORKLOADS))}; built-in: "
                       f"{', '.join(WORKLOADS)} (or a .jsonl/.csv trace file)")


def valid_tp_sizes(spec: ModelSpec, limit: int = 64) -> list[int]:
    """Tensor parallel sizes that split the model's heads evenly (the ones vLLM accepts), and DeepSeek-V4's
    output groups (vLLM gives each rank o_groups / tp of them)."""
    return [tp for tp in range(1, limit + 1) if _splits(spec, tp)]


def _splits(spec: ModelSpec, tp: int) -> bool:
    groups = spec.compressed_attention.o_groups if spec.compressed_attention is not None else 1
    return (tp >= 1 and spec.num_heads % tp == 0 and (spec.num_kv_heads % tp == 0 or tp % spec.num_kv_heads == 0)
            and (groups == 1 or groups % tp == 0))


def check_tp(spec: ModelSpec, tp: int) -> None:
    if not _splits(spec, tp):
        groups = (f", {spec.compressed_attention.o_groups} output groups" if spec.compressed_attention is not None
                  else "")
        raise PlannerError(f"tensor parallel size {tp} (--tp) does not split {spec.name}'s {spec.num_heads} "
                           f"attention heads ({spec.num_kv_heads} KV heads{groups}) evenly; valid: "
                           f"{', '.join(map(str, valid_tp_sizes(spec)))}")


def fit_hint(spec: ModelSpec, device: GpuSpec, tp: int, **plan_args) -> str:
    """'; fits with --tp N' / '; fits on a GPU' for a model that does not fit, or ''."""
    def fits(g: GpuSpec, t: int) -> bool:
        try:
            plan = plan_memory(spec, g, tp=t, **plan_args)
        except PlannerError:
            return False
        return plan.kv_token_slots >= spec.max_position_embeddings

    hints = []
    bigger = [t for t in valid_tp_sizes(spec, NODE_GPUS) if t > tp and fits(device, t)]
    if bigger:
        hints.append(f"--tp {bigger[0]} fits on {device.name}")
    others = sorted((g for g in list_gpus() if g.family != "cpu" and g.name != device.name),
                    key=lambda g: g.memory_bytes)
    same_tp = next((g for g in others if fits(g, tp)), None)
    if same_tp is not None:
        hints.append(f"--gpu {same_tp.name} fits at --tp {tp}")
    else:
        # Fewest GPUs first, then the smallest GPU: the cheapest other setup that holds it.
        options = [(t, g.memory_bytes, g.name) for g in others
                   for t in valid_tp_sizes(spec, NODE_GPUS) if t > tp and fits(g, t)]
        if options:
            t, _, name = min(options)
            if not bigger or t < bigger[0]:
                hints.append(f"--gpu {name} --tp {t} fits")
    return ("; " + " or ".join(hints)) if hints else "; no catalog GPU holds it with up to 8-way TP"


def check_plan(plan) -> list[str]:
    """Raise on what vLLM refuses at start-up; return warnings for what it would run differently.
    `plan` is a planner.deploy.plan.DeploymentPlan, its model, GPU and cache already resolved."""
    spec, device, dep = plan.model, plan.gpu, plan.deployment
    if plan.max_num_batched_tokens < dep.max_num_seqs:
        raise PlannerError(f"max_num_batched_tokens ({plan.max_num_batched_tokens}) must be >= max_num_seqs "
                           f"({dep.max_num_seqs}), as vLLM requires")
    # one sequence's recurrent states (a Gated DeltaNet hybrid) take blocks its tokens cannot use
    slots = (plan.num_gpu_blocks - plan.state_blocks) * plan.block_size
    if spec.sliding_layers and plan.memory is not None and not plan.memory.window_blocks_per_seq:
        # vLLM's start-up check counts a sliding layer at a window plus one step's tokens
        # (SlidingWindowSpec.max_memory_usage_bytes) against the whole KV cache, blocks and the reserve the plan
        # sets aside for a full batch's windows alike (kv_block_layout): one sequence's full layers may use
        # what its sliding ones leave (gpt-oss-120b on one H100 at 131,072 tokens starts in vLLM)
        window_tokens = min(spec.window - 1 + plan.max_num_batched_tokens, plan.max_model_len)
        window_blocks = -(-window_tokens // dep.block_size) + 1
        # in pages of one layer's block (Gemma 4's full layers' pages are `wide` times a sliding layer's)
        sliding_page = spec.kv_cache_bytes(dep.tp, plan.kv_dtype_bytes)
        wide = spec.full_layer_spec.kv_cache_bytes(dep.tp, plan.kv_dtype_bytes) / sliding_page
        reserve = plan.memory.sliding_window_bytes_per_gpu
        per_block = spec.full_attention_layers * wide + (0 if reserve else spec.sliding_layers)
        pages = plan.num_gpu_blocks * per_block + reserve / (sliding_page * dep.block_size)
        pages -= spec.sliding_layers * window_blocks
        slots = max(slots, int(pages // (spec.full_attention_layers * wide)) * dep.block_size)
    if slots < plan.max_model_len:
        sized = dep.num_gpu_blocks is not None or dep.kv_cache_memory_bytes is not None    # given, not planned
        hint = "" if sized else fit_hint(
            spec, device, dep.tp, gpu_memory_utilization=dep.gpu_memory_utilization, block_size=dep.block_size,
            dtype_bytes=plan.dtype_bytes, max_num_batched_tokens=plan.max_num_batched_tokens,
            max_num_seqs=dep.max_num_seqs, weight_format=plan.weight_format, kv_dtype_bytes=plan.kv_dtype_bytes)
        raise_what = (f"--num-gpu-blocks (now {dep.num_gpu_blocks})" if dep.num_gpu_blocks is not None else
                      f"--kv-cache-memory-bytes (now {dep.kv_cache_memory_bytes})" if sized else
                      f"--gpu-memory-utilization (now {dep.gpu_memory_utilization})")
        states = f", {plan.state_blocks} of them a sequence's states" if plan.state_blocks else ""
        lower = f", lower --max-model-len to {slots}" if slots > 0 else ""     # (states may leave no token)
        raise PlannerError(
            f"the KV cache holds {slots} tokens ({plan.num_gpu_blocks} blocks x {plan.block_size}{states}) but "
            f"max_model_len is {plan.max_model_len}: vLLM refuses to start (one sequence at the context limit would "
            f"not fit); raise {raise_what}{lower}{hint}")
    warnings: list[str] = []
    if plan.memory is not None and plan.num_gpu_blocks > plan.memory.num_gpu_blocks:
        warnings.append(f"--num-gpu-blocks {plan.num_gpu_blocks} is more than the {plan.memory.num_gpu_blocks:,} "
                        f"blocks {dep.tp} x {device.name}'s memory holds at utilization "
                        f"{dep.gpu_memory_utilization}: this cache would not fit")
    if dep.block_size not in VLLM_BLOCK_SIZES:
        warnings.append(f"block size {dep.block_size}: vLLM's CUDA kernels take {VLLM_BLOCK_SIZES}; this run "
                        f"is a simulation of a kernel that does not exist")
    if dep.preemption_mode == "swap" and plan.num_cpu_blocks == 0:
        warnings.append("preemption by swap with no CPU swap blocks: every preemption will recompute")
    if dep.allocator != "paged":
        warnings.append(f"allocator {dep.allocator} is the paper's contiguous baseline (Orca); vLLM has no "
                        f"such mode")
    if slots < 2 * plan.max_model_len:
        warnings.append(f"the KV cache holds {slots} tokens, less than two sequences at the context limit "
                        f"({plan.max_model_len}): expect preemptions and little batching")
    return warnings
