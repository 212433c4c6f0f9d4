"""The CUDA kernels compile for sm_80 and sm_90 (no GPU needed, only nvcc).

A CUDA syntax or type error fails here even on a machine that cannot run the
kernels. The default test compiles each .cu with PAGED_CUDA_MINIMAL_INSTANTIATIONS
(one head size, one block size: every kernel template still compiled once per
dtype) and checks from ptxas's report that each kernel exists for each arch and
dtype; the full instantiation set (about 45 s on two cores) is marked slow.
The host-side bindings.cpp is syntax-checked with g++ against torch's headers.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

from cuda_ext import build
from engine.core.config import SUPPORTED_BLOCK_SIZES

ARCHS = ("80", "90")
CUDA_DIR = build.CSRC / "cuda"
CU_FILES = sorted(CUDA_DIR.glob("*.cu"))


def find_nvcc() -> str | None:
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home and (Path(cuda_home) / "bin" / "nvcc").exists():
        return str(Path(cuda_home) / "bin" / "nvcc")
    return shutil.which("nvcc") or (str(Path("/usr/local/cuda/bin/nvcc")) if Path("/usr/local/cuda/bin/nvcc").exists() else None)


NVCC = find_nvcc()
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not found (set CUDA_HOME or put nvcc on PATH)")


def cuda_include_dir() -> Path:
    """The toolkit's include dir (cuda_runtime.h, cuda_fp16.h, cuda_bf16.h)."""
    candidates = [Path(NVCC).resolve().parent.parent / "include", Path("/usr/local/cuda/include")]
    cuda_home = os.environ.get("CUDA_HOME")
    if cuda_home:
        candidates.insert(0, Path(cuda_home) / "include")
    for path in candidates:
        if (path / "cuda_runtime.h").exists():
            return path
    pytest.skip("CUDA runtime headers (cuda_runtime.h) not found next to nvcc")


def torch_include_dirs() -> list[str]:
    from torch.utils import cpp_extension

    # include_paths(device_type=...) in torch >= 2.6, include_paths(cuda=...) before;
    # the CPU flavour suffices (the CUDA one only adds CUDA_HOME/include, added below).
    try:
        return cpp_extension.include_paths(device_type="cpu")
    except TypeError:
        return cpp_extension.include_paths(cuda=False)


