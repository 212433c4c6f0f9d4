"""vLLM's DeepEP all-to-all backends for a MoE's expert-parallel dispatch and combine (--all2all-backend).

With --enable-expert-parallel and dp > 1, vLLM moves each MoE layer's tokens to their experts' GPUs
and back through the backend --all2all-backend names (vLLM's Expert Parallel Deployment guide,
vllm/distributed/device_communicators/all2all.py):

- `allgather_reducescatter`, vLLM's default: every rank gathers all dp replicas' tokens and
  reduce-scatters the experts' outputs, priced from NCCL (planner/cost/measured_moe.py `dispatch`).
- `deepep_low_latency` (the guide's choice for decode): DeepEP's low-latency kernels. Each token
  goes once to every expert it picks (k copies, not one per GPU), FP8 with a float32 scale per 128
  values when the experts run FP8 (else 16-bit); the outputs come back in bf16. vLLM lets them use
  NVLink between GPUs of one node (allow_nvlink_for_low_latency_mode=True) and dispatches at most
  VLLM_MOE_DP_CHUNK_SIZE = 256 tokens per rank at a time, so a larger step runs in chunks.
- `deepep_high_throughput` (the guide's choice for prefill): DeepEP's normal kernels. A token
  crosses the network once per node holding one of its experts and is forwarded over NVLink to
  each GPU there that holds one.

Each rank sends its dp replica's tokens over its tp ranks (vLLM keeps them sequence-parallel, one
share each). The rates are DeepEP's published measurements (github.com/deepseek-ai/DeepEP README:
H800, one ConnectX-7 400 Gb/s NIC per GPU, DeepSeek-V3's 7168 hidden and top-8, FP8 dispatch and
bf16 combine), each the bytes its test counts over the kernel's time:

- low latency, 128 tokens per rank, every copy through the NIC (before DeepEP #173 added NVLink):
  dispatch 98, 63, 48, 43, 39, 39 GB/s and combine 127, 74, 53, 46, 39, 40 GB/s at EP 8 to 256
  (77 us and 114 us at EP 8: 128 x 8 x 7168 x 1.03 bytes in 77 us is 98 GB/s). Here only the
  copies bound for another node go at that rate, those for the own node over NVLink;
- normal, 4096 tokens: over NVLink 153 GB/s (dispatch) and 158 GB/s (combine) of the ~160 GB/s the
  README gives the H800's NVLink, 0.77 of its 200 GB/s each way, taken as the same share of this
  GPU's NVLink (0.77 x 450 GB/s = 344 GB/s on H100/H200; DeepEP issue #138 measured 326-344 GB/s
  on H20, whose NVLink is the H100's); over RDMA 43, 58, 51 GB/s (dispatch) and 43, 57, 50 GB/s
  (combine) at EP 16, 32, 64, counting each token once per destination node, its own included.

Rates between the measured EP sizes are interpolated in log2(EP) (outside them: the nearest); the
network rates scale with --node-link's bandwidth over the README's 50 GB/s NIC. No call costs less
than a collective's launch and one hop (NCCL's tuning constants, planner/cost/nodes.py): DeepEP
publishes nothing below 128 tokens. These are DeepEP's own benchmarks, not vLLM end to end; the
experts are still priced by NVIDIA's fused-MoE table, not DeepEP's masked or grouped GEMMs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from engine.deployment import ALL2ALL_BACKENDS
from planner.catalog import GpuSpec, ModelSpec
from planner.catalog.quantization import WeightFormat
from planner.cost.moe import MoeParallel
from planner.cost.nodes import NCCL_BASE_LATENCY, NCCL_NET_HOP, NCCL_NVLINK_HOP, node_link, nodes_of
from planner.errors import PlannerError

LL_CHUNK_TOKENS = 256                  # vLLM's VLLM_MOE_DP_CHUNK_SIZE default: tokens per rank per dispatch
README_NIC = 50e9                      # B/s: the README's ConnectX-7 400 Gb/s
README_NVLINK_SHARE = 153 / 200, 158 / 200     # normal kernels' NVLink rate over the H800's 200 GB/s each way
# DeepEP README: EP size -> (dispatch, combine) GB/s
LOW_LATENCY = {8: (98, 127), 16: (63, 74), 32: (48, 53), 64: (43, 46), 128: (39, 39), 256: (39, 40)}
NORMAL_RDMA = {16: (43, 43), 32: (58, 57), 64: (51, 50)}
FP8_GROUP = 128                        # values per float32 scale of an FP8 dispatch


def check_backend(backend: str, par: MoeParallel | None, gpu: GpuSpec) -> str | None:
    """One line refusing a DeepEP backend on a GPU without NVLink; a warning when the backend moves nothing
    (vLLM runs an all2all only for expert parallelism with dp > 1); None otherwise."""
    if backend == ALL2ALL_BACKENDS[0]:
        return None
    if par is None or not par.deepep:
        what = f"--all2all-backend {backend}" + (" and --enable-dbo change" if par is not None and par.dbo
                                                 else " changes")
        return (f"{what} nothing here: vLLM dispatches through it only for a MoE model with "
                f"--enable-expert-parallel and --dp > 1")
    if not gpu.interconnect.startswith("nvlink"):
        raise PlannerError(f"--all2all-backend {backend}: DeepEP needs NVLink between a node's GPUs; "
                           f"{gpu.name} has {gpu.interconnect}")
    return None


def _at(table: dict[int, tuple[float, float]], ep: int) -> tuple[float, float]:
    """The table's (dispatch, combine) GB/s at `ep`, interpolated in log2(ep), in B/s."""
    sizes = sorted(table)
    ep = min(max(ep, sizes[0]), sizes[-1])
    high = next(s for s in sizes if s >= ep)
    low = max(s for s in sizes if s <= ep)
    w = 0.0 if high == low else math.log2(ep / low) / math.log2(high / low)
    return tuple((a + (b - a) * w) * 1e9 for a, b in zip(table[low], table[high]))


