"""--enable-dbo: vLLM's dual-batch overlap, a large step as two microbatches whose all-to-all hides under compute."""
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from engine.deployment import Deployment
from planner import simulate
from planner.cli.app import app
from planner.cost.dbo import DualBatch
from planner.cost.measured import MeasuredCostModel
from planner.cost.moe import MoeParallel
from planner.cost.roofline import RooflineCostModel
from planner.cost.shape import StepShape, context_histogram
from planner.deploy.plan import plan_deployment

R1_FP8 = plan_deployment(Deployment(model="deepseek-r1", gpu="h200", dp=16, enable_expert_parallel=True)).weight_format


def parallel(dp: int = 16, dbo: DualBatch | None = DualBatch(), backend: str = "deepep_low_latency") -> MoeParallel:
    return MoeParallel(dp=dp, expert_parallel=True, all2all=backend, dbo=dbo)


def measured(dbo: DualBatch | None = DualBatch(), **kwargs) -> MeasuredCostModel:
    return MeasuredCostModel("deepseek-r1", "h200", moe=parallel(dbo=dbo), weight_format=R1_FP8, max_num_seqs=1024,
                             **kwargs)


SPLIT = measured()


def decode(seqs: int, context: int = 2000) -> StepShape:
    return StepShape(decode_seqs=seqs, decode_context=seqs * context,
                     decode_histogram=context_histogram([context] * seqs))


def test_vllm_refuses_dbo_without_deepep():
    with pytest.raises(ValueError, match="only supports the deepep_low_latency and deepep_high_throughput"):
        Deployment(model="deepseek-r1", enable_dbo=True)
    Deployment(model="deepseek-r1", enable_dbo=True, all2all_backend="deepep_high_throughput")
    with pytest.raises(ValueError, match="dbo_decode_token_threshold must be >= 1"):
        Deployment(dbo_decode_token_threshold=0)


def test_the_refusal_is_one_line_on_the_command_line():
    result = CliRunner().invoke(app, ["simulate", "--model", "deepseek-r1", "--gpu", "h200", "--dp", "16",
                                      "--enable-expert-parallel", "--enable-dbo", "--requests", "4"])
    assert result.exit_code != 0
    assert "--all2all-backend deepep_low_latency" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("tokens, seqs, decode_only, splits", [
    (31, 31, True, False), (32, 32, True, True),        # a decode from 32 tokens (vLLM's default)
    (511, 4, False, False), (512, 4, False, True),      # any other step from 512
    (4096, 1, False, False),                            # one request is never split
])
def test_when_vllm_splits_a_step(tokens, seqs, decode_only, splits):
    assert DualBatch().splits(tokens, seqs, decode_only) is splits


def test_the_halves_split_the_padded_count_at_its_middle():
    assert DualBatch.halves(256) == (128, 128)
    assert DualBatch.halves(9) == (4, 5)


def test_the_overlap_is_max_plus_the_ends_min():
    # 58 layers, each microbatch's compute (1 ms in all) and all-to-all (3 ms in all) on two streams
    assert DualBatch.overlapped(1.0, 3.0, 58) == pytest.approx(3.0 + 1.0 / 116)
    assert DualBatch.overlapped(3.0, 1.0, 58) == DualBatch.overlapped(1.0, 3.0, 58)


def test_dbo_is_priced_only_where_deepep_dispatches():
    assert parallel().dual_batch == DualBatch()
    assert parallel(dp=1).dual_batch is None                    # no all2all: nothing to hide
    plan = plan_deployment(Deployment(model="qwen3-30b-a3b", gpu="h100-sxm", enable_dbo=True,
                                      all2all_backend="deepep_low_latency"))
    assert any("--enable-dbo change nothing here" in w for w in plan.warnings)


def test_a_step_below_the_threshold_is_priced_as_without_dbo():
    split, whole = measured(), measured(dbo=None)
    assert split.step_time(decode(31)) == whole.step_time(decode(31))
    assert split.step_time(decode(256)) != whole.step_time(decode(256))


