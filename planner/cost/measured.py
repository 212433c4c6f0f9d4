"""Measured cost model: step time summed from NVIDIA's per-operation vLLM latencies on each GPU.

For GPUs nobody here can run. A step is priced as the engine runs it
(one forward pass over every scheduled token), per layer:

  qkv GEMM        m = all tokens of the step, n = this GPU's q+k+v width, k = hidden
  attention       prefill tokens: context attention (batch = prefill sequences at
                  their mean new length, scaled by the step's true (query, key)
                  pairs, which covers cached context and chunks); decode sequences:
                  generation attention, each at its own context length (below)
  o projection    n = hidden, k = this GPU's q width
  MLP GEMMs       gate+up and down (gated MLP) or fc1 and fc2
  all-reduce x 2  under tensor parallelism: vLLM's custom all-reduce (CUDA-graph
                  variant up to 512 tokens, vLLM's capture limit, eager above),
                  or NCCL where vLLM would not use it (PCIe GPUs beyond 2) or no
                  table exists

then once per step: the embedding all-reduce (TP), the LM-head GEMM over the
sampled sequences, sampling, and the engine's host overhead. Swap and
copy-on-write traffic are priced from bandwidths, as in the roofline model.

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

Lookups are cached by their integer arguments, so step_time is a few dict
reads once the simulation has seen a shape.
"""
from __future__ import annotations


from planner.catalog import GpuSpec, ModelSpec, list_gpus, resolve_gpu, resolve_model
from planner.catalog.quantization import WeightFormat, gemm_path
from planner.cost import tables
from planner.cost.calibrated import _Curve
from planner.cost.shape import StepShape, context_bucket
from planner.errors import PlannerError
from planner.profile.schema import load_profile, profiles_dir

# vLLM captures CUDA graphs for batches up to 512 tokens by default; larger
# steps run eagerly, and so does their all-reduce.
CUDA_GRAPH_MAX_TOKENS = 512

# Host time per step (schedule, build the inputs, record the outputs) when no
# profile of our engine on this GPU exists: our engine's own host path as
# `planner profile` measured it (profiles/cpu/opt-125m.json, sched_decode,
# linear fit: 19.3 us at 1 sequence, 582 us at 256), i.e. 17.1 us + 2.21 us per
# sequence. The host path does not touch the GPU, so it carries over.
HOST_BASE_S = 17.1e-6
HOST_PER_SEQ_S = 2.21e-6
HOST_SOURCE = "our engine's host path, profiles/cpu/opt-125m.json (17.1 us + 2.21 us/seq)"

# Sampling has no measured table: price it as memory traffic over the fp32
# logits (written once, read by softmax and by the argmax/sample: 3 passes) at
# the spec sheet's effective bandwidth, plus one fixed kernel latency per
# kernel (the spec sheet's mem_empirical_constant_latency).
SAMPLING_PASSES = 3
SAMPLING_KERNELS = 4


# The roofline model's planning efficiency for tensor-core math (planner/cost/roofline.py RooflineEfficiency),
# for the compute side of a weight-only GEMM.
WEIGHT_ONLY_COMPUTE_EFFICIENCY = 0.6


def gemm_table(system: str, fmt: WeightFormat | None, gpu: GpuSpec) -> tuple[str, float | None, str]:
    """(the table pricing the layers' GEMMs, the weight bytes per element a weight-only kernel reads or
    None, how they are priced). A format that runs natively here (planner/catalog/quantization.py
    gemm_path) uses its own measured table; a weight-only one (FP8 on Ampere, NVFP4 before Blackwell,
    AWQ, GPTQ) the bf16 table with the weights read at the format's bytes; MXFP4 leaves dense layers 16-bit."""
    if fmt is None or not fmt.quantizes_linear:
        return "gemm", None, "bf16 GEMMs"
    precision = gemm_path(fmt, gpu).precision
    if precision == "fp8":
        for table in (("gemm_fp8_block", "gemm_fp8") if fmt.scheme == "fp8-block" else ("gemm_fp8",)):
            if tables.has_table(system, table):
                return table, None, "fp8 GEMMs"
    if precision == "fp4" and tables.has_table(system, "gemm_nvfp4"):
        return "gemm_nvfp4", None, "nvfp4 GEMMs"
    return "gemm", fmt.bytes_per_weight(), f"weight-only GEMMs (bf16 table, {fmt.bits}-bit weights)"


