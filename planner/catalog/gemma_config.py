"""Reading a Gemma 3 config.json (model_type gemma3, or gemma3_text for the text-only 1B) or a Gemma 2 one (gemma2)
into ModelSpec fields.

Gemma 3's decoder is Llama's block with four RMSNorms a layer (before and after attention, before and after the
MLP), per-head q/k norms, a GELU-tanh gated MLP, tied embeddings and five sliding-window layers (window 512-1024)
to every full one, whose KV cache vLLM's hybrid allocator keeps to the window. The 4B, 12B and 27B checkpoints are
multimodal (Gemma3ForConditionalGeneration): a SigLIP vision encoder and a projector sit beside the decoder. vLLM
loads them with it, so their weights are counted (`vision_params`); a text request never runs them, so nothing
else about them is priced.

Gemma 2 is the same block without the q/k norms, with every other layer sliding (window 4,096, the first
one sliding) and one RoPE base, and soft-caps its attention logits (50 x tanh(s / 50)) and final logits. vLLM
runs the attention cap inside its FlashAttention/FlashInfer kernels, a few operations per score; the
measured tables time attention without it, so the cap is not priced.

The released config.json files list only what differs from transformers' defaults (the 4B's text_config names
neither its heads nor its vocabulary), so a config is read through transformers' Gemma3Config, which fills them
in as vLLM's loader does.
"""
from __future__ import annotations

from typing import Any

from planner.errors import PlannerError

GEMMA_TYPES = ("gemma3_text", "gemma2")       # what ModelSpec stores; a gemma3 config.json is read into gemma3_text
GEMMA_CONFIG_TYPES = ("gemma3", "gemma3_text", "gemma2")
FULL_ATTENTION_EVERY = 6                     # Gemma 3: layers 6, 12, ... attend to everything, the others slide


def _transformers_config(config: Any, name: str):
    """`config` (a config.json dict or a transformers config) with transformers' defaults filled in."""
    if not isinstance(config, dict):
        return config
    import transformers  # slow import; only a Gemma config needs it

    fields = {k: v for k, v in config.items() if k not in ("model_type", "transformers_version")}
    try:
        if config.get("model_type") == "gemma3":
            return transformers.Gemma3Config(**fields)
        if config.get("model_type") == "gemma2":
            return transformers.Gemma2Config(**fields)
        return transformers.Gemma3TextConfig(**fields)
    except Exception as exc:    # transformers' strict config classes raise their own error types
        raise PlannerError(f"model {name!r}: {' '.join(str(exc).split())}") from None


def siglip_params(vision, text_hidden: int) -> int:
    """A SigLIP vision tower's parameters (patch and position embeddings, encoder layers with biased linears
    and LayerNorms, the final LayerNorm, the attention-pooling head when `vision_use_head`), plus Gemma 3's
    projector into the text width (a matrix and an RMSNorm)."""
    h, i = vision.hidden_size, vision.intermediate_size
    layer = 4 * (h * h + h) + 2 * h * i + i + h + 2 * (2 * h)
    patches = (vision.image_size // vision.patch_size) ** 2
    embeddings = vision.num_channels * vision.patch_size ** 2 * h + h + patches * h
    # the pooling head: a probe, multi-head attention (in and out projections), a LayerNorm and an MLP
    head = h + 3 * (h * h + h) + (h * h + h) + 2 * h + 2 * h * i + i + h
    if not getattr(vision, "vision_use_head", True):
        head = 0
    projector = h * text_hidden + h
    return vision.num_hidden_layers * layer + embeddings + 2 * h + head + projector


def gemma_fields(config: Any, name: str) -> dict[str, Any]:
    """ModelSpec fields of a Gemma 3 config (the decoder's shapes, its sliding layers, the vision weights)."""
    full = _transformers_config(config, name)
    text = getattr(full, "text_config", None) or full
    vision = getattr(full, "vision_config", None) if text is not full else None
    layers = text.num_hidden_layers
    types = list(getattr(text, "layer_types", None) or [])
    if not types:
        types = ["full_attention" if (i + 1) % FULL_ATTENTION_EVERY == 0 else "sliding_attention"
                 for i in range(layers)]
    rope = getattr(text, "rope_parameters", None) or {}
    full_rope = rope.get("full_attention", rope) if isinstance(rope, dict) else {}
    window = text.sliding_window
    return dict(
        name=name, model_type="gemma2" if text.model_type == "gemma2" else "gemma3_text", num_layers=layers, hidden_size=text.hidden_size,
        num_heads=text.num_attention_heads, num_kv_heads=text.num_key_value_heads, head_size=text.head_dim,
        intermediate_size=text.intermediate_size, vocab_size=text.vocab_size,
        max_position_embeddings=text.max_position_embeddings,
        tie_word_embeddings=bool(getattr(full, "tie_word_embeddings", True)),
        rope_theta=float(full_rope.get("rope_theta") or getattr(text, "rope_theta", None) or 1e6),
        norm_eps=text.rms_norm_eps, sliding_window=window,
        sliding_layers=sum(t == "sliding_attention" for t in types) if window else 0,
        vision_params=siglip_params(vision, text.hidden_size) if vision is not None else 0)


def gemma_hf_config(spec, common: dict[str, Any]):
    """The text decoder's transformers config (what the profiler and the engine build; a multimodal
    checkpoint's vision tower is not part of a text step)."""
    import transformers  # slow import; only the profiler and the engine need configs

    full_layers = spec.num_layers - spec.sliding_layers
    every = spec.num_layers // full_layers if full_layers else 0      # Gemma 3's 6: layers 6, 12, ... are full
    full_at = {every * k - 1 for k in range(1, full_layers + 1)}
    types = ["full_attention" if i in full_at else "sliding_attention" for i in range(spec.num_layers)]
    if spec.model_type == "gemma2":          # one RoPE base for both kinds of layer
        config = transformers.Gemma2Config(sliding_window=spec.sliding_window or 4096, layer_types=types,
                                           query_pre_attn_scalar=spec.head_size, **common)
        config.architectures = ["Gemma2ForCausalLM"]
        return config
    local = {"rope_type": "default", "rope_theta": 10000.0}
    common = {**common, "rope_parameters": {"full_attention": common["rope_parameters"], "sliding_attention": local}}
    config = transformers.Gemma3TextConfig(sliding_window=spec.sliding_window or 4096, layer_types=types,
                                           query_pre_attn_scalar=spec.head_size, **common)
    config.architectures = ["Gemma3ForCausalLM"]
    return config
