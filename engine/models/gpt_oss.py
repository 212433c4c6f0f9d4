"""gpt-oss over the paged KV cache.

Llama's skeleton (engine.models.llama) with:

- attention sinks: a learned logit per query head that joins the softmax as a
  token without a value (engine.attention passes it to the paged kernels and
  to the prefill path), so a head can put its weight on "nothing";
- alternating attention: ``layer_types`` marks each layer sliding-window or
  full (sliding_window_of reads it); biases on q, k, v and o;
- a sparse MoE block in every layer: a router with a bias, the top-k logits
  kept and softmaxed, experts with biases and a clamped SwiGLU
  (engine.models.moe.clamped_swiglu);
- YaRN rotary positions (its default config uses them);
- an RMSNorm that multiplies by its weight before casting back to the input
  dtype (Llama casts first): the same in fp32, a different rounding in bf16.

Only unquantized checkpoints load: the released ones store the experts in
MXFP4 (``*_blocks`` / ``*_scales`` tensors), which would need their own kernels.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionMetadata
from engine.models.errors import UnsupportedModelError
from engine.models.llama import DecoderLayer, LlamaAttention, LlamaForCausalLM, RMSNorm
from engine.models.moe import SparseMoeBlock, clamped_swiglu, top_k_softmax
from engine.models.rotary import YARN_ROPE_TYPES, RotaryEmbedding
from engine.models.weights import WeightLoader

EXPERT_TENSORS = ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")


class GptOssRMSNorm(RMSNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return (self.weight * h).to(x.dtype)


class GptOssAttention(LlamaAttention):
    def __init__(self, config, qkv_bias: bool, o_bias: bool, layer: int):
        super().__init__(config, qkv_bias, o_bias, layer)
        self.sinks = nn.Parameter(torch.empty(self.num_heads))

    def forward(self, cos_sin, hidden, kv_cache, meta: AttentionMetadata) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = RotaryEmbedding.apply(
            cos_sin, q.view(-1, self.num_heads, self.head_size), k.view(-1, self.num_kv_heads, self.head_size)
        )
        out = self.attn(q.reshape(-1, self.q_size), k.reshape(-1, self.kv_size), v, kv_cache, meta, self.sinks)
        return self.o_proj(out)


def gpt_oss_moe_block(config) -> SparseMoeBlock:
    """The top-k logits softmaxed, experts with biases and gpt-oss's clamped SwiGLU."""
    top_k = config.num_experts_per_tok
    return SparseMoeBlock(config.hidden_size, config.intermediate_size, config.num_local_experts, top_k,
                          functools.partial(top_k_softmax, top_k=top_k),
                          clamped_swiglu(config.swiglu_alpha, config.swiglu_limit), bias=True)


class GptOssForCausalLM(LlamaForCausalLM):
    """HF GptOssForCausalLM (unquantized) with paged attention."""

    rope_types = YARN_ROPE_TYPES
    # The MoE block reads its experts' token counts on the host: not capturable.
    cuda_graphs = False

    def __init__(self, config):
        quantization = getattr(config, "quantization_config", None)
        if quantization:
            method = quantization.get("quant_method") if isinstance(quantization, dict) else quantization
            raise UnsupportedModelError(f"gpt-oss with quantized weights ({method}) is not supported; "
                                        "use an unquantized (bf16/fp32) checkpoint")
        super().__init__(config)
        self.norm = GptOssRMSNorm(config.hidden_size, config.rms_norm_eps)   # in place of Llama's final norm

    def decoder_layer(self, config, qkv_bias: bool, o_bias: bool, layer: int) -> nn.Module:
        return DecoderLayer(GptOssAttention(config, qkv_bias, o_bias, layer), gpt_oss_moe_block(config), config,
                            norm=GptOssRMSNorm)

    def load_own_layer_weight(self, name: str, parts: list[str], tensor: torch.Tensor, loader: WeightLoader) -> bool:
        """Sinks, router and experts here; every Llama-named weight goes on to Llama's loader."""
        prefix, rest = f"layers.{parts[1]}.", ".".join(parts[2:])
        mlp = self.layers[int(parts[1])].mlp
        if rest in ("self_attn.sinks", "mlp.router.weight", "mlp.router.bias"):
            loader.load(prefix + rest, tensor)
        elif len(parts) == 5 and parts[2:4] == ["mlp", "experts"] and parts[4] in EXPERT_TENSORS:
            # [E, H, 2I] / [E, 2I] with gate and up interleaved, and [E, I, H] / [E, H].
            mlp.load_fused(loader, prefix + "mlp.", parts[4].replace("_proj", ""), tensor,
                           interleaved_transposed=True)
        elif rest.startswith("mlp."):
            loader.unexpected(name)
        else:
            return False
        return True