def covered_gpus() -> list[str]:
    """Catalog GPUs that have measured vLLM tables."""
    return [g.name for g in list_gpus() if g.measured_system]


def _host_profile(gpu_name: str):
    """Host and sampling curves from a `planner profile` of our engine on this GPU, if one exists."""
    root = profiles_dir() / gpu_name
    if not root.is_dir():
        return None
    for path in sorted(root.glob("*.json")):
        try:
            fit = load_profile(path).fit
            return (_Curve(fit["sched_prefill"].curve), _Curve(fit["sched_decode"].curve),
                    _Curve(fit["sample_greedy"].curve), str(path))
        except (PlannerError, KeyError, OSError):
            continue
    return None


class MeasuredCostModel:
    """Step time for `model` on `tp` x `gpu` from measured vLLM op latencies."""

    prices_each_context = True   # decode attention from each sequence's own context (StepShape.decode_histogram)

    def __init__(self, model: ModelSpec | str, gpu: GpuSpec | str, tp: int = 1, dtype_bytes: int = 2,
                 block_size: int = 16, weight_format: WeightFormat | None = None,
                 kv_cache_dtype: str = "auto") -> None:
        model, gpu = resolve_model(model), resolve_gpu(gpu)
        system = gpu.measured_system
        if system is None:
            raise PlannerError(f"no measured vLLM data for GPU {gpu.name}; covered: {', '.join(covered_gpus())}")
        if dtype_bytes != 2:
            raise PlannerError(f"measured vLLM tables are bf16 (2 bytes per value), not {dtype_bytes}-byte weights")
        self.model, self.gpu, self.tp, self.system = model, gpu, tp, system
        self.weight_format, self.kv_cache_dtype = weight_format, kv_cache_dtype
        info = tables.source()["systems"][system]
        spec = info["spec"]
        self._versions = {name: t["version"] for name, t in info["tables"].items()}
        self._kernels = {name: t["kernel"] for name, t in info["tables"].items() if "kernel" in t}
        self._bw_eff = spec["mem_bw"] * (spec.get("mem_bw_empirical_scaling_factor") or 1.0)
        self._bw_ratio = spec["mem_bw"] / gpu.memory_bandwidth     # > 1: this GPU's memory is slower
        self._kernel_latency = spec.get("mem_empirical_constant_latency") or 0.0
        # weight-only GEMMs (Marlin) run 16-bit math: the spec sheet's bf16 peak at the roofline's efficiency
        self._flops_eff = spec["bfloat16_tc_flops"] * WEIGHT_ONLY_COMPUTE_EFFICIENCY
        self.extrapolated: set[str] = set()
        self.notes: list[str] = []

        heads, kv, hd = model.num_heads // tp, model.kv_heads_per_gpu(tp), model.head_size
        self._heads, self._kv, self._hd = heads, kv, hd
        self._set_up_gemms(model, tp, weight_format)
        self._set_up_attention(kv_cache_dtype)
        self._allreduce = self._allreduce_curves(tp) if tp > 1 else None

        kv_bytes_per_token = 2 * model.num_layers * kv * hd * self._kv_bytes
        self._swap_per_block = kv_bytes_per_token * block_size / gpu.host_link_bandwidth
        self._copy_per_block = 2 * kv_bytes_per_token * block_size / (gpu.memory_bandwidth * 0.8)

        host = _host_profile(gpu.name)
        if host is None:
            self._host_prefill = self._host_decode = self._sample = None
            self.host_source = HOST_SOURCE
        else:
            self._host_prefill, self._host_decode, self._sample, self.host_source = host

        self._linear_cache: dict[int, float] = {}
        self._per_seq_cache: dict[tuple[int, bool], float] = {}
        self._ctx_cache: dict[tuple[int, int], float] = {}
        self._gen_curves: dict[int, tuple] = {}
        # the context grid of generation attention, in powers of two: 1 .. 2**max_bucket
        self._gen_max_bucket = max(max(row) for row in self._gen_tree.values()).bit_length()
        self._name = self._make_name()

    def _make_name(self) -> str:
        used = {"gemm", self._tables["layer_gemm"], self._tables["context"], self._tables["generation"]}
        if getattr(self, "allreduce_backend", None) == "vllm custom all-reduce":
            used.add("custom_allreduce")
        versions = "/".join(sorted({self._versions[k] for k in used}))
        scaled = f", memory-bound parts x{self._bw_ratio:.2f}" if abs(self._bw_ratio - 1) > 1e-3 else ""
        formats = f", {self.weight_format.method}: {self._gemm_how}" if self.weight_format is not None else ""
        if self.kv_cache_dtype != "auto":
            formats += ", fp8 KV" + ("" if self._tables["generation"].endswith("_fp8kv") else " priced as bf16 KV")
        where = self.gpu.name if self.tp == 1 else f"{self.tp}x{self.gpu.name}"
        return (f"measured({where}: {self.system} vllm {versions}, "
                f"aiconfigurator-core {tables.source()['package_version']}{scaled}{formats})")

    def _set_up_gemms(self, model: ModelSpec, tp: int, weight_format: WeightFormat | None) -> None:
        """The layers' GEMM shapes and the tables that price them: the format's own table where the
        system measured it, else the bf16 table read as a weight-only kernel (`_weight_only`)."""
        heads, kv, hd, h = self._heads, self._kv, self._hd, model.hidden_size
        inter = model.intermediate_size // tp
        mlp_up = inter if model.is_gpt_like else 2 * inter
        self._gemm_shapes = [((heads + 2 * kv) * hd, h), (h, heads * hd), (mlp_up, h), (h, inter)]
        self._head_shape = (model.vocab_size // tp, h)
        self._gemm_tree = tables.monotone(tables.build_tree(tables.load_rows(self.system, "gemm"), ("n", "k", "m")), 3)
        self._gemm_max_n = max(self._gemm_tree)
        table, self._weight_only_bytes, self._gemm_how = gemm_table(self.system, weight_format, self.gpu)
        if table == "gemm_fp8" and weight_format.scheme == "fp8-block":
            self.notes.append(f"{self.system} has no full block-scaled FP8 GEMM table: priced with per-tensor FP8")
        self._tables = {"layer_gemm": table}
        self._layer_tree = self._gemm_tree if table == "gemm" else tables.monotone(
            tables.build_tree(tables.load_rows(self.system, table), ("n", "k", "m")), 3)
        self._layer_max_n = max(self._layer_tree)

    def _set_up_attention(self, kv_cache_dtype: str) -> None:
        """The attention tables of the KV cache's dtype (bf16 ones where the system has no FP8-KV table)."""
        fp8 = kv_cache_dtype == "fp8"
        self._kv_bytes = 1 if fp8 else 2
        heads, kv, hd = self._heads, self._kv, self._hd
        if fp8 and tables.has_table(self.system, "generation_attention_fp8kv"):
            try:
                self._ctx_tree, self._ctx_fold = self._attention_tree("context_attention_fp8kv", "isl", heads, kv, hd)
                self._gen_tree, self._gen_fold = self._attention_tree("generation_attention_fp8kv", "step",
                                                                      heads, kv, hd)
                self._tables.update(context="context_attention_fp8kv", generation="generation_attention_fp8kv")
                return
            except PlannerError as exc:
                self.notes.append(f"FP8-KV attention priced from the bf16-KV tables: {exc}")
        elif fp8:
            self.notes.append(f"{self.system} has no FP8-KV attention table: attention priced from the bf16-KV tables")
        self._tables.update(context="context_attention", generation="generation_attention")
        self._ctx_tree, self._ctx_fold = self._attention_tree("context_attention", "isl", heads, kv, hd)
        self._gen_tree, self._gen_fold = self._attention_tree("generation_attention", "step", heads, kv, hd)

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

    def _allreduce_curves(self, tp: int) -> dict[str, tables.Curve]:
        rows = tables.load_rows(self.system, "allreduce")
        by_backend: dict[str, dict] = {}
        for r in rows:
            if r["num_gpus"] == tp:
                by_backend.setdefault(r["backend"], {})[r["message_size"]] = r["latency"]
        by_backend = {name: tables.monotone(points, 1) for name, points in by_backend.items()}
        # vLLM's custom all-reduce needs NVLink beyond two GPUs; PCIe boxes fall back to NCCL.
        custom_ok = self.gpu.interconnect.startswith("nvlink") or tp <= 2
        if custom_ok and "custom_graph" in by_backend and "custom_eager" in by_backend:
            self.allreduce_backend = "vllm custom all-reduce"
            return {"graph": tables.Curve.of(by_backend["custom_graph"]),
                    "eager": tables.Curve.of(by_backend["custom_eager"])}
        if "nccl" in by_backend:
            self.allreduce_backend = "nccl"
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
        """One of a layer's GEMMs in the weights' format: its own table, or the 16-bit one read as a
        weight-only kernel."""
        if self._layer_tree is self._gemm_tree:
            latency = self.gemm(m, n, k)
            return latency if self._weight_only_bytes is None else self._weight_only(latency, m, n, k)
        blocks = -(-n // self._layer_max_n)
        latency, ext = tables.interpolate(self._layer_tree, (n / blocks, k, m))
        self._flag(self._tables["layer_gemm"], ext)
        return self._slower_memory(blocks * latency, 2.0 * (m * k + m * n) + self.weight_format.matrix_bytes(n, k))

    def _weight_only(self, latency: float, m: int, n: int, k: int) -> float:
        """A weight-only kernel (Marlin: the weights widened to 16 bits in registers, 16-bit math) priced as
        the measured 16-bit GEMM less the time its smaller weights save: the roofline time with the
        16-bit weights minus the one with the format's (equal when compute-bound), never below the
        measured time scaled by the same ratio. Marlin's own dequantization cost is not modelled."""
        compute = 2.0 * m * n * k / self._flops_eff
        before = max(compute, 2.0 * (m * k + k * n + m * n) / self._bw_eff)
        after = max(compute, (2.0 * (m * k + m * n) + self._weight_only_bytes * k * n) / self._bw_eff)
        return max(latency - (before - after), latency * after / before)

    def context_attention(self, batch: int, length: int) -> float:
        latency, ext = tables.interpolate(self._ctx_tree, (batch * self._ctx_fold, length))
        self._flag(self._tables["context"], ext)
        nbytes = batch * length * (2.0 * 2 * self._heads + self._kv_bytes * 2 * self._kv) * self._hd
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
        points = []
        for j in range(self._gen_max_bucket + 1):
            context = max(1 << j, 2)      # the table starts at one cached token: context 1 costs as 2
            # the table's `step` counts the tokens already cached; the new token is the one more
            latency, ext = tables.interpolate(self._gen_tree, (batch * self._gen_fold, context - 1))
            nbytes = self._kv_bytes * batch * context * 2.0 * self._kv * self._hd
            points.append((self._slower_memory(latency, nbytes), ext))
        curve = [(points[0][0], 0.0, points[0][1])]           # bucket 0: context 1
        for j in range(1, len(points)):
            (y0, e0), (y1, e1) = points[j - 1], points[j]
            slope = (y1 - y0) / (1 << (j - 1))
            curve.append((y0 - slope * (1 << (j - 1)), slope, e0 or e1))
        a, slope, _ = curve[-1]
        curve += [(a, slope, True)] * (64 - len(curve))       # longer contexts: the last line, extended
        curve = tuple(curve)
        self._gen_curves[batch] = curve
        return curve

    def decode_attention(self, s: StepShape) -> float:
        """All layers' decode attention: (1/b) * sum_i T(b, c_i), one term per context bucket."""
        b = s.decode_seqs
        curve = self._gen_curves.get(b) or self._gen_curve(b)
        hist = s.decode_histogram
        if hist:
            total = 0.0
            for i in range(0, len(hist), 3):
                a, slope, ext = curve[hist[i]]
                total += hist[i + 1] * a + slope * hist[i + 2]
                if ext:
                    self.extrapolated.add(self._tables["generation"])
            return self.model.num_layers * total / b
        # no histogram: every sequence at the mean context
        a, slope, ext = curve[context_bucket(-(-s.decode_context // b))]
        if ext:
            self.extrapolated.add(self._tables["generation"])
        return self.model.num_layers * (a + slope * s.decode_context / b)

    def allreduce(self, tokens: int) -> float:
        if self._allreduce is None:
            return 0.0
        curve = self._allreduce["graph" if tokens <= CUDA_GRAPH_MAX_TOKENS else "eager"]
        latency, ext = curve.at(tokens * self.model.hidden_size)
        self._flag("allreduce", ext)
        return latency

    def _linear(self, tokens: int) -> float:
        """Everything per step that scales with the token count: all layers' GEMMs and all-reduces."""
        layer = sum(self.layer_gemm(tokens, n, k) for n, k in self._gemm_shapes) + 2 * self.allreduce(tokens)
        value = self.model.num_layers * layer + self.allreduce(tokens)    # + the vocab-parallel embedding's
        self._linear_cache[tokens] = value
        return value

    def sampling(self, seqs: int) -> float:
        if self._sample is not None:
            return self._sample.at(seqs)
        logits = seqs * self.model.vocab_size * 4
        return SAMPLING_KERNELS * self._kernel_latency + SAMPLING_PASSES * logits / (self.gpu.memory_bandwidth * 0.8)

    def host(self, seqs: int, prefill: bool) -> float:
        curve = self._host_prefill if prefill else self._host_decode
        return curve.at(seqs) if curve is not None else HOST_BASE_S + HOST_PER_SEQ_S * seqs

    def _per_seq(self, seqs: int, prefill: bool) -> float:
        """LM head over the sampled sequences, sampling and host time."""
        value = self.gemm(seqs, *self._head_shape) + self.sampling(seqs) + self.host(seqs, prefill)
        self._per_seq_cache[(seqs, prefill)] = value
        return value

    def _context(self, batch: int, length: int) -> float:
        value = self.model.num_layers * self.context_attention(batch, length)
        self._ctx_cache[(batch, length)] = value
        return value

    # ---- the cost model -----------------------------------------------------

    def step_time(self, s: StepShape) -> float:
        """Seconds for one step. Hot path: a handful of dict lookups once a shape has been seen."""
        tokens = s.prefill_tokens + s.decode_seqs
        t = 0.0
        if tokens:
            t = self._linear_cache.get(tokens) or self._linear(tokens)
            seqs = s.prefill_seqs + s.decode_seqs
            prefill = s.prefill_tokens > 0
            t += self._per_seq_cache.get((seqs, prefill)) or self._per_seq(seqs, prefill)
            if prefill:
                batch = s.prefill_seqs
                length = (s.prefill_tokens + batch // 2) // batch
                ctx = self._ctx_cache.get((batch, length)) or self._context(batch, length)
                # the table prices `batch` fresh prompts of `length`; scale to the step's true pairs
                t += ctx * s.prefill_attn_pairs / (batch * length * (length + 1) // 2)
            if s.decode_seqs:
                t += self.decode_attention(s)
        if s.swap_blocks:
            t += s.swap_blocks * self._swap_per_block
        if s.copy_blocks:
            t += s.copy_blocks * self._copy_per_block
        return t

    def breakdown(self, s: StepShape) -> dict[str, float]:
        """step_time by part (seconds), for reports and tests; the parts sum to step_time."""
        parts = dict.fromkeys(("gemm", "prefill_attention", "decode_attention", "allreduce", "lm_head",
                               "sampling", "host", "swap", "copy"), 0.0)
        tokens, seqs = s.total_tokens, s.batch_size
        if tokens:
            layers = self.model.num_layers
            parts["gemm"] = layers * sum(self.layer_gemm(tokens, n, k) for n, k in self._gemm_shapes)
            parts["allreduce"] = (2 * layers + 1) * self.allreduce(tokens)
            parts["lm_head"] = self.gemm(seqs, *self._head_shape)
            parts["sampling"] = self.sampling(seqs)
            parts["host"] = self.host(seqs, s.prefill_tokens > 0)
            if s.prefill_tokens:
                b = s.prefill_seqs
                length = (s.prefill_tokens + b // 2) // b
                parts["prefill_attention"] = (layers * self.context_attention(b, length)
                                              * s.prefill_attn_pairs / (b * length * (length + 1) // 2))
            if s.decode_seqs:
                parts["decode_attention"] = self.decode_attention(s)
        parts["swap"] = s.swap_blocks * self._swap_per_block
        parts["copy"] = s.copy_blocks * self._copy_per_block
        return parts

    def describe(self) -> dict:
        """What this model rests on, for a result file's 'cost model' section."""
        src = tables.source()
        return {
            "name": self.name, "source": "measured", "model": self.model.name, "gpu": self.gpu.name, "tp": self.tp,
            "data": {"package": src["package"], "package_version": src["package_version"], "license": src["license"],
                     "system": self.system, "framework": "vllm", "versions": dict(self._versions),
                     "kernels": dict(self._kernels)},
            "memory_bandwidth_scale": self._bw_ratio,
            "attention_batch_fold": {"context": self._ctx_fold, "generation": self._gen_fold},
            "allreduce": getattr(self, "allreduce_backend", None),
            "host_overhead": self.host_source,
            "extrapolated": sorted(self.extrapolated),
            "weight_format": self.weight_format.as_dict() if self.weight_format is not None else None,
            "kv_cache_dtype": self.kv_cache_dtype, "tables": dict(self._tables), "notes": list(self.notes),
        }
