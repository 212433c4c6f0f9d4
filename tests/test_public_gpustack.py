"""bench/bench_public_gpustack.py simulates each of GPUStack's published runs as its page says it was made:
the serving command's own TP, context limit, token budget and scheduling, vLLM bench's bursts sent at once and
its ShareGPT runs at their concurrency through served clients, at the run's recorded mean lengths."""

import json
from pathlib import Path

import pytest

from planner.deploy.plan import plan_deployment
from planner.errors import PlannerError
from planner.sim.clients import SERVED_TURNAROUND

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_public_gpustack.py"


def test_every_run_is_a_vllm_bench_block_with_its_source(bench):
    doc = json.loads(Path(bench.DATA).read_text())
    assert len(doc["runs"]) == len(bench.load_runs()) == 41
    assert [r["gpu"] for r in doc["runs"]].count("h100-sxm") == 36    # and DeepSeek-R1's five on 8 x H200
    for row in doc["runs"]:
        assert row["page"].startswith("docs/performance-lab/") and len(row["commit"]) == 40
        assert row["serve"].startswith("vllm serve ") and row["model"] in row["serve"]
        assert row["requests"] in (100, 500, 1000)      # the runs that lost requests are left out


def test_runs_take_their_serving_commands_settings(bench):
    runs = {r.label: r for r in bench.load_runs()}
    tp2 = runs["gpt-oss-120b tp2 async 1998/98 x500 at once"]
    assert (tp2.tp, tp2.async_scheduling, tp2.max_model_len) == (2, True, None)
    tp1 = runs["gpt-oss-120b tp1 1998/98 x500 at once"]     # vllm serve ... --max-model-len 32768
    assert (tp1.tp, tp1.async_scheduling, tp1.max_model_len) == (1, False, 32768)
    assert tp1.deployment().max_model_len == 32768
    fp8 = runs["Qwen3-235B-A22B-FP8 tp4 3996/182 x500 at once"]   # -tp 4 --max-num-batched-tokens 16384
    deployment = fp8.deployment()
    assert (deployment.tp, deployment.max_num_batched_tokens, deployment.async_scheduling) == (4, 16384, False)
    assert fp8.moe and not runs["Qwen3-14B tp1 1996/100 x500 at once"].moe
    deepseek = runs["DeepSeek-R1-0528 h200 tp8 3995/200 x500 at once"].deployment()   # vllm serve ... -tp 8
    assert (deepseek.gpu, deepseek.tp, deepseek.async_scheduling) == ("h200", 8, False)


def test_bursts_arrive_at_once_and_sharegpt_clients_are_served(bench):
    for run in bench.load_runs():
        if run.dataset == "random":
            assert run.clients == run.requests and run.deployment().client_turnaround == 0.0
        else:
            assert run.clients in (1, 2, 4, 8) and run.deployment().client_turnaround == SERVED_TURNAROUND
    c1 = next(r for r in bench.load_runs() if r.model == "Qwen/Qwen3-8B" and r.clients == 1)
    # 23,260 input and 22,061 output tokens over 100 requests
    assert (c1.input_len, c1.output_len, c1.ttft, c1.tpot) == (233, 221, 0.05901, 0.00728)


def test_qwen3_32b_on_one_h100_is_refused_at_its_context_limit(bench):
    """The page's Qwen3-32B server started with the model's 40,960-token context on one H100; at vLLM's
    defaults the plan leaves room for fewer tokens, so the bench reports the run as refused."""
    run = next(r for r in bench.load_runs() if r.model == "Qwen/Qwen3-32B")
    with pytest.raises(PlannerError, match="max_model_len is 40960: vLLM refuses to start"):
        plan_deployment(run.deployment())
    assert plan_deployment(run.deployment(), refuse=False).num_gpu_blocks * 16 < 32_100
