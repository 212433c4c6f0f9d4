"""Measured cost model: NVIDIA's vLLM op tables, interpolated; selection order; the vLLM-style memory plan."""

import json
import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from planner.cli.app import app
from planner.cost import StepShape, prefill_attn_pairs, tables
from planner.cost.all2all import DeepEp
from planner.cost.moe import MoeParallel
from planner.cost.nodes import NodeSpan, nodes_of
from planner.cost.shape import context_histogram
from planner.cost.calibrated import CalibratedCostModel
from planner.cost.measured import MeasuredCostModel, covered_gpus
from planner.cost.roofline import RooflineCostModel
from planner.cost.select import parse_cost_model, select_cost_model
from planner.catalog import SM100_FAMILIES, resolve_gpu, resolve_model
from planner.errors import PlannerError
from planner.deploy.memory import plan_memory

LLAMA_H100 = MeasuredCostModel("llama-3.1-8b", "h100-sxm")


def decode(batch, context):
    return StepShape(decode_seqs=batch, decode_context=batch * context)


def prefill(tokens, seqs=1):
    per = tokens // seqs
    return StepShape(prefill_seqs=seqs, prefill_tokens=per * seqs, prefill_attn_pairs=seqs * prefill_attn_pairs(per))


# ---- interpolation --------------------------------------------------------------

def test_curve_is_exact_on_points_and_on_power_laws_between_them():
    curve = tables.Curve.of({1: 2.0, 4: 32.0, 16: 512.0})        # y = 2 x^2
    assert curve.at(4) == (32.0, False)
    y, ext = curve.at(2)
    assert y == pytest.approx(8.0) and not ext
    y, ext = curve.at(64)                                          # beyond the grid: extended, and flagged
    assert y == pytest.approx(2 * 64**2) and ext
    assert curve.at(0.5)[1]


def test_nested_interpolation_skips_missing_corners():
    tree = {1: {1: 1.0, 10: 10.0}, 10: {1: 10.0}}                # (10, 10) was never measured
    assert tables.interpolate(tree, (1, 10)) == (10.0, False)
    value, _ = tables.interpolate(tree, (10, 1))
    assert value == 10.0


# ---- grid points are exact --------------------------------------------------------

def test_gemm_exact_on_grid_points():
    rows = tables.load_rows("h100_sxm", "gemm")
    fitted = tables.monotone(tables.build_tree(rows, ("n", "k", "m")), 3)
    close = 0
    for row in rows[::97]:
        expected = fitted[row["n"]][row["k"]][row["m"]]
        assert LLAMA_H100.gemm(row["m"], row["n"], row["k"]) == pytest.approx(expected, rel=1e-9)
        close += abs(expected / row["latency"] - 1) < 0.1
    assert close > 0.9 * len(rows[::97])                      # the fit corrects violations, not the table


def test_monotone_fit_moves_only_the_violations_and_least():
    # m=2 was measured slower than m=4: the pair goes to its geometric mean, the rest stays as measured
    fit = tables.monotone({1: 2.0, 2: 5.0, 4: 3.2, 8: 8.0}, 1)
    assert fit[1] == 2.0 and fit[8] == 8.0 and fit[2] == fit[4] == pytest.approx(4.0)
    # a spike pools with as many larger sizes as it takes to stop the fall, no more
    spike = tables.monotone({1: 1.0, 2: 64.0, 4: 2.0, 8: 2.0, 16: 16.0}, 1)
    assert spike[1] == 1.0 and spike[16] == 16.0 and spike[2] == spike[4] == spike[8] == pytest.approx(256 ** (1 / 3))
    # two axes: rows and columns both end up nondecreasing; a consistent table is left alone
    two = tables.monotone({1: {1: 2.0, 8: 9.0}, 4: {1: 0.5, 8: 10.0}}, 2)
    assert two[1][8] == 9.0 and two[4][8] == 10.0 and two[1][1] == two[4][1] == pytest.approx(1.0)
    consistent = {1: {1: 1.0, 2: 2.0}, 2: {1: 3.0, 2: 4.0}}
    assert tables.monotone(consistent, 2) == consistent


