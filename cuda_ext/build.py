"""JIT builds of the compiled backends with torch.utils.cpp_extension.load.

Builds are cached on disk under ``$PAGED_KERNELS_BUILD_DIR`` or
``~/.cache/paged_planner/torch_extensions``, one folder per build key. The key
is a hash of everything the binary depends on: the sources' contents, the
compiler flags, the torch and Python versions, and the processor it is built
for (the CPU's instruction-set flags, since the CPU build uses -march=native;
the GPU's compute capability for the CUDA build). A process whose key finds a
built library imports it directly, without asking ninja: ninja would also
compare absolute source paths and file times, so a second copy of the
sources (an installed package, another checkout) or a ``git checkout`` that
touched them rebuilt everything, silently, on the first ``LLM.generate()``.
A real compilation prints one line before and one with the time it took.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import sys
import time
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
    return hashlib.sha1(f"{platform.machine()} {flags}".encode()).hexdigest()[:10]


def cuda_arch() -> str:
    """The current GPU's compute capability as nvcc names it, e.g. ``sm_90``."""
    import torch

    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def build_key(folder: str, flags: list[str], target: str) -> str:
    """Hash of the sources in csrc/<folder>, the flags, the toolchain versions and the target processor."""
    import torch

    digest = hashlib.sha1()
    for path in sorted((CSRC / folder).iterdir()):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    digest.update(repr((flags, torch.__version__, torch.version.cuda, sys.version_info[:2], target)).encode())
    return digest.hexdigest()[:12]


def build_root() -> Path:
    root = os.environ.get("PAGED_KERNELS_BUILD_DIR")
    if root:
        return Path(root)
    return Path.home() / ".cache" / "paged_planner" / "torch_extensions"


def _build_dir(name: str) -> Path:
    path = build_root() / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def _import_built(name: str, folder: Path) -> ModuleType | None:
    """The library a previous process built for this key, or None."""
    library = folder / f"{name}.so"
    if not library.is_file():
        return None
    import torch  # noqa: F401  (the library links against torch's, which must be loaded first)

    spec = importlib.util.spec_from_file_location(name, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compile(what: str, name: str, verbose: bool, **load_args) -> ModuleType:
    from torch.utils.cpp_extension import load

    folder = _build_dir(name)
    module = None if verbose else _import_built(name, folder)
    if module is not None:
        return module
    print(f"paged kernels: compiling the {what} into {folder} (once per machine and source version; "
          "about a minute)...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    module = load(name=name, build_directory=str(folder), verbose=verbose, **load_args)
    print(f"paged kernels: {what} compiled in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    return module


def build_cpu_extension(verbose: bool = False) -> ModuleType:
    """Compile (or load from the cache) the C++/OpenMP kernels."""
    fingerprint = _cpu_fingerprint()
    name = f"paged_kernels_cpu_{fingerprint}_{build_key('cpu', CPU_CFLAGS, fingerprint)}"
    return _compile("CPU kernels", name, verbose, sources=[str(path) for path in CPU_SOURCES],
                    extra_cflags=CPU_CFLAGS, extra_ldflags=["-fopenmp"])


def build_cuda_extension(verbose: bool = False) -> ModuleType:
    """Compile (or load from the cache) the CUDA kernels for this GPU's architecture only.

    Needs nvcc and a CUDA build of torch. The folder is keyed by the GPU's
    compute capability: a build for sm_80 must not be loaded on an sm_90 GPU.
    """
    arch = cuda_arch()
    name = f"paged_kernels_cuda_{arch}_{build_key('cuda', CUDA_CFLAGS, arch)}"
    # torch's load() reads the target architectures from this variable.
    previous = os.environ.get("TORCH_CUDA_ARCH_LIST")
    os.environ["TORCH_CUDA_ARCH_LIST"] = f"{arch[3:-1]}.{arch[-1]}"
    try:
        return _compile(f"CUDA kernels for {arch}", name, verbose,
                        sources=[str(path) for path in CUDA_SOURCES],
                        extra_cflags=["-O3"], extra_cuda_cflags=CUDA_CFLAGS)
    finally:
        if previous is None:
            os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = previous
