"""Reading a MiMo-V2-Flash config.json (model_type mimo_v2_flash) into ModelSpec fields.

MiMo-V2-Flash (Xiaomi, 309B total, 15B active) is a mixture of experts whose attention layers come in two
kinds (vllm/model_executor/models/mimo_v2_flash.py, transformers' modeling_mimo_v2_flash.py):

- sliding layers (`hybrid_layer_pattern` 1; 39 of 48): a 128-token window, `swa_num_key_value_heads` (8) KV
  heads and a learned sink logit per head (`add_swa_attention_sink_bias`);
- full layers (pattern 0: the first and every sixth after it): `num_key_value_heads` (4) KV heads, no sink.

Both kinds project q and k to 192-wide heads and v to 128-wide ones (`head_dim`, `v_head_dim`), so vLLM
runs them on FlashAttention's different-K/V backend, which caches each token's K and V side by side, 320
values per KV head (FlashAttentionDiffKVBackend.get_kv_cache_shape); the o projection takes 64 x 128
inputs. Rotary turns `partial_rotary_factor` (0.334: 64 dims) of each q/k head. The value is scaled by
`attention_value_scale` before attention (one multiply beside the QKV split, left out of the ledger).

The first layer keeps a dense SwiGLU MLP of `intermediate_size`; the others (`moe_layer_freq` 1) route
each token to 8 of 256 SwiGLU experts of `moe_intermediate_size` by a sigmoid router with a correction
bias, as DeepSeek-V3's, without a shared expert. vLLM skips the checkpoint's MTP layers (`model.mtp.*`).

transformers 5 writes the same model as `layer_types` and `mlp_layer_types`, the sliding layers' KV heads
as twice `num_key_value_heads`, and `sliding_window` as the window plus the query (129); vLLM reads
`sliding_window_size` (128), which transformers keeps too.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from planner.catalog.gemma4 import GlobalAttention
from planner.catalog.rope import partial_rotary_dims
from planner.errors import PlannerError

MIMO_TYPES = ("mimo_v2_flash",)


def _pattern(get: Callable[..., Any], name: str, layers: int) -> tuple[list[bool], list[bool]]:
    """(is a sliding layer, is a MoE layer) for each layer, from config.json's integer lists or
    transformers' named ones."""
    sliding = get("hybrid_layer_pattern")
    if sliding is None and get("layer_types") is not None:
        sliding = [kind == "sliding_attention" for kind in get("layer_types")]
    moe = get("moe_layer_freq")
    if moe is None and get("mlp_layer_types") is not None:
        moe = [kind == "sparse" for kind in get("mlp_layer_types")]
    for field, values in (("hybrid_layer_pattern (or layer_types)", sliding),
                          ("moe_layer_freq (or mlp_layer_types)", moe)):
        if not isinstance(values, list) or len(values) != layers:
            raise PlannerError(f"model {name!r}: config field {field} must list each of its {layers} layers")
    return [bool(s) for s in sliding], [bool(m) for m in moe]