@pytest.mark.parametrize("system", ["l40s", "b200_sxm"])
def test_fit_of_real_tables_is_monotone_and_keeps_consistent_points(system):
    rows = [r for r in tables.load_rows(system, "generation_attention")
            if (r["num_heads"], r["num_kv_heads"], r["head_dim"]) == (32, 8, 128)]
    tree = tables.build_tree(rows, ("batch_size", "step"))
    fitted = tables.monotone(tree, 2)
    columns: dict = {}
    for b in sorted(tree):
        line = [fitted[b][x] for x in sorted(tree[b])]
        assert line == sorted(line)
        for x in sorted(tree[b]):
            columns.setdefault(x, []).append(fitted[b][x])
    assert all(column == sorted(column) for column in columns.values())
    # along one axis, a point no smaller size beats and no larger size undercuts is kept as measured
    kept = 0
    for row in tree.values():
        line = tables.monotone(row, 1)
        for x, y in row.items():
            if all(y2 <= y if x2 < x else y2 >= y for x2, y2 in row.items()):
                assert line[x] == y
                kept += 1
    assert kept >= 40                                          # (not a vacuous check)


def test_attention_and_allreduce_exact_on_grid_points():
    def exact(table, length, method, shift):
        rows = [r for r in tables.load_rows("h100_sxm", table)
                if (r["num_heads"], r["num_kv_heads"], r["head_dim"]) == (32, 8, 128)]
        envelope = tables.monotone(tables.build_tree(rows, ("batch_size", length)), 2)
        for r in rows[::37]:
            assert method(r["batch_size"], r[length] + shift) == pytest.approx(
                envelope[r["batch_size"]][r[length]], rel=1e-9)
    exact("context_attention", "isl", LLAMA_H100.context_attention, 0)
    exact("generation_attention", "step", LLAMA_H100.generation_attention, 1)   # step counts cached tokens
    tp2 = MeasuredCostModel("llama-3.1-8b", "h100-sxm", tp=2)
    row = next(r for r in tables.load_rows("h100_sxm", "allreduce")
               if (r["backend"], r["num_gpus"], r["message_size"]) == ("custom_graph", 2, 4096 * 64))
    assert tp2.allreduce(64) == pytest.approx(row["latency"], rel=1e-9)


# ---- shape of the predictions -----------------------------------------------------

@pytest.mark.parametrize("gpu", ["a100-80g", "h100-sxm", "l40s", "b200"])
def test_monotone_in_tokens_and_batch_and_context(gpu):
    m = MeasuredCostModel("llama-3.1-8b", gpu)
    prefills = [m.step_time(prefill(n)) for n in (16, 64, 256, 1024, 2048, 4096)]
    assert prefills == sorted(prefills)
    batches = [m.step_time(decode(b, 1024)) for b in (1, 8, 32, 64, 128, 256)]
    assert batches == sorted(batches)
    contexts = [m.step_time(decode(32, c)) for c in (128, 512, 2048, 8192, 32768)]
    assert contexts == sorted(contexts) and contexts[-1] > 1.5 * contexts[0]


def test_tensor_parallel_adds_two_allreduces_per_layer():
    shape = decode(32, 1024)
    tp2 = MeasuredCostModel("llama-3.1-8b", "h100-sxm", tp=2)
    one, two = LLAMA_H100.breakdown(shape), tp2.breakdown(shape)
    assert one.get("collective", 0.0) == 0.0
    reduce = next(t for t in tp2.ledger(shape).terms if t.name == "all-reduce")
    layers = tp2.model.num_layers
    assert reduce.count == 2 * layers + 1                           # two per layer and the embedding's
    assert reduce.seconds == pytest.approx((2 * layers + 1) * tp2.allreduce(32, True))
    assert two["collective"] >= reduce.seconds                      # and the logits' all-gather
    assert two["gemm"] < one["gemm"]                                # the shards are narrower
    assert sum(v for v in two.values()) == pytest.approx(tp2.step_time(shape))


def test_pcie_gpus_use_nccl_beyond_two():
    assert MeasuredCostModel("llama-3.1-8b", "l40s", tp=2).describe()["allreduce"] == "vllm custom all-reduce"
    assert MeasuredCostModel("llama-3.1-8b", "l40s", tp=4).describe()["allreduce"] == "nccl"
    assert MeasuredCostModel("llama-3.1-70b", "h100-sxm", tp=8).describe()["allreduce"] == "vllm custom all-reduce"


