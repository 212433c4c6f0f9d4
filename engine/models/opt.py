"""OPT decoder over the paged KV cache.

Learned absolute positions stored with an offset of 2 (rows 0 and 1 were
reserved for padding in fairseq), LayerNorm before the sublayers (most sizes)
or after them (``do_layer_norm_before=False``, OPT-350m), ReLU FFN, and an
input/output projection when word embeddings are narrower than the model
(``word_embed_proj_dim``, also OPT-350m).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from engine.attention import AttentionMetadata, PagedAttention
from engine.models.activation import activation
from engine.models.weights import WeightLoader, lora_slices

POSITION_OFFSET = 2


class OPTAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        hidden, bias = config.hidden_size, getattr(config, "enable_bias", True)
        self.num_heads = config.num_attention_heads
        self.head_size = hidden // self.num_heads
        self.hidden = hidden
        self.qkv_proj = nn.Linear(hidden, 3 * hidden, bias=bias)
        self.out_proj = nn.Linear(hidden, hidden, bias=bias)
        self.attn = PagedAttention(self.num_heads, self.head_size, self.num_heads, self.head_size**-0.5)

    def forward(self, hidden, kv_cache, meta: AttentionMetadata) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden).split(self.hidden, dim=-1)
        return self.out_proj(self.attn(q, k, v, kv_cache, meta))


class OPTDecoderLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        hidden, bias = config.hidden_size, getattr(config, "enable_bias", True)
        affine = getattr(config, "layer_norm_elementwise_affine", True)
        self.pre_norm = config.do_layer_norm_before
        self.self_attn = OPTAttention(config)
        self.self_attn_layer_norm = nn.LayerNorm(hidden, elementwise_affine=affine)
        self.fc1 = nn.Linear(hidden, config.ffn_dim, bias=bias)
        self.fc2 = nn.Linear(config.ffn_dim, hidden, bias=bias)
        self.final_layer_norm = nn.LayerNorm(hidden, elementwise_affine=affine)
        self.act = activation(config.activation_function)

    def forward(self, hidden, kv_cache, meta) -> torch.Tensor:
        norm = self.self_attn_layer_norm
        attn_in = norm(hidden) if self.pre_norm else hidden
        hidden = hidden + self.self_attn(attn_in, kv_cache, meta)
        if not self.pre_norm:
            hidden = norm(hidden)
        norm = self.final_layer_norm
        ffn_in = norm(hidden) if self.pre_norm else hidden
        hidden = hidden + self.fc2(self.act(self.fc1(ffn_in)))
        return hidden if self.pre_norm else norm(hidden)


class OPTForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        hidden, embed_dim = config.hidden_size, config.word_embed_proj_dim
        self.embed_tokens = nn.Embedding(config.vocab_size, embed_dim)
        self.embed_positions = nn.Embedding(config.max_position_embeddings + POSITION_OFFSET, hidden)
        narrow = embed_dim != hidden
        self.project_in = nn.Linear(embed_dim, hidden, bias=False) if narrow else None
        self.project_out = nn.Linear(hidden, embed_dim, bias=False) if narrow else None
        self.layers = nn.ModuleList(OPTDecoderLayer(config) for _ in range(config.num_hidden_layers))
        # Post-norm OPT has no final norm; `_remove_final_layer_norm` is HF's
        # compatibility switch for old checkpoints that lack it.
        has_final = config.do_layer_norm_before and not getattr(config, "_remove_final_layer_norm", False)
        affine = getattr(config, "layer_norm_elementwise_affine", True)
        self.final_layer_norm = nn.LayerNorm(hidden, elementwise_affine=affine) if has_final else None
        self.lm_head = nn.Linear(embed_dim, config.vocab_size, bias=False)

    def forward(self, input_ids, positions, kv_caches, meta: AttentionMetadata) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        if self.project_in is not None:
            hidden = self.project_in(hidden)
        hidden = hidden + self.embed_positions(positions + POSITION_OFFSET)
        for i, layer in enumerate(self.layers):
            hidden = layer(hidden, kv_caches[i] if kv_caches else None, meta)
        if self.final_layer_norm is not None:
            hidden = self.final_layer_norm(hidden)
        if self.project_out is not None:
            hidden = self.project_out(hidden)
        return hidden

    def lora_modules(self) -> dict[str, tuple[str, int, int]]:
        """The linear layers a LoRA adapter may target (engine.lora), by HF's module name: where each
        runs here and which output rows it makes, ``(module, first row, rows)``; q/k/v are thirds of
        the fused projection."""
        hidden, modules = self.config.hidden_size, {}
        for i, layer in enumerate(self.layers):
            hf, own = f"model.decoder.layers.{i}.", f"layers.{i}."
            modules.update(lora_slices(hf + "self_attn.", own + "self_attn.", "qkv_proj",
                                       {"q_proj": hidden, "k_proj": hidden, "v_proj": hidden}, whole=False))
            modules[hf + "self_attn.out_proj"] = (own + "self_attn.out_proj", 0, hidden)
            modules[hf + "fc1"] = (own + "fc1", 0, layer.fc1.out_features)
            modules[hf + "fc2"] = (own + "fc2", 0, hidden)
        return modules

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def tie_lm_head(self) -> None:
        self.lm_head.weight = self.embed_tokens.weight

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], loader: WeightLoader) -> None:
        hidden = self.config.hidden_size
        qkv_rows = {"q_proj": 0, "k_proj": hidden, "v_proj": 2 * hidden}
        for name, tensor in weights:
            if name == "lm_head.weight":
                loader.load(name, tensor)
                continue
            # HF names are "model.decoder.X"; some old exports drop "model.".
            name = name.removeprefix("model.").removeprefix("decoder.")
            parts = name.split(".")
            if parts[0] == "layers" and len(parts) == 5 and parts[3] in qkv_rows:
                # layers.{i}.self_attn.{q,k,v}_proj.{weight,bias}
                fused = f"layers.{parts[1]}.self_attn.qkv_proj.{parts[4]}"
                loader.load_rows(fused, tensor, qkv_rows[parts[3]], hidden, parts[3])
            elif parts[0] == "layers" and ".".join(parts[2:-1]) in (
                "self_attn.out_proj", "self_attn_layer_norm", "fc1", "fc2", "final_layer_norm"
            ):
                loader.load(name, tensor)
            elif name in (
                "embed_tokens.weight", "embed_positions.weight", "project_in.weight", "project_out.weight",
                "final_layer_norm.weight", "final_layer_norm.bias",
            ):
                loader.load(name, tensor)
            else:
                loader.unexpected(name)
