"""Qwen3, Qwen3-MoE, Mixtral, gpt-oss, Phi-3 and Gemma 3 in the engine against transformers (fp32, CPU, greedy).

Each architecture is a tiny random-weight checkpoint written by save_pretrained
(tests/tiny_models.py: experts with top-2 routing, a dense layer among sparse
ones, YaRN positions, gpt-oss's sinks, biases, clamped experts and alternating
sliding/full layers with a window shorter than the prompts). The engine must
give exactly the tokens of ``generate(do_sample=False)``: with a roomy cache,
under recompute preemption, and with prefix caching over a shared prefix;
its logits must agree with transformers' to 1e-4. The attention-sink
argument of the paged kernels is checked here too: the torch reference
against dense attention written from the definition, the compiled CPU
kernels (and, on a GPU, the CUDA ones) against the reference.
"""
from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from cuda_ext import load_ops, reference
from engine import LLM
from engine.model_runner import ModelRunner, SequenceInput
from engine.models import load_model
from engine.models.moe import SparseMoeBlock
from reference_helpers import dense_attention, greedy_runners, make_prompts, prefix_cached_greedy
from tiny_models import hf_model, save_tiny_model

KINDS = ["qwen3", "qwen3_moe", "mixtral", "gpt_oss", "phi3", "gemma3_text"]
MAX_TOKENS = 10
engine_greedy, hf_greedy = greedy_runners(MAX_TOKENS)


@pytest.fixture(scope="module", params=KINDS)
def kind(request):
    return request.param


@pytest.fixture(scope="module")
def model_dir(kind, tmp_path_factory):
    return save_tiny_model(kind, tmp_path_factory.mktemp(kind))


@pytest.fixture(scope="module")
def reference_model(model_dir):
    return hf_model(model_dir)


# ---------------------------------------------------------------- the engine against transformers


def test_greedy_matches_transformers(model_dir, reference_model):
    prompts = make_prompts((5, 17, 11, 1, 24), seed=0)
    llm = LLM(model_dir, block_size=16, num_gpu_blocks=64)
    assert engine_greedy(llm, prompts) == [hf_greedy(reference_model, p) for p in prompts]


def test_greedy_matches_transformers_under_preemption(model_dir, reference_model):
    prompts = make_prompts((20, 14, 18, 9, 22), seed=1)
    max_tokens = 16
    # 8 blocks of 8 slots cannot hold the five sequences' ~160 tokens at once.
    llm = LLM(model_dir, block_size=8, num_gpu_blocks=8, preemption_mode="recompute", max_model_len=56)
    got = engine_greedy(llm, prompts, max_tokens)
    assert llm.engine.scheduler.preemptions["recompute"] > 0
    assert got == [hf_greedy(reference_model, p, max_tokens) for p in prompts]


def test_prefix_caching_with_a_shared_prefix_matches_transformers(model_dir, reference_model):
    prompts, first, rest, computed = prefix_cached_greedy(model_dir, MAX_TOKENS)
    assert first + rest == [hf_greedy(reference_model, p) for p in prompts]
    # The later prompts hit the cached prefix blocks: only the rest is computed.
    assert computed == [len(p) - 16 for p in prompts[1:]]


def test_logits_match_transformers_through_prefill_and_decode(model_dir, reference_model):
    """Closer than token equality: every step's logits, past the sliding window."""
    prompt = make_prompts((21,), seed=5)[0]
    runner = ModelRunner(model_dir, block_size=8, num_gpu_blocks=16, device="cpu")
    blocks = list(range(5))
    tokens = list(prompt)
    logits = runner.execute([SequenceInput(prompt, 0, blocks)])[0]
    for _ in range(5):
        with torch.no_grad():
            expected = reference_model(torch.tensor([tokens])).logits[0, -1]
        torch.testing.assert_close(logits, expected, atol=1e-4, rtol=0)
        tokens.append(int(logits.argmax()))
        logits = runner.execute([SequenceInput(tokens[-1:], len(tokens) - 1, blocks)])[0]


