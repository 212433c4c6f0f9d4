"""ModelOpt's MIXED_PRECISION checkpoints (vLLM's `modelopt_mixed`): each layer in the format its config's
quantized_layers names, the rest 16-bit; planned, and priced by the roofline and the measured model, layer by
layer (planner/catalog/quantization.py, planner/catalog/kept_layers.py format_shares)."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from engine.deployment import Deployment
from planner.catalog import resolve_model
from planner.catalog.kept_layers import format_shares
from planner.catalog.quantization import checkpoint_format, recorded_format, weight_format
from planner.cli.explain import step
from planner.cost.measured import MeasuredCostModel
from planner.cost.roofline import RooflineCostModel
from planner.deploy.plan import plan_deployment
from planner.errors import PlannerError
from planner.runs.pipeline import build_cost_model

DENSE = "nvidia/Qwen3.6-27B-NVFP4"          # FP8 attention and DeltaNet projections, W4A16 NVFP4 MLPs and LM head
MOE = "nvidia/Qwen3.6-35B-A3B-NVFP4"        # the same, with W4A16 NVFP4 experts and shared expert


def mixed_config(layers: dict) -> dict:
    """A Qwen3 config.json as ModelOpt writes a MIXED_PRECISION export into it."""
    return {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
            "vocab_size": 1000, "max_position_embeddings": 4096, "tie_word_embeddings": False,
            "quantization_config": {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
                                    "quantized_layers": layers, "ignore": ["mtp*"]}}


def test_a_config_names_each_layers_format_and_the_rest_stays_16_bit(tmp_path):
    layers = {f"model.layers.{i}.{w}": ({"quant_algo": "FP8"} if "attn" in w else
                                        {"quant_algo": "W4A16_NVFP4", "group_size": 16})
              for i in range(2) for w in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                          "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
    (tmp_path / "config.json").write_text(json.dumps(mixed_config({**layers, "lm_head": {"quant_algo": "NVFP4"}})))
    fmt = checkpoint_format(str(tmp_path))
    assert fmt.method == "modelopt_mixed" and fmt.excluded == ("mtp*",)
    assert {(f.scheme, f.weight_only) for f in fmt.formats} == {("fp8-tensor", False), ("nvfp4", True),
                                                               ("nvfp4", False)}
    assert fmt.head.scheme == "nvfp4" and not fmt.head.weight_only and fmt.experts is None
    model = resolve_model(str(tmp_path))
    shares = format_shares(model, fmt)
    fp8, w4a16 = (dict(fmt.layers)[f"model.layers.0.{w}"] for w in ("self_attn.q_proj", "mlp.down_proj"))
    # q, k, v in FP8; o_proj is not listed, so vLLM leaves it unquantized
    assert shares["attention"] == (((fp8, 1.0),),) * 3 + (((None, 1.0),),)
    assert shares["mlp"] == (((w4a16, 1.0),),) * 3
    # the memory plan: each weight in its format, the LM head in NVFP4, the embedding and norms in 16 bits
    plan = plan_deployment(Deployment(model=str(tmp_path), gpu="h100"))
    saved = sum(model.num_layers * (2 * n * k - f.matrix_bytes(n, k)) for f, shapes in
                ((fp8, model.attention_shapes[:3]), (w4a16, model.mlp_shapes)) for n, k in shapes)
    saved += 2 * model.vocab_size * model.hidden_size - fmt.head.matrix_bytes(model.vocab_size, model.hidden_size)
    plain = mixed_config({})
    del plain["quantization_config"]
    (tmp_path / "bf16").mkdir()
    (tmp_path / "bf16" / "config.json").write_text(json.dumps(plain))
    bf16 = plan_deployment(Deployment(model=str(tmp_path / "bf16"), gpu="h100"))
    assert bf16.weight_format is None and plan.memory.weight_bytes_per_gpu == bf16.memory.weight_bytes_per_gpu - saved
    assert "modelopt_mixed" in plan.weight_format.describe() and "lm_head in nvfp4" in plan.weight_format.describe()


def test_released_checkpoints_are_on_record_with_their_layers():
    dense, moe = recorded_format(DENSE), recorded_format(MOE)
    assert dense.method == moe.method == "modelopt_mixed"
    assert dense.head.weight_only and moe.experts.weight_only and dense.experts is None
    model = resolve_model(DENSE)
    shares = format_shares(model, dense)
    fp8 = next(f for f in dense.formats if f.method == "fp8")
    w4a16 = next(f for f in dense.formats if f.weight_only)
    # Gated DeltaNet layers: the fused q/k/v/z projection and the output in FP8; b and a (not listed) in 16 bits
    assert shares["linear_attention"] == (((fp8, 1.0),), ((None, 1.0),), ((fp8, 1.0),))
    assert shares["attention"] == (((fp8, 1.0),),) * 4 and shares["mlp"] == (((w4a16, 1.0),),) * 3
    # Qwen3.6-27B on one H100: 19.7 GiB of weights against 51.0 GiB in bf16
    plan = plan_deployment(Deployment(model=DENSE, gpu="h100"))
    assert plan.weight_format == dense and 19.5 * 2 ** 30 < plan.memory.weight_bytes_per_gpu < 19.8 * 2 ** 30


def test_the_measured_model_prices_each_layer_in_its_own_format():
    """On H100 the FP8 projections read NVIDIA's FP8 GEMM table; the W4A16 MLPs and LM head are FP4 Marlin,
    priced as --quantization nvfp4 is on Hopper (the bf16 table at 4.5-bit weights)."""
    plan = plan_deployment(Deployment(model=DENSE, gpu="h100"))
    cost = MeasuredCostModel(plan.model, "h100", weight_format=plan.weight_format)
    marlin = MeasuredCostModel(plan.model, "h100", weight_format=weight_format("nvfp4"))
    fp8 = MeasuredCostModel(plan.model, "h100", weight_format=weight_format("fp8"))
    model, shape = plan.model, step(16, 2048)
    terms = {t.name: t for t in cost.ledger(shape).terms}
    reference = {name: {t.name: t for t in m.ledger(shape).terms} for name, m in (("fp8", fp8), ("nvfp4", marlin))}
    assert terms["down GEMM"].seconds == pytest.approx(reference["nvfp4"]["down GEMM"].seconds)
    assert "gemm as nvfp4 W4A16 weight-only" in terms["down GEMM"].detail
    assert terms["qkv GEMM"].seconds == pytest.approx(reference["fp8"]["qkv GEMM"].seconds)
    assert "gemm_fp8" in terms["qkv GEMM"].detail
    # the o projection is FP8 too; the LM head is read at its NVFP4 bytes, cheaper than a 16-bit one
    n, k = model.vocab_size, model.hidden_size
    assert terms["LM head GEMM"].seconds < fp8.gemm(16, n, k)
    assert cost.describe()["tables"]["layer_gemm"] == "gemm_fp8+gemm"
    # the roofline reads the same layers: a memory-bound decode reads fewer bytes than all-FP8 (4.5-bit MLPs and
    # head), more than all-NVFP4 (8-bit projections)
    decode = {name: RooflineCostModel(model, "h100", weight_format=fmt).step_time(step(16, 2048))
              for name, fmt in (("mixed", plan.weight_format), ("fp8", weight_format("fp8")),
                                ("nvfp4", weight_format("nvfp4")))}
    assert decode["fp8"] > decode["mixed"] > decode["nvfp4"]


def test_w4a16_experts_read_the_marlin_moe_nvidia_timed():
    """vLLM runs W4A16 NVFP4 experts on its Marlin MoE, which NVIDIA timed as `int4_wo` for Kimi-K2.5's INT4
    experts (4.5 bits a weight, as NVFP4): Kimi-K2's shape reads those rows as they are, Qwen3.6's takes the
    table's efficiency over the roofline (source `scaled`)."""
    plan = plan_deployment(Deployment(model=MOE, gpu="b200"))
    cost = build_cost_model(plan, "auto")
    experts = {t.name: t for t in cost.ledger(step(32, 2048)).terms}["experts (fused MoE)"]
    assert cost.name.startswith("measured") and experts.source == "scaled" and "int4_wo" in experts.detail
    kimi = resolve_model("kimi-k2")
    w4a16 = recorded_format(MOE).experts
    fmt = replace(recorded_format(MOE), layers=(("model.layers.*.mlp.experts", w4a16),))
    timed = MeasuredCostModel(kimi, "h200", tp=8, weight_format=fmt)
    kimi_experts = {t.name: t for t in timed.ledger(step(64, 2048)).terms}["experts (fused MoE)"]
    assert kimi_experts.source == "table" and "int4_wo" in kimi_experts.detail


def test_bad_mixed_configs_are_refused_in_one_line(tmp_path):
    for layers, words in (({}, "requires a non-empty 'quantized_layers'"),
                          ({"model.layers.0.mlp.down_proj": {"quant_algo": "MXFP8"}}, "quant_algo 'MXFP8'"),
                          ({"model.layers.0.mlp.down_proj": {"quant_algo": "NVFP4", "group_size": 32}},
                           "with group_size 32"),
                          ({"model.layers.0.mlp.down_proj": "FP8"}, "must be an object with a quant_algo")):
        (tmp_path / "config.json").write_text(json.dumps(mixed_config(layers)))
        with pytest.raises(PlannerError, match=words):
            checkpoint_format(str(tmp_path))
    with pytest.raises(PlannerError, match="give the checkpoint"):
        weight_format("modelopt_mixed")
    # naming it matches the checkpoint's own method, as vLLM checks; another method does not
    assert plan_deployment(Deployment(model=DENSE, gpu="h100", quantization="modelopt_mixed")).weight_format.is_mixed
    with pytest.raises(PlannerError, match=r"model config \(modelopt_mixed\) does not match"):
        plan_deployment(Deployment(model=DENSE, gpu="h100", quantization="nvfp4"))
