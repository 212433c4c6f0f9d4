"""Vision-language checkpoints whose text decoder the planner prices: Qwen3-VL (dense and MoE), Qwen2.5-VL and
Qwen2-VL, Mistral 3 (Mistral-Small-3.1/3.2, Magistral), LLaVA, GLM-4.5V, Qwen3.5/3.6 (every Qwen3.5 checkpoint),
and Kimi-K2.5/K2.6 (a MoonViT encoder beside Kimi-K2's DeepSeek-V3 decoder).

vLLM loads the vision encoder and its projector beside the decoder and holds them for the whole run, so their
weights count in the memory plan (`vision_params`, sharded with the rest); a text request never runs them, so
nothing else about them is priced. The decoder is read as the architecture it is: Qwen3-VL's text model is
Qwen3's (or Qwen3-MoE's) with multimodal rotary positions (mrope), which change no cost; Qwen2.5-VL's is
Qwen2's; GLM-4.5V's is GLM-4.5-Air's; Kimi-K2.5's is Kimi-K2's; Mistral 3 and LLaVA wrap a plain Mistral,
Llama or Qwen2 config; Qwen3.5's is a Gated DeltaNet hybrid (planner/catalog/linear_attention.py).

The config is read through transformers (AutoConfig), which fills in what a released config.json leaves to
its defaults and moves a flat Qwen2.5-VL config's text fields into its text_config, as vLLM's loader sees
them. The vision weights are counted on the model transformers builds from the same config on the meta
device (no memory) with a one-layer decoder, and so is whether the LM head is tied to the embedding.
(Gemma 3 and Llama 4 keep their own readers: planner/catalog/gemma_config.py, llama4_config.py.)
"""
from __future__ import annotations

import copy
from typing import Any

from planner.errors import PlannerError

MULTIMODAL_TYPES = ("qwen3_vl", "qwen3_vl_moe", "qwen2_5_vl", "qwen2_vl", "mistral3", "llava", "glm4v_moe", "qwen3_5",
                    "qwen3_5_moe", "kimi_k25")
# text_config model_types that name an architecture the planner reads under another name
TEXT_TYPES = {"qwen3_vl_text": "qwen3", "qwen3_vl_moe_text": "qwen3_moe", "qwen2_5_vl_text": "qwen2",
              "qwen2_vl_text": "qwen2", "glm4v_moe_text": "glm4_moe"}


def multimodal_parts(config: dict[str, Any], name: str) -> tuple[dict[str, Any], int]:
    """(the text decoder's config as a dict the planner reads, the vision encoder's and projector's parameters)."""
    import torch  # slow imports: only a vision-language config needs them
    import transformers

    fields = {k: v for k, v in config.items() if k not in ("model_type", "transformers_version")}
    try:
        full = transformers.AutoConfig.for_model(config["model_type"], **fields)
        text = full.get_text_config().to_dict()
        shallow = copy.deepcopy(full)
        decoder = shallow.get_text_config()
        decoder.num_hidden_layers = 1          # the vision tower does not depend on the decoder's depth
        if getattr(decoder, "layer_types", None):
            decoder.layer_types = decoder.layer_types[:1]
        if getattr(decoder, "mlp_only_layers", None):
            decoder.mlp_only_layers = []
        with torch.device("meta"):
            model = transformers.AutoModelForImageTextToText.from_config(shallow)
    except Exception as exc:    # transformers' strict config classes raise their own error types
        raise PlannerError(f"model {name!r}: {' '.join(str(exc).split())}") from None
    params = dict(model.named_parameters())      # a tied LM head is the embedding, listed once
    vision = sum(p.numel() for n, p in params.items() if "language_model" not in n and not n.startswith("lm_head"))
    text["model_type"] = TEXT_TYPES.get(text.get("model_type"), text.get("model_type"))
    text["tie_word_embeddings"] = "lm_head.weight" not in params
    if config.get("quantization_config") is not None:     # a quantized checkpoint's format covers its decoder
        text.setdefault("quantization_config", config["quantization_config"])
    return text, vision
