"""Reading a Gemma 4 config.json (model_type gemma4, or gemma4_text for a text-only one) into ModelSpec fields.

Gemma 4 keeps Gemma 3's block (four RMSNorms a layer, GELU-tanh gated MLP, tied and scaled embedding, five
sliding-window layers to every full one) and gives its two kinds of layer their own attention
(vllm/model_executor/models/gemma4.py, transformers' modeling_gemma4.py):

- sliding layers: `head_dim` (256) wide heads, `num_key_value_heads` KV heads, a `sliding_window` of 1,024;
- full layers: `global_head_dim` (512) wide heads, and with `attention_k_eq_v` `num_global_key_value_heads`
  KV heads (else `num_key_value_heads`; transformers 5 writes both into `per_layer_config`). With
  `attention_k_eq_v` a full layer has no v_proj: its key is also
  its value. vLLM still builds one QKV projection with a V slot and loads the K weights into it, so such a
  layer holds and multiplies a V projection the checkpoint does not have, and caches K and V like the
  others (`GlobalAttention`; the parameter counts are the checkpoint's, the memory plan and the GEMMs
  vLLM's);
- q, k and v are RMS-normalized per head (v without a weight); the full layers' proportional rotary
  rotates a quarter of each head but is applied over the whole head (the other angles are zero), so the
  rotary kernel and its table cover head_dim.

The MoE model (26B-A4B, `enable_moe_block`) runs on every layer both the dense MLP (`intermediate_size`)
and, beside it on the same input, `num_experts` experts of `moe_intermediate_size` (top `top_k_experts`),
summed after their own RMSNorms. Its router normalizes its input without a weight and scales it per
dimension (`router.scale`), and scales each chosen expert's output (`per_expert_scale`); three more
RMSNorms a layer (pre-feedforward 2, post-feedforward 1 and 2). The planner holds the dense MLP as the
layer's shared expert of `intermediate_size` (ModelSpec.shared_expert_width). Under TP the MLP's down
projection and the experts all-reduce apart (RowParallelLinear, FusedMoE with reduce_results): three
all-reduces a layer, not DeepSeek's two.

The vision tower (Gemma4VisionModel: patch embedder with a 2-D position table, encoder layers with q/k
norms and a GELU-tanh gated MLP, and the projector into the text width) is loaded with the decoder and never
run by a text request (`vision_params`). The small E2B and E4B models (per-layer input embeddings, KV shared
by their last layers, double-wide MLPs) are refused in one line: none of that is modelled.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from planner.errors import PlannerError

GEMMA4_TYPES = ("gemma4_text",)              # what ModelSpec stores; a gemma4 config.json is read into gemma4_text
GEMMA4_CONFIG_TYPES = ("gemma4", "gemma4_text")


@dataclass(frozen=True, slots=True)
class GlobalAttention:
    """The full-attention layers' own attention shape (Gemma 4), where it differs from the sliding layers'."""

    head_size: int
    kv_heads: int
    k_eq_v: bool = False          # no v_proj in the checkpoint: vLLM loads the key's weights as the value's

    def __post_init__(self) -> None:
        for name in ("head_size", "kv_heads"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise PlannerError(f"global attention: {name} must be a positive integer, got {value!r}")


def vision_params(vision: dict[str, Any], text_hidden: int) -> int:
    """Gemma 4's vision tower and projector: per encoder layer q, k, v, o (hidden x hidden), a gated MLP,
    four RMSNorms and the q/k norms; the patch embedder's input projection (3 x patch^2 pixels) and its
    position table (two axes of position_embedding_size rows); the projector into the text width."""
    h, i = vision["hidden_size"], vision["intermediate_size"]
    head = vision.get("head_dim") or h // vision["num_attention_heads"]
    layer = 4 * h * h + 3 * h * i + 4 * h + 2 * head
    patch = vision.get("patch_size", 16)
    embedder = 3 * patch * patch * h + 2 * vision.get("position_embedding_size", 10240) * h
    return vision["num_hidden_layers"] * layer + embedder + h * text_hidden


def _full_layer_shape(text: dict[str, Any], full_at: int, k_eq_v: bool) -> tuple[int, int]:
    """(head size, KV heads) of the full-attention layers: config.json's global_head_dim, and its
    num_global_key_value_heads where the key is the value (else num_key_value_heads, as vLLM and
    transformers read them); or the per_layer_config entry transformers 5 writes for a full layer."""
    per_layer = text.get("per_layer_config") or {}
    entry = per_layer.get(f"{full_at:02d}") or per_layer.get(str(full_at)) or {}
    head = entry.get("head_dim") or text.get("global_head_dim") or text.get("head_dim")
    kv = entry.get("num_key_value_heads") or (k_eq_v and text.get("num_global_key_value_heads")
                                              or text.get("num_key_value_heads"))
    return head, kv


def gemma4_fields(config: dict[str, Any], name: str) -> dict[str, Any]:
    """ModelSpec fields of a Gemma 4 config.json (gemma4 with its text_config, or gemma4_text)."""
    text = config.get("text_config") or config if config.get("model_type") == "gemma4" else config
    if not isinstance(text, dict):
        raise PlannerError(f"model {name!r}: a gemma4 config needs a text_config object")
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"):
        value = text.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise PlannerError(f"model {name!r}: config field {key} must be a positive integer, got {value!r}")
    unmodelled = [what for what, on in (
        ("per-layer input embeddings (hidden_size_per_layer_input)", text.get("hidden_size_per_layer_input")),
        ("KV shared across layers (num_kv_shared_layers)", text.get("num_kv_shared_layers")),
        ("double-wide MLPs (use_double_wide_mlp)", text.get("use_double_wide_mlp"))) if on]
    if unmodelled:
        raise PlannerError(f"model {name!r}: Gemma 4 with {' and '.join(unmodelled)} (the E2B and E4B models) "
                           f"is not modelled; the 26B-A4B and 31B models are")
    layers = text["num_hidden_layers"]
    types = list(text.get("layer_types") or [])
    if len(types) != layers or set(types) - {"sliding_attention", "full_attention"}:
        raise PlannerError(f"model {name!r}: layer_types must name sliding_attention or full_attention for each "
                           f"of its {layers} layers")
    window = text.get("sliding_window")
    sliding = types.count("sliding_attention") if window else 0
    head, kv = text.get("head_dim") or 256, text.get("num_key_value_heads")
    k_eq_v = bool(text.get("attention_k_eq_v"))
    full_head, full_kv = (_full_layer_shape(text, types.index("full_attention"), k_eq_v)
                          if "full_attention" in types else (head, kv))
    moe = bool(text.get("enable_moe_block"))
    rope = text.get("rope_parameters") or {}
    full_rope = rope.get("full_attention", {}) if isinstance(rope, dict) else {}
    fields = dict(
        name=name, model_type="gemma4_text", num_layers=layers, hidden_size=text["hidden_size"],
        num_heads=text["num_attention_heads"], num_kv_heads=kv, head_size=head,
        intermediate_size=text["intermediate_size"], vocab_size=text["vocab_size"],
        max_position_embeddings=text.get("max_position_embeddings") or 131072,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", True))),
        rope_theta=float(full_rope.get("rope_theta") or 1e6), norm_eps=text.get("rms_norm_eps", 1e-6),
        sliding_window=window, sliding_layers=sliding,
        global_attention=(GlobalAttention(full_head, full_kv, k_eq_v)
                          if (full_head, full_kv, k_eq_v) != (head, kv, False) else None))
    if moe:
        fields.update(num_experts=text.get("num_experts") or 0, num_experts_per_tok=text.get("top_k_experts") or 0,
                      moe_intermediate_size=text.get("moe_intermediate_size") or text.get("expert_intermediate_size")
                      or 0)
    vision = config.get("vision_config") if config.get("model_type") == "gemma4" else None
    if isinstance(vision, dict):
        fields["vision_params"] = vision_params(vision, text["hidden_size"])
    return fields


def gemma4_hf_config(spec):
    """The text decoder's transformers config (Gemma4TextConfig), as config.json writes it."""
    import transformers  # slow import; only the catalog's checks build configs of a model the engine cannot run

    every = spec.num_layers // max(1, spec.num_layers - spec.sliding_layers)
    types = ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(spec.num_layers)]
    g = spec.global_attention
    fields = dict(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_size, global_head_dim=g.head_size if g else spec.head_size,
        num_global_key_value_heads=g.kv_heads if g else spec.num_kv_heads, attention_k_eq_v=bool(g and g.k_eq_v),
        max_position_embeddings=spec.max_position_embeddings, rms_norm_eps=spec.norm_eps,
        tie_word_embeddings=spec.tie_word_embeddings, sliding_window=spec.sliding_window or 1024,
        layer_types=types, hidden_size_per_layer_input=0, num_kv_shared_layers=0,
        enable_moe_block=spec.is_moe)
    if spec.is_moe:
        fields.update(num_experts=spec.num_experts, top_k_experts=spec.num_experts_per_tok,
                      moe_intermediate_size=spec.moe_intermediate_size)
    config = transformers.Gemma4TextConfig(**fields)
    config.architectures = ["Gemma4ForCausalLM"]
    return config