def test_each_microbatch_is_priced_at_its_own_tokens():
    split, whole = measured(), measured(dbo=None)
    terms = {t.name: t for t in split.ledger(decode(256)).terms}
    half = {t.name: t for t in whole.ledger(decode(128)).terms}
    for name in ("experts (DeepGEMM)", "MoE dispatch + combine (DeepEP)", "shared expert gate+up GEMM"):
        assert terms[name].seconds == pytest.approx(2 * half[name].seconds)
    # attention and the logits run on the whole batch
    unsplit = {t.name: t for t in whole.ledger(decode(256)).terms}
    assert terms["attention (decode)"].seconds == unsplit["attention (decode)"].seconds
    assert terms["LM head GEMM"].detail.endswith("m=256 n=129280 k=7168")


def test_the_ledger_shows_what_the_overlap_hides_and_sums_to_the_step():
    model = measured()
    ledger = model.ledger(decode(256))
    overlap = next(t for t in ledger.terms if t.name == "dual-batch overlap")
    assert overlap.source == "schedule" and overlap.seconds < 0
    comm = next(t for t in ledger.terms if t.name == "MoE dispatch + combine (DeepEP)").seconds
    assert -overlap.seconds <= comm                     # it hides at most the all-to-all
    assert ledger.total == pytest.approx(model.step_time(decode(256)), rel=1e-12)
    assert "dual-batch overlap" in model.name


def test_the_decode_batch_prices_split_steps_as_step_time_does():
    model = measured(async_scheduling=True)
    for seqs in (16, 64, 300):
        contexts = [1000 + 37 * i for i in range(seqs)]
        shape = StepShape(decode_seqs=seqs, decode_context=sum(contexts), decode_histogram=context_histogram(contexts))
        hist = shape.decode_histogram
        triples = list(zip(hist[0::3], hist[1::3], hist[2::3]))
        assert model.decode_pricer(seqs)(triples) == model.step_time(shape)
        low = triples[0][0]
        width = triples[-1][0] - low + 1
        counts, sums = np.zeros((1, width)), np.zeros((1, width))
        for k, n, keys in triples:
            counts[0, k - low], sums[0, k - low] = n, keys
        assert model.decode_step_times(seqs, low, counts, sums)[0] == model.step_time(shape)


def test_dbo_pays_where_the_all_to_all_is_large_and_costs_where_it_is_not():
    # a full decode batch over 2 nodes: the all-to-all hidden outweighs the experts' weights read twice
    split, whole = measured(), measured(dbo=None)
    assert split.step_time(decode(512)) < 0.9 * whole.step_time(decode(512))
    # a small one: each microbatch reads the touched experts again, which the little all-to-all cannot repay
    assert split.step_time(decode(64)) > whole.step_time(decode(64))


def test_the_roofline_splits_alike_and_its_breakdown_sums_to_the_step():
    roofline = RooflineCostModel("deepseek-r1", "h200", moe=parallel(), weight_format=R1_FP8)
    whole = RooflineCostModel("deepseek-r1", "h200", moe=parallel(dbo=None), weight_format=R1_FP8)
    parts = roofline.breakdown(decode(512))
    assert parts["dual_batch_overlap"] < 0
    assert roofline.step_time(decode(512)) == pytest.approx(sum(v for k, v in parts.items() if k != "bound"))
    assert roofline.step_time(decode(16)) == whole.step_time(decode(16))
    assert whole.breakdown(decode(512))["dual_batch_overlap"] == 0.0


def test_a_run_with_dbo_is_the_same_with_and_without_fast_forward():
    deployment = Deployment(model="qwen3-30b-a3b", gpu="h100-sxm", dp=2, enable_expert_parallel=True,
                            all2all_backend="deepep_low_latency", enable_dbo=True)
    runs = [simulate(deployment, workload="random", params={"input_len": 600, "output_len": 120},
                     concurrency=96, requests=192, step_by_step=step).metrics for step in (False, True)]
    assert runs[0] == runs[1]


def test_the_dp_ranks_split_together_or_not_at_all():
    """vLLM's vote (dp_utils._post_process_ubatch): every busy rank past its threshold, no rank on a dummy
    batch, and the fewest tokens past the middle of the largest padded count."""
    dbo = DualBatch()
    decode = [(64, 64, True, 64), (40, 40, True, 48)]
    assert dbo.agreed(decode, idle=False)
    assert not dbo.agreed(decode, idle=True)                              # a dummy batch's one token says no
    assert not dbo.agreed(decode + [(31, 31, True, 32)], idle=False)       # below the decode threshold
    assert not dbo.agreed([(40, 40, True, 40), (96, 96, True, 96)], idle=False)   # 40 <= 96 // 2: all padding
    assert dbo.agreed([(600, 3, False, 608), (512, 2, False, 512)], idle=False)
    assert not dbo.agreed([(600, 3, False, 608), (511, 2, False, 512)], idle=False)


