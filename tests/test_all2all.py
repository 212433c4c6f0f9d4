"""--all2all-backend: vLLM's DeepEP dispatch and combine, priced from DeepEP's published rates."""
import json
import math

import pytest
from typer.testing import CliRunner

from engine.deployment import Deployment
from planner.cli.app import app
from planner.catalog import resolve_model
from planner.cost.all2all import LOW_LATENCY, DeepEp, _at, distinct_groups
from planner.cost.measured import MeasuredCostModel
from planner.cost.moe import MoeParallel
from planner.cost.roofline import RooflineCostModel
from planner.cost.shape import StepShape, context_histogram
from planner.deploy.memory import activation_reserve_bytes
from planner.deploy.plan import plan_deployment
from planner.errors import PlannerError

R1_FP8 = plan_deployment(Deployment(model="deepseek-r1", gpu="h200", dp=16, enable_expert_parallel=True)).weight_format


def measured(dp: int, backend: str, link: str = "infiniband", tp: int = 1) -> MeasuredCostModel:
    par = MoeParallel(tp=tp, dp=dp, expert_parallel=True, all2all=backend)
    return MeasuredCostModel("deepseek-r1", "h200", tp=tp, moe=par, weight_format=R1_FP8, node_link=link)


def decode(seqs: int, context: int) -> StepShape:
    return StepShape(decode_seqs=seqs, decode_context=seqs * context,
                     decode_histogram=context_histogram([context] * seqs))


def test_the_readme_rates_are_its_bytes_over_its_times():
    # DeepEP README, low-latency kernels at EP 8: 128 tokens x top-8 x 7168 values, FP8 with a float32 scale
    # per 128 values, in 77 us; the bf16 combine in 114 us
    dispatch, combine = _at(LOW_LATENCY, 8)
    assert 128 * 8 * 7168 * (1 + 4 / 128) / dispatch == pytest.approx(77e-6, rel=0.02)
    assert 128 * 8 * 7168 * 2 / combine == pytest.approx(114e-6, rel=0.02)


def test_rates_between_measured_sizes_follow_log2_ep():
    low, high = _at(LOW_LATENCY, 16), _at(LOW_LATENCY, 32)
    middle = _at(LOW_LATENCY, 22)
    w = math.log2(22 / 16)                      # the share of the way from EP 16 to EP 32
    assert middle[0] == pytest.approx(low[0] + (high[0] - low[0]) * w)
    assert _at(LOW_LATENCY, 4) == _at(LOW_LATENCY, 8)          # below the table: its first size
    assert _at(LOW_LATENCY, 1024) == _at(LOW_LATENCY, 256)


@pytest.mark.parametrize("experts, k, groups, expected", [
    (256, 8, 256, 8.0),         # one expert per GPU: every pick its own GPU
    (256, 8, 1, 1.0),           # one group holds them all
    (256, 1, 16, 1.0),
    (8, 8, 2, 2.0),             # every expert picked: both groups
])
def test_distinct_groups(experts, k, groups, expected):
    assert distinct_groups(experts, k, groups) == pytest.approx(expected)


def test_distinct_groups_grow_with_the_groups():
    counts = [distinct_groups(256, 8, g) for g in (1, 2, 4, 8, 16, 32, 64)]
    assert counts == sorted(counts) and counts[-1] < 8


def test_low_latency_sends_remote_copies_at_the_published_rate():
    deepep = measured(16, "deepep_low_latency")._moe.deepep
    copies = 128 * 8 * 7168
    remote = copies / 2                         # EP 16 over two nodes: half of the experts on the other
    expected = remote * (1 + 4 / 128) / 63e9 + remote * 2 / 74e9
    assert deepep.seconds(128) == pytest.approx(expected)


def test_low_latency_dispatches_in_chunks_of_256_tokens():
    deepep = measured(16, "deepep_low_latency")._moe.deepep
    assert deepep.seconds(512) == pytest.approx(2 * deepep.seconds(256))
    assert deepep.seconds(300) == pytest.approx(deepep.seconds(256) + deepep.seconds(44))


