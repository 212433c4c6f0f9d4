"""DeepGEMM's grouped FP8 GEMMs: the experts vLLM runs behind DeepEP's all-to-all, at DeepGEMM's published rates.

What vLLM runs. When DeepEP dispatches a block-FP8 MoE (--all2all-backend deepep_low_latency or
deepep_high_throughput), the experts are not the Triton fused-MoE kernel NVIDIA's table times: vLLM's FP8
MoE method pairs DeepEP's low-latency kernels (the batched activation format) with BatchedDeepGemmExperts,
DeepGEMM's masked grouped GEMMs, and its normal kernels with DeepGemmExperts, the contiguous grouped GEMMs
(vllm/model_executor/layers/quantization/fp8.py select_gemm_impl; VLLM_USE_DEEP_GEMM is on by default).
Between the two GEMMs one kernel applies SiLU-and-mul and quantizes to FP8 again
(silu_mul_fp8_quant_deep_gemm).

The rates are DeepGEMM's published measurements for DeepSeek-V3's expert shapes (github.com/deepseek-ai/DeepGEMM
README as of April 2025, commit 327ec92: H800 SXM5, NVCC 12.8), TFLOPS by tokens per expert m:

    gate+up (N 4096, K 7168):  m 256: 932, 512: 1040, 1024: 1233 (masked), 4096 and 8192: 1346 (contiguous)
    down    (N 7168, K 2048):  m 256: 815, 512: 916, 1024: 925 (masked), 4096 and 8192: 1214 (contiguous)

interpolated in log2(m), flat past the ends. Below 256 tokens an expert a grouped GEMM reads its experts'
weights whatever m is: at m = 256 the README's rows move 2064 and 2047 GB/s, and a smaller m is priced as its
bytes (FP8 weights, FP8 inputs, bf16 outputs) at that rate, never below its FLOPs at m = 256's rate. The
SiLU-and-mul pass reads the gate and up outputs (bf16) and writes FP8 at the same rate. The H800 is an H100
SXM5 in compute and memory (132 SMs, 3.35 TB/s HBM3); another Hopper GPU keeps the FLOP rates and scales the
bandwidth with its memory's (H200: 4.8 / 3.35).

When it applies (--moe-backend, vLLM's KernelConfig.moe_backend): `auto` runs DeepGEMM behind DeepEP, as
vLLM's FP8 oracle does, and keeps NVIDIA's timing of vLLM's own choice behind the default all-gather;
`deep_gemm` runs it behind either, in the contiguous layout only from 128 rows, below which vLLM's
TritonOrDeepGemmExperts falls back to Triton (deep_gemm_moe.py _valid_deep_gemm); `triton` never. DeepGEMM
published rates for DeepSeek-V3's expert shape only (hidden 7168, width 2048: DeepSeek-V3/R1, Kimi-K2),
whole (expert parallelism or one GPU), block FP8, on Hopper: other experts keep NVIDIA's table, and
`--moe-backend deep_gemm` for them is a warning (`unpriced`).

Under dual-batch overlap vLLM gives the communication kernels 20 of the GPU's 132 SMs while a microbatch's
all-to-all runs and caps DeepGEMM at the rest (gpu_ubatch_wrapper.py SMControlContextManager,
VLLM_DBO_COMM_SMS; DeepGEMM is the only kernel it caps): the FLOP rates scale by that share
(`sm_share`), the bandwidth bound does not (112 SMs still draw the memory's rate).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from planner.catalog import GpuSpec, ModelSpec
from planner.catalog.quantization import WeightFormat
from planner.cost.moe import MoeParallel, MoeWork

HOPPER = ("h100", "h200")
H800_BANDWIDTH = 3.35e12                 # B/s: the README's GPU's HBM3
HIDDEN, WIDTH = 7168, 2048               # DeepSeek-V3's experts, the shapes the README timed
# tokens per expert -> TFLOPS (README, H800): gate+up (N 4096, K 7168) and down (N 7168, K 2048)
GATE_UP = {256: 932, 512: 1040, 1024: 1233, 4096: 1346, 8192: 1346}
DOWN = {256: 815, 512: 916, 1024: 925, 4096: 1214, 8192: 1214}
SMALL_M_BANDWIDTH = {"gate_up": 2064e9, "down": 2047e9}   # B/s at m = 256 on the H800
SCALE_GROUP = 128                        # block FP8: one float32 scale per 128 x 128 weights, 128 activations
CONTIGUOUS_MIN_ROWS = 128                # vLLM's DeepGEMM alignment: fewer rows run Triton (_valid_deep_gemm)
HOPPER_SMS = 132                         # SMs of an H100 / H200 SXM (and the README's H800)


def _rate(table: dict[int, float], m: float) -> float:
    """FLOP/s at `m` tokens an expert, interpolated in log2(m), flat past the ends."""
    sizes = sorted(table)
    m = min(max(m, sizes[0]), sizes[-1])
    high = next(s for s in sizes if s >= m)
    low = max(s for s in sizes if s <= m)
    w = 0.0 if high == low else math.log2(m / low) / math.log2(high / low)
    return (table[low] + (table[high] - table[low]) * w) * 1e12


@dataclass(frozen=True, slots=True)
class DeepGemm:
    """One MoE layer's experts on one GPU as DeepGEMM runs them."""

    bandwidth_scale: float               # this GPU's memory bandwidth over the H800's
    masked: bool = True                  # DeepEP's low-latency format (masked GEMMs), else contiguous

    @classmethod
    def of(cls, model: ModelSpec, fmt: WeightFormat | None, gpu: GpuSpec, par: MoeParallel) -> DeepGemm | None:
        """DeepGEMM's experts where --moe-backend runs them and the README's rates price them; None elsewhere."""
        if par.moe_backend == "triton" or (par.moe_backend == "auto" and not par.deepep):
            return None
        if unpriced(model, fmt, gpu, par) is not None:
            return None
        return cls(gpu.memory_bandwidth / H800_BANDWIDTH, par.deepep and par.all2all == "deepep_low_latency")

    def runs(self, work: MoeWork) -> bool:
        """Whether vLLM runs DeepGEMM for `work`: always in the masked layout; in the contiguous one from 128
        rows (the tokens the experts see), below which it runs Triton."""
        return self.masked or work.tokens >= CONTIGUOUS_MIN_ROWS

    def seconds(self, work: MoeWork, sm_share: float = 1.0) -> float:
        """Both grouped GEMMs and the SiLU-and-mul between them, for the busiest GPU's `work`, on `sm_share` of
        the GPU's SMs (dual-batch overlap's cap)."""
        if work.pairs <= 0 or work.touched <= 0:
            return 0.0
        m = work.pairs / work.touched
        width = work.width
        gate_up = self._gemm(work, GATE_UP, "gate_up", m, 2 * width, HIDDEN, sm_share)
        down = self._gemm(work, DOWN, "down", m, HIDDEN, width, sm_share)
        activation = work.pairs * (2 * width * 2 + width * (1 + 4 / SCALE_GROUP))
        return gate_up + activation / (SMALL_M_BANDWIDTH["down"] * self.bandwidth_scale) + down

    def _gemm(self, work: MoeWork, table: dict[int, float], role: str, m: float, n: int, k: int,
              sm_share: float = 1.0) -> float:
        flops = 2.0 * work.pairs * n * k
        if m >= min(table):
            return flops / (_rate(table, m) * sm_share)
        weights = work.touched * n * k * (1 + 4 / (SCALE_GROUP * SCALE_GROUP))
        nbytes = weights + work.pairs * (k * (1 + 4 / SCALE_GROUP) + 2 * n)
        return max(flops / (_rate(table, m) * sm_share), nbytes / (SMALL_M_BANDWIDTH[role] * self.bandwidth_scale))

    def describe(self) -> str:
        layout = "masked" if self.masked else "contiguous"
        return (f"DeepGEMM {layout} grouped FP8 GEMMs at DeepGEMM's published H800 rates"
                + (f", bandwidth x{self.bandwidth_scale:.2f}" if abs(self.bandwidth_scale - 1) > 1e-3 else "")
                + " (planner/cost/deepgemm.py)")


