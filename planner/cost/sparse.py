"""DeepSeek Sparse Attention's per-layer prices (planner/catalog/sparse_attention.py), shared by the measured
and roofline models: the indexer's scores over every cached key, and latent attention over the keys it keeps.

As vLLM 0.19 runs it (vllm/model_executor/layers/sparse_attn_indexer.py, v1/attention/backends/mla/
flashmla_sparse.py):

- The indexer scores each query against every earlier key in FP8 (DeepGEMM's fp8_mqa_logits in prefill,
  fp8_paged_mqa_logits in decode), writes one fp32 logit per (query, key) and a top-k kernel reads them
  back. Per pair: its FLOPs at the FP8 peak (at the 16-bit one on a GPU without FP8 tensor cores), or
  in decode its key's 132 bytes, whichever is slower, plus the logit's 8 bytes through memory.
- Latent attention then runs in the absorbed multi-query form for prefill as for decode (576-wide keys,
  512-wide values) over an index_topk-slot list per query, padded with -1 where the context is shorter.
  NVIDIA's timings of vLLM 0.24's whole DSA module (aiconfigurator-core's dsa_context_module and
  dsa_generation_module tables) cost the same for 128 prompts of 16 tokens as for one of 2,048, and
  barely move with the context below 2,048 in decode, so the kernels pay for all index_topk slots:
  a query is priced at index_topk keys whatever its context. The kernels pad the heads they compute
  to 64 (prefill on Blackwell: 128), so fewer heads per GPU cost as many FLOPs.

Where NVIDIA timed the model's shapes (DeepSeek-V3.2's and GLM-5's, on H100, H200 and B200), the measured
model reads those module timings instead (`module_trees`): they hold every kernel of the layer's attention,
the indexer's small ones included, which the parts above leave out (bench/bench_dsa_module.py).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from planner.catalog import SM100_FAMILIES, GpuSpec, ModelSpec, mla, resolve_model
from planner.catalog.quantization import WeightFormat
from planner.catalog.sparse_attention import latent_cache_bytes
from planner.cost import tables
from planner.errors import PlannerError

# the GPU families vLLM's sparse MLA kernels run on (compute capability 9.0 and 10.0) -> the heads its
# prefill kernel computes per program (FlashMLASparseImpl's prefill_padding)
PREFILL_PADDED_HEADS = {"h100": 64, "h200": 64, **dict.fromkeys(SM100_FAMILIES, 128)}
DECODE_PADDED_HEADS = 64          # the FP8 decode kernel's; 128 above 64 heads per GPU
LOGIT_BYTES = 8                   # one fp32 logit per (query, key), written by the indexer, read by top-k
_FLASHINFER_SPARSE_FAMILIES = SM100_FAMILIES     # compute capability 10: FlashInfer's sparse MLA for an FP8 cache


def check_sparse_gpu(model: ModelSpec, gpu: GpuSpec) -> None:
    """vLLM runs DeepSeek Sparse Attention and DeepSeek-V4's attention on Hopper and datacenter Blackwell only
    (FlashMLASparseBackend.supports_compute_capability: 9.x and 10.x)."""
    sparse = model.sparse_indexer is not None or model.compressed_attention is not None
    if sparse and gpu.kind == "gpu" and gpu.family not in PREFILL_PADDED_HEADS:
        raise PlannerError(f"{model.name}'s sparse attention runs in vLLM on H100, H200 and B200 only (FlashMLA's "
                           f"sparse kernels and DeepGEMM's indexer logits need compute capability 9.0 or 10.0), "
                           f"not on {gpu.name}")


def as_cached_on(model: ModelSpec, gpu: GpuSpec, kv_dtype_bytes: int) -> ModelSpec:
    """`model` with the latent cache vLLM keeps on `gpu`: a DSA model's FP8 cache on Blackwell in plain FP8
    (576 bytes a token and layer, not fp8_ds_mla's 656), as vLLM prefers FlashInfer's sparse backend there for
    a quantized cache (platforms/cuda.py `_get_backend_priorities`, compute capability 10) and FlashMLA's on
    Hopper; `model` itself otherwise."""
    index = model.sparse_indexer
    ds_mla = not (gpu.family in _FLASHINFER_SPARSE_FAMILIES and kv_dtype_bytes == 1)
    if index is None or index.fp8_ds_mla == ds_mla:
        return model
    return replace(model, sparse_indexer=replace(index, fp8_ds_mla=ds_mla))


@dataclass(frozen=True, slots=True)
class SparsePrice:
    """Seconds one layer spends per unit of work, on one of `tp` GPUs; the indexer's on a layer that runs
    one, which `indexed` of the layers do (GLM-5.2: 21 / 78)."""

    topk: int
    indexed: float
    decode_per_query: float     # latent attention of one decoding query over index_topk slots
    prefill_per_query: float    # the same for a prompt token (the bf16 prefill kernel)
    index_per_key: float        # the indexer's score of one cached key for one decoding query
    index_per_pair: float       # the indexer's score of one (query, key) pair in prefill

    @classmethod
    def of(cls, model: ModelSpec, gpu: GpuSpec, tp: int, kv_dtype_bytes: int, bandwidth: float,
           flops16: float, flops8: float) -> "SparsePrice":
        """Prices at `bandwidth` B/s and `flops16` / `flops8` FLOP/s (16-bit and FP8 tensor cores, achieved)."""
        index, heads = model.sparse_indexer, model.num_heads // tp
        per_key = mla.decode_flops_per_key(model)
        decode_heads = DECODE_PADDED_HEADS if heads <= DECODE_PADDED_HEADS else 2 * DECODE_PADDED_HEADS
        prefill_heads = max(heads, PREFILL_PADDED_HEADS.get(gpu.family, DECODE_PADDED_HEADS))
        latent = latent_cache_bytes(model.kv_lora_rank, model.qk_rope_head_dim, kv_dtype_bytes, index.fp8_ds_mla)
        index_flops = index.flops_per_pair / (flops8 or flops16)
        return cls(
            topk=index.topk, indexed=model.indexer_layers / model.attention_layers,
            decode_per_query=max(index.topk * latent / bandwidth, index.topk * decode_heads * per_key / flops16),
            prefill_per_query=index.topk * prefill_heads * per_key / flops16,
            index_per_key=max(index.key_bytes / bandwidth, index_flops) + LOGIT_BYTES / bandwidth,
            index_per_pair=index_flops + LOGIT_BYTES / bandwidth)

    def prefill(self, tokens: int, pairs: int) -> float:
        """A layer's sparse attention and indexer (on average over the layers) for `tokens` prompt tokens with
        `pairs` causal pairs."""
        return tokens * self.prefill_per_query + pairs * self.indexed * self.index_per_pair


# The measured model's ledger terms NVIDIA's DSA and MLA module timings include (its input norm and all-reduce
# excluded; an MLA layer has no indexer)
MODULE_GEMMS = frozenset(("q_a + kv_a", "q_b", "kv_b", "o projection", "indexer wq_b", "indexer wk + weights_proj"))
MODULE_KERNELS = frozenset(("q and KV latent RMSNorms", "rotary embedding", "KV-cache write",
                            "indexer q/k rotary, FP8 quantize, k LayerNorm"))


def _attention_shape(model: ModelSpec) -> tuple:
    """What one GPU's share of a latent-attention layer does at a given number of heads on it (the model's
    total heads only set how many a GPU holds); a layer with its indexer, whichever layers run one."""
    index = model.sparse_indexer
    return (model.hidden_size, model.q_lora_rank, model.kv_lora_rank, model.head_size, model.qk_rope_head_dim,
            model.v_head_dim, (index.heads, index.head_dim, index.topk) if index is not None else None)


def module_trees(system: str, model: ModelSpec, heads: int, kv_cache_dtype: str,
                 weight_format: WeightFormat | None, kind: str = "dsa") -> tuple[dict, dict, str] | None:
    """NVIDIA's timings of one layer's attention module, DeepSeek Sparse Attention's (`kind` "dsa") or
    multi-head latent attention's ("mla"), for `model` with `heads` heads per GPU: the prefill tree
    (batch_size, isl), the decode tree (batch_size, cached tokens) and what they time; None where the
    system timed no model of these shapes in this split. NVIDIA's FP8 checkpoints keep the attention
    projections in block-scaled FP8, its NVFP4 ones in bf16 (their exclude_modules)."""
    if not tables.has_table(system, f"{kind}_generation"):
        return None
    gemm = "fp8_block" if weight_format is not None and weight_format.method == "fp8" else "bfloat16"
    kv = "fp8" if kv_cache_dtype == "fp8" else "bfloat16"
    shape = _attention_shape(model)
    timed = {r["model"] for r in tables.load_rows(system, f"{kind}_generation")}
    same = [name for name in sorted(timed) if _attention_shape(resolve_model(name)) == shape]
    if not same:
        return None
    where = {"model": same[0], "num_heads": heads, "kv_cache_dtype": kv, "gemm_type": gemm}
    trees = [tables.build_tree(tables.load_rows(system, table), ("batch_size", axis), where)
             for table, axis in ((f"{kind}_context", "isl"), (f"{kind}_generation", "step"))]
    if not all(trees):
        return None
    label = f"{same[0]}'s shapes, {heads} heads, {kv} cache, {gemm} GEMMs"
    return tables.monotone(trees[0], 2), tables.monotone(trees[1], 2), label
