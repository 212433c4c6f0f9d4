"""The measured model's MoE layers: NVIDIA's timed vLLM fused-MoE kernels, the router and EP dispatch.

Per MoE layer, x its MoE layers (ledger terms, group "moe" and "collective"):

  router GEMM     the bf16 GEMM table at m = the replica's tokens, n = experts, k = hidden (vLLM's gate
                  is an unquantized ReplicatedLinear)
  experts         the `moe` table (aiconfigurator-core's moe_perf, vLLM's FusedMoE forward: routing's
                  top-k, permute, both expert GEMMs with the activation, unpermute): one layer on one
                  GPU at num_tokens = the tokens its experts see (the dp replicas' together), the
                  expert format's kernel, moe_tp = tp x dp and moe_ep = 1 (experts split by width) or
                  moe_tp = 1 and moe_ep = tp x dp (expert parallelism), and a routing distribution:
                  uniform (skew 0) or NVIDIA's power-law ones (exponents 1.01 and 1.2), linear in the
                  skew between them. Interpolated in log-log space along tokens.
                  NVIDIA's skew-0 table is not uniform routing but "balanced": its collector assigns the
                  T tokens' k picks to min(T k, E) distinct experts, the most a batch can touch, where
                  independent tokens touch E (1 - (1 - k/E) ** T) (planner/catalog/routing.py): at
                  T k = E, 128 experts against 81. A small batch's fused MoE reads only the touched
                  experts' weights, and along the table's first stretch (T k <= E) the time grows with
                  them; so uniform routing is priced as the table at T, less what its first stretch
                  says the experts a balanced batch touches beyond uniform ones cost:
                  f(T) - f(b/k) + f(u/k), with b and u the balanced and uniform counts. Below T k = E
                  that is the table at u/k tokens; once a batch touches every expert it is f(T).
                  (The power-law tables draw their routing at random, so they need no such step.)
  dispatch        dp > 1: the all-gather of the replicas' hidden states before the experts and the
                  reduce-scatter after them (vLLM's default allgather_reducescatter all2all backend),
                  priced from the NCCL all-reduce table on dp GPUs: an all-gather or a reduce-scatter
                  of a buffer moves half the bytes an all-reduce of it does, so the pair costs one
                  all-reduce of the gathered tokens x hidden, never below the smallest message's time.
                  Once tp x dp passes one 8-GPU node the dp ranks (one in every tp) span nodes: one
                  node's share through its table, the rest through the NICs (planner/cost/nodes.py).
                  With --all2all-backend deepep_low_latency or deepep_high_throughput, DeepEP's
                  dispatch and combine instead, at DeepEP's published rates (planner/cost/all2all.py),
                  and block-FP8 experts of DeepSeek-V3's shape on Hopper run DeepGEMM's grouped GEMMs,
                  priced at DeepGEMM's published rates (planner/cost/deepgemm.py), not the table.

The table holds only the shapes NVIDIA timed (scripts/extract_measured_tables.py keeps the catalog's).
Experts of a shape it never timed in their format and split (GLM-4.5's, a user's own config.json,
DeepSeek-V4's MXFP4 experts on Hopper) are priced by the roofline (planner/cost/moe.py expert_roofline:
the touched experts' FLOPs at the format's tensor-core peak x 0.6, or their weights at the bandwidth the
elementwise kernels get, whichever binds, on top of the table's smallest time, the fused kernel's launch
floor), times the efficiency the table
shows for the same tokens, format and split: the geometric mean, over every shape timed there, of its
time over that same roofline. The efficiency is NVIDIA's measurement of vLLM's kernel, not a fit (the
per-tensor FP8 MoE NVIDIA timed on Hopper, FlashInfer's CUTLASS one, runs 3-7x the roofline; bf16's
Triton one about 1x). Leaving each timed shape out in turn and pricing it so comes within a factor of
1.09 of its own rows on average (bench/bench_moe_shapes.py). Gated experts (gate, up, down) are scaled
by the gated shapes' efficiency and Nemotron-H's ungated ones (up, down) by theirs: the roofline of a
timed shape is only comparable with its own kind's. The ledger names the term's source
`scaled`. A format or split the table never timed for any shape is a one-line error, and `auto` then
prices the model with the roofline.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import lru_cache

from planner.catalog import ModelSpec, list_models
from planner.catalog.routing import experts_touched
from planner.catalog.quantization import WeightFormat
from planner.cost import tables
from planner.cost.all2all import DeepEp
from planner.cost.deepgemm import DeepGemm
from planner.cost.ledger import Term
from planner.cost.moe import MoeParallel, expert_roofline, moe_work
from planner.cost.nodes import NODE_GPUS, NODE_LINK, NodeSpan
from planner.errors import PlannerError

DEEPEP_TERM = "MoE dispatch + combine (DeepEP)"      # the ledger's DeepEP term (dual-batch overlap hides it)
# The skew (power-law exponent) of each routing distribution NVIDIA measured.
DISTRIBUTIONS = ((0.0, "balanced"), (1.01, "power_law_1.01"), (1.2, "power_law_1.2"))


def moe_dtypes(fmt: WeightFormat | None) -> tuple[str, ...]:
    """The table's names for the experts' format, best first where vLLM has several kernels for it. DeepSeek-V4's
    MXFP4 experts (Mxfp4MoEMethod) run FlashInfer's TRT-LLM kernel with MXFP8 activations on Blackwell and OpenAI's
    Triton kernel with bf16 activations on Hopper (vllm/model_executor/layers/fused_moe/oracle/mxfp4.py), the one
    NVIDIA timed for gpt-oss there; gpt-oss's own method keeps bf16 activations on both. NVFP4 experts
    (ModelOptNvFp4FusedMoE, CompressedTensorsW4A4Nvfp4MoE) run FP4 x FP4 where the GPU has FP4 tensor cores, the
    rows NVIDIA timed on Blackwell, and vLLM's Marlin MoE elsewhere (select_nvfp4_moe_backend: the W4A4 backends
    need Blackwell; moe_dtype below)."""
    experts = fmt.experts if fmt is not None else None
    if fmt is not None and fmt.expert_scheme == "mxfp4":
        return "w4a8_mxfp4_mxfp8", "w4a16_mxfp4"
    if experts is not None and experts.scheme == "nvfp4" and not experts.weight_only:
        return "nvfp4", "int4_wo"
    return (moe_dtype(experts),)


def moe_dtype(fmt: WeightFormat | None) -> str:
    """The table's name for the experts' format. ModelOpt's W4A16 NVFP4 experts run vLLM's Marlin MoE
    (ModelOptNvFp4FusedMoE with 16-bit activations: MarlinExperts, fused_marlin_moe), the kernel NVIDIA timed as
    `int4_wo` for Kimi-K2.5's INT4 experts (compressed-tensors W4A16 in groups of 32 with 16-bit scales). Those
    read 4.5 bits a weight, as NVFP4's E2M1 values with an E4M3 scale per 16 do, so the rows time the same
    bytes; other shapes take the table's efficiency (MeasuredMoe)."""
    if fmt is None:
        return "bfloat16"
    if fmt.weight_only:
        return "int4_wo"
    names = {"fp8-block": "fp8_block", "fp8-tensor": "fp8", "fp8-channel": "fp8", "nvfp4": "nvfp4",
             "mxfp4": "w4a16_mxfp4"}
    if fmt.scheme not in names:
        raise PlannerError(f"no measured vLLM MoE table for {fmt.method} experts")
    return names[fmt.scheme]


