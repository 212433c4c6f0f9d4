"""The torch side of the engine against transformers, on tiny random-weight checkpoints.

Every model is saved with save_pretrained(safe_serialization=True) and loaded
back through engine.models.load_model, the same path a real checkpoint takes.
The reference is HF's AutoModelForCausalLM loaded from the same folder (eager
attention), in fp32, so logits must agree to ~1e-4.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    OPTConfig,
    OPTForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

import cuda_ext
from engine import sampling
from engine.kv_cache import KVCache, bytes_per_block, num_blocks_for_budget
from engine.model_runner import ModelRunner, SequenceInput
from engine.models import load_model, resolve_dtype

ATOL = 1e-4
NUM_BLOCKS = 48


def llama_config(**overrides):
    # GQA: 4 query heads share 2 kv heads; head_dim 16.
    base = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=256, max_position_embeddings=256)
    return LlamaConfig(**{**base, **overrides})


def opt_config(**overrides):
    base = dict(hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=256,
                max_position_embeddings=256, word_embed_proj_dim=64)
    return OPTConfig(**{**base, **overrides})


def build_checkpoint(folder, model_cls, config, **save_kwargs) -> str:
    torch.manual_seed(0)
    model = model_cls(config).eval()
    # HF initializes norms to exactly 1 and biases to 0; random values make
    # the comparison sensitive to every one of those parameters being loaded.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or "ln_" in name or name.endswith("bias"):
                param.add_(torch.randn_like(param) * 0.1)
    model.save_pretrained(folder, safe_serialization=True, **save_kwargs)
    return str(folder)


CHECKPOINTS = {
    "llama": (LlamaForCausalLM, llama_config),
    "llama3-rope": (LlamaForCausalLM, lambda: llama_config(rope_scaling={
        "rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}, rope_theta=500000.0)),
    "qwen2": (Qwen2ForCausalLM, lambda: Qwen2Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256, max_position_embeddings=256)),
    # Phi-3/Phi-4: fused qkv and gate_up in the checkpoint itself; a 10-token window (Phi-3-mini has one),
    # shorter than the longest prompts.
    "phi3": (Phi3ForCausalLM, lambda: Phi3Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256, max_position_embeddings=256, sliding_window=10,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "opt": (OPTForCausalLM, opt_config),
    # OPT-350m shape: post-norm and narrower word embeddings with project_in/out.
    "opt-postnorm": (OPTForCausalLM, lambda: opt_config(do_layer_norm_before=False, word_embed_proj_dim=32)),
    "gpt2": (GPT2LMHeadModel, lambda: GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=256)),
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """checkpoint(name) -> folder, built once per module."""
    built: dict[str, str] = {}

    def get(name: str) -> str:
        if name not in built:
            model_cls, make_config = CHECKPOINTS[name]
            built[name] = build_checkpoint(tmp_path_factory.mktemp(name), model_cls, make_config())
        return built[name]

    return get


def hf_model(folder: str):
    return AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()


def hf_logits(model, token_ids: list[int]) -> torch.Tensor:
    """[len(token_ids), vocab] logits of a full forward."""
    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0].float()


def make_runner(folder: str, block_size: int, **kwargs) -> ModelRunner:
    return ModelRunner(folder, block_size=block_size, num_gpu_blocks=NUM_BLOCKS, num_cpu_blocks=8,
                       dtype="float32", device="cpu", **kwargs)


def consecutive_tables(lengths: list[int], block_size: int, first_block: int = 0) -> list[list[int]]:
    tables, next_block = [], first_block
    for length in lengths:
        n = -(-length // block_size)
        tables.append(list(range(next_block, next_block + n)))
        next_block += n
    return tables


def prompts_for(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    # Lengths straddle block boundaries for both block sizes (8 and 16), and
    # one prompt is a single token (a prefill of length 1).
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (5, 17, 11, 1, 24)]


def run_greedy(runner: ModelRunner, prompts: list[list[int]], steps: int):
    """Batched prefill then `steps` batched decode steps; returns generated tokens and per-step logits."""
    tables = consecutive_tables([len(p) + steps for p in prompts], runner.block_size)
    logits = runner.execute([SequenceInput(p, 0, t) for p, t in zip(prompts, tables)])
    generated, all_logits = [[int(x)] for x in sampling.greedy(logits)], [[row] for row in logits]
    for _ in range(steps - 1):
        seqs = [SequenceInput([out[-1]], len(p) + len(out) - 1, t) for p, out, t in zip(prompts, generated, tables)]
        logits = runner.execute(seqs)
        for out, row_logits, row in zip(generated, all_logits, logits):
            out.append(int(row.argmax()))
            row_logits.append(row)
    return generated, all_logits


@pytest.mark.parametrize("block_size", [8, 16])
@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_greedy_generation_matches_transformers(checkpoint, name, block_size):
    check_greedy_against_transformers(checkpoint(name), block_size)


def check_greedy_against_transformers(folder: str, block_size: int) -> None:
    """A batched prefill and decodes: every step's logits to ATOL, and the tokens of HF's generate."""
    runner = make_runner(folder, block_size)
    reference = hf_model(folder)
    prompts = prompts_for(runner.vocab_size)
    steps = 6
    generated, step_logits = run_greedy(runner, prompts, steps)
    for prompt, out, logits in zip(prompts, generated, step_logits):
        expected = hf_logits(reference, prompt + out)[len(prompt) - 1 : len(prompt) - 1 + steps]
        torch.testing.assert_close(torch.stack(logits), expected, atol=ATOL, rtol=0)
        with torch.no_grad():
            # eos_token_id=None: random weights may emit EOS early; both sides run all steps.
            hf_out = reference.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                        max_new_tokens=steps, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert out == hf_out[0, len(prompt):].tolist()


def test_mixed_prefill_and_decode_step_keeps_caller_order(checkpoint):
    """Continuous batching: a step mixing decodes and prefills, decodes listed first."""
    folder = checkpoint("llama")
    runner, reference = make_runner(folder, 8), hf_model(folder)
    a, b, c = prompts_for(runner.vocab_size)[:3]
    ta, tb, tc = consecutive_tables([len(a) + 2, len(b) + 1, len(c) + 1], 8)
    first = runner.execute([SequenceInput(a, 0, ta)])
    token_a = int(first[0].argmax())
    logits = runner.execute([SequenceInput([token_a], len(a), ta), SequenceInput(b, 0, tb), SequenceInput(c, 0, tc)])
    torch.testing.assert_close(logits[0], hf_logits(reference, a + [token_a])[-1], atol=ATOL, rtol=0)
    torch.testing.assert_close(logits[1], hf_logits(reference, b)[-1], atol=ATOL, rtol=0)
    torch.testing.assert_close(logits[2], hf_logits(reference, c)[-1], atol=ATOL, rtol=0)


@pytest.mark.parametrize("cached", [16, 13])
@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_prefill_after_cached_prefix_matches_full_prefill(checkpoint, name, cached):
    """Prefix caching (cached = full blocks) and recompute of a partial block (13)."""
    folder = checkpoint(name)
    runner = make_runner(folder, 8)
    prompt = prompts_for(runner.vocab_size)[4]  # 24 tokens
    full = runner.execute([SequenceInput(prompt, 0, [0, 1, 2])])
    table = [5, 9, 3]  # scattered blocks on purpose
    runner.execute([SequenceInput(prompt[:cached], 0, table)])
    rest = runner.execute([SequenceInput(prompt[cached:], cached, table)])
    torch.testing.assert_close(rest, full, atol=ATOL, rtol=0)
    torch.testing.assert_close(rest[0], hf_logits(hf_model(folder), prompt)[-1], atol=ATOL, rtol=0)


def test_torch_reference_backend_gives_the_same_logits(checkpoint, monkeypatch):
    folder = checkpoint("llama")
    prompts = prompts_for(256)[:3]
    compiled_tokens, compiled_logits = run_greedy(make_runner(folder, 8), prompts, 3)
    monkeypatch.setenv("PAGED_KERNELS", "torch")
    cuda_ext.reset()
    try:
        assert cuda_ext.ops.backend == "torch"
        tokens, logits = run_greedy(make_runner(folder, 8), prompts, 3)
    finally:
        monkeypatch.delenv("PAGED_KERNELS")
        cuda_ext.reset()
    assert tokens == compiled_tokens
    for ours, theirs in zip(logits, compiled_logits):
        torch.testing.assert_close(torch.stack(ours), torch.stack(theirs), atol=ATOL, rtol=0)


def test_swap_out_and_in_preserves_a_sequence(checkpoint):
    folder = checkpoint("llama")
    runner = make_runner(folder, 8)
    prompt = prompts_for(runner.vocab_size)[1]  # 17 tokens -> 3 blocks
    logits = runner.execute([SequenceInput(prompt, 0, [0, 1, 2])])
    token = int(logits[0].argmax())
    expected = runner.execute([SequenceInput([token], len(prompt), [0, 1, 2])])
    runner.swap_out({0: 4, 1: 5, 2: 6})
    for key, value in runner.kv_cache.gpu:
        key.zero_()
        value.zero_()
    runner.swap_in({4: 10, 5: 11, 6: 12})  # back into different device blocks
    after = runner.execute([SequenceInput([token], len(prompt), [10, 11, 12])])
    torch.testing.assert_close(after, expected, atol=1e-6, rtol=0)


def test_copy_on_write_fork_continues_both_branches(checkpoint):
    """Two sequences share full blocks; the partial last block is copied before they diverge."""
    folder = checkpoint("llama")
    runner, reference = make_runner(folder, 8), hf_model(folder)
    prompt = prompts_for(runner.vocab_size)[2]  # 11 tokens: block 0 full, block 1 partial
    runner.execute([SequenceInput(prompt, 0, [0, 1])])
    runner.copy_blocks([(1, 7)])
    logits = runner.execute([SequenceInput([3], len(prompt), [0, 1]), SequenceInput([4], len(prompt), [0, 7])])
    torch.testing.assert_close(logits[0], hf_logits(reference, prompt + [3])[-1], atol=ATOL, rtol=0)
    torch.testing.assert_close(logits[1], hf_logits(reference, prompt + [4])[-1], atol=ATOL, rtol=0)


def test_kv_cache_copy_and_swap_round_trip():
    cache = KVCache(num_layers=2, num_kv_heads=2, head_size=16, block_size=4, num_gpu_blocks=6,
                    num_cpu_blocks=3, dtype=torch.float32, device="cpu")
    assert cache.gpu[0][0].shape == (6, 2, 4, 4, 4)  # x = 4 for fp32
    assert cache.gpu[0][1].shape == (6, 2, 16, 4)
    for key, value in cache.gpu:
        key.copy_(torch.randn_like(key))
        value.copy_(torch.randn_like(value))
    original = [(k.clone(), v.clone()) for k, v in cache.gpu]
    cache.copy_blocks([(1, 5), (2, 0)])
    for (key, value), (k0, v0) in zip(cache.gpu, original):
        assert torch.equal(key[5], k0[1]) and torch.equal(value[5], v0[1])
        assert torch.equal(key[0], k0[2]) and torch.equal(value[0], v0[2])
        assert torch.equal(key[3], k0[3])  # untouched
    cache.swap_out({3: 2, 4: 0})
    for key, value in cache.gpu:
        key[3:5] = 0
        value[3:5] = 0
    cache.swap_in({2: 3, 0: 1})
    for (key, value), (k0, v0) in zip(cache.gpu, original):
        assert torch.equal(key[3], k0[3]) and torch.equal(value[3], v0[3])
        assert torch.equal(key[1], k0[4]) and torch.equal(value[1], v0[4])


def test_cache_sizing_from_budget(checkpoint):
    assert bytes_per_block(2, 2, 16, 8, torch.float32) == 2 * 2 * 2 * 16 * 8 * 4
    assert bytes_per_block(2, 2, 16, 8, torch.float16) == 2 * 2 * 2 * 16 * 8 * 2
    assert num_blocks_for_budget(10 * 4096 + 4095, 2, 2, 16, 8, torch.float32) == 10
    runner = ModelRunner(checkpoint("llama"), block_size=8, num_gpu_blocks=None, num_cpu_blocks=2,
                         device="cpu", kv_cache_memory_bytes=25 * 4096)
    assert runner.num_gpu_blocks == 25 and runner.kv_cache.gpu[0][0].shape[0] == 25
    assert runner.dtype == torch.float32 and runner.max_model_len == 256 and runner.vocab_size == 256
    assert runner.eos_token_id == 2


def test_a_runner_beside_another_runs_its_weights_on_a_cache_of_its_own(checkpoint):
    """weights_of: the same parameters in the same memory (a profile times the live engine's own), while
    each runner's KV cache holds its own sequences."""
    folder = checkpoint("llama")
    live = make_runner(folder, 8)
    beside = ModelRunner(folder, block_size=8, num_gpu_blocks=NUM_BLOCKS // 2, device="cpu", weights_of=live)
    assert beside.model is live.model and beside.model_path == live.model_path == folder
    assert beside.kv_cache is not live.kv_cache and beside.num_gpu_blocks == NUM_BLOCKS // 2
    a, b = prompts_for(live.vocab_size)[:2]
    first = live.execute([SequenceInput(a, 0, [0, 1, 2])])
    beside.execute([SequenceInput(b, 0, [0, 1, 2])])           # the same block ids, in its own cache
    token = int(first[0].argmax())
    logits = live.execute([SequenceInput([token], len(a), [0, 1, 2])])
    torch.testing.assert_close(logits[0], hf_logits(hf_model(folder), a + [token])[-1], atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match="weights_of runs"):         # another checkpoint's weights: refused
        ModelRunner(checkpoint("gpt2"), block_size=8, num_gpu_blocks=4, device="cpu", weights_of=live)


def test_sharded_checkpoint_loads(tmp_path):
    folder = build_checkpoint(tmp_path, LlamaForCausalLM, llama_config(), max_shard_size="40KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    model, config = load_model(folder, "float32", "cpu")
    assert config.model_type == "llama"
    runner = make_runner(folder, 16)
    prompt = prompts_for(256)[1]
    logits = runner.execute([SequenceInput(prompt, 0, [0, 1])])
    torch.testing.assert_close(logits[0], hf_logits(hf_model(folder), prompt)[-1], atol=ATOL, rtol=0)


def test_tied_embeddings_share_the_input_matrix(tmp_path):
    folder = build_checkpoint(tmp_path, LlamaForCausalLM, llama_config(tie_word_embeddings=True))
    assert "lm_head.weight" not in load_file(os.path.join(folder, "model.safetensors"))
    model, _ = load_model(folder, "float32", "cpu")
    assert model.lm_head.weight is model.embed_tokens.weight
    runner = make_runner(folder, 8)
    prompt = prompts_for(256)[0]
    logits = runner.execute([SequenceInput(prompt, 0, [0])])
    torch.testing.assert_close(logits[0], hf_logits(hf_model(folder), prompt)[-1], atol=ATOL, rtol=0)


def test_untied_checkpoint_without_lm_head_falls_back_to_tying(tmp_path):
    folder = build_checkpoint(tmp_path, LlamaForCausalLM, llama_config())
    path = os.path.join(folder, "model.safetensors")
    tensors = load_file(path)
    del tensors["lm_head.weight"]
    save_file(tensors, path, metadata={"format": "pt"})
    model, _ = load_model(folder, "float32", "cpu")
    assert model.lm_head.weight is model.embed_tokens.weight


def test_missing_or_unknown_weights_are_errors(tmp_path):
    folder = build_checkpoint(tmp_path, GPT2LMHeadModel, GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64,
                                                                     n_positions=64))
    path = os.path.join(folder, "model.safetensors")
    tensors = load_file(path)
    broken = {k: v for k, v in tensors.items() if k != "transformer.h.0.mlp.c_fc.bias"}
    save_file(broken, path, metadata={"format": "pt"})
    with pytest.raises(ValueError, match="c_fc.bias"):
        load_model(folder, "float32", "cpu")
    save_file({**tensors, "transformer.h.0.mystery.weight": torch.zeros(2)}, path, metadata={"format": "pt"})
    with pytest.raises(ValueError, match="mystery"):
        load_model(folder, "float32", "cpu")


def test_auto_dtype_uses_fp32_for_fp16_on_cpu():
    config = llama_config()
    config.dtype = torch.float16
    assert resolve_dtype("auto", config, torch.device("cpu")) == torch.float32
    assert resolve_dtype("auto", config, torch.device("cuda")) == torch.float16
    config.dtype = torch.bfloat16
    assert resolve_dtype("auto", config, torch.device("cpu")) == torch.bfloat16
    assert resolve_dtype("float16", config, torch.device("cpu")) == torch.float16


# -- sampling --

def test_sampling_is_reproducible_per_request_seed():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))

    def draw(seeds):
        gens = [sampling.make_generator(s) for s in seeds]
        return [sampling.sample(logits, 1.0, 0, 1.0, gens).tolist() for _ in range(20)]

    assert draw([1, 2, 3]) == draw([1, 2, 3])
    assert draw([1, 2, 3]) != draw([4, 5, 6])
    # A row's draws depend only on its own generator, not on its neighbours.
    first_rows = [tokens[0] for tokens in draw([1, 7, 8])]
    assert first_rows == [tokens[0] for tokens in draw([1, 2, 3])]


