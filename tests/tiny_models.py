"""Tiny random-weight checkpoints saved the way a user's local model folder is."""
from __future__ import annotations

import torch
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, OPTConfig,
                          OPTForCausalLM)

CONFIGS = {
    # GQA: 4 query heads share 2 KV heads.
    "llama": (LlamaForCausalLM, lambda: LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=200, max_position_embeddings=256, eos_token_id=2,
        bos_token_id=1, pad_token_id=0)),
    "opt": (OPTForCausalLM, lambda: OPTConfig(
        hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=200,
        max_position_embeddings=256, word_embed_proj_dim=64, eos_token_id=2, pad_token_id=1)),
    "gpt2": (GPT2LMHeadModel, lambda: GPT2Config(
        n_embd=64, n_layer=2, n_head=4, vocab_size=200, n_positions=256, eos_token_id=2,
        bos_token_id=2)),
}


def save_tiny_model(kind: str, folder) -> str:
    model_cls, config = CONFIGS[kind]
    torch.manual_seed(1234)
    model = model_cls(config()).eval()
    with torch.no_grad():
        # Larger random weights than the default init give peaked, varied
        # next-token distributions, so greedy paths do not sit on near-ties.
        for param in model.parameters():
            if param.dim() > 1:
                param.normal_(0.0, 0.15)
    model.save_pretrained(folder, safe_serialization=True)
    return str(folder)


def hf_model(folder):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def save_word_tokenizer(folder, vocab_size: int = 200) -> None:
    """A word-level tokenizer ("w0" .. "w{n-1}", one id per word) in the model folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab_size)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0").save_pretrained(folder)
