"""Gemma 3's text decoder against transformers on a tiny random-weight checkpoint: logits of a batched prefill
and decodes, and greedy tokens, with sliding-window layers whose window is shorter than the prompts."""
from __future__ import annotations

import pytest
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from engine.models.errors import UnsupportedModelError
from engine.models.gemma3 import Gemma3ForCausalLM as PagedGemma3
from tests.test_model_runner import build_checkpoint, check_greedy_against_transformers


def tiny_config(**overrides):
    # head_dim 32 is not hidden / heads, query_pre_attn_scalar is neither; two sliding layers (window 8) with
    # their own RoPE base, a full layer with a linearly scaled one; logits soft-capped
    base = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=24, vocab_size=256,
                max_position_embeddings=256, sliding_window=8,
                layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                 "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 4.0}},
                final_logit_softcapping=5.0, pad_token_id=0, bos_token_id=2, eos_token_id=1)
    return Gemma3TextConfig(**{**base, **overrides})


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma3")
    build_checkpoint(folder, Gemma3ForCausalLM, tiny_config())   # norms randomized: Gemma initializes them to 0
    return str(folder)


@pytest.mark.parametrize("block_size", [8, 16])
def test_greedy_generation_matches_transformers(gemma3, block_size):
    check_greedy_against_transformers(gemma3, block_size)


@pytest.mark.parametrize("overrides, message", [
    (dict(attn_logit_softcapping=50.0), "soft-capping"),                  # Gemma 2's
    (dict(use_bidirectional_attention=True), "bidirectional"),            # EmbeddingGemma
    (dict(attention_bias=True), "biases"),
])
def test_what_is_not_gemma3s_decoder_is_refused_in_one_line(overrides, message):
    with pytest.raises(UnsupportedModelError, match=message) as info:
        PagedGemma3(tiny_config(**overrides))
    assert "\n" not in str(info.value)


def test_an_unknown_layer_type_is_refused_in_one_line():
    config = tiny_config()
    config.layer_types = ["sliding_attention", "chunked_attention", "full_attention"]
    with pytest.raises(UnsupportedModelError, match="chunked_attention"):
        PagedGemma3(config)
