"""Reading a mixture-of-experts model's config.json (model_type qwen3_moe, mixtral, gpt_oss, minimax_m2, and
DeepSeek's deepseek_v2, deepseek_v3, kimi_k2) into ModelSpec fields.

The four architectures name the same things differently (transformers' Qwen3MoeConfig,
MixtralConfig, GptOssConfig, MiniMaxM2Config):

| field | qwen3_moe | mixtral | gpt_oss | minimax_m2 |
|---|---|---|---|---|
| experts | num_experts | num_local_experts | num_local_experts | num_local_experts |
| top-k | num_experts_per_tok | num_experts_per_tok | num_experts_per_tok, experts_per_token | num_experts_per_tok |
| expert width | moe_intermediate_size | intermediate_size | intermediate_size | intermediate_size |
| dense layers | mlp_only_layers, decoder_sparse_step | none | none | none |
| sliding window | use_sliding_window (off) | sliding_window, every layer | layer_types' "sliding_attention" ones | none |
| q/k norms | per head | none | none | over all heads (one all-reduce per layer under TP) |

None of the four has shared experts (an always-on expert beside the routed ones, as Qwen2-MoE
and DeepSeek have); a config of theirs that declares them is refused rather than priced without them.

DeepSeek-V2/V3/R1, Kimi-K2 and GLM-4.7-Flash (transformers' DeepseekV2Config, DeepseekV3Config; Kimi-K2
and GLM-4.7-Flash ship DeepSeek-V3's architecture under model_type kimi_k2 and glm4_moe_lite, the latter's
dense layers listed per layer in mlp_layer_types when transformers 5 writes it): n_routed_experts of
moe_intermediate_size, num_experts_per_tok, n_shared_experts shared ones, the first first_k_dense_replace
layers dense (then every moe_layer_freq-th layer a MoE), and multi-head latent attention (q_lora_rank, kv_lora_rank,
qk_nope_head_dim + qk_rope_head_dim q/k heads, v_head_dim v heads: planner/catalog/mla.py). Their
group-limited routing (n_group, topk_group) still spreads a batch's picks over all experts, so it is
priced as top-k routing; the multi-token-prediction layer (num_nextn_predict_layers) is not loaded
unless it drafts (vLLM's MTP speculation), so it is not counted.

GLM-4.5, 4.6, 4.7 and GLM-4.5-Air (transformers' Glm4MoeConfig, model_type glm4_moe) keep DeepSeek-V3's
expert layout (n_routed_experts, n_shared_experts, first_k_dense_replace, sigmoid group routing priced
as top-k, an MTP layer not counted) with grouped-query attention: num_key_value_heads heads of head_dim,
biased q/k/v (attention_bias), per-head q/k RMSNorms when use_qk_norm (the 355B models; not Air) and
rotary on partial_rotary_factor of each head (0.5). transformers 5 moves the factor into rope_parameters;
a config.json on the Hub has it at the top level.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from planner.catalog.llama4_config import LLAMA4_TYPES, llama4_hf_config
from planner.catalog.quantization import checkpoint_scheme
from planner.catalog.rope import partial_rotary_dims
from planner.catalog.sparse_attention import DSA_TYPES, sparse_indexer
from planner.errors import PlannerError

# DeepSeek-V3's architecture, latent attention included, under other names: Kimi-K2, GLM-4.7-Flash; and with
# DeepSeek Sparse Attention's indexer on top: DeepSeek-V3.2, GLM-5 (planner/catalog/sparse_attention.py)
DEEPSEEK_TYPES = ("deepseek_v3", "deepseek_v2", "kimi_k2", "glm4_moe_lite", *DSA_TYPES)
GLM_TYPES = ("glm4_moe",)
MOE_TYPES = ("qwen3_moe", "mixtral", "gpt_oss", "minimax_m2", *DEEPSEEK_TYPES, *GLM_TYPES,
             *LLAMA4_TYPES)   # Llama 4: llama4_config


def dense_layer_count(get: Callable[..., Any], layers: int) -> int:
    """Qwen3-MoE (and Qwen3-Next, Qwen3.5) layers that keep a dense MLP: listed in mlp_only_layers, or off the decoder_sparse_step."""
    only = set(get("mlp_only_layers") or [])
    step = get("decoder_sparse_step") or 1
    return sum(1 for layer in range(layers) if layer in only or (layer + 1) % step)


def shared_expert_count(width: Any, shared: int, name: str) -> int:
    """A shared expert `shared` wide as a count of `width`-wide experts (Qwen3-Next, Qwen3.5, Nemotron 3)."""
    if not (isinstance(width, int) and width > 0):
        return 0                # a bad width is named by ModelSpec's own check
    if shared % width:
        raise PlannerError(f"model {name!r}: a shared expert {shared} wide is not a whole number of "
                           f"{width}-wide experts")
    return shared // width


def moe_fields(get: Callable[..., Any], model_type: str, name: str) -> dict[str, Any]:
    """ModelSpec keyword arguments of a MoE config (`get(key, default=None)` reads the config)."""
    if model_type in DEEPSEEK_TYPES:
        fields = _deepseek_fields(get, model_type, name)
    elif model_type in GLM_TYPES:
        fields = _glm_fields(get, model_type, name)
    else:
        fields = _routed_fields(get, model_type, name)
    scheme = checkpoint_scheme(get("quantization_config"))
    if scheme is not None:
        fields["checkpoint_quantization"] = scheme
    return fields


def _routed_fields(get: Callable[..., Any], model_type: str, name: str) -> dict[str, Any]:
    """The four architectures without shared experts or latent attention (the table above)."""
    if any(get(key) for key in ("shared_expert_intermediate_size", "n_shared_experts", "num_shared_experts",
                                "shared_intermediate_size")):
        raise PlannerError(f"{name}: shared experts are not modelled (qwen3_moe, mixtral, gpt_oss and minimax_m2 "
                           f"have none)")
    hidden, heads, layers = get("hidden_size"), get("num_attention_heads"), get("num_hidden_layers")
    rope = get("rope_parameters") or {}
    theta = (rope.get("rope_theta") if isinstance(rope, dict) else None) or get("rope_theta") or 10000.0
    fields: dict[str, Any] = dict(
        name=name, model_type=model_type, num_layers=layers, hidden_size=hidden, num_heads=heads,
        num_kv_heads=get("num_key_value_heads") or heads, head_size=get("head_dim") or hidden // heads,
        vocab_size=get("vocab_size"), max_position_embeddings=get("max_position_embeddings"),
        tie_word_embeddings=bool(get("tie_word_embeddings", False)), rope_theta=float(theta),
        norm_eps=get("rms_norm_eps", 1e-6), num_experts_per_tok=get("num_experts_per_tok")
        or get("experts_per_token"))
    if model_type == "qwen3_moe":
        # the Hub's config.json says num_experts; transformers 5 writes it back as num_local_experts
        fields.update(num_experts=get("num_experts") or get("num_local_experts"),
                      moe_intermediate_size=get("moe_intermediate_size"),
                      intermediate_size=get("intermediate_size"), dense_layers=dense_layer_count(get, layers),
                      sliding_window=get("sliding_window") if get("use_sliding_window", False) else None)
    elif model_type == "mixtral":
        fields.update(num_experts=get("num_local_experts"), moe_intermediate_size=get("intermediate_size"),
                      intermediate_size=get("intermediate_size"), sliding_window=get("sliding_window"))
    elif model_type == "minimax_m2":
        # its config.json names the dims that turn (rotary_dim 64 of 128); transformers 5 writes a factor
        head, turned = fields["head_size"], get("rotary_dim")
        given = isinstance(turned, int) and isinstance(head, int) and 0 < turned < head
        fields.update(num_experts=get("num_local_experts"), moe_intermediate_size=get("intermediate_size"),
                      intermediate_size=get("intermediate_size"),
                      partial_rotary_dims=turned if given else partial_rotary_dims(get, head, name))
    else:
        types = list(get("layer_types") or [])
        sliding = sum(1 for t in types if t == "sliding_attention")
        fields.update(num_experts=get("num_local_experts"), moe_intermediate_size=get("intermediate_size"),
                      intermediate_size=get("intermediate_size"), sliding_window=get("sliding_window"),
                      sliding_layers=sliding if get("sliding_window") else 0, attention_sinks=True)
    return fields


def _shared_expert_fields(get: Callable[..., Any], model_type: str, name: str) -> dict[str, Any]:
    """DeepSeek-V3's expert layout, which GLM-4.5 keeps: routed and shared experts after
    first_k_dense_replace dense layers (then every moe_layer_freq-th layer a MoE)."""
    layers = get("num_hidden_layers")
    first_dense, freq = get("first_k_dense_replace") or 0, get("moe_layer_freq") or 1
    moe = sum(1 for layer in range(layers) if layer >= first_dense and layer % freq == 0)
    kinds = get("mlp_layer_types")           # transformers 5 writes GLM-4.7-Flash's layout out per layer
    if isinstance(kinds, list) and kinds:
        moe = sum(1 for kind in kinds if kind == "sparse")
    rope = get("rope_parameters") or get("rope_scaling") or {}
    theta = (rope.get("rope_theta") if isinstance(rope, dict) else None) or get("rope_theta") or 10000.0
    return dict(
        name=name, model_type=model_type, num_layers=layers, hidden_size=get("hidden_size"),
        num_heads=get("num_attention_heads"), intermediate_size=get("intermediate_size"),
        vocab_size=get("vocab_size"), max_position_embeddings=get("max_position_embeddings"),
        tie_word_embeddings=bool(get("tie_word_embeddings", False)), rope_theta=float(theta),
        norm_eps=get("rms_norm_eps", 1e-6), num_experts=get("n_routed_experts"),
        num_experts_per_tok=get("num_experts_per_tok"), moe_intermediate_size=get("moe_intermediate_size"),
        dense_layers=layers - moe, shared_experts=get("n_shared_experts") or 0)


def _deepseek_fields(get: Callable[..., Any], model_type: str, name: str) -> dict[str, Any]:
    """DeepSeek-V2/V3, Kimi-K2 and the DSA models: shared experts, leading dense layers and latent attention
    (above), and DSA's indexer."""
    rope_dims = get("qk_rope_head_dim")
    return dict(
        _shared_expert_fields(get, model_type, name), num_kv_heads=get("num_attention_heads"),
        head_size=(get("qk_nope_head_dim") or 0) + (rope_dims or 0),
        kv_lora_rank=get("kv_lora_rank"), q_lora_rank=get("q_lora_rank") or 0, qk_rope_head_dim=rope_dims,
        v_head_dim=get("v_head_dim"), sparse_indexer=sparse_indexer(get, name) if model_type in DSA_TYPES else None)


