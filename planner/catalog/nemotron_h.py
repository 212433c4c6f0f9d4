"""NVIDIA's Nemotron-H hybrids (model_type nemotron_h): Nemotron-H 8B/47B/56B, Nemotron Nano 2, and the
Nemotron 3 mixtures of experts (Nano 30B-A3B, Super 120B-A12B, Ultra 550B-A55B).

Unlike the other families, each block holds one thing behind its one RMSNorm and residual add: a Mamba-2
mixer ("M", planner/catalog/mamba.py), grouped-query attention without rotary embedding ("*"), a dense
MLP ("-") or a mixture of experts ("E"). hybrid_override_pattern spells the blocks in order, one character
each (transformers 5 reads it into layers_block_type: linear_attention, full_attention, mlp, moe). The
planner counts them as num_layers mixer blocks (attention and Mamba-2; linear_attention.layers of them
Mamba-2) and ffn_layers MLP blocks (dense_layers of them dense when the model has experts).

The MLPs are not gated: up, squared ReLU, down. A MoE block routes each token to num_experts_per_tok of
n_routed_experts such MLPs (moe_intermediate_size wide) by a sigmoid router, beside one always-on shared
MLP (moe_shared_expert_intermediate_size). Nemotron 3 Super and Ultra run the routed experts in a smaller
space: fc1_latent_proj takes each token down to moe_latent_size, the experts work there, fc2_latent_proj
brings their sum back (transformers' NemotronHMoE). The multi-token-prediction layers
(num_nextn_predict_layers) are loaded only when they draft, so they are not counted.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from planner.catalog.linear_attention import STATE_DTYPE_NAMES, state_dtype_bytes
from planner.catalog.mamba import Mamba2
from planner.catalog.moe_config import shared_expert_count
from planner.catalog.quantization import checkpoint_scheme
from planner.errors import PlannerError

NEMOTRON_H_TYPES = ("nemotron_h",)
_BLOCKS = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}


def block_types(get: Callable[..., Any], name: str) -> list[str]:
    """Each block's type, from layers_block_type (transformers 5) or hybrid_override_pattern (config.json)."""
    types = get("layers_block_type")
    if types is None:
        pattern = get("hybrid_override_pattern")
        if not isinstance(pattern, str) or not pattern or set(pattern) - set(_BLOCKS):
            raise PlannerError(f"model {name!r}: hybrid_override_pattern must be a string of M, *, - and E, "
                               f"got {pattern!r}")
        types = [_BLOCKS[c] for c in pattern]
    legacy = {"mamba": "linear_attention", "attention": "full_attention"}     # older configs' names
    types = [legacy.get(t, t) for t in types] if isinstance(types, list) else types
    if not isinstance(types, list) or not types or set(types) - set(_BLOCKS.values()):
        raise PlannerError(f"model {name!r}: layers_block_type must list mamba/linear_attention, attention/"
                           f"full_attention, mlp and moe blocks, got {types!r}")
    return types


