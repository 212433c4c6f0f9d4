"""The layers a quantized checkpoint keeps in 16 bits (ModelOpt exclude_modules, compressed-tensors ignore,
modules_to_not_convert): read from its config, planned at 2 bytes and priced at 16-bit speed."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from engine.deployment import Deployment
from planner.catalog import resolve_gpu, resolve_model
from planner.catalog.kept_layers import is_excluded, kept_fractions
from planner.catalog.quantization import (checkpoint_format, format_from_config, format_from_id, recorded_format,
                                          weight_format)
from planner.cli.explain import step
from planner.cost.measured import MeasuredCostModel
from planner.cost.roofline import RooflineCostModel
from planner.deploy.plan import plan_deployment
from planner.errors import PlannerError

# nvidia/DeepSeek-V3.1-NVFP4's hf_quant_config.json, per layer as released (o_proj is not listed: it is NVFP4)
DEEPSEEK_NVFP4 = ["lm_head"] + [f"model.layers.{i}.self_attn.{w}" for i in range(61)
                                for w in ("kv_a_proj_with_mqa", "kv_b_proj", "q_a_proj", "q_b_proj")]
ATTENTION = ("model.layers.*.self_attn*",)


def modelopt(patterns: list[str], algo: str = "NVFP4") -> dict:
    return {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": algo, "exclude_modules": patterns}}


def test_each_config_dialect_names_its_unquantized_modules():
    assert format_from_config(modelopt(["lm_head", "model.layers.0*"])).excluded == ("lm_head", "model.layers.0*")
    compressed = {"quant_method": "compressed-tensors", "ignore": ["lm_head", "re:.*self_attn.*"],
                  "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}}
    assert format_from_config(compressed).excluded == ("lm_head", "re:.*self_attn.*")
    fp8 = {"quant_method": "fp8", "weight_block_size": [128, 128], "modules_to_not_convert": ["model.layers.0.mlp"]}
    assert format_from_config(fp8).excluded == ("model.layers.0.mlp",)
    with pytest.raises(PlannerError, match="exclude_modules must be a list of module names"):
        format_from_config(modelopt("lm_head"))


def test_patterns_match_as_vllm_matches_them():
    name = "model.layers.3.self_attn.q_b_proj"
    assert is_excluded(name, ("model.layers.3.self_attn.q_b_proj",))          # exact
    assert is_excluded(name, ("model.layers.3.self_attn",))                    # a parent module
    assert is_excluded(name, ("model.layers.*.self_attn*",))                   # ModelOpt wildcard
    assert is_excluded(name, ("re:.*self_attn\\.q_b.*",))                      # compressed-tensors regex
    assert is_excluded(name, ("model.language_model.layers.3.self_attn*",))    # a vision-language wrapper
    assert not is_excluded(name, ("model.layers.31.*", "model.layers.3.mlp*", "lm_head"))


def test_fractions_follow_the_layers_and_weights_listed():
    deepseek = resolve_model("deepseek-v3")
    # q_b, kv_b, o, q_a, kv_a: all but o_proj in every layer; lm_head is not a layer weight
    assert kept_fractions(deepseek, tuple(DEEPSEEK_NVFP4)) == {"attention": (1.0, 1.0, 0.0, 1.0, 1.0)}
    llama = resolve_model("llama-3.1-8b")
    assert kept_fractions(llama, ("model.layers.0.self_attn*",)) == {"attention": (1 / 32,) * 4}
    assert kept_fractions(llama, ("model.layers.1.*",)) == {"attention": (1 / 32,) * 4, "mlp": (1 / 32,) * 3}
    qwen35 = resolve_model("qwen3.5-397b-a17b")      # 15 attention layers of 60, the others Gated DeltaNet
    kept = kept_fractions(qwen35, ("model.language_model.layers.*.linear_attn*", "model.layers.3.self_attn*"))
    assert kept == {"attention": (1 / 15,) * 4, "linear_attention": (1.0, 1.0, 1.0)}


def test_kept_weights_are_planned_at_two_bytes():
    model, fmt = resolve_model("llama-3.1-8b"), weight_format("nvfp4")
    kept = replace(fmt, excluded=ATTENTION)
    attention = model.num_layers * sum(n * k for n, k in model.attention_shapes)
    mlp = model.num_layers * sum(fmt.matrix_bytes(n, k) for n, k in model.mlp_shapes)
    assert model.linear_bytes_per_gpu(kept, 1) == 2 * attention + mlp
    assert model.linear_params_by_format(kept, 2) == {None: attention // 2, kept: (model.linear_params - attention) // 2}
    grown = model.weight_bytes_per_gpu(2, weight_format=kept) - model.weight_bytes_per_gpu(2, weight_format=fmt)
    nvfp4_attention = model.num_layers * sum(fmt.matrix_bytes(n, k) for n, k in model.attention_shapes)
    assert grown == pytest.approx((2 * attention - nvfp4_attention) / 2, abs=1)


def test_kept_weights_are_multiplied_at_sixteen_bits():
    model, gpu, fmt = resolve_model("llama-3.1-8b"), resolve_gpu("b200"), weight_format("nvfp4")
    kept = replace(fmt, excluded=ATTENTION)
    shape = step(0, 1, prefill_tokens=4096)
    measured = MeasuredCostModel(model, gpu, 1, weight_format=kept)
    qkv = next(t for t in measured.ledger(shape).terms if t.name == "qkv GEMM")
    n, k = (model.q_size + 2 * model.kv_size), model.hidden_size
    assert qkv.seconds == pytest.approx(model.num_layers * measured.gemm(4096, n, k))
    assert qkv.detail.startswith("b200_sxm gemm,") and "kept in 16 bits by the checkpoint" in qkv.detail
    down = next(t for t in measured.ledger(shape).terms if t.name == "down GEMM")
    assert down.seconds == pytest.approx(model.num_layers * measured.layer_gemm(4096, model.hidden_size,
                                                                                model.intermediate_size))
    # the roofline's compute-bound prefill: the attention projections at the 16-bit peak cost more
    assert (RooflineCostModel(model, gpu, 1, weight_format=kept).step_time(shape)
            > RooflineCostModel(model, gpu, 1, weight_format=fmt).step_time(shape))


def test_a_checkpoint_folder_and_a_released_id_carry_their_exclusions(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))     # ModelOpt's beside it
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(modelopt(["lm_head", *ATTENTION], "FP8")))
    assert checkpoint_format(str(tmp_path)).excluded == ("lm_head", *ATTENTION)
    by_id = recorded_format("NVIDIA/DeepSeek-V3.1-NVFP4")            # case as the user types it
    assert by_id.method == "nvfp4" and "model.layers.*.self_attn.q_b_proj" in by_id.excluded
    assert kept_fractions(resolve_model("deepseek-v3"), by_id.excluded) == kept_fractions(
        resolve_model("deepseek-v3"), tuple(DEEPSEEK_NVFP4))
    assert recorded_format("someone/DeepSeek-V3.1-NVFP4") is None       # another release: not on record


def test_a_released_fp8_checkpoint_is_planned_in_the_format_its_config_declares():
    # Qwen's FP8 releases are 128 x 128 block-scaled; an id nobody recorded is read from its words (per tensor)
    assert recorded_format("Qwen/Qwen3-30B-A3B-FP8").scheme == "fp8-block"
    assert format_from_id("someone/Qwen3-30B-A3B-FP8").scheme == "fp8-tensor"
    plan = plan_deployment(Deployment(model="Qwen/Qwen3-30B-A3B-FP8", gpu="h100-sxm", tp=1))
    assert plan.weight_format.scheme == "fp8-block"
    with pytest.raises(PlannerError, match="does not match the quantization method"):
        plan_deployment(Deployment(model="nvidia/DeepSeek-V3.2-NVFP4", gpu="b200", tp=4, quantization="fp8"))
