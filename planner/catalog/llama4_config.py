"""Reading a Llama 4 config.json (model_type llama4, or llama4_text for the decoder alone) into ModelSpec fields.

Llama 4 Scout and Maverick (transformers' Llama4Config): Llama's attention (40 heads, 8 KV heads of 128) and a
mixture of experts with one token-choice expert (top-1 of num_local_experts, each intermediate_size wide) plus a
shared expert of the same width on every MoE layer; every interleave_moe_layer_step-th layer is a MoE (Scout:
all 48, Maverick: every second), the others a dense MLP of intermediate_size_mlp. Three layers in four attend
within chunks of attention_chunk_size (8,192) tokens with rotary, every fourth to the whole context without
(no_rope_layers, layer_types' "chunked_attention"). A chunked layer's query sees at most the chunk's keys
before it, and vLLM's chunked-local KV manager keeps at most a chunk of them, so those layers are priced and
planned as sliding-window layers of the chunk's size: exact up to 8,192 tokens, beyond it an upper bound
(a chunk's query sees its position in the chunk, a window's the whole window). The q/k L2 norms have no
weights and are not priced. Both checkpoints are multimodal; vLLM loads the vision encoder and projector
with the decoder, so their weights are counted (`vision_params`) and nothing else about them is priced.
"""
from __future__ import annotations

from typing import Any

from planner.errors import PlannerError

LLAMA4_TYPES = ("llama4_text",)                 # what ModelSpec stores; a llama4 config.json is read into it
LLAMA4_CONFIG_TYPES = ("llama4", "llama4_text")
FULL_ATTENTION_EVERY = 4                        # Llama 4: layers 4, 8, ... attend to everything, without rotary


def _getter(config: Any):
    return config.get if isinstance(config, dict) else (lambda key, default=None: getattr(config, key, default))


def _layer_types(get, layers: int) -> list[str]:
    types = list(get("layer_types") or [])
    if types:
        return types
    rope = list(get("no_rope_layers") or [])
    if rope:
        return ["chunked_attention" if uses_rope else "full_attention" for uses_rope in rope]
    return ["full_attention" if (i + 1) % FULL_ATTENTION_EVERY == 0 else "chunked_attention" for i in range(layers)]


def vision_params(config: Any) -> int:
    """The vision encoder's and projector's parameters of a multimodal Llama 4 config (0 without one), counted
    from the model transformers builds on the meta device (no memory)."""
    get = _getter(config)
    vision = get("vision_config")
    if not vision:
        return 0
    import torch  # only a multimodal Llama 4 config.json needs the model built
    import transformers

    try:
        full = transformers.Llama4Config(**{k: v for k, v in config.items() if k not in ("model_type",
                                                                                          "transformers_version")}) \
            if isinstance(config, dict) else config
        with torch.device("meta"):
            encoder = transformers.Llama4VisionModel(full.vision_config)
            projector = transformers.models.llama4.modeling_llama4.Llama4MultiModalProjector(full)
    except Exception as exc:    # transformers' strict config classes raise their own error types
        raise PlannerError(f"Llama 4 vision_config: {' '.join(str(exc).split())}") from None
    return sum(p.numel() for module in (encoder, projector) for p in module.parameters())


def llama4_fields(config: Any, name: str) -> dict[str, Any]:
    """ModelSpec fields of a Llama 4 config (the decoder's shapes, its chunked layers, the vision weights)."""
    get = _getter(config)
    text = get("text_config") if get("model_type") == "llama4" else config
    if not text:
        raise PlannerError(f"model {name!r}: a llama4 config needs a text_config")
    tget = _getter(text)
    layers, hidden, heads = tget("num_hidden_layers"), tget("hidden_size"), tget("num_attention_heads")
    for key, value in (("num_hidden_layers", layers), ("hidden_size", hidden), ("num_attention_heads", heads)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise PlannerError(f"model {name!r}: config field {key} must be a positive integer, got {value!r}")
    step = tget("interleave_moe_layer_step") or 1
    moe_layers = tget("moe_layers")
    if moe_layers is None:
        moe_layers = list(range(step - 1, layers, step))
    chunk = tget("attention_chunk_size")
    chunked = sum(t == "chunked_attention" for t in _layer_types(tget, layers)[:layers]) if chunk else 0
    rope = tget("rope_parameters") or {}
    theta = (rope.get("rope_theta") if isinstance(rope, dict) else None) or tget("rope_theta") or 500000.0
    return dict(
        name=name, model_type="llama4_text", num_layers=layers, hidden_size=hidden, num_heads=heads,
        num_kv_heads=tget("num_key_value_heads") or heads, head_size=tget("head_dim") or hidden // heads,
        intermediate_size=tget("intermediate_size_mlp"), vocab_size=tget("vocab_size"),
        max_position_embeddings=tget("max_position_embeddings"),
        tie_word_embeddings=bool(get("tie_word_embeddings", False)), rope_theta=float(theta),
        norm_eps=tget("rms_norm_eps", 1e-5), num_experts=tget("num_local_experts"),
        num_experts_per_tok=tget("num_experts_per_tok"), moe_intermediate_size=tget("intermediate_size"),
        dense_layers=layers - len(set(moe_layers) & set(range(layers))), shared_experts=1,
        sliding_window=chunk if chunked else None, sliding_layers=chunked,
        vision_params=vision_params(config) if get("model_type") == "llama4" else 0)


def llama4_hf_config(spec, common: dict[str, Any]):
    """The decoder's transformers config (Llama4TextConfig) with the spec's shapes and layer pattern."""
    import transformers  # slow import; only the profiler and the engine need configs

    layers = spec.num_layers
    step = layers // spec.moe_layers if spec.moe_layers else layers + 1
    full_layers = layers - spec.sliding_layers
    every = layers // full_layers if full_layers else layers + 1
    types = ["full_attention" if (i + 1) % every == 0 else "chunked_attention" for i in range(layers)]
    common = {**common, "intermediate_size": spec.moe_intermediate_size}
    config = transformers.Llama4TextConfig(
        intermediate_size_mlp=spec.intermediate_size, num_local_experts=spec.num_experts,
        num_experts_per_tok=spec.num_experts_per_tok, interleave_moe_layer_step=step,
        moe_layers=list(range(step - 1, layers, step)), attention_chunk_size=spec.sliding_window or 8192,
        layer_types=types, no_rope_layers=[int(t == "chunked_attention") for t in types], **common)
    config.architectures = ["Llama4ForCausalLM"]
    return config