def distinct_groups(experts: int, top_k: int, groups: int) -> float:
    """Expected groups (GPUs or nodes, experts / groups each) a token's top-k distinct experts fall in,
    routed uniformly."""
    per_group = experts / groups
    miss = 1.0                                       # P(a given group holds none of the k)
    for i in range(top_k):
        miss *= max(experts - per_group - i, 0) / (experts - i)
    return groups * (1 - miss)


@dataclass(frozen=True, slots=True)
class DeepEp:
    """One MoE layer's DeepEP dispatch and combine on one rank."""

    mode: str                          # "low_latency" or "high_throughput"
    ep: int
    nodes: int
    tp: int
    hidden: int
    top_k: int
    num_experts: int
    dispatch_value_bytes: float
    nvlink: tuple[float, float]        # B/s over NVLink: dispatch, combine
    network: tuple[float, float]       # B/s over the network at this EP: dispatch, combine
    floor: float                       # s: the least one call costs

    @classmethod
    def of(cls, model: ModelSpec, par: MoeParallel, gpu: GpuSpec, fmt: WeightFormat | None, dtype_bytes: int,
           link: str) -> DeepEp | None:
        """The DeepEP dispatch of `par.all2all`, or None for vLLM's default all-gather / reduce-scatter."""
        if not par.deepep:
            return None
        mode = par.all2all.removeprefix("deepep_")
        nodes = nodes_of(par.gpus, gpu.node_gpus)
        scale = node_link(link).bandwidth / README_NIC
        rates = _at(LOW_LATENCY, par.ep) if mode == "low_latency" else _at(NORMAL_RDMA, par.ep)
        experts = fmt.experts if fmt is not None else None
        fp8 = experts is not None and experts.scheme.startswith("fp8") and not experts.weight_only
        hop = NCCL_NET_HOP if nodes > 1 else NCCL_NVLINK_HOP
        return cls(mode, par.ep, nodes, par.tp, model.expert_hidden, model.num_experts_per_tok, model.num_experts,
                   1 + 4 / FP8_GROUP if fp8 else dtype_bytes,
                   tuple(share * gpu.interconnect_bandwidth for share in README_NVLINK_SHARE),
                   tuple(r * scale for r in rates), NCCL_BASE_LATENCY + hop)

    def seconds(self, tokens: int) -> float:
        """Dispatch and combine of one MoE layer when each dp replica runs `tokens` tokens."""
        per_rank = -(-tokens // self.tp)
        if self.mode == "high_throughput":
            return self._call(per_rank)
        full, rest = divmod(per_rank, LL_CHUNK_TOKENS)
        return full * self._call(LL_CHUNK_TOKENS) + (self._call(rest) if rest else 0.0)

    def _call(self, tokens: int) -> float:
        """One dispatch and one combine of `tokens` tokens from this rank."""
        seconds = 0.0
        for value_bytes, nvlink, network in zip((self.dispatch_value_bytes, 2), self.nvlink, self.network):
            token_bytes = tokens * self.hidden * value_bytes
            if self.mode == "low_latency":            # k copies, the other nodes' share over the network
                copies = token_bytes * self.top_k
                remote = copies * (self.nodes - 1) / self.nodes
                t = max((copies - remote) / nvlink, remote / network)
            else:                                     # once per GPU over NVLink, once per node over the network
                ranks = distinct_groups(self.num_experts, self.top_k, self.ep)
                t = token_bytes * ranks / nvlink
                if self.nodes > 1:
                    t = max(t, token_bytes * distinct_groups(self.num_experts, self.top_k, self.nodes) / network)
            seconds += max(self.floor, t)
        return seconds

    def describe(self) -> str:
        where = f"{self.nodes} nodes" if self.nodes > 1 else "one node"
        kind = ("low-latency kernels, k copies per token, chunks of 256 tokens" if self.mode == "low_latency"
                else "normal kernels, once per GPU and per node")
        rates = f"NVLink {self.nvlink[0] / 1e9:.0f}/{self.nvlink[1] / 1e9:.0f} GB/s"
        if self.nodes > 1:
            rates += f", network {self.network[0] / 1e9:.0f}/{self.network[1] / 1e9:.0f} GB/s"
        return (f"DeepEP {kind}, EP{self.ep} over {where} ({rates} dispatch/combine, DeepEP's published "
                f"rates; planner/cost/all2all.py)")
