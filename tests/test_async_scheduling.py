"""--async-scheduling, vLLM's flag, is one deployment setting: every command's simulation prices it (the
measured model hides its fitted host time behind the GPU's), the models that cannot separate vLLM's host
time refuse it in one line, and the live engine, which schedules synchronously, refuses it too. The
simulator's measured model also takes the deployment's CUDA-graph capture sizes (max_num_seqs)."""

import pytest
from typer.testing import CliRunner

from engine.deployment import Deployment
from engine.llm_engine import check_runnable
from planner.api import simulate
from planner.cli.app import app
from planner.deploy.plan import plan_deployment
from planner.errors import PlannerError
from planner.runs.pipeline import build_cost_model

H100 = dict(model="llama-3.1-8b", gpu="h100-sxm", max_model_len=4096)


def test_async_scheduling_hides_the_host_time_and_is_recorded():
    runs = {on: simulate(Deployment(**H100, async_scheduling=on), workload="random", requests=48, concurrency=16,
                         params={"input_len": 512, "output_len": 64})
            for on in (False, True)}
    sync, overlapped = (runs[on].metrics for on in (False, True))
    assert overlapped.tpot_mean < sync.tpot_mean * 0.97       # ~1 ms of host time per step, hidden
    assert overlapped.ttft_mean < sync.ttft_mean
    assert [runs[on].document()["deployment"]["async_scheduling"] for on in (False, True)] == [False, True]
    assert "--async-scheduling" in runs[True].spec.command()


def test_the_measured_model_takes_the_deployments_graph_sizes_and_scheduling():
    model = build_cost_model(plan_deployment(Deployment(**H100, max_num_seqs=8, async_scheduling=True)))
    assert model.async_scheduling and model.graphs.largest == 16          # vLLM: min(2 x max_num_seqs, 512)
    assert build_cost_model(plan_deployment(Deployment(**H100))).graphs.largest == 512


def test_models_without_vllms_host_time_refuse_it_in_one_line():
    with pytest.raises(PlannerError, match="--async-scheduling is priced by the measured cost model"):
        build_cost_model(plan_deployment(Deployment(**H100, async_scheduling=True)), cost_model="roofline")
    result = CliRunner().invoke(app, ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--cost-model",
                                      "roofline", "--async-scheduling", "--requests", "4"])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "--async-scheduling is priced by the measured cost model" in result.output


def test_the_live_engine_refuses_it(tmp_path):
    with pytest.raises(ValueError, match="async scheduling: this engine schedules each step"):
        check_runnable(Deployment(model="opt-125m", gpu="cpu", async_scheduling=True), str(tmp_path))
