"""What a mixture-of-experts layer costs per step: the experts a batch touches, their FLOPs, their
weights read, and the collectives data parallelism adds.

Routing (the statistics live in planner/catalog/routing.py, which the profiler shares). Each of T
tokens picks k of E experts. Under uniform routing an expert is missed by one token with probability
1 - k/E, so the expected number of distinct experts the batch touches is

    E * (1 - (1 - k/E) ** T)

(k at T = 1, E as T grows; Qwen3-30B-A3B, E = 128, k = 8: 8 at one token, 51 at 8, 112 at 32).
A skewed router is described by a power-law popularity, p_e proportional to (e + 1) ** -skew (skew 0
is uniform; NVIDIA's measured tables use "power_law" exponents 1.01 and 1.2), an expert being in a
token's top k with probability q_e = k * p_e, capped at 1 with the excess spread over the others in
proportion (so that sum_e q_e = k: a token still picks k experts): sum_e 1 - (1 - q_e) ** T experts
touched, fewer than uniform. A decode step reads only the touched experts' weights, which is why a MoE's
decode step grows with the batch where a dense model's hardly does.

Parallelism (planner/deploy/parallel.py). All tp x dp GPUs run every MoE layer. With dp > 1 vLLM's
default all2all backend (allgather_reducescatter) all-gathers the dp replicas' tokens before the
experts and reduce-scatters the outputs after them, so a layer's experts see T x dp tokens when each
replica schedules T (every replica is assumed to schedule a batch like this one: vLLM runs them in
lockstep, idle ones on dummy batches). Without expert parallelism each GPU holds every expert at
1/(tp x dp) of its width; with it, whole experts, the hottest placed one per rank in turn (rank r
holds the experts of popularity rank r, r + EP, ...), so the busiest rank is rank 0: it holds the
most popular expert and carries its share sum_{e on rank 0} p_e of the routed pairs.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.deployment import ALL2ALL_BACKENDS, MOE_BACKENDS
from planner.catalog import ModelSpec
from planner.catalog.quantization import WeightFormat
from planner.catalog.routing import experts_touched, inclusion, pair_share, popularity, rank_experts
from planner.cost.dbo import DualBatch
from planner.errors import PlannerError

__all__ = ["MoeParallel", "MoeWork", "moe_work", "expert_flops", "bytes_per_expert", "expert_roofline",
           "dispatch_bytes", "experts_touched", "inclusion", "pair_share", "popularity", "rank_experts"]

MAX_SKEW = 4.0


@dataclass(frozen=True, slots=True)
class MoeParallel:
    """A deployment's parallelism as the MoE layers see it, and the routing skew assumed."""

    tp: int = 1
    dp: int = 1
    expert_parallel: bool = False
    skew: float = 0.0
    all2all: str = ALL2ALL_BACKENDS[0]     # vLLM's --all2all-backend (planner/cost/all2all.py)
    dbo: DualBatch | None = None            # vLLM's --enable-dbo and its thresholds (planner/cost/dbo.py)
    moe_backend: str = MOE_BACKENDS[0]      # the experts' kernel, vLLM's --moe-backend (planner/cost/deepgemm.py)

    def __post_init__(self) -> None:
        if not 0.0 <= self.skew <= MAX_SKEW:
            raise PlannerError(f"--moe-skew must be in [0, {MAX_SKEW:g}] (a power-law exponent; 0 is uniform "
                               f"routing), got {self.skew}")
        if self.all2all not in ALL2ALL_BACKENDS:
            raise PlannerError(f"--all2all-backend {self.all2all!r}: choose one of {', '.join(ALL2ALL_BACKENDS)}")

    @property
    def gpus(self) -> int:
        return self.tp * self.dp

    @property
    def ep(self) -> int:
        return self.gpus if self.expert_parallel else 1

    @property
    def deepep(self) -> bool:
        """Whether the dispatch runs DeepEP: a DeepEP backend, and expert parallelism with dp > 1, the only case
        in which vLLM dispatches through its all2all backend."""
        return self.all2all != ALL2ALL_BACKENDS[0] and self.dp > 1 and self.expert_parallel

    @property
    def dual_batch(self) -> DualBatch | None:
        """The dual-batch overlap a step may run: --enable-dbo where DeepEP dispatches (vLLM refuses it with any
        other backend; without an all2all it has nothing to hide and is not priced)."""
        return self.dbo if self.deepep else None

    @property
    def moe_tp(self) -> int:
        return 1 if self.expert_parallel else self.gpus


@dataclass(frozen=True, slots=True)
class MoeWork:
    """One MoE layer's work on the busiest GPU for a step: tokens in, experts touched, pairs computed."""

    tokens: int              # tokens the layer's experts see (the dp replicas' together)
    touched: float           # distinct local experts with at least one token
    local_experts: int       # experts this GPU holds
    pairs: float             # (token, expert) pairs this GPU computes (at its share of each expert's width)
    width: int               # each local expert's width on this GPU


def moe_work(model: ModelSpec, par: MoeParallel, tokens: int) -> MoeWork:
    """The work of one MoE layer when each dp replica schedules `tokens` tokens."""
    gathered = tokens * par.dp
    e, k = model.num_experts, model.num_experts_per_tok
    if par.expert_parallel and par.ep > 1:
        among = rank_experts(e, par.ep)
        touched = experts_touched(gathered, e, k, par.skew, among)
        pairs = gathered * k * pair_share(e, k, par.ep, par.skew)
        return MoeWork(gathered, touched, len(among), pairs, model.moe_intermediate_size)
    touched = experts_touched(gathered, e, k, par.skew)
    return MoeWork(gathered, touched, e, gathered * k, model.moe_intermediate_size // par.moe_tp)


def expert_flops(model: ModelSpec, work: MoeWork) -> float:
    """FLOPs of the local experts: 2 per weight per pair over gate, up and down (2 T k 3 H I in all;
    Nemotron-H's up and down in its experts' width)."""
    return 2.0 * work.pairs * len(model.expert_shapes) * model.expert_hidden * work.width


def bytes_per_expert(model: ModelSpec, weight_format: WeightFormat | None, dtype_bytes: int = 2) -> float:
    """One expert's weights in its format, scales and biases included."""
    return model.expert_bytes(dtype_bytes, weight_format) / (model.moe_layers * model.num_experts)


def expert_roofline(model: ModelSpec, par: MoeParallel, tokens: int, flops_rate: float, bandwidth: float,
                    bytes_per_expert: float) -> tuple[float, MoeWork]:
    """One MoE layer's local experts at their bound (FLOPs at `flops_rate`, or the touched experts' weights
    at `bandwidth`, whichever is slower) when each dp replica runs `tokens` tokens, and the work."""
    work = moe_work(model, par, tokens)
    nbytes = work.touched * bytes_per_expert * work.width / model.moe_intermediate_size
    return max(expert_flops(model, work) / flops_rate, nbytes / bandwidth), work


def dispatch_bytes(model: ModelSpec, par: MoeParallel, tokens: int, dtype_bytes: int = 2) -> float:
    """Bytes one GPU receives in the all-gather before a MoE layer (the reduce-scatter after it moves as
    many): the other dp - 1 replicas' tokens x hidden."""
    return (par.dp - 1) * tokens * model.hidden_size * dtype_bytes