def test_a_call_costs_at_least_a_launch_and_a_hop():
    one_node, two_nodes = measured(8, "deepep_low_latency")._moe.deepep, measured(16, "deepep_low_latency")._moe.deepep
    assert one_node.seconds(1) == pytest.approx(2 * (6.8e-6 + 0.6e-6))       # dispatch and combine
    assert two_nodes.seconds(1) == pytest.approx(2 * (6.8e-6 + 5.0e-6))


def test_high_throughput_in_one_node_is_nvlink_bound():
    deepep = measured(8, "deepep_high_throughput")._moe.deepep
    ranks = distinct_groups(256, 8, 8)
    token_bytes = 4096 * 7168
    expected = token_bytes * ranks * (1 + 4 / 128) / (153 / 200 * 450e9) + token_bytes * ranks * 2 / (158 / 200 * 450e9)
    assert deepep.seconds(4096) == pytest.approx(expected)


def test_tp_ranks_split_a_replicas_tokens():
    tp2 = measured(8, "deepep_low_latency", tp=2)._moe.deepep
    tp1 = measured(16, "deepep_low_latency")._moe.deepep
    assert tp2.seconds(256) == pytest.approx(tp1.seconds(128))      # the same EP 16, each rank half the tokens


def test_the_node_link_scales_the_network_rates():
    ib = measured(32, "deepep_low_latency")._moe.deepep
    eth = measured(32, "deepep_low_latency", link="ethernet")._moe.deepep
    assert eth.network[0] == pytest.approx(ib.network[0] / 4)
    assert eth.seconds(128) > 3 * ib.seconds(128)


def test_deepep_wins_where_vllm_recommends_it():
    # small decode batches over several nodes: DeepEP's direct sends beat NCCL's gathers of every replica's tokens
    for dp in (16, 32, 64):
        gathered, deepep = measured(dp, "allgather_reducescatter")._moe, measured(dp, "deepep_low_latency")._moe
        assert deepep.dispatch(8) < gathered.dispatch(8) / 2
    # and wide EP at a full decode batch, where the gathered bytes grow with dp and DeepEP's do not
    wide = measured(64, "deepep_low_latency")._moe
    assert wide.dispatch(128) < measured(64, "allgather_reducescatter")._moe.dispatch(128)


def test_the_ledger_names_deepep_as_published():
    model = measured(16, "deepep_low_latency")
    terms = {t.name: t for t in model.ledger(decode(32, 2000)).terms}
    assert "MoE all-gather + reduce-scatter" not in terms
    term = terms["MoE dispatch + combine (DeepEP)"]
    assert term.source == "published" and "EP16 over 2 nodes" in term.detail
    assert term.seconds == pytest.approx(58 * model._moe.deepep.seconds(32))
    assert "deepep_low_latency" in model.name


def test_the_roofline_prices_the_same_dispatch():
    par = MoeParallel(tp=1, dp=16, expert_parallel=True, all2all="deepep_high_throughput")
    roofline = RooflineCostModel("deepseek-r1", "h200", moe=par, weight_format=R1_FP8)
    assert roofline.moe_parts(64)["dispatch"] == pytest.approx(58 * measured(16, "deepep_high_throughput")
                                                               ._moe.deepep.seconds(64))
    assert "deepep_high_throughput" in roofline.name


def test_the_default_backend_prices_nccl_as_before():
    model = measured(16, "allgather_reducescatter")
    assert model._moe.deepep is None
    par = MoeParallel(tp=1, dp=1, expert_parallel=True, all2all="deepep_low_latency")
    assert DeepEp.of(model.model, par, model.gpu, R1_FP8, 2, "infiniband") is None      # dp 1: no all2all