def test_interactivity_mode_captures_every_small_batch_so_none_is_padded():
    from planner.cost.ledger import cudagraph_capture_sizes
    fine = cudagraph_capture_sizes(1024, 8192, interactivity=True)
    assert fine[:32] == tuple(range(1, 33)) and fine[32:] == cudagraph_capture_sizes(1024, 8192)[7:]
    balanced = MeasuredCostModel("llama-3.1-8b", "h100-sxm", max_num_seqs=1024, max_num_batched_tokens=8192)
    interactive = MeasuredCostModel("llama-3.1-8b", "h100-sxm", max_num_seqs=1024, max_num_batched_tokens=8192,
                                    performance_mode="interactivity")
    assert interactive.graphs.padded(9) == 9 and balanced.graphs.padded(9) == 16
    assert interactive.step_time(decode(9, 1024)) < balanced.step_time(decode(9, 1024))
    assert interactive.step_time(decode(16, 1024)) == balanced.step_time(decode(16, 1024))


def test_speculation_sizes_the_graphs_for_decode_steps_of_one_plus_k_tokens():
    # vLLM 0.19: the largest graph is max_num_seqs x (1 + K) x 2 (at most 512), every size rounded up to a
    # multiple of 1 + K (adjust_cudagraph_sizes_for_spec_decode), those past the largest dropped
    from engine.deployment import Deployment
    from planner.cost.ledger import cudagraph_capture_sizes
    from planner.deploy.plan import plan_deployment
    from planner.runs.pipeline import build_cost_model
    assert cudagraph_capture_sizes(32, 8192)[-1] == 64
    assert cudagraph_capture_sizes(32, 8192, decode_query_len=4)[-1] == 256
    eagle2 = cudagraph_capture_sizes(1024, 8192, decode_query_len=3)
    assert eagle2[:6] == (3, 6, 9, 18, 24, 33) and eagle2[-1] == 498 and all(s % 3 == 0 for s in eagle2)
    plan = plan_deployment(Deployment(model="llama-3.1-8b", gpu="h100-sxm", speculative="eagle:3", max_num_seqs=32))
    cost = build_cost_model(plan, "measured")
    assert plan.deployment.num_speculative_tokens == 3
    assert cost.graphs.sizes[0] == 4 and cost.graphs.largest == 256
    assert cost.graphs.padded(5 * 4) == 24 and not cost.graphs.captured(257)


def test_disable_custom_all_reduce_prices_nccl_for_every_message():
    # vLLM's --disable-custom-all-reduce: the small decode messages pay NCCL's latency, a large prefill's went
    # to NCCL anyway (over the custom all-reduce's 8 MiB buffer)
    custom = MeasuredCostModel("llama-3.1-70b", "h100-sxm", tp=4)
    nccl = MeasuredCostModel("llama-3.1-70b", "h100-sxm", tp=4, custom_all_reduce=False)
    assert nccl.describe()["allreduce"] == "nccl"
    assert nccl.allreduce(16, True) > custom.allreduce(16, True)
    assert nccl.step_time(decode(16, 1024)) > custom.step_time(decode(16, 1024))
    assert nccl.step_time(prefill(8192)) == custom.step_time(prefill(8192))
    assert MeasuredCostModel("llama-3.1-8b", "h100-sxm", custom_all_reduce=False).step_time(decode(16, 1024)) == \
        LLAMA_H100.step_time(decode(16, 1024))                        # one GPU: no all-reduce to change


def test_the_deployment_flag_reaches_the_measured_model():
    args = ["explain", "--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--tp", "4", "--batch", "16",
            "--context", "1024", "--json"]
    default, disabled = (json.loads(CliRunner().invoke(app, [*args, *extra]).stdout)
                         for extra in ([], ["--disable-custom-all-reduce"]))
    reduce = {name: next(t for t in doc["terms"] if t["term"] == "all-reduce") for name, doc in
              (("custom", default), ("nccl", disabled))}
    assert "custom all-reduce" in reduce["custom"]["detail"] and "nccl" in reduce["nccl"]["detail"]
    assert disabled["total_seconds"] > default["total_seconds"]


