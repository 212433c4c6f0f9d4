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
from planner.profile_check import check_settings, engine_dtype, find_profile


def select_cost_model(model: ModelSpec, gpu: GpuSpec, *, tp: int = 1, dtype_bytes: int = 2,
                      block_size: int = 16, profile: str | Path | None = None) -> CostModel:
    """The cost model for `model` on `tp` x `gpu`; its `name` says which source was used."""
    if profile is not None:
        try:
            from planner.cost.calibrated import CalibratedCostModel
        except ImportError as exc:
            raise PlannerError(f"--profile {profile}: the calibrated cost model is unavailable ({exc})") from None
        path = Path(profile)
        if not path.is_file():
            raise PlannerError(f"profile {path}: no such file")
        chosen = CalibratedCostModel.from_file(path, model=model, gpu=gpu, tp=tp)
        if getattr(chosen, "profile", None) is not None:
            check_settings(chosen.profile, path, block_size=block_size, dtype=engine_dtype(gpu, dtype_bytes), tp=tp)
        return chosen
    try:
        from planner.cost.calibrated import CalibratedCostModel, profile_path
    except ImportError:
        # No calibrated model installed: nobody can have profiled this pair.
        return RooflineCostModel(model, gpu, tp=tp, dtype_bytes=dtype_bytes, block_size=block_size)
    # Any profile filed under this GPU whose model, block size, dtype and TP all match.
    default = Path(profile_path(gpu.name, model.name))
    found, near_miss = find_profile(default.parent, model, block_size=block_size,
                                    dtype=engine_dtype(gpu, dtype_bytes), tp=tp)
    if found is None and near_miss is None and default.is_file():
        found = default          # unreadable to find_profile: loading it names the damage
    if found is not None:
        return CalibratedCostModel.from_file(found, model=model, gpu=gpu, tp=tp)
    roofline = RooflineCostModel(model, gpu, tp=tp, dtype_bytes=dtype_bytes, block_size=block_size)
    roofline.profile_note = near_miss   # why a profile that exists was not used (None: there is none)
    return roofline
