"""Mixtral over the paged KV cache.

Mistral's attention (Llama's, with an optional sliding window on every layer)
and, in every layer, a sparse MoE block instead of the MLP: softmax over the
experts, the top k kept and renormalized to sum to 1, SwiGLU experts
(engine.models.moe). Checkpoints name the experts' matrices w1 (gate), w3
(up) and w2 (down) under ``block_sparse_moe``; transformers 5's own layout
(``mlp.experts.gate_up_proj`` / ``down_proj``, router ``mlp.gate``) is read too.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import torch
from torch import nn

from engine.models.errors import UnsupportedModelError
from engine.models.llama import LlamaAttention, LlamaForCausalLM, RMSNorm
from engine.models.moe import SparseMoeBlock, softmax_top_k
from engine.models.rotary import YARN_ROPE_TYPES
from engine.models.weights import WeightLoader

# Mixtral's names of the expert matrices -> the parts of a SwiGLU expert.
EXPERT_PARTS = {"w1": "gate", "w3": "up", "w2": "down"}


class MixtralDecoderLayer(nn.Module):
    def __init__(self, config, qkv_bias: bool, o_bias: bool, layer: int):
        super().__init__()
        self.self_attn = LlamaAttention(config, qkv_bias, o_bias, layer)
        route = functools.partial(softmax_top_k, top_k=config.num_experts_per_tok, renormalize=True)
        self.mlp = SparseMoeBlock(config.hidden_size, config.intermediate_size, config.num_local_experts,
                                  config.num_experts_per_tok, route)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, cos_sin, hidden, kv_cache, meta) -> torch.Tensor:
        hidden = hidden + self.self_attn(cos_sin, self.input_layernorm(hidden), kv_cache, meta)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class MixtralForCausalLM(LlamaForCausalLM):
    """HF MixtralForCausalLM with paged attention."""

    rope_types = YARN_ROPE_TYPES
    # The MoE block reads its experts' token counts on the host: not capturable.
    cuda_graphs = False

    def __init__(self, config):
        if getattr(config, "hidden_act", "silu") != "silu":
            raise UnsupportedModelError(f"Mixtral activation {config.hidden_act!r} is not supported (only silu is)")
        super().__init__(config)

    def decoder_layer(self, config, qkv_bias: bool, o_bias: bool, layer: int) -> nn.Module:
        return MixtralDecoderLayer(config, qkv_bias, o_bias, layer)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], loader: WeightLoader) -> None:
        """Router and experts here; every Llama-named weight goes on to Llama's loader."""

        def llama_weights():
            for name, tensor in weights:
                parts = name.removeprefix("model.").split(".")
                if parts[0] != "layers" or parts[2] not in ("block_sparse_moe", "mlp"):
                    yield name, tensor
                    continue
                prefix, rest = f"layers.{parts[1]}.", ".".join(parts[3:])
                mlp = self.layers[int(parts[1])].mlp
                if rest == "gate.weight":
                    loader.load(prefix + "mlp.router.weight", tensor)
                elif rest in ("experts.gate_up_proj", "experts.down_proj"):
                    mlp.load_fused(loader, prefix + "mlp.", parts[-1].removesuffix("_proj"), tensor)
                elif len(parts) == 7 and parts[3] == "experts" and parts[5] in EXPERT_PARTS and parts[6] == "weight":
                    # layers.{i}.block_sparse_moe.experts.{e}.w{1,2,3}.weight
                    mlp.load_expert(loader, prefix + "mlp.", int(parts[4]), EXPERT_PARTS[parts[5]], tensor)
                else:
                    loader.unexpected(name)

        super().load_weights(llama_weights(), loader)