def mimo_fields(get: Callable[..., Any], name: str) -> dict[str, Any]:
    """ModelSpec fields of a MiMo-V2-Flash config (config.json's fields or transformers' MiMoV2FlashConfig)."""
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "intermediate_size", "vocab_size", "moe_intermediate_size", "num_experts_per_tok"):
        value = get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise PlannerError(f"model {name!r}: config field {key} must be a positive integer, got {value!r}")
    layers, heads, full_kv = get("num_hidden_layers"), get("num_attention_heads"), get("num_key_value_heads")
    head, value_head = get("head_dim") or 192, get("v_head_dim") or 0
    sliding, moe = _pattern(get, name, layers)
    # config.json names the sliding layers' shape; transformers doubles the KV heads and shares the rest
    swa = dict(heads=get("swa_num_attention_heads") or heads, head=get("swa_head_dim") or head,
               value=get("swa_v_head_dim") or value_head)
    if swa != dict(heads=heads, head=head, value=value_head):
        raise PlannerError(f"model {name!r}: sliding layers with their own query heads or head sizes "
                           f"({swa}) are not modelled; only their KV heads may differ")
    swa_kv = get("swa_num_key_value_heads") or 2 * full_kv
    window = get("sliding_window_size")
    if window is None and isinstance(get("sliding_window"), int):      # transformers': the window + the query
        window = get("sliding_window") - 1
    rope = get("rope_parameters") or {}
    full_rope = rope.get("full_attention", {}) if isinstance(rope, dict) else {}
    rotary = partial_rotary_dims(lambda k, d=None: full_rope.get(k, get(k, d)), head, name)
    has_sliding = any(sliding) and bool(window)     # (a window that is no count is refused by ModelSpec)
    return dict(
        name=name, model_type="mimo_v2_flash", num_layers=layers, hidden_size=get("hidden_size"),
        num_heads=heads, num_kv_heads=swa_kv if has_sliding else full_kv, head_size=head,
        v_head_dim=value_head if value_head != head else 0, partial_rotary_dims=rotary,
        intermediate_size=get("intermediate_size"), vocab_size=get("vocab_size"),
        max_position_embeddings=get("max_position_embeddings") or 262144,
        tie_word_embeddings=bool(get("tie_word_embeddings", False)),
        rope_theta=float(full_rope.get("rope_theta") or get("rope_theta") or 5e6),
        norm_eps=get("layernorm_epsilon") or get("rms_norm_eps") or 1e-5,
        sliding_window=window if has_sliding else None, sliding_layers=sum(sliding) if has_sliding else 0,
        attention_sinks=has_sliding and bool(get("add_swa_attention_sink_bias", True)),
        global_attention=GlobalAttention(head, full_kv) if has_sliding and swa_kv != full_kv else None,
        num_experts=get("n_routed_experts") or get("num_local_experts") or 0,
        num_experts_per_tok=get("num_experts_per_tok"), moe_intermediate_size=get("moe_intermediate_size"),
        dense_layers=moe.count(False))


def mimo_hf_config(spec):
    """transformers' MiMoV2FlashConfig of `spec`: its own layer pattern (the first layer and every sixth full)
    where that holds the spec's full layers, else the full layers first (the counts and shapes are what the
    planner keeps)."""
    import transformers  # slow import; only the catalog's checks build configs of a model the engine cannot run

    g = spec.global_attention
    full_kv = g.kv_heads if g else spec.num_kv_heads
    if spec.sliding_layers and spec.num_kv_heads != 2 * full_kv:
        raise PlannerError(f"model {spec.name!r}: transformers' MiMoV2FlashConfig gives the sliding layers twice "
                           f"the full layers' KV heads, not {spec.num_kv_heads} and {full_kv}")
    full = spec.num_layers - spec.sliding_layers
    types = ["full_attention" if i == 0 or (i + 1) % 6 == 0 else "sliding_attention" for i in range(spec.num_layers)]
    if types.count("full_attention") != full:
        types = ["full_attention"] * full + ["sliding_attention"] * spec.sliding_layers
    rope = {"rope_type": "default", "partial_rotary_factor": spec.rotary_dims / spec.head_size}
    config = transformers.MiMoV2FlashConfig(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads, num_key_value_heads=full_kv,
        head_dim=spec.head_size, v_head_dim=spec.value_head_size, max_position_embeddings=spec.max_position_embeddings,
        rms_norm_eps=spec.norm_eps, tie_word_embeddings=spec.tie_word_embeddings,
        moe_intermediate_size=spec.moe_intermediate_size, num_experts_per_tok=spec.num_experts_per_tok,
        n_routed_experts=spec.num_experts, sliding_window_size=spec.sliding_window or 128, layer_types=types,
        mlp_layer_types=["dense"] * spec.dense_layers + ["sparse"] * (spec.num_layers - spec.dense_layers),
        rope_parameters={"full_attention": {**rope, "rope_theta": spec.rope_theta or 5e6},
                         "sliding_attention": {**rope, "rope_theta": 10000.0}})
    config.architectures = ["MiMoV2FlashForCausalLM"]
    return config