@pytest.mark.parametrize("top_k,top_p", [(5, 1.0), (0, 0.7), (10, 0.5), (0, 0.0), (3, 0.99)])
def test_top_k_top_p_mask_matches_transformers(top_k, top_p):
    logits = torch.randn(4, 100, generator=torch.Generator().manual_seed(3)) * 2
    expected = logits.clone()
    if top_k:
        expected = TopKLogitsWarper(top_k)(None, expected)
    if top_p < 1.0:
        # transformers refuses p = 0; a tiny p is the same filter (keep one token).
        expected = TopPLogitsWarper(max(top_p, 1e-9))(None, expected)
    ours = sampling.mask_top_k_top_p(logits, top_k, top_p)
    assert torch.equal(torch.isinf(ours), torch.isinf(expected))
    assert torch.equal(ours[~torch.isinf(ours)], logits[~torch.isinf(ours)])


def test_top_p_keeps_smallest_set_reaching_p():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    kept = lambda p: (~torch.isinf(sampling.mask_top_k_top_p(logits, 0, p))).sum().item()  # noqa: E731
    assert kept(0.5) == 1 and kept(0.51) == 2 and kept(0.8) == 2 and kept(0.81) == 3 and kept(1.0) == 4
    assert kept(0.0) == 1


def test_sample_respects_masks_and_temperature_zero():
    logits = torch.randn(2, 30, generator=torch.Generator().manual_seed(4))
    top2 = set(logits[0].topk(2).indices.tolist())
    gens = [sampling.make_generator(9), sampling.make_generator(10)]
    for _ in range(50):
        tokens = sampling.sample(logits, [1.5, 0.0], [2, 0], [1.0, 0.3], gens)
        assert tokens[0].item() in top2
        assert tokens[1].item() == logits[1].argmax().item()