def test_mixed_step_has_both_attention_parts_and_shares_the_gemms():
    # a chunked-prefill step: one 256-token prompt chunk and three decodes (contexts 301, 501, 701)
    mixed = StepShape(prefill_seqs=1, prefill_tokens=256, prefill_attn_pairs=prefill_attn_pairs(256),
                      decode_seqs=3, decode_context=1503)
    parts = {t.name: t.seconds for t in LLAMA_H100.ledger(mixed).terms}
    assert parts["attention (prefill)"] > 0 and parts["attention (decode)"] > 0
    alone = LLAMA_H100.step_time(prefill(256)) + LLAMA_H100.step_time(decode(3, 501))
    assert LLAMA_H100.step_time(decode(3, 501)) < LLAMA_H100.step_time(mixed) < alone
    # a later chunk attends to the part of its prompt already cached
    chunk = StepShape(prefill_seqs=1, prefill_tokens=512, prefill_attn_pairs=prefill_attn_pairs(512, 1024))
    assert LLAMA_H100.step_time(chunk) > LLAMA_H100.step_time(prefill(512))


def test_slower_memory_stretches_only_the_memory_bound_part():
    fast, slow = MeasuredCostModel("llama-3.1-8b", "a100-80g"), MeasuredCostModel("llama-3.1-8b", "a100-40g")
    assert "memory-bound parts x1.31" in slow.name and slow.describe()["memory_bandwidth_scale"] > 1.3
    def gpu_time(model, shape):              # the host's share does not depend on the GPU's memory
        return sum(v for group, v in model.breakdown(shape).items() if group != "host")

    weight_bound = gpu_time(slow, decode(1, 512)) / gpu_time(fast, decode(1, 512))
    compute_bound = slow.step_time(prefill(4096)) / fast.step_time(prefill(4096))
    bandwidth_ratio = 2.039 / 1.555          # A100-80GB against A100-40GB HBM, TB/s (NVIDIA datasheets)
    assert slow.describe()["memory_bandwidth_scale"] == pytest.approx(bandwidth_ratio)
    # A batch-1 decode streams the weights: its GPU time stretches by nearly the whole bandwidth ratio,
    # never more; the whole step by less, its host time being the same on both.
    assert 0.95 * bandwidth_ratio < weight_bound <= bandwidth_ratio
    whole_step = slow.step_time(decode(1, 512)) / fast.step_time(decode(1, 512))
    host = [model.breakdown(decode(1, 512)).get("host", 0.0) for model in (slow, fast)]
    assert host[0] == host[1] > 0        # the same host time on both: what keeps the whole step's stretch smaller
    # the host's ~1 ms of an ~12 ms step holds the whole step's stretch at least 5 points under the bandwidth's
    assert 1.15 < whole_step < bandwidth_ratio - 0.05
    # A 4096-token prefill is compute-bound, and both A100s have the same compute.
    assert compute_bound < 1.05 and compute_bound < weight_bound


def test_heads_fold_into_the_batch_where_the_table_lacks_the_pair():
    opt = MeasuredCostModel("opt-13b", "a100-40g")                  # 40 KV heads; generation tables stop at 8
    assert opt.describe()["attention_batch_fold"]["generation"] == 5
    assert opt.generation_attention(4, 1024) == pytest.approx(
        opt.generation_attention(1, 1024) * 4, rel=0.5)              # same work, one kernel


def test_extrapolation_is_flagged():
    m = MeasuredCostModel("llama-3.1-8b", "h100-sxm")
    m.step_time(prefill(2048))
    assert "context_attention" not in m.describe()["extrapolated"]
    m.step_time(prefill(40000, seqs=1))                             # past the 16K-token grid
    assert "context_attention" in m.describe()["extrapolated"]
    assert "; extrapolated context_attention" in m.name             # the result file's cost_model says so


def test_describe_names_the_data_source():
    d = LLAMA_H100.describe()
    assert d["data"]["system"] == "h100_sxm" and d["data"]["framework"] == "vllm"
    assert d["data"]["versions"]["gemm"] == "0.24.0" and d["data"]["package_version"] == "0.12.0"
    assert LLAMA_H100.name == "measured(h100-sxm: h100_sxm vllm 0.24.0, aiconfigurator-core 0.12.0)"
    assert "a100_sxm vllm 0.14.0" in MeasuredCostModel("opt-13b", "a100").name


