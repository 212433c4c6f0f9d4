"""GPT-2 over the paged KV cache.

Pre-LayerNorm blocks, learned absolute positions, GELU (tanh form, "gelu_new")
MLP. HF stores GPT-2's projections as Conv1D with weights [in, out]; they are
transposed at load time into ordinary nn.Linear [out, in].
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from engine.attention import AttentionMetadata, PagedAttention
from engine.models.activation import activation
from engine.models.weights import WeightLoader

# Conv1D weights: transposed when loaded.
CONV1D_WEIGHTS = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
PLAIN_LAYER_PARAMS = (
    "ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias",
    "attn.c_attn.bias", "attn.c_proj.bias", "mlp.c_fc.bias", "mlp.c_proj.bias",
)
# Causal-mask buffers that older exports saved alongside the weights.
MASK_BUFFERS = ("attn.bias", "attn.masked_bias")


class GPT2Attention(nn.Module):
    def __init__(self, config, layer_idx: int):
        super().__init__()
        hidden = config.hidden_size
        self.hidden = hidden
        num_heads = config.num_attention_heads
        head_size = hidden // num_heads
        scale = head_size**-0.5 if getattr(config, "scale_attn_weights", True) else 1.0
        if getattr(config, "scale_attn_by_inverse_layer_idx", False):
            scale /= layer_idx + 1
        self.c_attn = nn.Linear(hidden, 3 * hidden)
        self.c_proj = nn.Linear(hidden, hidden)
        self.attn = PagedAttention(num_heads, head_size, num_heads, scale)

    def forward(self, hidden, kv_cache, meta: AttentionMetadata) -> torch.Tensor:
        q, k, v = self.c_attn(hidden).split(self.hidden, dim=-1)
        return self.c_proj(self.attn(q, k, v, kv_cache, meta))


class GPT2MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        inner = getattr(config, "n_inner", None) or 4 * config.hidden_size
        self.c_fc = nn.Linear(config.hidden_size, inner)
        self.c_proj = nn.Linear(inner, config.hidden_size)
        self.act = activation(config.activation_function)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.act(self.c_fc(x)))


class GPT2Block(nn.Module):
    def __init__(self, config, layer_idx: int):
        super().__init__()
        eps = config.layer_norm_epsilon
        self.ln_1 = nn.LayerNorm(config.hidden_size, eps=eps)
        self.attn = GPT2Attention(config, layer_idx)
        self.ln_2 = nn.LayerNorm(config.hidden_size, eps=eps)
        self.mlp = GPT2MLP(config)

    def forward(self, hidden, kv_cache, meta) -> torch.Tensor:
        hidden = hidden + self.attn(self.ln_1(hidden), kv_cache, meta)
        return hidden + self.mlp(self.ln_2(hidden))


class GPT2LMHeadModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        hidden = config.hidden_size
        self.wte = nn.Embedding(config.vocab_size, hidden)
        self.wpe = nn.Embedding(config.max_position_embeddings, hidden)
        self.h = nn.ModuleList(GPT2Block(config, i) for i in range(config.num_hidden_layers))
        self.ln_f = nn.LayerNorm(hidden, eps=config.layer_norm_epsilon)
        self.lm_head = nn.Linear(hidden, config.vocab_size, bias=False)

    def forward(self, input_ids, positions, kv_caches, meta: AttentionMetadata) -> torch.Tensor:
        hidden = self.wte(input_ids) + self.wpe(positions)
        for i, block in enumerate(self.h):
            hidden = block(hidden, kv_caches[i] if kv_caches else None, meta)
        return self.ln_f(hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def tie_lm_head(self) -> None:
        self.lm_head.weight = self.wte.weight

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], loader: WeightLoader) -> None:
        for name, tensor in weights:
            if name == "lm_head.weight":
                loader.load(name, tensor)
                continue
            # HF names are "transformer.X"; the original hub export has bare "X".
            name = name.removeprefix("transformer.")
            parts = name.split(".")
            rest = ".".join(parts[2:])
            if parts[0] == "h" and rest in CONV1D_WEIGHTS:
                loader.load(name, tensor.t())
            elif parts[0] == "h" and rest in PLAIN_LAYER_PARAMS:
                loader.load(name, tensor)
            elif parts[0] == "h" and rest in MASK_BUFFERS:
                continue
            elif name in ("wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"):
                loader.load(name, tensor)
            else:
                loader.unexpected(name)
