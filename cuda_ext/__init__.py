"""Paged-KV kernels: CUDA, CPU C++ (OpenMP) and a pure-torch reference.

``from cuda_ext import ops`` gives ops that dispatch on the device of the
tensors they get: CUDA tensors run the CUDA kernels and CPU tensors the C++
ones, so a CPU runner works on a GPU host. ``ops_for(device)`` gives one
device's backend (``.backend`` is ``"cuda"``, ``"cpu"`` or ``"torch"``);
``ops.backend`` names the default device's. A backend is picked on first use,
not at ``import cuda_ext``, because it may compile an extension. A CUDA build
failure raises; a CPU one falls back to the torch reference and
``describe()`` says why. ``load_ops(name)`` returns one backend or raises.
"""

from __future__ import annotations

import torch

from cuda_ext.loader import BACKENDS, BackendUnavailable, KernelOps, load_ops, pick_ops

__all__ = ["BACKENDS", "BackendUnavailable", "KernelOps", "describe", "load_ops", "ops", "ops_for", "reset"]

_picked: dict[str, KernelOps] = {}


def ops_for(device: torch.device | str | None = None) -> KernelOps:
    """The kernels for tensors on ``device`` (default: CUDA if present, else the CPU)."""
    if device is None:
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    else:
        kind = device.type if isinstance(device, torch.device) else torch.device(device).type
    chosen = _picked.get(kind)
    if chosen is None:
        chosen = _picked[kind] = pick_ops(kind)
    return chosen


def describe(device: torch.device | str | None = None) -> str:
    """One line: which backend serves ``device``'s tensors and why."""
    return ops_for(device).describe()


def reset() -> None:
    """Forget the picked backends, so the next use re-reads PAGED_KERNELS (used by tests)."""
    _picked.clear()


class DeviceOps:
    """The five ops, each sent to the backend of its tensors' device."""

    @property
    def backend(self) -> str:
        return ops_for().backend

    def describe(self) -> str:
        return ops_for().describe()

    def reshape_and_cache(self, key, value, key_cache, value_cache, slot_mapping, *args, **options) -> None:
        ops_for(key_cache.device).reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, *args, **options)

    def paged_attention_v1(self, out, query, *args, **options) -> None:
        ops_for(query.device).paged_attention_v1(out, query, *args, **options)

    def paged_attention_v2(self, out, query, *args, **options) -> None:
        ops_for(query.device).paged_attention_v2(out, query, *args, **options)

    def copy_blocks(self, key_caches, value_caches, block_mapping) -> None:
        key_caches = list(key_caches)
        ops_for(key_caches[0].device if key_caches else None).copy_blocks(key_caches, value_caches, block_mapping)

    def swap_blocks(self, src, dst, block_mapping) -> None:
        # Between host and device memory the device's kernels do the copy.
        device = dst.device if src.device.type == "cpu" else src.device
        ops_for(device).swap_blocks(src, dst, block_mapping)


ops = DeviceOps()