def test_works_offline_from_the_package(monkeypatch):
    tables.load_rows.cache_clear()
    monkeypatch.setattr(socket.socket, "connect", lambda *a: (_ for _ in ()).throw(OSError("offline")))
    m = MeasuredCostModel("qwen3-8b", "h200")
    assert m.step_time(decode(8, 512)) > 0
    src = tables.source()
    assert src["license"] == "Apache-2.0"
    for system in src["systems"].values():
        for table in system["tables"].values():
            assert len(table["sha256"]) == 64 and table["version"]


# ---- coverage errors and selection ------------------------------------------------

def test_uncovered_gpu_and_op_are_one_line_errors_naming_what_is_covered():
    with pytest.raises(PlannerError, match=r"no measured vLLM data for GPU rtx-4090; covered: a100-40g, a100-80g"):
        MeasuredCostModel("llama-3.1-8b", "rtx-4090")
    with pytest.raises(PlannerError, match=r"covers head_dim 128, not opt-2.7b's 80") as err:
        MeasuredCostModel("opt-2.7b", "a100-80g")
    assert "\n" not in str(err.value)
    with pytest.raises(PlannerError, match="bf16"):
        MeasuredCostModel("llama-3.1-8b", "h100", dtype_bytes=4)
    assert set(covered_gpus()) == {"a100-40g", "a100-80g", "h100-sxm", "h200", "l40s", "rtx-pro-6000", "b200", "b300",
                                   "gb200", "gb300"}


def test_selection_order(tmp_path, monkeypatch):
    monkeypatch.setenv("PLANNER_PROFILE_DIR", str(tmp_path))
    llama, h100 = resolve_model("llama-3.1-8b"), resolve_gpu("h100-sxm")
    assert isinstance(select_cost_model(llama, h100), MeasuredCostModel)
    assert isinstance(select_cost_model(llama, resolve_gpu("rtx-4090")), RooflineCostModel)
    assert isinstance(select_cost_model(resolve_model("opt-2.7b"), h100), RooflineCostModel)   # head_dim 80
    assert isinstance(select_cost_model(llama, h100, cost_model="roofline"), RooflineCostModel)
    with pytest.raises(PlannerError, match="no profile of llama-3.1-8b on h100-sxm"):
        select_cost_model(llama, h100, cost_model="calibrated")
    with pytest.raises(PlannerError, match="no measured vLLM data for GPU rtx-4090"):
        select_cost_model(llama, resolve_gpu("rtx-4090"), cost_model="measured")
    # a profile of this pair wins over the tables
    profile = json.load(open("profiles/cpu/opt-125m.json"))
    opt, cpu = resolve_model("opt-125m"), resolve_gpu("cpu")
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "opt-125m.json").write_text(json.dumps(profile))
    assert isinstance(select_cost_model(opt, cpu), CalibratedCostModel)
    with pytest.raises(PlannerError, match="--profile belongs to the calibrated cost model"):
        select_cost_model(opt, cpu, profile=tmp_path / "cpu" / "opt-125m.json", cost_model="measured")
    assert parse_cost_model(None) == "auto" and parse_cost_model("Measured") == "measured"
    with pytest.raises(PlannerError, match="choose one of auto, calibrated, measured, roofline"):
        parse_cost_model("magic")


# ---- memory plan, the vLLM way -------------------------------------------------------

def test_rtx4090_llama31_8b_kv_tokens_near_vllm():
    # vLLM 0.19, one RTX 4090, Llama-3.1-8B bf16, utilization 0.9, 2048 batched tokens: 41,408 KV tokens. The plan
    # fitted to vLLM 0.19's H100 logs (below) leaves 0.40 GiB more for the KV cache than this run did (+8 %):
    # something on the 4090 that those logs do not show, one run with no breakdown, so no term was added for it
    plan = plan_memory("llama-3.1-8b", "rtx-4090", gpu_memory_utilization=0.9, max_num_batched_tokens=2048)
    assert plan.kv_token_slots == pytest.approx(41_408, rel=0.10)
    assert plan.weight_bytes_per_gpu / 2**30 == pytest.approx(14.9889, abs=0.001)   # vLLM's "Model loading took"


