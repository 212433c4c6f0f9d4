"""The GPU path's host side (issue 14), checked on the CPU where it can be, on CUDA where it must.

CPU: the v1/v2 rule, CUDA-graph buckets and their padding (through the same
static buffers, without capture), kernels chosen per tensor device, loud
CUDA build failures, the profiler's refusals and one-runner-at-a-time, the
memory-profiling pass, the build cache key, lower-right causal prefix
attention, Mistral's sliding window against transformers.
`gpu`-marked: the same paths on a real device.
"""
from __future__ import annotations

import gc
import weakref

import pytest

from engine.deployment import Deployment
import torch
from transformers import MistralConfig, MistralForCausalLM

import cuda_ext
from cuda_ext import BackendUnavailable, KernelOps, build, load_ops, reference
from engine import LLM, SamplingParams, sampling
from engine.attention import prefix_prefill_attention, use_v2
from engine.cuda_graphs import DecodeGraphs, capture_sizes, graph_batch_size
from engine.model_runner import ModelRunner, SequenceInput
from planner.errors import PlannerError
from tests.test_model_runner import (ATOL, build_checkpoint, consecutive_tables, hf_logits, hf_model, llama_config,
                                     make_runner)

CUDA = torch.device("cuda")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from transformers import LlamaForCausalLM
    return build_checkpoint(tmp_path_factory.mktemp("llama"), LlamaForCausalLM, llama_config())


@pytest.fixture
def fresh_kernels():
    cuda_ext.reset()
    yield
    cuda_ext.reset()


# -- decode kernel choice and CUDA-graph buckets ---------------------------------------

@pytest.mark.parametrize("max_seq_len,num_seqs,num_heads,v2", [
    (512, 1, 8, False),        # one partition: v1
    (2048, 64, 32, False),     # 2048 (seq, head) pairs fill the GPU: v1
    (2048, 8, 32, True),       # 256 pairs, 4 partitions: v2
    (8192, 64, 32, False),     # the longest context v1 takes
    (8193, 64, 32, True),      # longer: always v2, however many pairs
    (60000, 256, 64, True),
])
def test_v1_v2_choice_is_vllms(max_seq_len, num_seqs, num_heads, v2):
    assert use_v2(CUDA, max_seq_len, num_seqs, num_heads) is v2
    assert use_v2(torch.device("cpu"), max_seq_len, num_seqs, num_heads) is False


def test_graph_buckets_are_vllms():
    assert [graph_batch_size(n) for n in (1, 2, 3, 4, 5, 8, 9, 17, 255, 256)] == [1, 2, 4, 4, 8, 8, 16, 24, 256, 256]
    assert graph_batch_size(257) is None
    assert capture_sizes(32) == [1, 2, 4, 8, 16, 24, 32]
    assert capture_sizes(5) == [1, 2, 4, 8]
    assert capture_sizes(1000)[-1] == 256 and len(capture_sizes(1000)) == 35


def _decode_batches(runner_a, runner_b, prompts, batches):
    """Prefill every prompt, then decode steps of varying batch sizes; logits of both runners side by side."""
    steps = len(batches)
    tables = consecutive_tables([len(p) + steps for p in prompts], runner_a.block_size)
    out = []
    for runner in (runner_a, runner_b):
        first = runner.execute([SequenceInput(p, 0, t) for p, t in zip(prompts, tables)])
        tokens = [[int(x)] for x in sampling.greedy(first)]
        logits = []
        for size in batches:
            seqs = [SequenceInput([tokens[i][-1]], len(prompts[i]) + len(tokens[i]) - 1, tables[i]) for i in range(size)]
            step = runner.execute(seqs)
            logits.append(step)
            for i, row in enumerate(step):
                tokens[i].append(int(row.argmax()))
        out.append(logits)
    return out


def test_decode_through_graph_buffers_matches_eager(llama):
    """Bucketing and padding of the graph path, without capture: same logits, stale rows harmless."""
    eager = make_runner(llama, 8)
    buffered = make_runner(llama, 8)
    buffered.graphs = DecodeGraphs(buffered.model, buffered.kv_cache.gpu, device=buffered.device, block_size=8,
                                   max_model_len=buffered.max_model_len, max_num_seqs=8, capture=False)
    prompts = [[3 + (7 * i + j) % 250 for j in range(n)] for i, n in enumerate((5, 17, 11, 1, 24, 9))]
    # 6 rows pad to 8, then 3 rows pad to 4 over buffers still holding the 6-row step.
    expected, got = _decode_batches(eager, buffered, prompts, [6, 3, 5, 1, 2])
    for want, have in zip(expected, got):
        torch.testing.assert_close(have, want, atol=ATOL, rtol=0)


