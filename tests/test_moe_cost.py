"""MoE step prices: experts touched per step, the roofline and measured MoE terms, EP dispatch, sliding
windows, and where a calibrated profile or a bad setting is refused."""

import math

import pytest
from typer.testing import CliRunner

from engine.deployment import Deployment
from planner.catalog import resolve_gpu, resolve_model
from planner.catalog.quantization import WeightFormat, weight_format
from planner.cli.app import app
from planner.cost.measured import MeasuredCostModel
from planner.cost.moe import MoeParallel, experts_touched, moe_work, pair_share
from planner.cost.roofline import RooflineCostModel
from planner.cost.select import select_cost_model
from planner.cost.shape import StepShape, context_histogram
from planner.deploy.plan import plan_deployment
from planner.errors import PlannerError


def decode(batch: int, context: int = 1000) -> StepShape:
    contexts = [context] * batch
    return StepShape(decode_seqs=batch, decode_context=sum(contexts), decode_histogram=context_histogram(contexts))


def test_experts_touched_limits():
    assert experts_touched(0, 128, 8) == 0
    assert experts_touched(1, 128, 8) == pytest.approx(8)
    assert experts_touched(10_000, 128, 8) == pytest.approx(128)
    assert experts_touched(8, 128, 8) == pytest.approx(128 * (1 - (1 - 8 / 128) ** 8))
    assert experts_touched(1, 8, 2) == pytest.approx(2)
    # a skewed router touches fewer distinct experts for the same tokens, still k for one token
    assert experts_touched(1, 128, 8, skew=1.2) == pytest.approx(8, rel=1e-9)
    assert experts_touched(32, 128, 8, skew=1.2) < experts_touched(32, 128, 8)
    touched = [experts_touched(t, 128, 8, skew=0.5) for t in (1, 2, 4, 16, 64, 256)]
    assert touched == sorted(touched) and touched[-1] <= 128


def test_ep_rank_holds_its_share_and_the_busiest_carries_more_under_skew():
    q = resolve_model("qwen3-30b-a3b")
    even = moe_work(q, MoeParallel(tp=1, dp=4, expert_parallel=True), tokens=16)
    assert even.tokens == 64 and even.local_experts == 32
    assert even.pairs == pytest.approx(64 * 8 / 4)
    assert even.touched == pytest.approx(32 * (1 - (1 - 8 / 128) ** 64))
    assert pair_share(128, 8, 4, 1.2) > 0.25 and pair_share(128, 8, 4, 0.0) == pytest.approx(0.25)
    width = moe_work(q, MoeParallel(tp=2, dp=2), tokens=16)
    assert width.width == 192 and width.pairs == 32 * 8 and width.local_experts == 128


