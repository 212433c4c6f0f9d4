"""Gemma 3's text decoder (HF ``model_type`` gemma3_text, Gemma3ForCausalLM) over the paged KV cache.

Llama's skeleton (engine.models.llama) with:

- embeddings multiplied by sqrt(hidden_size), the factor rounded to the weights' dtype first;
- Gemma's RMSNorm: normalized and multiplied by (1 + weight) in fp32, then cast back (its weights are
  stored as offsets from 1);
- four norms a layer: before and after attention and before and after the MLP, the "after" ones on
  the branch's output before it is added to the residual stream;
- per-head q/k norms before rotary (Qwen3's, with Gemma's norm);
- attention scaled by query_pre_attn_scalar ** -0.5, not head_dim ** -0.5;
- ``layer_types``: sliding-window layers with their own RoPE base (10,000) and full layers with theirs
  (1,000,000, linearly scaled on the larger checkpoints): one rotary table per layer type;
- a GELU-tanh gated MLP; tied embeddings; logits soft-capped when ``final_logit_softcapping`` is set.

Refused, not approximated: attention logit soft-capping (Gemma 2's), bidirectional attention
(EmbeddingGemma's), attention biases and layer types other than sliding and full.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionMetadata
from engine.models.errors import UnsupportedModelError
from engine.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP, RMSNorm
from engine.models.rotary import BASIC_ROPE_TYPES, RotaryEmbedding


class GemmaRMSNorm(RMSNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return (h * (1.0 + self.weight.float())).to(x.dtype)


class Gemma3Attention(LlamaAttention):
    def __init__(self, config, layer: int):
        super().__init__(config, False, False, layer)
        self.attn.scale = config.query_pre_attn_scalar ** -0.5
        self.q_norm = GemmaRMSNorm(self.head_size, config.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(self.head_size, config.rms_norm_eps)
        self.layer_type = config.layer_types[layer]

    def forward(self, cos_sin, hidden, kv_cache, meta: AttentionMetadata) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = self.q_norm(q.reshape(-1, self.num_heads, self.head_size))
        k = self.k_norm(k.reshape(-1, self.num_kv_heads, self.head_size))
        q, k = RotaryEmbedding.apply(cos_sin[self.layer_type], q, k)
        out = self.attn(q.reshape(-1, self.q_size), k.reshape(-1, self.kv_size), v, kv_cache, meta)
        return self.o_proj(out)


class Gemma3MLP(LlamaMLP):
    def __init__(self, config):
        if config.hidden_activation != "gelu_pytorch_tanh":
            raise UnsupportedModelError(f"Gemma 3 activation {config.hidden_activation!r} is not supported "
                                        f"(only gelu_pytorch_tanh is)")
        super().__init__(config)

    @staticmethod
    def activation(gate: torch.Tensor) -> torch.Tensor:
        return F.gelu(gate, approximate="tanh")


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, config, layer: int):
        super().__init__()
        size, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = Gemma3Attention(config, layer)
        self.mlp = Gemma3MLP(config)
        self.input_layernorm = GemmaRMSNorm(size, eps)
        self.post_attention_layernorm = GemmaRMSNorm(size, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(size, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(size, eps)

    def forward(self, cos_sin, hidden, kv_cache, meta) -> torch.Tensor:
        attended = self.self_attn(cos_sin, self.input_layernorm(hidden), kv_cache, meta)
        hidden = hidden + self.post_attention_layernorm(attended)
        return hidden + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(hidden)))


class Gemma3ForCausalLM(LlamaForCausalLM):
    """HF Gemma3ForCausalLM (the text decoder) with paged attention."""

    whole_layer_weights = ("self_attn.q_norm.weight", "self_attn.k_norm.weight", "pre_feedforward_layernorm.weight",
                           "post_feedforward_layernorm.weight")

    def __init__(self, config):
        if getattr(config, "attn_logit_softcapping", None):
            raise UnsupportedModelError("attention logit soft-capping is not supported")
        if getattr(config, "use_bidirectional_attention", False):    # EmbeddingGemma: an encoder, not a decoder
            raise UnsupportedModelError("bidirectional attention (an embedding model) is not supported")
        if getattr(config, "attention_bias", False):
            raise UnsupportedModelError("Gemma 3 with attention biases is not supported")
        unknown = set(config.layer_types) - {"sliding_attention", "full_attention"}
        if unknown:
            raise UnsupportedModelError(f"layer types {', '.join(sorted(unknown))} are not supported "
                                        f"(sliding_attention and full_attention are)")
        nn.Module.__init__(self)
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.embed_scale = config.hidden_size ** 0.5
        self.rotary = {kind: RotaryEmbedding(config.head_dim, config.max_position_embeddings,
                                             dict(config.rope_parameters[kind]), BASIC_ROPE_TYPES)
                       for kind in set(config.layer_types)}
        self.layers = nn.ModuleList(Gemma3DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.softcap = getattr(config, "final_logit_softcapping", None)

    def forward(self, input_ids, positions, kv_caches, meta: AttentionMetadata) -> torch.Tensor:
        embedded = self.embed_tokens(input_ids)
        hidden = embedded * torch.tensor(self.embed_scale, dtype=embedded.dtype)
        cos_sin = {kind: rotary.cos_sin(positions, hidden.dtype) for kind, rotary in self.rotary.items()}
        for i, layer in enumerate(self.layers):
            hidden = layer(cos_sin, hidden, kv_caches[i] if kv_caches else None, meta)
        return self.norm(hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