# -- kernels chosen per tensor device, and no silent fallbacks --------------------------

def test_cpu_tensors_get_cpu_kernels_on_a_gpu_host(monkeypatch, fresh_kernels):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cuda_ext.ops_for("cpu").backend == "cpu"
    key = torch.randn(3, 2, 16)
    caches = (torch.zeros(4, 2, 4, 8, 4), torch.zeros(4, 2, 16, 8))
    cuda_ext.ops.reshape_and_cache(key, key, *caches, torch.tensor([0, 9, -1]))   # dispatched by device
    assert torch.equal(caches[1][1, :, :, 1], key[1])


def test_failed_cuda_build_is_an_error_not_a_fallback(monkeypatch, fresh_kernels):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake GPU")

    def broken(**_):
        raise RuntimeError("nvcc fatal: unsupported gpu architecture")
    monkeypatch.setattr(build, "build_cuda_extension", broken)
    with pytest.raises(BackendUnavailable, match="cuda extension failed to build/load: RuntimeError: nvcc fatal"):
        cuda_ext.ops_for("cuda")
    monkeypatch.setenv("PAGED_KERNELS", "cpu")
    with pytest.raises(BackendUnavailable, match="PAGED_KERNELS=cpu cannot run CUDA tensors"):
        cuda_ext.ops_for("cuda")


def test_runner_refuses_a_head_size_the_cuda_kernels_lack(llama, monkeypatch):
    fake_cuda = KernelOps("cuda", "fake", reference)
    monkeypatch.setattr(cuda_ext, "ops_for", lambda device=None: fake_cuda)
    with pytest.raises(ValueError, match="head size 16 is not supported by the CUDA kernels"):
        make_runner(llama, 8)


def test_profiler_refuses_other_kernels_for_a_gpu_profile(monkeypatch):
    from planner.catalog import resolve_gpu
    from planner.profile.device import Target
    from planner.profile.run import require_cuda_kernels

    target = Target(resolve_gpu("h200"), CUDA, torch.float16, False)
    monkeypatch.setattr(cuda_ext, "ops_for", lambda device=None: load_ops("torch"))
    with pytest.raises(PlannerError, match="cannot profile h200 with the torch kernels"):
        require_cuda_kernels(target)

    def unbuildable(device=None):
        raise BackendUnavailable("cuda extension failed to build/load: nvcc missing")
    monkeypatch.setattr(cuda_ext, "ops_for", unbuildable)
    with pytest.raises(PlannerError, match="cannot profile h200: cuda extension failed"):
        require_cuda_kernels(target)


def test_suite_engines_run_on_the_cpu():
    from engine.models import resolve_device
    assert resolve_device("auto") == torch.device("cpu")


# -- memory profiling and the profiler ---------------------------------------------------

def test_memory_profile_runs_the_step_budget_and_the_sampler(llama, monkeypatch):
    runner = make_runner(llama, 8, max_num_seqs=6)
    seen = {}
    real_sample = sampling.sample

    def spy(logits, temperature, top_k, top_p, generator):
        seen.update(rows=logits.shape[0], top_k=top_k, top_p=top_p)
        return real_sample(logits, temperature, top_k, top_p, generator)
    monkeypatch.setattr(sampling, "sample", spy)
    runner.profile_run(100)
    assert seen == {"rows": 6, "top_k": runner.vocab_size - 1, "top_p": 0.99}
    runner.profile_run(600)            # 6 sequences of 100 fit; the limit is 256 per sequence
    runner.profile_run(2000)           # 6 x 334 would not: split into 8 of 250
    assert seen["rows"] == 8


def test_engine_gives_the_runner_its_limits(llama):
    llm = LLM(llama, max_model_len=64, max_num_seqs=7, num_gpu_blocks=32, device="cpu")
    assert (llm.engine.runner.max_model_len, llm.engine.runner.max_num_seqs) == (64, 7)


