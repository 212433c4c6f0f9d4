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

import torch
from torch import nn

from engine.models.errors import UnsupportedModelError
from engine.models.llama import DecoderLayer, LlamaAttention, LlamaForCausalLM
from engine.models.moe import SparseMoeBlock, softmax_top_k
from engine.models.rotary import YARN_ROPE_TYPES
from engine.models.weights import WeightLoader

# Mixtral's names of the expert matrices -> the parts of a SwiGLU expert.
EXPERT_PARTS = {"w1": "gate", "w3": "up", "w2": "down"}


def mixtral_moe_block(config) -> SparseMoeBlock:
    """Softmax over the experts, the top k kept and renormalized, SwiGLU experts."""
    route = functools.partial(softmax_top_k, top_k=config.num_experts_per_tok, renormalize=True)
    return SparseMoeBlock(config.hidden_size, config.intermediate_size, config.num_local_experts,
                          config.num_experts_per_tok, route)


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
        return DecoderLayer(LlamaAttention(config, qkv_bias, o_bias, layer), mixtral_moe_block(config), config)

    def load_own_layer_weight(self, name: str, parts: list[str], tensor: torch.Tensor, loader: WeightLoader) -> bool:
        """Router and experts here; every Llama-named weight goes on to Llama's loader."""
        if parts[2] not in ("block_sparse_moe", "mlp"):
            return False
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
        return True
