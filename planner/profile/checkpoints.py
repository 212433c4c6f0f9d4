"""Model folders for live runs and profiles: a user's checkpoint, or a catalog architecture, random weights.

No hub: a catalog name becomes a checkpoint folder built from the true
architecture with random weights (timing does not depend on weight values),
saved with ``save_pretrained(safe_serialization=True)`` and then loaded
through the same path as a user's checkpoint (`model_folder` keeps one per
model in a cache directory). A model too large for the device is profiled as
a 1- and a 2-layer model instead; their difference is one layer's cost, so
full = t1 + (layers - 1) * (t2 - t1) (the fixed part, embeddings and LM head,
is in t1 once).
"""
from __future__ import annotations

import os
from pathlib import Path

from planner.catalog import ModelSpec, resolve_model
from planner.errors import PlannerError
from planner.profile.byte_tokenizer import build_byte_tokenizer


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
        tmp = folder.with_name(folder.name + ".partial")
        build_checkpoint(model, spec, tmp)
        _add_tokenizer(tmp)
        tmp.rename(folder)   # atomic: a half-written folder is never mistaken for a model
    elif not (folder / "tokenizer.json").exists():   # a folder cached before tokenizers were added
        _add_tokenizer(folder)
    return str(folder), spec


def _add_tokenizer(folder: Path) -> None:
    """A random-weight catalog model gets a deterministic byte-level tokenizer, so text prompts work."""
    build_byte_tokenizer(folder)


# CPU runs are fp32 (4 bytes per weight): above this many parameters a full
# model takes minutes per grid point and tens of GB of RAM, so it is scaled.
CPU_FULL_MODEL_MAX_PARAMS = 1.5e9
# On a GPU the full model must leave room for activations and a KV cache.
GPU_FULL_MODEL_MAX_FRACTION = 0.6


def needs_per_layer(spec: ModelSpec, device, dtype, memory_bytes: int) -> bool:
    """Whether `planner profile` must time 1- and 2-layer models instead of the full one (torch device, dtype)."""
    if device.type == "cpu":
        return spec.num_params > CPU_FULL_MODEL_MAX_PARAMS
    dtype_bytes = dtype.itemsize
    return spec.weight_bytes(dtype_bytes) > GPU_FULL_MODEL_MAX_FRACTION * memory_bytes


def _config(model: str, spec: ModelSpec, num_layers: int | None):
    folder = Path(model)
    if (folder / "config.json").is_file():
        from engine.models.loader import read_config   # transformers, like torch: only a build needs it

        config = read_config(folder)
    else:
        config = spec.to_hf_config()
    if num_layers is not None:
        config.num_hidden_layers = num_layers   # attribute_map turns this into n_layer for GPT-2
    return config


def build_checkpoint(model: str, spec: ModelSpec, folder: str | os.PathLike, num_layers: int | None = None) -> str:
    """Write a random-weight checkpoint of `spec` (optionally with `num_layers` layers) into `folder`."""
    import torch                                    # torch and transformers: only a build needs them
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from engine.models import MODEL_CLASSES         # the engine's models, like torch: only a build needs them

    if spec.model_type not in MODEL_CLASSES:        # refused before tens of GB of random weights are made
        raise PlannerError(f"the engine does not run {spec.model_type} models ({spec.name}; it runs "
                           f"{', '.join(MODEL_CLASSES)}): price it with --cost-model measured or roofline")
    hf_logging.disable_progress_bar()          # our own progress bar is the one the user watches
    config = _config(model, spec, num_layers)
    torch.manual_seed(0)
    try:
        hf_model = AutoModelForCausalLM.from_config(config)
    except (ValueError, KeyError) as exc:
        raise PlannerError(f"cannot build model {spec.name!r} from its config: {exc}") from None
    hf_model.save_pretrained(folder, safe_serialization=True)
    del hf_model
    return str(folder)
