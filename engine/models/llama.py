"""Llama-family decoder (Llama 2/3, Mistral, Qwen2) over the paged KV cache.

RMSNorm, rotary positions, SwiGLU MLP and grouped-query attention. Q, K and V
are one fused projection and gate/up another, so each layer runs two matmuls
where the checkpoint has five; the loader slices HF's separate matrices into
them. Qwen2 differs only in having biases on q/k/v. Qwen3, Mixtral and gpt-oss
(their own modules) are this model with other layers: they override
``decoder_layer`` and load their own weights in ``load_own_layer_weight``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionMetadata, PagedAttention
from engine.models.rotary import BASIC_ROPE_TYPES, RotaryEmbedding, rope_parameters
from engine.models.weights import WeightLoader, lora_slices
from engine.models.errors import UnsupportedModelError

KVCaches = list[tuple[torch.Tensor, torch.Tensor]] | None


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalize in fp32 and cast back before the weight, as HF does, so
        # half-precision results round the same way.
        h = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)   # one fused op: h * rsqrt(mean(h^2) + eps)
        return self.weight * h.to(x.dtype)


def head_size_of(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def sliding_window_of(config, layer: int) -> int | None:
    """The layer's attention window (Mistral: every layer; Qwen2: the layers its config marks), or None."""
    window = getattr(config, "sliding_window", None)
    if not window:
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return window if layer_types[layer] == "sliding_attention" else None
    return window if getattr(config, "use_sliding_window", True) else None


class LlamaAttention(nn.Module):
    def __init__(self, config, qkv_bias: bool, o_bias: bool, layer: int):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_size = head_size_of(config)
        self.q_size = self.num_heads * self.head_size
        self.kv_size = self.num_kv_heads * self.head_size
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=qkv_bias)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=o_bias)
        self.attn = PagedAttention(self.num_heads, self.head_size, self.num_kv_heads, self.head_size**-0.5,
                                   sliding_window_of(config, layer))

    def forward(self, cos_sin, hidden, kv_cache, meta: AttentionMetadata) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = RotaryEmbedding.apply(
            cos_sin, q.view(-1, self.num_heads, self.head_size), k.view(-1, self.num_kv_heads, self.head_size)
        )
        out = self.attn(q.reshape(-1, self.q_size), k.reshape(-1, self.kv_size), v, kv_cache, meta)
        return self.o_proj(out)


