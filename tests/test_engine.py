"""The engine end to end against Hugging Face transformers (fp32, CPU, greedy).

Same model folder, same prompts: the engine must produce the same tokens as
``generate(do_sample=False)``, also when a tiny KV cache forces preemption
(recompute and swap), with prefix caching and shared prefixes, and for beam
search.
"""
from __future__ import annotations

import pytest
import torch

from engine import LLM, LLMEngine, SamplingParams
from reference_helpers import greedy_runners, make_prompts, prefix_cached_greedy
from tiny_models import hf_model, save_tiny_model, save_word_tokenizer

PROMPT_LENS = (5, 17, 11, 1, 24, 9)
MAX_TOKENS = 12
engine_greedy, hf_greedy = greedy_runners(MAX_TOKENS)


@pytest.fixture(scope="module", params=["llama", "opt", "gpt2"])
def model_dir(request, tmp_path_factory):
    return save_tiny_model(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def reference(model_dir):
    return hf_model(model_dir)


@pytest.mark.parametrize("block_size", [8, 16])
def test_greedy_matches_transformers(model_dir, reference, block_size):
    prompts = make_prompts(PROMPT_LENS, seed=0)
    llm = LLM(model_dir, block_size=block_size, num_gpu_blocks=64)
    assert engine_greedy(llm, prompts) == [hf_greedy(reference, p) for p in prompts]


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_greedy_matches_transformers_under_preemption(model_dir, reference, mode):
    prompts = make_prompts(lens=(20, 14, 18, 9, 22, 16), seed=1)
    max_tokens = 20
    # 9 blocks of 8 slots cannot hold the six sequences' ~200 tokens at once.
    llm = LLM(model_dir, block_size=8, num_gpu_blocks=9, preemption_mode=mode, swap_space=0.01,
              max_model_len=64, policy="paper")   # what one sequence can hold in 9 blocks: the engine refuses more
    got = engine_greedy(llm, prompts, max_tokens)
    preemptions = llm.engine.scheduler.preemptions
    assert preemptions[mode] > 0
    assert got == [hf_greedy(reference, p, max_tokens) for p in prompts]
    assert llm.engine.allocator.num_free_blocks() == 9


def test_prefix_caching_with_shared_prefixes_matches_transformers(model_dir, reference):
    prompts, first, rest, computed = prefix_cached_greedy(model_dir, MAX_TOKENS)
    assert first + rest == [hf_greedy(reference, p) for p in prompts]
    # The later prompts reuse the cached prefix blocks: only the rest is computed.
    assert computed == [len(p) - 16 for p in prompts[1:]]


@pytest.mark.parametrize("policy", ["vllm-v1", "paper"])
def test_a_cache_salt_shares_prefix_blocks_only_with_requests_of_its_salt(model_dir, reference, policy):
    """vLLM's `cache_salt` (a dict prompt's, as vLLM's offline API takes it): a prompt's cached blocks are a hit
    only for requests of the same salt, so one tenant cannot time prefix hits on another's prompts; a request's
    n children run with its salt. Each output says how many prompt tokens it found cached (vLLM's
    RequestOutput.num_cached_tokens)."""
    prompt = make_prompts(lens=(20,), seed=11)[0]
    llm = LLM(model_dir, block_size=8, num_gpu_blocks=64, policy=policy, enable_prefix_caching=True)
    computed = []
    llm.engine.step_observer = lambda out: computed.extend(
        s.num_tokens - s.num_computed_tokens for s in out.seqs if s.num_computed_tokens < s.prompt_len)

    def run(salt, n=1):
        computed.clear()
        params = SamplingParams(n=n, temperature=0, max_tokens=MAX_TOKENS)
        out = llm.generate([{"prompt_token_ids": prompt} | ({"cache_salt": salt} if salt else {})], params,
                           use_tqdm=False)[0]
        assert [o.token_ids for o in out.outputs] == [hf_greedy(reference, prompt)] * n
        assert out.num_cached_tokens == len(prompt) - computed[0]
        return list(computed)
    assert [run(salt)[0] for salt in (None, "tenant-a", "tenant-a", "tenant-b", None)] == [20, 20, 4, 20, 4]
    if policy == "vllm-v1":                      # n child requests
        assert run("tenant-a", n=2) == [4, 4]
        assert run("tenant-c", n=2) == [20, 4]   # (the second child hits the first's blocks, cached at admission)
    with pytest.raises(ValueError, match="^Parameter 'cache_salt' must be a non-empty string if provided.$"):
        llm.engine.add_request("x", {"prompt_token_ids": prompt, "cache_salt": ""})


def test_beam_search_matches_transformers(model_dir, reference):
    prompts = make_prompts(lens=(6, 13), seed=5)
    llm = LLM(model_dir, block_size=8, num_gpu_blocks=64, policy="paper")   # vLLM v1 has no beam search
    for length_penalty in (1.0, 0.5):
        params = SamplingParams(n=1, best_of=3, use_beam_search=True, max_tokens=8,
                                length_penalty=length_penalty)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        for prompt, out in zip(prompts, outs):
            with torch.no_grad():
                ref = reference.generate(torch.tensor([prompt]), do_sample=False, num_beams=3,
                                         max_new_tokens=8, length_penalty=length_penalty,
                                         early_stopping=False, pad_token_id=0, eos_token_id=2)
            assert out.outputs[0].token_ids == ref[0, len(prompt):].tolist()
    assert llm.engine.allocator.num_free_blocks() == 64


def test_parallel_samples_are_seeded_and_share_prompt_blocks(model_dir):
    engine = LLMEngine(model_dir, block_size=8, num_gpu_blocks=64, policy="paper")   # forks inside one group
    prompt = make_prompts(lens=(20,), seed=9)[0]           # 3 blocks, the last partly filled
    params = SamplingParams(n=3, temperature=1.0, top_k=50, seed=42, max_tokens=6)
    engine.add_request("a", {"prompt_token_ids": prompt}, params)
    engine.step()                                          # prefill, then fork into 3 samples
    group = engine.scheduler.running[0]
    assert len(group.seqs) == 3
    assert engine.allocator.num_used_blocks() == 3         # the prompt's blocks are shared
    engine.step()                                          # each sample copies the shared last block
    assert engine.allocator.num_used_blocks() == 3 + 2
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    again = LLM(model_dir, block_size=8, num_gpu_blocks=64, policy="paper").generate(
        [{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
    assert [o.token_ids for o in outs[0].outputs] == [o.token_ids for o in again.outputs]
    assert len({tuple(o.token_ids) for o in again.outputs}) > 1   # samples differ from each other


def test_vllm_v1_fans_n_out_into_child_requests_sharing_the_prompt(model_dir, reference):
    """vLLM v1's parallel sampling (vllm/v1/engine/parallel_sampling.py): n child requests above the
    scheduler, their prompt shared through the prefix cache, their outputs gathered into one."""
    prompts = make_prompts(lens=(20, 9), seed=3)
    engine = LLMEngine(model_dir, block_size=8, num_gpu_blocks=64)      # the default policy: vllm-v1
    assert engine.deployment.policy == "vllm-v1" and engine.deployment.enable_prefix_caching
    params = SamplingParams(n=3, temperature=0, max_tokens=MAX_TOKENS)
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), {"prompt_token_ids": prompt}, params)
    assert len(engine.scheduler.waiting) == 6                           # 2 requests x 3 children
    assert [g.request_id for g in engine.scheduler.waiting][:3] == ["0_0", "1_0", "2_0"]
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    assert sorted(o.request_id for o in outs) == ["0", "1"]
    for out in outs:
        prompt = prompts[int(out.request_id)]
        assert [o.index for o in out.outputs] == [0, 1, 2]
        assert [o.token_ids for o in out.outputs] == [hf_greedy(reference, prompt)] * 3
        assert out.metrics.num_seqs == 3 and out.metrics.output_len == 3 * MAX_TOKENS
        assert 0 <= out.metrics.ttft <= out.metrics.e2e
    # The second and third child of the 20-token prompt hit its two full blocks.
    assert engine.scheduler.prefix_hit_tokens == 2 * 16 + 2 * 8
    assert engine.allocator.num_free_blocks() == 64 - 1 and not engine.groups   # all but vLLM's null block


def test_vllm_v1_refuses_beam_search_in_one_line(model_dir):
    engine = LLMEngine(model_dir, block_size=8, num_gpu_blocks=64)
    beam = SamplingParams(n=1, best_of=2, use_beam_search=True, max_tokens=4)
    with pytest.raises(ValueError, match="^beam search is not supported by the vllm-v1 policy.*--policy paper$"):
        engine.add_request("b", {"prompt_token_ids": [5, 6, 7]}, beam)
    assert "--policy paper" in engine.unservable([5, 6, 7], beam)
    assert engine.unservable([5, 6, 7], SamplingParams(n=300, max_tokens=4)) is None   # each child fits


def test_too_long_prompt_is_rejected_alone(model_dir, reference):
    prompts = make_prompts(lens=(7, 300, 5), seed=11)     # 300 > max_position_embeddings 256
    llm = LLM(model_dir, block_size=16, num_gpu_blocks=64)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=MAX_TOKENS), use_tqdm=False)
    assert outs[1].outputs[0].finish_reason == "rejected" and "exceeds" in outs[1].error
    assert [outs[0].outputs[0].token_ids, outs[2].outputs[0].token_ids] == [
        hf_greedy(reference, prompts[0]), hf_greedy(reference, prompts[2])]
    assert outs[0].metrics.ttft >= 0 and outs[0].metrics.e2e >= outs[0].metrics.ttft


