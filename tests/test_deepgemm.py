"""DeepGEMM's grouped FP8 GEMMs: the experts vLLM runs behind DeepEP, priced at DeepGEMM's published rates."""
from dataclasses import replace

import pytest

from engine.deployment import Deployment
from planner.catalog import resolve_gpu, resolve_model
from planner.cost.deepgemm import DOWN, GATE_UP, DeepGemm, _rate
from planner.cost.measured import MeasuredCostModel
from planner.cost.moe import MoeParallel, MoeWork
from planner.cost.shape import StepShape
from planner.deploy.plan import plan_deployment

R1 = resolve_model("deepseek-r1")
LL = MoeParallel(dp=16, expert_parallel=True, all2all="deepep_low_latency")
R1_FP8 = plan_deployment(Deployment(model="deepseek-r1", gpu="h200", dp=16, enable_expert_parallel=True)).weight_format


def work(groups: int, m: int) -> MoeWork:
    return MoeWork(tokens=groups * m, touched=groups, local_experts=groups, pairs=groups * m, width=2048)


def gemm(dg: DeepGemm, table: dict, role: str, groups: int, m: int, n: int, k: int) -> float:
    return dg._gemm(work(groups, m), table, role, m, n, k)


@pytest.mark.parametrize("groups, m, tflops", [(1, 1024, 1233), (2, 512, 1040), (4, 256, 932)])
def test_the_readme_masked_rows_are_its_flops_over_its_times(groups, m, tflops):
    dg = DeepGemm(1.0)          # an H800: the README's GPU
    flops = 2 * groups * m * 4096 * 7168
    assert gemm(dg, GATE_UP, "gate_up", groups, m, 4096, 7168) == pytest.approx(flops / (tflops * 1e12))


def test_rates_between_points_follow_log2_m_and_stay_flat_past_the_ends():
    assert _rate(GATE_UP, 256 * 2 ** 0.5) == pytest.approx((932 + (1040 - 932) / 2) * 1e12)   # halfway in log2
    assert _rate(DOWN, 100_000) == 1214e12
    assert _rate(DOWN, 2048) == pytest.approx((925 + (1214 - 925) * 0.5) * 1e12)


def test_a_small_batch_reads_its_experts_at_the_readmes_m256_bandwidth():
    dg = DeepGemm(1.0)
    # at m = 256 the bandwidth bound and the FLOP rate give the README's time: the curve is continuous there
    at_256 = gemm(dg, GATE_UP, "gate_up", 4, 256, 4096, 7168)
    assert gemm(dg, GATE_UP, "gate_up", 4, 255, 4096, 7168) == pytest.approx(at_256, rel=0.01)
    # far below it the time is the weights' read: 16 experts of 4096 x 7168 FP8 values at 2064 GB/s
    small = gemm(dg, GATE_UP, "gate_up", 16, 4, 4096, 7168)
    assert small == pytest.approx(16 * 4096 * 7168 / 2064e9, rel=0.01)


def test_another_hopper_scales_only_the_bandwidth_bound():
    h100, h200 = (DeepGemm.of(R1, R1_FP8, resolve_gpu(g), LL) for g in ("h100-sxm", "h200"))
    assert h100.bandwidth_scale == pytest.approx(1.0)
    assert h200.seconds(work(16, 8)) == pytest.approx(h100.seconds(work(16, 8)) * 3.35 / 4.8, rel=1e-6)
    assert h200.seconds(work(16, 2048)) < h100.seconds(work(16, 2048))      # the activation pass only
    assert h200._gemm(work(16, 2048), DOWN, "down", 2048, 7168, 2048) == h100._gemm(work(16, 2048), DOWN, "down",
                                                                                    2048, 7168, 2048)


def test_only_what_the_readme_timed_on_the_kernel_vllm_runs():
    h200 = resolve_gpu("h200")
    assert DeepGemm.of(R1, R1_FP8, h200, LL).masked
    assert not DeepGemm.of(R1, R1_FP8, h200, replace(LL, all2all="deepep_high_throughput")).masked
    assert DeepGemm.of(R1, None, h200, LL) is None                      # bf16 experts: not DeepGEMM's FP8
    assert DeepGemm.of(R1, R1_FP8, resolve_gpu("b200"), LL) is None     # no published Blackwell rates
    qwen = plan_deployment(Deployment(model="Qwen/Qwen3-30B-A3B-FP8", gpu="h100-sxm"))
    assert DeepGemm.of(qwen.model, qwen.weight_format, resolve_gpu("h100-sxm"), LL) is None   # another shape


