"""vLLM's --cpu-offload-gb: part of each GPU's weights in host memory, read over the host link every step."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from engine.deployment import Deployment
from planner.catalog import GIB, resolve_gpu
from planner.cli import app
from planner.cli.from_vllm import translate
from planner.cost.shape import StepShape
from planner.deploy.plan import plan_deployment
from planner.runs.pipeline import build_cost_model

BASE = Deployment(model="llama-3.1-8b", gpu="l4", max_model_len=8192)


def test_the_offloaded_weights_leave_their_memory_to_the_kv_cache():
    plain, offloaded = plan_deployment(BASE), plan_deployment(BASE.replace(cpu_offload_gb=4.0))
    assert plain.memory.weight_bytes_per_gpu - offloaded.memory.weight_bytes_per_gpu == 4 * GIB
    assert offloaded.memory.summary()["cpu_offload_gib_per_gpu"] == 4.0
    block = plain.memory.block_bytes_per_gpu
    assert offloaded.num_gpu_blocks - plain.num_gpu_blocks == pytest.approx(4 * GIB / block, abs=1)


def test_no_more_than_the_layers_is_offloaded():
    # 100 GiB asked of an 8B model: its decoder layers go, its embedding and LM head stay (vLLM wraps the layers)
    plan = plan_deployment(BASE.replace(cpu_offload_gb=100.0))
    model = plan.model
    kept = (model.embedding_params + model.lm_head_params) * 2
    assert plan.cpu_offload_bytes_per_gpu == model.weight_bytes_per_gpu(1, 2) - kept


def test_every_step_that_computes_reads_them_over_the_host_link():
    plain = build_cost_model(plan_deployment(BASE))
    offloaded = build_cost_model(plan_deployment(BASE.replace(cpu_offload_gb=4.0)))
    decode = StepShape(decode_seqs=8, decode_context=8 * 1000)
    link = resolve_gpu("l4").host_link_bandwidth
    assert offloaded.step_time(decode) - plain.step_time(decode) == pytest.approx(4 * GIB / link)
    assert offloaded.step_time(StepShape()) == plain.step_time(StepShape())
    measured = build_cost_model(plan_deployment(BASE.replace(gpu="h100", cpu_offload_gb=4.0)))   # has a ledger
    assert "weights from host memory" in [t.name for t in measured.ledger(decode).terms]
    shown = CliRunner().invoke(app, ["explain", "--model", "llama-3.1-8b", "--gpu", "h100", "--batch", "8",
                                     "--context", "1000", "--cpu-offload-gb", "4"])
    assert shown.exit_code == 0
    assert "weights from host memory" in shown.output


def test_it_is_refused_where_weights_are_in_host_memory_already_and_by_the_live_engine(tmp_path):
    result = CliRunner().invoke(app, ["simulate", "--model", "opt-125m", "--gpu", "cpu", "--requests", "10",
                                      "--cpu-offload-gb", "1"])
    assert result.exit_code == 2
    assert "its weights are in host memory already" in result.stderr
    from engine.llm_engine import check_runnable
    with pytest.raises(ValueError, match="keeps its weights where its device reads them"):
        check_runnable(Deployment(model=str(tmp_path), cpu_offload_gb=1.0), str(tmp_path))


def test_from_vllm_carries_it_over():
    t = translate("vllm serve m --cpu-offload-gb 10", None, "l4")
    assert t.words[-2:] == ["--cpu-offload-gb", "10"]
    assert t.not_modelled == []
