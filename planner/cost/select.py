"""Which cost model prices a simulation.

Order (`auto`): our own calibrated profile of this (GPU, model) pair (an
explicit --profile file, else a profile under profiles/<gpu>/ whose model,
block size, dtype and TP all match the run: `planner profile` writes
profiles/<gpu>/<model>.json; a near miss is passed over and named in the
chosen model's `profile_note`), then the `measured` model where NVIDIA's vLLM op tables
cover the GPU and the model's attention shape, then the roofline model from
datasheet peaks. `--cost-model calibrated|measured|roofline` forces one; a
forced model that cannot be built is a one-line error, never a silent
fallback. `linear:A,B` (A + B x scheduled tokens per step) is a what-if model.

Quantized weights and an FP8 KV cache (`weight_format`, `kv_cache_dtype`) are
priced by the measured model (the format's own GEMM and FP8-KV attention
tables where NVIDIA measured them) and the roofline model (bytes and
tensor-core peaks by format). A calibrated profile is one dtype: it timed
this engine's 16-bit weights and its KV cache as profiled (model dtype unless
the profile records `kv_cache_dtype`). It is refused for another format,
never scaled: the engine runs no quantized GEMM to time, and what an FP8
cache saves in bytes a CPU or our CUDA kernel spends again widening every
element, so no factor on a 16-bit profile is physically justified.
"""
from __future__ import annotations

from pathlib import Path

from planner.catalog import GpuSpec, ModelSpec
from planner.catalog.quantization import WeightFormat
from planner.cost.block_size import decode_attention_factor
from planner.cost.calibrated import CalibratedCostModel
from planner.cost.linear import parse_linear
from planner.cost.measured import MeasuredCostModel
from planner.cost.moe import MoeParallel
from planner.cost.nodes import NODE_LINK
from planner.cost.roofline import RooflineCostModel
from planner.cost.shape import CostModel
from planner.errors import PlannerError
from planner.profile.check import check_settings, engine_dtype, find_profile
from planner.profile.schema import profile_path

COST_MODELS = ("auto", "calibrated", "measured", "roofline")


def parse_cost_model(text: str | None) -> str:
    """The --cost-model option: one of COST_MODELS (None means auto). Anything else is a one-line error."""
    choice = ("auto" if text is None else text).strip().lower()      # (an empty value is a mistake, not auto)
    if choice not in COST_MODELS:
        raise PlannerError(f"--cost-model {text!r}: choose one of {', '.join(COST_MODELS)}, or linear:A,B")
    return choice


def _format_refusal(weight_format: WeightFormat | None, kv_cache_dtype: str, profiled_kv: str) -> str | None:
    """Why a calibrated profile (of `profiled_kv` KV cache, 16-bit weights) cannot price this deployment."""
    if weight_format is not None:
        return (f"a calibrated profile times this engine's 16-bit weights; it cannot price --quantization "
                f"{weight_format.method} (the engine runs no quantized GEMM); use --cost-model measured or roofline")
    if kv_cache_dtype != profiled_kv:
        return (f"a calibrated profile is for the KV-cache dtype it was timed with ({profiled_kv}), not "
                f"--kv-cache-dtype {kv_cache_dtype}: an FP8 cache's bytes saved are spent again widening "
                f"each element in the kernel, so no scaling of the profile is justified; use --cost-model "
                f"measured or roofline")
    return None


def _lora_refusal(calibrated, lora_rank: int | None) -> str | None:
    """Why a calibrated profile cannot price LoRA adapters of `lora_rank` (None: no adapters served), or None."""
    if lora_rank is None or calibrated.lora_rank == lora_rank:
        return None
    rank = calibrated.lora_rank
    timed = "timed no LoRA adapter" if rank is None else f"timed adapters of rank {rank}"
    return (f"the calibrated profile {timed}, not of --max-lora-rank {lora_rank}: profile with --enable-lora "
            f"--max-lora-rank {lora_rank}, or use --cost-model measured or roofline")


def _moe_refusal(moe: MoeParallel | None) -> str | None:
    """Why a calibrated profile (one device, the engine's own routing) cannot price this MoE deployment."""
    if moe is not None and (moe.dp > 1 or moe.skew):
        return (f"a calibrated profile times one device with the engine's own routing; it cannot price "
                f"{'--dp ' + str(moe.dp) if moe.dp > 1 else '--moe-skew ' + format(moe.skew, 'g')}; "
                f"use --cost-model measured or roofline")
    return None


