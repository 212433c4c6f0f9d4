"""Reading a local HF checkpoint's safetensors and copying tensors into a model.

Each model maps HF names to its own parameters explicitly; this module only
streams the tensors and keeps the books, so that a missing, misshapen or
unknown weight is an error at load time instead of garbage at generation time.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from itertools import accumulate
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn


def safetensors_files(folder: str | Path) -> list[Path]:
    """The checkpoint's weight files: those the shard index names, else every *.safetensors."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [folder / name for name in sorted(set(weight_map.values()))]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {folder} (only safetensors checkpoints are supported)")
    return files


def _open(path: Path):
    try:
        return safe_open(str(path), framework="pt", device="cpu")
    except Exception as exc:   # noqa: BLE001 - safetensors' own error type: a file that is not a checkpoint
        raise ValueError(f"{path}: not a safetensors checkpoint ({exc})") from None


def iter_safetensors(folder: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, CPU tensor) for every tensor of the checkpoint, one file open at a time."""
    for path in safetensors_files(folder):
        with _open(path) as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def tensor_count(folder: str | Path) -> int:
    """How many tensors the checkpoint holds (its files' headers only)."""
    total = 0
    for path in safetensors_files(folder):
        with _open(path) as f:
            total += len(f.keys())
    return total


class WeightLoader:
    """Copies checkpoint tensors into a model's parameters and records what was filled."""

    def __init__(self, model: nn.Module):
        self.params = dict(model.named_parameters())
        # elements filled per parameter, keyed by shard so a fused parameter
        # is complete only when every one of its source matrices has arrived
        self.filled: dict[str, dict[str, int]] = {}

    def _param(self, name: str) -> nn.Parameter:
        if name not in self.params:
            raise KeyError(f"checkpoint weight maps to {name!r}, which the model does not have")
        return self.params[name]

    def load(self, name: str, tensor: torch.Tensor) -> None:
        """The whole parameter ``name`` from ``tensor`` (same shape)."""
        param = self._param(name)
        if tuple(tensor.shape) != tuple(param.shape):
            raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != model shape {tuple(param.shape)}")
        with torch.no_grad():
            param.copy_(tensor)
        self.filled.setdefault(name, {})["all"] = param.numel()

    def load_rows(self, name: str, tensor: torch.Tensor, start: int, size: int, shard: str) -> None:
        """Rows [start, start + size) of a fused parameter (e.g. the K part of qkv_proj)."""
        param = self._param(name)
        if tuple(tensor.shape) != (size, *param.shape[1:]):
            expected = (size, *param.shape[1:])
            raise ValueError(f"{name}[{shard}]: checkpoint shape {tuple(tensor.shape)} != expected {expected}")
        with torch.no_grad():
            param[start : start + size].copy_(tensor)
        self.filled.setdefault(name, {})[shard] = tensor.numel()

    def load_slice(self, name: str, tensor: torch.Tensor, index, shard: str) -> None:
        """``param[index]`` from ``tensor`` (same shape): e.g. one expert's gate rows of a fused
        [experts, 2 * intermediate, hidden] parameter, ``index = (expert, slice(0, intermediate))``."""
        param = self._param(name)
        target = param[index]
        if tuple(tensor.shape) != tuple(target.shape):
            raise ValueError(f"{name}[{shard}]: checkpoint shape {tuple(tensor.shape)} != expected {tuple(target.shape)}")
        with torch.no_grad():
            target.copy_(tensor)
        self.filled.setdefault(name, {})[shard] = tensor.numel()

    def unexpected(self, name: str) -> None:
        raise ValueError(f"checkpoint weight {name!r} has no place in the model (unknown name)")

    def is_loaded(self, name: str) -> bool:
        return name in self.params and sum(self.filled.get(name, {}).values()) == self.params[name].numel()

    def missing(self) -> list[str]:
        return [name for name in self.params if not self.is_loaded(name)]


def lora_slices(hf: str, own: str, fused: str, sizes: dict[str, int],
                whole: bool) -> dict[str, tuple[str, int, int]]:
    """LoRA targets of one fused projection ``own + fused``: HF's separate modules ``hf + name``, each its
    rows in turn (``sizes``, in the fused order); or, ``whole``, the checkpoint's own fused module."""
    if whole:
        return {hf + fused: (own + fused, 0, sum(sizes.values()))}
    starts = [0, *accumulate(sizes.values())]
    return {hf + name: (own + fused, start, size) for (name, size), start in zip(sizes.items(), starts)}
