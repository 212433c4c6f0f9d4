"""The links a disaggregated prefill pool sends KV caches to its decode pool over (`--kv-link`).

Entries live in planner/data/links.json with their sources: NVLink inside one node,
InfiniBand (NDR, one NIC per GPU) and Ethernet (100 GbE RoCE) across nodes. A
transfer costs a fixed latency plus bytes over the bandwidth of the parallel
streams: every GPU of the smaller pool's tensor-parallel group moves its shard
of the KV cache over its own link (as vLLM's NIXL connector reads each rank's
blocks from the matching rank), so streams = min(prefill TP, decode TP).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from planner.catalog.base import Catalog
from planner.catalog.gpus import GpuSpec
from planner.errors import PlannerError

DEFAULT_LINK = "infiniband"      # pools on separate nodes: the usual disaggregated deployment


@dataclass(frozen=True, slots=True)
class KvLink:
    name: str
    bandwidth: float | None         # B/s one direction per GPU; None: the GPU's own NVLink
    latency: float                  # s per transfer
    scope: str
    source: str
    aliases: tuple[str, ...] = ()
    node_gpus: int | None = None    # a link inside one node joins at most this many GPUs

    def stream_bandwidth(self, prefill_gpu: GpuSpec, decode_gpu: GpuSpec) -> float:
        """Bytes/s of one stream between a prefill GPU and a decode GPU."""
        if self.bandwidth is not None:
            return self.bandwidth
        for gpu in (prefill_gpu, decode_gpu):
            if not gpu.interconnect.startswith("nvlink"):
                raise PlannerError(f"--kv-link {self.name}: {gpu.name} has no NVLink ({gpu.interconnect}); "
                                   f"use --kv-link infiniband or ethernet")
        if prefill_gpu.name != decode_gpu.name:
            raise PlannerError(f"--kv-link {self.name} joins GPUs of one node: {prefill_gpu.name} and "
                               f"{decode_gpu.name} are not in one NVLink domain; use --kv-link infiniband")
        return prefill_gpu.interconnect_bandwidth

    def transfer_seconds(self, num_bytes: float, stream_bandwidth: float, streams: int) -> float:
        return self.latency + num_bytes / (stream_bandwidth * streams)

    def as_dict(self) -> dict:
        return {"name": self.name, "bandwidth": self.bandwidth, "latency": self.latency, "scope": self.scope,
                "source": self.source}


@lru_cache(maxsize=1)
def link_catalog() -> Catalog[KvLink]:
    text = resources.files("planner").joinpath("data/links.json").read_text(encoding="utf-8")
    entries = [KvLink(e["name"], e["bandwidth"], float(e["latency"]), e["scope"], e["source"],
                      tuple(e.get("aliases", ())), e.get("node_gpus")) for e in json.loads(text)["links"]]
    return Catalog("KV link", entries, lambda e: (e.name, *e.aliases))


def resolve_link(name: str | None) -> KvLink:
    """`--kv-link NAME` (default infiniband), or a one-line error naming the known links."""
    return link_catalog().get(DEFAULT_LINK if name is None else name)      # (an empty name is a mistake)
