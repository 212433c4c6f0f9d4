"""Paged implementations of the supported HF architectures and their loader."""

from engine.models.loader import MODEL_CLASSES, load_model, resolve_device, resolve_dtype

__all__ = ["MODEL_CLASSES", "load_model", "resolve_device", "resolve_dtype"]
