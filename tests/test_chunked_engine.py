"""Chunked prefill end to end: greedy tokens equal transformers' (fp32, CPU).

A 32-token budget against ~100-token prompts splits every prompt into several
chunks, and steps mix a prompt chunk (attending to its cached blocks plus
itself) with other requests' decodes in one forward pass.
"""
from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
# The same tiny llama/opt/gpt2 models and transformers references as the engine's own tests.
from test_engine import engine_greedy, hf_greedy, make_prompts, model_dir, reference  # noqa: F401

BUDGET = 32
MAX_TOKENS = 8


def chunked_llm(model_dir, **kwargs) -> LLM:
    llm = LLM(model_dir, enable_chunked_prefill=True, max_num_batched_tokens=BUDGET, max_num_seqs=8, **kwargs)
    steps = []
    # Per step, (tokens already computed, tokens of the sequence, tokens scheduled) per sequence.
    llm.engine.step_observer = lambda out: steps.append(
        [(s.num_computed_tokens, s.num_tokens, n) for s, n in zip(out.seqs, out.scheduled_tokens())])
    llm.steps_seen = steps
    return llm


def _chunk_and_mix_happened(steps) -> tuple[bool, bool]:
    chunked = any(n < total - computed for step in steps for computed, total, n in step)
    mixed = any(any(n == 1 for *_, n in step) and any(n > 1 for *_, n in step) for step in steps)
    return chunked, mixed


def test_chunked_prefill_matches_transformers(model_dir, reference):
    prompts = make_prompts(lens=(100, 37, 90, 5), seed=4)
    llm = chunked_llm(model_dir, block_size=8, num_gpu_blocks=128)
    assert engine_greedy(llm, prompts, MAX_TOKENS) == [hf_greedy(reference, p, MAX_TOKENS) for p in prompts]
    assert all(sum(n for *_, n in step) <= BUDGET for step in llm.steps_seen)
    assert _chunk_and_mix_happened(llm.steps_seen) == (True, True)


def test_a_chunk_cap_matches_transformers(model_dir, reference):
    # vLLM's --long-prefill-token-threshold 12 under the 32-token budget: every prompt goes 12 tokens at a time,
    # and two or more prompts' chunks share a step
    prompts = make_prompts(lens=(100, 37, 90, 5), seed=4)
    llm = chunked_llm(model_dir, block_size=8, num_gpu_blocks=128, long_prefill_token_threshold=12)
    assert engine_greedy(llm, prompts, MAX_TOKENS) == [hf_greedy(reference, p, MAX_TOKENS) for p in prompts]
    assert max(n for step in llm.steps_seen for *_, n in step) == 12
    assert any(sum(n == 12 for *_, n in step) >= 2 for step in llm.steps_seen)


def unchunked_llm(model_dir, budget: int, **kwargs) -> LLM:
    """vLLM v1 with --no-enable-chunked-prefill: the budget holds max_model_len, as vLLM requires."""
    llm = LLM(model_dir, enable_chunked_prefill=False, max_num_batched_tokens=budget, max_model_len=budget,
              max_num_seqs=8, block_size=8, **kwargs)
    steps = []
    llm.engine.step_observer = lambda out: steps.append(
        [(s.num_computed_tokens, s.num_tokens, n) for s, n in zip(out.seqs, out.scheduled_tokens())])
    llm.steps_seen = steps
    return llm


def test_without_chunked_prefill_matches_transformers(model_dir, reference):
    # Each prompt runs whole, and one larger than the budget a step has left waits for a later step
    prompts = make_prompts(lens=(100, 37, 90, 5), seed=4)
    llm = unchunked_llm(model_dir, 128, num_gpu_blocks=128)
    assert engine_greedy(llm, prompts, MAX_TOKENS) == [hf_greedy(reference, p, MAX_TOKENS) for p in prompts]
    steps = llm.steps_seen
    assert all(n == total - computed for step in steps for computed, total, n in step)     # nothing chunked
    assert [n for *_, n in steps[0]] == [100]         # the 37-token prompt would not fit the 28 left
    assert _chunk_and_mix_happened(steps) == (False, True)


