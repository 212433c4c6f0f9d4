"""Phi-3 and Phi-4 (HF ``model_type`` phi3) over the paged KV cache.

Llama's decoder (engine.models.llama) exactly: RMSNorm, rotary positions, SwiGLU and grouped-query attention,
no biases. The checkpoint already stores what this engine fuses: ``self_attn.qkv_proj`` (query, key, value
rows in that order) and ``mlp.gate_up_proj`` (gate rows, then up), so those load whole. Phi-3-mini's sliding
window is Mistral's. Phi-4-mini's partial rotary embedding (the first 3/4 of each head turns) and the
128k variants' and Phi-4-mini's LongRoPE are the rotary table's (engine.models.rotary), checked against
transformers in tests/test_phi3_rope.py.
"""

from __future__ import annotations

from engine.models.llama import LlamaForCausalLM
from engine.models.rotary import PHI3_ROPE_TYPES


class Phi3ForCausalLM(LlamaForCausalLM):
    """HF Phi3ForCausalLM with paged attention."""

    whole_layer_weights = ("self_attn.qkv_proj.weight", "mlp.gate_up_proj.weight")
    rope_types = PHI3_ROPE_TYPES
    partial_rotary = True
