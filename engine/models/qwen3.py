"""Qwen3 and Qwen3-MoE over the paged KV cache.

Llama's layout (engine.models.llama) with two differences:

- q_norm / k_norm: each head's query and key vector goes through its own
  RMSNorm (weights [head_dim], shared by the heads) before rotary. It keeps
  attention logits bounded, which is why Qwen3 has no q/k/v biases.
- Qwen3-MoE: a layer's MLP is a sparse MoE block (engine.models.moe; softmax
  over all experts, top k, renormalized when ``norm_topk_prob``) unless the
  layer is in ``mlp_only_layers`` or not every ``decoder_sparse_step``-th
  layer; the other layers keep a dense SwiGLU MLP of ``intermediate_size``.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from engine.attention import AttentionMetadata
from engine.models.errors import UnsupportedModelError
from engine.models.llama import DecoderLayer, LlamaAttention, LlamaForCausalLM, LlamaMLP, RMSNorm
from engine.models.moe import SparseMoeBlock, softmax_top_k
from engine.models.rotary import YARN_ROPE_TYPES, RotaryEmbedding
from engine.models.weights import WeightLoader


class Qwen3Attention(LlamaAttention):
    def __init__(self, config, qkv_bias: bool, o_bias: bool, layer: int):
        super().__init__(config, qkv_bias, o_bias, layer)
        self.q_norm = RMSNorm(self.head_size, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_size, config.rms_norm_eps)

    def forward(self, cos_sin, hidden, kv_cache, meta: AttentionMetadata) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = self.q_norm(q.reshape(-1, self.num_heads, self.head_size))
        k = self.k_norm(k.reshape(-1, self.num_kv_heads, self.head_size))
        q, k = RotaryEmbedding.apply(cos_sin, q, k)
        out = self.attn(q.reshape(-1, self.q_size), k.reshape(-1, self.kv_size), v, kv_cache, meta)
        return self.o_proj(out)


def is_sparse_layer(config, layer: int) -> bool:
    """transformers' rule for which Qwen3-MoE layers carry experts."""
    num_experts = getattr(config, "num_experts", 0) or 0
    step = getattr(config, "decoder_sparse_step", 1) or 1
    return layer not in (getattr(config, "mlp_only_layers", None) or []) and num_experts > 0 and (layer + 1) % step == 0


def qwen3_moe_block(config) -> SparseMoeBlock:
    route = functools.partial(softmax_top_k, top_k=config.num_experts_per_tok, renormalize=config.norm_topk_prob)
    return SparseMoeBlock(config.hidden_size, config.moe_intermediate_size, config.num_experts,
                          config.num_experts_per_tok, route)


def qwen3_mlp(config, layer: int) -> nn.Module:
    """The layer's MLP: a sparse MoE block where Qwen3-MoE puts experts, else dense SwiGLU."""
    sparse = config.model_type == "qwen3_moe" and is_sparse_layer(config, layer)
    return qwen3_moe_block(config) if sparse else LlamaMLP(config)


class Qwen3ForCausalLM(LlamaForCausalLM):
    """HF Qwen3ForCausalLM and Qwen3MoeForCausalLM with paged attention."""

    rope_types = YARN_ROPE_TYPES

    def __init__(self, config):
        if getattr(config, "hidden_act", "silu") != "silu":
            raise UnsupportedModelError(f"Qwen3 activation {config.hidden_act!r} is not supported (only silu is)")
        super().__init__(config)
        # The MoE block reads its experts' token counts on the host: not capturable.
        self.cuda_graphs = not any(isinstance(layer.mlp, SparseMoeBlock) for layer in self.layers)

    def decoder_layer(self, config, qkv_bias: bool, o_bias: bool, layer: int) -> nn.Module:
        return DecoderLayer(Qwen3Attention(config, qkv_bias, o_bias, layer), qwen3_mlp(config, layer), config)

    def load_own_layer_weight(self, name: str, parts: list[str], tensor: torch.Tensor, loader: WeightLoader) -> bool:
        """q/k norms and experts here; every Llama-named weight goes on to Llama's loader."""
        prefix, rest = f"layers.{parts[1]}.", ".".join(parts[2:])
        mlp = self.layers[int(parts[1])].mlp
        if rest in ("self_attn.q_norm.weight", "self_attn.k_norm.weight"):
            loader.load(prefix + rest, tensor)
        elif not (isinstance(mlp, SparseMoeBlock) and rest.startswith("mlp.")):
            return False
        elif rest == "mlp.gate.weight":
            loader.load(prefix + "mlp.router.weight", tensor)
        elif rest in ("mlp.experts.gate_up_proj", "mlp.experts.down_proj"):
            # transformers 5's fused layout: [E, 2I, H] (gate rows, then up) and [E, H, I].
            mlp.load_fused(loader, prefix + "mlp.", parts[-1].removesuffix("_proj"), tensor)
        elif len(parts) == 7 and parts[2:4] == ["mlp", "experts"] and parts[6] == "weight" \
                and parts[5] in ("gate_proj", "up_proj", "down_proj"):
            # layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight: what save_pretrained writes.
            mlp.load_expert(loader, prefix + "mlp.", int(parts[4]), parts[5].removesuffix("_proj"), tensor)
        else:
            loader.unexpected(name)
        return True
