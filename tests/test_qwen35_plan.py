"""Qwen3.5/3.6 and Qwen3-Next in the planner: Gated DeltaNet layers read from their configs, vLLM's hybrid
cache (its larger blocks, each sequence's state blocks from the same pool), and the layers' kernels priced."""
import json

import pytest

from engine.core.chunked_scheduler import VllmBlockManager
from engine.core.sequence import Sequence
from engine.deployment import Deployment
from planner.api import run_spec
from planner.catalog import resolve_gpu, resolve_model
from planner.cost.measured import MeasuredCostModel
from planner.cost.roofline import RooflineCostModel
from planner.cost.shape import StepShape
from planner.deploy.memory import plan_memory
from planner.deploy.plan import plan_deployment
from planner.deploy.state_cache import cache_groups, cache_block_size, state_blocks
from planner.errors import PlannerError
from planner.runs.pipeline import Simulation

QWEN35 = resolve_model("qwen3.5-35b-a3b")


def test_ids_and_published_sizes():
    assert resolve_model("Qwen/Qwen3.5-35B-A3B") is QWEN35
    assert resolve_model("nvidia/Qwen3.6-35B-A3B-NVFP4") is QWEN35          # Qwen3.6: Qwen3.5's shapes
    assert resolve_model("nvidia/Qwen3.5-397B-A17B-NVFP4").name == "qwen3.5-397b-a17b"
    for name in ("qwen3.5-27b", "qwen3.5-35b-a3b", "qwen3.5-122b-a10b", "qwen3.5-397b-a17b"):
        spec = resolve_model(name)
        assert spec.num_params == pytest.approx(spec.published_params, rel=0.02), name
        if spec.published_active_params:    # the names round (A3B: 3.46B in the decoder, embeddings included)
            assert spec.active_params - spec.vision_params == pytest.approx(spec.published_active_params,
                                                                             rel=0.2), name
    assert (QWEN35.attention_layers, QWEN35.linear_attention_layers) == (10, 30)
    nxt = resolve_model("Qwen/Qwen3-Next-80B-A3B-Instruct")          # Qwen3.5's layers with 512 experts, text only
    assert nxt.model_type == "qwen3_next" and nxt.vision_params == 0
    assert (nxt.attention_layers, nxt.linear_attention_layers, nxt.num_experts) == (12, 36, 512)
    assert nxt.num_params == pytest.approx(80e9, rel=0.005)
    # "3B activated" counts the decoder without the embedding and LM head (3.25B here)
    assert nxt.active_params - 2 * nxt.vocab_size * nxt.hidden_size == pytest.approx(3e9, rel=0.1)
    assert QWEN35.kv_bytes_per_token(2) == 10 * 2 * 2 * 256 * 2         # only the attention layers cache


def test_a_vision_language_checkpoint_reads_its_decoder_and_format(tmp_path):
    """Qwen3.5's released config.json wraps the decoder (text_config) in a vision-language model; an FP8
    release (Qwen/Qwen3.5-35B-A3B-FP8) declares its format at the top level, which covers the decoder."""
    transformers = pytest.importorskip("transformers")
    text = QWEN35.to_hf_config().to_dict()
    config = transformers.Qwen3_5MoeConfig(text_config=text).to_dict()
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    path = tmp_path / "Qwen3.5-35B-A3B-FP8" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    spec = resolve_model(str(path))
    assert spec.linear_attention == QWEN35.linear_attention
    assert spec.num_params - spec.vision_params == QWEN35.num_params - QWEN35.vision_params
    assert spec.vision_params > 0 and spec.checkpoint_quantization == "fp8-block"


def test_bad_layer_types_are_named(tmp_path):
    text = QWEN35.to_hf_config().to_dict() | {"layer_types": ["linear_attention", "sliding_attention"]}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(text))
    with pytest.raises(PlannerError, match="layer_types must list 40 layers"):
        resolve_model(str(path))


def test_vllms_block_size_holds_a_layers_state():
    """vLLM raises the attention block size to the smallest multiple of 16 (32 on B200 for 256-wide heads)
    whose page of one layer's K and V holds one layer's recurrent state."""
    state = QWEN35.linear_attention.state_bytes_per_gpu(1, 2)
    assert state == 3 * (2 * 16 * 128 + 32 * 128) * 2 + 32 * 128 * 128 * 4       # conv window + fp32 state
    for gpu, tp in (("h200", 1), ("h200", 2), ("b200", 1)):
        size = cache_block_size(QWEN35, resolve_gpu(gpu), tp, 2, 2, 16)
        token = QWEN35.kv_cache_width(tp) * 2
        step = 32 if gpu == "b200" else 16
        assert size % step == 0 and size * token >= QWEN35.linear_attention.state_bytes_per_gpu(tp, 2)
        assert (size - step) * token < QWEN35.linear_attention.state_bytes_per_gpu(tp, 2)
    assert cache_block_size(QWEN35, resolve_gpu("h200"), 1, 2, 2, 16) == 1056
    assert cache_block_size(resolve_model("llama-3.1-8b"), resolve_gpu("h200"), 1, 2, 2, 16) == 16