def test_bad_arguments_give_clear_errors(model_dir, tmp_path):
    with pytest.raises(ValueError, match="block_size 12"):
        LLM(model_dir, block_size=12)
    with pytest.raises(ValueError, match="no config.json"):
        LLM(str(tmp_path))
    llm = LLM(model_dir, num_gpu_blocks=8, max_model_len=112)
    with pytest.raises(ValueError, match="no tokenizer"):
        llm.generate("hello", use_tqdm=False)
    with pytest.raises(ValueError, match="stop strings need the model's tokenizer"):
        llm.generate({"prompt_token_ids": [5, 6]}, SamplingParams(stop=["x"]), use_tqdm=False)
    with pytest.raises(ValueError, match=r"token id 100000 is out of range: the model's vocabulary has 200 tokens"):
        llm.generate({"prompt_token_ids": [5, 100000]}, use_tqdm=False)
    with pytest.raises(ValueError, match="prompt 1: token id -3"):
        llm.generate([[5, 6], [7, -3]], use_tqdm=False)
    with pytest.raises(ValueError, match=r"token ids must be integers, got 4\.0 \(float\)"):
        llm.generate({"prompt_token_ids": [5, 4.0]}, use_tqdm=False)
    with pytest.raises(ValueError, match=r"token ids must be integers, got True \(bool\)"):
        llm.generate({"prompt_token_ids": [5, True]}, use_tqdm=False)
    for params, words in (({"temperature": float("nan")}, "temperature must be a finite number"),
                          ({"seed": 2 ** 70}, "seed must be a signed 64-bit integer"),
                          ({"max_tokens": 3.5}, "max_tokens must be an integer")):
        with pytest.raises(ValueError, match=words):     # (refused up front, not by the step that meets them)
            SamplingParams(**params)
    assert not llm.engine.has_unfinished_requests()   # nothing of a refused batch is left queued
    # numpy's and torch's integers are integers; max_tokens None runs to the context, as vLLM's
    import numpy as np
    same = [llm.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)[0]
            .outputs[0].token_ids for ids in ([5, 6, 7], list(np.array([5, 6, 7])), torch.tensor([5, 6, 7]))]
    assert same[0] == same[1] == same[2]
    to_the_end = llm.generate({"prompt_token_ids": [5, 6, 7]}, SamplingParams(temperature=0, max_tokens=None,
                                                                              ignore_eos=True), use_tqdm=False)[0]
    assert len(to_the_end.outputs[0].token_ids) == 112 - 3
    with pytest.raises(ValueError, match="tensor_parallel_size=2 is not supported.*must be 1"):
        LLM(model_dir, tensor_parallel_size=2)
    with pytest.raises(TypeError, match="unexpected keyword argument 'tensor_paralel_size'"):
        LLM(model_dir, tensor_paralel_size=1)
    # vLLM refuses a context past the model's positions (this engine used to cut it down without a word)
    positions = LLM(model_dir, num_gpu_blocks=64).engine.max_model_len
    with pytest.raises(ValueError, match=f"^max_model_len {positions + 1} is greater than the model's {positions} "
                                         r"positions \(max_position_embeddings\)$"):
        LLM(model_dir, max_model_len=positions + 1)
    # a cache no memory holds is refused before anything is allocated (zero-filling it would take hours)
    with pytest.raises(ValueError, match=r"^a KV cache of 10,000,000,000,000 blocks and 0 swap blocks \([\d,]+ "
                                         r"bytes each\) needs [\d,.]+ GiB on the host, more than its [\d,.]+ GiB free"):
        LLM(model_dir, num_gpu_blocks=10**13)


