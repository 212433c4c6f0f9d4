"""Measured cost model: step time summed from NVIDIA's per-operation vLLM latencies on each GPU, as a ledger.

For GPUs nobody here can run. A step is priced as vLLM runs it (one forward
pass over every scheduled token, then the LM head, the sampler and the host
work around it), and every priced part is a `Term` of the step's ledger
(planner/cost/ledger.py): `step_time` adds up exactly the terms `ledger`
returns, and `planner explain` prints them. Per layer, x num_layers:

  qkv GEMM        table: m = the step's tokens as the GPU runs them (below),
                  n = this GPU's q+k+v width, k = hidden
  attention       table: prefill tokens by context attention (batch = prefill
                  sequences, each priced as a fresh prompt with as many (query, key)
                  pairs, which covers cached context and chunks);
                  decode sequences by generation attention, each at its own context
  o projection    table: n = hidden, k = this GPU's q width
  MLP GEMMs       table: gate+up and down (gated MLP) or fc1 and fc2
  elementwise     roofline: the norms with their residual adds, Qwen3's q/k norms,
                  rotary, the KV-cache write, the activation (planner/cost/elementwise.py):
                  bytes over the effective bandwidth + a fitted per-kernel floor
  all-reduce x 2  table, under tensor parallelism: vLLM's custom all-reduce
                  (CUDA-graph variant inside a captured graph, eager above),
                  or NCCL where vLLM would not use it (PCIe GPUs beyond 2) or no
                  table exists; the tables' smallest messages are the latency floor
                  (MiniMax-M2: a third, of each token's q/k-norm variances)

then once per step: the embedding lookup and final norm (roofline), the
embedding's all-reduce (TP), the LM-head GEMM over the sampled sequences
(table), the logits all-gather (TP: NCCL table, an all-gather moving half an
all-reduce's bytes), the sampler (roofline over the fp32 logits), and vLLM's
host work: scheduling, input preparation, the sampled tokens' copy to the host
and the output processing, a fitted time per step plus one per scheduled
sequence (planner/cost/calibration.py). Swap and copy-on-write traffic are
priced from bandwidths, as in the roofline model.

A MoE's layers add the router, the experts and the dp dispatch (planner/cost/measured_moe.py: NVIDIA's
fused-MoE table, or DeepGEMM's published rates behind DeepEP, planner/cost/deepgemm.py). Under
--enable-dbo a large step runs as two microbatches whose DeepEP all-to-all overlaps the other's compute
(planner/cost/dbo.py): each half's token terms at its own tokens, then a negative `dual-batch overlap`
term for what the overlap hides.

CUDA graphs. vLLM pads a step of at most its largest capture size to the next
captured size (planner/cost/ledger.py cites vLLM's sizes): the GEMMs,
elementwise kernels and all-reduces run at the padded token count, attention
and the LM head at the real one (padded decode slots carry no context; logits
are computed for the sampled positions only, outside the graph).

Host time. The fitted per-step and per-sequence times are what NVIDIA's H100
runs (vLLM 0.12, whose engine loop schedules, prepares inputs, waits for the
sampled tokens and processes outputs in series with the GPU) take beyond the
priced GPU terms; they are charged in series, as measured. Newer vLLM
(SchedulerConfig.async_scheduling None -> on, vllm/config/vllm.py) prepares
step N+1 while the GPU runs step N; `async_scheduling=True` hides all of the
fitted time behind the GPU (a step costs max(GPU, host)), which is an upper
bound on what async scheduling saves: the runs cannot tell vLLM's host work
from per-step or per-sequence GPU time the tables miss (docs/calibration.md).

Attention tables cover a few (heads, KV heads) pairs per head size. Heads are
independent, so a model whose per-GPU pair is missing is priced as f times the
batch of a pair with 1/f of its heads (f the smallest factor found). A GPU
with slower memory than the measured system (a100-40g on a100_sxm data) keeps
each op's compute but stretches the part its bytes need at the measured
system's effective bandwidth by the bandwidth ratio, and its name says so.

Decode attention. The table times b sequences that all hold c tokens,
T(b, c); a real batch mixes contexts. Each sequence is charged the share it
would have of a uniform batch at its own context, T(b, c_i) / b, and the step
pays the sum:

    decode attention = (1/b) * sum_i T(b, c_i)

For uniform contexts this is T(b, c), and wherever T is affine in c (a fixed
cost plus KV bytes over bandwidth) it equals the price at the mean context;
it departs from that exactly where T is not linear: the launch-bound floor of
short contexts (on h100, T hardly moves below ~256 tokens, so a short
sequence costs the floor however short it is) and the bends where the kernel
leaves it. The form assumes the sequences' work adds up, rather than the
batch waiting on its longest sequence: FlashAttention's decode path (vLLM's
kernel in these tables) splits a long sequence's KV over many thread blocks,
which is what makes that hold.

Along context T is interpolated linearly between the table's points, which
sit at powers of two: decode attention is a fixed cost plus bytes over
bandwidth, affine in context, which linear interpolation reproduces exactly;
its leave-one-out error on these tables is below the log-log one (median
0.5-2.0% against 0.9-2.4%, p90 lower on five of six systems; see
bench/bench_measured_model.py). Then T(b, .) is affine within each
power-of-two bucket, so the sum over sequences needs only each bucket's count
and sum of contexts, which StepShape.decode_histogram carries: a step costs
one term per occupied bucket, not one per sequence. Along batch size T is
interpolated in log-log space, as everywhere else.

Lookups are cached by their integer arguments (the token-count terms by
tokens, the per-sequence ones by sequences), so step_time is a few dict reads
once the simulation has seen a shape.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from planner.catalog import GpuSpec, ModelSpec, list_gpus, mla, resolve_gpu, resolve_model
from planner.catalog.kept_layers import format_share
from planner.catalog.quantization import WeightFormat, gemm_path, peak_flops
from planner.cost import tables
from planner.cost.all2all import DeepEp
from planner.cost.calibration import Calibration, load_calibration
from planner.cost.dbo import COMM_SMS, DualBatch, SplitsSteps
from planner.cost.dbo import TERM as DBO_TERM
from planner.cost.deepgemm import HOPPER_SMS, DeepGemm
from planner.cost.elementwise import step_kernels
from planner.cost.mamba import recurrent_price
from planner.cost.ledger import CudaGraphs, Ledger, Term, cudagraph_capture_sizes
from planner.cost.measured_compressed import MODULE_KERNELS as COMPRESSED_MODULE_KERNELS
from planner.cost.measured_compressed import CompressedModule, HyperConnections
from planner.cost.measured_moe import DEEPEP_TERM, ExpertRoofline, MeasuredMoe
from planner.cost.moe import MoeParallel, bytes_per_expert
from planner.cost.nodes import NODE_LINK, NodeSpan
from planner.cost.shape import StepShape, context_bucket
from planner.cost.sparse import MODULE_GEMMS, MODULE_KERNELS, SparsePrice, module_trees
from planner.cost.window import windowed_prefill_pairs
from planner.errors import PlannerError

# The host time the model charged before it was calibrated against vLLM's own runs (`leave_out=("host",)`):
# our engine's host path as `planner profile` measured it (profiles/cpu/opt-125m.json, sched_decode,
# linear fit: 19.3 us at 1 sequence, 582 us at 256), i.e. 17.1 us + 2.21 us per sequence.
LEGACY_HOST_BASE_S = 17.1e-6
LEGACY_HOST_PER_SEQ_S = 2.21e-6

# Sampling has no measured table: price it as memory traffic over the fp32
# logits (written once, read by softmax and by the argmax/sample: 3 passes) at
# the spec sheet's effective bandwidth, plus one fixed kernel latency per
# kernel (the spec sheet's mem_empirical_constant_latency).
SAMPLING_PASSES = 3
SAMPLING_KERNELS = 4

# The roofline model's planning efficiency for tensor-core math (planner/cost/roofline.py RooflineEfficiency),
# for the compute side of a weight-only GEMM and of what the tables never timed (MLA, an unmeasured MoE shape).
WEIGHT_ONLY_COMPUTE_EFFICIENCY = 0.6

# Two fp32 variances per token (q/k norms across heads), in the all-reduce table's 16-bit values.
QK_VARIANCE_VALUES = 4
# vLLM's custom all-reduce registers an 8 MiB buffer and hands larger messages to NCCL
# (vllm/distributed/device_communicators/custom_all_reduce.py CustomAllreduce max_size=8192 * 1024,
# should_custom_ar: inp_size < self.max_size).
CUSTOM_ALLREDUCE_MAX_BYTES = 8 * 1024 * 1024

# Parts of the ledger that can be left out (priced as before they existed), for the calibration
# bench's before/after table: chunk attention priced by its work (else: the mean new length, scaled by
# pairs), NCCL above the custom all-reduce's buffer, CUDA-graph padding, the elementwise kernels, the
# logits all-gather, and vLLM's host time (the legacy planning guess instead).
TERM_FAMILIES = ("chunk_attention", "allreduce_size", "padding", "elementwise", "logits_gather", "host")


def gemm_table(system: str, fmt: WeightFormat | None, gpu: GpuSpec) -> tuple[str, float | None, str]:
    """(the table pricing the layers' GEMMs, the weight bytes per element a weight-only kernel reads or
    None, how they are priced). A format that runs natively here (planner/catalog/quantization.py
    gemm_path) uses its own measured table; a weight-only one (FP8 on Ampere, NVFP4 before Blackwell,
    AWQ, GPTQ) the bf16 table with the weights read at the format's bytes; MXFP4 leaves dense layers 16-bit.
    Every FP8 scheme reads the per-tensor FP8 table: block-scaled weights run the same FP8 tensor-core GEMM
    (their scales add 1/16,384 of the weights' bytes), and NVIDIA's block-scaled rows time a per-call cost
    that CUDA graphs do not pay (scripts/extract_measured_tables.py)."""
    if fmt is None or not fmt.quantizes_linear:
        return "gemm", None, "bf16 GEMMs"
    precision = gemm_path(fmt, gpu).precision
    if precision == "fp8" and tables.has_table(system, "gemm_fp8"):
        return "gemm_fp8", None, "fp8 GEMMs"
    if precision == "fp4" and tables.has_table(system, "gemm_nvfp4"):
        return "gemm_nvfp4", None, "nvfp4 GEMMs"
    return "gemm", fmt.bytes_per_weight(), f"weight-only GEMMs (bf16 table, {fmt.bits}-bit weights)"


@dataclass(frozen=True)
class FormatGemms:
    """How a system's GEMMs of one weight format are priced (gemm_table): its table's tree, or None to read
    the 16-bit one (with the weights' bytes per element where the kernel is weight-only)."""

    table: str
    tree: dict | None
    max_n: int
    weight_only_bytes: float | None
    how: str


def covered_gpus() -> list[str]:
    """Catalog GPUs that have measured vLLM tables."""
    return [g.name for g in list_gpus() if g.measured_system]


def windowed_decode(triples, curve, w: int) -> float:
    """sum_i T(b, min(c_i, w)) for one sliding-window layer of window `w`, the contexts as (bucket, sequences,
    total context) triples: a sequence past the window is priced at the window (the kernel reads only its
    keys)."""
    a_w, slope_w, _ = curve[context_bucket(w)]
    at_window = a_w + slope_w * w
    total = 0.0
    for k, n, keys in triples:
        if k > 0 and 1 << (k - 1) >= w:
            total += n * at_window
        else:
            a, slope, _ = curve[k]
            total += n * a + slope * min(keys, n * w)
    return total


class MeasuredCostModel(SplitsSteps):
    """Step time for `model` on `tp` x `gpu` from measured vLLM op latencies, as a ledger of priced terms.

    `max_num_seqs` and `max_num_batched_tokens` set vLLM's CUDA-graph capture sizes; `async_scheduling`
    hides the fitted host time behind the GPU's (an upper bound; here in series unless told, as calibrated;
    a deployment says what vLLM does, engine.deployment.vllm_async_default);
    `leave_out` names TERM_FAMILIES to price as before they were modelled; `calibration` replaces the
    shipped fitted constants (planner/data/measured_calibration.json), for the fit itself;
    `custom_all_reduce` False is vLLM's --disable-custom-all-reduce (NCCL's table for every all-reduce);
    `performance_mode` "interactivity" captures a graph for every step of up to 32 tokens (no padding there);
    `speculative_tokens` K sizes the graphs for decode steps of 1 + K tokens a sequence."""

    prices_each_context = True   # decode attention from each sequence's own context (StepShape.decode_histogram)

    def __init__(self, model: ModelSpec | str, gpu: GpuSpec | str, tp: int = 1, dtype_bytes: int = 2,
                 block_size: int = 16, weight_format: WeightFormat | None = None,
                 kv_cache_dtype: str = "auto", *, max_num_seqs: int = 256,
                 max_num_batched_tokens: int | None = None, async_scheduling: bool = False,
                 leave_out: tuple[str, ...] = (), calibration: Calibration | None = None,
                 moe: MoeParallel | None = None, node_link: str = NODE_LINK, custom_all_reduce: bool = True,
                 performance_mode: str = "balanced", speculative_tokens: int = 0) -> None:
        model, gpu = resolve_model(model), resolve_gpu(gpu)
        system = gpu.measured_system
        if system is None:
            raise PlannerError(f"no measured vLLM data for GPU {gpu.name}; covered: {', '.join(covered_gpus())}")
        if dtype_bytes != 2:
            raise PlannerError(f"measured vLLM tables are bf16 (2 bytes per value), not {dtype_bytes}-byte weights")
        unknown = set(leave_out) - set(TERM_FAMILIES)
        if unknown:
            raise PlannerError(f"leave_out: unknown term {sorted(unknown)[0]!r}; known: {', '.join(TERM_FAMILIES)}")
        self.model, self.gpu, self.tp, self.system = model, gpu, tp, system
        self.weight_format, self.kv_cache_dtype = weight_format, kv_cache_dtype
        self.async_scheduling, self.leave_out = async_scheduling, frozenset(leave_out)
        self.graphs = CudaGraphs(cudagraph_capture_sizes(max_num_seqs, max_num_batched_tokens,
                                                         interactivity=performance_mode == "interactivity",
                                                         decode_query_len=1 + speculative_tokens))
        self.calibration = calibration if calibration is not None else load_calibration()
        self._set_up_system(tables.source()["systems"][system])
        self.extrapolated: set[str] = set()
        self.notes: list[str] = []

        heads, kv, hd = model.num_heads // tp, model.kv_heads_per_gpu(tp), model.head_size
        self._heads, self._kv, self._hd = heads, kv, hd
        self._set_up_gemms(model, tp, weight_format)
        par = moe or MoeParallel(tp=tp)
        if par.deepep and par.all2all == "deepep_high_throughput":
            # vLLM runs DeepEP's normal kernels without CUDA graphs (CompilationConfig sets cudagraph_mode NONE
            # for deepep_high_throughput with dp > 1): every step eager, none padded
            self.graphs = CudaGraphs(())
        deepep = DeepEp.of(model, par, gpu, weight_format, dtype_bytes, node_link) if model.is_moe else None
        # the experts' kernel: DeepGEMM where --moe-backend runs it and its published rates price it
        self._moe = (MeasuredMoe(system, model, par, weight_format, self._expert_roofline(model, weight_format),
                                 node_link, deepep, DeepGemm.of(model, weight_format, gpu, par), gpu.node_gpus)
                     if model.is_moe else None)
        # vLLM's dual-batch overlap where DeepEP dispatches (planner/cost/dbo.py); tokens -> (compute, all-to-all)
        self._dbo = par.dual_batch if model.is_moe else None
        self._dbo_cache: dict[int, tuple[float, float]] = {}
        self._dbo_run_cache: dict[tuple[int, bool], tuple[tuple[Term, ...], float]] = {}
        self._dbo_sm_share = (HOPPER_SMS - COMM_SMS) / HOPPER_SMS     # DeepGEMM's cap, which runs on Hopper only
        if self._moe is not None and self._moe.efficiency is not None and self._moe.deepgemm is None:
            self.notes.append(f"{system}'s fused-MoE table has no {self._moe.dtype} rows for {model.name}'s experts: "
                              f"the roofline prices them at the efficiency the table shows for its "
                              f"{len(self._moe.efficiency.timed)} timed shapes in their format and split "
                              f"(planner/cost/measured_moe.py)")
        self._set_up_attention(kv_cache_dtype)
        self._nccl = None
        self._span = NodeSpan.of(tp, tp, node_link, gpu.node_gpus)   # a TP group over nodes (planner/cost/nodes.py)
        self._allreduce = self._allreduce_curves(tp, custom_all_reduce) if tp > 1 else None
        # a term an attention table already times (DeepSeek Sparse Attention's whole module) is not priced again
        self._gemms = [g for g in self._gemms if g[0] not in self._in_attention]
        self._kernels = tuple(k for k in step_kernels(model, tp, self._kv_bytes) if k.name not in self._in_attention)
        self._gdn = recurrent_price(model, gpu, tp, dtype_bytes, system, WEIGHT_ONLY_COMPUTE_EFFICIENCY,
                                    self._elementwise_bw / gpu.memory_bandwidth)
        if self._gdn is not None and self._gdn.source == "roofline":
            self.notes.append(f"{system} has no timed {model.linear_attention.kind} kernels under vLLM: their "
                              f"convolution and recurrent update are priced by the roofline ({self._gdn.module})")

        kv_bytes_per_token = model.kv_cache_bytes_per_token(tp, self._kv_bytes)
        self._swap_per_block = kv_bytes_per_token * block_size / gpu.host_link_bandwidth
        self._copy_per_block = 2 * kv_bytes_per_token * block_size / (gpu.memory_bandwidth * 0.8)
        self._host_base, self._host_per_seq, self.host_source = self._host_constants()

        self._token_cache: dict[int, tuple[tuple[Term, ...], float]] = {}
        self._run_cache: dict[tuple[int, bool], tuple[tuple[Term, ...], float]] = {}
        self._seq_cache: dict[int, tuple[tuple[Term, ...], float]] = {}
        self._ctx_cache: dict[tuple[int, int], tuple[float, float]] = {}
        self._gen_curves: dict[int, tuple] = {}
        self._gen_arrays: dict[int, tuple] = {}      # the same curves as numpy arrays (decode_step_times)
        self._attention_of: dict[int, Callable] = {}  # decode attention of b sequences, by their triples
        # the context grid of generation attention, in powers of two: 1 .. 2**max_bucket
        self._gen_max_bucket = (max(max(row) for row in self._gen_tree.values()).bit_length() if self._latent is None
                                else model.max_position_embeddings.bit_length())
        self._name = self._make_name()

    def _set_up_system(self, info: dict) -> None:
        """The system file's figures: table versions and kernels, effective bandwidth, kernel floor."""
        spec = info["spec"]
        self._versions = {name: t["version"] for name, t in info["tables"].items()}
        self._table_kernels = {name: t["kernel"] for name, t in info["tables"].items() if "kernel" in t}
        scaling = spec.get("mem_bw_empirical_scaling_factor") or 1.0
        self._bw_eff = spec["mem_bw"] * scaling
        self._bw_ratio = spec["mem_bw"] / self.gpu.memory_bandwidth     # > 1: this GPU's memory is slower
        self._kernel_latency = spec.get("mem_empirical_constant_latency") or 0.0
        # the elementwise kernels read this GPU's own memory, at the system file's empirical efficiency
        self._elementwise_bw = self.gpu.memory_bandwidth * scaling
        # weight-only GEMMs (Marlin) run 16-bit math: the spec sheet's bf16 peak at the roofline's efficiency
        self._flops_eff = spec["bfloat16_tc_flops"] * WEIGHT_ONLY_COMPUTE_EFFICIENCY

    def _expert_roofline(self, model: ModelSpec, weight_format: WeightFormat | None) -> ExpertRoofline:
        """The rates of a MoE's experts where the fused-MoE table has no rows for their shape: the format's
        tensor-core peak (16-bit for a weight-only kernel, as the roofline's), the elementwise bandwidth."""
        experts = weight_format.experts if weight_format is not None else None
        return ExpertRoofline(peak_flops(experts, self.gpu) * WEIGHT_ONLY_COMPUTE_EFFICIENCY,
                              self._elementwise_bw, bytes_per_expert(model, weight_format))

    def _host_constants(self) -> tuple[float, float, str]:
        """vLLM's host time per step and per scheduled sequence, and where it comes from."""
        if "host" in self.leave_out:
            return (LEGACY_HOST_BASE_S, LEGACY_HOST_PER_SEQ_S,
                    "our engine's host path, profiles/cpu/opt-125m.json (17.1 us + 2.21 us/seq)")
        cal = self.calibration
        return cal.host_step_s, cal.host_seq_s, cal.describe()

    def _make_name(self) -> str:
        used = {"gemm", *self._tables["layer_gemm"].split("+"), self._tables["context"], self._tables["generation"]}
        if self._moe is not None:
            used.add("moe")
        if getattr(self, "allreduce_backend", None) == "vllm custom all-reduce":
            used.add("custom_allreduce")
        versions = "/".join(sorted({self._versions[k] for k in used if k in self._versions}))
        scaled = f", memory-bound parts x{self._bw_ratio:.2f}" if abs(self._bw_ratio - 1) > 1e-3 else ""
        formats = f", {self.weight_format.method}: {self._gemm_how}" if self.weight_format is not None else ""
        if self.kv_cache_dtype != "auto":
            # only the FlashAttention tables lack FP8-cache rows on some systems; every other table read (the
            # FP8-KV ones, the timed modules) or roofline prices the cache as asked
            as_bf16 = self._tables["generation"] == "generation_attention"
            formats += ", fp8 KV" + (" priced as bf16 KV" if as_bf16 else "")
        where = self.gpu.name if self.tp == 1 else f"{self.tp}x{self.gpu.name}"
        if self._moe is not None:
            par = self._moe.par
            formats += f", moe {self._moe.dtype} dp{par.dp} ep{par.ep}" + (f" skew {par.skew:g}" if par.skew else "")
            formats += f", {par.all2all}" if self._moe.deepep is not None else ""
            formats += ", dual-batch overlap" if self._dbo is not None else ""
            if self._moe.deepgemm is not None:
                formats += " (experts: DeepGEMM)"
            elif self._moe.efficiency is not None:
                formats += " (experts: roofline x the table's efficiency)"
        return (f"measured({where}: {self.system} vllm {versions}, "
                f"aiconfigurator-core {tables.source()['package_version']}{scaled}{formats})")

    def _set_up_gemms(self, model: ModelSpec, tp: int, weight_format: WeightFormat | None) -> None:
        """The layers' GEMM shapes and the tables that price them: the format's own table where the
        system measured it, else the bf16 table read as a weight-only kernel (`_weight_only`)."""
        h = model.hidden_size
        q_width = 2 * self._heads if model.attention_output_gate else self._heads   # Qwen3.5: q and its gate
        # (name, (n, k), layers, (role, indices)): this GPU's share of each GEMM, and the weights of the role's
        # shape tuple it multiplies (which the checkpoint may keep in 16 bits: planner/catalog/kept_layers.py).
        # Gemma 4's full and sliding layers project to heads of their own shape: their GEMMs apart.
        gemms = self._mla_gemms(model, tp) if model.is_mla else []
        # DeepSeek-V4's projections are inside its timed attention module (planner/cost/measured_compressed.py)
        own_projections = not model.is_mla and model.compressed_attention is None
        for layers, spec in model.attention_kinds if own_projections else ():
            label = model.attention_kind_label(spec)
            kv, hd, vd = spec.kv_heads_per_gpu(tp), spec.head_size, spec.value_head_size
            gemms += [(f"qkv{label}", ((q_width + kv) * hd + kv * vd, h), layers, ("attention", (0, 1, 2))),
                      (f"o projection{label}", (h, self._heads * vd), layers, ("attention", (3,)))]
        mixer = model.linear_attention
        if mixer is not None:     # its input projections (GDN: q, k, v, z and b, a) priced as one GEMM
            out = len(mixer.shapes(h)) - 1
            gemms += [("linear attention in-proj", (mixer.in_proj_per_gpu(tp), h), mixer.layers,
                       ("linear_attention", mixer.in_weights)),
                      ("linear attention out-proj", (h, mixer.out_proj_inputs_per_gpu(tp)), mixer.layers,
                       ("linear_attention", (out,)))]
        # an MLP's gate and up run as one GEMM (vLLM's merged column-parallel layer), its down projection last
        ups, down = ((0, 1), (2,)) if model.gated_mlp else ((0,), (1,))
        up = "gate+up" if model.gated_mlp else "fc1" if model.is_gpt_like else "up"
        mlps = model.dense_mlp_kinds                  # a MoE's experts: MeasuredMoe; a DeciLM's MLPs by width
        for layers, width, _ in mlps:
            label, inter = f" ({width} wide)" if len(mlps) > 1 else "", width // tp
            gemms += [(f"{up}{label}", (len(ups) * inter, h), layers, ("mlp", ups)),
                      (f"{'fc2' if model.is_gpt_like else 'down'}{label}", (h, inter), layers, ("mlp", down))]
        if model.shared_expert_width:
            shared = model.shared_expert_width // tp
            what = "MLP" if model.is_gemma else "shared expert"     # Gemma 4's dense MLP beside its experts
            gemms += [(f"{what} {up}", (len(ups) * shared, h), model.moe_layers, ("shared_experts", ups)),
                      (f"{what} down", (h, shared), model.moe_layers, ("shared_experts", down))]
        if model.moe_latent_size:     # whole on every rank (vLLM's ReplicatedLinear)
            latent = model.moe_latent_size
            gemms += [("latent down-projection", (latent, h), model.moe_layers, ("latent", (0,))),
                      ("latent up-projection", (h, latent), model.moe_layers, ("latent", (1,)))]
        shapes = {"attention": model.attention_shapes, "linear_attention": model.linear_attention_shapes,
                  "mlp": model.mlp_shapes, "shared_experts": model.shared_expert_shapes,
                  "latent": model.latent_shapes, "indexer": model.indexer_shapes}
        quantized = weight_format is not None and weight_format.quantizes_linear
        # (name, (n, k), layers, ((format or None for 16 bits, share of the GEMM's weights), ...))
        gemms = [(name, shape, layers, format_share(model, weight_format, role, shapes[role], indices)
                  if quantized else ((None, 1.0),)) for name, shape, layers, (role, indices) in gemms]
        self._gemms = [g for g in gemms if g[2]]
        self._head_shape = (model.vocab_size // tp, h)
        self._head_format = weight_format.head if weight_format is not None else None
        self._gemm_tree = tables.monotone(tables.build_tree(tables.load_rows(self.system, "gemm"), ("n", "k", "m")), 3)
        self._gemm_max_n = max(self._gemm_tree)
        formats = dict.fromkeys([weight_format] if quantized and not weight_format.is_mixed else [])
        formats.update(dict.fromkeys(f for *_, shares in self._gemms for f, _ in shares if f is not None))
        formats.update(dict.fromkeys([self._head_format] if self._head_format is not None else []))
        self._format_tables = {fmt: self._format_table(fmt) for fmt in formats}
        used = list(dict.fromkeys(t.table for t in self._format_tables.values())) or ["gemm"]
        self._tables = {"layer_gemm": "+".join(used)}
        self._gemm_how = "; ".join(dict.fromkeys(t.how for t in self._format_tables.values())) or "bf16 GEMMs"

    def _format_table(self, fmt: WeightFormat) -> FormatGemms:
        """How one format's GEMMs are priced on this system (gemm_table)."""
        table, weight_only_bytes, how = gemm_table(self.system, fmt, self.gpu)
        if table == "gemm_fp8" and fmt.scheme == "fp8-block":
            self.notes.append("block-scaled FP8 GEMMs priced with the per-tensor FP8 table (the same tensor-core "
                              "GEMM; NVIDIA's block-scaled rows time a per-call cost CUDA graphs do not pay)")
        tree = None if table == "gemm" else tables.monotone(
            tables.build_tree(tables.load_rows(self.system, table), ("n", "k", "m")), 3)
        return FormatGemms(table, tree, max(tree) if tree else 0, weight_only_bytes, how)

    @staticmethod
    def _mla_gemms(model: ModelSpec, tp: int) -> list[tuple[str, tuple[int, int], int, tuple[str, tuple[int, ...]]]]:
        """Latent attention's GEMMs on one of `tp` GPUs (planner/catalog/mla.py): the down-projections
        whole (vLLM's fused_qkv_a_proj), the up-projections and o split by heads. kv_b is priced as one
        GEMM over the step's tokens, which is its FLOPs both as prefill runs it and as decode's absorbed
        per-head products (W_UK, W_UV) do."""
        h, heads, layers = model.hidden_size, model.num_heads // tp, model.num_layers
        nope = model.head_size - model.qk_rope_head_dim
        down = model.q_lora_rank + model.kv_lora_rank + model.qk_rope_head_dim
        # the attention shape tuple's order (planner/catalog/mla.py): q_b or q, kv_b, o, [q_a], kv_a, [indexer]
        down_weights = (3, 4) if model.q_lora_rank else (3,)
        gemms = [("q_a + kv_a", (down, h), layers, ("attention", down_weights))]
        gemms.append(("q_b" if model.q_lora_rank else "q", (heads * model.head_size, model.q_lora_rank or h), layers,
                      ("attention", (0,))))
        gemms += [("kv_b", (heads * (nope + model.v_head_dim), model.kv_lora_rank), layers, ("attention", (1,))),
                  ("o projection", (h, heads * model.v_head_dim), layers, ("attention", (2,)))]
        if model.sparse_indexer is not None:     # whole on every rank, on its layers (planner/catalog/sparse_attention.py)
            (q_out, q_in), (k_out, _), (w_out, _) = model.indexer_shapes
            indexed = model.indexer_layers
            gemms += [("indexer wq_b", (q_out, q_in), indexed, ("indexer", (0,))),
                      ("indexer wk + weights_proj", (k_out + w_out, h), indexed, ("indexer", (1, 2)))]
        return gemms

    def _set_up_attention(self, kv_cache_dtype: str) -> None:
        """The attention tables of the KV cache's dtype (bf16 ones where the system has no FP8-KV table)."""
        fp8 = kv_cache_dtype == "fp8"
        self._kv_bytes = 1 if fp8 else 2
        self._latent = self._sparse = self._full = self._ctx_tree = self._gen_tree = None
        self._index_share = 0.0           # the share of a DSA model's layers that reuse another's indexer
        self._compressed = self._hyper = None
        self._in_attention: frozenset[str] = frozenset()
        self._ctx_fold = self._gen_fold = 1        # the FlashAttention tables' batch fold (_attention_tree)
        if self.model.sparse_indexer is not None:
            self._set_up_sparse_attention()
            return
        if self.model.compressed_attention is not None:
            self._set_up_compressed_attention()
            return
        if self.model.is_mla:
            self._set_up_latent_attention()
            return
        heads, kv, hd = self._heads, self._kv, self._hd
        if fp8 and tables.has_table(self.system, "generation_attention_fp8kv"):
            try:
                self._ctx_tree, self._ctx_fold = self._attention_tree("context_attention_fp8kv", "isl", heads, kv, hd)
                self._gen_tree, self._gen_fold = self._attention_tree("generation_attention_fp8kv", "step",
                                                                      heads, kv, hd)
                self._set_up_full_layers("_fp8kv")
                self._tables.update(context="context_attention_fp8kv", generation="generation_attention_fp8kv")
                return
            except PlannerError as exc:
                self.notes.append(f"FP8-KV attention priced from the bf16-KV tables: {exc}")
        elif fp8:
            self.notes.append(f"{self.system} has no FP8-KV attention table: attention priced from the bf16-KV tables")
        self._tables.update(context="context_attention", generation="generation_attention")
        self._ctx_tree, self._ctx_fold = self._attention_tree("context_attention", "isl", heads, kv, hd)
        self._gen_tree, self._gen_fold = self._attention_tree("generation_attention", "step", heads, kv, hd)
        self._set_up_full_layers("")

    def _set_up_full_layers(self, fp8: str) -> None:
        """Gemma 4's full-attention layers: the same tables at their own head size and KV heads, priced apart
        (`_full`: (context tree, its fold, generation tree, its fold, KV heads, head size)); None when every
        layer attends alike."""
        spec = self.model.full_layer_spec
        if spec is self.model:
            return
        kv, hd = spec.kv_heads_per_gpu(self.tp), spec.head_size
        self._full = (*self._attention_tree(f"context_attention{fp8}", "isl", self._heads, kv, hd),
                      *self._attention_tree(f"generation_attention{fp8}", "step", self._heads, kv, hd), kv, hd)
        self._full_curves: dict[int, tuple] = {}
        self._full_arrays: dict[int, tuple] = {}

    def _timed_module(self, kind: str) -> str | None:
        """NVIDIA's timed attention module of this model (`kind` "dsa" or "mla": planner/cost/sparse.py
        module_trees) read as its attention tables, its projections and small kernels leaving the ledger's
        GEMM and elementwise terms; what the tables time, or None where the system timed no such module."""
        module = module_trees(self.system, self.model, self._heads, self.kv_cache_dtype, self.weight_format, kind)
        if module is None:
            return None
        self._ctx_tree, self._gen_tree, timed = module
        self._in_attention = MODULE_GEMMS | MODULE_KERNELS
        self._tables.update(context=f"{kind}_context", generation=f"{kind}_generation")
        return timed

    def _set_up_latent_attention(self) -> None:
        """Multi-head latent attention (planner/catalog/mla.py). Where NVIDIA timed vLLM's whole MLA module at
        the model's shapes (DeepSeek-V3's, and Kimi-K2's, which are the same per head), one layer's module
        comes from its tables, read like the attention tables: its projections, latent norms, rotary and
        cache write leave the ledger's GEMM and elementwise terms (`_in_attention`). Elsewhere (a shape it
        never timed: DeepSeek-V2) by the roofline, at the bandwidth the elementwise kernels get and the
        16-bit tensor-core peak at the roofline's efficiency, on top of the smallest time the system's
        attention tables record (a kernel's launch floor):
            decode   floor + b c max(cache bytes per key / bandwidth, heads x decode FLOPs per key / peak)
            prefill  floor + b max(l (l + 1) / 2 heads x FLOPs per pair / peak, l x cache bytes / bandwidth)"""
        timed = self._timed_module("mla")
        if timed is not None:
            self.notes.append(f"multi-head latent attention: each layer's MLA module (q_a + kv_a, q_b, kv_b, o, "
                              f"latent norms, rotary, cache write, attention) from {self.system}'s mla_context / "
                              f"mla_generation tables ({timed})")
            return
        self._latent = self._latent_prices()
        self._tables.update(context="MLA roofline", generation="MLA roofline")
        self.notes.append(f"multi-head latent attention priced by the roofline on top of the attention tables' "
                          f"floor ({self.system} timed no MLA module of {self.model.name}'s shapes)")

    def _latent_prices(self) -> dict[str, float]:
        """One layer's MLA prices by the roofline (`_set_up_latent_attention`)."""
        m = self.model
        key_bytes = m.kv_cache_width(self.tp) * self._kv_bytes
        return {
            "decode_per_seq": 0.0,
            "decode_per_key": max(key_bytes / self._elementwise_bw,
                                  self._heads * mla.decode_flops_per_key(m) / self._flops_eff),
            "prefill_per_pair": self._heads * mla.prefill_flops_per_pair(m) / self._flops_eff,
            "write_per_token": key_bytes / self._elementwise_bw,
            "decode_floor": min(r["latency"] for r in tables.load_rows(self.system, "generation_attention")),
            "prefill_floor": min(r["latency"] for r in tables.load_rows(self.system, "context_attention")),
        }

    def _set_up_sparse_attention(self) -> None:
        """DeepSeek Sparse Attention (planner/cost/sparse.py). Where NVIDIA timed the model's shapes, one
        layer's whole attention module comes from its tables, read like the attention tables (its
        projections and small kernels leave the ledger's GEMM and elementwise terms: `_in_attention`).
        Elsewhere by the roofline: a decoding sequence pays index_topk keys' latent attention and the
        indexer's score of each of its keys, so its decode curve is the MLA floor plus those two (linear
        in the context: the context buckets' lines are exact). Either way a prefill's cached keys beyond
        a fresh prompt's are the indexer's to score (`_prefill_attention`)."""
        fp8 = self.gpu.fp8_flops * WEIGHT_ONLY_COMPUTE_EFFICIENCY
        self._sparse = SparsePrice.of(self.model, self.gpu, self.tp, self._kv_bytes, self._elementwise_bw,
                                      self._flops_eff, fp8)
        timed = self._timed_module("dsa")
        if timed is not None:
            self.notes.append(f"DeepSeek Sparse Attention: each layer's attention module (projections, indexer, "
                              f"sparse MLA, o_proj) from {self.system}'s dsa_context / dsa_generation tables "
                              f"({timed}); a prefill's cached keys scored by the indexer's roofline")
            self._set_up_shared_indexers()
            return
        self._latent = self._latent_prices() | {"decode_per_seq": self._sparse.decode_per_query,
                                                "decode_per_key": self._sparse.indexed * self._sparse.index_per_key}
        self._tables.update(context="DSA roofline", generation="DSA roofline")
        self.notes.append(f"DeepSeek Sparse Attention priced by the roofline on top of the attention tables' floor: "
                          f"{self._sparse.topk} keys of latent attention per query and the indexer's FP8 score of "
                          f"every key (planner/cost/sparse.py; bench/bench_dsa_module.py sets it beside NVIDIA's "
                          f"timed vLLM DSA module)")

    def _set_up_shared_indexers(self) -> None:
        """A model whose layers share indexers (GLM-5.2: 57 of 78 reuse the picks of the last layer that ran one)
        against a module NVIDIA timed with an indexer on every layer: a sharing layer costs the module less what
        its indexer does (`_index_credit`), priced as the ledger prices the parts: its two GEMMs from the GEMM
        tables, its small kernel and its scoring of the keys by the roofline."""
        m = self.model
        self._index_share = (m.attention_layers - m.indexer_layers) / m.attention_layers
        if not self._index_share:
            return
        self._index_gemms = [(n, k, shares) for name, (n, k), _, shares in self._gemms if name.startswith("indexer ")]
        self._index_kernel = next(k.bytes_per_token for k in step_kernels(m, self.tp, self._kv_bytes)
                                  if k.name.startswith("indexer "))
        self.notes.append(f"{m.indexer_layers} of {m.attention_layers} layers run an indexer: the other layers' "
                          f"module is priced less its indexer's GEMMs, kernel and scoring")

    def _index_credit(self, tokens: int, scored: int, per_score: float) -> float:
        """Per layer, on average over the layers: the time the layers that share an indexer's picks do not spend
        on one (`_set_up_shared_indexers`), at `tokens` tokens and `scored` scores of `per_score` seconds each."""
        run = self._padded(tokens)
        own = (sum(self._shared_gemm(run, n, k, shares) for n, k, shares in self._index_gemms)
               + self.elementwise(self._index_kernel * run, 1) + scored * per_score)
        return self._index_share * own

    def _set_up_compressed_attention(self) -> None:
        """DeepSeek-V4 (planner/cost/measured_compressed.py): each layer's whole attention module from the
        system's dsv4 tables (its projections, rotary and cache writes leave the ledger's GEMM and
        elementwise terms), and the hyper-connections from its mhc table."""
        module = CompressedModule.of(self.system, self.model, self._heads)
        if module is None:
            raise PlannerError(f"{self.system} has no timed DeepSeek-V4 attention module of {self.model.name}'s "
                               f"shapes at {self._heads} heads per GPU: --cost-model roofline prices it")
        self._compressed, self._gen_tree = module, module.generation
        self._prefix_cache: dict[tuple[int, int, int], float] = {}
        self._in_attention = frozenset(k.name for k in step_kernels(self.model, self.tp, self._kv_bytes)
                                       if k.name.startswith(COMPRESSED_MODULE_KERNELS))
        self._tables.update(context="dsv4_context", generation="dsv4_generation")
        self._hyper = HyperConnections.of(self.system, self.model)
        hyper = "the mhc table" if self._hyper is not None else "nothing (no mhc table: left out)"
        self.notes.append(f"DeepSeek-V4: each layer's attention module (projections, compressors, indexer, sparse "
                          f"attention) from {self.system}'s dsv4_context / dsv4_generation tables ({module.label}; "
                          f"window-only layers as HCA layers within the window); hyper-connections from {hyper}")

    @property
    def name(self) -> str:
        """What priced the steps; names any table the run had to extrapolate beyond its grid."""
        if not self.extrapolated:
            return self._name
        return f"{self._name[:-1]}; extrapolated {', '.join(sorted(self.extrapolated))})"

    # ---- set-up -------------------------------------------------------------

    def _attention_tree(self, table: str, length_axis: str, heads: int, kv: int, hd: int) -> tuple[dict, int]:
        """The (batch, length) sub-table for this GPU's heads, and the batch fold factor it needs."""
        rows = [r for r in tables.load_rows(self.system, table) if r["head_dim"] == hd]
        if not rows:
            dims = sorted({r["head_dim"] for r in tables.load_rows(self.system, table)})
            raise PlannerError(f"{self.system} {table} covers head_dim {', '.join(map(str, dims))}, "
                               f"not {self.model.name}'s {hd}")
        pairs = {(r["num_heads"], r["num_kv_heads"]) for r in rows}
        for fold in range(1, kv + 1):
            if kv % fold == 0 and heads % fold == 0 and (heads // fold, kv // fold) in pairs:
                where = {"num_heads": heads // fold, "num_kv_heads": kv // fold}
                return tables.monotone(tables.build_tree(rows, ("batch_size", length_axis), where), 2), fold
        shown = ", ".join(f"{a}/{b}" for a, b in sorted(pairs))
        raise PlannerError(f"{self.system} {table} has no (heads/KV heads) pair for {heads}/{kv} per GPU "
                           f"(head_dim {hd}); covered: {shown}")

    def _allreduce_curves(self, tp: int, custom: bool = True) -> dict[str, tables.Curve]:
        """The all-reduce curves vLLM would use on `tp` of these GPUs (and the NCCL one, for the logits
        all-gather, in `_nccl`); a group over several nodes reads one node's share of it (`_span`). `custom`
        False: vLLM's --disable-custom-all-reduce, NCCL for every message."""
        rows = tables.load_rows(self.system, "allreduce")
        local = tp if self._span is None else self._span.per_node
        by_backend: dict[str, dict] = {}
        for r in rows:
            if r["num_gpus"] == local:
                by_backend.setdefault(r["backend"], {})[r["message_size"]] = r["latency"]
        by_backend = {name: tables.monotone(points, 1) for name, points in by_backend.items()}
        self._nccl = tables.Curve.of(by_backend["nccl"]) if "nccl" in by_backend else None
        # vLLM's custom all-reduce needs NVLink beyond two GPUs (PCIe boxes fall back to NCCL) and all of
        # the group in one node
        custom_ok = custom and (self.gpu.interconnect.startswith("nvlink") or tp <= 2) and self._span is None
        if custom_ok and "custom_graph" in by_backend and "custom_eager" in by_backend:
            self.allreduce_backend = "vllm custom all-reduce"
            return {"graph": tables.Curve.of(by_backend["custom_graph"]),
                    "eager": tables.Curve.of(by_backend["custom_eager"])}
        if "nccl" in by_backend:
            self.allreduce_backend = "nccl" if self._span is None else f"nccl over {self._span.nodes} nodes"
            curve = tables.Curve.of(by_backend["nccl"])
            return {"graph": curve, "eager": curve}
        counts = sorted({r["num_gpus"] for r in rows})
        raise PlannerError(f"{self.system} has no all-reduce table for {tp} GPUs; covered: {counts}")

    # ---- lookups (cache misses) ---------------------------------------------

    def _flag(self, what: str, extrapolated: bool) -> None:
        if extrapolated:
            self.extrapolated.add(what)

    def _slower_memory(self, latency: float, nbytes: float) -> float:
        """Stretch the memory-bound part of an op measured on faster memory than this GPU's."""
        if self._bw_ratio <= 1.0:
            return latency
        memory_part = min(latency, nbytes / self._bw_eff)
        return latency + memory_part * (self._bw_ratio - 1.0)

    def gemm(self, m: int, n: int, k: int) -> float:
        """A 16-bit GEMM (the LM head's; the layers' when the weights are 16-bit)."""
        # A GEMM wider than the table (an LM head over a 128K vocabulary) is priced
        # as equal column blocks that the table covers, run one after another.
        blocks = -(-n // self._gemm_max_n)
        latency, ext = tables.interpolate(self._gemm_tree, (n / blocks, k, m))
        self._flag("gemm", ext)
        return self._slower_memory(blocks * latency, 2.0 * (m * k + k * n + m * n))

    def layer_gemm(self, m: int, n: int, k: int) -> float:
        """One of a layer's GEMMs in the weights' one format (16 bits where it quantizes no dense layer)."""
        fmt = self.weight_format
        return self.format_gemm(fmt if fmt is not None and fmt.quantizes_linear else None, m, n, k)

    def format_gemm(self, fmt: WeightFormat | None, m: int, n: int, k: int) -> float:
        """A GEMM with weights in `fmt` (None: 16 bits): the format's own table, or the 16-bit one read as a
        weight-only kernel."""
        if fmt is None:
            return self.gemm(m, n, k)
        priced = self._format_tables[fmt]
        if priced.tree is None:
            latency = self.gemm(m, n, k)
            return (latency if priced.weight_only_bytes is None
                    else self._weight_only(latency, m, n, k, priced.weight_only_bytes))
        blocks = -(-n // priced.max_n)
        latency, ext = tables.interpolate(priced.tree, (n / blocks, k, m))
        self._flag(priced.table, ext)
        return self._slower_memory(blocks * latency, 2.0 * (m * k + m * n) + fmt.matrix_bytes(n, k))

    def _shared_gemm(self, m: int, n: int, k: int, shares) -> float:
        """A layer GEMM whose weights are stored in several formats across the layers (a share kept in 16 bits
        by the checkpoint, or a mixed checkpoint's formats; planner/catalog/kept_layers.py): each share at
        its format's price."""
        if len(shares) == 1:
            return self.format_gemm(shares[0][0], m, n, k)
        return sum(share * self.format_gemm(fmt, m, n, k) for fmt, share in shares)

    def _tables_read(self, shares) -> str:
        """The table(s) a GEMM of these format shares reads, for its term's detail."""
        def table(fmt: WeightFormat | None) -> str:
            if fmt is None:
                return "gemm"
            priced = self._format_tables[fmt]
            return priced.table + (f" as {fmt.name} weight-only" if priced.weight_only_bytes is not None else "")

        kept = sum(share for fmt, share in shares if fmt is None)
        quantized = self.weight_format is not None and self.weight_format.quantizes_linear
        if len(shares) == 1:
            return table(shares[0][0]) + (", kept in 16 bits by the checkpoint" if kept and quantized else "")
        if len(shares) == 2 and kept and not self.weight_format.is_mixed:
            return f"{table(next(f for f, _ in shares if f is not None))}, {kept:.0%} of it kept in 16 bits (gemm)"
        return " + ".join(f"{share:.0%} {table(fmt)}" for fmt, share in shares)

    def _weight_only(self, latency: float, m: int, n: int, k: int, weight_bytes: float) -> float:
        """A weight-only kernel (Marlin: the weights widened to 16 bits in registers, 16-bit math) priced as
        the measured 16-bit GEMM less the time its smaller weights save: the roofline time with the
        16-bit weights minus the one with the format's (equal when compute-bound), never below the
        measured time scaled by the same ratio. Marlin's own dequantization cost is not modelled."""
        compute = 2.0 * m * n * k / self._flops_eff
        before = max(compute, 2.0 * (m * k + k * n + m * n) / self._bw_eff)
        after = max(compute, (2.0 * (m * k + m * n) + weight_bytes * k * n) / self._bw_eff)
        return max(latency - (before - after), latency * after / before)

    def context_attention(self, batch: int, length: int) -> float:
        """One layer's attention over `batch` fresh prompts of `length` tokens."""
        if self._latent is not None and self._sparse is not None:       # DSA by the roofline
            return self._latent["prefill_floor"] + self._sparse.prefill(batch * length,
                                                                        batch * length * (length + 1) // 2)
        if self._compressed is not None:
            return self._compressed.prefill(batch, length, 0)[0]
        if self._latent is not None:
            p = self._latent
            return p["prefill_floor"] + batch * max(length * (length + 1) // 2 * p["prefill_per_pair"],
                                                    length * p["write_per_token"])
        one = self._context_at(batch, length, self._ctx_tree, self._ctx_fold, self._kv, self._hd)
        if self._index_share:            # DSA layers that share an indexer's picks (_set_up_shared_indexers)
            tokens = batch * length
            one -= self._index_credit(tokens, tokens * (length + 1) // 2, self._sparse.index_per_pair)
        return one

    def _context_at(self, batch: int, length: int, tree: dict, fold: int, kv: int, hd: int) -> float:
        """context_attention from a table of one head shape (`kv` KV heads of `hd` on this GPU)."""
        latency, ext = tables.interpolate(tree, (batch * fold, length))
        self._flag(self._tables["context"], ext)
        nbytes = batch * length * (2.0 * 2 * self._heads + self._kv_bytes * 2 * kv) * hd
        return self._slower_memory(latency, nbytes)

    def generation_attention(self, batch: int, context: int) -> float:
        """One layer's decode attention for `batch` sequences of `context` tokens each."""
        curve = self._gen_curves.get(batch) or self._gen_curve(batch)
        a, slope, ext = curve[context_bucket(context)]
        self._flag(self._tables["generation"], ext)
        return a + slope * context

    def _gen_curve(self, batch: int) -> tuple:
        """Per context bucket k, (a, slope, extrapolated) with one layer's T(batch, c) = a + slope * c
        for 2**(k-1) < c <= 2**k: the line through the table's points at 2**(k-1) and 2**k."""
        curve = self._curve_through(batch, self._gen_tree, self._gen_fold, self._kv, self._hd)
        self._gen_curves[batch] = curve
        return curve

    def _full_curve(self, batch: int) -> tuple:
        """`_gen_curve` of Gemma 4's full-attention layers (their own head shape); the same curve when every
        layer attends alike."""
        if self._full is None:
            return self._gen_curves.get(batch) or self._gen_curve(batch)
        curve = self._full_curves.get(batch)
        if curve is None:
            _, _, tree, fold, kv, hd = self._full
            curve = self._full_curves[batch] = self._curve_through(batch, tree, fold, kv, hd)
        return curve

    def _curve_through(self, batch: int, tree: dict, fold: int, kv: int, hd: int) -> tuple:
        """`_gen_curve` from a generation table of one head shape (`kv` KV heads of `hd` on this GPU)."""
        points = []
        for j in range(self._gen_max_bucket + 1):
            context = max(1 << j, 2)      # the table starts at one cached token: context 1 costs as 2
            if self._latent is not None:
                p = self._latent
                points.append((p["decode_floor"] + batch * (p["decode_per_seq"] + context * p["decode_per_key"]),
                               False))
                continue
            # the table's `step` counts the tokens already cached; the new token is the one more
            latency, ext = tables.interpolate(tree, (batch * fold, context - 1))
            nbytes = self._kv_bytes * batch * context * 2.0 * kv * hd
            latency = self._slower_memory(latency, nbytes)
            if self._index_share:        # DSA layers that share an indexer's picks (_set_up_shared_indexers)
                latency -= self._index_credit(batch, batch * context, self._sparse.index_per_key)
            points.append((latency, ext))
        curve = [(points[0][0], 0.0, points[0][1])]           # bucket 0: context 1
        for j in range(1, len(points)):
            (y0, e0), (y1, e1) = points[j - 1], points[j]
            slope = (y1 - y0) / (1 << (j - 1))
            curve.append((y0 - slope * (1 << (j - 1)), slope, e0 or e1))
        a, slope, _ = curve[-1]
        curve += [(a, slope, True)] * (64 - len(curve))       # longer contexts: the last line, extended
        return tuple(curve)

    def decode_attention(self, s: StepShape) -> float:
        """All layers' decode attention: (1/b) * sum_i T(b, c_i), one term per context bucket.

        A sequence verifying d drafts is priced as one decode at its last row's context: vLLM runs its
        d + 1 query rows in one attention program over its keys (flash_attn_varlen_func with the
        request's query length, vllm/v1/attention/backends/flash_attn.py), so the keys are read once and
        the step stays memory-bound; the extra rows' arithmetic is left out."""
        b = s.decode_seqs
        hist = s.decode_histogram
        if hist:
            iterator = iter(hist)
            return self._bucket_attention(b, list(zip(iterator, iterator, iterator)) if self.model.sliding_layers
                                          else zip(iterator, iterator, iterator))
        # No histogram: every sequence at the mean context.
        curve = self._gen_curves.get(b) or self._gen_curve(b)
        k = context_bucket(-(-s.decode_context // b))
        a, slope, ext = self._full_curve(b)[k]
        if ext:
            self.extrapolated.add(self._tables["generation"])
        full = self.model.full_attention_layers * (a + slope * s.decode_context / b)
        if not self.model.sliding_layers:
            return full
        return full + self.model.sliding_layers * windowed_decode(((k, b, s.decode_context),), curve,
                                                                 self.model.window) / b

    def _bucket_attention(self, b: int, triples) -> float:
        """decode_attention of `b` sequences given as (bucket, sequences, total context) triples, buckets
        ascending (re-iterable when the model has sliding-window layers)."""
        return (self._attention_of.get(b) or self._attention_pricer(b))(triples)

    def _attention_pricer(self, b: int) -> Callable:
        """`_bucket_attention` of `b` sequences as a function of the triples, everything else bound once
        (a short plan prices each of its steps so: planner/sim/batch.py)."""
        curve = self._gen_curves.get(b) or self._gen_curve(b)
        full_curve = self._full_curve(b)        # the full-attention layers' (Gemma 4: their own head shape)
        full_layers, sliding_layers, window = self.model.full_attention_layers, self.model.sliding_layers, \
            self.model.window
        extrapolated, table = self.extrapolated, self._tables["generation"]

        def attention(triples) -> float:
            total = 0.0
            for k, n, keys in triples:
                a, slope, ext = full_curve[k]
                total += n * a + slope * keys
                if ext:
                    extrapolated.add(table)
            full = full_layers * total / b
            if not sliding_layers:
                return full
            return full + sliding_layers * windowed_decode(triples, curve, window) / b
        self._attention_of[b] = attention       # (kept by self: so it must not hold self)
        return attention

    def decode_pricer(self, seqs: int) -> Callable:
        """step_time of a decode-only step of `seqs` sequences as a function of their contexts, given as
        (bucket, sequences, total context) triples, buckets ascending (the decode batch's histogram as it
        keeps it), everything else bound once: planner/sim/batch.py prices a short plan's steps, all of
        one batch, so without building StepShapes. The same float: the terms that do not depend on the
        contexts summed as step_time sums them."""
        attention = self._attention_of.get(seqs) or self._attention_pricer(seqs)
        host = self._host_base + self._host_per_seq * seqs
        recurrent = self._gdn.decode(seqs) if self._gdn is not None else 0.0   # as step_time adds it, last
        if self._dbo is not None and self._dbo.splits(seqs, seqs, True):
            compute, comm = self._dbo_cache.get(seqs) or self._dbo_price(seqs)
            rest = (self._seq_cache.get(seqs) or self._seq_terms(seqs))[1]
            layers, in_series = self.model.moe_layers, not self.async_scheduling

            def split(triples) -> float:         # as _dual_batch_step
                gpu = DualBatch.overlapped(compute + (attention(triples) + recurrent), comm, layers) + rest
                return gpu + host if in_series else (gpu if gpu >= host else host)
            return split
        fixed = (self._token_cache.get(seqs) or self._token_terms(seqs))[1]
        fixed += (self._seq_cache.get(seqs) or self._seq_terms(seqs))[1]
        if self.async_scheduling:
            def price(triples) -> float:
                gpu = fixed + attention(triples) + recurrent
                return gpu if gpu >= host else host
        else:
            def price(triples) -> float:
                return fixed + attention(triples) + recurrent + host
        return price

    def decode_step_times(self, seqs: int, low: int, counts, sums):
        """`step_time` of decode-only steps of `seqs` sequences, one per row: row i holds counts[i, j]
        sequences of total context sums[i, j] in context bucket low + j (numpy arrays; 0 where empty).
        The same floats as step_time, term by term in its order (the buckets summed left to right
        by a cumulative sum, which numpy runs sequentially), for a run of steps in a few array
        operations (the simulator's decode batch, planner/sim/decode_run.py); an empty bucket adds
        exactly 0. Flags nothing: `flag_decode_buckets` does, for the steps the caller takes."""
        a, slope = self._full_array(seqs)
        width = counts.shape[1]
        terms = counts * a[low:low + width] + slope[low:low + width] * sums
        total = np.cumsum(terms, axis=1)[:, -1]
        attention = self.model.full_attention_layers * total / seqs
        if self.model.sliding_layers:
            attention = attention + self.model.sliding_layers * self._windowed_decode_rows(seqs, low, counts,
                                                                                          sums) / seqs
        host = self._host_base + self._host_per_seq * seqs
        if self._dbo is not None and self._dbo.splits(seqs, seqs, True):     # as _dual_batch_step, row by row
            compute, comm = self._dbo_cache.get(seqs) or self._dbo_price(seqs)
            if self._gdn is not None:
                attention = attention + self._gdn.decode(seqs)
            work = compute + attention
            gpu = np.maximum(work, comm) + np.minimum(work, comm) / (2 * self.model.moe_layers)
            gpu = gpu + (self._seq_cache.get(seqs) or self._seq_terms(seqs))[1]
            return gpu + host if not self.async_scheduling else np.where(gpu >= host, gpu, host)
        gpu = (self._token_cache.get(seqs) or self._token_terms(seqs))[1]
        gpu += (self._seq_cache.get(seqs) or self._seq_terms(seqs))[1]
        gpu = gpu + attention
        if self._gdn is not None:
            gpu = gpu + self._gdn.decode(seqs)
        return gpu + host if not self.async_scheduling else np.where(gpu >= host, gpu, host)

    def _gen_array(self, seqs: int) -> tuple:
        curve = self._gen_curves.get(seqs) or self._gen_curve(seqs)
        value = (np.array([c[0] for c in curve]), np.array([c[1] for c in curve]))
        self._gen_arrays[seqs] = value
        return value

    def _full_array(self, seqs: int) -> tuple:
        """`_gen_array` of the full-attention layers (`_full_curve`)."""
        if self._full is None:
            return self._gen_arrays.get(seqs) or self._gen_array(seqs)
        value = self._full_arrays.get(seqs)
        if value is None:
            curve = self._full_curve(seqs)
            value = self._full_arrays[seqs] = (np.array([c[0] for c in curve]), np.array([c[1] for c in curve]))
        return value

    def flag_decode_buckets(self, seqs: int, low: int, counts) -> None:
        """What step_time notes of the decode steps of `seqs` sequences in `counts` (as for
        decode_step_times): the generation table extrapolated where a bucket they read lies outside it."""
        width = counts.shape[1]
        curves = [self._gen_curves.get(seqs) or self._gen_curve(seqs)]
        if self._full is not None:          # Gemma 4's full-attention layers read their own table
            curves.append(self._full_curve(seqs))
        for curve in curves:
            if any(c[2] for c in curve[low:low + width]) and any(
                    curve[low + j][2] for j, used in enumerate(counts.any(axis=0).tolist()) if used):
                self.extrapolated.add(self._tables["generation"])

    def _windowed_decode_rows(self, seqs: int, low: int, counts, sums):
        """`windowed_decode` of each row of a run laid out as for `decode_step_times`: the same floats
        (a bucket past the window at the window's price, the others' keys capped at the window's)."""
        w = self.model.window
        curve = self._gen_curves.get(seqs) or self._gen_curve(seqs)
        a_w, slope_w, _ = curve[context_bucket(w)]
        a, slope = self._gen_arrays.get(seqs) or self._gen_array(seqs)
        width = counts.shape[1]
        buckets = np.arange(low, low + width)
        past = (buckets > 0) & (np.left_shift(1, np.maximum(buckets - 1, 0)) >= w)
        inside = counts * a[low:low + width] + slope[low:low + width] * np.minimum(sums, counts * w)
        terms = np.where(past, counts * (a_w + slope_w * w), inside)
        return np.cumsum(terms, axis=1)[:, -1]

    def allreduce(self, tokens: int, captured: bool | None = None) -> float:
        """One all-reduce of `tokens` x hidden values: the CUDA-graph variant inside a captured graph; NCCL
        for a message over vLLM's custom all-reduce buffer."""
        if self._allreduce is None:
            return 0.0
        if captured is None:
            captured = self.graphs.captured(tokens)
        curve = self._nccl if self._over_custom_buffer(tokens) else self._allreduce["graph" if captured else "eager"]
        return self._spanned(curve, tokens * self.model.hidden_size)

    def qk_norm_allreduce(self, tokens: int, captured: bool) -> float:
        """A q/k RMSNorm across heads (MiniMax-M2) needs each token's two fp32 variances summed over the TP
        ranks: vLLM all-reduces them (MiniMaxText01RMSNormTP.forward_qk), a message at the latency floor."""
        return self._spanned(self._allreduce["graph" if captured else "eager"], tokens * QK_VARIANCE_VALUES)

    def _spanned(self, curve: tables.Curve, values: int) -> float:
        """An all-reduce of `values` 16-bit values: the curve's, or over nodes, its node's share with the
        network's (planner/cost/nodes.py)."""
        latency, ext = curve.at(values)
        self._flag("allreduce", ext)
        return latency if self._span is None else self._span.allreduce(latency, 2 * values)

    def _over_custom_buffer(self, tokens: int) -> bool:
        """Whether vLLM hands this all-reduce (tokens x hidden bf16 values) to NCCL because it exceeds the
        custom all-reduce's registered buffer."""
        return (self._nccl is not None and "allreduce_size" not in self.leave_out and self._span is None
                and tokens * self.model.hidden_size * 2 > CUSTOM_ALLREDUCE_MAX_BYTES)

    def allreduce_backend_for(self, tokens: int) -> str:
        if self._over_custom_buffer(tokens):
            return "nccl (message over the custom all-reduce's 8 MiB)"
        return self.allreduce_backend

    def logits_gather(self, seqs: int) -> float:
        """The LM head's all-gather of every GPU's vocabulary shard (vLLM's LogitsProcessor) over NCCL:
        half an all-reduce of the gathered logits (an all-gather moves half the bytes), never below the
        smallest message's time (the latency floor)."""
        if self._nccl is None:
            return 0.0
        floor = self._nccl.ys[0]
        latency, ext = self._nccl.at(seqs * self.model.vocab_size)
        self._flag("allreduce", ext)
        if self._span is not None:      # half an all-reduce's bytes cross the network too
            return self._span.allreduce(max(floor, latency / 2), seqs * self.model.vocab_size)
        return max(floor, latency / 2)

    def elementwise(self, kernel_bytes: float, launches: int) -> float:
        """`launches` memory-bound kernels moving `kernel_bytes` each: the per-kernel floor plus the bytes
        over the effective bandwidth."""
        return launches * (self.calibration.elementwise_floor_s + kernel_bytes / self._elementwise_bw)

    def sampling(self, seqs: int) -> float:
        logits = seqs * self.model.vocab_size * 4
        return SAMPLING_KERNELS * self._kernel_latency + SAMPLING_PASSES * logits / (self.gpu.memory_bandwidth * 0.8)

    def host(self, seqs: int) -> float:
        """vLLM's host work for a step scheduling `seqs` sequences (before any overlap with the GPU)."""
        return self._host_base + self._host_per_seq * seqs

    # ---- the ledger's terms ---------------------------------------------------

    def _padded(self, tokens: int) -> int:
        return tokens if "padding" in self.leave_out else self.graphs.padded(tokens)

    def split_padding(self, tokens: int) -> int:
        return self._padded(tokens)

    def _token_terms(self, tokens: int) -> tuple[tuple[Term, ...], float]:
        """The terms priced by the step's token count (GEMMs, elementwise kernels, all-reduces), at the
        padded count a CUDA graph runs; cached by `tokens`, and by what they depend on (the padded count
        and whether a graph runs it), which the token counts a graph pads to the same size share."""
        run, captured = self._padded(tokens), self.graphs.captured(tokens)
        value = self._run_cache.get((run, captured))
        if value is None:
            value = self._run_cache[run, captured] = self._run_terms(run, captured)
        self._token_cache[tokens] = value
        return value

    def _run_terms(self, run: int, captured: bool, sm_share: float = 1.0) -> tuple[tuple[Term, ...], float]:
        """_token_terms' terms for `run` tokens (padded), run by a CUDA graph or not."""
        layers = self.model.num_layers
        terms = [Term(f"{name} GEMM", "gemm", count * self._shared_gemm(run, n, k, shares), "table",
                      f"{self.system} {self._tables_read(shares)}, m={run} n={n} k={k}, x{count} layers", count)
                 for name, (n, k), count, shares in self._gemms]
        if self._moe is not None:
            terms += self._moe.terms(run, self.gemm(run, self.model.num_experts, self.model.hidden_size), sm_share)
            self._flag("moe", self._moe.extrapolated)
        if "elementwise" not in self.leave_out:
            for kernel in self._kernels:
                count = kernel.launches(layers)
                terms.append(Term(kernel.name, "elementwise", self.elementwise(kernel.bytes_per_token * run, count),
                                  "roofline", f"{kernel.bytes_per_token * run / 1e3:.1f} KB at "
                                  f"{self._elementwise_bw / 1e12:.2f} TB/s + "
                                  f"{self.calibration.elementwise_floor_s * 1e6:.1f} us floor per kernel"
                                  + (f", x{count} layers" if count > 1 else ""), count))
        if self._hyper is not None:
            term, extrapolated = self._hyper.term(run)
            terms.append(term)
            self._flag("mhc", extrapolated)
        if self._allreduce is not None:
            count = self.model.tp_allreduces
            per_layer = ("1 per block" if self.model.ffn_layers else
                         "3 per layer (attention, MLP, experts)" if count > 2 * layers + 1 else "2 per layer")
            terms.append(Term("all-reduce", "collective", count * self.allreduce(run, captured), "table",
                              f"{self.system} {self.allreduce_backend_for(run)} "
                              f"({'CUDA graph' if captured else 'eager'}), "
                              f"{run} x {self.model.hidden_size} values, {per_layer} + the embedding's"
                              + (f"; {self._span.describe()}" if self._span is not None else ""), count))
            if self.model.qk_norm == "across heads":
                terms.append(Term("q/k-norm all-reduce", "collective", layers * self.qk_norm_allreduce(run, captured),
                                  "table", f"{self.system} {self.allreduce_backend} of {run} x 2 fp32 variances, "
                                  f"x{layers} layers", layers))
        return tuple(terms), sum(t.seconds for t in terms)

    def _seq_terms(self, seqs: int) -> tuple[tuple[Term, ...], float]:
        """The terms priced by the sequences a step samples: LM head, logits all-gather, sampler; cached."""
        n, k = self._head_shape
        head = self._head_format
        read = "gemm" if head is None else self._tables_read(((head, 1.0),))
        terms = [Term("LM head GEMM", "lm_head", self.format_gemm(head, seqs, n, k), "table",
                      f"{self.system} {read}, m={seqs} n={n} k={k}")]
        if self.tp > 1 and "logits_gather" not in self.leave_out and self._nccl is not None:
            terms.append(Term("logits all-gather", "collective", self.logits_gather(seqs), "table",
                              f"{self.system} nccl all-reduce of {seqs} x {self.model.vocab_size} values, halved"
                              + (f", over {self._span.nodes} nodes" if self._span is not None else "")))
        terms.append(Term("sampler", "sampler", self.sampling(seqs), "roofline",
                          f"{SAMPLING_PASSES} passes over {seqs} x {self.model.vocab_size} fp32 logits + "
                          f"{SAMPLING_KERNELS} kernels"))
        value = (tuple(terms), sum(t.seconds for t in terms))
        self._seq_cache[seqs] = value
        return value

    def _prefill_attention(self, s: StepShape) -> float:
        """All layers' context attention. The table times `batch` fresh prompts of one length; a step's
        prompts and chunks are priced as fresh prompts with as many (query, key) pairs per sequence
        (length l with l (l + 1) / 2 pairs), then scaled to the exact pairs. A fresh prompt is its own
        length; a short chunk after a long cached part (the tail of a chunked prompt: 4 tokens after
        8188) costs what a prompt of that much work costs, not its own launch-bound time multiplied by
        its pairs over a 4-token prompt's (which priced such a chunk at 3 s on 8 x H100)."""
        batch = s.prefill_seqs
        if self._sparse is not None:
            return self._sparse_prefill(s)
        if self._compressed is not None:
            return self._compressed_prefill(s)
        if "chunk_attention" in self.leave_out:
            length = (s.prefill_tokens + batch // 2) // batch
        else:
            length = max(1, round((math.sqrt(8 * s.prefill_attn_pairs / batch + 1) - 1) / 2))
        full, sliding = self._ctx_cache.get((batch, length)) or self._context(batch, length)
        # a sliding-window layer's queries see at most the window's keys
        pairs = windowed_prefill_pairs(s, self.model.window) if self.model.sliding_layers else 0
        return (full * s.prefill_attn_pairs + sliding * pairs) / (batch * length * (length + 1) // 2)

    def _sparse_prefill(self, s: StepShape) -> float:
        """All layers' DSA prefill: the module table's (or the roofline's) price of the step's prompts as fresh
        prompts of their mean length, and the indexer's score of the pairs a cached prefix adds."""
        batch = s.prefill_seqs
        length = max(1, round(s.prefill_tokens / batch))
        fresh = batch * length * (length + 1) // 2
        ctx = sum(self._ctx_cache.get((batch, length)) or self._context(batch, length))   # no sliding layers
        return ctx + self.model.indexer_layers * max(0, s.prefill_attn_pairs - fresh) * self._sparse.index_per_pair

    def _compressed_prefill(self, s: StepShape) -> float:
        """All layers' DeepSeek-V4 prefill: the module table at the step's mean prompt length and mean cached
        prefix (a chunk of l tokens after p cached ones has l p + l (l + 1) / 2 pairs)."""
        batch = s.prefill_seqs
        length = max(1, round(s.prefill_tokens / batch))
        prefix = max(0, round((s.prefill_attn_pairs / batch - length * (length + 1) / 2) / length))
        value = self._prefix_cache.get((batch, length, prefix))
        if value is None:
            latency, ext = self._compressed.prefill(batch, length, prefix)
            self._flag("dsv4_context", ext)
            value = self._prefix_cache[batch, length, prefix] = self.model.attention_layers * latency
        return value

    def _context(self, batch: int, length: int) -> tuple[float, float]:
        """(full-attention layers', sliding-window layers') context attention over `batch` fresh prompts of
        `length` tokens, each kind at its own head shape (Gemma 4's full layers read their own table)."""
        one = self.context_attention(batch, length)
        full = one
        if self._full is not None:
            ctx_tree, ctx_fold, _, _, kv, hd = self._full
            full = self._context_at(batch, length, ctx_tree, ctx_fold, kv, hd)
        value = (self.model.full_attention_layers * full, self.model.sliding_layers * one)
        self._ctx_cache[(batch, length)] = value
        return value

    def _linear_attention(self, s: StepShape) -> float:
        """The Gated DeltaNet layers' convolution and recurrent update (planner/cost/gdn.py): decodes, then
        prompt chunks (a decode-only step's is exactly decode_pricer's)."""
        gdn = self._gdn
        value = gdn.decode(s.decode_seqs)
        if s.prefill_tokens:
            value += gdn.prefill(s.prefill_seqs, s.prefill_tokens)
        self._flag("gdn", gdn.extrapolated)
        return value

    def _linear_attention_term(self, s: StepShape) -> Term:
        gdn = self._gdn
        return Term(f"linear attention ({gdn.what})", "attention", self._linear_attention(s), gdn.source,
                    f"{gdn.describe()}, {s.decode_seqs} decoding, {s.prefill_seqs} sequences' {s.prefill_tokens} "
                    f"prompt tokens, x{gdn.layers} layers", gdn.layers)

    def _host_term(self, host: float, gpu: float) -> Term:
        """The host time a step pays on top of its GPU time: all of it in series, what exceeds the GPU's
        time under async scheduling."""
        fitted = "host" not in self.leave_out
        how = (f"{self._host_base * 1e6:.0f} us/step + {self._host_per_seq * 1e6:.1f} us/sequence"
               + (" (fitted)" if fitted else " (our engine's host path)"))
        if not self.async_scheduling:
            return Term("host: schedule, inputs, outputs", "host", host, "fitted" if fitted else "roofline",
                        f"{how}, in series with the GPU")
        exposed = max(0.0, host - gpu)
        return Term("host: schedule, inputs, outputs", "host", exposed, "fitted" if fitted else "roofline",
                    f"{how} = {host * 1e3:.2f} ms, overlapped with the GPU's {gpu * 1e3:.2f} ms (async scheduling)")

    # ---- dual-batch overlap (planner/cost/dbo.py) --------------------------------

    def _dbo_halves(self, tokens: int) -> list[tuple[int, tuple[Term, ...]]]:
        """The two microbatches of a split step of `tokens` tokens: each one's tokens and token terms."""
        captured = self.graphs.captured(tokens)
        halves = []
        for half in DualBatch.halves(self._padded(tokens)):
            value = self._dbo_run_cache.get((half, captured))
            if value is None:       # DeepGEMM on the SMs the communication kernels leave it (planner/cost/dbo.py)
                value = self._dbo_run_cache[half, captured] = self._run_terms(half, captured, self._dbo_sm_share)
            halves.append((half, value[0]))
        return halves

    def _dbo_price(self, tokens: int) -> tuple[float, float]:
        """(compute, all-to-all) seconds of both microbatches' token terms; cached by `tokens`."""
        compute = comm = 0.0
        for _, terms in self._dbo_halves(tokens):
            for term in terms:
                if term.name == DEEPEP_TERM:
                    comm += term.seconds
                else:
                    compute += term.seconds
        value = self._dbo_cache[tokens] = (compute, comm)
        return value

    def _attention_seconds(self, s: StepShape) -> float:
        """The step's attention (prefill, decode, linear), whole: it divides between microbatches with its
        sequences."""
        seconds = 0.0
        if s.prefill_tokens:
            seconds += self._prefill_attention(s)
        if s.decode_seqs:
            seconds += self.decode_attention(s)
        if self._gdn is not None:
            seconds += self._linear_attention(s)
        return seconds

    def _dual_batch_step(self, s: StepShape, tokens: int, seqs: int) -> float:
        """step_time of a step vLLM splits into two microbatches (swap and copy aside)."""
        compute, comm = self._dbo_cache.get(tokens) or self._dbo_price(tokens)
        gpu = DualBatch.overlapped(compute + self._attention_seconds(s), comm, self.model.moe_layers)
        rows = seqs + s.draft_tokens
        gpu += (self._seq_cache.get(rows) or self._seq_terms(rows))[1]
        host = self._host_base + self._host_per_seq * seqs
        return gpu + host if not self.async_scheduling else (gpu if gpu >= host else host)

    def _dual_batch_terms(self, tokens: int) -> list[Term]:
        """Both microbatches' token terms, each name's summed."""
        (first, terms), (second, other) = self._dbo_halves(tokens)
        merged = []
        for one, two in zip(terms, other):
            merged.append(Term(one.name, one.group, one.seconds + two.seconds, one.source,
                               f"2 microbatches ({first} + {second} tokens), the first's: {one.detail}",
                               one.count + two.count))
        return merged

    def _overlap_term(self, s: StepShape, tokens: int) -> Term:
        """The (negative) term of the time the overlap hides: both streams' work less the overlapped layers."""
        compute, comm = self._dbo_cache.get(tokens) or self._dbo_price(tokens)
        work = compute + self._attention_seconds(s)
        layers = self.model.moe_layers
        hidden = work + comm - DualBatch.overlapped(work, comm, layers)
        return Term(DBO_TERM, "collective", -hidden, "schedule",
                    f"compute {work * 1e3:.3f} ms and DeepEP all-to-all {comm * 1e3:.3f} ms of both microbatches "
                    f"on two streams over {layers} MoE layers: max + min / {2 * layers} (planner/cost/dbo.py)")

    # ---- the cost model -----------------------------------------------------

    def step_time(self, s: StepShape) -> float:
        """Seconds for one step: the sum of its ledger's terms. Hot path: a few dict reads once a shape's
        token count and sequence count have been seen."""
        seqs = s.prefill_seqs + s.decode_seqs
        tokens = s.prefill_tokens + s.decode_seqs + s.draft_tokens
        t = 0.0
        if tokens and self._dbo is not None and self._dbo.splits(tokens, seqs, not s.prefill_tokens):
            t = self._dual_batch_step(s, tokens, seqs)
        elif tokens:
            rows = seqs + s.draft_tokens           # logit rows: one per sequence and per draft verified
            gpu = (self._token_cache.get(tokens) or self._token_terms(tokens))[1]
            gpu += (self._seq_cache.get(rows) or self._seq_terms(rows))[1]
            if s.prefill_tokens:
                gpu += self._prefill_attention(s)
            if s.decode_seqs:
                gpu += self.decode_attention(s)
            if self._gdn is not None:
                gpu += self._linear_attention(s)
            host = self._host_base + self._host_per_seq * seqs
            t = gpu + host if not self.async_scheduling else (gpu if gpu >= host else host)
        if s.swap_blocks:
            t += s.swap_blocks * self._swap_per_block
        if s.copy_blocks:
            t += s.copy_blocks * self._copy_per_block
        return t

    def ledger(self, s: StepShape) -> Ledger:
        """Every term of the step `s`, each with its seconds and source; `ledger(s).total == step_time(s)`."""
        tokens, seqs = s.total_tokens, s.batch_size
        terms: list[Term] = []
        split = bool(tokens) and self._dbo is not None and self._dbo.splits(tokens, seqs, not s.prefill_tokens)
        if tokens:
            terms += (self._dual_batch_terms(tokens) if split
                      else (self._token_cache.get(tokens) or self._token_terms(tokens))[0])
            source = "table" if self._latent is None else "roofline"      # MLA: _set_up_latent_attention
            layers = self.model.attention_layers
            if s.prefill_tokens:
                terms.append(Term("attention (prefill)", "attention", self._prefill_attention(s), source,
                                  f"{self.system} {self._tables['context']}, {s.prefill_seqs} sequences, "
                                  f"{s.prefill_tokens} tokens, {s.prefill_attn_pairs} (query, key) pairs, "
                                  f"x{layers} layers", layers))
            if s.decode_seqs:
                terms.append(Term("attention (decode)", "attention", self.decode_attention(s), source,
                                  f"{self.system} {self._tables['generation']}, {s.decode_seqs} sequences, "
                                  f"{s.decode_context} context tokens in all, x{layers} layers", layers))
            if self._gdn is not None:
                terms.append(self._linear_attention_term(s))
            if split:
                terms.append(self._overlap_term(s, tokens))
            terms += (self._seq_cache.get(s.logit_rows) or self._seq_terms(s.logit_rows))[0]
            terms.append(self._host_term(self.host(seqs), sum(t.seconds for t in terms)))
        if s.swap_blocks:
            terms.append(Term("swap", "memory", s.swap_blocks * self._swap_per_block, "roofline",
                              f"{s.swap_blocks} blocks over the host link"))
        if s.copy_blocks:
            terms.append(Term("copy-on-write", "memory", s.copy_blocks * self._copy_per_block, "roofline",
                              f"{s.copy_blocks} blocks through device memory"))
        return Ledger(self.name, tuple(terms), tokens, self._padded(tokens) if tokens else 0, self._ledger_notes())

    def _ledger_notes(self) -> tuple[str, ...]:
        graphs = f"CUDA graphs up to {self.graphs.largest} tokens (vLLM's capture sizes)"
        host = "async scheduling: the fitted host time hidden behind the GPU's (an upper bound)" \
            if self.async_scheduling else "host time in series with the GPU, as calibrated (vLLM 0.12)"
        left = [f"left out: {', '.join(sorted(self.leave_out))}"] if self.leave_out else []
        dbo = [self._dbo.describe()] if self._dbo is not None else []
        return (graphs, host, *dbo, *left, *self.notes)

    def breakdown(self, s: StepShape) -> dict[str, float]:
        """step_time by group (seconds: gemm, attention, elementwise, collective, lm_head, sampler, host,
        memory, ...), for reports and tests; the parts sum to step_time."""
        return self.ledger(s).by_group()

    def describe(self) -> dict:
        """What this model rests on, for a result file's 'cost model' section."""
        src = tables.source()
        return {
            "name": self.name, "source": "measured", "model": self.model.name, "gpu": self.gpu.name, "tp": self.tp,
            "data": {"package": src["package"], "package_version": src["package_version"], "license": src["license"],
                     "system": self.system, "framework": "vllm", "versions": dict(self._versions),
                     "kernels": dict(self._table_kernels)},
            "memory_bandwidth_scale": self._bw_ratio,
            "attention_batch_fold": {"context": self._ctx_fold, "generation": self._gen_fold},
            "allreduce": getattr(self, "allreduce_backend", None),
            "host_overhead": self.host_source,
            "async_scheduling": self.async_scheduling,
            "cudagraph_max_size": self.graphs.largest,
            "calibration": self.calibration.source,
            "left_out": sorted(self.leave_out),
            "extrapolated": sorted(self.extrapolated),
            "weight_format": self.weight_format.as_dict() if self.weight_format is not None else None,
            "kv_cache_dtype": self.kv_cache_dtype, "tables": dict(self._tables), "notes": list(self.notes),
        }