DP2 = dict(model="qwen3-30b-a3b", gpu="h100-sxm", dp=2, enable_expert_parallel=True,
           all2all_backend="deepep_low_latency")


def run_dp2(concurrency: int, step_by_step: bool = False, cost_model: str | None = None, **deployment):
    return simulate(Deployment(**DP2, **deployment), workload="random", concurrency=concurrency, requests=24,
                    params={"input_len": 64, "output_len": 40, "range_ratio": 0.5}, step_by_step=step_by_step,
                    cost_model=cost_model).metrics


def test_ranks_that_never_all_reach_the_threshold_run_as_without_dbo():
    """Three clients over two ranks: one rank holds two sequences at most while the other holds one or none, so
    the vote never passes, though the busier rank alone would split every decode step."""
    split = dict(enable_dbo=True, dbo_decode_token_threshold=2, dbo_prefill_token_threshold=2)
    assert DualBatch(2, 2).splits(2, 2, True)
    assert run_dp2(3, **split) == run_dp2(3)
    assert run_dp2(3, step_by_step=True, **split) == run_dp2(3)
    # With four clients both ranks hold two at times: those steps split, and the run changes.
    assert run_dp2(4, **split) != run_dp2(4)
    assert run_dp2(4, **split) == run_dp2(4, step_by_step=True, **split)
    # The roofline model (no priced runs: its plans' steps are re-priced shape by shape) votes the same way.
    assert run_dp2(3, cost_model="roofline", **split) == run_dp2(3, cost_model="roofline")
    assert run_dp2(4, cost_model="roofline", **split) != run_dp2(4, cost_model="roofline")


def test_simulate_records_dbo_and_a_pool_may_set_it(tmp_path):
    result = CliRunner().invoke(app, ["simulate", "--model", "deepseek-r1", "--gpu", "h200", "--dp", "16",
                                      "--enable-expert-parallel", "--all2all-backend", "deepep_low_latency",
                                      "--enable-dbo", "--dbo-decode-token-threshold", "64", "--concurrency", "64",
                                      "--requests", "64", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["params"]["enable_dbo"] is True and saved["params"]["dbo_decode_token_threshold"] == 64
    assert saved["deployment"]["dbo_prefill_token_threshold"] == 512
    assert any("dual-batch overlap" in note for note in saved["not_modelled"])
    pd = CliRunner().invoke(app, ["simulate", "--model", "deepseek-r1", "--gpu", "h200", "--dp", "16",
                                  "--enable-expert-parallel", "--pd", "1:1", "--decode-set",
                                  "all2all_backend=deepep_low_latency", "--decode-set", "enable_dbo=true",
                                  "--concurrency", "32", "--requests", "32", "--out", str(tmp_path / "pd")])
    assert pd.exit_code == 0, pd.output
    pools = json.loads((tmp_path / "pd" / "result.json").read_text())["pd"]
    assert pools["decode"]["deployment"]["enable_dbo"] is True
    assert pools["prefill"]["deployment"]["enable_dbo"] is False


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 1.0), st.floats(0, 1.0), st.integers(1, 128))
def test_the_overlap_never_beats_the_busier_stream_nor_loses_to_no_overlap(compute, comm, layers):
    overlapped = DualBatch.overlapped(compute, comm, layers)
    assert max(compute, comm) <= overlapped <= compute + comm + 1e-15
    # more layers hide more: the ends that nothing overlaps are one layer's share
    assert DualBatch.overlapped(compute, comm, layers + 1) <= overlapped


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 600), st.integers(200, 4000))
def test_a_split_decode_step_costs_at_least_its_halves_compute_and_at_most_no_overlap(seqs, context):
    split = SPLIT
    shape = decode(seqs, context)
    ledger = split.ledger(shape)
    assert ledger.total == pytest.approx(split.step_time(shape), rel=1e-9)
    hidden = sum(t.seconds for t in ledger.terms if t.name == "dual-batch overlap")
    assert hidden <= 0.0
    comm = sum(t.seconds for t in ledger.terms if t.name == "MoE dispatch + combine (DeepEP)")
    assert -hidden <= comm + 1e-12                      # it hides no more than the all-to-all
