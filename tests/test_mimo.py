"""MiMo-V2-Flash (sliding and full layers with their own KV heads, value heads narrower than the keys, experts
on all but the first layer): config reading, memory, and what the cost models price
(planner/catalog/mimo_config.py)."""
import json

import pytest
from typer.testing import CliRunner

from planner.catalog import resolve_gpu, resolve_model
from planner.catalog.models import ModelSpec
from planner.cli.app import app
from planner.cost.measured import MeasuredCostModel
from planner.cost.select import select_cost_model
from planner.cost.shape import StepShape
from planner.deploy.memory import kv_block_layout
from planner.errors import PlannerError
from reference_helpers import transformers_param_count

# a small config.json in the shape Xiaomi ships it: integer layer patterns and the sliding layers' own fields
SMALL = {"model_type": "mimo_v2_flash", "architectures": ["MiMoV2FlashForCausalLM"], "num_hidden_layers": 6,
         "hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 48, "v_head_dim": 32,
         "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 4096, "rope_theta": 5000000,
         "partial_rotary_factor": 0.334, "sliding_window": 16, "sliding_window_size": 16,
         "swa_num_attention_heads": 8, "swa_num_key_value_heads": 4, "swa_head_dim": 48, "swa_v_head_dim": 32,
         "hybrid_layer_pattern": [0, 1, 1, 1, 1, 0], "moe_layer_freq": [0, 1, 1, 1, 1, 1],
         "moe_intermediate_size": 64, "n_routed_experts": 8, "n_shared_experts": None, "num_experts_per_tok": 2,
         "add_swa_attention_sink_bias": True, "add_full_attention_sink_bias": False, "layernorm_epsilon": 1e-5,
         "tie_word_embeddings": False}



def test_config_json_read_as_vllm_builds_it():
    spec = ModelSpec.from_hf_config(SMALL, "small")
    g = spec.global_attention
    assert (spec.sliding_layers, spec.full_attention_layers, spec.sliding_window) == (4, 2, 16)
    assert (spec.num_kv_heads, g.kv_heads, spec.head_size, g.head_size, spec.value_head_size) == (4, 2, 48, 48, 32)
    assert spec.rotary_dims == 16 and spec.dense_layers == 1 and spec.moe_layers == 5 and spec.shared_experts == 0
    # q, k (48 wide) and v (32 wide), o from 8 x 32; sinks on the sliding layers only, as transformers builds them
    assert spec.attention_shapes == ((8 * 48, 256), (4 * 48, 256), (4 * 32, 256), (256, 8 * 32))
    assert spec.num_params == transformers_param_count(spec)


def test_transformers_window_is_the_window_plus_the_query():
    """transformers writes sliding_window as vLLM's window + 1; without sliding_window_size that is read back."""
    written = {k: v for k, v in SMALL.items() if k != "sliding_window_size"} | {"sliding_window": 17}
    assert ModelSpec.from_hf_config(written, "small").sliding_window == 16


@pytest.mark.parametrize("change, words", [
    ({"swa_head_dim": 64}, "own query heads or head sizes"),
    ({"hybrid_layer_pattern": [0, 1]}, "hybrid_layer_pattern"),
    ({"moe_layer_freq": None}, "moe_layer_freq"),
    ({"swa_num_key_value_heads": 3}, "multiple of num_kv_heads"),
    ({"sliding_window_size": "128"}, "sliding_window must be a positive integer"),
])
def test_unmodelled_or_broken_configs_refused(change, words):
    with pytest.raises(PlannerError, match=words):
        ModelSpec.from_hf_config(dict(SMALL, **change), "small")


def test_catalog_counts_and_ids():
    m = resolve_model("XiaomiMiMo/MiMo-V2-Flash")
    assert m.name == "mimo-v2-flash" and m.checkpoint_quantization == "fp8-block"
    assert m.num_params == pytest.approx(m.published_params, rel=0.005)                 # the card: 309B
    assert m.active_params == pytest.approx(m.published_active_params, rel=0.05)        # 15B


