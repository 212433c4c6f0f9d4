"""A tiny model folder with the catalog's byte-level tokenizer, and a running server for it."""
from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from planner.profile.byte_tokenizer import build_byte_tokenizer


def save_byte_model(folder, max_position_embeddings: int = 128) -> str:
    """A random 2-layer Llama whose vocabulary (320) holds the 256 byte tokens, plus that tokenizer."""
    torch.manual_seed(4321)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=320, max_position_embeddings=max_position_embeddings,
                         eos_token_id=2, bos_token_id=1, pad_token_id=0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.15)
    model.save_pretrained(folder, safe_serialization=True)
    build_byte_tokenizer(folder)
    return str(folder)
