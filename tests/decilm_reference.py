"""A DeciLM (nemotron-nas) model built from transformers' Llama parts, which transformers has no class for:
each layer's attention with its input norm unless dropped, and its SwiGLU MLP at its own width with its
post-attention norm unless dropped (DeciLM's modeling code, and vLLM's DeciLMDecoderLayer)."""
from __future__ import annotations

import copy

import transformers
from torch import nn
from transformers.models.llama import modeling_llama


def decilm_model(config) -> nn.Module:
    """The model a DeciLM config describes (build it under `torch.device("meta")` to count parameters)."""
    h, heads = config.hidden_size, config.num_attention_heads
    base = transformers.LlamaConfig(hidden_size=h, num_attention_heads=heads, head_dim=config.head_dim,
                                    vocab_size=config.vocab_size, attention_bias=False, mlp_bias=False)
    layers = []
    for block in config.block_configs:
        parts = []
        if not block["attention"]["no_op"]:
            layer = copy.copy(base)
            layer.num_key_value_heads = heads // block["attention"]["n_heads_in_group"]
            parts += [modeling_llama.LlamaRMSNorm(h), modeling_llama.LlamaAttention(layer, layer_idx=0)]
        if not block["ffn"]["no_op"]:
            layer = copy.copy(base)
            layer.intermediate_size = block["ffn"]["intermediate_size"]
            parts += [modeling_llama.LlamaRMSNorm(h), modeling_llama.LlamaMLP(layer)]
        layers.append(nn.ModuleList(parts))
    model = nn.ModuleDict({"embed_tokens": nn.Embedding(config.vocab_size, h), "layers": nn.ModuleList(layers),
                           "norm": modeling_llama.LlamaRMSNorm(h)})
    if not config.tie_word_embeddings:
        model["lm_head"] = nn.Linear(h, config.vocab_size, bias=False)
    return model