def nvcc_compile(source: Path, output: Path, *defines: str) -> str:
    command = [
        NVCC, "-c", str(source), "-o", str(output), "-std=c++17", "-O3", "--use_fast_math",
        *[f"-gencode=arch=compute_{arch},code=sm_{arch}" for arch in ARCHS],
        f"-I{CUDA_DIR}", f"-I{cuda_include_dir()}", *[f"-I{path}" for path in torch_include_dirs()],
        "-DTORCH_EXTENSION_NAME=paged_kernels_cuda", *defines,
        "-Xptxas", "-v",  # reports every compiled entry function per arch
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"nvcc failed for {source.name}:\n{result.stderr[-6000:]}"
    assert output.stat().st_size > 0
    return result.stderr


def entry_points(ptxas_report: str) -> dict[str, set[str]]:
    """arch -> mangled names of the kernels compiled for it."""
    found: dict[str, set[str]] = {arch: set() for arch in ARCHS}
    for name, arch in re.findall(r"Compiling entry function '(\S+)' for 'sm_(\d+)'", ptxas_report):
        found.setdefault(arch, set()).add(name)
    return found


# Mangled-name fragments: kernel template + its first template argument.
ATTENTION_DTYPES = {"float": "If", "half": "I6__half", "bfloat16": "I13__nv_bfloat16"}
# The attention kernel's second template argument: the cache type, the query's own (a substitution, S..._)
# or FP8 E4M3.
FP8_CACHE = "13__nv_fp8_e4m3"
EXPECTED_KERNELS = {
    "paged_attention.cu": [
        f"{kernel}{dtype}" for kernel in ("paged_attention_kernel", "paged_attention_reduce_kernel")
        for dtype in ATTENTION_DTYPES.values()
    ] + [f"paged_attention_kernel{dtype}{FP8_CACHE}" for dtype in ATTENTION_DTYPES.values()],
    # bit-copy kernels, templated on element width: uint32 (j) and uint16 (t); FP8 writes per source dtype
    "cache_kernels.cu": ["reshape_and_cache_kernelIj", "reshape_and_cache_kernelIt", "copy_blocks_kernel",
                         *[f"reshape_and_cache_fp8_kernel{dtype}" for dtype in ATTENTION_DTYPES.values()]],
}  # fmt: skip


def test_every_cu_file_is_covered():
    assert {path.name for path in CU_FILES} == set(EXPECTED_KERNELS)


@pytest.mark.parametrize("source", CU_FILES, ids=lambda path: path.name)
def test_cu_compiles_for_sm80_and_sm90(source, tmp_path):
    report = nvcc_compile(source, tmp_path / f"{source.stem}.o", "-DPAGED_CUDA_MINIMAL_INSTANTIATIONS")
    compiled = entry_points(report)
    for arch in ARCHS:
        for fragment in EXPECTED_KERNELS[source.name]:
            assert any(fragment in name for name in compiled[arch]), f"{fragment} not compiled for sm_{arch}"
    # v1 (partition size 0) and v2 (512) variants of the attention kernel.
    if source.name == "paged_attention.cu":
        for arch in ARCHS:
            assert any("ELi0EEE" in name for name in compiled[arch]) and any("ELi512EEE" in name for name in compiled[arch])


@pytest.mark.slow
def test_attention_compiles_with_every_head_and_block_size(tmp_path):
    report = nvcc_compile(CUDA_DIR / "paged_attention.cu", tmp_path / "full.o")
    compiled = entry_points(report)
    for arch in ARCHS:
        for head_size in (64, 80, 96, 112, 128, 256):
            for block_size in SUPPORTED_BLOCK_SIZES:
                shape = f"Li{head_size}ELi{block_size}E"
                for dtype in ATTENTION_DTYPES.values():
                    ours = [n for n in compiled[arch] if f"paged_attention_kernel{dtype}" in n and shape in n]
                    fp8 = [n for n in ours if FP8_CACHE in n]
                    # v1 and v2, each over a cache of the query's dtype and over an FP8 cache
                    assert (len(ours), len(fp8)) == (4, 2), f"{dtype}{shape} for sm_{arch}: {ours}"


def test_bindings_cpp_parses_against_torch_headers(tmp_path):
    """bindings.cpp is host C++ built by the host compiler; check it with g++ -fsyntax-only.

    A CPU build of torch ships c10/cuda headers but not the generated
    c10/cuda/impl/cuda_cmake_macros.h they include; an empty stand-in is
    enough for a syntax check (it only holds build-configuration macros).
    """
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no host C++ compiler")
    includes = torch_include_dirs()
    shim = tmp_path / "shim"
    if not any((Path(path) / "c10/cuda/impl/cuda_cmake_macros.h").exists() for path in includes):
        (shim / "c10/cuda/impl").mkdir(parents=True)
        (shim / "c10/cuda/impl/cuda_cmake_macros.h").write_text("#pragma once\n")
    command = [
        compiler, "-fsyntax-only", "-std=c++20", "-Wall", f"-I{shim}", *[f"-I{path}" for path in includes],
        f"-I{cuda_include_dir()}", f"-I{sysconfig.get_paths()['include']}",
        "-DTORCH_EXTENSION_NAME=paged_kernels_cuda", "-DTORCH_API_INCLUDE_EXTENSION_H",
        str(CUDA_DIR / "bindings.cpp"),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"bindings.cpp does not compile:\n{result.stderr[-6000:]}"
    assert "warning" not in result.stderr, result.stderr[-3000:]


def test_jit_build_compiles_everything():
    """The JIT build takes every .cu plus the bindings, and never the check-only macro."""
    assert {path.name for path in build.CUDA_SOURCES} == {path.name for path in CU_FILES} | {"bindings.cpp"}
    assert not any("MINIMAL" in flag for flag in build.CUDA_CFLAGS)
