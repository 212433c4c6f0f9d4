"""JIT builds of the compiled backends with torch.utils.cpp_extension.load.

Builds are cached on disk, so only the first import on a machine pays for
compilation (torch rebuilds by itself when a source file changes). The cache
directory is ``$PAGED_KERNELS_BUILD_DIR`` or ``~/.cache/paged_planner/torch_extensions``;
it is keyed by the CPU's instruction-set flags because the CPU build uses
``-march=native`` and must not be reused on a different processor.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from types import ModuleType

CSRC = Path(__file__).resolve().parent / "csrc"
CPU_SOURCES = sorted((CSRC / "cpu").glob("*.cpp"))
CUDA_SOURCES = sorted((CSRC / "cuda").glob("*.cu")) + sorted((CSRC / "cuda").glob("*.cpp"))

# -fopenmp: at::parallel_for expands to an OpenMP region inside our code, which
# would silently run serially without it. -fno-math-errno lets expf vectorize.
CPU_CFLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno"]
CUDA_CFLAGS = ["-O3", "--use_fast_math", "-lineinfo"]


def _cpu_fingerprint() -> str:
    """Short hash of the CPU's feature flags (so -march=native builds are not shared across CPUs)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
        flags = next((line for line in text.splitlines() if line.startswith(("flags", "Features"))), "")
    except OSError:
        flags = ""
    import platform

    return hashlib.sha1(f"{platform.machine()} {flags}".encode()).hexdigest()[:10]


def build_root() -> Path:
    root = os.environ.get("PAGED_KERNELS_BUILD_DIR")
    if root:
        return Path(root)
    return Path.home() / ".cache" / "paged_planner" / "torch_extensions"


def _build_dir(name: str) -> Path:
    path = build_root() / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def build_cpu_extension(verbose: bool = False) -> ModuleType:
    """Compile (or load from cache) the C++/OpenMP kernels."""
    from torch.utils.cpp_extension import load

    name = f"paged_kernels_cpu_{_cpu_fingerprint()}"
    return load(
        name=name,
        sources=[str(path) for path in CPU_SOURCES],
        extra_cflags=CPU_CFLAGS,
        extra_ldflags=["-fopenmp"],
        build_directory=str(_build_dir(name)),
        verbose=verbose,
    )


def build_cuda_extension(verbose: bool = False) -> ModuleType:
    """Compile (or load from cache) the CUDA kernels; needs nvcc and a CUDA build of torch."""
    from torch.utils.cpp_extension import load

    name = "paged_kernels_cuda"
    return load(
        name=name,
        sources=[str(path) for path in CUDA_SOURCES],
        extra_cflags=["-O3"],
        extra_cuda_cflags=CUDA_CFLAGS,
        build_directory=str(_build_dir(name)),
        verbose=verbose,
    )
