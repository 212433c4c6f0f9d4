"""Pick a kernel backend and wrap it behind one checked interface.

The backend is chosen per device type of the tensors an op gets: CUDA
tensors run the CUDA kernels, CPU tensors the C++/OpenMP kernels, so a CPU
runner works on a GPU host. ``PAGED_KERNELS=torch`` asks for the pure-torch
reference everywhere. A CUDA build failure is an error (never a silent
fallback on a GPU); a CPU build failure falls back to the torch reference and
says why. ``load_ops(name)`` is the strict form: it raises if that backend is
unusable.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from types import ModuleType

import torch

from cuda_ext import build, checks, reference

logger = logging.getLogger("cuda_ext")

BACKENDS = ("cuda", "cpu", "torch")
ENV_VAR = "PAGED_KERNELS"


class BackendUnavailable(RuntimeError):
    """A requested kernel backend cannot be built or cannot run here."""


@dataclass(frozen=True)
class KernelOps:
    """The five paged-KV ops of one backend, each validating its arguments first.

    ``sinks`` (paged attention only): None, or an fp32 [num_heads] tensor of
    per-head logits that join each softmax as a value-less token (gpt-oss).

    ``kv_cache_dtype``, ``k_scale``, ``v_scale`` (reshape_and_cache, paged attention; vLLM's names): an
    FP8 cache (dtype float8_e4m3fn, kv_cache_dtype "fp8") stores values divided by the per-tensor scale
    and reads them times it; kv_cache_dtype None reads the cache's dtype.

    ``check_values=False`` skips the checks that read index tensors' values
    (block ids, slots, lengths on the CPU), for a caller that checked them
    once per step itself; shapes, dtypes and devices are always checked.

    ``backend`` names the backend; ``reason`` says why it was chosen (or why a
    preferred one was not). Every op writes into the tensors it is given.
    """

    backend: str
    reason: str
    impl: ModuleType

    def reshape_and_cache(self, key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype=None,
                          k_scale=1.0, v_scale=1.0, *, check_values=True) -> None:
        checks.check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, check_values)
        k_scale, v_scale = checks.kv_scales(kv_cache_dtype, key_cache, k_scale, v_scale)
        checks.check_backend_device(self.backend, key_cache)
        # Keys and values are often views of a fused QKV projection; the kernels read them densely.
        self.impl.reshape_and_cache(key.contiguous(), value.contiguous(), key_cache, value_cache,
                                    slot_mapping.contiguous(), k_scale, v_scale)

    def paged_attention_v1(self, out, query, key_cache, value_cache, num_kv_heads, scale,
                           block_tables, seq_lens, block_size, max_seq_len, sinks=None, kv_cache_dtype=None,
                           k_scale=1.0, v_scale=1.0, *, check_values=True) -> None:
        self._attention(self.impl.paged_attention_v1, out, query, key_cache, value_cache, num_kv_heads, scale,
                        block_tables, seq_lens, block_size, max_seq_len, sinks, check_values,
                        (kv_cache_dtype, k_scale, v_scale))

    def paged_attention_v2(self, out, query, key_cache, value_cache, num_kv_heads, scale,
                           block_tables, seq_lens, block_size, max_seq_len, sinks=None, kv_cache_dtype=None,
                           k_scale=1.0, v_scale=1.0, *, check_values=True) -> None:
        self._attention(self.impl.paged_attention_v2, out, query, key_cache, value_cache, num_kv_heads, scale,
                        block_tables, seq_lens, block_size, max_seq_len, sinks, check_values,
                        (kv_cache_dtype, k_scale, v_scale))

    def _attention(self, kernel, out, query, key_cache, value_cache, num_kv_heads, scale,
                   block_tables, seq_lens, block_size, max_seq_len, sinks, check_values, kv) -> None:
        checks.check_paged_attention(out, query, key_cache, value_cache, num_kv_heads,
                                     block_tables, seq_lens, block_size, max_seq_len, check_values)
        kv_scales = checks.kv_scales(kv[0], key_cache, kv[1], kv[2])
        checks.check_sinks(sinks, query)
        checks.check_compiled_shapes(self.backend, block_size, query.shape[-1])
        checks.check_backend_device(self.backend, query)
        kernel(out, query.contiguous(), key_cache, value_cache, int(num_kv_heads), float(scale),
               block_tables.contiguous(), seq_lens.contiguous(), int(block_size), int(max_seq_len), sinks,
               *kv_scales)

    def copy_blocks(self, key_caches, value_caches, block_mapping) -> None:
        key_caches, value_caches = list(key_caches), list(value_caches)
        checks.check_copy_blocks(key_caches, value_caches, block_mapping)
        checks.check_backend_device(self.backend, key_caches[0])
        self.impl.copy_blocks(key_caches, value_caches, block_mapping.contiguous())

    def swap_blocks(self, src, dst, block_mapping) -> None:
        checks.check_swap_blocks(src, dst, block_mapping)
        self.impl.swap_blocks(src, dst, block_mapping.contiguous())

    def describe(self) -> str:
        return f"paged kernels: backend={self.backend} ({self.reason})"


def _short(error: BaseException) -> str:
    """First line of an error (compiler logs are long), for one-line reasons."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def load_ops(backend: str) -> KernelOps:
    """Ops of exactly this backend; raises BackendUnavailable if it cannot be used here."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown kernel backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "torch":
        return KernelOps("torch", "pure-torch reference", reference)
    if backend == "cuda":
        if not torch.cuda.is_available():
            raise BackendUnavailable("cuda backend needs a CUDA device: torch.cuda.is_available() is False")
        try:
            module = build.build_cuda_extension()
        except Exception as error:  # compiler missing, nvcc error, ABI mismatch...
            raise BackendUnavailable(
                f"cuda extension failed to build/load: {_short(error)} (full compiler log: python -c "
                f"'from cuda_ext import build; build.build_cuda_extension(verbose=True)')") from error
        return KernelOps("cuda", f"CUDA kernels on {torch.cuda.get_device_name()}", module)
    try:
        module = build.build_cpu_extension()
    except Exception as error:
        raise BackendUnavailable(f"cpu extension failed to build/load: {_short(error)}") from error
    return KernelOps("cpu", f"C++/OpenMP kernels, {torch.get_num_threads()} threads", module)


# Which backends may serve tensors on each kind of device, best first.
DEVICE_BACKENDS = {"cuda": ("cuda", "torch"), "cpu": ("cpu", "torch")}


def _requested() -> str:
    requested = os.environ.get(ENV_VAR, "").strip().lower()
    if requested and requested not in BACKENDS:
        raise ValueError(f"{ENV_VAR}={requested!r} is not a kernel backend; choose one of {', '.join(BACKENDS)}")
    return requested


def pick_ops(device_type: str | None = None) -> KernelOps:
    """The backend for tensors on ``device_type`` (default: CUDA if present, else CPU).

    CUDA tensors get the CUDA kernels or, if PAGED_KERNELS=torch, the torch
    reference; a CUDA build that fails raises BackendUnavailable, loudly: on a
    GPU a silent fallback would run (and profile) the wrong kernels. CPU
    tensors get the C++ kernels, or the torch reference when they do not build
    (the reason is kept in ``describe()``). PAGED_KERNELS=cuda has no meaning
    for CPU tensors and is noted, not obeyed; PAGED_KERNELS=cpu for CUDA
    tensors is an error.
    """
    if device_type is None:
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if device_type not in DEVICE_BACKENDS:
        raise BackendUnavailable(f"no paged kernels for {device_type} tensors (cuda and cpu are supported)")
    requested = _requested()
    candidates = DEVICE_BACKENDS[device_type]
    if device_type == "cuda":
        if requested == "cpu":
            raise BackendUnavailable(f"{ENV_VAR}=cpu cannot run CUDA tensors; use {ENV_VAR}=cuda or torch")
        chosen = load_ops("torch" if requested == "torch" else "cuda")
        why = chosen.reason + (f", requested by {ENV_VAR}" if requested == chosen.backend else "")
        return KernelOps(chosen.backend, why, chosen.impl)
    skipped: list[str] = []
    if requested == "torch":
        candidates = ("torch",)
    for name in candidates:
        try:
            chosen = load_ops(name)
        except BackendUnavailable as error:
            skipped.append(f"{name} unavailable: {error}")
            logger.warning("paged kernels: %s unavailable (%s); using the torch reference", name, error)
            continue
        why = [chosen.reason + (f", requested by {ENV_VAR}" if requested == name else "")]
        if requested and requested != name:
            why.insert(0, f"{ENV_VAR}={requested} could not be used for CPU tensors")
        if device_type == "cpu" and not requested and not torch.cuda.is_available():
            why.append("cuda unavailable: torch.cuda.is_available() is False")
        chosen = KernelOps(chosen.backend, "; ".join(why + skipped), chosen.impl)
        logger.info(chosen.describe())
        return chosen
    raise AssertionError("the torch backend is always available")  # pragma: no cover
