"""The memory plan of MoE deployments: experts split by TP or EP over tp x dp GPUs, MXFP4 experts,
sliding-window layers' KV, and the dp / expert-parallel settings vLLM refuses."""

import re

import pytest
from typer.testing import CliRunner

from engine.deployment import Deployment
from planner.catalog import GIB, resolve_model
from planner.catalog.quantization import weight_format
from planner.cli.app import app
from planner.deploy.memory import kv_block_layout, plan_memory
from planner.deploy.plan import plan_deployment
from planner.errors import PlannerError


def test_experts_split_over_every_gpu_by_width_or_whole():
    q = resolve_model("qwen3-30b-a3b")
    whole = q.expert_bytes(2)
    assert q.expert_bytes_per_gpu(1) == whole
    assert q.expert_bytes_per_gpu(2) == pytest.approx(whole / 2, abs=1)
    assert q.expert_bytes_per_gpu(2, 2) == pytest.approx(whole / 4, abs=1)              # TP2 x DP2: width / 4
    assert q.expert_bytes_per_gpu(2, 2, expert_parallel=True) == whole // 4             # 32 of 128 experts
    assert q.expert_bytes_per_gpu(6, 1, expert_parallel=True) == whole * 22 // 128      # uneven: ceil(128 / 6)
    # bf16 Qwen3-30B-A3B: ~57 GiB of weights on one GPU (vLLM logs ~56.9 GiB for its load)
    assert q.weight_bytes_per_gpu(1) / GIB == pytest.approx(56.9, rel=0.01)


def test_attention_replicates_over_dp_while_experts_split():
    q = resolve_model("qwen3-30b-a3b")
    tp2 = q.weight_bytes_per_gpu(2)
    dp2 = q.weight_bytes_per_gpu(1, dp=2, expert_parallel=True)
    # same experts per GPU; the DP replica holds the whole attention, embedding and LM head
    assert dp2 - tp2 == pytest.approx((q.weight_bytes_per_gpu(1) - q.expert_bytes(2)) / 2, rel=0.01)


def test_mxfp4_stores_only_the_experts_in_four_bits():
    g = resolve_model("gpt-oss-120b")
    fmt = weight_format("mxfp4")
    experts = g.expert_bytes(2, fmt)
    assert experts / g.expert_bytes(2) == pytest.approx((0.5 + 1 / 32) / 2, rel=0.01)    # 4.25 bits per weight
    dense = g.weight_bytes_per_gpu(1, 2, fmt) - experts
    assert dense == pytest.approx((g.num_params - g.linear_params + g.dense_linear_params
                                   - g.expert_bias_params) * 2 + g.expert_bias_params * 2 - (
                                       g.expert_bytes(2) - 3 * g.hidden_size * g.moe_intermediate_size * 2
                                       * g.num_experts * g.moe_layers), rel=0.01)
    plan = plan_memory(g, "h100-sxm", weight_format=fmt, max_num_batched_tokens=8192)
    assert 58 < plan.weight_bytes_per_gpu / GIB < 63          # fits one 80 GB H100, as OpenAI says


def test_sliding_window_layers_are_set_aside_and_blocks_hold_full_layers():
    g = resolve_model("gpt-oss-20b")
    block, sliding = kv_block_layout(g, 1, 2, 16, max_num_seqs=256)
    per_layer = 2 * g.num_kv_heads * g.head_size * 2 * 16
    assert block == 12 * per_layer
    assert sliding == 256 * (8 + 1) * 12 * per_layer          # cdiv(127, 16) + 1 blocks per request
    plan = plan_memory(g, "h100-sxm", weight_format=weight_format("mxfp4"), max_num_batched_tokens=8192)
    assert plan.block_bytes_per_gpu == block and plan.sliding_window_bytes_per_gpu == sliding
    dense = resolve_model("llama-3.1-8b")
    assert kv_block_layout(dense, 1, 2, 16, 256) == (2 * 32 * 8 * 128 * 2 * 16, 0)


def test_more_gpus_for_the_experts_leave_more_kv():
    base = dict(model="qwen3-235b-a22b", gpu="h200", policy="vllm-v1", max_model_len=8192)
    tp8 = plan_deployment(Deployment(tp=8, **base))
    tp4dp2 = plan_deployment(Deployment(tp=4, dp=2, enable_expert_parallel=True, **base))
    assert tp8.memory.expert_bytes_per_gpu == tp4dp2.memory.expert_bytes_per_gpu
    assert tp4dp2.memory.weight_bytes_per_gpu > tp8.memory.weight_bytes_per_gpu     # attention at TP4
    assert tp4dp2.moe.ep == 8 and tp4dp2.moe.experts_per_gpu == 16
    assert tp8.moe.moe_tp == 8 and tp8.moe.width_per_gpu == 192
    assert tp4dp2.params()["dp"] == 2