def test_per_layer_profile_holds_one_runner_at_a_time(monkeypatch, tmp_path):
    from transformers import OPTConfig

    import planner.profile.run as run

    OPTConfig(hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=256,
              max_position_embeddings=256, word_embed_proj_dim=64).save_pretrained(tmp_path)
    live, most = weakref.WeakSet(), []

    class Counted(ModelRunner):
        def __init__(self, *args, **kwargs):
            gc.collect()
            super().__init__(*args, **kwargs)
            live.add(self)
            most.append(len(live))
    monkeypatch.setattr(run, "ModelRunner", Counted)
    grid = dict(prefill_tokens=[32], prefill_seqs=[1], decode_batch=[2], decode_context=[32], host_batch=[1],
                block_counts=[1, 2], warmup=0)
    profile = run.run_profile(run.ProfileOptions(Deployment(model=str(tmp_path), gpu="cpu"), quick=True, repeats=1,
                                                 per_layer=True, grid_overrides=grid))
    assert profile.per_layer_scaling and most == [1, 1]


# -- build cache -----------------------------------------------------------------------

def test_build_key_follows_sources_flags_and_target(monkeypatch, tmp_path):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "a.cpp").write_text("int f() { return 1; }")
    monkeypatch.setattr(build, "CSRC", tmp_path)
    key = build.build_key("cpu", ["-O3"], "sm_90")
    assert key == build.build_key("cpu", ["-O3"], "sm_90")
    assert key != build.build_key("cpu", ["-O2"], "sm_90")
    assert key != build.build_key("cpu", ["-O3"], "sm_80")
    (tmp_path / "cpu" / "a.cpp").write_text("int f() { return 2; }")
    assert key != build.build_key("cpu", ["-O3"], "sm_90")


def test_a_built_library_is_loaded_without_the_compiler(monkeypatch, capsys):
    build.build_cpu_extension()                      # built (or loaded) once

    def no_compiler(**_):
        raise AssertionError("the cached build should not be compiled again")
    monkeypatch.setattr("torch.utils.cpp_extension.load", no_compiler)
    module = build.build_cpu_extension()
    assert hasattr(module, "paged_attention_v1")
    assert "compiling" not in capsys.readouterr().err


def test_cuda_build_is_keyed_and_targeted_by_gpu_arch(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("PAGED_KERNELS_BUILD_DIR", str(tmp_path))
    monkeypatch.setattr(build, "cuda_arch", lambda: "sm_90")
    calls = []

    def fake_load(name, build_directory, verbose, **kwargs):
        import os
        calls.append((name, os.environ.get("TORCH_CUDA_ARCH_LIST")))
        return "module"
    monkeypatch.setattr("torch.utils.cpp_extension.load", fake_load)
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    assert build.build_cuda_extension() == "module"
    (name, arch_list), = calls
    assert name.startswith("paged_kernels_cuda_sm_90_") and arch_list == "9.0"
    assert "TORCH_CUDA_ARCH_LIST" not in __import__("os").environ
    err = capsys.readouterr().err
    assert "compiling the CUDA kernels for sm_90" in err and "compiled in" in err


# -- prefix prefill and the sliding window ---------------------------------------------

def _masked_reference(q, k, v, scale, window=None):
    group = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
    new, total = q.shape[1], k.shape[1]
    pos = torch.arange(total - new, total)[:, None]
    keys = torch.arange(total)[None, :]
    allowed = (keys <= pos) & ((keys > pos - window) if window else True)
    scores = (q @ k.transpose(1, 2)) * scale
    return scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v


@pytest.mark.parametrize("window", [None, 6])
def test_prefix_prefill_attention_is_lower_right_causal(window):
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(4, 5, 16, generator=g), torch.randn(2, 12, 16, generator=g), torch.randn(2, 12, 16, generator=g)
    torch.testing.assert_close(prefix_prefill_attention(q, k, v, 0.25, window), _masked_reference(q, k, v, 0.25, window))


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    config = MistralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=256, max_position_embeddings=256, sliding_window=8)
    return build_checkpoint(tmp_path_factory.mktemp("mistral"), MistralForCausalLM, config)


def test_mistral_sliding_window_matches_transformers_past_the_window(mistral):
    """Prompts shorter and longer than the 8-token window; decode runs far past it."""
    runner = make_runner(mistral, 8)
    reference = hf_model(mistral)
    prompts = [[3 + (5 * i + 11 * j) % 250 for j in range(n)] for i, n in enumerate((5, 20))]
    steps = 12
    tables = consecutive_tables([len(p) + steps for p in prompts], 8)
    logits = runner.execute([SequenceInput(p, 0, t) for p, t in zip(prompts, tables)])
    tokens = [[int(x)] for x in logits.argmax(-1)]
    per_step = [[row] for row in logits]
    for _ in range(steps - 1):
        step = runner.execute([SequenceInput([out[-1]], len(p) + len(out) - 1, t)
                               for p, out, t in zip(prompts, tokens, tables)])
        for out, rows, row in zip(tokens, per_step, step):
            out.append(int(row.argmax()))
            rows.append(row)
    for prompt, out, rows in zip(prompts, tokens, per_step):
        expected = hf_logits(reference, prompt + out)[len(prompt) - 1: len(prompt) - 1 + steps]
        torch.testing.assert_close(torch.stack(rows), expected, atol=ATOL, rtol=0)
        with torch.no_grad():
            hf_out = reference.generate(torch.tensor([prompt]), max_new_tokens=steps, do_sample=False,
                                        eos_token_id=None, pad_token_id=0)
        assert out == hf_out[0, len(prompt):].tolist()