# vLLM 0.19.0's start-up logs on an H100 80GB (bench/data/vllm_memory_logs.json, at vLLM's API-server defaults of
# 8,192 batched tokens and 1,024 sequences): model, tp, utilization, logged activation peak, non-torch, KV GiB
H100_LOGS = [
    ("llama-3.1-8b", 1, 0.95, 1.89, 0.25, 58.11),
    ("llama-3.1-8b", 2, 0.95, 1.89, 2.07, 63.76),
    ("llama-3.1-8b", 4, 0.95, 1.89, 2.13, 67.44),
    ("google/gemma-2-27b-it", 1, 0.95, 3.66, 0.26, 20.59),   # a 256k vocabulary: the sampler's warm-up dominates
    ("Qwen/Qwen2.5-72B-Instruct", 2, 0.95, 2.29, 2.09, 3.04),
    ("Qwen/Qwen3-30B-A3B", 1, 0.95, 2.68, 0.27, 15.41),     # a MoE: its buffers stay beside the sampler's
]


@pytest.mark.parametrize("model, tp, utilization, activation, non_torch, kv", H100_LOGS)
def test_memory_plan_matches_vllm_019_logs_on_h100(model, tp, utilization, activation, non_torch, kv):
    # the peak is the forward's or the sampler's warm-up, whichever is larger, not both: summed, the plan gave
    # Llama-3.1-8B 3.38 GiB of activations and Gemma-2-27B 6.90 (its KV cache 15 % short)
    plan = plan_memory(model, "h100-sxm", tp=tp, gpu_memory_utilization=utilization, max_num_batched_tokens=8192,
                       max_num_seqs=1024).summary()
    assert plan["activations_gib_per_gpu"] == pytest.approx(activation, abs=0.1)
    assert plan["non_torch_gib_per_gpu"] == pytest.approx(non_torch, abs=0.05)
    assert plan["kv_gib_per_gpu"] == pytest.approx(kv, abs=0.15)


def test_tensor_parallel_reserves_nccl_buffers():
    one = plan_memory("llama-3.1-70b", "h100-sxm", tp=4)
    assert one.non_torch_bytes_per_gpu > plan_memory("llama-3.1-8b", "h100-sxm").non_torch_bytes_per_gpu
    assert plan_memory("llama-3.1-8b", "h100-sxm", count_non_torch=False).num_gpu_blocks > \
        plan_memory("llama-3.1-8b", "h100-sxm").num_gpu_blocks
    # NCCL's buffers as vLLM 0.19 logs them on H100s (about 1.9 GiB more at TP 4), on NVLink 4 and 5; A100s keep
    # aiconfigurator's smaller figure; over PCIe the logs show nothing beyond one GPU's
    assert one.non_torch_bytes_per_gpu / 2**30 == pytest.approx(2.17, abs=0.01)
    assert plan_memory("llama-3.1-70b", "b200", tp=4).non_torch_bytes_per_gpu == one.non_torch_bytes_per_gpu
    assert plan_memory("llama-3.1-70b", "a100-80g", tp=4).non_torch_bytes_per_gpu / 2**30 < 0.7
    single = plan_memory("llama-3.1-8b", "l40s").non_torch_bytes_per_gpu
    assert plan_memory("llama-3.1-70b", "l40s", tp=4).non_torch_bytes_per_gpu == single == 0.25 * 2**30


# ---- decode attention: every sequence at its own context ---------------------------

def decode_at(contexts):
    """A decode step whose sequences hold these contexts, as the simulator describes it."""
    return StepShape(decode_seqs=len(contexts), decode_context=sum(contexts),
                     decode_histogram=context_histogram(contexts))


def test_decode_attention_is_each_sequence_priced_at_its_own_context():
    m = LLAMA_H100
    contexts = [40, 100, 900, 3000, 3000, 12000, 30000, 60000]
    b = len(contexts)
    own = m.decode_attention(decode_at(contexts))
    assert own == pytest.approx(32 * sum(m.generation_attention(b, c) for c in contexts) / b, rel=1e-12)
    # T_gen(b, c) is not linear in c (a launch-bound floor below a few hundred tokens,
    # then KV reads), so the mean context would price this batch differently
    at_mean = m.decode_attention(StepShape(decode_seqs=b, decode_context=sum(contexts)))
    assert abs(own / at_mean - 1) > 0.05
    assert m.step_time(decode_at(contexts)) - m.step_time(StepShape(decode_seqs=b, decode_context=sum(contexts))) \
        == pytest.approx(own - at_mean, rel=1e-9)


