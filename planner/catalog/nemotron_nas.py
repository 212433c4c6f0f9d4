"""NVIDIA's Llama-Nemotron models pruned by neural architecture search (model_type nemotron-nas, architecture
DeciLMForCausalLM): Llama-3.3-Nemotron-Super-49B v1 and v1.5.

Each decoder layer is Llama's, except that its `block_configs` entry may drop the attention (`no_op`: no
input norm, no projections, no KV cache) or the MLP (`no_op`: no post-attention norm either), and gives each
MLP its own width: `ffn_mult` x hidden x 2/3, rounded up to a multiple of 256, or an `intermediate_size` of its
own. Attention layers keep num_attention_heads and take num_attention_heads / n_heads_in_group KV heads. That is
vLLM's DeciLMDecoderLayer (vllm/model_executor/models/nemotron_nas.py), which builds nothing else: a
`replace_with_linear` block is not something it loads, so the planner refuses it.

The planner counts such a model as Nemotron-H's: num_layers attention blocks and ffn_layers MLP blocks, each
behind its one RMSNorm and residual add, and one all-reduce each under TP. block_pattern spells each decoder
layer in two characters, its attention ("*", or "." when dropped) and its MLP ("-", or "."), so a block's
decoder layer is its position over two; mlp_widths lists the MLPs' widths in order.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from planner.errors import PlannerError

NEMOTRON_NAS_TYPES = ("nemotron-nas",)
DROPPED = "."          # a decoder layer's dropped attention or MLP in block_pattern


def ffn_width(ffn_mult: float, hidden: int) -> int:
    """An MLP's width from its ffn_mult, as DeciLM's own code and vLLM's compute it: 2/3 of ffn_mult x hidden,
    truncated, rounded up to a multiple of 256."""
    return -(-int(2 * ffn_mult * hidden / 3) // 256) * 256


def _as_dict(value: Any) -> dict | None:
    """A config.json object, or the fields of the object remote code made of it; None for anything else."""
    if isinstance(value, dict) or value is None:
        return value
    return vars(value) if hasattr(value, "__dict__") else None


def _block(entry: Any, index: int, name: str) -> tuple[dict, dict]:
    """One decoder layer's attention and ffn settings as dicts."""
    entry = _as_dict(entry) or {}
    attention, ffn = _as_dict(entry.get("attention")), _as_dict(entry.get("ffn"))
    if attention is None or ffn is None:
        raise PlannerError(f"model {name!r}: block_configs[{index}] must hold an attention and an ffn object")
    return attention, ffn


def nemotron_nas_fields(get: Callable[..., Any], model_type: str, name: str) -> dict[str, Any]:
    """ModelSpec keyword arguments of a DeciLM config (`get(key, default=None)` reads it)."""
    blocks, layers = get("block_configs"), get("num_hidden_layers")
    if not isinstance(blocks, list) or len(blocks) != layers:
        raise PlannerError(f"model {name!r}: config field block_configs must list each of its {layers} layers")
    hidden, heads = get("hidden_size"), get("num_attention_heads")
    pattern, widths, groups = [], [], set()
    for index, entry in enumerate(blocks):
        attention, ffn = _block(entry, index, name)
        if attention.get("replace_with_linear") or ffn.get("replace_with_linear"):
            raise PlannerError(f"model {name!r}: layer {index} replaces a block with a linear layer, which vLLM's "
                               f"DeciLM does not build")
        if attention.get("no_op"):
            pattern.append(DROPPED)
        else:
            groups.add(attention.get("n_heads_in_group"))
            pattern.append("*")
        if ffn.get("no_op"):
            pattern.append(DROPPED)
            continue
        act = ffn.get("hidden_act") or get("hidden_act") or "silu"
        if act != "silu":
            raise PlannerError(f"model {name!r}: layer {index}'s MLP uses {act!r}; vLLM's Llama MLP runs silu only")
        mult = ffn.get("ffn_mult")
        width = ffn.get("intermediate_size") or (ffn_width(mult, hidden) if isinstance(mult, (int, float))
                                                 and math.isfinite(mult) else None)
        if not isinstance(width, int) or width < 1:
            raise PlannerError(f"model {name!r}: layer {index}'s MLP needs an ffn_mult or an intermediate_size")
        widths.append(width)
        pattern.append("-")
    if not groups or not widths:
        raise PlannerError(f"model {name!r}: a DeciLM model without {'attention' if not groups else 'MLP'} layers "
                           f"is not modelled")
    if len(groups) > 1:
        raise PlannerError(f"model {name!r}: its attention layers differ in n_heads_in_group "
                           f"({', '.join(sorted(map(str, groups)))}); the planner models one KV shape")
    group = groups.pop()
    if not isinstance(group, int) or isinstance(group, bool) or group < 1 or heads % group:
        raise PlannerError(f"model {name!r}: n_heads_in_group must be a positive integer dividing the {heads} "
                           f"attention heads, got {group!r}")
    if get("attention_bias") or get("mlp_bias"):
        raise PlannerError(f"model {name!r}: biased DeciLM projections are not modelled")
    rope = get("rope_parameters") or {}
    theta = (rope.get("rope_theta") if isinstance(rope, dict) else None) or get("rope_theta") or 10000.0
    return dict(
        name=name, model_type=model_type, num_layers=pattern.count("*"), ffn_layers=len(widths),
        block_pattern="".join(pattern), mlp_widths=tuple(widths) if len(set(widths)) > 1 else (),
        hidden_size=hidden, num_heads=heads, num_kv_heads=heads // group,
        head_size=get("head_dim") or hidden // heads, intermediate_size=max(widths),
        vocab_size=get("vocab_size"), max_position_embeddings=get("max_position_embeddings"),
        tie_word_embeddings=bool(get("tie_word_embeddings", False)), rope_theta=float(theta),
        norm_eps=get("rms_norm_eps") or 1e-5)


def _block_configs(spec) -> list[dict]:
    """config.json's block_configs of `spec`: each layer's MLP by its width (intermediate_size, which vLLM
    reads where an entry has no ffn_mult)."""
    widths = iter(spec.mlp_widths or [spec.intermediate_size] * spec.ffn_layers)
    group = spec.num_heads // spec.num_kv_heads
    pattern = spec.block_pattern
    return [{"attention": {"no_op": True} if attention == DROPPED else {"no_op": False, "n_heads_in_group": group},
             "ffn": {"no_op": True} if ffn == DROPPED else {"no_op": False, "intermediate_size": next(widths)}}
            for attention, ffn in zip(pattern[::2], pattern[1::2])]


@lru_cache(maxsize=1)
def _config_class():
    import transformers  # slow import; only the catalog's checks build configs of a model the engine cannot run

    class DeciLMConfig(transformers.PretrainedConfig):
        """config.json's fields as DeciLM's checkpoints write them (transformers has no class of its own)."""
        model_type = NEMOTRON_NAS_TYPES[0]

    return DeciLMConfig


def nemotron_nas_hf_config(spec):
    """A config of `spec` with DeciLM's fields (block_configs), which reads back to `spec`."""
    config = _config_class()(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, num_hidden_layers=len(spec.block_pattern) // 2,
        num_attention_heads=spec.num_heads, head_dim=spec.head_size, hidden_act="silu",
        max_position_embeddings=spec.max_position_embeddings, rms_norm_eps=spec.norm_eps,
        rope_theta=spec.rope_theta, tie_word_embeddings=spec.tie_word_embeddings, block_configs=_block_configs(spec))
    config.architectures = ["DeciLMForCausalLM"]
    return config
