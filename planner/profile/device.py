"""Which device a profile runs on, checked against the GPU the user named.

`--gpu cpu` profiles this host with the CPU kernels. Any other catalog GPU
needs a CUDA device of that family; the variant (a100-40g vs a100-80g) is
picked from the detected memory. A missing or different device stops the run
with a one-line PlannerError, unless --force, which profiles whatever is there
and records the mismatch in the file.
"""

from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import dataclass

import torch

import cuda_ext

from planner.catalog import GpuSpec, gpu_variant_for_memory, resolve_gpu
from planner.errors import PlannerError
from planner.profile.schema import DeviceInfo


OMP_VARIABLES = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "MKL_NUM_THREADS")


@dataclass(frozen=True)
class Target:
    gpu: GpuSpec                 # what the profile is filed under
    device: torch.device
    dtype: torch.dtype           # the engine's dtype there: fp32 on CPU, fp16 on CUDA
    forced: bool

    def sync(self) -> None:
        # CUDA launches are asynchronous: a timer must wait for the kernels, not the launch.
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def resolve_target(gpu_name: str, *, force: bool = False) -> Target:
    requested = resolve_gpu(gpu_name)
    cpu = torch.device("cpu")
    if requested.kind == "cpu":
        return Target(requested, cpu, torch.float32, False)
    if not torch.cuda.is_available():
        if not force:
            raise PlannerError(f"no CUDA device found: cannot profile {requested.name} (use --gpu cpu, or --force)")
        return Target(requested, cpu, torch.float32, True)
    name = torch.cuda.get_device_name(0)
    memory = torch.cuda.get_device_properties(0).total_memory
    try:
        detected = gpu_variant_for_memory(name, memory)
    except PlannerError:
        detected = None
    if detected is None or detected.family != requested.family:
        if not force:
            found = f"{detected.name}" if detected else "not in the catalog"
            hint = f"use --gpu {detected.name}, or --force" if detected else "use --force to profile it anyway"
            raise PlannerError(f"the CUDA device is {name!r} ({found}), not {requested.name}: {hint}")
        return Target(requested, torch.device("cuda", 0), torch.float16, True)
    return Target(detected, torch.device("cuda", 0), torch.float16, False)


def engine_device(gpu_name: str) -> tuple[str, str]:
    """(device, dtype) a profile of `gpu_name` times the engine on: where a live run compared with it runs."""
    target = resolve_target(gpu_name)
    return target.device.type, str(target.dtype).removeprefix("torch.")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _nvidia_driver() -> str | None:
    try:
        result = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=10, check=True)
        return result.stdout.strip().splitlines()[0] or None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def device_info(target: Target) -> DeviceInfo:
    if target.device.type == "cuda":
        props = torch.cuda.get_device_properties(target.device)
        name, memory = props.name, props.total_memory
        driver = _nvidia_driver()
    else:
        name, driver = _cpu_name(), None
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    return DeviceInfo(gpu=target.gpu.name, kind="gpu" if target.device.type == "cuda" else "cpu",
                      device_name=name, memory_bytes=int(memory), torch_version=torch.__version__,
                      cuda_version=torch.version.cuda, driver_version=driver,
                      kernel_backend=cuda_ext.ops_for(target.device).backend, threads=torch.get_num_threads(),
                      load_average=load, forced=target.forced,
                      omp_env={k: v for k, v in os.environ.items() if k in OMP_VARIABLES})
