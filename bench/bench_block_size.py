"""Paged-attention decode time against KV block size, for the planner's block-size factors.

Times our kernels' paged_attention_v1 at block sizes 8, 16 and 32 on the same
keys and values (same batch, context, heads; the blocks shuffled in the pool as
after an engine has run a while), round-robin so that load from other
processes slows every block size alike, and prints each time relative to block
16. With --write it stores the factors in planner/data/block_size_factors.json, which
planner/cost/block_size.py applies to the cost models' decode-attention term.

    PYTHONPATH=. .venv/bin/python bench/bench_block_size.py [--repeats 15] [--backend cpu] [--write]
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time
from pathlib import Path

import torch

from cuda_ext import load_ops

BLOCK_SIZES = (8, 16, 32)
# Decode shapes the planner prices: a mid-size batch at short and long context, MHA and GQA.
SHAPES = [dict(batch=32, context=512, num_heads=32, num_kv_heads=32, head_size=128),
          dict(batch=32, context=2048, num_heads=32, num_kv_heads=32, head_size=128),
          dict(batch=16, context=2048, num_heads=32, num_kv_heads=8, head_size=128)]
OUT = Path(__file__).resolve().parents[1] / "planner" / "data" / "block_size_factors.json"


def inputs(shape: dict, block_size: int, dtype: torch.dtype, device: str, gen: torch.Generator):
    x = 16 // torch.empty((), dtype=dtype).element_size()
    per_seq = math.ceil(shape["context"] / block_size)
    blocks = shape["batch"] * per_seq
    kvh, d = shape["num_kv_heads"], shape["head_size"]
    key_cache = torch.randn(blocks, kvh, d // x, block_size, x, generator=gen).to(dtype).to(device)
    value_cache = torch.randn(blocks, kvh, d, block_size, generator=gen).to(dtype).to(device)
    tables = torch.randperm(blocks, generator=gen).view(shape["batch"], per_seq).int().to(device)
    lens = torch.full((shape["batch"],), shape["context"], dtype=torch.int32, device=device)
    query = torch.randn(shape["batch"], shape["num_heads"], d, generator=gen).to(dtype).to(device)
    return query, key_cache, value_cache, tables, lens


def measure(ops, shape: dict, dtype: torch.dtype, device: str, repeats: int) -> dict[int, float]:
    gen = torch.Generator().manual_seed(0)
    calls = {}
    for bs in BLOCK_SIZES:
        q, kc, vc, tables, lens = inputs(shape, bs, dtype, device, gen)
        out = torch.empty_like(q)
        args = (out, q, kc, vc, shape["num_kv_heads"], shape["head_size"] ** -0.5, tables, lens, bs,
                shape["context"])
        calls[bs] = (lambda a=args: ops.paged_attention_v1(*a))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for fn in calls.values():
        fn()
    sync()
    samples = {bs: [] for bs in BLOCK_SIZES}
    for _ in range(repeats):
        for bs, fn in calls.items():
            start = time.perf_counter()
            fn()
            sync()
            samples[bs].append(time.perf_counter() - start)
    return {bs: statistics.median(s) for bs, s in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--backend", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--write", action="store_true", help=f"store the factors in {OUT.name}")
    args = parser.parse_args()
    ops = load_ops(args.backend)
    device = "cuda" if args.backend == "cuda" else "cpu"
    dtype = torch.float16 if device == "cuda" else torch.float32
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {ops.describe()}; {dtype}")
    print(f"{'batch':>5} {'ctx':>5} {'heads':>6} " + " ".join(f"{'bs' + str(b) + ' ms':>9}" for b in BLOCK_SIZES)
          + " " + " ".join(f"{str(b) + '/16':>6}" for b in BLOCK_SIZES))
    ratios = {bs: [] for bs in BLOCK_SIZES}
    for shape in SHAPES:
        t = measure(ops, shape, dtype, device, args.repeats)
        for bs in BLOCK_SIZES:
            ratios[bs].append(t[bs] / t[16])
        print(f"{shape['batch']:5d} {shape['context']:5d} {shape['num_heads']:>3}/{shape['num_kv_heads']:<2} "
              + " ".join(f"{t[b] * 1e3:9.2f}" for b in BLOCK_SIZES) + " "
              + " ".join(f"{t[b] / t[16]:6.3f}" for b in BLOCK_SIZES))
    factors = {str(bs): round(statistics.geometric_mean(r), 4) for bs, r in ratios.items()}
    print("factors (geometric mean over the shapes, relative to block 16):", factors)
    if args.write:
        data = json.loads(OUT.read_text()) if OUT.is_file() else {"backends": {}}
        data["about"] = ("paged_attention_v1 decode time at each KV block size relative to block 16, "
                         "measured by bench/bench_block_size.py")
        data["backends"][args.backend] = {
            "factors": factors,
            "source": (f"bench/bench_block_size.py --backend {args.backend} --repeats {args.repeats} on "
                       f"{platform.machine()} ({torch.get_num_threads()} threads, {dtype}), "
                       f"{time.strftime('%Y-%m-%d')}"),
            "shapes": SHAPES,
            "per_shape": {str(bs): [round(x, 4) for x in r] for bs, r in ratios.items()},
        }
        OUT.write_text(json.dumps(data, indent=2) + "\n")
        print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
