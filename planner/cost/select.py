"""Which cost model prices a simulation: a measured profile when there is one, else the roofline.

Order: an explicit profile file; the default profile for this (GPU, model) pair
if someone has run `planner profile` for it; the roofline model from datasheet
peaks otherwise. The calibrated model lives in its own module, imported here
lazily so that the roofline path works (and stays cheap to import) without it.
"""
from __future__ import annotations

from pathlib import Path

from planner.catalog import GpuSpec, ModelSpec
from planner.cost.roofline import RooflineCostModel
from planner.cost.shape import CostModel
from planner.errors import PlannerError


def select_cost_model(model: ModelSpec, gpu: GpuSpec, *, tp: int = 1, dtype_bytes: int = 2,
                      block_size: int = 16, profile: str | Path | None = None,
                      cost_model: str | None = None) -> CostModel:
    """The cost model for `model` on `tp` x `gpu`; its `name` says which source was used.
    ``cost_model`` ``linear:A,B`` overrides them all (planner/cost/linear.py)."""
    if cost_model is not None:
        from planner.cost.linear import parse_linear
        return parse_linear(cost_model)
    if profile is not None:
        try:
            from planner.cost.calibrated import CalibratedCostModel
        except ImportError as exc:
            raise PlannerError(f"--profile {profile}: the calibrated cost model is unavailable ({exc})") from None
        path = Path(profile)
        if not path.is_file():
            raise PlannerError(f"profile {path}: no such file")
        return CalibratedCostModel.from_file(path, model=model, gpu=gpu, tp=tp)
    try:
        from planner.cost.calibrated import CalibratedCostModel, profile_path
    except ImportError:
        # No calibrated model installed: nobody can have profiled this pair.
        return RooflineCostModel(model, gpu, tp=tp, dtype_bytes=dtype_bytes, block_size=block_size)
    default = Path(profile_path(gpu.name, model.name))
    if default.is_file():
        return CalibratedCostModel.from_file(default, model=model, gpu=gpu, tp=tp)
    return RooflineCostModel(model, gpu, tp=tp, dtype_bytes=dtype_bytes, block_size=block_size)
