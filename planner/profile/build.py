"""Random-weight checkpoints of the profiled architecture, loaded the way the engine loads models.

Timing does not depend on weight values, so the catalog architecture (or a
local folder's config.json) is instantiated with random weights, saved with
save_pretrained(safe_serialization=True) and read back by ModelRunner: the same
path a real checkpoint takes. A model too large for the device is built with 1
and with 2 layers instead; their difference is one layer's cost, so
full = t1 + (layers - 1) * (t2 - t1) (the fixed part, embeddings and LM head,
is in t1 once).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from planner.catalog import ModelSpec, resolve_model
from planner.errors import PlannerError

# CPU runs are fp32 (4 bytes per weight): above this many parameters a full
# model takes minutes per grid point and tens of GB of RAM, so it is scaled.
CPU_FULL_MODEL_MAX_PARAMS = 1.5e9
# On a GPU the full model must leave room for activations and a KV cache.
GPU_FULL_MODEL_MAX_FRACTION = 0.6


def model_spec(model: str) -> ModelSpec:
    return resolve_model(model)


def needs_per_layer(spec: ModelSpec, device: torch.device, dtype: torch.dtype, memory_bytes: int) -> bool:
    if device.type == "cpu":
        return spec.num_params > CPU_FULL_MODEL_MAX_PARAMS
    dtype_bytes = torch.empty((), dtype=dtype).element_size()
    return spec.weight_bytes(dtype_bytes) > GPU_FULL_MODEL_MAX_FRACTION * memory_bytes


def _config(model: str, spec: ModelSpec, num_layers: int | None):
    folder = Path(model)
    if (folder / "config.json").is_file():
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(folder, local_files_only=True)
    else:
        config = spec.to_hf_config()
    if num_layers is not None:
        config.num_hidden_layers = num_layers   # attribute_map turns this into n_layer for GPT-2
    return config


def build_checkpoint(model: str, spec: ModelSpec, folder: str | os.PathLike, num_layers: int | None = None) -> str:
    """Write a random-weight checkpoint of `spec` (optionally with `num_layers` layers) into `folder`."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

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