def test_kv_cache_holds_keys_and_narrower_values_side_by_side():
    m = resolve_model("mimo-v2-flash")        # 9 full layers (4 KV heads), 39 sliding (8): 192-wide K, 128-wide V
    assert m.kv_bytes_per_token(2) == 9 * 4 * (192 + 128) * 2 + 39 * 8 * (192 + 128) * 2
    assert m.kv_bytes_per_context(4096) == 9 * 4096 * 2560 + 39 * 128 * 5120
    block, reserve = kv_block_layout(m, tp=8, kv_dtype_bytes=2, block_size=16, max_num_seqs=4)
    assert block == 9 * 16 * 1 * 320 * 2                        # one KV head a GPU: the full layers' 4 replicated
    assert reserve == 4 * (8 + 1) * 39 * 16 * 1 * 320 * 2       # 4 sequences' windows of 127 tokens + one block


def test_measured_gemms_take_the_value_width():
    terms = {t.name: t for t in MeasuredCostModel(resolve_model("mimo-v2-flash"), "h100", tp=8).ledger(
        StepShape(decode_seqs=8, decode_context=8 * 2048)).terms}
    assert "n=1856 k=4096, x9 layers" in terms["qkv (full layers) GEMM"].detail      # (8 + 1) x 192 + 1 x 128
    assert "n=4096 k=1024, x39 layers" in terms["o projection (sliding layers) GEMM"].detail     # 8 x 128
    assert "dense" not in terms["experts (fused MoE)"].detail and "x47 layers" in terms["experts (fused MoE)"].detail
    assert terms["all-reduce"].count == 2 * 48 + 1


def test_attention_flops_count_qk_and_the_narrower_pv():
    m = resolve_model("mimo-v2-flash")
    assert m.attention_flops_per_key == 2 * 64 * 192 + 2 * 64 * 128


def test_gpu_without_the_head_size_falls_back_to_the_roofline_and_says_why():
    """B200's tables time no 192-wide heads: auto prices MiMo by the roofline and names the gap; a forced
    measured model is refused in one line."""
    m = resolve_model("mimo-v2-flash")
    cost = select_cost_model(m, resolve_gpu("b200"), tp=4)
    assert cost.name.startswith("roofline") and "head_dim" in cost.profile_note and "192" in cost.profile_note
    result = CliRunner().invoke(app, ["simulate", "--model", "mimo-v2-flash", "--gpu", "b200", "--tp", "4",
                                      "--workload", "random", "--requests", "4", "--cost-model", "measured"])
    assert result.exit_code != 0 and "192" in result.output and "Traceback" not in result.output


def test_cli_simulates_mimo_from_its_config_file(tmp_path):
    config = dict(SMALL, num_hidden_layers=48, hidden_size=4096, num_attention_heads=64, swa_num_attention_heads=64,
                  num_key_value_heads=4, swa_num_key_value_heads=8, head_dim=192, swa_head_dim=192, v_head_dim=128,
                  swa_v_head_dim=128, intermediate_size=16384, vocab_size=152576, moe_intermediate_size=2048,
                  n_routed_experts=256, num_experts_per_tok=8, sliding_window=128, sliding_window_size=128,
                  hybrid_layer_pattern=[0] + ([1] * 4 + [0] + [1] * 1) * 7 + [1] * 4 + [0],
                  moe_layer_freq=[0] + [1] * 47, max_position_embeddings=262144)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    spec, catalog = resolve_model(str(path)), resolve_model("mimo-v2-flash")
    assert (spec.full_attention_layers, spec.sliding_layers, spec.num_params) == (9, 39, catalog.num_params)
    assert spec.kv_bytes_per_token(2) == catalog.kv_bytes_per_token(2)
    result = CliRunner().invoke(app, ["simulate", "--model", str(path), "--gpu", "h200", "--tp", "8",
                                      "--workload", "random", "--concurrency", "8", "--requests", "16",
                                      "--max-model-len", "8192"])
    assert result.exit_code == 0, result.output
    assert "TPOT mean" in result.output
