"""Hardware and model catalogs: `resolve_gpu("a100")`, `resolve_model("opt-13b")`."""

from planner.catalog.base import Catalog
from planner.catalog.gpus import GIB, SM100_FAMILIES, GpuSpec, gpu_variant_for_memory, list_gpus, resolve_gpu
from planner.catalog.models import ModelSpec, list_models, model_ids, resolve_model

__all__ = [
    "GIB", "SM100_FAMILIES", "Catalog", "GpuSpec", "ModelSpec", "gpu_variant_for_memory", "list_gpus", "list_models",
    "model_ids", "resolve_gpu", "resolve_model",
]
