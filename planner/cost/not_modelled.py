"""What the cost model in use does not capture, in plain words (every result lists it)."""
from __future__ import annotations

from engine.core.config import SUPPORTED_BLOCK_SIZES
from planner.cost.block_size import decode_attention_factor


def not_modelled(cost_model: str, block_size: int, enable_prefix_caching: bool = False,
                 preemption_mode: str = "recompute", tp: int = 1, factor_source: str | None = None) -> list[str]:
    """Effects the cost model in use does not capture, in plain words."""
    notes = []
    if cost_model.startswith("roofline"):
        notes.append("roofline: peaks x fixed efficiencies; no kernel launch gaps, no CUDA graphs, "
                     "CPU overhead is a planning guess (2 ms + 20 us/sequence)")
        if factor_source:
            factors = ", ".join(f"{b}: x{decode_attention_factor(b):.3g}" for b in SUPPORTED_BLOCK_SIZES)
            notes.append(f"block size: decode attention scaled by factors measured on our own CPU paged-attention "
                         f"kernel ({factors}; {factor_source}); how block size changes GPU kernel speed is not "
                         f"measured")
        else:
            notes.append(f"block size {block_size}: no effect on attention-kernel speed in this model; only its "
                         f"effect on memory (fragmentation, blocks) is simulated")
    elif cost_model.startswith("measured"):
        notes.append("measured: NVIDIA's per-operation vLLM latencies summed per layer, the elementwise kernels "
                     "from their bytes, vLLM's host time fitted to NVIDIA's H100 runs (planner explain prints "
                     "the ledger); the tables' attention kernels at their own block size (block size changes "
                     "memory only)")
    else:
        notes.append("calibrated: measured on the profiled device at the profiled block size; other block sizes "
                     "are scaled by the kernel factor" + (f" ({factor_source})" if factor_source else ""))
        if tp > 1:
            notes.append("tensor parallelism: the profile covers one device; all-reduce time is not measured")
    if "weight-only" in cost_model or "16-bit math" in cost_model:
        notes.append("weight-only kernels (Marlin): priced by the bytes their smaller weights save; the "
                     "dequantization inside the kernel and its large-batch tiles are not measured")
    if "priced as bf16 KV" in cost_model:
        notes.append("FP8 KV cache: no measured FP8-KV attention table for this GPU; attention priced as with a "
                     "16-bit cache (the memory plan still holds FP8 blocks)")
    if "deepep_" in cost_model:
        experts = ("the experts' grouped GEMMs at DeepGEMM's published H800 rates, DeepSeek-V3's shape only"
                   if "experts: DeepGEMM" in cost_model else
                   "the experts still priced as vLLM's fused MoE: DeepGEMM published no rates for this shape or GPU")
        notes.append("DeepEP dispatch and combine: bytes at the rates DeepEP's README measured on H800 nodes (not "
                     f"vLLM end to end, nothing below 128 tokens per rank); {experts}")
    if "dual-batch overlap" in cost_model:
        notes.append("dual-batch overlap: both microbatches' compute and all-to-all overlapped as two ideal "
                     "streams, DeepGEMM on the SMs the communication kernels leave, the dp ranks splitting together "
                     "or not at all; the other kernels' sharing of the SMs and a split step's padding of every rank "
                     "to the largest rank's tokens are not priced")
    if "deepep_high_throughput" in cost_model:
        notes.append("deepep_high_throughput: vLLM runs every step without CUDA graphs (none padded); the CPU's "
                     "kernel launches that graphs would hide are not priced, so small decode steps come out short")
    if "+ LoRA roofline" in cost_model:
        notes.append("LoRA: the adapters' shrink and expand kernels priced from their bytes and FLOPs, an adapter's "
                     "load into a GPU slot from its bytes over the host link (no vLLM LoRA run was measured); "
                     "reading an adapter from disk and the host's per-step LoRA metadata are not priced")
    if enable_prefix_caching:
        notes.append("prefix caching: hashing and lookup cost on the host is not priced")
    if preemption_mode == "swap":
        notes.append("swap: transfers are priced on the step, not overlapped with compute")
    notes.append("no network, tokenization or detokenization time: latencies are engine-side (Qwen3-8B on an H100 "
                 "through vLLM's chat endpoint measured 5-10 ms more TTFT than the engine's share with vLLM 0.18, "
                 "about 50 ms with vLLM 0.11: bench/bench_public_qwen3_8b.py, bench/bench_public_gpustack.py)")
    return notes
