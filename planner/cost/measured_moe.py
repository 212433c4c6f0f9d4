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

The table holds only the catalog's MoE shapes (scripts/extract_measured_tables.py); another shape, a
format or a TP/EP split the system did not measure is a one-line error, and `auto` then prices the
model with the roofline.
"""
from __future__ import annotations

from planner.catalog import ModelSpec
from planner.catalog.routing import experts_touched
from planner.catalog.quantization import WeightFormat
from planner.cost import tables
from planner.cost.ledger import Term
from planner.cost.moe import MoeParallel
from planner.errors import PlannerError

# The skew (power-law exponent) of each routing distribution NVIDIA measured.
DISTRIBUTIONS = ((0.0, "balanced"), (1.01, "power_law_1.01"), (1.2, "power_law_1.2"))


def moe_dtype(fmt: WeightFormat | None) -> str:
    """The table's name for the experts' format."""
    if fmt is None:
        return "bfloat16"
    names = {"fp8-block": "fp8_block", "fp8-tensor": "fp8", "fp8-channel": "fp8", "nvfp4": "nvfp4",
             "mxfp4": "w4a16_mxfp4"}
    if fmt.scheme not in names:
        raise PlannerError(f"no measured vLLM MoE table for {fmt.method} experts")
    return names[fmt.scheme]


class MeasuredMoe:
    """The MoE terms of one model on one system: curves over tokens, looked up once per token count."""

    def __init__(self, system: str, model: ModelSpec, par: MoeParallel, fmt: WeightFormat | None) -> None:
        self.system, self.model, self.par = system, model, par
        if not tables.has_table(system, "moe"):
            raise PlannerError(f"{system} has no measured vLLM MoE table")
        self.dtype = moe_dtype(fmt)
        key = (self.dtype, model.hidden_size, model.moe_intermediate_size, model.num_experts_per_tok,
               model.num_experts, par.moe_tp, par.ep)
        rows = [r for r in tables.load_rows(system, "moe")
                if (r["moe_dtype"], r["hidden_size"], r["inter_size"], r["topk"], r["num_experts"],
                    r["moe_tp_size"], r["moe_ep_size"]) == key]
        if not rows:
            raise PlannerError(f"{system} has no measured vLLM MoE rows for {model.name}'s experts "
                               f"({self.dtype}, hidden {model.hidden_size}, width {model.moe_intermediate_size}, "
                               f"top-{model.num_experts_per_tok} of {model.num_experts}) at moe_tp {par.moe_tp}, "
                               f"moe_ep {par.ep}")
        self._curves = {}
        for skew, name in DISTRIBUTIONS:
            points = {r["num_tokens"]: r["latency"] for r in rows if r["distribution"] == name}
            if points:
                self._curves[skew] = tables.Curve.of(tables.monotone(points, 1))
        self.skews = sorted(self._curves)
        self.extrapolated = False
        self._nccl = self._dispatch_curve() if par.dp > 1 else None

    def _dispatch_curve(self) -> tables.Curve:
        points = {r["message_size"]: r["latency"] for r in tables.load_rows(self.system, "allreduce")
                  if r["backend"] == "nccl" and r["num_gpus"] == self.par.dp}
        if not points:
            raise PlannerError(f"{self.system} has no NCCL table on {self.par.dp} GPUs for the dp dispatch")
        return tables.Curve.of(tables.monotone(points, 1))

    def experts(self, tokens: int) -> float:
        """One layer's fused-MoE time when its experts see `tokens` tokens, at the routing skew."""
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
        """The all-gather and reduce-scatter around one MoE layer when each replica runs `tokens` tokens."""
        if self._nccl is None:
            return 0.0
        latency, ext = self._nccl.at(tokens * self.par.dp * self.model.hidden_size)
        self.extrapolated |= ext
        return max(self._nccl.ys[0], latency)

    def terms(self, run: int, router_gemm: float) -> list[Term]:
        """The MoE terms of a step whose replicas each run `run` tokens (CUDA-graph padded)."""
        layers, par = self.model.moe_layers, self.par
        gathered = run * par.dp
        split = f"EP{par.ep}" if par.ep > 1 else f"moe_tp {par.moe_tp}"
        skew = f", routing skew {par.skew:g}" if par.skew else ", uniform routing"
        terms = [Term("router GEMM", "moe", layers * router_gemm, "table",
                      f"{self.system} gemm, m={run} n={self.model.num_experts} k={self.model.hidden_size}, "
                      f"x{layers} layers", layers),
                 Term("experts (fused MoE)", "moe", layers * self.experts(gathered), "table",
                      f"{self.system} moe {self.dtype}, {gathered} tokens, top-{self.model.num_experts_per_tok} "
                      f"of {self.model.num_experts}, {split}{skew}, x{layers} layers", layers)]
        if par.dp > 1:
            terms.append(Term("MoE all-gather + reduce-scatter", "collective", layers * self.dispatch(run), "table",
                              f"{self.system} nccl on {par.dp} GPUs, {gathered} x {self.model.hidden_size} "
                              f"values (half an all-reduce each), x{layers} layers", 2 * layers))
        return terms
