"""Phi-4-mini's rotary embedding in the engine against transformers: partial rotary (the first 3/4 of each head
turns, the rest passes through) and LongRoPE (per-dimension factors, short within the pretraining length and
long past it, with its attention factor on cos and sin)."""
from __future__ import annotations

import pytest
import torch
from transformers import Phi3Config, Phi3ForCausalLM

from engine.models.errors import UnsupportedModelError
from engine.models.rotary import RotaryEmbedding
from tests.test_model_runner import (ATOL, build_checkpoint, check_greedy_against_transformers, hf_logits, hf_model,
                                     make_runner, run_greedy)


def phi4_mini_like(original_max: int) -> Phi3Config:
    """Phi-4-mini's rotary settings on a tiny model: head_dim 16, 12 dims turn, 6 factors each."""
    g = torch.Generator().manual_seed(3)
    short, long_ = (torch.rand(6, generator=g) * 3 + 1 for _ in range(2))
    return Phi3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=256, max_position_embeddings=256,
                      original_max_position_embeddings=original_max, partial_rotary_factor=0.75,
                      rope_scaling={"type": "longrope", "short_factor": short.tolist(), "long_factor": long_.tolist()},
                      pad_token_id=0, bos_token_id=1, eos_token_id=2)


@pytest.fixture(scope="module")
def within(tmp_path_factory):
    """Every position of the tests inside the pretraining length (64): the short factors."""
    return build_checkpoint(tmp_path_factory.mktemp("phi4mini"), Phi3ForCausalLM, phi4_mini_like(64))


@pytest.fixture(scope="module")
def past(tmp_path_factory):
    """A pretraining length of 4: every step past it, the long factors."""
    return build_checkpoint(tmp_path_factory.mktemp("phi4mini-long"), Phi3ForCausalLM, phi4_mini_like(4))


@pytest.mark.parametrize("block_size", [8, 16])
def test_partial_rotary_and_short_factors_match_transformers(within, block_size):
    check_greedy_against_transformers(within, block_size)


def test_long_factors_past_the_pretraining_length_match_transformers(past):
    """Prompts longer than the pretraining length: transformers turns the whole forward with the long factors,
    and so does the engine's step (its last position is past it)."""
    runner, reference = make_runner(past, 8), hf_model(past)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (5, 9, 17)]
    steps = 5
    generated, rows = run_greedy(runner, prompts, steps)
    for prompt, out, seen in zip(prompts, generated, rows):
        expected = hf_logits(reference, prompt + out)[len(prompt) - 1: len(prompt) - 1 + steps]
        torch.testing.assert_close(torch.stack(seen), expected, atol=ATOL, rtol=0)


def test_the_switch_follows_the_last_position():
    """A step whose positions all lie inside the pretraining length turns with the short factors; one token past
    it switches the whole step (vLLM's Phi3LongRoPEScaledRotaryEmbedding switches a batch the same way)."""
    params = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
              "original_max_position_embeddings": 8, "short_factor": [1.0] * 6, "long_factor": [4.0] * 6}
    rotary = RotaryEmbedding(16, 32, params, ("longrope",), partial=True)
    inside = rotary.cos_sin(torch.tensor([1, 7]), torch.float32)[0]
    past = rotary.cos_sin(torch.tensor([1, 8]), torch.float32)[0]
    assert inside.shape == (2, 1, 12)                       # 12 of 16 dims turn
    assert not torch.allclose(inside[0], past[0])           # position 1 turned with the long factors too
    factor = (1 + torch.log(torch.tensor(4.0)) / torch.log(torch.tensor(8.0))).sqrt()
    torch.testing.assert_close(inside[0, 0, 0], factor * torch.cos(torch.tensor(1.0)))   # attention factor


def test_partial_rotary_is_refused_where_the_architecture_has_none():
    params = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    with pytest.raises(UnsupportedModelError, match="partial rotary"):
        RotaryEmbedding(16, 32, params)