def test_moe_backend_chooses_the_kernel_as_vllm_does():
    h200 = resolve_gpu("h200")
    gathered = replace(LL, all2all="allgather_reducescatter")
    assert DeepGemm.of(R1, R1_FP8, h200, gathered) is None              # auto: NVIDIA's timing of vLLM's choice
    assert DeepGemm.of(R1, R1_FP8, h200, replace(LL, moe_backend="triton")) is None
    forced = DeepGemm.of(R1, R1_FP8, h200, replace(gathered, moe_backend="deep_gemm"))
    assert not forced.masked
    # the contiguous layout runs Triton below 128 rows (vLLM's _valid_deep_gemm), the masked one always DeepGEMM
    assert not forced.runs(work(4, 31)) and forced.runs(work(4, 32))
    assert DeepGemm.of(R1, R1_FP8, h200, LL).runs(work(1, 1))


def test_deep_gemm_where_no_rates_exist_is_a_warning_and_the_table_prices_it():
    plan = plan_deployment(Deployment(model="Qwen/Qwen3-30B-A3B-FP8", gpu="h100-sxm", dp=2,
                                      enable_expert_parallel=True, moe_backend="deep_gemm"))
    assert any("--moe-backend deep_gemm: DeepGEMM published rates for DeepSeek-V3's experts only" in w
               for w in plan.warnings)
    split = plan_deployment(Deployment(model="deepseek-r1", gpu="h200", tp=8, moe_backend="deep_gemm"))
    assert any("split by width" in w for w in split.warnings)
    dense = plan_deployment(Deployment(model="llama-3.1-8b", gpu="h100-sxm", moe_backend="deep_gemm"))
    assert any("--moe-backend deep_gemm changes nothing here" in w for w in dense.warnings)
    with pytest.raises(ValueError, match="moe_backend 'cutlass' is not supported"):
        Deployment(moe_backend="cutlass")


def model(backend: str) -> MeasuredCostModel:
    par = MoeParallel(dp=16, expert_parallel=True, all2all=backend)
    return MeasuredCostModel("deepseek-r1", "h200", moe=par, weight_format=R1_FP8)


def test_deepep_runs_the_experts_on_deepgemm_and_the_default_backend_on_nvidias_table():
    step = StepShape(decode_seqs=128, decode_context=128 * 2000)
    for backend in ("deepep_low_latency", "deepep_high_throughput"):
        terms = {t.name: t for t in model(backend).ledger(step).terms}
        assert terms["experts (DeepGEMM)"].source == "published"
        assert "experts: DeepGEMM" in model(backend).name
    gathered = {t.name: t for t in model("allgather_reducescatter").ledger(step).terms}
    assert gathered["experts (fused MoE)"].source == "table"
    # NVIDIA timed vLLM's Triton fused MoE for these experts: several times DeepGEMM's published time
    assert (gathered["experts (fused MoE)"].seconds
            > 3 * {t.name: t for t in model("deepep_low_latency").ledger(step).terms}["experts (DeepGEMM)"].seconds)


def test_under_dual_batch_overlap_deepgemm_runs_on_the_sms_left_to_it():
    # vLLM caps DeepGEMM at the SMs the communication kernels leave (132 - 20 on Hopper): FLOP-bound GEMMs slow
    # by that share, a bandwidth-bound one does not
    dg, share = DeepGemm(1.0), (132 - 20) / 132
    compute_bound, memory_bound = work(4, 1024), work(16, 8)
    assert dg.seconds(compute_bound, share) == pytest.approx(
        (dg.seconds(compute_bound) - dg.seconds(compute_bound, 1e9)) / share + dg.seconds(compute_bound, 1e9))
    assert dg._gemm(memory_bound, GATE_UP, "gate_up", 8, 4096, 7168, share) == \
        dg._gemm(memory_bound, GATE_UP, "gate_up", 8, 4096, 7168)
