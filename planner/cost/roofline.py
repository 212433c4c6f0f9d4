"""Roofline cost model: step time from datasheet peaks, for hardware nobody has profiled.

Each part of a step is limited either by arithmetic or by memory traffic, so
it takes max(flops / achievable FLOP/s, bytes / achievable bandwidth); the
parts run one after another, so the step is their sum:

  linear      all transformer-layer matmuls: weights read once per step,
              2 FLOPs per weight per token                      (this GPU's 1/tp shard)
  lm_head     vocab projection of the last token of each sequence only
  prefill     causal attention over prefill (query, key) pairs, 2 (head_size + value head)
              FLOPs per pair per head (QK^T and PV; 4*head_size where V is as wide as K),
              vs. writing the new tokens' K/V into the cache and reading back the cached
              context a prompt continues (a prefix-cache hit, an earlier chunk: a short
              chunk after a long context reads as much as a decode row there)
  decode      attention of one query per sequence: reads the KV of its whole
              context, memory-bound in practice
  allreduce   tensor parallelism: 2 all-reduces per layer (after attention and
              after the MLP) + 1 for the vocab-parallel embedding, ring algorithm,
              plus gathering the logits; each collective also pays a fixed latency
  swap        KV blocks over the host link (each GPU moves its share in parallel)
  copy        copy-on-write block copies, read + write through device memory
  cpu         scheduler, input preparation and sampling on the host: a + b * batch

Mixtures of experts (planner/cost/moe.py): the linear part holds only the attention (and any dense
MLP layers); each MoE layer adds

  router      the gate's matmul over the replica's tokens (replicated, 16-bit)
  experts     max(2 T k 3 H I / (tp x dp) FLOPs, the touched experts' weights): the experts the step's
              tokens (x dp, gathered) touch are read once, E (1 - (1 - k/E)^T) of them under uniform
              routing; under expert parallelism the busiest rank's experts and pairs
  dispatch    dp > 1: the all-gather of the replicas' tokens before the experts and the reduce-scatter
              after them, bytes over the interconnect plus its latency each

Multi-head latent attention (DeepSeek, Kimi-K2; planner/catalog/mla.py): decode reads each key's
latent (kv_lora_rank + qk_rope_head_dim values, whole on every TP rank) and spends
2 (kv_lora + rope) + 2 kv_lora FLOPs per query head on it; prefill spends 2 head_size + 2 v_head_dim
per pair and head; the shared experts are a dense MLP, priced with the linear part.

Sliding-window layers (gpt-oss) read at most the window's keys at decode and attend to at most the
window in prefill (planner/cost/window.py).

DeepSeek-V4 (planner/cost/compressed.py) prices its own attention: each query's window, top-k and compressed
slots, the CSA indexer's scores, the compressors' and hyper-connections' weights and work.

Gated DeltaNet layers (Qwen3-Next, Qwen3.5) attend over no KV cache: their projections are linear
layers, and their convolution and recurrent update are priced per decoding sequence and per prompt
token (planner/cost/gdn.py); attention and its KV traffic cover the other layers only.

Activation traffic (tokens x hidden per layer) is left out: it is small next to
the weights at decode and next to the FLOPs at prefill.

Quantized weights (`weight_format`) are read at their format's bytes (scales
included; planner/catalog/quantization.py) and multiplied at the tensor-core
peak of the precision vLLM runs them in on this GPU: FP8 or FP4 where it has
those units (the catalog's datasheet fp8_flops / fp4_flops), 16-bit where the
kernel is weight-only (Marlin: FP8 on Ampere, NVFP4 before Blackwell, AWQ,
GPTQ). The LM head stays 16-bit. An FP8 KV cache (`kv_cache_dtype="fp8"`)
halves the bytes decode attention reads and prefill writes; attention math
stays at the 16-bit peak.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from planner.cost.all2all import DeepEp
from planner.cost.block_size import decode_attention_factor
from planner.cost.compressed import CompressedPrice
from planner.cost.dbo import SplitsSteps
from planner.cost.mamba import recurrent_price
from planner.cost.moe import MoeParallel, bytes_per_expert, dispatch_bytes, expert_roofline
from planner.cost.nodes import NODE_LINK, NodeSpan
from planner.cost.sparse import SparsePrice
from planner.cost.window import windowed_decode_keys, windowed_prefill_pairs
from planner.catalog import GpuSpec, ModelSpec, resolve_gpu, resolve_model
from planner.catalog.quantization import WeightFormat, gemm_path, peak_flops
from planner.cost.shape import StepShape
from planner.errors import PlannerError


@dataclass(frozen=True, slots=True)
class RooflineEfficiency:
    """Fractions of datasheet peaks that real kernels reach.

    compute 0.6: cuBLAS reaches 70-80 % of tensor-core peak on large fp16 GEMMs,
      less on the skinny and oddly sized ones of a serving batch and in attention
      kernels; 0.6 is the usual planning figure.
    memory 0.8: streaming kernels (weight-bound GEMV-like decode, paged attention
      reads) reach 80-90 % of HBM bandwidth; block tables and partial blocks cost
      a little more.
    interconnect 0.7: NCCL ring all-reduce bus bandwidth is ~70-80 % of NVLink's
      and lower for the small messages of decode steps (the latency term covers
      the rest).
    """

    compute: float = 0.6
    memory: float = 0.8
    interconnect: float = 0.7

    def __post_init__(self) -> None:
        for name in ("compute", "memory", "interconnect"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise PlannerError(f"efficiency.{name} must be in (0, 1], got {value}")


# Host-side time per step. vLLM 0.1/0.2 (the paper's engine) schedules, builds
# input tensors and block tables, and samples in Python: a few milliseconds per
# step, growing with the number of sequences. These are planning guesses, not
# measurements; a calibrated cost model fits them from a profile instead.
CPU_OVERHEAD_BASE_S = 2e-3
CPU_OVERHEAD_PER_SEQ_S = 20e-6


def _kernel_backend(gpu: GpuSpec) -> str:
    return "cpu" if gpu.family == "cpu" else "cuda"


def linear_weights(model: ModelSpec, gpu: GpuSpec, tp: int, dtype_bytes: int,
                   weight_format: WeightFormat | None) -> tuple[float, float, str]:
    """(bytes of one GPU's layer weights, the tensor-core FLOP/s they are multiplied at, that precision);
    a MoE's experts and routers are priced apart (RooflineCostModel.moe_time). Weights the checkpoint keeps
    in 16 bits are multiplied at the 16-bit peak: the FLOP/s returned is the rate of the mix."""
    params = model.linear_params_per_gpu(tp)
    if weight_format is None or not weight_format.quantizes_linear:
        return params * dtype_bytes, gpu.peak_flops(dtype_bytes), "16-bit" if dtype_bytes == 2 else "fp32"
    nbytes = model.linear_bytes_per_gpu(weight_format, tp)
    by_format = model.linear_params_by_format(weight_format, tp)
    seconds_per_flop = sum(p / (peak_flops(f, gpu, dtype_bytes) if f is not None else gpu.peak_flops(2))
                           for f, p in by_format.items())
    precisions = [gemm_path(f, gpu).precision for f in weight_format.formats]
    return nbytes, params / seconds_per_flop, "/".join(dict.fromkeys(precisions))


def _check_args(model: ModelSpec, gpu: GpuSpec, tp: int, moe: MoeParallel, block_size: int, cpu_base: float,
                cpu_per_seq: float) -> None:
    if tp > 1 and gpu.interconnect_bandwidth <= 0:
        raise PlannerError(f"{gpu.name} has no interconnect; tensor parallel size must be 1, got {tp}")
    if model.is_moe and moe.dp > 1 and gpu.interconnect_bandwidth <= 0:
        raise PlannerError(f"{gpu.name} has no interconnect; a MoE's data parallel size must be 1, got {moe.dp}")
    if block_size < 1:
        raise PlannerError(f"block_size must be >= 1, got {block_size}")
    if cpu_base < 0 or cpu_per_seq < 0:
        raise PlannerError("CPU overhead constants must be >= 0")


class RooflineCostModel(SplitsSteps):
    """Step time for `model` on `tp` x `gpu` from peaks, efficiencies and a CPU overhead."""

    prices_each_context = False   # decode attention from the contexts' sum: StepShape.decode_histogram is not read

    def __init__(self, model: ModelSpec | str, gpu: GpuSpec | str, tp: int = 1, dtype_bytes: int = 2,
                 block_size: int = 16, efficiency: RooflineEfficiency = RooflineEfficiency(),
                 cpu_overhead_base: float = CPU_OVERHEAD_BASE_S,
                 cpu_overhead_per_seq: float = CPU_OVERHEAD_PER_SEQ_S, weight_format: WeightFormat | None = None,
                 kv_cache_dtype: str = "auto", moe: MoeParallel | None = None, node_link: str = NODE_LINK) -> None:
        model, gpu = resolve_model(model), resolve_gpu(gpu)
        moe = moe if moe is not None else MoeParallel(tp=tp)
        _check_args(model, gpu, tp, moe, block_size, cpu_overhead_base, cpu_overhead_per_seq)
        self.model, self.gpu, self.tp, self.dtype_bytes = model, gpu, tp, dtype_bytes
        self.block_size, self.efficiency = block_size, efficiency
        self.weight_format, self.kv_cache_dtype = weight_format, kv_cache_dtype
        linear_bytes, linear_peak, self.linear_precision = linear_weights(model, gpu, tp, dtype_bytes, weight_format)
        self.name = self._make_name(moe)

        # Everything below is per GPU; the GPUs of a TP group work in lockstep.
        flops = gpu.peak_flops(dtype_bytes) * efficiency.compute        # achievable FLOP/s
        bw = gpu.memory_bandwidth * efficiency.memory                    # achievable B/s
        hidden, vocab = model.hidden_size, model.vocab_size
        kv_dtype_bytes = 1 if kv_cache_dtype == "fp8" else dtype_bytes
        kv_bytes_per_token = model.kv_cache_bytes_per_token(tp, kv_dtype_bytes)   # a Gated DeltaNet layer: none
        # a MoE's routers and experts are priced apart (moe_time): here only what every token multiplies
        linear_params = model.linear_params_per_gpu(tp)
        head_params = vocab * hidden / tp

        self._linear_weights = linear_bytes / bw                           # s, once per step
        self._linear_per_token = 2 * linear_params / (linear_peak * efficiency.compute)   # s per token
        head = weight_format.head if weight_format is not None else None   # a mixed checkpoint's quantized head
        self._head_weights = (head_params * dtype_bytes if head is None
                              else head.matrix_bytes(vocab, hidden) / tp) / bw
        self._head_per_seq = 2 * head_params / (flops if head is None else peak_flops(head, gpu) * efficiency.compute)
        self._prefill_kv_write = kv_bytes_per_token / bw                   # per new token
        # Block size changes paged-attention kernel speed (measured: planner/cost/block_size.py).
        self.block_size_factor = decode_attention_factor(block_size, backend=_kernel_backend(gpu))
        self._set_up_attention(model, tp, kv_dtype_bytes, bw, flops)
        self._prefill_per_query = self._sparse_per_query = 0.0   # a DSA model's latent attention per query
        if model.sparse_indexer is not None:
            self._set_up_sparse(model, gpu, tp, kv_dtype_bytes, bw, flops)
        self._compressed = None           # DeepSeek-V4's attention, priced whole (planner/cost/compressed.py)
        if model.compressed_attention is not None:
            self._compressed = CompressedPrice.of(model, gpu, tp, bw, flops, gpu.fp8_flops * efficiency.compute)
            self._decode_per_key = self._prefill_per_pair = self._prefill_kv_write = self._prefill_kv_read = 0.0
        self._set_up_moe(model, gpu, moe, dtype_bytes, weight_format, node_link)
        self._gdn = recurrent_price(model, gpu, tp, dtype_bytes, None, efficiency.compute, efficiency.memory)

        if tp > 1:
            ic = gpu.interconnect_bandwidth * efficiency.interconnect
            ring = 2 * (tp - 1) / tp                                       # ring all-reduce traffic factor
            collectives = model.tp_allreduces                 # each block's output, and the embedding
            # a group over several nodes: the slower of NVLink and the NICs, and NCCL's network latency
            span = NodeSpan.of(tp, tp, node_link, gpu.node_gpus)
            latency = gpu.interconnect_latency + (span.extra_latency() if span is not None else 0.0)
            self._allreduce_fixed = (collectives + 1) * latency   # +1: logits gather
            per_token = ring * hidden * dtype_bytes / ic
            per_seq = (tp - 1) / tp * vocab * dtype_bytes / ic
            if span is not None:
                per_token = max(per_token, span.nic_seconds(hidden * dtype_bytes))
                per_seq = max(per_seq, span.nic_seconds(vocab * dtype_bytes) / 2)   # an all-gather: half
            self._allreduce_per_token = collectives * per_token
            self._gather_per_seq = per_seq
        else:
            self._allreduce_fixed = self._allreduce_per_token = self._gather_per_seq = 0.0

        block_bytes = kv_bytes_per_token * block_size
        self._swap_per_block = block_bytes / gpu.host_link_bandwidth      # already an effective rate
        self._copy_per_block = 2 * block_bytes / bw                        # read + write
        self._cpu_base = cpu_overhead_base
        self._cpu_per_seq = cpu_overhead_per_seq

    def _make_name(self, moe: MoeParallel) -> str:
        fmt, tp, gpu = self.weight_format, self.tp, self.gpu
        formats = ([f"{fmt.method} weights, {self.linear_precision} math"] if fmt else []) + \
                  (["fp8 KV"] if self.kv_cache_dtype == "fp8" else [])
        if self.model.is_moe:
            formats.append(f"dp{moe.dp} ep{moe.ep}" + (f", moe skew {moe.skew:g}" if moe.skew else ""))
            formats += [moe.all2all] if moe.deepep else []
        where = gpu.name if tp == 1 else f"{tp}x{gpu.name}"
        return f"roofline({where}{''.join(', ' + f for f in formats)})"

    def _set_up_sparse(self, model: ModelSpec, gpu: GpuSpec, tp: int, kv_dtype_bytes: int, bw: float,
                       flops: float) -> None:
        """DeepSeek Sparse Attention (planner/cost/sparse.py): the causal pairs and the decode keys are the
        indexer's to score (on the layers that run one); latent attention costs each query index_topk keys,
        whatever its context."""
        layers, indexed = model.attention_layers, model.indexer_layers
        price = SparsePrice.of(model, gpu, tp, kv_dtype_bytes, bw, flops, gpu.fp8_flops * self.efficiency.compute)
        self._prefill_per_pair = indexed * price.index_per_pair
        self._decode_per_key = indexed * price.index_per_key
        self._prefill_per_query = layers * price.prefill_per_query
        self._sparse_per_query = layers * price.decode_per_query

    def _set_up_attention(self, model: ModelSpec, tp: int, kv_dtype_bytes: int, bw: float, flops: float) -> None:
        """QK^T and PV of this GPU's heads (MLA: planner/catalog/mla.py) and their K and V read, per key and per
        prefill pair: the full-attention layers' (every key) and the sliding-window ones' (the window's) apart,
        each kind at its own head shape (Gemma 4's differ: ModelSpec.attention_kinds)."""
        self._window = model.window
        self.prices_each_context = bool(self._window)      # the windowed keys come from the histogram

        def prices(layers: int, spec: ModelSpec) -> tuple[float, float]:
            per_key = self.block_size_factor * max(layers * spec.kv_cache_bytes(tp, kv_dtype_bytes) / bw,
                                                   spec.attention_flops_per_key // tp * layers / flops)
            return per_key, spec.prefill_flops_per_pair // tp * layers / flops

        self._decode_per_key, self._prefill_per_pair = prices(model.full_attention_layers, model.full_layer_spec)
        self._slide_per_key, self._slide_per_pair = prices(model.sliding_layers, model)
        # A prompt continuing a cached context reads that context's keys and values back, as a decode row
        # does: on the full-attention layers (a sliding layer's window is the lesser part), per cached token.
        self._prefill_kv_read = model.full_attention_layers * model.full_layer_spec.kv_cache_bytes(
            tp, kv_dtype_bytes) / bw

    def _set_up_moe(self, model: ModelSpec, gpu: GpuSpec, par: MoeParallel, dtype_bytes: int,
                    weight_format: WeightFormat | None, node_link: str = NODE_LINK) -> None:
        """Constants of the MoE layers' price (planner/cost/moe.py); None for a dense model."""
        self._moe, self._par, self._moe_cache, self._dbo = None, par, {}, None
        if not model.is_moe:
            return
        self._moe = model
        eff = self.efficiency
        experts = weight_format.experts if weight_format is not None else None
        self._expert_flops_rate = peak_flops(experts, gpu, dtype_bytes) * eff.compute
        self._flops16 = gpu.peak_flops(dtype_bytes) * eff.compute
        self._bw = gpu.memory_bandwidth * eff.memory
        self._expert_bytes = bytes_per_expert(model, weight_format, dtype_bytes)
        self._ic = gpu.interconnect_bandwidth * eff.interconnect
        self._dtype_bytes = dtype_bytes
        self._dispatch_span = NodeSpan.of(par.dp, par.gpus, node_link, gpu.node_gpus) if par.dp > 1 else None
        self._deepep = DeepEp.of(model, par, gpu, weight_format, dtype_bytes, node_link)
        self._dbo = par.dual_batch            # vLLM's dual-batch overlap (planner/cost/dbo.py)

    def moe_parts(self, tokens: int) -> dict[str, float]:
        """All MoE layers' router, experts and dispatch seconds when each dp replica runs `tokens` tokens."""
        model, par = self._moe, self._par
        experts, work = expert_roofline(model, par, tokens, self._expert_flops_rate, self._bw, self._expert_bytes)
        router_weights = model.hidden_size * model.num_experts
        router = max(2.0 * tokens * router_weights / self._flops16, router_weights * self._dtype_bytes / self._bw)
        dispatch = 0.0
        if self._deepep is not None:
            dispatch = self._deepep.seconds(tokens)
        elif par.dp > 1:
            one_way = self.gpu.interconnect_latency + dispatch_bytes(model, par, tokens, self._dtype_bytes) / self._ic
            span = self._dispatch_span
            if span is not None:        # an all-gather's ring moves half an all-reduce's bytes
                gathered = par.dp * tokens * model.hidden_size * self._dtype_bytes
                one_way = max(one_way, span.nic_seconds(gathered) / 2) + span.extra_latency()
            dispatch = 2 * one_way
        layers = model.moe_layers
        return {"router": layers * router, "experts": layers * experts, "dispatch": layers * dispatch,
                "experts_touched": work.touched}

    def moe_time(self, tokens: int) -> float:
        parts = self.moe_parts(tokens)
        value = parts["router"] + parts["experts"] + parts["dispatch"]
        self._moe_cache[tokens] = value
        return value

    def step_time(self, s: StepShape) -> float:
        """Seconds for one step. Hot path: plain float arithmetic on precomputed constants."""
        seqs = s.prefill_seqs + s.decode_seqs
        rows = seqs + s.draft_tokens                  # logit rows: a draft verified is one more
        tokens = s.prefill_tokens + s.decode_seqs + s.draft_tokens
        if tokens and self._dbo is not None and self._dbo.splits(tokens, seqs, not s.prefill_tokens):
            parts = self.breakdown(s)          # two microbatches: breakdown writes the split out
            del parts["bound"]
            return sum(parts.values())
        if tokens:
            t = tokens * self._linear_per_token
            if t < self._linear_weights:
                t = self._linear_weights
            head = rows * self._head_per_seq
            t += head if head > self._head_weights else self._head_weights
            if s.prefill_tokens:
                pairs = s.prefill_attn_pairs * self._prefill_per_pair
                if self._window:
                    pairs += windowed_prefill_pairs(s, self._window) * self._slide_per_pair
                moved = s.prefill_tokens * self._prefill_kv_write + s.prefill_context * self._prefill_kv_read
                t += pairs if pairs > moved else moved
                if self._sparse_per_query:
                    t += s.prefill_tokens * self._prefill_per_query
            t += s.decode_context * self._decode_per_key + s.decode_seqs * self._sparse_per_query
            if self._window and s.decode_seqs:
                t += windowed_decode_keys(s, self._window) * self._slide_per_key
            if self._moe is not None:
                t += self._moe_cache.get(tokens) or self.moe_time(tokens)
            if self._gdn is not None:
                t += self._gdn.decode(s.decode_seqs) + (self._gdn.prefill(s.prefill_seqs, s.prefill_tokens)
                                                        if s.prefill_tokens else 0.0)
            if self._compressed is not None:
                c = self._compressed
                t += c.decode(s) + c.prefill(s) + c.tokens(tokens)
            if self.tp > 1:
                t += self._allreduce_fixed + tokens * self._allreduce_per_token + rows * self._gather_per_seq
        elif s.swap_blocks or s.copy_blocks:
            t = 0.0
        else:
            return 0.0
        return (t + s.swap_blocks * self._swap_per_block + s.copy_blocks * self._copy_per_block
                + self._cpu_base + seqs * self._cpu_per_seq)

    def breakdown(self, s: StepShape) -> dict[str, float]:
        """step_time split by component (seconds), each with its bound; for reports and tests.

        Written out plainly rather than shared with step_time so the hot path stays
        inline; tests hold the two equal.
        """
        parts = {k: 0.0 for k in ("linear", "moe", "lm_head", "prefill_attention", "decode_attention",
                                  "linear_attention", "compressors", "allreduce", "dual_batch_overlap", "swap",
                                  "copy", "cpu")}
        bound: dict[str, str] = {}
        if s.is_empty:
            return {**parts, "bound": bound}
        tokens, seqs, rows = s.total_tokens, s.batch_size, s.logit_rows
        if tokens:
            rooflines = [("linear", tokens * self._linear_per_token, self._linear_weights),
                         ("lm_head", rows * self._head_per_seq, self._head_weights)]
            if s.prefill_tokens:
                slide = windowed_prefill_pairs(s, self._window) * self._slide_per_pair if self._window else 0.0
                moved = s.prefill_tokens * self._prefill_kv_write + s.prefill_context * self._prefill_kv_read
                rooflines.append(("prefill_attention", s.prefill_attn_pairs * self._prefill_per_pair + slide, moved))
            for name, compute, memory in rooflines:
                parts[name] = max(compute, memory)
                bound[name] = "compute" if compute > memory else "memory"
            if self._sparse_per_query:     # DSA: latent attention over index_topk keys per query
                parts["prefill_attention"] += s.prefill_tokens * self._prefill_per_query
            parts["decode_attention"] = s.decode_context * self._decode_per_key + s.decode_seqs * self._sparse_per_query + (
                windowed_decode_keys(s, self._window) * self._slide_per_key if self._window and s.decode_seqs else 0.0)
            if self._moe is not None:
                parts["moe"] = self.moe_time(tokens)
            if self._gdn is not None:
                parts["linear_attention"] = self._gdn.decode(s.decode_seqs) + (
                    self._gdn.prefill(s.prefill_seqs, s.prefill_tokens) if s.prefill_tokens else 0.0)
            if self._compressed is not None:     # DeepSeek-V4: attention, then compressors and hyper-connections
                parts["prefill_attention"] += self._compressed.prefill(s)
                parts["decode_attention"] += self._compressed.decode(s)
                parts["compressors"] = self._compressed.tokens(tokens)
            if self.tp > 1:
                parts["allreduce"] = (self._allreduce_fixed + tokens * self._allreduce_per_token
                                      + rows * self._gather_per_seq)
            if self._dbo is not None and self._dbo.splits(tokens, seqs, not s.prefill_tokens):
                self._split(parts, tokens, rows)
        parts["swap"] = s.swap_blocks * self._swap_per_block
        parts["copy"] = s.copy_blocks * self._copy_per_block
        parts["cpu"] = self._cpu_base + seqs * self._cpu_per_seq
        return {**parts, "bound": bound}

    def _split(self, parts: dict[str, float], tokens: int, rows: int) -> None:
        """`parts` of a step vLLM runs as two microbatches (planner/cost/dbo.py): the token-priced parts (linear
        layers, MoE, all-reduces) at each half's tokens, and the overlap of compute and DeepEP all-to-all."""
        halves = self._dbo.halves(tokens)
        parts["linear"] = sum(max(h * self._linear_per_token, self._linear_weights) for h in halves)
        moe = [self.moe_parts(h) for h in halves]
        comm = sum(p["dispatch"] for p in moe)
        parts["moe"] = sum(p["router"] + p["experts"] + p["dispatch"] for p in moe)
        if self.tp > 1:
            parts["allreduce"] = (sum(self._allreduce_fixed + h * self._allreduce_per_token for h in halves)
                                  + rows * self._gather_per_seq)
        gather = rows * self._gather_per_seq if self.tp > 1 else 0.0       # the logits', after the microbatches
        work = sum(parts[k] for k in ("linear", "moe", "prefill_attention", "decode_attention", "linear_attention",
                                      "compressors", "allreduce")) - comm - gather
        parts["dual_batch_overlap"] = -(work + comm - self._dbo.overlapped(work, comm, self._moe.moe_layers))

    def describe(self) -> dict:
        """What this model assumed, for a result file's 'cost model' section."""
        return {
            "name": self.name, "source": "roofline", "model": self.model.name, "gpu": self.gpu.name,
            "tp": self.tp, "dtype_bytes": self.dtype_bytes,
            "block_size": self.block_size,
            **({"moe": {"dp": self._par.dp, "ep": self._par.ep, "skew": self._par.skew}} if self._moe else {}),
            "weight_format": self.weight_format.as_dict() if self.weight_format is not None else None,
            "linear_precision": self.linear_precision, "kv_cache_dtype": self.kv_cache_dtype,
            "block_size_factor": self.block_size_factor, "efficiency": asdict(self.efficiency), "cpu_overhead_base_s": self._cpu_base,
            "cpu_overhead_per_seq_s": self._cpu_per_seq, "gpu_source": self.gpu.source,
        }
