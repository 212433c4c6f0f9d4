"""Tiny random-weight checkpoints saved the way a user's local model folder is."""
from __future__ import annotations

import torch
from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, GPT2Config, GPT2LMHeadModel, GptOssConfig,
                          GptOssForCausalLM, LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM,
                          OPTConfig, OPTForCausalLM, Phi3Config, Phi3ForCausalLM, Qwen3Config, Qwen3ForCausalLM,
                          Qwen3MoeConfig, Qwen3MoeForCausalLM)

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
    # head_dim 32 is not hidden / heads (16): the config's head_dim must win. Tied embeddings, as the
    # small Qwen3 checkpoints have.
    "qwen3": (Qwen3ForCausalLM, lambda: Qwen3Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, vocab_size=200, max_position_embeddings=256,
        tie_word_embeddings=True, eos_token_id=2, bos_token_id=1, pad_token_id=0)),
    # 8 experts, top 2, renormalized; layer 1 is dense (mlp_only_layers); YaRN positions (truncated ramp).
    "qwen3_moe": (Qwen3MoeForCausalLM, lambda: Qwen3MoeConfig(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1], num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=200, max_position_embeddings=256,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 64},
        eos_token_id=2, bos_token_id=1, pad_token_id=0)),
    # 4 experts, top 2; a 12-token sliding window on every layer, shorter than most test prompts.
    "mixtral": (MixtralForCausalLM, lambda: MixtralConfig(
        hidden_size=64, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=200, max_position_embeddings=256,
        sliding_window=12, eos_token_id=2, bos_token_id=1, pad_token_id=0)),
    # Layers sliding (window 8, shorter than the prompts), full, sliding; 8 experts, top 2; a SwiGLU
    # limit low enough that the clamps act; YaRN positions (untruncated ramp, as gpt-oss ships).
    "gpt_oss": (GptOssForCausalLM, lambda: GptOssConfig(
        hidden_size=64, intermediate_size=32, num_local_experts=8, num_experts_per_tok=2, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=200, max_position_embeddings=256,
        sliding_window=8, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        swiglu_limit=1.0, rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0,
                                           "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                           "original_max_position_embeddings": 64},
        eos_token_id=2, bos_token_id=1, pad_token_id=0)),
    # Phi-3/Phi-4: the checkpoint's own fused qkv and gate_up; a 12-token sliding window (Phi-3-mini has one).
    "phi3": (Phi3ForCausalLM, lambda: Phi3Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=200, max_position_embeddings=256, sliding_window=12, eos_token_id=2, bos_token_id=1,
        pad_token_id=0)),
    # Gemma 3's text decoder: sliding (window 8, its own RoPE base), full (linear RoPE scaling), sliding;
    # query_pre_attn_scalar and head_dim unlike hidden / heads; logits soft-capped.
    "gemma3_text": (Gemma3ForCausalLM, lambda: Gemma3TextConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, query_pre_attn_scalar=24, vocab_size=200, max_position_embeddings=256, sliding_window=8,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 4.0}},
        final_logit_softcapping=5.0, eos_token_id=2, bos_token_id=1, pad_token_id=0)),
}


def _gpt_oss_vectors(model) -> None:
    """Attention sinks large enough to take a real share of each softmax, and non-zero biases
    (transformers initializes the expert biases to 0), so a model that drops or misplaces
    either gives other tokens."""
    for name, param in model.named_parameters():
        if name.endswith("sinks"):
            param.normal_(1.0, 1.5)
        elif name.endswith("bias"):
            param.normal_(0.0, 0.1)


# Extra initialization for a kind, after the shared one.
AFTER_INIT = {"gpt_oss": _gpt_oss_vectors}


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
        if kind in AFTER_INIT:
            AFTER_INIT[kind](model)
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
