"""Paged-KV kernels: the torch reference against naive dense attention, the
CPU C++ kernels (and, on a GPU, the CUDA kernels) against the reference, and
the loader's backend choice.

The first test that touches the CPU backend JIT-builds it (about 25 s on two
cores, cached afterwards under ~/.cache/paged_planner).
"""

from __future__ import annotations

import math

import pytest
import torch

import cuda_ext
from cuda_ext import BackendUnavailable, load_ops, reference
from engine.core.config import SUPPORTED_BLOCK_SIZES
from reference_helpers import dense_attention

DTYPE_TOLERANCE = {torch.float32: 2e-5, torch.float16: 5e-3, torch.bfloat16: 2e-2}


@pytest.fixture(scope="module")
def cpu_ops():
    return load_ops("cpu")


def x_for(dtype: torch.dtype) -> int:
    return 16 // torch.empty((), dtype=dtype).element_size()


def empty_caches(num_blocks, num_kv_heads, head_size, block_size, dtype, fill=float("nan"), device="cpu"):
    """Caches filled with `fill` (NaN by default) so a kernel reading a slot nobody wrote shows up."""
    x = x_for(dtype)
    key_cache = torch.full((num_blocks, num_kv_heads, head_size // x, block_size, x), fill, dtype=dtype, device=device)
    value_cache = torch.full((num_blocks, num_kv_heads, head_size, block_size), fill, dtype=dtype, device=device)
    return key_cache, value_cache


def paged_problem(seq_lens, num_heads, num_kv_heads, head_size, block_size, dtype, seed=0):
    """Random dense K/V per sequence written into a shuffled paged cache.

    Returns (query, key_cache, value_cache, block_tables, seq_lens, dense) where
    dense[i] = (keys, values) of sequence i as [seq_len, num_kv_heads, head_size].
    Unwritten cache slots (incl. the tail of each last block) hold NaN.
    """
    gen = torch.Generator().manual_seed(seed)
    blocks_needed = [math.ceil(n / block_size) for n in seq_lens]
    max_blocks = max(max(blocks_needed), 1) + 1  # a padded column, as the runner makes
    num_blocks = sum(blocks_needed) + 5
    key_cache, value_cache = empty_caches(num_blocks, num_kv_heads, head_size, block_size, dtype)
    pool = torch.randperm(num_blocks, generator=gen).tolist()
    block_tables = torch.full((len(seq_lens), max_blocks), 10**6, dtype=torch.int32)  # garbage padding
    dense, slots, keys, values = [], [], [], []
    for i, n in enumerate(seq_lens):
        ids = [pool.pop() for _ in range(blocks_needed[i])]
        block_tables[i, : len(ids)] = torch.tensor(ids, dtype=torch.int32)
        k = torch.randn(n, num_kv_heads, head_size, generator=gen).to(dtype)
        v = torch.randn(n, num_kv_heads, head_size, generator=gen).to(dtype)
        dense.append((k, v))
        keys.append(k)
        values.append(v)
        slots += [ids[t // block_size] * block_size + t % block_size for t in range(n)]
    reference.reshape_and_cache(torch.cat(keys), torch.cat(values), key_cache, value_cache, torch.tensor(slots, dtype=torch.int64))
    query = torch.randn(len(seq_lens), num_heads, head_size, generator=gen).to(dtype)
    return query, key_cache, value_cache, block_tables, torch.tensor(seq_lens, dtype=torch.int32), dense


def run_attention(ops, version, query, key_cache, value_cache, num_kv_heads, block_tables, seq_lens, block_size):
    out = torch.full_like(query, float("nan"))
    fn = ops.paged_attention_v1 if version == 1 else ops.paged_attention_v2
    max_len = int(seq_lens.max()) if len(seq_lens) else 0
    fn(out, query, key_cache, value_cache, num_kv_heads, query.shape[-1] ** -0.5, block_tables, seq_lens, block_size, max_len)
    return out


# ---------------------------------------------------------------- the reference itself


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (4, 2), (8, 2)])
def test_reference_matches_naive_dense_attention(version, num_heads, num_kv_heads):
    seq_lens = [1, 5, 16, 33, 700]  # 700 spans two v2 partitions
    query, kc, vc, bt, sl, dense = paged_problem(seq_lens, num_heads, num_kv_heads, 64, 16, torch.float32)
    got = run_attention(cuda_ext.load_ops("torch"), version, query, kc, vc, num_kv_heads, bt, sl, 16)
    expected = dense_attention(query, dense, num_kv_heads, 64**-0.5)
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)


def test_reference_reshape_and_cache_layout_and_skip():
    """Each token's key lands at [block, head, d // x, offset, d % x], its value at [block, head, d, offset]."""
    num_kv_heads, head_size, block_size = 2, 16, 8
    kc, vc = empty_caches(4, num_kv_heads, head_size, block_size, torch.float32, fill=0.0)
    key = torch.randn(3, num_kv_heads, head_size)
    value = torch.randn(3, num_kv_heads, head_size)
    reference.reshape_and_cache(key, value, kc, vc, torch.tensor([13, -1, 2]))
    x = 4
    for token, slot in ((0, 13), (2, 2)):
        block, offset = divmod(slot, block_size)
        for d in range(head_size):
            assert torch.equal(kc[block, :, d // x, offset, d % x], key[token, :, d])
            assert torch.equal(vc[block, :, d, offset], value[token, :, d])
    assert int((kc != 0).sum()) == 2 * num_kv_heads * head_size  # the -1 token wrote nothing


# ---------------------------------------------------------------- CPU kernels vs reference


@pytest.mark.parametrize("block_size", SUPPORTED_BLOCK_SIZES)
@pytest.mark.parametrize("head_size", [64, 80, 96, 128])
@pytest.mark.parametrize("group", [1, 2, 4])
def test_cpu_attention_matches_reference_fp32(cpu_ops, block_size, head_size, group):
    num_kv_heads = 2
    seq_lens = [1, block_size - 1, block_size, 3 * block_size + 5, 1100]  # 1100 spans three v2 partitions
    query, kc, vc, bt, sl, _ = paged_problem(seq_lens, group * num_kv_heads, num_kv_heads, head_size, block_size, torch.float32)
    expected = run_attention(reference, 1, query, kc, vc, num_kv_heads, bt, sl, block_size)
    v1 = run_attention(cpu_ops, 1, query, kc, vc, num_kv_heads, bt, sl, block_size)
    v2 = run_attention(cpu_ops, 2, query, kc, vc, num_kv_heads, bt, sl, block_size)
    torch.testing.assert_close(v1, expected, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(v2, v1, atol=2e-6, rtol=1e-5)  # v2 is the same math, re-associated


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("block_size,head_size,group", [(16, 128, 1), (8, 64, 4), (32, 96, 2)])
def test_cpu_attention_matches_reference_half_types(cpu_ops, dtype, block_size, head_size, group):
    seq_lens = [1, 40, 600]
    query, kc, vc, bt, sl, _ = paged_problem(seq_lens, 2 * group, 2, head_size, block_size, dtype, seed=3)
    expected = run_attention(reference, 1, query, kc, vc, 2, bt, sl, block_size)
    tol = DTYPE_TOLERANCE[dtype]
    for version in (1, 2):
        got = run_attention(cpu_ops, version, query, kc, vc, 2, bt, sl, block_size)
        torch.testing.assert_close(got.float(), expected.float(), atol=tol, rtol=tol)


def test_v1_equals_v2_across_partition_boundaries(cpu_ops):
    seq_lens = [511, 512, 513, 1024, 1025, 1537]
    query, kc, vc, bt, sl, _ = paged_problem(seq_lens, 4, 2, 64, 16, torch.float32, seed=7)
    for ops in (reference, cpu_ops):
        v1 = run_attention(ops, 1, query, kc, vc, 2, bt, sl, 16)
        v2 = run_attention(ops, 2, query, kc, vc, 2, bt, sl, 16)
        torch.testing.assert_close(v2, v1, atol=2e-6, rtol=1e-5)


def test_zero_length_sequence_gives_zeros(cpu_ops):
    query, kc, vc, bt, sl, _ = paged_problem([3, 9], 2, 2, 64, 8, torch.float32)
    sl[0] = 0
    for ops in (reference, cpu_ops):
        for version in (1, 2):
            out = run_attention(ops, version, query, kc, vc, 2, bt, sl, 8)
            assert torch.equal(out[0], torch.zeros_like(out[0]))
            assert torch.isfinite(out[1]).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cpu_reshape_and_cache_is_exact_and_skips_padding(cpu_ops, dtype):
    num_kv_heads, head_size, block_size, num_blocks = 3, 80, 16, 6
    key = torch.randn(20, num_kv_heads, head_size).to(dtype)
    value = torch.randn(20, num_kv_heads, head_size).to(dtype)
    slots = torch.randperm(num_blocks * block_size)[:20]
    slots[[0, 7, 19]] = -1
    expected_k, expected_v = empty_caches(num_blocks, num_kv_heads, head_size, block_size, dtype, fill=0.5)
    got_k, got_v = expected_k.clone(), expected_v.clone()
    reference.reshape_and_cache(key, value, expected_k, expected_v, slots)
    # A non-contiguous key (a slice of a fused QKV tensor) must work too.
    fused = torch.cat([key, value], dim=-1)
    cpu_ops.reshape_and_cache(fused[..., :head_size], fused[..., head_size:], got_k, got_v, slots)
    assert torch.equal(got_k, expected_k)
    assert torch.equal(got_v, expected_v)


def test_cpu_copy_blocks_copies_every_layer_exactly(cpu_ops):
    layers = [empty_caches(8, 2, 64, 16, torch.bfloat16, fill=0.0) for _ in range(3)]
    for kc, vc in layers:
        kc.copy_(torch.randn(kc.shape))
        vc.copy_(torch.randn(vc.shape))
    expected = [(kc.clone(), vc.clone()) for kc, vc in layers]
    mapping = torch.tensor([[0, 5], [2, 6], [2, 7]], dtype=torch.int64)
    reference.copy_blocks([k for k, _ in expected], [v for _, v in expected], mapping)
    cpu_ops.copy_blocks([k for k, _ in layers], [v for _, v in layers], mapping)
    for (kc, vc), (ek, ev) in zip(layers, expected):
        assert torch.equal(kc, ek) and torch.equal(vc, ev)
        assert torch.equal(kc[7], kc[2]) and torch.equal(vc[5], vc[0])


def test_cpu_swap_blocks_between_pools_is_exact(cpu_ops):
    src = torch.randn(6, 2, 16, 16, 4)
    dst = torch.zeros(4, 2, 16, 16, 4)
    cpu_ops.swap_blocks(src, dst, torch.tensor([[5, 0], [1, 3]], dtype=torch.int64))
    assert torch.equal(dst[0], src[5]) and torch.equal(dst[3], src[1])
    assert torch.equal(dst[1], torch.zeros_like(dst[1])) and torch.equal(dst[2], torch.zeros_like(dst[2]))


# ---------------------------------------------------------------- argument checks


def test_bad_arguments_raise_value_error(cpu_ops):
    query, kc, vc, bt, sl, _ = paged_problem([5, 20], 4, 2, 64, 16, torch.float32)
    out = torch.empty_like(query)
    args = dict(num_kv_heads=2, scale=0.1, block_tables=bt, seq_lens=sl, block_size=16, max_seq_len=20)

    def call(**changes):
        merged = {**dict(out=out, query=query, key_cache=kc, value_cache=vc), **args, **changes}
        cpu_ops.paged_attention_v1(**merged)

    with pytest.raises(ValueError, match="block_tables must be torch.int32"):
        call(block_tables=bt.long())
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        call(query=query[:, :3], out=out[:, :3].contiguous(), num_kv_heads=2)
    with pytest.raises(ValueError, match="exceeds max_seq_len"):
        call(max_seq_len=10)
    bad_table = bt.clone()
    bad_table[1, 0] = 999
    with pytest.raises(ValueError, match="block id outside"):
        call(block_tables=bad_table)
    with pytest.raises(ValueError, match="last dim must be x"):
        call(key_cache=kc.view(kc.shape[0], 2, 8, 16, 8))
    with pytest.raises(ValueError, match="block_size in"):
        small_k, small_v = empty_caches(4, 2, 64, 4, torch.float32)
        call(key_cache=small_k, value_cache=small_v, block_size=4, block_tables=torch.zeros(2, 5, dtype=torch.int32))
    with pytest.raises(ValueError, match="both source and destination"):
        cpu_ops.copy_blocks([kc], [vc], torch.tensor([[0, 1], [1, 2]]))
    with pytest.raises(ValueError, match="slot >= num_blocks"):
        cpu_ops.reshape_and_cache(torch.zeros(1, 2, 64), torch.zeros(1, 2, 64), kc, vc, torch.tensor([10**6]))


# ---------------------------------------------------------------- loader


def test_load_ops_names_its_backend():
    assert load_ops("torch").backend == "torch"
    assert load_ops("cpu").backend == "cpu"
    with pytest.raises(ValueError, match="unknown kernel backend"):
        load_ops("tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_cuda_backend_unavailable_without_gpu():
    with pytest.raises(BackendUnavailable, match="is_available"):
        load_ops("cuda")


@pytest.fixture
def fresh_loader(monkeypatch):
    """Lets a test set PAGED_KERNELS and re-run the pick; restores the pick afterwards."""
    cuda_ext.reset()
    yield monkeypatch
    monkeypatch.delenv("PAGED_KERNELS", raising=False)
    cuda_ext.reset()


def test_env_override_picks_torch(fresh_loader):
    fresh_loader.setenv("PAGED_KERNELS", "torch")
    from cuda_ext import ops

    assert ops.backend == "torch"
    assert cuda_ext.describe() == "paged kernels: backend=torch (pure-torch reference, requested by PAGED_KERNELS)"


def test_default_pick_and_describe(fresh_loader):
    fresh_loader.delenv("PAGED_KERNELS", raising=False)
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert cuda_ext.ops.backend == expected
    line = cuda_ext.describe()
    assert "\n" not in line and f"backend={expected}" in line
    if expected == "cpu":
        assert "cuda unavailable" in line  # says why it did not pick cuda


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the fallback without a GPU")
def test_unusable_override_falls_back_and_says_why(fresh_loader):
    fresh_loader.setenv("PAGED_KERNELS", "cuda")
    assert cuda_ext.ops.backend == "cpu"
    assert "PAGED_KERNELS=cuda could not be used" in cuda_ext.describe()


def test_invalid_override_is_a_clear_error(fresh_loader):
    fresh_loader.setenv("PAGED_KERNELS", "gpu")
    with pytest.raises(ValueError, match="PAGED_KERNELS='gpu' is not a kernel backend"):
        cuda_ext.describe()


# ---------------------------------------------------------------- CUDA kernels (need a GPU)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def cuda_ops():
    return load_ops("cuda")


def _to_cuda(*tensors):
    return [t.cuda() for t in tensors]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("block_size", SUPPORTED_BLOCK_SIZES)
@pytest.mark.parametrize("head_size,group", [(64, 1), (80, 2), (96, 4), (112, 1), (128, 4), (256, 2)])
def test_cuda_attention_matches_reference(cuda_ops, dtype, block_size, head_size, group):
    seq_lens = [1, block_size + 3, 511, 513, 1500]
    query, kc, vc, bt, sl, _ = paged_problem(seq_lens, 2 * group, 2, head_size, block_size, dtype, seed=11)
    expected = run_attention(reference, 1, query, kc, vc, 2, bt, sl, block_size).float()
    q, k, v, t, s = _to_cuda(query, kc, vc, bt, sl)
    tol = DTYPE_TOLERANCE[dtype] if dtype != torch.float32 else 1e-4
    for version in (1, 2):
        got = run_attention(cuda_ops, version, q, k, v, 2, t, s, block_size)
        torch.testing.assert_close(got.cpu().float(), expected, atol=tol, rtol=tol)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cuda_cache_ops_match_reference(cuda_ops, dtype):
    key = torch.randn(50, 4, 128).to(dtype)
    value = torch.randn(50, 4, 128).to(dtype)
    slots = torch.randperm(8 * 16)[:50]
    slots[::7] = -1
    ek, ev = empty_caches(8, 4, 128, 16, dtype, fill=0.0)
    reference.reshape_and_cache(key, value, ek, ev, slots)
    gk, gv = empty_caches(8, 4, 128, 16, dtype, fill=0.0, device="cuda")
    cuda_ops.reshape_and_cache(key.cuda(), value.cuda(), gk, gv, slots.cuda())
    assert torch.equal(gk.cpu(), ek) and torch.equal(gv.cpu(), ev)

    mapping = torch.tensor([[0, 5], [1, 6], [1, 7]])
    second_k, second_v = gk.clone() * 2, gv.clone() * 2
    cuda_ops.copy_blocks([gk, second_k], [gv, second_v], mapping.cuda())
    for cache in (gk, second_k, gv, second_v):
        assert torch.equal(cache[5], cache[0]) and torch.equal(cache[7], cache[1])

    host = torch.zeros(4, *gk.shape[1:], dtype=dtype)
    cuda_ops.swap_blocks(gk, host, torch.tensor([[5, 0], [2, 3]]))  # device -> CPU
    assert torch.equal(host[0], gk[5].cpu()) and torch.equal(host[3], gk[2].cpu())
    cuda_ops.swap_blocks(host, gk, torch.tensor([[3, 4]]))  # CPU -> device
    torch.cuda.synchronize()
    assert torch.equal(gk[4].cpu(), host[3])


def test_the_engine_takes_the_block_sizes_the_kernels_are_built_for():
    from cuda_ext.checks import COMPILED_BLOCK_SIZES
    from engine.core.config import SUPPORTED_BLOCK_SIZES
    assert COMPILED_BLOCK_SIZES == SUPPORTED_BLOCK_SIZES
