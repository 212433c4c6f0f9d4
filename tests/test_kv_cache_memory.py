"""vLLM's --kv-cache-memory-bytes: each GPU's KV cache given in bytes instead of what the utilization leaves."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from engine.deployment import Deployment
from engine.llm import LLM
from engine.model_runner import bytes_per_block
from planner.cli import app
from planner.deploy.plan import plan_deployment
from planner.errors import PlannerError
from tiny_models import save_tiny_model

LLAMA_8B = Deployment(model="llama-3.1-8b", gpu="h100-sxm", max_model_len=8192)
# What a vLLM start-up line suggests, "Replace gpu_memory_utilization config with `--kv-cache-memory=N`"
GIVEN = 20_064_085_607


def test_the_bytes_are_cut_into_blocks_as_vllm_cuts_them():
    # vLLM: available // page_size // num_layers; Llama-3.1-8B's page is 16 tokens x 8 KV heads x 128 x K,V x
    # 2 bytes = 64 KiB a layer, 32 layers: 20,064,085,607 bytes hold 9,567 blocks
    plan = plan_deployment(LLAMA_8B.replace(kv_cache_memory_bytes=GIVEN))
    assert plan.num_gpu_blocks == GIVEN // (16 * 8 * 128 * 2 * 2) // 32 == 9567
    assert plan.memory_summary()["kv_cache_memory_bytes_given"] == GIVEN
    # the utilization no longer sizes the cache; TP 2 halves each GPU's share of a block
    for utilization in (0.5, 0.95):
        assert plan_deployment(LLAMA_8B.replace(kv_cache_memory_bytes=GIVEN, gpu_memory_utilization=utilization)
                               ).num_gpu_blocks == 9567
    assert plan_deployment(LLAMA_8B.replace(kv_cache_memory_bytes=GIVEN, tp=2)).num_gpu_blocks == \
        GIVEN // (16 * 4 * 128 * 2 * 2) // 32 == 19134
    # vLLM's block-count override wins over it, as in vLLM
    assert plan_deployment(LLAMA_8B.replace(kv_cache_memory_bytes=GIVEN, num_gpu_blocks=600)).num_gpu_blocks == 600


@pytest.mark.parametrize("given, message", [
    (100 * 2**30, "does not fit on h100-sxm beside 15.24 GiB of weights and non-torch memory"),
    (2**20, "holds no KV block of llama-3.1-8b on 1 x h100-sxm: one takes 2.00 MiB per GPU"),
])
def test_a_cache_that_cannot_be_allocated_is_refused_in_one_line(given, message):
    with pytest.raises(PlannerError, match=message):
        plan_deployment(LLAMA_8B.replace(kv_cache_memory_bytes=given))


def test_a_cache_too_small_for_the_context_says_which_flag_to_raise():
    with pytest.raises(PlannerError, match=r"holds 8176 tokens .* raise --kv-cache-memory-bytes \(now 1073741823\), "
                                           r"lower --max-model-len to 8176$"):
        plan_deployment(LLAMA_8B.replace(kv_cache_memory_bytes=2**30 - 1))      # 511 blocks


def test_cli_takes_vllms_flag_and_its_short_name(tmp_path):
    for flag in ("--kv-cache-memory-bytes", "--kv-cache-memory"):
        result = CliRunner().invoke(app, ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm",
                                          "--max-model-len", "8192", flag, str(GIVEN), "--requests", "20",
                                          "--out", str(tmp_path / flag), "--json"])
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout)
        assert doc["memory_plan"]["num_gpu_blocks"] == 9567 and doc["deployment"]["kv_cache_memory_bytes"] == GIVEN
        assert f"--kv-cache-memory-bytes {GIVEN}" in doc["command"]


def test_the_live_engine_and_the_plan_cut_the_same_bytes_into_the_same_blocks(tmp_path):
    folder = save_tiny_model("llama", tmp_path / "llama")
    budget = 3 << 20
    deployment = Deployment(model=folder, gpu="cpu", dtype="float32", block_size=16, kv_cache_memory_bytes=budget)
    runner = LLM(folder, deployment=deployment, enforce_eager=True).engine.runner
    assert runner.num_gpu_blocks == budget // bytes_per_block(*runner.cache_shape, 16, runner.cache_dtype)
    assert plan_deployment(deployment, refuse=False).num_gpu_blocks == runner.num_gpu_blocks
    # vLLM's keyword on LLM(...) says the same
    assert LLM(folder, dtype="float32", kv_cache_memory_bytes=budget, enforce_eager=True
               ).engine.runner.num_gpu_blocks == runner.num_gpu_blocks
