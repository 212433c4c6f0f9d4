"""Collectives whose ranks span nodes: a TP group over more than one 8-GPU node, a MoE's dp dispatch.

vLLM lays a deployment's ranks out in order (global rank = dp rank x tp + tp rank) over nodes of
eight NVLink-joined GPUs (the GPU's `node_gpus`: an NVL72 rack is one node of 72, its hosts joined
by NVLink switches, not NICs). Its custom all-reduce works inside one node only (custom_all_reduce.py
refuses a group that spans nodes, and world sizes over 8), so a group that leaves the node runs
NCCL, whose rings cross the network once per node boundary through one NIC per GPU (a DGX/HGX
node's compute fabric: planner/data/links.json `infiniband`; `--node-link ethernet` for 100 GbE).

An all-reduce of S bytes over n ranks on N nodes (n / N on each) is priced as

  max(the node's own NCCL all-reduce of S,  the NICs' share)  +  NCCL's extra network latency

- the node's part: the measured NCCL all-reduce on n / N GPUs (on the roofline, its NVLink ring);
  with one rank per node there is none, only NCCL's base latency;
- the NICs' share: a ring all-reduce sends 2 (n - 1) / n x S over each edge; a node's edges to the
  next node carry that for every ring, split over its n / N NICs, at the link's bandwidth. The
  ring is pipelined, so the slower of NVLink and the NICs sets the pace, not their sum;
- the extra latency: NCCL's own tuning model (NVIDIA/nccl src/graph/tuning.cc, baseLat and hwLat,
  tree algorithm with the LL protocol its small messages use) adds, for ranks on N > 1 nodes,
  2 log2(N) network hops of 5.0 us and stretches each NVLink hop (0.6 us) by 1.8x:
  2 ((n/N - 1) x 0.6 x 0.8 + log2(N) x 5.0) us over the same ranks' latency inside one node
  (16.7 us for two nodes of eight GPUs).

These are NCCL's model constants and the NIC's datasheet rate, not a measurement of vLLM across
nodes: no such table is public (NVIDIA's aiconfigurator-core times all-reduces on one node).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from planner.catalog.links import KvLink, resolve_link
from planner.errors import PlannerError

NODE_GPUS = 8                    # GPUs in one NVLink node (an HGX H100/H200/B200 or A100 board)
NODE_LINK = "infiniband"         # the default fabric between nodes: one 400 Gb/s NDR NIC per GPU
# NCCL src/graph/tuning.cc, tree all-reduce with the LL protocol (microseconds): the base latency of
# a call, one NVLink hop, one network hop, and the factor an NVLink hop takes once the tree spans nodes
NCCL_BASE_LATENCY = 6.8e-6
NCCL_NVLINK_HOP = 0.6e-6
NCCL_NET_HOP = 5.0e-6
NCCL_MULTINODE_HOP_FACTOR = 1.8


def node_link(name: str) -> KvLink:
    """The catalog link `name` as the network between nodes (--node-link); one line for a link that joins
    the GPUs of one node only."""
    try:
        link = resolve_link(name)
    except PlannerError:
        raise PlannerError(f"--node-link {name!r}: unknown link; between nodes give infiniband or ethernet "
                           f"(planner/data/links.json)") from None
    if link.bandwidth is None:
        raise PlannerError(f"--node-link {name}: {link.name} joins the GPUs of one node; between nodes give "
                           f"infiniband or ethernet")
    return link


def nodes_of(gpus: int, node_gpus: int = NODE_GPUS) -> int:
    """The nodes (of `node_gpus` GPUs each) a deployment of `gpus` GPUs takes."""
    return -(-gpus // node_gpus)


@dataclass(frozen=True, slots=True)
class NodeSpan:
    """A collective's `ranks` ranks over `nodes` nodes, as many on each, one NIC per GPU on `link`."""

    ranks: int
    nodes: int
    link: KvLink

    @classmethod
    def of(cls, ranks: int, gpus: int, link: str = NODE_LINK, node_gpus: int = NODE_GPUS) -> NodeSpan | None:
        """The span of a group of `ranks` ranks among a deployment's `gpus` GPUs laid out in rank order
        (a TP group: ranks = gpus; a dp group: one rank in every tp) over nodes of `node_gpus` and the
        `link` between them; None when the group is in one node."""
        nodes = min(nodes_of(gpus, node_gpus), ranks)
        if nodes <= 1:
            return None
        return cls(ranks, nodes, node_link(link))

    @property
    def per_node(self) -> int:
        return self.ranks // self.nodes

    def extra_latency(self) -> float:
        """What NCCL's tuning model adds to the group's small all-reduce for spanning its nodes."""
        stretched = (self.per_node - 1) * NCCL_NVLINK_HOP * (NCCL_MULTINODE_HOP_FACTOR - 1)
        return 2 * (stretched + math.log2(self.nodes) * NCCL_NET_HOP)

    def nic_seconds(self, message_bytes: float) -> float:
        """The time the NICs need for a ring all-reduce of `message_bytes`."""
        ring = 2 * (self.ranks - 1) / self.ranks
        return ring * message_bytes / self.per_node / self.link.bandwidth

    def allreduce(self, node_seconds: float | None, message_bytes: float) -> float:
        """An all-reduce of `message_bytes` over the group, given the same message's all-reduce on one
        node's share of the ranks (`node_seconds`; None with one rank per node)."""
        inside = NCCL_BASE_LATENCY if node_seconds is None else node_seconds
        return max(inside, self.nic_seconds(message_bytes)) + self.extra_latency()

    def describe(self) -> str:
        nic = f"{self.link.bandwidth / 1e9:.0f} GB/s {self.link.name} per GPU"
        inside = (f"{self.nodes} nodes x {self.per_node} GPUs: the node's share, or {nic} if slower"
                  if self.per_node > 1 else f"{self.nodes} nodes, one GPU on each: {nic}")
        return f"NCCL over {inside}, + {self.extra_latency() * 1e6:.1f} us network latency (NCCL's tuning model)"
