"""Deployments over more than one 8-GPU node: TP all-reduces and MoE dispatches priced through the NICs."""
import pytest
from typer.testing import CliRunner

from engine.deployment import Deployment
from planner.cli.app import app
from planner.cost.measured import MeasuredCostModel
from planner.cost.moe import MoeParallel
from planner.cost.nodes import NodeSpan
from planner.cost.roofline import RooflineCostModel
from planner.cost.shape import StepShape, context_histogram
from planner.deploy.plan import plan_deployment


@pytest.mark.parametrize("ranks, gpus, nodes, per_node", [
    (8, 8, None, None),          # TP 8: one node
    (16, 16, 2, 8),              # TP 16
    (32, 32, 4, 8),
    (16, 16, 2, 8),              # a dp 16 dispatch at TP 1
    (2, 16, 2, 1),               # TP 8 x DP 2: each dp group has one rank on each node
    (4, 16, 2, 2),               # TP 4 x DP 4
    (4, 8, None, None),          # TP 2 x DP 4: one node
])
def test_a_group_spans_the_nodes_its_ranks_sit_on(ranks, gpus, nodes, per_node):
    span = NodeSpan.of(ranks, gpus)
    if nodes is None:
        assert span is None
    else:
        assert (span.nodes, span.per_node) == (nodes, per_node)


def test_nccl_tuning_model_sets_the_network_latency():
    # NCCL src/graph/tuning.cc, tree LL: 2 x ((8 - 1) x 0.6 us x (1.8 - 1) + log2(2) x 5.0 us) = 16.72 us
    assert NodeSpan.of(16, 16).extra_latency() == pytest.approx(16.72e-6)
    assert NodeSpan.of(32, 32).extra_latency() == pytest.approx(26.72e-6)


def test_the_slower_of_the_node_and_its_nics_sets_the_pace():
    span = NodeSpan.of(16, 16)
    small, large = 64 * 1024, 256 * 2**20
    nic = 2 * 15 / 16 * large / 8 / 50e9            # each of a node's 8 NICs carries its share of the ring
    assert span.nic_seconds(large) == pytest.approx(nic)
    assert span.allreduce(20e-6, small) == pytest.approx(20e-6 + span.extra_latency())
    assert span.allreduce(1e-4, large) == pytest.approx(nic + span.extra_latency())


def decode(seqs: int, context: int) -> StepShape:
    return StepShape(decode_seqs=seqs, decode_context=seqs * context,
                     decode_histogram=context_histogram([context] * seqs))


def allreduce_term(model, shape):
    return next(t for t in model.ledger(shape).terms if t.name == "all-reduce")


def test_measured_tp16_runs_nccl_across_two_nodes():
    one_node = MeasuredCostModel("llama-3.1-405b", "h100-sxm", tp=8)
    two_nodes = MeasuredCostModel("llama-3.1-405b", "h100-sxm", tp=16)
    assert one_node.allreduce_backend == "vllm custom all-reduce"
    assert two_nodes.allreduce_backend == "nccl over 2 nodes"
    shape = decode(32, 2000)
    inside, across = allreduce_term(one_node, shape), allreduce_term(two_nodes, shape)
    assert "2 nodes x 8 GPUs" in across.detail
    # per call: the node's NCCL all-reduce of the same message plus NCCL's network latency
    values = 32 * 16384
    nccl8 = MeasuredCostModel("llama-3.1-405b", "h100-sxm", tp=8)._nccl.at(values)[0]
    assert across.seconds / across.count == pytest.approx(nccl8 + 16.72e-6)
    assert across.seconds > 2 * inside.seconds             # custom all-reduce inside a node is far cheaper
    # the whole step: the weights halve per GPU, the collectives grow
    assert two_nodes.step_time(shape) < one_node.step_time(shape)


def test_measured_prices_a_dp16_moe_over_two_nodes():
    par = MoeParallel(tp=1, dp=16, expert_parallel=True)
    model = MeasuredCostModel("qwen3-235b-a22b", "h200", moe=par)
    shape = decode(32, 2000)
    dispatch = next(t for t in model.ledger(shape).terms if t.name == "MoE all-gather + reduce-scatter")
    assert "2 nodes x 8 GPUs" in dispatch.detail
    inside = MeasuredCostModel("qwen3-235b-a22b", "h200", moe=MoeParallel(tp=1, dp=8, expert_parallel=True))
    per_layer = dispatch.seconds / model.model.moe_layers
    assert per_layer > inside._moe.dispatch(32) + 16.7e-6


