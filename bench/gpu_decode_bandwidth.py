"""Paged decode attention bandwidth on a GPU: v1, v2 and SDPA over the same keys and values.

Batch 64, context 2048, head size 128, fp16, MHA (32/32 heads) and GQA (32/8),
block size 16 with the blocks shuffled in the pool. Times come from CUDA
events (median of --iters launches after warm-up); bandwidth counts the bytes
a launch must read (every key and value of every context, plus the query)
and write (the output). SDPA reads the same K/V held contiguously
(``enable_gqa`` for grouped heads). Issue 14's target: v1 or v2 at >= 70% of
the H200's 4.8 TB/s on MHA. Writes one JSON document to --out.

    python3 bench/gpu_decode_bandwidth.py --out decode_bandwidth.json
    python3 bench/gpu_decode_bandwidth.py --device cpu --batch 4 --context 256   # dry run
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from cuda_ext import ops_for  # noqa: E402

H200_BANDWIDTH = 4.8e12   # bytes/s, the vendor's datasheet


def timer(device: torch.device, fn, warmup: int, iters: int) -> float:
    """Median seconds per call: CUDA events on a GPU, the wall clock on the CPU."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def case(device, dtype, batch, context, num_heads, num_kv_heads, head_size, block_size, warmup, iters) -> dict:
    gen = torch.Generator().manual_seed(0)
    x = 16 // torch.empty((), dtype=dtype).element_size()
    per_seq = context // block_size
    num_blocks = batch * per_seq
    key_cache = torch.randn(num_blocks, num_kv_heads, head_size // x, block_size, x, generator=gen).to(device, dtype)
    value_cache = torch.randn(num_blocks, num_kv_heads, head_size, block_size, generator=gen).to(device, dtype)
    block_tables = torch.randperm(num_blocks, generator=gen).view(batch, per_seq).to(torch.int32).to(device)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    query = torch.randn(batch, num_heads, head_size, generator=gen).to(device, dtype)
    out = torch.empty_like(query)
    scale = head_size ** -0.5
    ops = ops_for(device)
    element = torch.empty((), dtype=dtype).element_size()
    kv_bytes = 2 * batch * context * num_kv_heads * head_size * element
    moved = kv_bytes + 2 * query.numel() * element
    # The same contexts, contiguous: [batch, kv_heads, context, head_size].
    blocks = block_tables.long()
    keys = key_cache[blocks].permute(0, 2, 1, 4, 3, 5).reshape(batch, num_kv_heads, per_seq, block_size, head_size)
    keys = keys.reshape(batch, num_kv_heads, context, head_size).contiguous()
    values = value_cache[blocks].permute(0, 2, 1, 4, 3).reshape(batch, num_kv_heads, context, head_size).contiguous()
    q4 = query.unsqueeze(2)
    runs = {
        "v1": lambda: ops.paged_attention_v1(out, query, key_cache, value_cache, num_kv_heads, scale,
                                             block_tables, seq_lens, block_size, context),
        "v2": lambda: ops.paged_attention_v2(out, query, key_cache, value_cache, num_kv_heads, scale,
                                             block_tables, seq_lens, block_size, context),
        "sdpa": lambda: F.scaled_dot_product_attention(q4, keys, values, scale=scale,
                                                       enable_gqa=num_heads != num_kv_heads),
    }
    result = {"batch": batch, "context": context, "num_heads": num_heads, "num_kv_heads": num_kv_heads,
              "head_size": head_size, "block_size": block_size, "dtype": str(dtype).removeprefix("torch."),
              "bytes_moved": moved, "backend": ops.backend}
    with torch.inference_mode():
        runs["v1"]()
        reference = out.clone()
        for name, fn in runs.items():
            seconds = timer(device, fn, warmup, iters)
            result[name] = {"seconds": seconds, "bandwidth_bytes_per_s": moved / seconds,
                            "fraction_of_h200_peak": moved / seconds / H200_BANDWIDTH}
        runs["v2"]()
        result["v2_matches_v1_max_abs"] = float((out.float() - reference.float()).abs().max())
        sdpa = runs["sdpa"]().squeeze(2)
        result["sdpa_matches_v1_max_abs"] = float((sdpa.float() - reference.float()).abs().max())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--head-size", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--out", default=None, help="JSON file to write")
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    cases = {"mha": (32, 32), "gqa": (32, 8)}
    doc = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "target": "v1 or v2 >= 70% of 4.8 TB/s (MHA, fp16, batch 64, context 2048)", "cases": {}}
    for name, (heads, kv_heads) in cases.items():
        result = case(device, dtype, args.batch, args.context, heads, kv_heads, args.head_size, 16,
                      args.warmup, args.iters)
        doc["cases"][name] = result
        print(f"{name}: " + ", ".join(f"{k} {result[k]['seconds'] * 1e6:.1f} us "
                                      f"{result[k]['bandwidth_bytes_per_s'] / 1e12:.2f} TB/s "
                                      f"({result[k]['fraction_of_h200_peak']:.0%} of H200)"
                                      for k in ("v1", "v2", "sdpa")))
    mha = doc["cases"]["mha"]
    doc["best_paged_fraction_mha"] = max(mha["v1"]["fraction_of_h200_peak"], mha["v2"]["fraction_of_h200_peak"])
    doc["target_met"] = device.type == "cuda" and doc["best_paged_fraction_mha"] >= 0.7
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=2)


if __name__ == "__main__":
    main()
