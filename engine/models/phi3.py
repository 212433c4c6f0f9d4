"""Phi-3 and Phi-4 (HF ``model_type`` phi3) over the paged KV cache.

Llama's decoder (engine.models.llama) exactly: RMSNorm, rotary positions, SwiGLU and grouped-query attention,
no biases. The checkpoint already stores what this engine fuses: ``self_attn.qkv_proj`` (query, key, value
rows in that order) and ``mlp.gate_up_proj`` (gate rows, then up), so those load whole. Phi-3-mini's sliding
window is Mistral's. Phi-4-mini's partial rotary embedding and the 128k variants' LongRoPE are refused by the
rotary table (engine.models.rotary), not approximated.
"""

from __future__ import annotations

from engine.models.llama import LlamaForCausalLM


class Phi3ForCausalLM(LlamaForCausalLM):
    """HF Phi3ForCausalLM with paged attention."""

    whole_layer_weights = ("self_attn.qkv_proj.weight", "mlp.gate_up_proj.weight")
