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

from planner.cost.block_size import decode_attention_factor
from planner.catalog import GpuSpec, ModelSpec, list_gpus, list_models, resolve_gpu, resolve_model
from planner.errors import PlannerError
from planner.runs.memory import plan_memory

VLLM_BLOCK_SIZES = (8, 16, 32)      # what vLLM's CUDA paged-attention kernels take (and ours)
MAX_TP_PER_NODE = 8                 # GPUs in one NVLink node


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
        names = [n for m in list_models() for n in (m.name, *getattr(m, "aliases", ()))]
        raise PlannerError(f"{exc}{did_you_mean(str(name), names)}") from None


def workload(name: str) -> None:
    """Fail on an unknown built-in workload name (trace files are checked when read)."""
    from workloads import WORKLOADS
    from workloads.make import is_trace_file

    if is_trace_file(name) or name in WORKLOADS:
        return
    raise PlannerError(f"unknown workload {name!r}{did_you_mean(name, list(WORKLOADS))}; built-in: "
                       f"{', '.join(WORKLOADS)} (or a .jsonl/.csv trace file)")


def valid_tp_sizes(spec: ModelSpec, limit: int = 64) -> list[int]:
    """Tensor parallel sizes that split the model's heads evenly (the ones vLLM accepts)."""
    return [tp for tp in range(1, limit + 1) if spec.num_heads % tp == 0
            and (spec.num_kv_heads % tp == 0 or tp % spec.num_kv_heads == 0)]


def check_tp(spec: ModelSpec, tp: int) -> None:
    if tp < 1 or tp not in valid_tp_sizes(spec, max(tp, 64)):
        raise PlannerError(f"tensor parallel size {tp} (--tp) does not split {spec.name}'s {spec.num_heads} "
                           f"attention heads ({spec.num_kv_heads} KV heads) evenly; valid: "
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
    bigger = [t for t in valid_tp_sizes(spec, MAX_TP_PER_NODE) if t > tp and fits(device, t)]
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
                   for t in valid_tp_sizes(spec, MAX_TP_PER_NODE) if t > tp and fits(g, t)]
        if options:
            t, _, name = min(options)
            if not bigger or t < bigger[0]:
                hints.append(f"--gpu {name} --tp {t} fits")
    return ("; " + " or ".join(hints)) if hints else "; no catalog GPU holds it with up to 8-way TP"


def check_config(config) -> list[str]:
    """Raise on what vLLM refuses; return warnings for what it would run differently.

    `config` is a planner.sim.SimConfig (its model and gpu already resolved).
    """
    spec, device = config.model, config.gpu
    check_tp(spec, config.tp)
    warnings: list[str] = []
    if config.max_model_len > spec.max_position_embeddings:
        raise PlannerError(f"max_model_len {config.max_model_len} is greater than {spec.name}'s "
                           f"{spec.max_position_embeddings} positions; vLLM refuses it (lower --max-model-len)")
    if config.max_num_batched_tokens < config.max_num_seqs:
        raise PlannerError(f"max_num_batched_tokens ({config.max_num_batched_tokens}) must be >= max_num_seqs "
                           f"({config.max_num_seqs}), as vLLM requires")
    plan_args = dict(gpu_memory_utilization=config.gpu_memory_utilization, block_size=config.block_size,
                     dtype_bytes=config.dtype_bytes, max_num_batched_tokens=config.max_num_batched_tokens,
                     max_num_seqs=config.max_num_seqs)
    try:
        gpu_blocks, cpu_blocks, _ = config.cache_size()
    except PlannerError as exc:
        if "does not fit" not in str(exc):
            raise
        raise PlannerError(f"{exc}{fit_hint(spec, device, config.tp, **plan_args)}") from None
    slots = gpu_blocks * config.block_size
    if slots < config.max_model_len:
        util = config.gpu_memory_utilization
        raise PlannerError(
            f"the KV cache holds {slots} tokens ({gpu_blocks} blocks x {config.block_size}) but max_model_len is "
            f"{config.max_model_len}: vLLM refuses to start (one sequence at the context limit would not fit); "
            f"raise --gpu-memory-utilization (now {util}), lower --max-model-len to {slots}"
            f"{fit_hint(spec, device, config.tp, **plan_args)}")
    if config.block_size not in VLLM_BLOCK_SIZES:
        warnings.append(f"block size {config.block_size}: vLLM's CUDA kernels take {VLLM_BLOCK_SIZES}; this run "
                        f"is a simulation of a kernel that does not exist")
    if config.tp > MAX_TP_PER_NODE:
        warnings.append(f"--tp {config.tp} spans more than one {MAX_TP_PER_NODE}-GPU node; the cost model prices "
                        f"NVLink all-reduces, not the slower inter-node network")
    if config.preemption_mode == "swap" and cpu_blocks == 0:
        warnings.append("preemption by swap with no CPU swap blocks: every preemption will recompute")
    if config.allocator != "paged":
        warnings.append(f"allocator {config.allocator} is the paper's contiguous baseline (Orca); vLLM has no "
                        f"such mode")
    if slots < 2 * config.max_model_len:
        warnings.append(f"the KV cache holds {slots} tokens, less than two sequences at the context limit "
                        f"({config.max_model_len}): expect preemptions and little batching")
    return warnings


def not_modelled(cost_model: str, block_size: int, enable_prefix_caching: bool = False,
                 preemption_mode: str = "recompute", tp: int = 1, factor_source: str | None = None) -> list[str]:
    """Effects the cost model in use does not capture, in plain words."""
    notes = []
    if cost_model.startswith("roofline"):
        notes.append("roofline: peaks x fixed efficiencies; no kernel launch gaps, no CUDA graphs, "
                     "CPU overhead is a planning guess (2 ms + 20 us/sequence)")
        if factor_source:
            factors = ", ".join(f"{b}: x{decode_attention_factor(b):.3g}" for b in VLLM_BLOCK_SIZES)
            notes.append(f"block size: decode attention scaled by factors measured on our own CPU paged-attention "
                         f"kernel ({factors}; {factor_source}); how block size changes GPU kernel speed is not "
                         f"measured")
        else:
            notes.append(f"block size {block_size}: no effect on attention-kernel speed in this model; only its "
                         f"effect on memory (fragmentation, blocks) is simulated")
    elif cost_model.startswith("measured"):
        notes.append("measured: NVIDIA's per-operation vLLM latencies summed per layer; no scheduler or Python "
                     "overhead beyond a planning guess, and the tables' attention kernels at their own block size "
                     "(block size changes memory only)")
    else:
        notes.append("calibrated: measured on the profiled device at the profiled block size; other block sizes "
                     "are scaled by the kernel factor" + (f" ({factor_source})" if factor_source else ""))
        if tp > 1:
            notes.append("tensor parallelism: the profile covers one device; all-reduce time is not measured")
    if enable_prefix_caching:
        notes.append("prefix caching: hashing and lookup cost on the host is not priced")
    if preemption_mode == "swap":
        notes.append("swap: transfers are priced on the step, not overlapped with compute")
    notes.append("no network, tokenization or detokenization time: latencies are engine-side")
    return notes