def _calibrated(model: ModelSpec, gpu: GpuSpec, tp: int, profile: str | Path | None, block_size: int,
                dtype: str, kv_cache_dtype: str = "auto") -> tuple[CostModel | None, str | None]:
    """(the calibrated model from `profile`, or from a profile under profiles/<gpu>/ matching model,
    block size, dtype and TP; None when there is none, with the near miss that was passed over, if any)."""
    near_miss = None
    if profile is not None:
        path = Path(profile)
        if not path.is_file():
            raise PlannerError(f"profile {path}: " + ("a folder; give a profile's .json file in it" if path.is_dir()
                                                      else "no such file"))
    else:
        default = Path(profile_path(gpu.name, model.name))
        path, near_miss = find_profile(default.parent, model, block_size=block_size, dtype=dtype, tp=tp)
        if path is None and near_miss is None and default.is_file():
            path = default          # unreadable to find_profile: loading it names the damage
        if path is None:
            return None, near_miss
    chosen = CalibratedCostModel.from_file(path, model=model, gpu=gpu, tp=tp)
    if getattr(chosen, "profile", None) is not None:
        check_settings(chosen.profile, path, block_size=block_size, dtype=dtype, tp=tp)
        refusal = _format_refusal(None, kv_cache_dtype, getattr(chosen.profile, "kv_cache_dtype", "auto"))
        if refusal is not None:
            if profile is not None:
                raise PlannerError(f"profile {path}: {refusal}")
            return None, f"profile {path} passed over: {refusal}"
    return chosen, None


def select_cost_model(model: ModelSpec, gpu: GpuSpec, *, tp: int = 1, dtype_bytes: int = 2,
                      block_size: int = 16, profile: str | Path | None = None,
                      cost_model: str | None = None, weight_format: WeightFormat | None = None,
                      kv_cache_dtype: str = "auto", max_num_seqs: int = 256,
                      max_num_batched_tokens: int | None = None, moe: MoeParallel | None = None,
                      async_scheduling: bool = False, node_link: str = NODE_LINK,
                      custom_all_reduce: bool = True, performance_mode: str = "balanced",
                      speculative_tokens: int = 0, lora_rank: int | None = None) -> CostModel:
    """The cost model for `model` on `tp` x `gpu`; its `name` says which source was used.
    ``cost_model`` is the --cost-model option (None: auto). `max_num_seqs` and `max_num_batched_tokens`
    set vLLM's CUDA-graph capture sizes for the measured model. `moe` is a MoE's dp / expert parallelism
    and routing skew (planner/cost/moe.py); a calibrated profile timed one GPU's own routing, so it
    prices neither dp > 1 nor an assumed skew. `async_scheduling` (vLLM's --async-scheduling) hides the
    measured model's fitted host time behind the GPU; no other model separates vLLM's host time (the
    roofline has none, a profile times this engine's steps whole), so they price the same steps and
    async scheduling moves only the step a request joins (planner/sim/engine.py). `node_link` is the
    network a collective crosses between nodes (planner/cost/nodes.py); `custom_all_reduce` False is vLLM's
    --disable-custom-all-reduce (the measured model prices NCCL's all-reduce); `performance_mode` vLLM's
    --performance-mode and `speculative_tokens` the K of speculative decoding (both set its CUDA-graph sizes).
    `lora_rank` (--enable-lora's --max-lora-rank): a calibrated profile must have timed adapters of that rank,
    else it is passed over (refused when asked for), as for a format it cannot price."""
    model_ = _select(model, gpu, tp=tp, dtype_bytes=dtype_bytes, block_size=block_size, profile=profile,
                     cost_model=cost_model, weight_format=weight_format, kv_cache_dtype=kv_cache_dtype,
                     graphs={"max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_num_batched_tokens,
                             "async_scheduling": async_scheduling, "custom_all_reduce": custom_all_reduce,
                             "performance_mode": performance_mode, "speculative_tokens": speculative_tokens},
                     moe=moe, node_link=node_link, lora_rank=lora_rank)
    return model_


