"""The simulator with the chunked policy: vLLM's decisions on the simulated clock, mixed-step pricing, CLI."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner.catalog import resolve_gpu, resolve_model
from planner.cli.app import app
from planner.cost.linear import LinearCostModel, parse_linear
from planner.cost.roofline import RooflineCostModel
from planner.cost.shape import StepShape
from planner.errors import PlannerError
from planner.sim import simulate
from planner.deploy.plan import DeploymentPlan
from sim_helpers import sim_plan
from workloads import Trace
from workloads.schema import TraceRequest

GOLDEN = json.loads((Path(__file__).parent / "data" / "vllm_0_19_scheduler_golden.json").read_text())


def trace_of(case) -> Trace:
    return Trace([TraceRequest(request_id=r["id"], arrival_time=r["arrival"], prompt_len=len(r["prompt"]),
                               output_len=r["max_tokens"], prompt_token_ids=r["prompt"]) for r in case["requests"]])


def sim_config(case, **kw) -> DeploymentPlan:
    cfg = case["config"]
    return sim_plan(resolve_model("opt-125m"), resolve_gpu("a100-40g"), block_size=cfg["block_size"],
                     max_num_seqs=cfg["max_num_seqs"], max_num_batched_tokens=cfg["budget"],
                     enable_prefix_caching=cfg["caching"], enable_chunked_prefill=True,
                     num_gpu_blocks=cfg["num_blocks"], max_model_len=cfg["max_model_len"], **kw)


# reserve_full_isl is on in these (the simulator, like vLLM, always uses the default).
CASES = [c for c in GOLDEN["cases"] if c["config"]["reserve_full_isl"]][:6]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["name"])
def test_simulator_steps_like_vllm(case):
    """Same trace, cache size and step times (A + B x tokens): the simulator's steps are vLLM's."""
    result = simulate(trace_of(case), sim_config(case), LinearCostModel(*case["step_time"]))
    vllm = [s for s in case["vllm_steps"] if s["tokens"]]
    assert len(result.steps) == len(vllm)
    for step, theirs in zip(result.steps, vllm):
        assert step.end == pytest.approx(theirs["t"], abs=1e-6)
        assert step.prefill_tokens + step.decode_tokens == sum(theirs["tokens"].values())
        assert step.preempted == len(theirs["preempted"])
    assert result.metrics["num_completed"] == len(case["requests"])


def test_mixed_step_shape_and_prices():
    case = CASES[0]
    config = sim_config(case)
    result = simulate(trace_of(case), config, LinearCostModel(0.01, 0.001))
    mixed = [s for s in result.shapes if s.prefill_tokens and s.decode_seqs]
    assert mixed, "the trace should produce mixed steps"
    for step, shape in zip(result.steps, result.shapes):
        assert step.prefill_tokens == shape.prefill_tokens and step.decode_tokens == shape.decode_seqs
    # The roofline prices a mixed step as one pass: less than its two halves run apart.
    roof = RooflineCostModel(config.model, config.gpu)
    s = mixed[0]
    prefill_only = StepShape(prefill_seqs=s.prefill_seqs, prefill_tokens=s.prefill_tokens,
                             prefill_attn_pairs=s.prefill_attn_pairs)
    decode_only = StepShape(decode_seqs=s.decode_seqs, decode_context=s.decode_context)
    assert max(roof.step_time(prefill_only), roof.step_time(decode_only)) < roof.step_time(s) \
        < roof.step_time(prefill_only) + roof.step_time(decode_only)


def test_linear_cost_model_option():
    model = parse_linear("linear:0.5,0.25")
    assert model.step_time(StepShape(prefill_seqs=1, prefill_tokens=6, decode_seqs=2)) == 0.5 + 0.25 * 8
    assert model.step_time(StepShape()) == 0.0
    for bad in ("linear:1", "linear:a,b", "linear:-1,0", "quadratic:1,2"):
        with pytest.raises(PlannerError):
            parse_linear(bad)


def test_bad_chunked_sim_configs_are_refused():
    case = CASES[0]
    for kw, msg in [({"preemption_mode": "swap"}, "recompute only"), ({"allocator": "orca-max"}, "paged")]:
        with pytest.raises(ValueError, match=msg):
            sim_config(case, **kw)


def test_prefix_caching_needs_the_paged_allocator():
    """The paper's contiguous baselines share no block: prefix caching on one is refused (with the prefix-aware
    router it crashed the fleet, whose replicas had no block pool to log events of)."""
    from engine.deployment import Deployment
    with pytest.raises(ValueError, match="prefix caching shares KV blocks, which the orca-max allocator has not"):
        Deployment(policy="paper", allocator="orca-max", enable_prefix_caching=True)
    assert not Deployment(policy="paper", allocator="orca-max").prefix_caching_on


def test_cli_chunked_prefill_writes_per_step_log(tmp_path):
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["simulate", "--model", "opt-125m", "--workload", "sharegpt", "-n", "40",
                                   "--rate", "20", "--chunked-prefill", "--max-num-batched-tokens", "256",
                                   "--num-gpu-blocks", "300", "--cost-model", "linear:0.01,0.0001",
                                   "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    assert doc["params"]["enable_chunked_prefill"] is True and doc["num_gpu_blocks"] == 300
    assert doc["cost_model"] == "linear(0.01,0.0001)"
    rows = list(csv.DictReader((out / "steps.csv").open()))
    for row in rows:
        tokens = int(row["prefill_tokens"]) + int(row["decode_tokens"])
        assert 0 < tokens <= 256
        assert float(row["duration"]) == pytest.approx(0.01 + 0.0001 * tokens)
        assert int(row["num_running"]) >= int(row["batch_size"])   # every scheduled request is running
    assert any(int(r["prefill_tokens"]) and int(r["decode_tokens"]) for r in rows)
    assert "preempted" in rows[0]


def test_cli_rejects_a_bad_cost_model_cleanly():
    res = CliRunner().invoke(app, ["simulate", "-n", "5", "--cost-model", "linear:oops"])
    assert res.exit_code != 0
    assert "linear:A,B" in res.output and "Traceback" not in res.output


def test_calibrated_model_prices_a_mixed_step_as_one_pass():
    from planner.cost.calibrated import CalibratedCostModel
    model = CalibratedCostModel.from_file(Path(__file__).parent.parent / "profiles" / "cpu" / "opt-125m.json")
    prefill = StepShape(prefill_seqs=1, prefill_tokens=96, prefill_attn_pairs=96 * 100 + 96 * 97 // 2)
    decode = StepShape(decode_seqs=8, decode_context=8 * 150)
    mixed = StepShape(prefill_seqs=1, prefill_tokens=96, prefill_attn_pairs=prefill.prefill_attn_pairs,
                      decode_seqs=8, decode_context=8 * 150)
    assert max(model.step_time(prefill), model.step_time(decode)) < model.step_time(mixed) \
        < model.step_time(prefill) + model.step_time(decode)
    assert sum(model.breakdown(mixed).values()) == pytest.approx(model.step_time(mixed))


def test_chunked_prefill_smooths_inter_token_latency():
    """A long prompt arriving among decoding requests stalls every decode for one
    whole prefill step under the paper's policy; a 256-token budget cuts it into
    chunks that ride along with the decodes, so the worst gap shrinks."""
    requests = [TraceRequest(request_id=f"d{i}", arrival_time=0.0, prompt_len=16, output_len=200)
                for i in range(8)]
    requests += [TraceRequest(request_id="long", arrival_time=0.5, prompt_len=2000, output_len=4)]
    trace = Trace(requests)
    model, gpu = resolve_model("opt-125m"), resolve_gpu("a100-40g")
    worst = {}
    for chunked in (False, True):
        cfg = sim_plan(model, gpu, enable_chunked_prefill=chunked, num_gpu_blocks=2000, num_cpu_blocks=0,
                        max_num_batched_tokens=256 if chunked else None, max_num_seqs=32)
        result = simulate(trace, cfg, LinearCostModel(0.005, 0.00005))
        assert result.metrics["num_completed"] == len(requests)
        worst[chunked] = max(b - a for r in result.requests for a, b in zip(r.token_times, r.token_times[1:]))
    # Paper: a decode waits out the whole prompt's step, then a decode step of 9 (8 + the new one).
    assert worst[False] == pytest.approx((0.005 + 0.00005 * 2000) + (0.005 + 0.00005 * 9))
    # Chunked: one mixed step of a full budget (8 decodes + a 248-token chunk).
    assert worst[True] == pytest.approx(0.005 + 0.00005 * 256)
