"""Gemma 3 in the planner: its ids, its memory plan (vision weights, a 1,024-token window on 5 of 6 layers)
and the kernels of its step."""
from __future__ import annotations

import pytest

from engine.deployment import Deployment
from planner import simulate
from planner.catalog import GIB, resolve_model
from planner.cost.elementwise import step_kernels
from planner.deploy.memory import kv_block_layout, plan_memory
from planner.deploy.plan import plan_deployment
from planner.errors import PlannerError


@pytest.mark.parametrize("name, expected", [("google/gemma-3-27b-it", "gemma-3-27b"),
                                            ("google/gemma-3-4b-pt", "gemma-3-4b"),
                                            ("google/gemma-3-12b-it", "gemma-3-12b"),
                                            ("google/gemma-3-1b-it", "gemma-3-1b")])
def test_gemma3_ids(name, expected):
    assert resolve_model(name).name == expected


def test_the_vision_tower_is_held_in_memory_and_shards_with_tp():
    gemma = resolve_model("gemma-3-4b")
    text_only = gemma.weight_bytes_per_gpu(1) - gemma.vision_params * 2
    assert gemma.weight_bytes_per_gpu(1) / GIB == pytest.approx(8.0, abs=0.1)        # 4.3B in bf16
    assert text_only == pytest.approx(gemma.weight_bytes_per_gpu(1) * 0.9, rel=0.01)   # the tower is 10% of it
    assert gemma.weight_bytes_per_gpu(2) < gemma.weight_bytes_per_gpu(1) * 0.51


def test_large_windows_are_held_in_every_block_and_one_long_sequence_still_starts():
    gemma = resolve_model("gemma-3-27b")
    per_layer = 2 * 16 * 128 * 2 * 16
    # vLLM's 1,024 sequences x 65 window blocks x 52 layers would need ~450 GB: the window goes into the blocks
    assert kv_block_layout(gemma, 1, 2, 16, 1024, kv_room=20 * GIB) == (62 * per_layer, 0)
    # a small window (gpt-oss's 128 tokens) keeps its reserve whatever the room
    oss = resolve_model("gpt-oss-20b")
    assert kv_block_layout(oss, 1, 2, 16, 256, kv_room=20 * GIB)[1] > 0
    # one H100: a 65,536-token context starts though the blocks of all 62 layers hold 34,112 tokens, since
    # vLLM counts a sliding layer at a window plus a step's 8,192 tokens; so does 131,072 (about 13.6 GiB: vLLM
    # 0.19 logs 19.53 GiB of KV cache for this model at utilization 0.95, about 15.6 at the default 0.9), and
    # at 0.85 it is refused
    plan = plan_deployment(Deployment(model="google/gemma-3-27b-it", gpu="h100-sxm", max_model_len=65536))
    assert plan.memory.block_bytes_per_gpu == 62 * per_layer and plan.memory.sliding_window_bytes_per_gpu == 0
    assert plan.num_gpu_blocks * 16 == 34112
    assert plan_deployment(Deployment(model="google/gemma-3-27b-it", gpu="h100-sxm")).max_model_len == 131072
    with pytest.raises(PlannerError, match="lower --max-model-len to 111504"):
        plan_deployment(Deployment(model="google/gemma-3-27b-it", gpu="h100-sxm", gpu_memory_utilization=0.85))
    assert plan_deployment(Deployment(model="google/gemma-3-27b-it", gpu="h200")).max_model_len == 131072
    memory = plan_memory("gemma-3-27b", "h100-sxm")
    assert memory.weight_bytes_per_gpu / GIB == pytest.approx(51.1, abs=0.1)


def test_gemma_step_runs_its_extra_norms_and_gelu():
    names = [k.name for k in step_kernels(resolve_model("gemma-3-12b"), 1, 2)]
    assert names == ["embedding lookup", "embedding scale", "input RMSNorm + residual add", "q/k RMSNorm",
                     "rotary embedding", "KV-cache write", "post-attention RMSNorm",
                     "pre-feedforward RMSNorm + residual add", "GELU-tanh and mul", "post-feedforward RMSNorm",
                     "final RMSNorm"]
    llama = [k.name for k in step_kernels(resolve_model("llama-3.1-8b"), 1, 2)]
    assert "post-feedforward RMSNorm" not in llama and "SiLU and mul" in llama


def test_a_bad_gemma3_config_is_named_in_one_line(tmp_path):
    from planner.catalog import ModelSpec

    with pytest.raises(PlannerError, match="model 'bad': .*num_hidden_layers") as info:
        ModelSpec.from_hf_config({"model_type": "gemma3", "text_config": {"num_hidden_layers": "x"}}, name="bad")
    assert "\n" not in str(info.value)
    with pytest.raises(PlannerError, match="sliding_window must be a positive integer"):
        ModelSpec.from_hf_config({"model_type": "gemma3_text", "sliding_window": -5}, name="bad")


def test_vllm_v1_takes_each_running_sequences_windows_from_the_pool():
    # gpt-oss's 128-token windows: 9 blocks a running sequence, not 9 x vLLM's 1,024 sequences set aside
    v1 = plan_deployment(Deployment(model="openai/gpt-oss-120b", gpu="h100-sxm", max_model_len=8192))
    assert v1.deployment.max_num_seqs == 1024
    assert v1.memory.window_blocks_per_seq == 9 and v1.memory.sliding_window_bytes_per_gpu == 0
    assert v1.state_blocks == 9 and v1.num_gpu_blocks * 16 > 150_000
    paper = plan_deployment(Deployment(model="openai/gpt-oss-120b", gpu="h100-sxm", max_model_len=8192,
                                       policy="paper"))
    assert paper.memory.window_blocks_per_seq == 0 and paper.memory.sliding_window_bytes_per_gpu > 0
    # as vLLM, which starts it at its own 131,072-token context on one H100
    assert plan_deployment(Deployment(model="openai/gpt-oss-120b", gpu="h100-sxm")).max_model_len == 131072


def test_a_full_batch_of_gpt_oss_clients_runs_without_preemption():
    result = simulate(Deployment(model="openai/gpt-oss-120b", gpu="h100-sxm", max_model_len=8192),
                      workload="sharegpt", concurrency=128, requests=256)
    # (18,160 token slots before: 731 preemptions and a batch of 30 at 512 requests)
    assert result.metrics.preemptions["total"] == 0 and result.metrics.mean_batch_size > 40