def _select(model: ModelSpec, gpu: GpuSpec, *, tp: int, dtype_bytes: int, block_size: int,
            profile: str | Path | None, cost_model: str | None, weight_format: WeightFormat | None,
            kv_cache_dtype: str, graphs: dict, moe: MoeParallel | None,
            node_link: str = NODE_LINK, lora_rank: int | None = None) -> CostModel:
    """select_cost_model's choice; `graphs` are the measured model's own settings (CUDA graphs, scheduling,
    all-reduce)."""
    if cost_model is not None and cost_model.strip().lower().startswith("linear:"):
        if profile is not None:
            raise PlannerError("--profile belongs to the calibrated cost model, not --cost-model linear")
        return parse_linear(cost_model.strip().lower())
    choice = parse_cost_model(cost_model)
    if profile is not None and choice in ("measured", "roofline"):
        raise PlannerError(f"--profile belongs to the calibrated cost model, not --cost-model {choice}")
    formats = {"weight_format": weight_format, "kv_cache_dtype": kv_cache_dtype, "moe": moe, "node_link": node_link}
    if choice == "roofline":
        return RooflineCostModel(model, gpu, tp=tp, dtype_bytes=dtype_bytes, block_size=block_size, **formats)
    if choice in ("auto", "calibrated"):
        if weight_format is not None or _moe_refusal(moe):
            refusal = _moe_refusal(moe) or _format_refusal(weight_format, kv_cache_dtype, "auto")
            if choice == "calibrated" or profile is not None:
                raise PlannerError(refusal)
            calibrated, near_miss = None, refusal if Path(profile_path(gpu.name, model.name)).is_file() else None
        else:
            calibrated, near_miss = _calibrated(model, gpu, tp, profile, block_size, engine_dtype(gpu, dtype_bytes),
                                                kv_cache_dtype)
            refusal = None if calibrated is None else _lora_refusal(calibrated, lora_rank)
            if refusal is not None:
                if choice == "calibrated" or profile is not None:
                    raise PlannerError(refusal)
                calibrated, near_miss = None, refusal
        if calibrated is not None:
            return _at_block_size(calibrated, block_size)
        if choice == "calibrated":
            raise PlannerError(near_miss or f"no profile of {model.name} on {gpu.name}: run `planner profile` "
                                            f"on that GPU or pass --profile FILE")
        fallback = _fallback(model, gpu, tp, dtype_bytes, block_size, choice, graphs, **formats)
        # why a profile that exists was not used, else why the measured tables were not (None: neither)
        fallback.profile_note = near_miss or getattr(fallback, "profile_note", None)
        return fallback
    return _fallback(model, gpu, tp, dtype_bytes, block_size, choice, graphs, **formats)


def _fallback(model: ModelSpec, gpu: GpuSpec, tp: int, dtype_bytes: int, block_size: int, choice: str,
              graphs: dict, **formats) -> CostModel:
    if choice == "measured":
        return MeasuredCostModel(model, gpu, tp=tp, dtype_bytes=dtype_bytes, block_size=block_size, **formats,
                                 **graphs)
    if gpu.measured_system is not None and dtype_bytes == 2:
        try:
            return MeasuredCostModel(model, gpu, tp=tp, dtype_bytes=dtype_bytes, block_size=block_size, **formats,
                                     **graphs)
        except PlannerError as exc:     # the tables do not cover this model's shape: the roofline does
            roofline = RooflineCostModel(model, gpu, tp=tp, dtype_bytes=dtype_bytes, block_size=block_size,
                                         **formats)
            roofline.profile_note = f"no profile; roofline cost model, as the measured tables do not cover it ({exc})"
            return roofline
    return RooflineCostModel(model, gpu, tp=tp, dtype_bytes=dtype_bytes, block_size=block_size, **formats)


def _at_block_size(cost_model, block_size: int):
    """A calibrated model priced at `block_size` rather than the block size it was profiled at."""
    profile = getattr(cost_model, "profile", None)
    if profile is None or not hasattr(cost_model, "scale_decode_attention"):
        return cost_model
    profiled = profile.block_size
    backend = "cpu" if profile.device.gpu == "cpu" else "cuda"
    cost_model.scale_decode_attention(decode_attention_factor(block_size, reference=profiled, backend=backend))
    return cost_model