def test_gpt_oss_partitioned_decode_kernel_gives_the_same_tokens(tmp_path, monkeypatch):
    """paged_attention_v2 (what a GPU picks for long contexts) adds the sinks in its reduction."""
    import engine.attention

    folder = save_tiny_model("gpt_oss", tmp_path / "gpt_oss")
    prompts = make_prompts((13, 6), seed=9)
    monkeypatch.setattr(engine.attention, "use_v2", lambda *args: True)
    llm = LLM(folder, block_size=8, num_gpu_blocks=16, max_model_len=64)
    assert engine_greedy(llm, prompts, 8) == [hf_greedy(hf_model(folder), p, 8) for p in prompts]


def test_sink_attention_in_chunks_is_the_dense_definition(monkeypatch):
    """Prefill's sink attention (GQA, a causal sliding window) against float64 dense math; once in one
    pass and once with the query rows split into chunks of 3 (as a long prompt is)."""
    import engine.attention

    gen = torch.Generator().manual_seed(2)
    query, key, value = (torch.randn(h, n, 16, generator=gen) for h, n in ((4, 10), (2, 14), (2, 14)))
    sinks = torch.randn(4, generator=gen)
    mask = engine.attention.window_mask(10, 14, 6, "cpu")
    logits = torch.einsum("hnd,hld->hnl", query.double(), key.double().repeat_interleave(2, 0)) * 0.25
    logits = torch.cat([logits.masked_fill(~mask, float("-inf")), sinks.double().view(4, 1, 1).expand(4, 10, 1)], -1)
    expected = torch.softmax(logits, -1)[..., :-1] @ value.double().repeat_interleave(2, 0)
    whole = engine.attention.sink_attention(query, key, value, 0.25, mask, sinks)
    monkeypatch.setattr(engine.attention, "SINK_LOGITS_BYTES", 3 * 4 * 4 * 15)
    chunked = engine.attention.sink_attention(query, key, value, 0.25, mask, sinks)
    torch.testing.assert_close(whole.double(), expected, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(chunked, whole, atol=1e-6, rtol=1e-6)


# ---------------------------------------------------------------- loading


def test_moe_layers_follow_decoder_sparse_step_and_mlp_only_layers(tmp_path):
    model, _ = load_model(save_tiny_model("qwen3_moe", tmp_path / "m"), device="cpu")
    assert [isinstance(layer.mlp, SparseMoeBlock) for layer in model.layers] == [True, False, True]
    assert model.cuda_graphs is False
    dense, _ = load_model(save_tiny_model("qwen3", tmp_path / "d"), device="cpu")
    assert dense.cuda_graphs is True     # no experts: decode steps may be captured


@pytest.mark.parametrize("kind,moe", [("qwen3_moe", "mlp"), ("mixtral", "block_sparse_moe")])
def test_fused_expert_tensors_load_like_per_expert_ones(tmp_path, kind, moe):
    """transformers 5 keeps experts as 3-D tensors in memory; a checkpoint saved in that layout
    (experts.gate_up_proj [E, 2I, H], experts.down_proj [E, H, I], router mlp.gate) loads the same."""
    folder = save_tiny_model(kind, tmp_path / "per-expert")
    names = ("gate_proj", "up_proj", "down_proj") if kind == "qwen3_moe" else ("w1", "w3", "w2")
    tensors = load_file(f"{folder}/model.safetensors")
    fused = {}
    for layer in range(3):
        prefix = f"model.layers.{layer}.{moe}."
        if f"{prefix}gate.weight" not in tensors:
            continue                                   # a dense layer
        per_expert = {name: [] for name in names}
        expert = 0
        while f"{prefix}experts.{expert}.{names[0]}.weight" in tensors:
            for name in names:
                per_expert[name].append(tensors.pop(f"{prefix}experts.{expert}.{name}.weight"))
            expert += 1
        fused[f"model.layers.{layer}.mlp.gate.weight"] = tensors.pop(f"{prefix}gate.weight")
        gate, up, down = (torch.stack(per_expert[name]) for name in names)
        fused[f"model.layers.{layer}.mlp.experts.gate_up_proj"] = torch.cat([gate, up], dim=1)
        fused[f"model.layers.{layer}.mlp.experts.down_proj"] = down
    assert fused
    other = tmp_path / "fused"
    other.mkdir()
    (other / "config.json").write_text((tmp_path / "per-expert" / "config.json").read_text())
    save_file({**tensors, **fused}, str(other / "model.safetensors"))
    a, _ = load_model(folder, device="cpu")
    b, _ = load_model(str(other), device="cpu")
    params = dict(b.named_parameters())
    for name, param in a.named_parameters():
        assert torch.equal(param, params[name]), name


def test_quantized_gpt_oss_is_refused_in_one_line(tmp_path):
    import json

    folder = save_tiny_model("gpt_oss", tmp_path / "q")
    config = json.loads((tmp_path / "q" / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4"}
    (tmp_path / "q" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="quantized weights \\(mxfp4\\) is not supported"):
        load_model(folder, device="cpu")


# ---------------------------------------------------------------- the kernels' attention sinks


def sink_problem(seq_lens, num_heads, num_kv_heads, head_size, block_size, dtype, seed=0):
    """Random K/V written into a shuffled paged cache (unwritten slots NaN) and random sinks."""
    gen = torch.Generator().manual_seed(seed)
    x = 16 // torch.empty((), dtype=dtype).element_size()
    needed = [math.ceil(n / block_size) for n in seq_lens]
    num_blocks = sum(needed) + 3
    key_cache = torch.full((num_blocks, num_kv_heads, head_size // x, block_size, x), float("nan"), dtype=dtype)
    value_cache = torch.full((num_blocks, num_kv_heads, head_size, block_size), float("nan"), dtype=dtype)
    pool = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.zeros(len(seq_lens), max(needed) + 1, dtype=torch.int32)
    dense, slots = [], []
    for i, n in enumerate(seq_lens):
        ids = [pool.pop() for _ in range(needed[i])]
        tables[i, :len(ids)] = torch.tensor(ids, dtype=torch.int32)
        dense.append((torch.randn(n, num_kv_heads, head_size, generator=gen).to(dtype),
                      torch.randn(n, num_kv_heads, head_size, generator=gen).to(dtype)))
        slots += [ids[t // block_size] * block_size + t % block_size for t in range(n)]
    reference.reshape_and_cache(torch.cat([k for k, _ in dense]), torch.cat([v for _, v in dense]),
                                key_cache, value_cache, torch.tensor(slots, dtype=torch.int64))
    query = torch.randn(len(seq_lens), num_heads, head_size, generator=gen).to(dtype)
    sinks = torch.randn(num_heads, generator=gen) * 2
    return query, key_cache, value_cache, tables, torch.tensor(seq_lens, dtype=torch.int32), dense, sinks


def decode(ops, version, query, key_cache, value_cache, num_kv_heads, tables, seq_lens, sinks):
    out = torch.full_like(query, float("nan"))
    fn = ops.paged_attention_v1 if version == 1 else ops.paged_attention_v2
    fn(out, query, key_cache, value_cache, num_kv_heads, query.shape[-1] ** -0.5, tables, seq_lens,
       key_cache.shape[3], int(seq_lens.max()), sinks=sinks)
    return out


def dense_sink_attention(query, dense, num_kv_heads, sinks):
    return dense_attention(query, dense, num_kv_heads, sinks=sinks)


@pytest.mark.parametrize("version", [1, 2])
def test_reference_sinks_match_dense_attention(version):
    query, kc, vc, tables, lens, dense, sinks = sink_problem([1, 7, 40, 700], 8, 2, 64, 16, torch.float32)
    got = decode(reference, version, query, kc, vc, 2, tables, lens, sinks)
    torch.testing.assert_close(got.double(), dense_sink_attention(query, dense, 2, sinks), atol=1e-5, rtol=1e-5)
    # A sink is a real change: without it the output differs.
    assert not torch.allclose(got, decode(reference, version, query, kc, vc, 2, tables, lens, None), atol=1e-3)


@pytest.fixture(scope="module")
def cpu_ops():
    return load_ops("cpu")


@pytest.mark.parametrize("block_size,head_size,group", [(8, 64, 1), (16, 80, 2), (32, 128, 4)])
def test_cpu_kernel_sinks_match_reference(cpu_ops, block_size, head_size, group):
    lens = [1, block_size + 3, 300, 1100]         # 1100 spans three v2 partitions
    query, kc, vc, tables, seq_lens, _, sinks = sink_problem(lens, 2 * group, 2, head_size, block_size,
                                                             torch.float32, seed=block_size)
    expected = decode(reference, 1, query, kc, vc, 2, tables, seq_lens, sinks)
    for version in (1, 2):
        got = decode(cpu_ops, version, query, kc, vc, 2, tables, seq_lens, sinks)
        torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cpu_kernel_sinks_in_half_precision(cpu_ops, dtype):
    query, kc, vc, tables, seq_lens, _, sinks = sink_problem([5, 600], 4, 2, 64, 16, dtype, seed=4)
    expected = decode(reference, 1, query, kc, vc, 2, tables, seq_lens, sinks).float()
    for version in (1, 2):
        got = decode(cpu_ops, version, query, kc, vc, 2, tables, seq_lens, sinks).float()
        torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2)


def test_extreme_sinks(cpu_ops):
    """A sink far below every logit changes nothing; one far above takes all the weight (output 0, not NaN)."""
    query, kc, vc, tables, seq_lens, _, _ = sink_problem([3, 530], 4, 2, 64, 16, torch.float32, seed=6)
    plain = decode(reference, 1, query, kc, vc, 2, tables, seq_lens, None)
    for ops in (reference, cpu_ops):
        for version in (1, 2):
            low = decode(ops, version, query, kc, vc, 2, tables, seq_lens, torch.full((4,), -1e4))
            torch.testing.assert_close(low, plain, atol=2e-5, rtol=1e-4)
            high = decode(ops, version, query, kc, vc, 2, tables, seq_lens, torch.full((4,), 1e4))
            assert torch.equal(high, torch.zeros_like(high))


def test_bad_sinks_raise_value_error(cpu_ops):
    query, kc, vc, tables, seq_lens, _, sinks = sink_problem([5], 4, 2, 64, 16, torch.float32)
    with pytest.raises(ValueError, match="sinks must be torch.float32"):
        decode(cpu_ops, 1, query, kc, vc, 2, tables, seq_lens, sinks.double())
    with pytest.raises(ValueError, match=r"sinks must be \[num_heads\] = \[4\]"):
        decode(cpu_ops, 1, query, kc, vc, 2, tables, seq_lens, sinks[:2])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_kernel_sinks_match_reference(dtype):
    cuda_ops = load_ops("cuda")
    query, kc, vc, tables, seq_lens, _, sinks = sink_problem([1, 19, 511, 513, 1500], 8, 2, 128, 16, dtype, seed=8)
    expected = decode(reference, 1, query, kc, vc, 2, tables, seq_lens, sinks).float()
    q, k, v, t, s, sk = (x.cuda() for x in (query, kc, vc, tables, seq_lens, sinks))
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    for version in (1, 2):
        got = decode(cuda_ops, version, q, k, v, 2, t, s, sk)
        torch.testing.assert_close(got.cpu().float(), expected, atol=tol, rtol=tol)
