"""Which cost model prices a simulation.

Order (`auto`): our own calibrated profile of this (GPU, model) pair (an
explicit --profile file, else profiles/<gpu>/<model>.json when someone ran
`planner profile`), then the `measured` model where NVIDIA's vLLM op tables
cover the GPU and the model's attention shape, then the roofline model from
datasheet peaks. `--cost-model calibrated|measured|roofline` forces one; a
forced model that cannot be built is a one-line error, never a silent
fallback. The calibrated and measured models are imported lazily so that the
roofline path stays cheap to import.
"""
from __future__ import annotations

from pathlib import Path

from planner.catalog import GpuSpec, ModelSpec
from planner.cost.roofline import RooflineCostModel
from planner.cost.shape import CostModel
from planner.errors import PlannerError

COST_MODELS = ("auto", "calibrated", "measured", "roofline")


def parse_cost_model(text: str | None) -> str:
    """The --cost-model option: one of COST_MODELS (None means auto). Anything else is a one-line error."""
    choice = (text or "auto").strip().lower()
    if choice not in COST_MODELS:
        raise PlannerError(f"--cost-model {text!r}: choose one of {', '.join(COST_MODELS)}, or linear:A,B")
    return choice


def _calibrated(model: ModelSpec, gpu: GpuSpec, tp: int, profile: str | Path | None) -> CostModel | None:
    """The calibrated model from `profile` or the default profile path; None when neither exists."""
    try:
        from planner.cost.calibrated import CalibratedCostModel, profile_path
    except ImportError as exc:
        if profile is not None:
            raise PlannerError(f"--profile {profile}: the calibrated cost model is unavailable ({exc})") from None
        return None
    if profile is not None:
        path = Path(profile)
        if not path.is_file():
            raise PlannerError(f"profile {path}: no such file")
    else:
        path = Path(profile_path(gpu.name, model.name))
        if not path.is_file():
            return None
    return CalibratedCostModel.from_file(path, model=model, gpu=gpu, tp=tp)


def select_cost_model(model: ModelSpec, gpu: GpuSpec, *, tp: int = 1, dtype_bytes: int = 2,
                      block_size: int = 16, profile: str | Path | None = None,
                      cost_model: str | None = None) -> CostModel:
    """The cost model for `model` on `tp` x `gpu`; its `name` says which source was used.
    ``cost_model`` is the --cost-model option (None: auto)."""
    if cost_model is not None and cost_model.strip().lower().startswith("linear:"):
        from planner.cost.linear import parse_linear   # what-if: A + B x scheduled tokens per step
        if profile is not None:
            raise PlannerError("--profile belongs to the calibrated cost model, not --cost-model linear")
        return parse_linear(cost_model.strip().lower())
    choice = parse_cost_model(cost_model)
    if profile is not None and choice in ("measured", "roofline"):
        raise PlannerError(f"--profile belongs to the calibrated cost model, not --cost-model {choice}")
    if choice == "roofline":
        return RooflineCostModel(model, gpu, tp=tp, dtype_bytes=dtype_bytes, block_size=block_size)
    if choice in ("auto", "calibrated"):
        calibrated = _calibrated(model, gpu, tp, profile)
        if calibrated is not None:
            return _at_block_size(calibrated, block_size)
        if choice == "calibrated":
            raise PlannerError(f"no profile of {model.name} on {gpu.name}: run `planner profile` on that GPU "
                               f"or pass --profile FILE")
    from planner.cost.measured import MeasuredCostModel
    if choice == "measured":
        return MeasuredCostModel(model, gpu, tp=tp, dtype_bytes=dtype_bytes, block_size=block_size)
    if gpu.measured_system is not None and dtype_bytes == 2:
        try:
            return MeasuredCostModel(model, gpu, tp=tp, dtype_bytes=dtype_bytes, block_size=block_size)
        except PlannerError:
            pass     # the tables do not cover this model's shape: the roofline does
    return RooflineCostModel(model, gpu, tp=tp, dtype_bytes=dtype_bytes, block_size=block_size)


def _at_block_size(cost_model, block_size: int):
    """A calibrated model priced at `block_size` rather than the block size it was profiled at."""
    from planner.block_size_factors import decode_attention_factor

    profile = getattr(cost_model, "profile", None)
    if profile is None or not hasattr(cost_model, "scale_decode_attention"):
        return cost_model
    profiled = profile.block_size
    backend = "cpu" if profile.device.gpu == "cpu" else "cuda"
    cost_model.scale_decode_attention(decode_attention_factor(block_size, reference=profiled, backend=backend))
    return cost_model