def nemotron_h_fields(get: Callable[..., Any], model_type: str, name: str) -> dict[str, Any]:
    """ModelSpec keyword arguments of a Nemotron-H config (`get(key, default=None)` reads it)."""
    types = block_types(get, name)
    mamba, attention = types.count("linear_attention"), types.count("full_attention")
    dense, moe = types.count("mlp"), types.count("moe")
    if not attention:
        raise PlannerError(f"model {name!r}: a Nemotron-H model without attention blocks is not modelled")
    hidden, heads = get("hidden_size"), get("num_attention_heads")
    mixer = Mamba2(layers=mamba, heads=get("mamba_num_heads"), head_dim=get("mamba_head_dim"),
                   groups=get("n_groups") or get("mamba_n_groups"), state_size=get("ssm_state_size"),
                   conv_kernel=get("conv_kernel") or get("mamba_d_conv"),
                   # transformers' NemotronHConfig defaults mamba_ssm_cache_dtype to float32
                   state_dtype_bytes=state_dtype_bytes(get("mamba_ssm_cache_dtype") or "float32",
                                                       "mamba_ssm_cache_dtype", name),
                   conv_bias=bool(get("use_conv_bias", True))) if mamba else None
    if any(get(key) for key in ("use_bias", "mlp_bias", "attention_bias", "mamba_proj_bias")):
        raise PlannerError(f"model {name!r}: biased Nemotron-H projections are not modelled")
    if get("mlp_hidden_act", "relu2") != "relu2":
        raise PlannerError(f"model {name!r}: Nemotron-H MLPs with {get('mlp_hidden_act')!r} are not modelled "
                           f"(squared ReLU is)")
    fields: dict[str, Any] = dict(
        name=name, model_type=model_type, num_layers=mamba + attention, ffn_layers=dense + moe,
        block_pattern="".join({v: k for k, v in _BLOCKS.items()}[t] for t in types),
        hidden_size=hidden, num_heads=heads, num_kv_heads=get("num_key_value_heads") or heads,
        head_size=get("head_dim") or get("attention_head_dim") or hidden // heads,
        intermediate_size=get("intermediate_size"), vocab_size=get("vocab_size"),
        max_position_embeddings=get("max_position_embeddings"),
        tie_word_embeddings=bool(get("tie_word_embeddings", False)),
        norm_eps=get("layer_norm_epsilon") or get("rms_norm_eps") or 1e-5, linear_attention=mixer)
    if moe:
        width = get("moe_intermediate_size")
        # vLLM's NemotronHMoE: one shared MLP n_shared_experts x moe_shared_expert_intermediate_size wide
        copies = 1 if get("n_shared_experts") is None else get("n_shared_experts")
        if not isinstance(copies, int) or isinstance(copies, bool) or copies < 0:
            raise PlannerError(f"model {name!r}: n_shared_experts must be a count, got {copies!r}")
        shared = (get("moe_shared_expert_intermediate_size") or 0) * copies
        fields.update(num_experts=get("n_routed_experts") or get("num_local_experts"),
                      num_experts_per_tok=get("num_experts_per_tok"), moe_intermediate_size=width,
                      dense_layers=dense, moe_latent_size=get("moe_latent_size") or 0,
                      shared_experts=shared_expert_count(width, shared, name))
    scheme = checkpoint_scheme(get("quantization_config"))
    if scheme is not None:
        fields["checkpoint_quantization"] = scheme
    return fields


def nemotron_h_hf_config(spec):
    """A transformers config of a Nemotron-H model with its true shapes and block order."""
    import transformers  # slow import; only the profiler, the engine and the tests build configs

    mixer = spec.linear_attention
    fields = dict(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size,
        layers_block_type=[_BLOCKS[c] for c in spec.block_pattern], num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads, head_dim=spec.head_size, intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_position_embeddings, tie_word_embeddings=spec.tie_word_embeddings,
        layer_norm_epsilon=spec.norm_eps)
    if mixer is not None:
        fields.update(mamba_num_heads=mixer.heads, mamba_head_dim=mixer.head_dim, n_groups=mixer.groups,
                      ssm_state_size=mixer.state_size, conv_kernel=mixer.conv_kernel, use_conv_bias=mixer.conv_bias,
                      mamba_ssm_cache_dtype=STATE_DTYPE_NAMES[mixer.state_dtype_bytes])
    if spec.is_moe:
        fields.update(n_routed_experts=spec.num_experts, num_experts_per_tok=spec.num_experts_per_tok,
                      moe_intermediate_size=spec.moe_intermediate_size,
                      moe_shared_expert_intermediate_size=spec.shared_experts * spec.moe_intermediate_size,
                      moe_latent_size=spec.moe_latent_size or None)
    config = transformers.NemotronHConfig(**fields)
    config.architectures = ["NemotronHForCausalLM"]
    return config