def test_mistral_window_with_a_cached_prefix(mistral):
    prefix = [7 + (3 * j) % 200 for j in range(17)]
    prompts = [prefix + [40, 41, 42], prefix + [90, 91, 92, 93, 94]]
    llm = LLM(mistral, block_size=8, num_gpu_blocks=64, device="cpu", enable_prefix_caching=True)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    first = llm.generate([{"prompt_token_ids": prompts[0]}], params, use_tqdm=False)[0]
    second = llm.generate([{"prompt_token_ids": prompts[1]}], params, use_tqdm=False)[0]   # reuses 16 cached tokens
    reference = hf_model(mistral)
    for prompt, out in zip(prompts, (first, second)):
        with torch.no_grad():
            hf_out = reference.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False,
                                        eos_token_id=None, pad_token_id=0)
        assert out.outputs[0].token_ids == hf_out[0, len(prompt):].tolist()


# -- on a real GPU ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def llama_h64(tmp_path_factory):
    """Head size 64: one the CUDA kernels serve."""
    from transformers import LlamaForCausalLM
    return build_checkpoint(tmp_path_factory.mktemp("llama64"), LlamaForCausalLM,
                            llama_config(hidden_size=256, num_attention_heads=4, num_key_value_heads=2))


@pytest.mark.gpu
@needs_cuda
def test_cuda_graph_decode_matches_eager(llama_h64):
    kwargs = dict(block_size=16, num_gpu_blocks=64, num_cpu_blocks=0, dtype="float32", device="cuda")
    graphs = ModelRunner(llama_h64, max_num_seqs=16, **kwargs)
    eager = ModelRunner(llama_h64, enforce_eager=True, **kwargs)
    assert graphs.graphs is not None and sorted(graphs.graphs.graphs) == [1, 2, 4, 8, 16]
    prompts = [[3 + (7 * i + j) % 250 for j in range(n)] for i, n in enumerate((5, 17, 11, 1, 24, 9))]
    expected, got = _decode_batches(eager, graphs, prompts, [6, 3, 5, 1, 2])
    for want, have in zip(expected, got):
        torch.testing.assert_close(have, want, atol=1e-3, rtol=0)


@pytest.mark.gpu
@needs_cuda
def test_cuda_prefix_prefill_stays_off_the_math_kernel():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(*shape, generator=g).half().cuda() for shape in ((8, 64, 128), (2, 1024, 128), (2, 1024, 128)))
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
        got = prefix_prefill_attention(q, k, v, 128 ** -0.5)
    want = _masked_reference(q.float().cpu(), k.float().cpu(), v.float().cpu(), 128 ** -0.5)
    torch.testing.assert_close(got.float().cpu(), want, atol=2e-3, rtol=2e-3)


@pytest.mark.gpu
@needs_cuda
def test_cuda_v1_launches_where_shared_memory_passes_48k():
    """~12K tokens of fp32 logits plus the kernel's static memory pass the 48 KiB default."""
    from tests.test_kernels import paged_problem, run_attention
    query, kc, vc, bt, sl, _ = paged_problem([12000, 11800], 8, 8, 128, 16, torch.float16, seed=3)
    expected = run_attention(reference, 1, query, kc, vc, 8, bt, sl, 16).float()
    cuda = load_ops("cuda")
    got = run_attention(cuda, 1, *(t.cuda() for t in (query, kc, vc)), 8, bt.cuda(), sl.cuda(), 16)
    torch.testing.assert_close(got.float().cpu(), expected, atol=2e-3, rtol=2e-3)


@pytest.mark.gpu
@needs_cuda
def test_cpu_runner_works_on_a_gpu_host(llama):
    runner = make_runner(llama, 8)
    assert cuda_ext.ops_for(runner.device).backend == "cpu"
    assert runner.execute([SequenceInput([5, 6, 7], 0, [0])]).shape == (1, runner.vocab_size)