def test_a_backend_that_moves_nothing_is_a_warning():
    plan = plan_deployment(Deployment(model="qwen3-30b-a3b", gpu="h100-sxm", all2all_backend="deepep_low_latency"))
    assert any("changes nothing here" in w for w in plan.warnings)
    dense = plan_deployment(Deployment(model="llama-3.1-8b", gpu="h100-sxm", dp=2,
                                       all2all_backend="deepep_low_latency"))
    assert any("changes nothing here" in w for w in dense.warnings)


def test_deepep_needs_nvlink():
    with pytest.raises(PlannerError, match="DeepEP needs NVLink between a node's GPUs; l40s has pcie4"):
        plan_deployment(Deployment(model="qwen3-30b-a3b", gpu="l40s", dp=2, enable_expert_parallel=True,
                                   all2all_backend="deepep_low_latency"))


def test_deepep_across_nodes_is_not_warned_as_nccl():
    plan = plan_deployment(Deployment(model="deepseek-r1", gpu="h200", dp=16, enable_expert_parallel=True,
                                      all2all_backend="deepep_low_latency"))
    assert not any("MoE dispatch" in w for w in plan.warnings)


def test_an_unknown_backend_is_one_line(tmp_path):
    result = CliRunner().invoke(app, ["simulate", "--model", "qwen3-30b-a3b", "--gpu", "h100-sxm",
                                      "--all2all-backend", "deepep", "--requests", "4"])
    assert result.exit_code != 0
    assert "all2all_backend 'deepep' is not supported" in result.output and "Traceback" not in result.output


def test_simulate_records_the_backend(tmp_path):
    result = CliRunner().invoke(app, ["simulate", "--model", "deepseek-r1", "--gpu", "h200", "--dp", "16",
                                      "--enable-expert-parallel", "--all2all-backend", "deepep_low_latency",
                                      "--concurrency", "64", "--requests", "64", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["params"]["all2all_backend"] == "deepep_low_latency"
    assert saved["deployment"]["all2all_backend"] == "deepep_low_latency"
    assert "DeepEP dispatch and combine" in " ".join(saved["not_modelled"])


def moe_activations(dp: int, backend: str = "allgather_reducescatter", tokens: int = 8192) -> int:
    return activation_reserve_bytes(resolve_model("deepseek-r1"), 1, 2, tokens, 256, dp, True, backend)


def test_the_fused_moe_caches_hold_one_chunk_of_gathered_tokens():
    # past 16,384 gathered tokens (vLLM's VLLM_FUSED_MOE_CHUNK_SIZE) only the gathered hidden states and
    # router logits grow: 2 x 7168 + 256 values a token, 2 bytes each
    per_token = (2 * 7168 + 256) * 2
    assert moe_activations(8) - moe_activations(4) == 8192 * 4 * per_token
    assert moe_activations(2) - moe_activations(1) > 8192 * per_token          # below the chunk the caches grow too


def test_deepep_gathers_nothing():
    gathered = moe_activations(32)
    assert moe_activations(32, "deepep_high_throughput") < gathered / 4
    # the low-latency kernels' masked buffer: 8 local experts x 256 tokens from each of 32 ranks
    low_latency = moe_activations(32, "deepep_low_latency")
    assert moe_activations(64, "deepep_low_latency") == pytest.approx(low_latency, rel=0.01)     # 4 x 64 = 8 x 32
    assert low_latency < gathered / 2


def test_dp64_fits_on_h200_as_vllm_runs_it():
    for backend in ("allgather_reducescatter", "deepep_low_latency", "deepep_high_throughput"):
        plan = plan_deployment(Deployment(model="deepseek-r1", gpu="h200", dp=64, enable_expert_parallel=True,
                                          all2all_backend=backend))
        assert plan.num_gpu_blocks > 0


def test_high_throughput_runs_every_step_eagerly():
    # vLLM turns CUDA graphs off for deepep_high_throughput with dp > 1: a decode batch of 9 is not padded to 16
    assert measured(16, "deepep_high_throughput").graphs.padded(9) == 9
    assert measured(16, "deepep_low_latency").graphs.padded(9) == 16