def test_without_chunked_prefill_matches_transformers_under_preemption(model_dir, reference):
    prompts = make_prompts(lens=(44, 36, 40), seed=5)
    max_tokens = 16
    # 13 blocks of 8 (12 usable past the null block) cannot hold the three ~56-token sequences.
    llm = unchunked_llm(model_dir, 96, num_gpu_blocks=13)
    assert engine_greedy(llm, prompts, max_tokens) == [hf_greedy(reference, p, max_tokens) for p in prompts]
    assert llm.engine.scheduler.preemptions["recompute"] > 0
    assert all(n == total - computed for step in llm.steps_seen for computed, total, n in step)


def test_priority_scheduling_matches_transformers_under_preemption(model_dir, reference):
    # vLLM's --scheduling-policy priority: the priority-0 request runs first and keeps its blocks; the
    # priority-2 one is preempted first when the 12 usable blocks run out
    prompts = make_prompts(lens=(44, 36, 40), seed=5)
    max_tokens = 16
    llm = chunked_llm(model_dir, block_size=8, num_gpu_blocks=13, max_model_len=96, scheduling_policy="priority")
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False, priority=[2, 0, 1])
    assert [o.outputs[0].token_ids for o in outs] == [hf_greedy(reference, p, max_tokens) for p in prompts]
    assert llm.engine.scheduler.preemptions["recompute"] > 0
    assert llm.steps_seen[0][0][1] == 36              # the priority-0 prompt goes first
    with pytest.raises(ValueError, match="got 2 priorities for 3 prompts"):
        llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False, priority=[0, 1])


def test_chunked_prefill_matches_transformers_under_preemption(model_dir, reference):
    prompts = make_prompts(lens=(44, 36, 40), seed=5)
    max_tokens = 16
    # 13 blocks of 8 (12 usable past the null block) cannot hold the three ~56-token sequences.
    llm = chunked_llm(model_dir, block_size=8, num_gpu_blocks=13, max_model_len=96)
    got = engine_greedy(llm, prompts, max_tokens)
    assert llm.engine.scheduler.preemptions["recompute"] > 0
    assert got == [hf_greedy(reference, p, max_tokens) for p in prompts]
    assert llm.engine.allocator.num_free_blocks() == 12


def test_chunked_prefill_with_prefix_caching_matches_transformers(model_dir, reference):
    shared = make_prompts(lens=(70,), seed=7)[0]
    prompts = make_prompts(lens=(30, 9, 21), seed=8, prefix=shared)
    llm = chunked_llm(model_dir, block_size=8, num_gpu_blocks=128, enable_prefix_caching=True)
    first = engine_greedy(llm, prompts[:1], MAX_TOKENS)
    llm.steps_seen.clear()
    rest = engine_greedy(llm, prompts[1:], MAX_TOKENS)
    assert first + rest == [hf_greedy(reference, p, MAX_TOKENS) for p in prompts]
    # The shared 64 tokens (8 full blocks) come from the cache: the later prompts'
    # first chunks start after them.
    starts = [computed for step in llm.steps_seen for computed, _, n in step if n > 1]
    assert 64 in starts


@pytest.mark.slow
def test_chunked_prefill_with_prefix_caching_under_preemption(model_dir, reference):
    prompts = make_prompts(lens=(44, 36, 40), seed=5)
    max_tokens = 16
    llm = chunked_llm(model_dir, block_size=8, num_gpu_blocks=13, enable_prefix_caching=True, max_model_len=96)
    got = engine_greedy(llm, prompts, max_tokens)
    assert llm.engine.scheduler.preemptions["recompute"] > 0
    assert got == [hf_greedy(reference, p, max_tokens) for p in prompts]
