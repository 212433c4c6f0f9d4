"""An FP8 KV cache (vLLM's --kv-cache-dtype fp8): the kernels against the torch reference, the engine's
capacity against the planner's prediction, and its greedy outputs against the 16-bit cache's."""
from __future__ import annotations

import math

import pytest
import torch

import cuda_ext
from cuda_ext import load_ops, reference
from engine import LLM
from engine.deployment import Deployment
from engine.kv_cache import bytes_per_block
from engine.model_runner import ModelRunner, SequenceInput
from planner.deploy.plan import plan_deployment
from reference_helpers import engine_greedy, make_prompts
from tiny_models import save_tiny_model

FP8 = torch.float8_e4m3fn


@pytest.fixture(scope="module")
def cpu_ops():
    return load_ops("cpu")


def fp8_problem(seq_lens, num_heads, num_kv_heads, head_size, block_size, dtype, k_scale, v_scale, seed=0):
    """Random K/V (x3, so some saturate at the smaller scales) written by the reference into NaN-filled
    FP8 caches of shuffled blocks; returns the query, caches, block tables, lengths and the K/V."""
    gen = torch.Generator().manual_seed(seed)
    blocks = [math.ceil(n / block_size) for n in seq_lens]
    num_blocks = sum(blocks) + 3
    key_cache = torch.full((num_blocks, num_kv_heads, head_size // 16, block_size, 16), float("nan"), dtype=FP8)
    value_cache = torch.full((num_blocks, num_kv_heads, head_size, block_size), float("nan"), dtype=FP8)
    pool = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.zeros(len(seq_lens), max(blocks) + 1, dtype=torch.int32)
    slots = []
    for i, n in enumerate(seq_lens):
        ids = [pool.pop() for _ in range(blocks[i])]
        tables[i, :len(ids)] = torch.tensor(ids, dtype=torch.int32)
        slots += [ids[t // block_size] * block_size + t % block_size for t in range(n)]
    key = (3 * torch.randn(sum(seq_lens), num_kv_heads, head_size, generator=gen)).to(dtype)
    value = torch.randn(sum(seq_lens), num_kv_heads, head_size, generator=gen).to(dtype)
    reference.reshape_and_cache(key, value, key_cache, value_cache, torch.tensor(slots, dtype=torch.int64),
                                k_scale, v_scale)
    query = torch.randn(len(seq_lens), num_heads, head_size, generator=gen).to(dtype)
    return query, key_cache, value_cache, tables, torch.tensor(seq_lens, dtype=torch.int32), key, value, slots


def test_reference_stores_x_over_scale_rounded_and_saturated():
    key = torch.tensor([[[1.0, -0.3, 1000.0, 20.0] * 4]])          # one token, one head, head size 16
    kc, vc = torch.zeros(1, 1, 1, 8, 16, dtype=FP8), torch.zeros(1, 1, 16, 8, dtype=FP8)
    reference.reshape_and_cache(key, key, kc, vc, torch.tensor([3]), 0.5, 2.0)
    assert kc[0, 0, 0, 3, :4].float().tolist() == [2.0, -0.625, 448.0, 40.0]    # -0.6 -> -0.625; 2000 saturates
    assert vc[0, 0, :4, 3].float().tolist() == [0.5, -0.15625, 448.0, 10.0]     # -0.15 -> -0.15625 (E4M3)
    keys, values = reference.gather_kv(kc, vc, torch.tensor([0]), 4, 0.5, 2.0)
    assert keys[0, 3, :4].tolist() == [1.0, -0.3125, 224.0, 20.0] and values.dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("k_scale,v_scale", [(1.0, 1.0), (0.05, 3.0)])
def test_cpu_kernels_match_the_reference_on_fp8_caches(cpu_ops, dtype, block_size, k_scale, v_scale):
    seq_lens = [1, block_size + 3, 600]
    query, kc, vc, tables, lens, key, value, slots = fp8_problem(seq_lens, 4, 2, 64, block_size, dtype,
                                                                 k_scale, v_scale, seed=block_size)
    # the CPU kernel writes the same bytes as the reference
    kc2, vc2 = torch.full_like(kc, float("nan")), torch.full_like(vc, float("nan"))
    cpu_ops.reshape_and_cache(key, value, kc2, vc2, torch.tensor(slots, dtype=torch.int64), "fp8", k_scale, v_scale)
    assert torch.equal(kc2.view(torch.uint8), kc.view(torch.uint8)) and torch.equal(vc2.view(torch.uint8),
                                                                                   vc.view(torch.uint8))
    expected = torch.empty_like(query)
    reference.paged_attention_v1(expected, query, kc, vc, 2, 0.125, tables, lens, block_size, 600,
                                 k_scale=k_scale, v_scale=v_scale)
    tol = {torch.float32: 2e-5, torch.float16: 5e-3, torch.bfloat16: 2e-2}[dtype]
    for attention in (cpu_ops.paged_attention_v1, cpu_ops.paged_attention_v2):
        got = torch.full_like(query, float("nan"))
        attention(got, query, kc, vc, 2, 0.125, tables, lens, block_size, 600, kv_cache_dtype="fp8",
                  k_scale=k_scale, v_scale=v_scale)
        torch.testing.assert_close(got.float(), expected.float(), atol=tol, rtol=tol)


def test_fp8_attention_is_close_to_the_exact_one(cpu_ops):
    """E4M3 keeps 3 mantissa bits (relative step 1/8): attention over rounded K/V stays within a few %."""
    query, kc, vc, tables, lens, key, value, _ = fp8_problem([300], 4, 2, 64, 16, torch.float32, 1.0, 1.0)
    query = query / 3          # the keys are 3 x N(0, 1): logits of unit spread, not a near one-hot softmax
    fp8 = torch.empty_like(query)
    cpu_ops.paged_attention_v1(fp8, query, kc, vc, 2, 0.125, tables, lens, 16, 300)
    keys, values = key.transpose(0, 1).repeat_interleave(2, 0), value.transpose(0, 1).repeat_interleave(2, 0)
    probs = torch.softmax(torch.einsum("hd,hld->hl", query[0], keys) * 0.125, -1)
    exact = torch.einsum("hl,hld->hd", probs, values)
    assert (fp8[0] - exact).norm() / exact.norm() < 0.05


def test_copy_and_swap_move_fp8_blocks_exactly(cpu_ops):
    _, kc, vc, *_ = fp8_problem([40], 4, 2, 64, 16, torch.float16, 1.0, 1.0)
    for ops in (cpu_ops, load_ops("torch")):
        k, v = kc.clone(), vc.clone()
        ops.copy_blocks([k], [v], torch.tensor([[0, 4]]))
        assert torch.equal(k[4].view(torch.uint8), kc[0].view(torch.uint8))
        host = torch.zeros_like(vc)
        ops.swap_blocks(v, host, torch.tensor([[1, 2]]))
        assert torch.equal(host[2].view(torch.uint8), vc[1].view(torch.uint8))


def test_bad_fp8_arguments_are_one_line_errors(cpu_ops):
    query, kc, vc, tables, lens, key, value, _ = fp8_problem([10], 4, 2, 64, 16, torch.float16, 1.0, 1.0)
    out = torch.empty_like(query)
    args = (out, query, kc, vc, 2, 0.1, tables, lens, 16, 10)
    for kwargs, message in (({"kv_cache_dtype": "auto"}, "kv_cache_dtype='auto' but the cache is"),
                            ({"kv_cache_dtype": "fp8_e5m2"}, "kv_cache_dtype must be one of"),
                            ({"k_scale": 0.0}, "k_scale must be a positive finite number"),
                            ({"v_scale": torch.ones(2)}, "v_scale must be one number")):
        with pytest.raises(ValueError, match=message):
            cpu_ops.paged_attention_v1(*args, **kwargs)
    plain_k, plain_v = torch.zeros(2, 2, 8, 16, 8, dtype=torch.float16), torch.zeros(2, 2, 64, 16, dtype=torch.float16)
    with pytest.raises(ValueError, match="scales apply to an FP8 cache only"):
        cpu_ops.reshape_and_cache(key[:1], value[:1], plain_k, plain_v, torch.tensor([0]), k_scale=2.0)
    with pytest.raises(ValueError, match="must share one dtype"):
        cpu_ops.paged_attention_v1(out.float(), query.float(), plain_k, plain_v, 2, 0.1, tables[:, :1], lens, 16, 10)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return save_tiny_model("llama", tmp_path_factory.mktemp("llama-fp8kv"))


@pytest.mark.parametrize("dtype, ratio", [("float32", 4), ("float16", 2)])
def test_engine_holds_more_blocks_and_the_planner_predicts_them(tiny_llama, dtype, ratio):
    budget = 3 << 20
    engines = {kv: LLM(tiny_llama, dtype=dtype, kv_cache_memory_bytes=budget, block_size=16, enforce_eager=True,
                       kv_cache_dtype=kv).engine for kv in ("auto", "fp8")}
    auto, fp8 = engines["auto"].runner, engines["fp8"].runner
    assert fp8.kv_cache.gpu[0][0].dtype == FP8 and fp8.num_gpu_blocks == ratio * auto.num_gpu_blocks
    for kv, runner in (("auto", auto), ("fp8", fp8)):
        plan = plan_deployment(Deployment(model=tiny_llama, gpu="cpu", dtype=dtype, kv_cache_dtype=kv), refuse=False)
        block_bytes = bytes_per_block(*runner.cache_shape, 16, runner.cache_dtype)
        assert plan.memory.block_bytes_per_gpu == block_bytes            # the planner's block is the engine's
        assert budget // plan.memory.block_bytes_per_gpu == runner.num_gpu_blocks


def test_engine_fp8_equals_rounding_the_16_bit_cache(tiny_llama, monkeypatch):
    """The FP8 engine computes exactly what a float32 engine computes when every cached K/V is rounded to
    E4M3 on its way in: the difference between the two caches is the rounding and nothing else."""
    monkeypatch.setenv("PAGED_KERNELS", "torch")
    cuda_ext.reset()
    try:
        prompts = make_prompts([5, 21, 40], seed=3)
        fp8 = engine_greedy(LLM(tiny_llama, dtype="float32", num_gpu_blocks=64, block_size=16, enforce_eager=True,
                                kv_cache_dtype="fp8"), prompts, 24)
        round_trip = reference.to_cache

        def rounded(x, dtype, scale=1.0):
            return round_trip(x, FP8, scale).float().to(dtype) if dtype == torch.float32 else round_trip(x, dtype)

        monkeypatch.setattr(reference, "to_cache", rounded)
        emulated = engine_greedy(LLM(tiny_llama, dtype="float32", num_gpu_blocks=64, block_size=16,
                                     enforce_eager=True), prompts, 24)
    finally:
        cuda_ext.reset()
    assert fp8 == emulated


def teacher_forced_agreement(folder: str, prompts, steps: int) -> tuple[int, int]:
    """(positions whose greedy token agrees, positions): both caches decode the 16-bit cache's own greedy
    tokens, so one early flip does not decide every later position."""
    runners = {kv: ModelRunner(folder, block_size=16, num_gpu_blocks=8 * len(prompts), dtype="float32",
                               kv_cache_dtype=kv) for kv in ("auto", "fp8")}
    agree = 0
    for i, prompt in enumerate(prompts):
        table = list(range(8 * i, 8 * i + 8))
        tokens: dict[str, list[int]] = {"auto": [], "fp8": []}
        for kv, runner in runners.items():
            logits = runner.execute([SequenceInput(list(prompt), 0, table)])
            for step in range(steps):
                tokens[kv].append(int(logits[0].argmax()))
                if step + 1 < steps:
                    forced = tokens["auto"][step] if kv == "fp8" else tokens[kv][-1]
                    logits = runner.execute([SequenceInput([forced], len(prompt) + step, table)])
        agree += sum(a == b for a, b in zip(tokens["auto"], tokens["fp8"]))
    return agree, steps * len(prompts)


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_greedy_agreement_with_the_16_bit_cache(kind, tmp_path, capsys):
    """Reported, not required exact: E4M3 rounds K/V by up to 1/16 of their value; on a tiny random model
    (logit margins of a few tenths) that flips some greedy picks."""
    folder = save_tiny_model(kind, tmp_path / kind)
    prompts = make_prompts([5, 17, 33, 60, 8, 90, 3, 40], seed=7)
    agree, total = teacher_forced_agreement(folder, prompts, 32)
    llms = {kv: LLM(folder, dtype="float32", num_gpu_blocks=128, block_size=16, enforce_eager=True,
                    kv_cache_dtype=kv) for kv in ("auto", "fp8")}
    auto, fp8 = (engine_greedy(llms[kv], prompts, 32) for kv in ("auto", "fp8"))
    same = sum(a == b for a, b in zip(auto, fp8))
    prefix = sum(next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), len(a)) for a, b in zip(auto, fp8))
    with capsys.disabled():
        print(f"\n{kind}: FP8 KV greedy agreement with the float32 cache: teacher-forced {agree}/{total} tokens "
              f"({agree / total:.1%}); free-running {same}/{len(prompts)} sequences identical, "
              f"{prefix}/{sum(map(len, auto))} tokens before the first divergence")
    assert agree / total >= 0.8
    assert all(a[0] == b[0] for a, b in zip(auto, fp8))   # the first token comes from the prefill: exact


def test_llm_takes_vllms_keywords(tiny_llama):
    with pytest.raises(ValueError, match="quantization 'awq': this engine runs 16/32-bit weights"):
        LLM(tiny_llama, quantization="awq")
    with pytest.raises(ValueError, match="kv_cache_dtype 'int8' is not supported"):
        LLM(tiny_llama, kv_cache_dtype="int8")
    llm = LLM(tiny_llama, dtype="float32", num_gpu_blocks=32, block_size=16, kv_cache_dtype="fp8_e4m3")
    assert llm.engine.deployment.kv_cache_dtype == "fp8" and llm.engine.runner.cache_dtype == FP8


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("head_size", [64, 80, 128])
def test_cuda_kernels_match_the_reference_on_fp8_caches(dtype, block_size, head_size):
    cuda_ops = load_ops("cuda")
    query, kc, vc, tables, lens, key, value, slots = fp8_problem([1, block_size + 3, 1500], 4, 2, head_size,
                                                                 block_size, dtype, 0.05, 3.0)
    kc2, vc2 = torch.full_like(kc, float("nan")).cuda(), torch.full_like(vc, float("nan")).cuda()
    cuda_ops.reshape_and_cache(key.cuda(), value.cuda(), kc2, vc2, torch.tensor(slots).cuda(), "fp8", 0.05, 3.0)
    assert torch.equal(kc2.cpu().view(torch.uint8), kc.view(torch.uint8))
    assert torch.equal(vc2.cpu().view(torch.uint8), vc.view(torch.uint8))
    expected = torch.empty_like(query)
    reference.paged_attention_v1(expected, query, kc, vc, 2, 0.1, tables, lens, block_size, 1500,
                                 k_scale=0.05, v_scale=3.0)
    for attention in (cuda_ops.paged_attention_v1, cuda_ops.paged_attention_v2):
        got = torch.empty_like(query).cuda()
        attention(got, query.cuda(), kc2, vc2, 2, 0.1, tables.cuda(), lens.cuda(), block_size, 1500,
                  kv_cache_dtype="fp8", k_scale=0.05, v_scale=3.0)
        torch.testing.assert_close(got.cpu().float(), expected.float(), atol=2e-2, rtol=2e-2)
