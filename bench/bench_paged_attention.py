"""CPU paged decode attention vs torch SDPA on the same keys/values held contiguously.

Prints, for each case, the median time of the CPU kernels' paged_attention_v1
and v2 and of torch.nn.functional.scaled_dot_product_attention (query
[batch, heads, 1, d] against keys/values [batch, kv_heads, ctx, d]; GQA via
enable_gqa, so both read the same bytes), and their ratio. The paged blocks
are shuffled in the pool, as they are after an engine has run a while.

    PYTHONPATH=. .venv/bin/python bench/bench_paged_attention.py [--repeats 10]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cuda_ext import load_ops, reference


@dataclass(frozen=True)
class Case:
    name: str
    batch: int = 32
    context: int = 1024
    num_heads: int = 32
    num_kv_heads: int = 32
    head_size: int = 128
    block_size: int = 16
    dtype: torch.dtype = torch.float32


CASES = [
    Case("MHA 32 heads"),
    Case("GQA 32/8 heads", num_kv_heads=8),
]


def median_seconds(fns: dict, repeats: int) -> dict:
    """Median time of each function, measured round-robin so that load from
    other processes on the machine slows every contender alike."""
    for fn in fns.values():
        fn()  # warm-up: page faults, thread pool start, caches
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(samples) for name, samples in times.items()}


def build_inputs(case: Case, generator: torch.Generator):
    """Random paged K/V with shuffled block ids, and the same K/V as contiguous tensors."""
    x = 16 // torch.empty((), dtype=case.dtype).element_size()
    blocks_per_seq = math.ceil(case.context / case.block_size)
    num_blocks = case.batch * blocks_per_seq
    shape_k = (num_blocks, case.num_kv_heads, case.head_size // x, case.block_size, x)
    key_cache = torch.randn(shape_k, generator=generator).to(case.dtype)
    value_cache = torch.randn(num_blocks, case.num_kv_heads, case.head_size, case.block_size, generator=generator).to(case.dtype)
    block_tables = torch.randperm(num_blocks, generator=generator).view(case.batch, blocks_per_seq).int()
    seq_lens = torch.full((case.batch,), case.context, dtype=torch.int32)
    query = torch.randn(case.batch, case.num_heads, case.head_size, generator=generator).to(case.dtype)
    keys, values = [], []
    for seq in range(case.batch):
        k, v = reference.gather_kv(key_cache, value_cache, block_tables[seq], case.context)
        keys.append(k)
        values.append(v)
    return query, key_cache, value_cache, block_tables, seq_lens, torch.stack(keys), torch.stack(values)


def run_case(case: Case, ops, repeats: int) -> dict:
    generator = torch.Generator().manual_seed(0)
    query, key_cache, value_cache, block_tables, seq_lens, keys, values = build_inputs(case, generator)
    scale = case.head_size ** -0.5
    out = torch.empty_like(query)
    args = (query, key_cache, value_cache, case.num_kv_heads, scale, block_tables, seq_lens, case.block_size, case.context)
    sdpa_query = query.unsqueeze(2)  # [batch, heads, 1, d]
    gqa = case.num_heads != case.num_kv_heads

    def sdpa():
        return F.scaled_dot_product_attention(sdpa_query, keys, values, scale=scale, enable_gqa=gqa)

    t = median_seconds(
        {
            "v1": lambda: ops.paged_attention_v1(out, *args),
            "v2": lambda: ops.paged_attention_v2(out, *args),
            "sdpa": sdpa,
        },
        repeats,
    )
    # The comparison is only meaningful if both compute the same thing.
    ops.paged_attention_v1(out, *args)
    error = (out.float() - sdpa().squeeze(2).float()).abs().max().item()
    kv_bytes = keys.numel() * keys.element_size() * 2
    return {**t, "max_abs_err": error, "kv_gib": kv_bytes / 2**30}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    ops = load_ops("cpu")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {ops.describe()}")
    print(f"{'case':<16} {'KV GiB':>7} {'v1 ms':>8} {'v2 ms':>8} {'sdpa ms':>8} {'v1/sdpa':>8} {'v2/sdpa':>8} {'v1 GB/s':>8} {'max err':>9}")
    for case in CASES:
        r = run_case(case, ops, args.repeats)
        bandwidth = r["kv_gib"] * 2**30 / r["v1"] / 1e9
        print(
            f"{case.name:<16} {r['kv_gib']:7.2f} {r['v1'] * 1e3:8.2f} {r['v2'] * 1e3:8.2f} {r['sdpa'] * 1e3:8.2f} "
            f"{r['v1'] / r['sdpa']:8.3f} {r['v2'] / r['sdpa']:8.3f} {bandwidth:8.1f} {r['max_abs_err']:9.2e}"
        )
    print(f"(batch {CASES[0].batch}, context {CASES[0].context}, block size {CASES[0].block_size}, "
          f"head size {CASES[0].head_size}, fp32; ratio < 1 means the paged kernel is faster)")


if __name__ == "__main__":
    main()
