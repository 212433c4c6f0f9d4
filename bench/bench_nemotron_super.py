"""Llama-3.3-Nemotron-Super-49B (DeciLM) beside Llama-3.3-70B, and DSA's FP8 cache layout on B200.

Prints, from the catalog and the measured cost model (nothing fitted, nothing timed here):
- the Super's parameters, KV bytes per token and one H100's FP8 plan, against Llama-3.3-70B;
- a decode step on 2 x H100 (bf16, 32 sequences of 2,048 tokens) and its MLP GEMMs by width;
- the decode-only rate on one B200 in FP8 at 64 sequences of 2,400 tokens (set it beside a vLLM run's peak
  one-second window, which holds decode steps alone) and the simulated closed loops;
- the KV tokens each of 8 B200s holds for DeepSeek-V3.2 and GLM-5 with an FP8 cache, in the plain FP8
  layout vLLM's FlashInfer sparse backend keeps there and in FlashMLA's fp8_ds_mla (Hopper's).

    .venv/bin/python bench/bench_nemotron_super.py
"""
from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from engine.deployment import Deployment  # noqa: E402
from planner import simulate  # noqa: E402
from planner.catalog import resolve_model  # noqa: E402
from planner.cost.shape import StepShape  # noqa: E402
from planner.deploy.plan import plan_deployment  # noqa: E402
from planner.runs.pipeline import build_cost_model  # noqa: E402

SUPER, LLAMA70 = "nvidia/Llama-3_3-Nemotron-Super-49B-v1-FP8", "nvidia/Llama-3.3-70B-Instruct-FP8"


def shapes() -> None:
    sup, llama = resolve_model(SUPER), resolve_model(LLAMA70)
    print(f"parameters: {sup.num_params:,} (Llama-3.3-70B {llama.num_params:,})")
    print(f"KV bytes per token, bf16: {sup.kv_bytes_per_token():,} (Llama-3.3-70B {llama.kv_bytes_per_token():,})")
    print("MLPs by width:", ", ".join(f"{n} x {w:,}" for n, w, _ in sup.dense_mlp_kinds))
    memory = plan_deployment(Deployment(model=SUPER, gpu="h100", tp=1, max_model_len=32768)).memory
    print(f"one H100, FP8, 32K limit: weights {memory.weight_bytes_per_gpu / 1e9:.1f} GB, "
          f"{memory.kv_token_slots:,} cached tokens")


def steps() -> None:
    """Priced as `planner simulate` and `planner explain` price them: the plan's measured model (vLLM v1's
    async scheduling hides the host time behind the GPU's)."""
    plan = plan_deployment(Deployment(model="nemotron-super-49b", gpu="h100", tp=2, max_model_len=8192))
    ledger = build_cost_model(plan, "measured").ledger(StepShape(decode_seqs=32, decode_context=32 * 2048))
    print(f"2 x H100 bf16, 32 x 2K decode: {ledger.total * 1e3:.2f} ms")
    for term in ledger.terms:
        if term.name.startswith(("gate+up", "down")):
            print(f"  {term.name:<26} {term.seconds * 1e3:6.3f} ms  {term.detail}")
    plan = plan_deployment(Deployment(model=SUPER, gpu="b200", tp=1, max_model_len=32768))
    step = build_cost_model(plan, "measured").step_time(StepShape(decode_seqs=64, decode_context=64 * 2400))
    print(f"1 x B200 FP8, 64 x 2,400 decode: {step * 1e3:.1f} ms a step, {64 / step:,.0f} tok/s")


def closed_loops() -> None:
    runs = [(SUPER, "h100", 2, 32, 96, {}), (LLAMA70, "h100", 2, 32, 96, {}),
            (SUPER, "b200", 1, 64, 256, {"input_len": 2048, "output_len": 512, "range_ratio": 0})]
    for model, gpu, tp, clients, requests, params in runs:
        run = simulate(Deployment(model=model, gpu=gpu, tp=tp, max_model_len=32768 if params else 8192),
                       workload="random", concurrency=clients, requests=requests, params=params)
        m = run.metrics
        print(f"{model.split('/')[-1]} on {tp} x {gpu}, {clients} clients: {m.output_token_throughput:,.0f} tok/s, "
              f"TPOT {m.tpot_mean * 1e3:.1f} ms, TTFT {m.ttft_mean:.2f} s")


def dsa_fp8_layouts() -> None:
    for name in ("deepseek-v3.2", "zai-org/GLM-5-FP8", "zai-org/GLM-5.2-FP8"):
        plan = plan_deployment(Deployment(model=name, gpu="b200", tp=8, kv_cache_dtype="fp8", max_model_len=32768))
        memory, model = plan.memory, plan.model
        room = (memory.usable_bytes_per_gpu - memory.weight_bytes_per_gpu - memory.activation_bytes_per_gpu
                - memory.non_torch_bytes_per_gpu)
        ds_mla_block = (model.kv_bytes_per_token(1) + model.attention_layers * (656 - 576)) * memory.block_size
        before = room // ds_mla_block * memory.block_size
        print(f"{name} on 8 x B200, FP8 cache: {memory.kv_token_slots:,} tokens a GPU in plain FP8 "
              f"(fp8_ds_mla would hold {before:,}: {memory.kv_token_slots / before - 1:+.1%})")


if __name__ == "__main__":
    shapes()
    steps()
    closed_loops()
    dsa_fp8_layouts()
