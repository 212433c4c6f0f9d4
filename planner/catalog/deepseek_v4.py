"""DeepSeek-V4 (model_type deepseek_v4): compressed attention, hyper-connections and hashed experts.

DeepSeek-V4-Flash (284B, 43 layers) and -Pro (1.6T, 61 layers) keep DeepSeek-V3's experts (a sigmoid-family
router over 256 or 384 SwiGLU experts, top 6, one shared expert) and replace the rest of the block
(vllm/model_executor/models/deepseek_v4.py, layers/deepseek_v4_attention.py and deepseek_compressor.py;
transformers' modeling_deepseek_v4.py):

- Attention is multi-query over one 512-wide head that is both key and value (its last 64 values rotated),
  reached from a q latent (`q_lora_rank`) and left through a grouped output projection: `o_groups` groups of
  heads each projected to `o_lora_rank` values (wo_a, a batched GEMM), then mixed to the hidden size (wo_b).
  vLLM holds wq_a and wkv whole on every tensor-parallel rank (one fused replicated GEMM), splits wq_b by
  heads and wo_a by groups, and all-reduces after wo_b. A learned sink logit per head.
- Every layer attends to a 128-token sliding window (`sliding_window`). Beside it, per `compress_ratios`
  (transformers 5: `layer_types`), a layer compresses its keys: ratio 4 ("CSA", compressed sparse attention)
  pools every 4 tokens (overlapping windows of 8) into one entry and a lightning indexer (64 heads of 128,
  FP8) picks `index_topk` (512; Pro 1,024) of them per query; ratio 128 ("HCA", heavily compressed) pools
  every 128 tokens and attends to all of those entries; ratio 0 is the window alone. The compressors'
  projections and the indexer's head weights are unquantized and replicated.
- The residual stream is `hc_mult` (4) copies of the hidden state (manifold-constrained hyper-connections):
  around attention and around the MoE a [4 x hidden -> 24] fp32 projection gives the weights that collapse
  the copies into the block's input, spread its output back and mix the copies (a 4 x 4 matrix made doubly
  stochastic by `hc_sinkhorn_iters` Sinkhorn steps); a last [4 x hidden -> 4] one collapses them for the head.
- The first `num_hash_layers` (3) route each token by a fixed token-id -> expert table instead of the router.

The cache (vLLM's DeepseekV4 backends, FP8 only: vLLM asserts an fp8 cache and stores DeepSeek's fp8_ds_mla
rows): one row is 448 FP8 values, 7 UE8M0 scales (one per 64), the 64 rotary values in bf16 and a pad byte,
584 bytes. Every layer keeps the window's rows in 64-token blocks; a compressed layer keeps one row per 4 or
128 tokens in 256-token blocks (64 or 2 rows), a CSA layer also its indexer keys (128 FP8 values and an fp32
scale, 132 bytes, per compressed row), and each compressor an fp32 state for the tokens not yet pooled
(2 x 2 x 512 floats per token over its 8-token window for CSA, 2 x 512 over 128 tokens for HCA, 2 x 2 x 128
over 8 for the indexer's), in blocks of 4, 8 and 4 tokens. Each page is rounded up to a multiple of 576 bytes
(the decode kernel's TMA stride; kv_cache_interface.py's `alignment`). How vLLM fits pages of different sizes
into one pool is not modelled: each is counted at its own size.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from planner.catalog.quantization import checkpoint_scheme, with_expert_dtype
from planner.catalog.sparse_attention import SparseIndexer
from planner.errors import PlannerError

DEEPSEEK_V4_TYPES = ("deepseek_v4",)
SLIDING, CSA, HCA = 1, 4, 128             # vLLM's compress ratio per layer kind (ratio 0 in the config is 1)
_KIND_NAMES = {"sliding_attention": SLIDING, "compressed_sparse_attention": CSA,
               "heavily_compressed_attention": HCA}
SWA_BLOCK = 64                            # tokens per block of the window's rows (DeepseekV4SWACache)
COMPRESSED_BLOCK = 256                    # tokens per block of the compressed rows (the FlashMLA kernel's)
PAGE_ALIGNMENT = 576                      # bytes every page is rounded up to
_SCALE_GROUP = 64                         # FP8 values per UE8M0 scale in a row
_STATE_BLOCK = {CSA: 4, HCA: 8}           # tokens per block of a compressor's state (CompressorStateCache)
_FP32 = 4


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _page(rows: int, row_bytes: int) -> int:
    return _cdiv(rows * row_bytes, PAGE_ALIGNMENT) * PAGE_ALIGNMENT


def _window_blocks(window: int, block: int) -> int:
    """Blocks a running sequence holds for a `window`-token sliding window: its last `window` tokens span at
    most cdiv(window - 1, block) + 1 of them (vLLM frees the ones that leave the window)."""
    return _cdiv(window - 1, block) + 1


@dataclass(frozen=True, slots=True)
class CompressedAttention:
    """DeepSeek-V4's attention beyond what ModelSpec's fields hold: the layers of each kind, the window, the
    grouped output projection, the hyper-connections and the CSA layers' indexer. `ratio` is set on the
    twins ModelSpec.attention_kinds makes, one per kind: the kind those layers are (SLIDING, CSA, HCA)."""

    sliding_layers: int
    csa_layers: int
    hca_layers: int
    window: int
    o_groups: int
    o_lora_rank: int
    hc_mult: int
    hc_sinkhorn_iters: int
    hash_layers: int
    indexer: SparseIndexer
    ratio: int | None = None

    def __post_init__(self) -> None:
        for field in ("sliding_layers", "csa_layers", "hca_layers", "hash_layers"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise PlannerError(f"compressed attention: {field} must be a count, got {value!r}")
        for field in ("window", "o_groups", "o_lora_rank", "hc_mult", "hc_sinkhorn_iters"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PlannerError(f"compressed attention: {field} must be a positive integer, got {value!r}")

    @property
    def layers(self) -> int:
        return self.sliding_layers + self.csa_layers + self.hca_layers

    @property
    def kinds(self) -> tuple[tuple[int, int], ...]:
        """(ratio, layers) of each kind the model has."""
        counts = ((SLIDING, self.sliding_layers), (CSA, self.csa_layers), (HCA, self.hca_layers))
        return tuple((ratio, layers) for ratio, layers in counts if layers)

    @property
    def hc_mix(self) -> int:
        """Weights one hyper-connection computes per token: hc_mult to collapse, hc_mult to spread, hc_mult^2
        to mix."""
        return (2 + self.hc_mult) * self.hc_mult

    def hc_params_per_layer(self, hidden: int) -> int:
        """The two hyper-connections of one layer: each a [hc_mult x hidden -> hc_mix] projection, its
        bias and three scales (fp32)."""
        return 2 * (self.hc_mix * self.hc_mult * hidden + self.hc_mix + 3)

    def hc_head_params(self, hidden: int) -> int:
        """The final collapse of the copies before the model's norm: [hc_mult x hidden -> hc_mult], a bias and
        a scale."""
        return self.hc_mult * self.hc_mult * hidden + self.hc_mult + 1

    @staticmethod
    def compressor_width(ratio: int, head: int) -> int:
        """Values a compressor's key and gate projections each give per token: CSA's overlapping windows
        pool two rows' worth (coff 2), HCA one."""
        return (2 if ratio == CSA else 1) * head

    def compressor_shapes(self, ratio: int, hidden: int, head: int) -> tuple[tuple[int, int], ...]:
        """(outputs, inputs) of the unquantized, replicated projections a layer of `ratio` adds: the
        compressor's key and gate; on a CSA layer the indexer's compressor (its key and gate at the
        indexer's width) and its per-head weights."""
        if ratio == SLIDING:
            return ()
        width = self.compressor_width(ratio, head)
        shapes = ((width, hidden), (width, hidden))
        if ratio == CSA:
            index = self.compressor_width(CSA, self.indexer.head_dim)
            shapes += ((index, hidden), (index, hidden), (self.indexer.heads, hidden))
        return shapes

    def compressor_other_params(self, ratio: int, head: int) -> int:
        """A compressed layer's position biases (ratio x width, fp32) and RMSNorms, the indexer's too."""
        if ratio == SLIDING:
            return 0
        own = ratio * self.compressor_width(ratio, head) + head
        if ratio != CSA:
            return own
        index = self.indexer.head_dim
        return own + CSA * self.compressor_width(CSA, index) + index

    # ---- the cache ---------------------------------------------------------------------------------------

    @staticmethod
    def row_bytes(head: int, rope: int) -> int:
        """One fp8_ds_mla row: FP8 values of the unrotated part, a UE8M0 scale per 64 of them, the rotary
        part in bf16, padded to 8 bytes (584 for V4's 512-wide head)."""
        nope = head - rope
        return _cdiv(nope + _cdiv(nope, _SCALE_GROUP) + 2 * rope, 8) * 8

    def block_bytes(self, head: int, rope: int) -> int:
        """Bytes one COMPRESSED_BLOCK-token block of every layer's compressed rows takes: a CSA layer's page of
        rows and page of indexer keys, an HCA layer's page of rows."""
        row = self.row_bytes(head, rope)
        csa = _page(COMPRESSED_BLOCK // CSA, row) + _page(COMPRESSED_BLOCK // CSA, self.indexer.key_bytes)
        return self.csa_layers * csa + self.hca_layers * _page(COMPRESSED_BLOCK // HCA, row)

    def sequence_bytes(self, head: int, rope: int) -> int:
        """Bytes a running sequence holds whatever its length: every layer's window rows and each compressor's
        state, in the blocks their sliding windows span."""
        row = self.row_bytes(head, rope)
        window = self.layers * _window_blocks(self.window, SWA_BLOCK) * _page(SWA_BLOCK, row)
        csa = self._state_bytes(CSA, head) + self._state_bytes(CSA, self.indexer.head_dim)
        return window + self.csa_layers * csa + self.hca_layers * self._state_bytes(HCA, head)

    @staticmethod
    def _state_bytes(ratio: int, head: int) -> int:
        """One compressor's fp32 state (a key and a score per value) over its window: 2 x ratio tokens for
        CSA's overlapping windows, ratio for HCA."""
        coff = 2 if ratio == CSA else 1
        per_token = 2 * coff * head * _FP32
        block = _STATE_BLOCK[ratio]
        return _window_blocks(coff * ratio, block) * _page(block, per_token)


def _ratios(get: Callable[..., Any], name: str, layers: int) -> list[int]:
    """Each layer's compress ratio (SLIDING, CSA, HCA): config.json's `compress_ratios` (one more entry than
    layers: the MTP layer's) or transformers' `layer_types` with its `compress_rates`."""
    ratios = get("compress_ratios")
    if ratios is None and isinstance(get("layer_types"), list):
        rates = get("compress_rates") or {}
        kinds = get("layer_types")
        if any(kind not in _KIND_NAMES for kind in kinds):
            raise PlannerError(f"model {name!r}: layer_types must name sliding_attention, compressed_sparse_attention "
                               f"or heavily_compressed_attention, got {sorted(set(kinds) - set(_KIND_NAMES))}")
        ratios = [rates.get(kind, _KIND_NAMES[kind]) if kind != "sliding_attention" else 0 for kind in kinds]
    if not isinstance(ratios, list) or len(ratios) < layers:
        raise PlannerError(f"model {name!r}: config field compress_ratios (or layer_types) must give each of its "
                           f"{layers} layers a compress ratio")
    ratios = [max(1, r) if isinstance(r, int) and not isinstance(r, bool) else r for r in ratios[:layers]]
    if any(r not in (SLIDING, CSA, HCA) for r in ratios):
        raise PlannerError(f"model {name!r}: compress ratios {sorted(set(map(str, ratios)))} are not modelled; "
                           f"DeepSeek-V4's are 0 (the window alone), 4 and 128")
    return ratios


def _hash_layers(get: Callable[..., Any]) -> int:
    kinds = get("mlp_layer_types")
    if isinstance(kinds, list):
        return kinds.count("hash_moe")
    return get("num_hash_layers") or 0


def _checkpoint(get: Callable[..., Any]) -> dict[str, Any]:
    """The released checkpoint's format: FP8 in 128 x 128 blocks, its experts in MXFP4 where `expert_dtype`
    says fp4 (config.json's top level; transformers 5 moves it into quantization_config)."""
    scheme = checkpoint_scheme(with_expert_dtype(get("quantization_config"), get("expert_dtype")))
    return {"checkpoint_quantization": scheme} if scheme is not None else {}


def deepseek_v4_fields(get: Callable[..., Any], name: str) -> dict[str, Any]:
    """ModelSpec fields of a DeepSeek-V4 config (config.json's fields or transformers' DeepseekV4Config)."""
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim", "q_lora_rank", "o_lora_rank",
                "o_groups", "vocab_size", "moe_intermediate_size", "num_experts_per_tok", "n_routed_experts",
                "index_n_heads", "index_head_dim", "index_topk", "sliding_window"):
        value = get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise PlannerError(f"model {name!r}: config field {key} must be a positive integer, got {value!r}")
    if (get("num_key_value_heads") or 1) != 1:
        raise PlannerError(f"model {name!r}: DeepSeek-V4 attends with one shared key/value head, not "
                           f"{get('num_key_value_heads')}")
    layers, head = get("num_hidden_layers"), get("head_dim")
    rope = get("qk_rope_head_dim")
    if rope is None and get("partial_rotary_factor") is not None:
        rope = round(head * get("partial_rotary_factor"))
    ratios = _ratios(get, name, layers)
    attention = CompressedAttention(
        sliding_layers=ratios.count(SLIDING), csa_layers=ratios.count(CSA), hca_layers=ratios.count(HCA),
        window=get("sliding_window"), o_groups=get("o_groups"), o_lora_rank=get("o_lora_rank"),
        hc_mult=get("hc_mult") or 4, hc_sinkhorn_iters=get("hc_sinkhorn_iters") or 20, hash_layers=_hash_layers(get),
        indexer=SparseIndexer(heads=get("index_n_heads"), head_dim=get("index_head_dim"), topk=get("index_topk")))
    return dict(
        name=name, model_type="deepseek_v4", num_layers=layers, hidden_size=get("hidden_size"),
        num_heads=get("num_attention_heads"), num_kv_heads=1, head_size=head,
        intermediate_size=get("moe_intermediate_size"), vocab_size=get("vocab_size"),
        max_position_embeddings=get("max_position_embeddings") or 1048576,
        tie_word_embeddings=bool(get("tie_word_embeddings", False)), rope_theta=float(get("rope_theta") or 10000.0),
        norm_eps=get("rms_norm_eps") or 1e-6, sliding_window=get("sliding_window"), attention_sinks=True,
        num_experts=get("n_routed_experts"), num_experts_per_tok=get("num_experts_per_tok"),
        moe_intermediate_size=get("moe_intermediate_size"), shared_experts=get("n_shared_experts") or 0,
        q_lora_rank=get("q_lora_rank"), partial_rotary_dims=rope or 64, compressed_attention=attention,
        **_checkpoint(get))


def deepseek_v4_hf_config(spec):
    """transformers' DeepseekV4Config of `spec`: its layers' kinds in V4-Flash's order (the window-only layers
    first, then CSA and HCA alternating while both last); the counts and shapes are what the planner keeps."""
    import transformers  # slow import; only the catalog's checks build configs of a model the engine cannot run

    ca = spec.compressed_attention
    kinds = ["sliding_attention"] * ca.sliding_layers
    csa, hca = ca.csa_layers, ca.hca_layers
    while csa or hca:
        if csa:
            kinds.append("compressed_sparse_attention")
            csa -= 1
        if hca:
            kinds.append("heavily_compressed_attention")
            hca -= 1
    config = transformers.DeepseekV4Config(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, moe_intermediate_size=spec.moe_intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads, num_key_value_heads=1,
        head_dim=spec.head_size, q_lora_rank=spec.q_lora_rank, num_experts_per_tok=spec.num_experts_per_tok,
        n_routed_experts=spec.num_experts, n_shared_experts=spec.shared_experts,
        max_position_embeddings=spec.max_position_embeddings, layer_types=kinds,
        mlp_layer_types=["hash_moe"] * ca.hash_layers + ["moe"] * (spec.num_layers - ca.hash_layers),
        hc_mult=ca.hc_mult, hc_sinkhorn_iters=ca.hc_sinkhorn_iters, sliding_window=ca.window, o_groups=ca.o_groups,
        o_lora_rank=ca.o_lora_rank, index_n_heads=ca.indexer.heads, index_head_dim=ca.indexer.head_dim,
        index_topk=ca.indexer.topk, partial_rotary_factor=spec.rotary_dims / spec.head_size,
        rms_norm_eps=spec.norm_eps, tie_word_embeddings=spec.tie_word_embeddings)
    config.architectures = ["DeepseekV4ForCausalLM"]
    return config
