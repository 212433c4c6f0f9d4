"""End-to-end output-token throughput: the paged engine vs transformers' static batching.

Same random-weight model (saved and loaded like a user's checkpoint), same
ShareGPT-like request set (lengths scaled down to fit a CPU run), same
maximum batch size. transformers runs padded batches of ``--batch`` requests
in arrival order, each until its longest request is done; the engine batches
at the iteration level. Only the requested output tokens count. Also reports
the engine's KV-cache utilization (token-state slots / allocated slots,
time-averaged over its steps). Targets: issue 3, >= 3x throughput on
opt-125m and >= 95% utilization; issue 13, >= 5x on the tiny Llama (hidden
256, 4 layers, batch 32), where the engine's per-step host work dominates.

    .venv/bin/python bench/bench_engine_throughput.py [--requests 48 --batch 16 --scale 0.25]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from engine import LLM  # noqa: E402
from planner.catalog import resolve_model  # noqa: E402
from workloads import make_trace  # noqa: E402


def tiny_llama_config():
    """Issue 13's model: a Llama with hidden size 256 and 4 layers, where the engine's host path dominates."""
    from transformers import LlamaConfig
    return LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4,
                       num_key_value_heads=4, vocab_size=1024, max_position_embeddings=2048)


def build_model(folder: str, name: str) -> str:
    # tiny-llama, or a catalog architecture (OPT is the paper's family), with random weights.
    config = tiny_llama_config() if name == "tiny-llama" else resolve_model(name).to_hf_config()
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder, safe_serialization=True)
    return folder


def run_hf(folder, prompts, outputs, batch):
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    start = time.perf_counter()
    for i in range(0, len(prompts), batch):
        chunk, lens = prompts[i:i + batch], outputs[i:i + batch]
        width = max(map(len, chunk))
        ids = torch.tensor([[1] * (width - len(p)) + p for p in chunk])          # left padding
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        with torch.no_grad():
            model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max(lens),
                           min_new_tokens=max(lens), pad_token_id=1)
    return time.perf_counter() - start


def run_engine(folder, prompts, trace, batch, block_size):
    """(seconds, KV-cache utilization): token-state slots / allocated slots, time-averaged over steps."""
    llm = LLM(folder, block_size=block_size, max_num_seqs=batch, kv_cache_memory_bytes=1 << 30)
    params = [r.sampling_params() for r in trace]
    outputs = [r.output_len for r in trace]
    start = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    assert [len(o.outputs[0].token_ids) for o in outs] == outputs
    steps = llm.engine.steps
    used = sum(s.kv_blocks_used * block_size * s.duration for s in steps)
    states = sum(s.token_states * s.duration for s in steps)
    return elapsed, states / used


def full_length_utilization(requests: int, batch: int, block_size: int) -> tuple[float, float]:
    """Utilization on unscaled ShareGPT-like lengths (mean 161 + 338 tokens).

    How full the allocated blocks are depends on sequence lengths and the block
    size, not on the model's width, so a narrow OPT with the real context
    length keeps this run short. Returns (utilization, mean sequence length).
    """
    from transformers import OPTConfig
    trace = make_trace("sharegpt", num_requests=requests, seed=1)
    prompts = [trace.prompt_token_ids(r, 1000, seed=0) for r in trace]
    outputs = [r.output_len for r in trace]
    config = OPTConfig(hidden_size=64, ffn_dim=128, num_hidden_layers=1, num_attention_heads=1,
                       vocab_size=1000, max_position_embeddings=2048, word_embed_proj_dim=64)
    with tempfile.TemporaryDirectory() as folder:
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(config).save_pretrained(folder, safe_serialization=True)
        _, utilization = run_engine(folder, prompts, trace, batch, block_size)
    return utilization, (sum(map(len, prompts)) + sum(outputs)) / len(prompts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama",
                        help="tiny-llama (hidden 256, 4 layers) or a catalog model (random weights)")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--scale", type=float, default=0.25, help="length scale of the ShareGPT-like trace")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--engine-only", action="store_true", help="skip transformers (for profiling the engine)")
    args = parser.parse_args()
    trace = make_trace("sharegpt", num_requests=args.requests, seed=0).scaled(
        length_scale=args.scale, max_prompt_len=512, max_output_len=500)
    vocab = tiny_llama_config().vocab_size if args.model == "tiny-llama" else resolve_model(args.model).vocab_size
    prompts = [trace.prompt_token_ids(r, vocab, seed=0) for r in trace]
    outputs = [r.output_len for r in trace]
    tokens = sum(outputs)
    with tempfile.TemporaryDirectory() as folder:
        build_model(folder, args.model)
        engine_time, utilization = run_engine(folder, prompts, trace, args.batch, args.block_size)
        if args.engine_only:
            print(f"engine: {engine_time:.2f} s, {tokens / engine_time:.1f} output tok/s")
            return
        hf_time = run_hf(folder, prompts, outputs, args.batch)
    print(f"model {args.model} (random weights, fp32, CPU); {len(prompts)} ShareGPT-like requests (x{args.scale} lengths): mean prompt "
          f"{sum(map(len, prompts)) / len(prompts):.0f}, mean output {tokens / len(prompts):.0f} tokens; "
          f"batch {args.batch}; torch threads {torch.get_num_threads()}")
    print(f"{'system':<34}{'seconds':>10}{'output tok/s':>14}")
    print(f"{'transformers generate (static)':<34}{hf_time:>10.2f}{tokens / hf_time:>14.1f}")
    print(f"{'paged engine (iteration-level)':<34}{engine_time:>10.2f}{tokens / engine_time:>14.1f}")
    print(f"throughput ratio engine / transformers: {hf_time / engine_time:.2f}x "
          f"(targets: >= 3x on opt-125m, issue 3; >= 5x on tiny-llama, issue 13)")
    print(f"KV-cache utilization (token states / allocated slots), this run: {utilization:.1%}")
    full, mean_len = full_length_utilization(args.requests, args.batch, args.block_size)
    print(f"KV-cache utilization on unscaled ShareGPT-like lengths (mean {mean_len:.0f} tokens per "
          f"sequence), block {args.block_size}: {full:.1%} (target >= 95%)")


if __name__ == "__main__":
    main()