class LlamaMLP(nn.Module):
    activation = staticmethod(F.silu)      # of the gate; Gemma's is GELU-tanh

    def __init__(self, config):
        super().__init__()
        bias = getattr(config, "mlp_bias", False)
        self.intermediate = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * self.intermediate, bias=bias)
        self.down_proj = nn.Linear(self.intermediate, config.hidden_size, bias=bias)
        if getattr(config, "hidden_act", "silu") != "silu":
            raise UnsupportedModelError(f"Llama MLP activation {config.hidden_act!r} is not supported (only silu is)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(self.activation(gate) * up)


class DecoderLayer(nn.Module):
    """A pre-norm layer: attention, then the MLP, each reading the residual stream
    through its own norm and adding its output back. The Llama family here
    (Qwen3, Mixtral and gpt-oss too) differs only in the attention, the MLP (dense
    or a sparse MoE block) and the norm a layer is built with."""

    def __init__(self, self_attn: nn.Module, mlp: nn.Module, config, norm: type[nn.Module] = RMSNorm):
        super().__init__()
        self.self_attn = self_attn
        self.mlp = mlp
        self.input_layernorm = norm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = norm(config.hidden_size, config.rms_norm_eps)

    def forward(self, cos_sin, hidden, kv_cache, meta) -> torch.Tensor:
        hidden = hidden + self.self_attn(cos_sin, self.input_layernorm(hidden), kv_cache, meta)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class LlamaForCausalLM(nn.Module):
    """HF LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM with paged attention."""

    # The RoPE variants this architecture accepts (engine.models.rotary), and whether it turns only part of
    # each head when a config asks.
    rope_types = BASIC_ROPE_TYPES
    partial_rotary = False

    def __init__(self, config):
        super().__init__()
        self.config = config
        qwen2 = config.model_type == "qwen2"
        qkv_bias = qwen2 or getattr(config, "attention_bias", False)
        o_bias = not qwen2 and getattr(config, "attention_bias", False)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        # One cos/sin table for all layers: at 128k positions it is ~128 MiB.
        self.rotary = RotaryEmbedding(head_size_of(config), config.max_position_embeddings, rope_parameters(config),
                                      self.rope_types, self.partial_rotary)
        self.layers = nn.ModuleList(
            self.decoder_layer(config, qkv_bias, o_bias, i) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def decoder_layer(self, config, qkv_bias: bool, o_bias: bool, layer: int) -> nn.Module:
        """Layer number ``layer``: called once per layer while the model is built."""
        return DecoderLayer(LlamaAttention(config, qkv_bias, o_bias, layer), LlamaMLP(config), config)

    def lora_modules(self) -> dict[str, tuple[str, int, int]]:
        """The linear layers a LoRA adapter may target (engine.lora), by the module name PEFT's keys give
        (HF's): where each runs here and which of that module's output rows it makes, as
        ``(module, first row, rows)``. Q/K/V and gate/up are slices of the fused projections, or whole
        where the checkpoint fuses them itself (Phi-3). Attention everywhere, the MLP where it is dense
        (an MoE block's experts take no adapter)."""
        modules = {}
        for i, layer in enumerate(self.layers):
            hf, own = f"model.layers.{i}.", f"layers.{i}."
            attn, mlp = layer.self_attn, layer.mlp
            if isinstance(attn, LlamaAttention):
                modules.update(lora_slices(hf + "self_attn.", own + "self_attn.", "qkv_proj",
                                           {"q_proj": attn.q_size, "k_proj": attn.kv_size, "v_proj": attn.kv_size},
                                           "self_attn.qkv_proj.weight" in self.whole_layer_weights))
                modules[hf + "self_attn.o_proj"] = (own + "self_attn.o_proj", 0, attn.o_proj.out_features)
            if isinstance(mlp, LlamaMLP):
                modules.update(lora_slices(hf + "mlp.", own + "mlp.", "gate_up_proj",
                                           {"gate_proj": mlp.intermediate, "up_proj": mlp.intermediate},
                                           "mlp.gate_up_proj.weight" in self.whole_layer_weights))
                modules[hf + "mlp.down_proj"] = (own + "mlp.down_proj", 0, mlp.down_proj.out_features)
        return modules

    def forward(self, input_ids, positions, kv_caches: KVCaches, meta: AttentionMetadata) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        cos_sin = self.rotary.cos_sin(positions, hidden.dtype)
        for i, layer in enumerate(self.layers):
            hidden = layer(cos_sin, hidden, kv_caches[i] if kv_caches else None, meta)
        return self.norm(hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def tie_lm_head(self) -> None:
        self.lm_head.weight = self.embed_tokens.weight

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], loader: WeightLoader) -> None:
        """Copy HF-named tensors into this model (names listed explicitly, one branch each)."""
        for name, tensor in self._not_own_layer_weights(weights, loader):
            name = name.removeprefix("model.")
            if name.endswith("rotary_emb.inv_freq"):
                continue  # recomputed from the config
            parts = name.split(".")
            if parts[0] == "layers":
                prefix = f"layers.{parts[1]}."
                rest = ".".join(parts[2:])
                attn = self.layers[int(parts[1])].self_attn
                kind = parts[-1]  # weight or bias
                if rest.startswith("self_attn.q_proj."):
                    loader.load_rows(prefix + f"self_attn.qkv_proj.{kind}", tensor, 0, attn.q_size, "q")
                elif rest.startswith("self_attn.k_proj."):
                    loader.load_rows(prefix + f"self_attn.qkv_proj.{kind}", tensor, attn.q_size, attn.kv_size, "k")
                elif rest.startswith("self_attn.v_proj."):
                    loader.load_rows(
                        prefix + f"self_attn.qkv_proj.{kind}", tensor, attn.q_size + attn.kv_size, attn.kv_size, "v"
                    )
                elif rest.startswith("mlp.gate_proj."):
                    size = self.config.intermediate_size
                    loader.load_rows(prefix + f"mlp.gate_up_proj.{kind}", tensor, 0, size, "gate")
                elif rest.startswith("mlp.up_proj."):
                    size = self.config.intermediate_size
                    loader.load_rows(prefix + f"mlp.gate_up_proj.{kind}", tensor, size, size, "up")
                elif rest in (
                    f"self_attn.o_proj.{kind}", f"mlp.down_proj.{kind}",
                    "input_layernorm.weight", "post_attention_layernorm.weight",
                ):
                    loader.load(prefix + rest, tensor)
                else:
                    loader.unexpected(name)
            elif name in ("embed_tokens.weight", "norm.weight", "lm_head.weight"):
                loader.load(name, tensor)
            else:
                loader.unexpected(name)

    # Per-layer weights (names within a layer) that a model built on this one loads as the checkpoint
    # stores them: Phi-3's already fused projections, Gemma's extra norms. Llama has none.
    whole_layer_weights: tuple[str, ...] = ()

    def load_own_layer_weight(self, name: str, parts: list[str], tensor: torch.Tensor, loader: WeightLoader) -> bool:
        """Where a model built on this one loads a per-layer weight Llama does not
        have (``parts``: ``name`` without ``model.``, split at the dots): True when
        it did; False leaves the weight to Llama's loader. Here: the ``whole_layer_weights``."""
        rest = ".".join(parts[2:])
        if rest not in self.whole_layer_weights:
            return False
        loader.load(f"layers.{parts[1]}.{rest}", tensor)
        return True

    def _not_own_layer_weights(self, weights: Iterable[tuple[str, torch.Tensor]],
                               loader: WeightLoader) -> Iterable[tuple[str, torch.Tensor]]:
        """The checkpoint's tensors, less the per-layer ones ``load_own_layer_weight`` took."""
        for name, tensor in weights:
            parts = name.removeprefix("model.").split(".")
            if parts[0] == "layers" and self.load_own_layer_weight(name, parts, tensor, loader):
                continue
            yield name, tensor
