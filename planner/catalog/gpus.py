"""Hardware catalog: datasheet numbers for the devices the planner knows.

The numbers live in planner/data/gpus.json, one entry per device with the
datasheet it came from, so a reader can check them without reading code.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from planner.catalog.base import Catalog
from planner.errors import PlannerError

GIB = 2**30
# Datacenter Blackwell (compute capability 10.x: B200's sm100, B300's sm103), the family vLLM's kernel choices
# test with current_platform.is_device_capability_family(100): FlashInfer's TRT-LLM-gen attention and MoE.
SM100_FAMILIES = ("b200", "b300", "gb200", "gb300")


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One accelerator (or the host CPU). Bandwidths are one direction, FLOP/s are dense peaks."""

    name: str
    family: str                     # "a100", "h100", ...: what gpu_variant_for_memory matches on
    kind: str                       # "gpu" or "cpu"
    memory_bytes: int               # what torch reports as the device's total (usable), not the marketing size
    memory_bandwidth: float         # B/s, device memory
    fp16_flops: float               # FLOP/s, tensor cores, no sparsity
    bf16_flops: float
    fp32_flops: float
    interconnect: str               # "nvlink3", "pcie4", "none"
    interconnect_bandwidth: float   # B/s per GPU toward its peers (0: cannot do tensor parallelism)
    interconnect_latency: float     # s per collective call (NCCL small-message latency)
    host_link_bandwidth: float      # B/s effective GPU<->CPU (pinned PCIe copies), used for swapping
    source: str
    aliases: tuple[str, ...] = ()
    measured_system: str | None = None   # aiconfigurator-core system with measured vLLM tables, if any
    memory_source: str = ""
    fp8_flops: float = 0.0          # FLOP/s, FP8 tensor cores, dense; 0: none (vLLM runs FP8 weight-only)
    fp4_flops: float = 0.0          # FLOP/s, FP4 tensor cores, dense; 0: none (vLLM runs NVFP4 weight-only)
    low_precision_source: str = ""
    node_gpus: int = 8              # GPUs one node joins without the NICs: an 8-GPU server; an NVL72 rack's 72
                                    # over its NVLink switches (planner/cost/nodes.py)

    def peak_flops(self, dtype_bytes: int = 2) -> float:
        """Peak FLOP/s for matmuls in a dtype of this many bytes (2: fp16/bf16, 4: fp32)."""
        if dtype_bytes == 2:
            return self.fp16_flops
        if dtype_bytes == 4:
            return self.fp32_flops
        raise PlannerError(f"unsupported dtype size {dtype_bytes} bytes; known: 2 (fp16/bf16), 4 (fp32)")


def _spec_from_entry(entry: dict) -> GpuSpec:
    return GpuSpec(
        name=entry["name"],
        family=entry["family"],
        kind=entry["kind"],
        memory_bytes=int(entry["memory_bytes"]) if "memory_bytes" in entry else int(round(entry["memory_gib"] * GIB)),
        memory_bandwidth=float(entry["memory_bandwidth"]),
        fp16_flops=float(entry["fp16_flops"]),
        bf16_flops=float(entry["bf16_flops"]),
        fp32_flops=float(entry["fp32_flops"]),
        interconnect=entry["interconnect"],
        interconnect_bandwidth=float(entry["interconnect_bandwidth"]),
        interconnect_latency=float(entry["interconnect_latency"]),
        host_link_bandwidth=float(entry["host_link_bandwidth"]),
        source=entry["source"],
        aliases=tuple(entry.get("aliases", ())),
        measured_system=entry.get("measured_system"),
        memory_source=entry.get("memory_source", ""),
        fp8_flops=float(entry.get("fp8_flops", 0.0)),
        fp4_flops=float(entry.get("fp4_flops", 0.0)),
        low_precision_source=entry.get("low_precision_source", ""),
        node_gpus=int(entry.get("node_gpus", 8)),
    )


@lru_cache(maxsize=1)
def gpu_catalog() -> Catalog[GpuSpec]:
    """The GPU catalog (planner/data/gpus.json), indexed by name and aliases."""
    text = resources.files("planner").joinpath("data/gpus.json").read_text(encoding="utf-8")
    specs = [_spec_from_entry(e) for e in json.loads(text)["gpus"]]
    return Catalog("GPU", specs, keys=lambda s: (s.name, *s.aliases))


def list_gpus() -> list[GpuSpec]:
    """All catalog entries, in file order."""
    return list(gpu_catalog())


def resolve_gpu(name: str | GpuSpec) -> GpuSpec:
    """Look a device up by name or alias ("a100" is the paper's a100-40g, "h100" is h100-sxm)."""
    if isinstance(name, GpuSpec):
        return name
    return gpu_catalog().get(name)


def _family_of(device: str, families: list[str]) -> str | None:
    """Find a catalog family in a free-form device name such as 'NVIDIA A100-SXM4-80GB'.

    Matched as a whole token so that 'l4' does not match 'NVIDIA L40S'.
    """
    text = device.strip().lower()
    if text in families:
        return text
    # longest first so a longer family name wins over a shorter one it contains
    for family in sorted(families, key=len, reverse=True):
        if re.search(rf"(?<![a-z0-9]){re.escape(family)}(?![a-z0-9])", text):
            return family
    return None


def gpu_variant_for_memory(family: str, memory_bytes: int) -> GpuSpec:
    """The catalog variant of a device family whose memory is closest to what was detected.

    `family` may be a catalog family ("a100") or a device name as the driver
    reports it ("NVIDIA A100-SXM4-40GB"); `memory_bytes` is the detected total
    (drivers report a little less than the nominal size, hence closest, not equal).
    """
    specs = list_gpus()
    families = sorted({s.family for s in specs})
    found = _family_of(family, families)
    if found is None:
        raise PlannerError(f"unknown GPU family {family!r}; known: {', '.join(families)}")
    if memory_bytes <= 0:
        raise PlannerError(f"device memory must be positive, got {memory_bytes} bytes")
    variants = [s for s in specs if s.family == found]
    return min(variants, key=lambda s: abs(s.memory_bytes - memory_bytes))
