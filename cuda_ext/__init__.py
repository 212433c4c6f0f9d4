"""Paged-KV kernels: CUDA, CPU C++ (OpenMP) and a pure-torch reference.

``from cuda_ext import ops`` gives the ops of the backend picked for this
machine (``ops.backend`` is ``"cuda"``, ``"cpu"`` or ``"torch"``). The pick
happens on first access, not at ``import cuda_ext``, because it may compile
the C++ extension; it never fails for a build problem (it falls back and
``describe()`` says why). ``load_ops(name)`` returns one backend or raises.
"""

from __future__ import annotations

from cuda_ext.loader import BACKENDS, BackendUnavailable, KernelOps, load_ops, pick_ops

__all__ = ["BACKENDS", "BackendUnavailable", "KernelOps", "describe", "load_ops", "ops", "reset"]

_picked: KernelOps | None = None


def _get_ops() -> KernelOps:
    global _picked
    if _picked is None:
        _picked = pick_ops()
    return _picked


def describe() -> str:
    """One line: which backend the loader picked and why."""
    return _get_ops().describe()


def reset() -> None:
    """Forget the picked backend, so the next access re-reads PAGED_KERNELS (used by tests)."""
    global _picked
    _picked = None


def __getattr__(name: str):
    # PEP 562: resolves `from cuda_ext import ops` lazily.
    if name == "ops":
        return _get_ops()
    raise AttributeError(f"module 'cuda_ext' has no attribute {name!r}")