def test_the_cache_pool_holds_tokens_and_states():
    assert cache_groups(QWEN35) == (10, 1, 3) and state_blocks(QWEN35) == 3
    plan = plan_memory(QWEN35, "h200", block_size=16)
    assert plan.block_size == 1056 and plan.state_blocks_per_seq == 3
    assert plan.block_bytes_per_gpu == 10 * 1056 * QWEN35.kv_cache_width(1) * 2
    free = plan.usable_bytes_per_gpu - plan.weight_bytes_per_gpu - plan.activation_bytes_per_gpu \
        - plan.non_torch_bytes_per_gpu
    assert 0 <= free - plan.num_gpu_blocks * plan.block_bytes_per_gpu < plan.block_bytes_per_gpu


def test_a_sequence_holds_its_state_blocks_while_it_runs():
    manager = VllmBlockManager(1056, 20, state_blocks=3)
    free = manager.num_free_blocks()
    seq = Sequence(0, list(range(2000)), 2000)
    assert manager.blocks_to_admit([], 2000) == 2 + 3
    manager.admit(seq, [], 2000)
    assert manager.num_free_blocks() == free - 5 and len(manager.block_table(seq)) == 2
    manager.free(seq)
    assert manager.num_free_blocks() == free


def test_the_plan_runs_vllm_v1_without_prefix_caching():
    plan = plan_deployment(Deployment(model="qwen3.5-35b-a3b", gpu="h200", max_model_len=32768))
    assert (plan.block_size, plan.deployment.block_size, plan.state_blocks) == (1056, 16, 3)
    assert plan.deployment.enable_prefix_caching is False
    assert any("prefix caching off" in w for w in plan.warnings)
    with pytest.raises(PlannerError, match="only under vLLM v1"):
        plan_deployment(Deployment(model="qwen3.5-35b-a3b", gpu="h200", max_model_len=32768, policy="paper"))


def test_states_bound_how_many_sequences_run_at_once():
    """With 40 blocks, each running sequence holds 3 for its states and at least one for its tokens:
    at most 10 run at once, however many the clients send."""
    spec = run_spec(Deployment(model="qwen3.5-35b-a3b", gpu="h200", max_model_len=4096, num_gpu_blocks=40),
                    workload="random", concurrency=32, requests=64)
    result = Simulation.prepare(spec).simulate()
    assert result.metrics.num_completed == 64
    assert 8 <= max(r.batch_size for r in result.steps) <= 10


def test_the_measured_model_times_the_gdn_kernels():
    h200 = MeasuredCostModel(QWEN35, "h200")
    step = StepShape(decode_seqs=256, decode_context=256 * 2048)
    terms = {t.name: t for t in h200.ledger(step).terms}
    gdn = terms["linear attention (conv + delta rule)"]
    assert gdn.source == "table" and gdn.count == 30
    assert terms["qkv GEMM"].count == 10 and terms["linear attention in-proj GEMM"].count == 30
    # decode moves each sequence's fp32 state in and out: bandwidth-bound at large batches
    state = QWEN35.linear_attention.state_bytes_per_gpu(1, 2)
    assert 30 * 2 * 256 * state / 4.8e12 < gdn.seconds < 2 * 30 * 2 * 256 * state / 4.8e12
    assert h200.ledger(step).total == pytest.approx(h200.step_time(step))


def test_the_roofline_prices_the_gdn_layers():
    model = RooflineCostModel(QWEN35, "h200")
    decode = StepShape(decode_seqs=128, decode_context=128 * 1024)
    parts = model.breakdown(decode)
    assert parts["linear_attention"] > 0
    assert model.step_time(decode) == pytest.approx(sum(v for k, v in parts.items() if k != "bound"))
    wider = model.breakdown(StepShape(decode_seqs=256, decode_context=256 * 1024))
    assert wider["linear_attention"] == pytest.approx(2 * parts["linear_attention"])
    prefill = model.breakdown(StepShape(prefill_seqs=1, prefill_tokens=4096, prefill_attn_pairs=4096 * 4097 // 2))
    assert prefill["linear_attention"] > 0