def unpriced(model: ModelSpec, fmt: WeightFormat | None, gpu: GpuSpec, par: MoeParallel) -> str | None:
    """Why DeepGEMM's published rates cannot price this MoE's experts; None when they can."""
    experts = fmt.experts if fmt is not None else None
    if experts is None or experts.scheme != "fp8-block":
        return "its experts are not block FP8, the format DeepGEMM runs"
    if gpu.family not in HOPPER:
        return f"DeepGEMM published rates for Hopper only, not {gpu.name}"
    if (model.expert_hidden, model.moe_intermediate_size) != (HIDDEN, WIDTH) or not model.gated_mlp:
        return (f"DeepGEMM published rates for DeepSeek-V3's experts only (hidden {HIDDEN}, width {WIDTH}), not "
                f"{model.name}'s ({model.expert_hidden}, {model.moe_intermediate_size})")
    if par.moe_tp > 1:
        return ("its experts are split by width over the GPUs (no --enable-expert-parallel): DeepGEMM published no "
                "rates for them")
    return None


def check_moe_backend(model: ModelSpec, fmt: WeightFormat | None, gpu: GpuSpec, par: MoeParallel | None,
                      backend: str) -> str | None:
    """A warning when --moe-backend `backend` changes nothing (a dense model) or deep_gemm cannot be priced as
    asked (the experts then keep NVIDIA's table)."""
    if par is None and backend != "auto":
        return f"--moe-backend {backend} changes nothing here: {model.name} has no experts"
    if par is None or par.moe_backend != "deep_gemm":
        return None
    why = unpriced(model, fmt, gpu, par)
    if why is None:
        return None
    return f"--moe-backend deep_gemm: {why}; its experts are priced by NVIDIA's fused-MoE table"