def test_tp8_dp2_dispatch_has_one_rank_per_node():
    model = MeasuredCostModel("qwen3-235b-a22b", "h200", tp=8,
                              moe=MoeParallel(tp=8, dp=2, expert_parallel=True))
    gathered_bytes = 2 * 32 * model.model.hidden_size * 2
    expected = max(6.8e-6, gathered_bytes / 50e9) + 10e-6      # NCCL's base latency, the NIC, one hop each way
    assert model._moe.dispatch(32) == pytest.approx(expected)


def test_roofline_adds_the_network_to_each_collective():
    shape = decode(32, 2000)
    eight = RooflineCostModel("llama-3.1-405b", "h100-sxm", tp=8).breakdown(shape)["allreduce"]
    sixteen = RooflineCostModel("llama-3.1-405b", "h100-sxm", tp=16).breakdown(shape)["allreduce"]
    collectives = 2 * 126 + 1 + 1                              # two per layer, the embedding's, the logits'
    assert sixteen - eight >= collectives * 16.7e-6


@pytest.mark.parametrize("deployment, warned", [
    (dict(model="llama-3.1-405b", tp=16), "--tp 16's all-reduces"),
    (dict(model="qwen3-235b-a22b", dp=16, enable_expert_parallel=True), "the MoE dispatch over the dp ranks"),
    (dict(model="llama-3.1-405b", tp=8, pp=2), "the hidden states between pipeline stages"),
    (dict(model="llama-3.1-70b", tp=4, dp=4), None),            # dense dp ranks share no collective
    (dict(model="llama-3.1-70b", tp=4, pp=2), None),
    (dict(model="llama-3.1-405b", tp=8), None),
])
def test_the_plan_says_which_collectives_cross_nodes(deployment, warned):
    plan = plan_deployment(Deployment(gpu="h200", max_model_len=4096, **deployment))
    crossing = [w for w in plan.warnings if "GB/s per GPU" in w]
    if warned is None:
        assert not crossing
    else:
        assert len(crossing) == 1 and warned in crossing[0] and "2 8-GPU nodes" in crossing[0]


def test_explain_prices_deepseek_over_two_nodes():
    result = CliRunner().invoke(app, ["explain", "--model", "deepseek-r1", "--gpu", "h200", "--dp", "16",
                                      "--enable-expert-parallel", "--batch", "32", "--context", "2000"])
    assert result.exit_code == 0, result.output
    assert "measured(" in result.output and "MoE all-gather + reduce-scatter" in result.output


def test_ethernet_between_nodes_slows_what_crosses_them():
    shape = decode(256, 2000)
    ib = MeasuredCostModel("llama-3.1-405b", "h100-sxm", tp=16)
    eth = MeasuredCostModel("llama-3.1-405b", "h100-sxm", tp=16, node_link="ethernet")
    assert allreduce_term(eth, shape).seconds > allreduce_term(ib, shape).seconds
    inside = MeasuredCostModel("llama-3.1-70b", "h100-sxm", tp=8, node_link="ethernet")
    assert inside.step_time(shape) == MeasuredCostModel("llama-3.1-70b", "h100-sxm", tp=8).step_time(shape)
    plan = plan_deployment(Deployment(model="llama-3.1-405b", gpu="h200", tp=16, node_link="ethernet",
                                      max_model_len=4096))
    assert any("(ethernet, 12.5 GB/s per GPU)" in w for w in plan.warnings)


@pytest.mark.parametrize("link, message", [("nvlink", "joins the gpus of one node"), ("carrier-pigeon", "unknown")])
def test_a_node_link_that_does_not_join_nodes_is_one_line(link, message):
    result = CliRunner().invoke(app, ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--node-link", link,
                                      "--requests", "4"])
    assert result.exit_code == 2 and message in result.output.lower() and "Traceback" not in result.output