@dataclass(frozen=True, slots=True)
class ExpertRoofline:
    """The roofline's rates for a MoE's experts (planner/cost/moe.py expert_roofline), which price a shape the
    table lacks."""

    flops_rate: float           # FLOP/s: the experts' format's tensor-core peak at the roofline's efficiency
    bandwidth: float            # B/s: what the elementwise kernels get from this GPU's memory
    bytes_per_expert: float     # one of the model's experts' weights (scales and biases included) in its format


class MeasuredMoe:
    """The MoE terms of one model on one system: curves over tokens, looked up once per token count."""

    def __init__(self, system: str, model: ModelSpec, par: MoeParallel, fmt: WeightFormat | None,
                 roofline: ExpertRoofline | None = None, node_link: str = NODE_LINK,
                 deepep: DeepEp | None = None, deepgemm: DeepGemm | None = None,
                 node_gpus: int = NODE_GPUS) -> None:
        self.system, self.model, self.par, self.deepep, self.deepgemm = system, model, par, deepep, deepgemm
        if not tables.has_table(system, "moe"):
            raise PlannerError(f"{system} has no measured vLLM MoE table")
        table = tables.load_rows(system, "moe")
        timed_dtypes = {r["moe_dtype"] for r in table}
        candidates = moe_dtypes(fmt)
        self.dtype = next((d for d in candidates if d in timed_dtypes), candidates[-1])
        self.extrapolated = False
        # the dp ranks a dispatch gathers over, when they span nodes (one in every tp GPUs)
        self._span = NodeSpan.of(par.dp, par.gpus, node_link, node_gpus) if par.dp > 1 else None
        local = par.dp if self._span is None else self._span.per_node
        self._nccl = self._dispatch_curve(local) if local > 1 and deepep is None else None
        shape = (model.expert_hidden, model.moe_intermediate_size, model.num_experts_per_tok, model.num_experts)
        split = (self.dtype, par.moe_tp, par.ep)
        self.efficiency = None
        if roofline is not None and not any(_shape(r) == shape and _split(r) == split for r in table):
            # a shape NVIDIA never timed in this format and split: the roofline at the efficiency of the
            # split's timed shapes (above)
            ungated = _ungated_shapes()
            timed = sorted({_shape(r) for r in table
                            if _split(r) == split and (_shape(r) in ungated) != model.gated_mlp})
            if timed:
                self.efficiency = _Efficiency(system, model, par, fmt, roofline, timed,
                                              min(r["latency"] for r in table))
                return
        rows = [r for r in table if _shape(r) == shape and _split(r) == split]
        if not rows:
            raise PlannerError(f"{system} has no measured vLLM MoE rows for {model.name}'s experts "
                               f"({self.dtype}, hidden {model.expert_hidden}, width {model.moe_intermediate_size}, "
                               f"top-{model.num_experts_per_tok} of {model.num_experts}) at moe_tp {par.moe_tp}, "
                               f"moe_ep {par.ep}")
        self._curves = {}
        for skew, name in DISTRIBUTIONS:
            points = {r["num_tokens"]: r["latency"] for r in rows if r["distribution"] == name}
            if points:
                self._curves[skew] = tables.Curve.of(tables.monotone(points, 1))
        self.skews = sorted(self._curves)

    def _dispatch_curve(self, gpus: int) -> tables.Curve:
        points = {r["message_size"]: r["latency"] for r in tables.load_rows(self.system, "allreduce")
                  if r["backend"] == "nccl" and r["num_gpus"] == gpus}
        if not points:
            raise PlannerError(f"{self.system} has no NCCL table on {gpus} GPUs for the dp dispatch")
        return tables.Curve.of(tables.monotone(points, 1))

    def experts(self, tokens: int, sm_share: float = 1.0) -> float:
        """One layer's fused-MoE time when its experts see `tokens` tokens, at the routing skew (DeepGEMM's on
        `sm_share` of the SMs: dual-batch overlap's cap)."""
        if self.deepgemm is not None:
            work = moe_work(self.model, self.par, tokens // self.par.dp)
            if self.deepgemm.runs(work):
                return self.deepgemm.seconds(work, sm_share)
        if self.efficiency is not None:
            price, extrapolated = self.efficiency.price(tokens // self.par.dp)
            self.extrapolated |= extrapolated
            return price
        skew = self.par.skew
        below = max((s for s in self.skews if s <= skew), default=self.skews[0])
        above = min((s for s in self.skews if s >= skew), default=self.skews[-1])
        low, ext = self._at(below, tokens)
        high, ext_high = self._at(above, tokens)
        self.extrapolated |= ext or ext_high or skew > self.skews[-1]
        if above == below:
            return low
        return low + (high - low) * (skew - below) / (above - below)

    def _at(self, skew: float, tokens: int) -> tuple[float, bool]:
        """One distribution's curve at `tokens`; the balanced one (skew 0) priced for uniform routing."""
        curve = self._curves[skew]
        latency, ext = curve.at(tokens)
        if skew != 0.0:
            return latency, ext
        e, k = self.model.num_experts, self.model.num_experts_per_tok
        balanced = min(tokens * k, e) / k                      # tokens whose balanced picks touch as many
        uniform = experts_touched(tokens, e, k) / k            # experts as `tokens` uniform ones
        if uniform >= balanced:
            return latency, ext
        return latency - curve.at(balanced)[0] + curve.at(uniform)[0], ext

    def dispatch(self, tokens: int) -> float:
        """The dispatch around one MoE layer (the all-gather and reduce-scatter, or DeepEP's dispatch and combine)
        when each replica runs `tokens` tokens."""
        if self.par.dp == 1:
            return 0.0
        if self.deepep is not None:
            return self.deepep.seconds(tokens)
        values = tokens * self.par.dp * self.model.hidden_size
        latency = None          # one rank in each node: no node-local part
        if self._nccl is not None:
            at, ext = self._nccl.at(values)
            self.extrapolated |= ext
            latency = max(self._nccl.ys[0], at)
        return latency if self._span is None else self._span.allreduce(latency, 2 * values)

    def terms(self, run: int, router_gemm: float, sm_share: float = 1.0) -> list[Term]:
        """The MoE terms of a step whose replicas each run `run` tokens (CUDA-graph padded); DeepGEMM's experts
        on `sm_share` of the SMs (a microbatch of dual-batch overlap)."""
        layers, par = self.model.moe_layers, self.par
        gathered = run * par.dp
        split = f"EP{par.ep}" if par.ep > 1 else f"moe_tp {par.moe_tp}"
        skew = f", routing skew {par.skew:g}" if par.skew else ", uniform routing"
        terms = [Term("router GEMM", "moe", layers * router_gemm, "table",
                      f"{self.system} gemm, m={run} n={self.model.num_experts} k={self.model.hidden_size}, "
                      f"x{layers} layers", layers),
                 self._experts_term(gathered, split, skew, sm_share)]
        if self.deepep is not None:
            terms.append(Term(DEEPEP_TERM, "collective", layers * self.dispatch(run),
                              "published", f"{self.deepep.describe()}, {run} tokens per replica, x{layers} layers",
                              2 * layers))
        elif par.dp > 1:
            terms.append(Term("MoE all-gather + reduce-scatter", "collective", layers * self.dispatch(run), "table",
                              f"{self.system} nccl on {par.dp} GPUs, {gathered} x {self.model.hidden_size} "
                              f"values (half an all-reduce each), x{layers} layers"
                              + (f"; {self._span.describe()}" if self._span is not None else ""), 2 * layers))
        return terms

    def _experts_term(self, gathered: int, split: str, skew: str, sm_share: float = 1.0) -> Term:
        layers, m = self.model.moe_layers, self.model
        what = f"{gathered} tokens, top-{m.num_experts_per_tok} of {m.num_experts}, {split}{skew}, x{layers} layers"
        seconds = layers * self.experts(gathered, sm_share)
        if self.deepgemm is not None and self.deepgemm.runs(moe_work(self.model, self.par, gathered // self.par.dp)):
            share = f", on {sm_share:.0%} of the SMs (dual-batch overlap)" if sm_share < 1 else ""
            return Term("experts (DeepGEMM)", "moe", seconds, "published",
                        f"{self.deepgemm.describe()}{share}, {what}", layers)
        if self.efficiency is None:
            return Term("experts (fused MoE)", "moe", seconds, "table", f"{self.system} moe {self.dtype}, {what}",
                        layers)
        e = self.efficiency
        return Term("experts (fused MoE)", "moe", seconds, "scaled",
                    f"roofline x {e.at(gathered // self.par.dp):.2f}, the {self.system} moe {self.dtype} table's "
                    f"efficiency over its {len(e.timed)} timed shapes, {what}", layers)


@lru_cache(maxsize=1)
def _ungated_shapes() -> frozenset[tuple[int, int, int, int]]:
    """The table's shapes whose experts have no gate: the catalog's Nemotron-H ones (vLLM's relu2_no_mul)."""
    return frozenset((m.expert_hidden, m.moe_intermediate_size, m.num_experts_per_tok, m.num_experts)
                     for m in list_models() if m.is_moe and not m.gated_mlp)


def _shape(row: dict) -> tuple[int, int, int, int]:
    return row["hidden_size"], row["inter_size"], row["topk"], row["num_experts"]


def _split(row: dict) -> tuple[str, int, int]:
    return row["moe_dtype"], row["moe_tp_size"], row["moe_ep_size"]


class _Efficiency:
    """Experts of a shape NVIDIA never timed: the launch floor plus the roofline (planner/cost/moe.py
    expert_roofline), times the table's own efficiency at the same tokens, format and split, the geometric
    mean over every shape it timed there of (its table time / its floor + roofline)."""

    def __init__(self, system: str, model: ModelSpec, par: MoeParallel, fmt: WeightFormat | None,
                 rates: ExpertRoofline, timed: list[tuple[int, int, int, int]], floor: float) -> None:
        self.model, self.par, self.rates, self.timed, self.floor = model, par, rates, timed, floor
        self._shapes = []                   # (a timed shape's MeasuredMoe, its ModelSpec, its bytes per expert)
        for h, i, k, e in timed:
            spec = dataclasses.replace(model, hidden_size=h, moe_intermediate_size=i, num_experts_per_tok=k,
                                       num_experts=e, moe_latent_size=0)
            per_expert = rates.bytes_per_expert * h * i / (model.expert_hidden * model.moe_intermediate_size)
            self._shapes.append((MeasuredMoe(system, spec, par, fmt), spec, per_expert))
        self._cache: dict[int, tuple[float, bool]] = {}

    def _bound(self, spec: ModelSpec, tokens: int, per_expert: float) -> float:
        r = self.rates
        return self.floor + expert_roofline(spec, self.par, tokens, r.flops_rate, r.bandwidth, per_expert)[0]

    def at(self, tokens: int) -> float:
        """The timed shapes' table over roofline when each dp replica runs `tokens` tokens."""
        return self._at(tokens)[0]

    def _at(self, tokens: int) -> tuple[float, bool]:
        if tokens not in self._cache:
            logs = []
            for timed, spec, per_expert in self._shapes:
                logs.append(math.log(timed.experts(tokens * self.par.dp) / self._bound(spec, tokens, per_expert)))
            self._cache[tokens] = (math.exp(sum(logs) / len(logs)), any(t.extrapolated for t, _, _ in self._shapes))
        return self._cache[tokens]

    def price(self, tokens: int) -> tuple[float, bool]:
        """One layer's experts (seconds) when each dp replica runs `tokens` tokens, and whether a table was
        extrapolated."""
        efficiency, extrapolated = self._at(tokens)
        return self._bound(self.model, tokens, self.rates.bytes_per_expert) * efficiency, extrapolated