@pytest.mark.parametrize("model,fmt", [("qwen3-30b-a3b", None), ("gpt-oss-120b", "mxfp4"), ("mixtral-8x7b", None)])
def test_moe_steps_grow_with_tokens(model, fmt):
    wf = weight_format(fmt) if fmt else None
    for cost in (RooflineCostModel(model, "h100-sxm", tp=2, weight_format=wf),
                 MeasuredCostModel(model, "h100-sxm", tp=2, weight_format=wf)):
        times = [cost.step_time(decode(b)) for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
        assert times == sorted(times), cost.name
        prefill = [cost.step_time(StepShape(prefill_seqs=1, prefill_tokens=n, prefill_attn_pairs=n * (n + 1) // 2))
                   for n in (16, 128, 1024, 8192)]
        assert prefill == sorted(prefill), cost.name


def test_roofline_decode_reads_only_touched_experts():
    r = RooflineCostModel("qwen3-30b-a3b", "h100-sxm")
    one, many = r.moe_parts(1), r.moe_parts(512)
    assert one["experts_touched"] == pytest.approx(8) and many["experts_touched"] == pytest.approx(128)
    # memory-bound at one token: about 8/128 of the experts' bytes over the bandwidth
    q = resolve_model("qwen3-30b-a3b")
    expected = q.expert_bytes(2) * 8 / 128 / (r.gpu.memory_bandwidth * r.efficiency.memory)
    assert one["experts"] == pytest.approx(expected, rel=1e-6)
    assert r.breakdown(decode(8))["moe"] > 0 and r.breakdown(decode(8))["moe"] == pytest.approx(r.moe_time(8))


def test_dp_adds_the_dispatch_and_ep_splits_the_experts():
    plain = MeasuredCostModel("qwen3-30b-a3b", "h100-sxm")
    dp2 = MeasuredCostModel("qwen3-30b-a3b", "h100-sxm", moe=MoeParallel(tp=1, dp=2, expert_parallel=True))
    ledger = dp2.ledger(decode(64))
    names = {t.name: t for t in ledger.terms}
    assert "MoE all-gather + reduce-scatter" in names and names["experts (fused MoE)"].source == "table"
    assert "128 tokens" in names["experts (fused MoE)"].detail and "EP2" in names["experts (fused MoE)"].detail
    assert ledger.total == pytest.approx(dp2.step_time(decode(64)))
    assert "MoE all-gather + reduce-scatter" not in {t.name for t in plain.ledger(decode(64)).terms}
    # at a large batch half the experts per GPU beat all of them, even with twice the tokens
    assert dp2.ledger(decode(256)).by_group()["moe"] < plain.ledger(decode(256)).by_group()["moe"] * 1.2
    r_dp2 = RooflineCostModel("qwen3-30b-a3b", "h100-sxm", moe=MoeParallel(tp=1, dp=2, expert_parallel=True))
    assert r_dp2.moe_parts(64)["dispatch"] > 0


def test_skew_interpolates_between_the_measured_distributions():
    balanced = MeasuredCostModel("qwen3-30b-a3b", "h100-sxm", moe=MoeParallel(tp=1, dp=1))
    skewed = MeasuredCostModel("qwen3-30b-a3b", "h100-sxm", moe=MoeParallel(tp=1, dp=1, skew=1.2))
    mid = MeasuredCostModel("qwen3-30b-a3b", "h100-sxm", moe=MoeParallel(tp=1, dp=1, skew=1.01))
    half = MeasuredCostModel("qwen3-30b-a3b", "h100-sxm", moe=MoeParallel(tp=1, dp=1, skew=0.6))
    a, b, c, d = (m._moe.experts(64) for m in (balanced, mid, half, skewed))
    assert c == pytest.approx(a + (b - a) * 0.6 / 1.01)        # linear in the skew between measured ones
    assert d != a
    assert "skew 1.2" in skewed.name


def test_sliding_window_layers_cost_less_at_long_context():
    g = resolve_model("gpt-oss-20b")
    wf = weight_format("mxfp4")
    m = MeasuredCostModel(g, "h100-sxm", weight_format=wf)
    short, long = m.decode_attention(decode(32, 100)), m.decode_attention(decode(32, 16000))
    full_only = MeasuredCostModel(g.__class__(**{**{f: getattr(g, f) for f in g.__dataclass_fields__},
                                                 "sliding_layers": 0}), "h100-sxm", weight_format=wf)
    assert full_only.decode_attention(decode(32, 100)) == pytest.approx(short, rel=1e-9)   # below the window
    assert long < full_only.decode_attention(decode(32, 16000)) * 0.6
    r = RooflineCostModel(g, "h100-sxm", weight_format=wf)
    assert r.prices_each_context
    assert r.breakdown(decode(32, 16000))["decode_attention"] == pytest.approx(
        32 * (16000 * r._decode_per_key + 128 * r._slide_per_key))


def test_measured_refuses_what_nvidia_did_not_time():
    nvfp4 = weight_format("nvfp4")
    with pytest.raises(PlannerError, match="no measured vLLM MoE rows"):
        MeasuredCostModel("qwen3-30b-a3b", "a100", weight_format=nvfp4)   # A100's MoE table is bf16 only
    gpu = resolve_gpu("a100")
    assert select_cost_model(resolve_model("qwen3-30b-a3b"), gpu, weight_format=nvfp4).name.startswith("roofline")
    # Hopper runs NVFP4 experts on vLLM's Marlin MoE, which NVIDIA timed (int4_wo) for Kimi-K2.5's shape only
    hopper = MeasuredCostModel("qwen3-30b-a3b", "h100-sxm", weight_format=nvfp4)
    experts = {t.name: t for t in hopper.ledger(StepShape(decode_seqs=8, decode_context=8 * 512)).terms}
    assert experts["experts (fused MoE)"].source == "scaled" and "int4_wo" in experts["experts (fused MoE)"].detail
    # gpt-oss in bf16: its shape was timed in MXFP4 only, so its experts are the roofline at the efficiency
    # of the bf16 kernel's timed shapes
    bf16 = MeasuredCostModel("gpt-oss-20b", "h100-sxm")
    experts = {t.name: t for t in bf16.ledger(StepShape(decode_seqs=8, decode_context=8 * 512)).terms}
    assert experts["experts (fused MoE)"].source == "scaled" and "bfloat16" in experts["experts (fused MoE)"].detail


def test_calibrated_profile_refuses_dp_and_skew():
    plan = plan_deployment(Deployment(model="qwen3-30b-a3b", gpu="h100-sxm", dp=2, max_model_len=4096,
                                      policy="vllm-v1"))
    with pytest.raises(PlannerError, match="--dp 2"):
        select_cost_model(plan.model, plan.gpu, cost_model="calibrated", moe=plan.moe_parallel)
    assert select_cost_model(plan.model, plan.gpu, moe=plan.moe_parallel).name.startswith("measured")


def test_moe_skew_out_of_range_is_one_line():
    result = CliRunner().invoke(app, ["simulate", "--model", "qwen3-30b-a3b", "--gpu", "h100-sxm",
                                      "--moe-skew", "9", "--requests", "4"])
    assert result.exit_code == 2 and "moe_skew" in result.output and "Traceback" not in result.output


def test_explain_shows_the_moe_terms_with_sources():
    result = CliRunner().invoke(app, ["explain", "--model", "qwen3-30b-a3b", "--gpu", "h100-sxm", "--dp", "2",
                                      "--enable-expert-parallel", "--batch", "16", "--context", "1000", "--json"])
    assert result.exit_code == 0, result.output
    assert "experts (fused MoE)" in result.output and "MoE all-gather + reduce-scatter" in result.output


def test_simulate_dp_runs_one_replica_per_dp_rank():
    from planner import simulate
    run = simulate(Deployment(model="qwen3-30b-a3b", gpu="h100-sxm", dp=2, enable_expert_parallel=True,
                              policy="vllm-v1", max_model_len=4096), workload="sharegpt", rate=8, requests=80)
    doc = run.document()
    # one replica (as the command line counts it) of two engines, each dp rank its own
    assert doc["fleet"]["replicas"] == 1 and doc["fleet"]["engines"] == 2 and doc["params"]["dp"] == 2
    assert doc["num_completed"] == 80 and not math.isnan(doc["tpot_mean"])


def test_uniform_routing_touches_fewer_experts_than_nvidias_balanced_table():
    # NVIDIA's skew-0 table spreads a batch's picks over min(T k, E) experts; independent tokens touch fewer
    m = MeasuredCostModel("qwen3-30b-a3b", "h100-sxm", moe=MoeParallel(tp=1, dp=1))
    curve = m._moe._curves[0.0]
    e, k = 128, 8
    assert m._moe.experts(1) == curve.at(1)[0]                 # one token: its k experts either way
    touched = experts_touched(16, e, k)                        # balanced: all 128
    assert 80 < touched < 83
    assert m._moe.experts(16) == pytest.approx(curve.at(touched / k)[0])
    assert m._moe.experts(16) < 0.8 * curve.at(16)[0]
    # past T k = E the difference is the first stretch's, and it fades once every expert is touched
    assert curve.at(32)[0] - m._moe.experts(32) == pytest.approx(curve.at(16)[0] - curve.at(experts_touched(32, e, k) / k)[0])
    assert m._moe.experts(4096) == curve.at(4096)[0]
    steps = [m._moe.experts(t) for t in (1, 2, 4, 8, 16, 32, 64, 128, 512, 4096)]
    assert steps == sorted(steps)                               # still grows with the batch


def test_each_split_reads_its_own_kernels_rows_and_minimax_all_reduces_its_qk_norms():
    fp8_block = WeightFormat("fp8", "fp8-block")
    ep = MeasuredCostModel("minimax-m2.5", "h100-sxm", tp=4, weight_format=fp8_block,
                           moe=MoeParallel(tp=4, expert_parallel=True))
    width = MeasuredCostModel("minimax-m2.5", "h100-sxm", tp=4, weight_format=fp8_block, moe=MoeParallel(tp=4))
    by_ep, by_width = ({t.name: t for t in m.ledger(decode(16)).terms} for m in (ep, width))
    # on Hopper vLLM runs block FP8 experts with Triton split by width and FlashInfer CUTLASS under EP: NVIDIA
    # timed each split with its own kernel, and each deployment reads its split's rows
    assert "EP4" in by_ep["experts (fused MoE)"].detail and "moe_tp 4" in by_width["experts (fused MoE)"].detail
    assert by_ep["experts (fused MoE)"].seconds != by_width["experts (fused MoE)"].seconds
    assert by_ep["experts (fused MoE)"].seconds == pytest.approx(by_width["experts (fused MoE)"].seconds, rel=0.25)
    # q/k RMSNorm over all heads: one more all-reduce per layer under TP, at the table's latency floor
    qk = by_ep["q/k-norm all-reduce"]
    assert qk.count == 62 and qk.seconds == pytest.approx(62 * ep.qk_norm_allreduce(16, True))
    assert 0 < qk.seconds < by_ep["all-reduce"].seconds
    one_gpu = MeasuredCostModel("minimax-m2.5", "h100-sxm", tp=1, weight_format=fp8_block)
    assert "q/k-norm all-reduce" not in {t.name for t in one_gpu.ledger(decode(16)).terms}


def test_minimax_checkpoint_is_block_fp8_and_its_experts_split_by_ep():
    plan = plan_deployment(Deployment(model="MiniMaxAI/MiniMax-M2.5", gpu="h100-sxm", tp=4,
                                      enable_expert_parallel=True, max_model_len=9416, policy="vllm-v1"))
    assert (plan.weight_format.method, plan.weight_format.scheme) == ("fp8", "fp8-block")
    assert (plan.moe.ep, plan.moe.experts_per_gpu) == (4, 64)
    # 229B parameters in FP8 over 4 GPUs: about 57 GB each, the KV cache in what is left of 0.9 x 80 GiB
    assert plan.memory.weight_bytes_per_gpu == pytest.approx(resolve_model("minimax-m2.5").num_params / 4, rel=0.02)
    assert plan.num_gpu_blocks > 10_000
    # a variant id that names its own format is that checkpoint, not the catalog's FP8 release
    nvfp4 = plan_deployment(Deployment(model="nvidia/MiniMax-M2.5-NVFP4", gpu="b200", tp=2, max_model_len=9416,
                                       policy="vllm-v1"))
    assert (nvfp4.model.name, nvfp4.weight_format.method) == ("minimax-m2.5", "nvfp4")