def test_logprobs_and_top_k_logprobs():
    logits = torch.randn(2, 20, dtype=torch.float16)
    lp = sampling.logprobs(logits)
    assert lp.dtype == torch.float32
    torch.testing.assert_close(lp.exp().sum(-1), torch.ones(2))
    values, ids = sampling.top_k_logprobs(logits, 3)
    assert ids[:, 0].tolist() == sampling.greedy(logits).tolist()
    torch.testing.assert_close(values, lp.gather(-1, ids))
    assert (values[:, :-1] >= values[:, 1:]).all()


def test_partitioned_decode_kernel_gives_the_same_logits(checkpoint, monkeypatch):
    """Force paged_attention_v2 (chosen on CUDA for long contexts) through the same decode path."""
    import engine.attention

    folder = checkpoint("gpt2")
    prompts = prompts_for(256)[:3]
    _, v1_logits = run_greedy(make_runner(folder, 16), prompts, 3)
    monkeypatch.setattr(engine.attention, "use_v2", lambda *args: True)
    _, v2_logits = run_greedy(make_runner(folder, 16), prompts, 3)
    for ours, theirs in zip(v2_logits, v1_logits):
        torch.testing.assert_close(torch.stack(ours), torch.stack(theirs), atol=ATOL, rtol=0)


def test_half_precision_cache_layout(checkpoint):
    """bf16: x = 8 in the key layout; logits stay close to the fp32 reference."""
    folder = checkpoint("llama")
    runner = ModelRunner(folder, block_size=8, num_gpu_blocks=8, num_cpu_blocks=0, dtype="bfloat16", device="cpu")
    assert runner.kv_cache.gpu[0][0].shape == (8, 2, 2, 8, 8)
    prompt = prompts_for(256)[2]
    first = runner.execute([SequenceInput(prompt, 0, [0, 1])])
    token = int(first[0].argmax())
    logits = runner.execute([SequenceInput([token], len(prompt), [0, 1])])
    expected = hf_logits(hf_model(folder), prompt + [token])[-1]
    assert (logits[0] - expected).abs().max() < 0.05 * expected.abs().max()


def test_profile_run_needs_no_cache(checkpoint):
    runner = make_runner(checkpoint("opt"), 8)
    runner.profile_run(300)  # longer than max_model_len (256): split into two sequences