@pytest.mark.parametrize("batch,context", [(1, 2), (8, 512), (8, 700), (32, 3000), (128, 1024), (200, 77)])
def test_uniform_contexts_price_as_before(batch, context):
    uniform = decode_at([context] * batch)
    assert LLAMA_H100.step_time(uniform) == pytest.approx(LLAMA_H100.step_time(decode(batch, context)), rel=1e-12)
    assert LLAMA_H100.decode_attention(uniform) == pytest.approx(32 * LLAMA_H100.generation_attention(batch, context))


def test_generation_attention_is_linear_in_context_between_grid_points():
    m = LLAMA_H100
    lo, hi = m.generation_attention(16, 1024), m.generation_attention(16, 2048)
    assert m.generation_attention(16, 1536) == pytest.approx((lo + hi) / 2, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 70000), min_size=1, max_size=40), st.data())
def test_decode_time_grows_with_each_sequence_context(contexts, data):
    i = data.draw(st.integers(0, len(contexts) - 1))
    longer = list(contexts)
    longer[i] += data.draw(st.integers(1, 20000))
    before, after = LLAMA_H100.step_time(decode_at(contexts)), LLAMA_H100.step_time(decode_at(longer))
    assert after >= before * (1 - 1e-12)


def test_decode_contexts_past_the_grid_are_flagged():
    m = MeasuredCostModel("llama-3.1-8b", "h100-sxm")
    m.step_time(decode_at([100, 4000]))
    assert "generation_attention" not in m.describe()["extrapolated"]
    m.step_time(decode_at([100, 200000]))                         # past the 128K-token grid
    assert "generation_attention" in m.describe()["extrapolated"]


def test_b300_reads_its_own_tables_and_runs_datacenter_blackwells_kernels():
    # NVIDIA timed vLLM 0.24 on HGX B300 (aiconfigurator-core 0.12.0 b300_sxm): its own rows, not B200's
    b300, b200 = MeasuredCostModel("llama-3.1-8b", "b300"), MeasuredCostModel("llama-3.1-8b", "b200")
    assert b300.system == "b300_sxm" and "b300_sxm" in b300.name
    shape = StepShape(decode_seqs=64, decode_context=64 * 2000)
    assert b300.step_time(shape) != b200.step_time(shape)
    assert b300.step_time(shape) == pytest.approx(b200.step_time(shape), rel=0.25)   # the same silicon family
    gpu = resolve_gpu("b300")
    assert gpu.family in SM100_FAMILIES and gpu.fp4_flops == 14e15 and gpu.memory_bytes > 280e9


def test_an_nvl72_rack_is_one_node_its_collectives_on_nvlink():
    # GB200 NVL72: 72 GPUs joined by NVLink switches, so wide expert parallelism stays off the NICs
    gb200, b200 = resolve_gpu("gb200"), resolve_gpu("b200")
    assert gb200.node_gpus == 72 and b200.node_gpus == 8
    assert nodes_of(64, gb200.node_gpus) == 1 and nodes_of(64, b200.node_gpus) == 8
    assert NodeSpan.of(16, 16, node_gpus=gb200.node_gpus) is None and NodeSpan.of(16, 16).nodes == 2
    par = MoeParallel(dp=64, expert_parallel=True, all2all="deepep_low_latency")
    model = resolve_model("deepseek-r1")
    on_rack = DeepEp.of(model, par, gb200, None, 2, "infiniband")
    over_nics = DeepEp.of(model, par, b200, None, 2, "infiniband")
    assert on_rack.nodes == 1 and over_nics.nodes == 8
    assert on_rack.seconds(128) < over_nics.seconds(128) / 3


def test_list_gpus_says_each_gpus_node():
    rows = {g["name"]: g for g in json.loads(CliRunner().invoke(app, ["list", "gpus", "--json"]).output)}
    assert rows["gb200"]["node_gpus"] == 72 and rows["h100-sxm"]["node_gpus"] == 8
    assert "node" in CliRunner().invoke(app, ["list", "gpus"]).output