def test_string_prompts_use_the_model_folders_tokenizer(tmp_path):
    folder = save_tiny_model("llama", tmp_path / "with-tokenizer")
    save_word_tokenizer(folder)
    llm = LLM(folder, block_size=8, num_gpu_blocks=32, max_model_len=128)
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, logprobs=True)
    by_text, by_ids = llm.generate(["w5 w17 w42", {"prompt_token_ids": [5, 17, 42]}], params, use_tqdm=False)
    assert by_text.prompt == "w5 w17 w42" and by_text.prompt_token_ids == [5, 17, 42]
    out = by_text.outputs[0]
    assert out.token_ids == by_ids.outputs[0].token_ids
    assert out.text == " ".join(f"w{t}" for t in out.token_ids)
    # vLLM's shape: per position {token id: Logprob(logprob, rank, decoded_token)}, the sampled token included.
    assert len(out.logprobs) == 5
    chosen = [pos[t] for pos, t in zip(out.logprobs, out.token_ids)]
    assert all(lp.logprob <= 0 and lp.rank == 1 for lp in chosen)   # greedy picks the top token
    assert [lp.decoded_token for lp in chosen] == [f"w{t}" for t in out.token_ids]
    assert out.cumulative_logprob == pytest.approx(sum(lp.logprob for lp in chosen))
