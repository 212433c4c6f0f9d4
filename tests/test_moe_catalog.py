"""Mixture-of-experts models in the catalog: true shapes, total and active parameters, config.json input."""

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from planner.catalog import ModelSpec, resolve_model
from planner.catalog.quantization import CHECKPOINT_CONFIGS
from planner.cli.app import app
from planner.deploy.plan import plan_deployment
from engine.deployment import Deployment
from planner.errors import PlannerError

MOE = ("qwen3-30b-a3b", "qwen3-235b-a22b", "qwen3-coder-480b-a35b", "gpt-oss-20b", "gpt-oss-120b", "mixtral-8x7b",
       "mixtral-8x22b", "minimax-m2.5", "minimax-m2.7")
# MiniMax's card rounds: "230B total" (to the ten billion: 228.7B counted), "10B activated" (to the billion)
ROUNDED = {"minimax-m2.5": (5e9, 0.5e9), "minimax-m2.7": (5e9, 0.5e9)}


@pytest.mark.parametrize("name", MOE)
def test_total_and_active_parameters_match_the_published_counts(name):
    spec = resolve_model(name)
    assert spec.is_moe
    total_tolerance, active_tolerance = ROUNDED.get(name, (0.005 * spec.published_params,
                                                           0.02 * spec.published_active_params))
    assert spec.num_params == pytest.approx(spec.published_params, abs=total_tolerance)
    active = spec.active_params
    if spec.model_type in ("gpt_oss", "minimax_m2"):   # their cards count the active parameters without the embedding
        active -= spec.embedding_params
    assert active == pytest.approx(spec.published_active_params, abs=active_tolerance)
    assert spec.active_params < spec.num_params / 3


def test_shapes_from_the_configs():
    q = resolve_model("Qwen/Qwen3-30B-A3B")
    assert (q.num_experts, q.num_experts_per_tok, q.moe_intermediate_size, q.dense_layers) == (128, 8, 768, 0)
    g = resolve_model("openai/gpt-oss-120b")
    assert (g.num_experts, g.num_experts_per_tok, g.sliding_layers, g.window, g.checkpoint_quantization) == \
        (128, 4, 18, 128, "mxfp4")
    assert g.full_attention_layers == 18 and g.attention_sinks
    m = resolve_model("mistralai/Mixtral-8x7B-Instruct-v0.1")
    assert (m.num_experts, m.num_experts_per_tok, m.moe_intermediate_size, m.window) == (8, 2, 14336, 0)


def test_sliding_window_layers_cap_their_kv():
    g = resolve_model("gpt-oss-20b")
    per_layer = 2 * g.kv_size * 2
    assert g.kv_bytes_per_context(100) == g.num_layers * 100 * per_layer
    assert g.kv_bytes_per_context(10_000) == (12 * 10_000 + 12 * 128) * per_layer
    dense = resolve_model("llama-3.1-8b")
    assert dense.kv_bytes_per_context(1000) == 1000 * dense.kv_bytes_per_token()


def test_flops_count_only_the_routed_experts():
    q = resolve_model("qwen3-30b-a3b")
    dense_equivalent = 2 * (q.linear_params + q.vocab_size * q.hidden_size)
    assert q.flops_per_token() < dense_equivalent / 5
    assert q.flops_per_token() == 2 * (q.active_linear_params + q.vocab_size * q.hidden_size)


@pytest.mark.parametrize("name", MOE)
def test_config_json_folder_reads_back_the_catalog_shapes(name, tmp_path):
    pytest.importorskip("transformers")
    spec = resolve_model(name)
    config = spec.to_hf_config().to_dict()
    if spec.checkpoint_quantization:
        config["quantization_config"] = CHECKPOINT_CONFIGS[spec.checkpoint_quantization]
    (tmp_path / "config.json").write_text(json.dumps(config))
    back = resolve_model(str(tmp_path))
    same = dict(name=spec.name, hf_id=spec.hf_id, published_params=spec.published_params, source=spec.source,
                aliases=spec.aliases, published_active_params=spec.published_active_params)
    assert dataclasses.replace(back, **same) == spec


def test_qwen3_moe_dense_layers_and_shared_experts(tmp_path):
    config = dict(model_type="qwen3_moe", hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, num_hidden_layers=4, intermediate_size=96, moe_intermediate_size=32,
                  num_experts=8, num_experts_per_tok=2, mlp_only_layers=[1], decoder_sparse_step=2,
                  vocab_size=200, max_position_embeddings=256)
    spec = ModelSpec.from_hf_config(config, name="tiny")
    assert spec.dense_layers == 3 and spec.moe_layers == 1       # layer 1 listed; layers 0 and 2 off the step
    with pytest.raises(PlannerError, match="shared experts"):
        ModelSpec.from_hf_config({**config, "shared_expert_intermediate_size": 64}, name="tiny")


def test_a_deepseek_config_missing_its_latent_shapes_is_named_in_one_line():
    with pytest.raises(PlannerError, match="hidden_size") as info:
        ModelSpec.from_hf_config({"model_type": "deepseek_v3"}, name="DeepSeek-V3")
    assert "\n" not in str(info.value)


def test_gpt_oss_checkpoint_is_mxfp4_and_a_contradicting_flag_is_refused():
    plan = plan_deployment(Deployment(model="gpt-oss-20b", gpu="h100-sxm", max_model_len=8192))
    assert plan.weight_format.method == "mxfp4" and not plan.warnings
    with pytest.raises(PlannerError, match="does not match"):
        plan_deployment(Deployment(model="gpt-oss-20b", gpu="h100-sxm", quantization="fp8", max_model_len=8192))


def test_list_models_shows_total_and_active_parameters():
    result = CliRunner().invoke(app, ["list", "models", "--json"])
    assert result.exit_code == 0
    rows = {r["name"]: r for r in json.loads(result.output)}
    assert rows["qwen3-30b-a3b"]["active_params"] == resolve_model("qwen3-30b-a3b").active_params
    assert rows["qwen3-30b-a3b"]["num_experts"] == 128
    assert rows["llama-3.1-8b"]["active_params"] == rows["llama-3.1-8b"]["num_params"]
    table = CliRunner().invoke(app, ["list", "models"], env={"COLUMNS": "200"})
    assert "active B" in table.output and "8/128" in table.output


def test_a_model_the_engine_does_not_run_is_refused_before_its_weights_are_made(tmp_path):
    """MiniMax-M2.5 is priced (measured, roofline) but not run: profiling it must not build 230B random weights."""
    pytest.importorskip("torch")
    from planner.profile.checkpoints import build_checkpoint

    with pytest.raises(PlannerError, match="the engine does not run minimax_m2 models"):
        build_checkpoint("minimax-m2.5", resolve_model("minimax-m2.5"), tmp_path / "m", num_layers=1)
    assert not (tmp_path / "m").exists()
