"""vllm-v1 is the default policy, with vLLM's own defaults for it (issue 23, item 6).

vLLM's API server sets max_num_batched_tokens and max_num_seqs per device
(vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults) and turns prefix
caching on; the paper's policy keeps vLLM v0.2.0's. A request with n > 1 runs
as n child requests under vllm-v1 (vllm/v1/engine/parallel_sampling.py), in
the simulator as in the live engine (tests/test_engine.py); beam search is
refused in one line.
"""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from engine.deployment import BatchDevice, Deployment, resolve_batch_limits, vllm_batch_defaults
from planner import simulate as simulate_run
from planner.cli.app import app
from planner.cost.linear import LinearCostModel
from planner.deploy.plan import plan_deployment
from planner.errors import PlannerError
from planner.sim import simulate
from sim_helpers import sim_plan
from workloads import make_trace

GIB = 1 << 30
H100 = Deployment(model="llama-3.1-8b", gpu="h100-sxm", max_model_len=4096)


def _limits(gpu: str, **knobs) -> tuple[int, int, bool]:
    d = plan_deployment(Deployment(model="llama-3.1-8b", gpu=gpu, max_model_len=4096, **knobs)).deployment
    return d.max_num_batched_tokens, d.max_num_seqs, d.enable_prefix_caching


@pytest.mark.parametrize("gpu, tokens, seqs", [
    ("h100-sxm", 8192, 1024),     # 79 GiB: vLLM's larger defaults
    ("h200", 8192, 1024),
    ("a100-80g", 2048, 256),      # 79 GiB, but an A100: vLLM keeps the small ones (its PR #17885)
    ("l4", 2048, 256),            # under 70 GiB
])
def test_vllm_v1_defaults_follow_vllms_api_server_per_gpu(gpu, tokens, seqs):
    assert Deployment().policy == "vllm-v1"
    assert _limits(gpu) == (tokens, seqs, True)


def test_the_cpu_gets_vllms_cpu_defaults_per_rank():
    d = plan_deployment(Deployment(model="opt-125m", gpu="cpu")).deployment
    assert (d.max_num_batched_tokens, d.max_num_seqs, d.enable_prefix_caching) == (2048, 128, True)
    assert vllm_batch_defaults(BatchDevice(is_cpu=True), world_size=2) == (4096, 256)


def test_the_paper_policy_keeps_its_own_defaults():
    assert _limits("h100-sxm", policy="paper") == (4096, 256, False)    # max(max_model_len, 2048)


def test_a_value_given_always_wins():
    assert _limits("h100-sxm", max_num_seqs=64) == (8192, 64, True)
    assert _limits("h100-sxm", enable_prefix_caching=False)[2] is False
    assert _limits("l4", policy="paper", enable_prefix_caching=True)[2] is True
    # A budget given caps the defaulted max_num_seqs at it, as vLLM does; both given: both kept.
    assert _limits("h100-sxm", max_num_batched_tokens=512) == (512, 512, True)
    assert _limits("h100-sxm", max_num_batched_tokens=512, max_num_seqs=128)[:2] == (512, 128)


def test_throughput_mode_doubles_vllms_defaults_and_keeps_what_is_given():
    # vLLM's --performance-mode throughput (EngineArgs._set_default_max_num_seqs_and_batched_tokens_args)
    assert _limits("h100-sxm", performance_mode="throughput") == (16384, 2048, True)
    assert _limits("a100-80g", performance_mode="throughput") == (4096, 512, True)
    assert _limits("h100-sxm", performance_mode="throughput", max_num_seqs=64)[:2] == (16384, 64)
    assert _limits("h100-sxm", performance_mode="interactivity") == _limits("h100-sxm")
    with pytest.raises(ValueError, match="a setting of vLLM v1"):
        Deployment(policy="paper", performance_mode="throughput")
    with pytest.raises(ValueError, match="performance_mode 'fast' is not supported"):
        Deployment(performance_mode="fast")


def test_without_chunked_prefill_the_default_budget_holds_max_model_len():
    # vLLM: without chunked prefill a defaulted budget is raised to max_model_len (then capped at
    # max_num_seqs x max_model_len); a budget given below it is refused, as vLLM's SchedulerConfig refuses it
    assert _limits("h100-sxm", enable_chunked_prefill=False) == (8192, 1024, True)        # 4096 <= 8192
    d = plan_deployment(Deployment(model="llama-3.1-8b", gpu="h100-sxm", enable_chunked_prefill=False))
    assert (d.deployment.max_num_batched_tokens, d.max_model_len) == (131072, 131072)
    # vLLM's profile run is a forward pass of the whole budget: its activations leave fewer KV blocks
    assert d.num_gpu_blocks < plan_deployment(Deployment(model="llama-3.1-8b", gpu="h100-sxm")).num_gpu_blocks
    with pytest.raises(PlannerError, match="use --enable-chunked-prefill or --max-model-len 8192"):
        plan_deployment(Deployment(model="llama-3.1-8b", gpu="h100-sxm", enable_chunked_prefill=False,
                                   max_num_batched_tokens=8192))
    with pytest.raises(ValueError, match="chunked prefill is vLLM v1's"):
        Deployment(policy="paper", enable_chunked_prefill=True)
    assert Deployment.of(enable_chunked_prefill=True).policy == "vllm-v1"
    assert Deployment.of(Deployment(policy="paper"), enable_chunked_prefill=True).chunked_prefill_on