def _glm_fields(get: Callable[..., Any], model_type: str, name: str) -> dict[str, Any]:
    """GLM-4.5/4.6/4.7: DeepSeek-V3's experts behind grouped-query attention (above)."""
    fields = _shared_expert_fields(get, model_type, name)
    heads = fields["num_heads"]          # hidden_size and heads are checked positive before this reads them
    head_size = get("head_dim") or fields["hidden_size"] // heads
    return dict(fields, num_kv_heads=get("num_key_value_heads") or heads, head_size=head_size,
                attention_bias=bool(get("attention_bias", False)), use_qk_norm=bool(get("use_qk_norm", False)),
                partial_rotary_dims=partial_rotary_dims(get, head_size, name))


def moe_hf_config(spec, common: dict[str, Any]):
    """A transformers config of a MoE ModelSpec with its true shapes (random-weight checkpoints)."""
    import transformers  # slow import; only the profiler and the engine need configs

    experts = dict(num_experts_per_tok=spec.num_experts_per_tok)
    if spec.model_type == "qwen3_moe":
        mlp_only = list(range(spec.num_layers - spec.dense_layers, spec.num_layers))
        config = transformers.Qwen3MoeConfig(num_experts=spec.num_experts,
                                             moe_intermediate_size=spec.moe_intermediate_size,
                                             norm_topk_prob=True, mlp_only_layers=mlp_only, **experts, **common)
        config.architectures = ["Qwen3MoeForCausalLM"]
    elif spec.model_type == "mixtral":
        common = {**common, "intermediate_size": spec.moe_intermediate_size}
        config = transformers.MixtralConfig(num_local_experts=spec.num_experts, sliding_window=spec.sliding_window,
                                            **experts, **common)
        config.architectures = ["MixtralForCausalLM"]
    elif spec.model_type == "minimax_m2":
        common = {**common, "intermediate_size": spec.moe_intermediate_size}
        config = transformers.MiniMaxM2Config(num_local_experts=spec.num_experts, **experts, **common)
        config.architectures = ["MiniMaxM2ForCausalLM"]
    elif spec.model_type in LLAMA4_TYPES:
        config = llama4_hf_config(spec, common)
    elif spec.is_mla:
        drop = ("num_key_value_heads", "head_dim")     # MLA's heads come from the latent ranks below
        fields = dict(
            n_routed_experts=spec.num_experts, moe_intermediate_size=spec.moe_intermediate_size,
            n_shared_experts=spec.shared_experts, n_group=1, topk_group=1,
            kv_lora_rank=spec.kv_lora_rank, q_lora_rank=spec.q_lora_rank or None,
            qk_rope_head_dim=spec.qk_rope_head_dim, qk_nope_head_dim=spec.head_size - spec.qk_rope_head_dim,
            v_head_dim=spec.v_head_dim, **experts, **{k: v for k, v in common.items() if k not in drop})
        if spec.sparse_indexer is not None:
            index = spec.sparse_indexer
            make = transformers.DeepseekV32Config if spec.model_type == "deepseek_v32" else transformers.GlmMoeDsaConfig
            shared = {}
            if index.every > 1:       # GLM-5.2's config lists the layers that run their own indexer
                indexed = index.indexed_layers(spec.num_layers)
                shared = dict(index_topk_freq=index.every, index_skip_topk_offset=index.offset,
                              indexer_types=["full" if i in indexed else "shared" for i in range(spec.num_layers)])
            config = make(first_k_dense_replace=spec.dense_layers, index_n_heads=index.heads,
                          index_head_dim=index.head_dim, index_topk=index.topk, **shared, **fields)
            config.architectures = ["DeepseekV32ForCausalLM" if spec.model_type == "deepseek_v32"
                                    else "GlmMoeDsaForCausalLM"]
        elif spec.model_type == "glm4_moe_lite":        # its dense layers listed per layer
            kinds = ["dense"] * spec.dense_layers + ["sparse"] * spec.moe_layers
            config = transformers.Glm4MoeLiteConfig(mlp_layer_types=kinds, **fields)
            config.architectures = ["Glm4MoeLiteForCausalLM"]
        else:
            config = transformers.DeepseekV3Config(first_k_dense_replace=spec.dense_layers, **fields)
            config.architectures = ["DeepseekV3ForCausalLM"]
    elif spec.model_type in GLM_TYPES:
        config = transformers.Glm4MoeConfig(
            n_routed_experts=spec.num_experts, moe_intermediate_size=spec.moe_intermediate_size,
            n_shared_experts=spec.shared_experts, first_k_dense_replace=spec.dense_layers, n_group=1, topk_group=1,
            attention_bias=spec.attention_bias, use_qk_norm=spec.use_qk_norm, **experts, **common)
        config.architectures = ["Glm4MoeForCausalLM"]
    else:
        common = {**common, "intermediate_size": spec.moe_intermediate_size}
        # gpt-oss alternates sliding and full layers, sliding first, as the released configs list them
        types = ["sliding_attention" if i % 2 == 0 and i // 2 < spec.sliding_layers else "full_attention"
                 for i in range(spec.num_layers)]
        config = transformers.GptOssConfig(num_local_experts=spec.num_experts, sliding_window=spec.sliding_window,
                                           layer_types=types, **experts, **common)
        config.architectures = ["GptOssForCausalLM"]
    return config