@pytest.mark.parametrize("knobs, match", [
    (dict(model="llama-3.1-8b", enable_expert_parallel=True), "no experts"),
    (dict(model="mixtral-8x7b", tp=8, dp=2, enable_expert_parallel=True), "exceeds"),
    (dict(model="gpt-oss-20b", tp=1, dp=7), "do not split"),
])
def test_parallel_settings_vllm_refuses(knobs, match):
    with pytest.raises(PlannerError, match=match) as info:
        plan_deployment(Deployment(gpu="h100-sxm", max_model_len=4096, policy="vllm-v1", **knobs))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("knobs, refused", [
    # Qwen's block-FP8 releases: an expert's 1536 (768) rows split 8 (4) ways leave 192 per GPU
    (dict(model="Qwen/Qwen3-235B-A22B-FP8", tp=8), "weight = 192 is not divisible by weight quantization block_n"),
    (dict(model="Qwen/Qwen3-235B-A22B-FP8", tp=8, enable_expert_parallel=True), None),     # whole experts
    (dict(model="Qwen/Qwen3-235B-A22B-FP8", tp=4), None),                                   # 384 = 3 blocks
    (dict(model="Qwen/Qwen3-30B-A3B-FP8", tp=2, dp=2), "split 4 ways (tp 2 x dp 2)"),
    (dict(model="Qwen/Qwen3-30B-A3B-FP8", tp=2, dp=2, enable_expert_parallel=True), None),
    (dict(model="MiniMaxAI/MiniMax-M2.5", tp=8), "add --enable-expert-parallel"),
    # vLLM's online FP8 scales per tensor: no blocks to cut
    (dict(model="Qwen/Qwen3-235B-A22B", tp=8, quantization="fp8"), None),
    # a dense MLP's down projection split 16 ways: 25600 / 16 = 1600 rows, 12.5 blocks
    (dict(model="Qwen/Qwen3-32B-FP8", tp=16), "input_size_per_partition = 1600 is not divisible"),
    (dict(model="Qwen/Qwen3-32B-FP8", tp=8), None),
])
def test_block_fp8_checkpoints_load_only_in_whole_blocks(knobs, refused):
    deployment = Deployment(gpu="h200", max_model_len=4096, policy="vllm-v1", **knobs)
    if refused is None:
        assert plan_deployment(deployment).weight_format.method == "fp8"
        return
    with pytest.raises(PlannerError, match=re.escape(refused)) as info:
        plan_deployment(deployment)
    assert "\n" not in str(info.value)


def test_on_blackwell_vllm_pads_a_block_fp8_expert_share_and_the_plan_says_so():
    # FlashInfer's TRTLLM MoE (SM100) loads 192-row shares padded to 256 (vllm#55867); a dense MLP cut past
    # whole blocks is refused on every GPU
    plan = plan_deployment(Deployment(model="Qwen/Qwen3-235B-A22B-FP8", gpu="b200", tp=8, max_model_len=4096,
                                      policy="vllm-v1"))
    assert any("padding each share to 256 rows" in w for w in plan.warnings)
    with pytest.raises(PlannerError, match="split 8 ways"):      # only under pure TP: tp 4 x dp 2 is refused
        plan_deployment(Deployment(model="Qwen/Qwen3-235B-A22B-FP8", gpu="b200", tp=4, dp=2, max_model_len=4096,
                                   policy="vllm-v1"))
    with pytest.raises(PlannerError, match="dense MLP width 25600 over --tp 16"):
        plan_deployment(Deployment(model="Qwen/Qwen3-32B-FP8", gpu="b200", tp=16, max_model_len=4096,
                                   policy="vllm-v1"))


def test_uneven_experts_are_planned_with_a_warning():
    plan = plan_deployment(Deployment(model="qwen3-30b-a3b", gpu="h100-sxm", tp=2, dp=3, enable_expert_parallel=True,
                                      max_model_len=4096, policy="vllm-v1"))
    assert plan.moe.experts_per_gpu == 22 and any("one expert more" in w for w in plan.warnings)


def test_dp_below_one_is_refused():
    with pytest.raises(ValueError, match="dp must be >= 1"):
        Deployment(dp=0)


def test_cli_refuses_in_one_line_with_exit_2():
    result = CliRunner().invoke(app, ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm",
                                      "--enable-expert-parallel", "--requests", "4"])
    assert result.exit_code == 2
    assert "no experts" in result.output and "Traceback" not in result.output


def test_eplb_redundant_experts_take_their_weights_on_every_rank():
    # vLLM's expert-parallel guide: "For DeepSeekV3, this is approximately 2.4 GB for one redundant expert per
    # EP rank" (NUM_MOE_LAYERS x BYTES_PER_EXPERT x (E + R) / EP)
    base = dict(model="deepseek-r1", gpu="h200", dp=16, enable_expert_parallel=True)
    plain = plan_deployment(Deployment(**base))
    one_each = plan_deployment(Deployment(**base, enable_eplb=True, num_redundant_experts=16))
    extra = (one_each.memory.weight_bytes_per_gpu - plain.memory.weight_bytes_per_gpu) / GIB
    assert extra == pytest.approx(2.4, abs=0.05)
    assert one_each.memory.redundant_experts == 16 and one_each.num_gpu_blocks < plain.num_gpu_blocks
    # EPLB alone rebalances, and holds no more
    balanced = plan_deployment(Deployment(**base, enable_eplb=True))
    assert balanced.memory.weight_bytes_per_gpu == plain.memory.weight_bytes_per_gpu


@pytest.mark.parametrize("knobs, message", [
    (dict(enable_eplb=True), "enable_expert_parallel must be True to use EPLB"),
    (dict(num_redundant_experts=4, enable_expert_parallel=True, dp=2), "but EPLB is not enabled"),
    (dict(enable_eplb=True, enable_expert_parallel=True), "EPLB requires tensor_parallel_size or data_parallel_size"),
    (dict(enable_eplb=True, enable_expert_parallel=True, dp=2, num_redundant_experts=-1), "must be >= 0"),
])
def test_eplb_is_refused_as_vllm_refuses_it(knobs, message):
    with pytest.raises(ValueError, match=message):
        Deployment(model="qwen3-30b-a3b", gpu="h100-sxm", **knobs)
