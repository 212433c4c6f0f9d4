"""Model folders for live runs: a user's local checkpoint, or a catalog architecture with random weights.

No hub: a catalog name becomes a checkpoint folder built from the true
architecture with random weights (timing does not depend on weight values),
saved once with ``save_pretrained`` under a cache directory and then loaded
through the same path as a user's checkpoint.
"""
from __future__ import annotations

import os
from pathlib import Path

from planner.catalog import ModelSpec, resolve_model
from planner.errors import PlannerError


def cache_dir() -> Path:
    return Path(os.environ.get("PLANNER_MODEL_CACHE", Path.home() / ".cache" / "paged_planner" / "models"))


def model_folder(model: str, *, max_params: float = 2e9) -> tuple[str, ModelSpec]:
    """(folder, spec) for a local folder with config.json, or a catalog name."""
    path = Path(model)
    if (path / "config.json").exists():
        return str(path), ModelSpec.from_model_dir(path)
    spec = resolve_model(model)
    if spec.num_params > max_params:
        raise PlannerError(f"{spec.name} has {spec.num_params / 1e9:.1f}B parameters: too large to run live "
                           f"here; validate with a smaller model (e.g. opt-125m)")
    folder = cache_dir() / spec.name
    if not (folder / "config.json").exists():
        from planner.profile.build import build_checkpoint

        tmp = folder.with_name(folder.name + ".partial")
        build_checkpoint(model, spec, tmp)
        _add_tokenizer(tmp)
        tmp.rename(folder)   # atomic: a half-written folder is never mistaken for a model
    elif not (folder / "tokenizer.json").exists():   # a folder cached before tokenizers were added
        _add_tokenizer(folder)
    return str(folder), spec


def _add_tokenizer(folder: Path) -> None:
    """A random-weight catalog model gets a deterministic byte-level tokenizer, so text prompts work."""
    from planner.profile.byte_tokenizer import build_byte_tokenizer

    build_byte_tokenizer(folder)
