"""Speculative decoding (n-gram prompt lookup) against none, on the CPU, side by side in one run.

Two workloads on random-weight Llama checkpoints saved as a user's model folder:

- ``repeats``: outputs that repeat their prompts, as in code editing (the prompt holds the text,
  the answer rewrites it). The model's attention output is zeroed, so its next token depends on
  the current token only; each prompt is the model's own greedy path from a token s, then a
  separator, then s again, so the answer walks the same path and prompt lookup finds it.
- ``random``: the same-sized model with its attention left on and random prompts: the drafts are
  mostly rejected, which shows what speculation costs where it does not pay.

For each, the same requests run without and with ``speculative_config``, alternating, ``--repeats``
times (the best time of each is kept, the machine being shared); greedy outputs are checked equal.
Prints wall time, output tokens/s, the speedup ratio and vLLM's acceptance metrics.

    python bench/bench_spec_decode.py [--k 4] [--requests 4] [--max-tokens 128]
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import LLM, SamplingParams  # noqa: E402
from engine.core.speculative import SpecDecodingStats  # noqa: E402


def save_model(folder: Path, *, hidden: int, layers: int, vocab: int, attention: bool, seed: int = 0) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    config = LlamaConfig(hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                         num_attention_heads=hidden // 64, num_key_value_heads=max(hidden // 128, 1),
                         vocab_size=vocab, max_position_embeddings=2048, eos_token_id=2, bos_token_id=1,
                         pad_token_id=0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() > 1:
                param.normal_(0.0, 0.08)
            if not attention and name.endswith("o_proj.weight"):
                param.zero_()       # attention computes as usual; its output is dropped
    model.save_pretrained(folder, safe_serialization=True)
    return str(folder)


def timed(llm: LLM, prompts, params) -> tuple[float, list[list[int]]]:
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - start, [o.outputs[0].token_ids for o in outs]


def compare(name: str, folder: str, prompts, params, spec: dict, repeats: int, block_size: int) -> dict:
    base = LLM(folder, block_size=block_size, num_gpu_blocks=1024)
    fast = LLM(folder, block_size=block_size, num_gpu_blocks=1024, speculative_config=spec)
    timed(base, prompts[:1], SamplingParams(temperature=0, max_tokens=4))     # warm up both
    timed(fast, prompts[:1], SamplingParams(temperature=0, max_tokens=4))
    fast.engine.scheduler.spec_stats = SpecDecodingStats(spec["num_speculative_tokens"])   # the measured runs only
    t_base, t_spec = [], []
    for _ in range(repeats):
        t, want = timed(base, prompts, params)
        t_base.append(t)
        t, got = timed(fast, prompts, params)
        t_spec.append(t)
        if got != want:
            raise SystemExit(f"{name}: outputs with speculation differ from those without")
    tokens = sum(map(len, want))
    stats = fast.engine.spec_decoding_stats
    row = {"workload": name, "requests": len(prompts), "output_tokens": tokens,
           "base_s": min(t_base), "spec_s": min(t_spec), "base_tok_s": tokens / min(t_base),
           "spec_tok_s": tokens / min(t_spec), "speedup": min(t_base) / min(t_spec),
           "mean_acceptance_length": stats.mean_acceptance_length, "acceptance_rate": stats.acceptance_rate,
           "acceptance_rate_per_pos": stats.acceptance_rate_per_pos(), "identical_outputs": True}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    ap.add_argument("--lookup-min", type=int, default=1)
    ap.add_argument("--lookup-max", type=int, default=4)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (1: on a shared machine, multi-threaded BLAS spins and its timings drift)")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    spec = {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_min": args.lookup_min,
            "prompt_lookup_max": args.lookup_max}
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    rng = random.Random(0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        size = dict(hidden=args.hidden, layers=args.layers, vocab=args.vocab)
        copier = save_model(Path(tmp, "repeats"), attention=False, **size)
        # Each prompt: the model's own greedy path from a start token, a separator, the start again.
        starts = [rng.randrange(3, args.vocab) for _ in range(args.requests)]
        paths = [o.outputs[0].token_ids for o in LLM(copier, block_size=args.block_size).generate(
            [[s] for s in starts], params, use_tqdm=False)]
        prompts = [[s] + path + [1, s] for s, path in zip(starts, paths)]
        rows.append(compare("repeats", copier, prompts, params, spec, args.repeats, args.block_size))
        plain = save_model(Path(tmp, "random"), attention=True, **size)
        prompts = [[rng.randrange(3, args.vocab) for _ in range(len(p))] for p in prompts]
        rows.append(compare("random", plain, prompts, params, spec, args.repeats, args.block_size))
    print(f"n-gram speculation (k={args.k}, lookup {args.lookup_min}-{args.lookup_max}) vs none, CPU, "
          f"{args.requests} requests x {args.max_tokens} tokens, llama {args.hidden}x{args.layers} "
          f"vocab {args.vocab}, {args.threads} thread(s), best of {args.repeats}")
    print(f"{'workload':10} {'none s':>8} {'ngram s':>8} {'none tok/s':>11} {'ngram tok/s':>12} {'speedup':>8} "
          f"{'accept len':>10} {'accept rate':>11}  per position")
    for r in rows:
        per_pos = ", ".join(f"{p:.2f}" for p in r["acceptance_rate_per_pos"] if p is not None)
        length = r["mean_acceptance_length"]
        rate = r["acceptance_rate"]
        print(f"{r['workload']:10} {r['base_s']:8.2f} {r['spec_s']:8.2f} {r['base_tok_s']:11.1f} "
              f"{r['spec_tok_s']:12.1f} {r['speedup']:7.2f}x {length if length else float('nan'):10.2f} "
              f"{rate if rate is not None else float('nan'):11.2f}  [{per_pos}]")
    print("greedy outputs identical with and without speculation: yes")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