def test_no_enable_chunked_prefill_is_vllms_flag(tmp_path):
    result = CliRunner().invoke(app, ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--max-model-len",
                                      "16384", "--requests", "20", "--rate", "4", "--no-enable-chunked-prefill",
                                      "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert "policy vllm-v1: 16384 tokens / 1024 seqs per step, no chunked prefill" in " ".join(result.output.split())
    doc = (tmp_path / "run" / "result.json").read_text()
    assert '"enable_chunked_prefill": false' in doc and '"max_num_batched_tokens": 16384' in doc
    result = CliRunner().invoke(app, ["simulate", "--policy", "paper", "--chunked-prefill", "--requests", "2"])
    assert result.exit_code != 0 and result.output.strip().splitlines() == [
        "error: chunked prefill is vLLM v1's (--policy vllm-v1): the paper's policy prefills each prompt whole"]


def test_a_defaulted_budget_is_capped_by_what_the_sequences_can_hold():
    h100 = BatchDevice(memory_bytes=80 * GIB, name="NVIDIA H100 80GB HBM3")
    d = resolve_batch_limits(Deployment(max_num_seqs=2), h100, max_model_len=1000)
    assert (d.max_num_batched_tokens, d.max_num_seqs) == (2000, 2)
    a100 = BatchDevice(memory_bytes=80 * GIB, name="NVIDIA A100-SXM4-80GB")
    assert vllm_batch_defaults(a100, 1) == (2048, 256)
    assert vllm_batch_defaults(BatchDevice(), 1) == (2048, 256)       # vLLM's fallback: no device to ask


def test_simulate_prints_and_records_the_resolved_policy(tmp_path):
    result = CliRunner().invoke(app, ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--max-model-len",
                                      "4096", "--requests", "20", "--rate", "4", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert ("policy vllm-v1: 8192 tokens / 1024 seqs per step, prefix caching, async scheduling"
            in " ".join(result.output.split()))
    doc = (tmp_path / "run" / "result.json").read_text()
    for field in ('"policy": "vllm-v1"', '"max_num_seqs": 1024', '"max_num_batched_tokens": 8192',
                  '"enable_prefix_caching": true', '"async_scheduling": true'):
        assert field in doc


def test_the_parallel_workload_runs_under_vllm_v1_as_child_requests():
    trace = make_trace("parallel", num_requests=30, rate=2.0, seed=0)
    plan = sim_plan(model="opt-13b", gpu="a100-40g", policy="vllm-v1")
    fast = simulate(trace, plan, LinearCostModel(0.005, 1e-4))
    slow = simulate(trace, plan, LinearCostModel(0.005, 1e-4), fast_forward=False)
    assert fast.metrics.num_completed == 30 and fast.metrics.num_rejected == 0
    assert [r.request_id for r in fast.requests] == [r.request_id for r in trace.requests]
    assert all(r.num_seqs == 4 and r.output_len == 4 * r.seq_output_len for r in fast.requests)
    # Children 1..3 of each request find the first child's full prompt blocks in the prefix cache (at most
    # 3/4 of the prompt tokens looked up: each child computes the partial last block itself).
    assert 0.4 < fast.prefix_cache_hit_rate < 0.75
    assert [(r.first_token, r.finish) for r in fast.requests] == [(r.first_token, r.finish) for r in slow.requests]
    paper = simulate(trace, sim_plan(model="opt-13b", gpu="a100-40g"), LinearCostModel(0.005, 1e-4))
    assert paper.metrics.num_completed == 30 and paper.prefix_cache_hit_rate == 0.0


def test_beam_search_under_vllm_v1_is_refused_in_one_line():
    trace = make_trace("beam", num_requests=5, rate=2.0, seed=0)
    with pytest.raises(PlannerError, match="--policy paper"):
        simulate(trace, sim_plan(policy="vllm-v1"), LinearCostModel(0.005, 1e-4))
    result = CliRunner().invoke(app, ["simulate", "--workload", "beam", "--requests", "5"])
    assert result.exit_code != 0
    assert result.output.strip().splitlines() == [
        "error: beam search is not supported by the vllm-v1 policy (vLLM v1 has no beam search in its scheduler); "
        "run it with --policy paper"]


def test_a_random_prefix_is_served_from_the_prefix_cache():
    # vllm bench serve --random-prefix-len 1024 before 512-token inputs: vLLM v1's prefix cache serves the
    # prefix to every request but the first, so TTFT falls against prompts of the same length with none
    params = {"input_len": 512, "output_len": 32}
    shared = simulate_run(H100, workload="random", params={**params, "prefix_len": 1024}, rate=8.0,
                          requests=60).document()
    alone = simulate_run(H100, workload="random", params={**params, "input_len": 1536}, rate=8.0,
                         requests=60).document()
    assert shared["prefix_cache_hit_rate"] == pytest.approx(59 * 1024 / (60 * 1536), rel=0.01)
    assert alone["prefix_cache_hit_rate"] == 0
    assert shared["ttft_mean"] < 0.6 * alone["ttft_mean"]


def test_priority_scheduling_serves_priority_0_first_and_reports_each_class():
    # vLLM's --scheduling-policy priority under load: half the requests at priority 1 wait behind the others
    run = dict(workload="sharegpt", params={"low_priority_share": 0.5}, requests=400, rate=30.0)
    d = Deployment(model="llama-3.1-8b", gpu="h100-sxm", max_model_len=4096, num_gpu_blocks=3000)
    doc = simulate_run(d.replace(scheduling_policy="priority"), **run).document()
    classes = doc["by_priority"]
    assert set(classes) == {"0", "1"} and classes["0"]["num_submitted"] + classes["1"]["num_submitted"] == 400
    assert classes["0"]["ttft_mean"] < classes["1"]["ttft_mean"] / 5
    fcfs = simulate_run(d, **run).document()["by_priority"]            # fcfs ignores priorities
    assert fcfs["0"]["ttft_mean"] > classes["0"]["ttft_mean"] * 3
    assert "by_priority" not in simulate_run(d, workload="sharegpt", requests=20, rate=4.0).document()
