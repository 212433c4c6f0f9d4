"""Quantized weights and an FP8 KV cache in the plan: bytes per format, where the format comes from,
what vLLM runs on each GPU, and the cost models that price them (issue 23, item 4)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.deployment import Deployment
from planner.catalog import resolve_gpu, resolve_model
from planner.catalog.quantization import (
    WeightFormat,
    format_from_config,
    format_from_id,
    gemm_path,
    weight_format,
)
from planner.cli.app import app
from planner.cost.measured import MeasuredCostModel
from planner.cost.roofline import RooflineCostModel
from planner.cost.select import select_cost_model
from planner.cost.shape import StepShape
from planner.deploy.memory import plan_memory
from planner.deploy.plan import plan_deployment
from planner.errors import PlannerError

N = K = 4096      # one 4096 x 4096 linear weight: 16,777,216 values


@pytest.mark.parametrize("fmt, expected", [
    (weight_format("fp8"), N * K + 4 + 4),                                   # fp32 weight + activation scale
    (WeightFormat("fp8", "fp8-channel"), N * K + 4 * N),                     # fp32 scale per output row
    (WeightFormat("fp8", "fp8-block"), N * K + 4 * 32 * 32),                 # fp32 scale per 128x128 block
    (weight_format("nvfp4"), N * K // 2 + N * K // 16 + 8),                  # E2M1 pairs + E4M3 per 16 + 2 fp32
    (weight_format("mxfp4"), N * K // 2 + N * K // 32),                      # E2M1 pairs + E8M0 per 32
    (weight_format("awq"), N * K // 2 + 2 * N * 32 + N * 32 // 2),          # int4 + fp16 scale + int4 zero / group
    (weight_format("gptq"), N * K // 2 + 2 * N * 32),                        # symmetric: no zero points
    (WeightFormat("gptq", "int-group", bits=4, group_size=128, act_order=True), N * K // 2 + 2 * N * 32 + 8 * K),
])
def test_matrix_bytes_per_format_by_hand(fmt, expected):
    assert fmt.matrix_bytes(N, K) == expected


def test_llama_8b_fp8_weights_by_hand():
    m = resolve_model("llama-3.1-8b")
    linear = 32 * (2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 14336 * 4096)        # 6,979,321,856 weights
    rest = 2 * 128256 * 4096 + 32 * 2 * 4096 + 4096                            # embedding, LM head, norms
    assert m.weight_bytes_per_gpu(1, 2, weight_format("fp8")) == linear + 32 * 7 * 8 + 2 * rest == 9_081_202_432
    assert m.weight_bytes_per_gpu(1, 2) == 2 * (linear + rest) == 16_060_522_496
    # MXFP4 leaves a dense model's linear layers 16-bit, as vLLM's Mxfp4Config does
    assert m.weight_bytes_per_gpu(1, 2, weight_format("mxfp4")) == m.weight_bytes_per_gpu(1, 2)
    # TP shards the linear layers with their scales and the embedding and head; the norms are replicated
    assert m.weight_bytes_per_gpu(2, 2, weight_format("fp8")) == \
        -(-(linear + 32 * 7 * 8) // 2) + 2 * (2 * 128256 * 4096 // 2 + 32 * 2 * 4096 + 4096)


def test_fp8_kv_cache_doubles_the_blocks_in_the_same_memory():
    auto = plan_memory("llama-3.1-8b", "h100", max_num_batched_tokens=2048)
    fp8 = plan_memory("llama-3.1-8b", "h100", max_num_batched_tokens=2048, kv_dtype_bytes=1)
    assert fp8.block_bytes_per_gpu * 2 == auto.block_bytes_per_gpu == 2 * 32 * 8 * 128 * 2 * 16
    assert fp8.kv_bytes_per_token == 2 * 32 * 8 * 128
    assert fp8.num_gpu_blocks in (2 * auto.num_gpu_blocks, 2 * auto.num_gpu_blocks + 1)


def test_llama_8b_fp8_on_h100_holds_more_blocks_than_bf16():
    base = Deployment(model="llama-3.1-8b", gpu="h100", max_model_len=8192, policy="vllm-v1")
    bf16, fp8 = plan_deployment(base), plan_deployment(base.replace(quantization="fp8"))
    both = plan_deployment(base.replace(quantization="fp8", kv_cache_dtype="fp8"))
    saved = bf16.memory.weight_bytes_per_gpu - fp8.memory.weight_bytes_per_gpu
    assert saved == 16_060_522_496 - 9_081_202_432
    assert fp8.num_gpu_blocks - bf16.num_gpu_blocks == pytest.approx(saved // bf16.memory.block_bytes_per_gpu, abs=1)
    assert both.num_gpu_blocks in (2 * fp8.num_gpu_blocks, 2 * fp8.num_gpu_blocks + 1)
    assert fp8.warnings == () and fp8.gemm.precision == "fp8"
    params = both.params()
    assert (params["quantization"], params["kv_cache_dtype"], params["kv_dtype_bytes"]) == ("fp8", "fp8", 1)
    assert both.memory.summary()["quantization"].startswith("fp8 (per-tensor scales; from --quantization")


@pytest.mark.parametrize("gpu, method, precision, warned", [
    ("a100-80g", "fp8", "16-bit", "FP8 Marlin (W8A16"),     # Ampere: vLLM's weight-only FP8 Marlin
    ("l40s", "fp8", "fp8", None),                          # Ada has FP8 tensor cores
    ("h100", "nvfp4", "16-bit", "FP4 Marlin (W4A16"),       # Hopper has no FP4 tensor cores
    ("b200", "nvfp4", "fp4", None),
    ("rtx-pro-6000", "nvfp4", "fp4", None),
    ("h100", "mxfp4", "16-bit", "MoE experts"),
    ("a100-80g", "awq", "16-bit", None),                   # AWQ Marlin is the native path
])
def test_what_vllm_runs_where_and_the_warning(gpu, method, precision, warned):
    plan = plan_deployment(Deployment(model="llama-3.1-8b", gpu=gpu, quantization=method, max_model_len=8192,
                                      policy="vllm-v1"))
    assert plan.gemm.precision == precision
    if warned is None:
        assert plan.warnings == ()
    else:
        assert len(plan.warnings) == 1 and warned in plan.warnings[0]


def test_a100_fp8_warns_as_vllm_and_prices_weight_only():
    d = Deployment(model="llama-3.1-8b", gpu="a100-80g", quantization="fp8", kv_cache_dtype="fp8",
                   max_model_len=8192, policy="vllm-v1")
    plan = plan_deployment(d)
    assert "Your GPU does not have native support for FP8 computation" in plan.warnings[0]
    assert "FlashInfer or Triton" in plan.warnings[1]
    cost = select_cost_model(plan.model, plan.gpu, weight_format=plan.weight_format, kv_cache_dtype="fp8")
    assert isinstance(cost, MeasuredCostModel)
    assert "weight-only GEMMs" in cost.name and "fp8 KV priced as bf16 KV" in cost.name
    bf16 = MeasuredCostModel("llama-3.1-8b", "a100-80g")
    decode = StepShape(0, 0, 0, 8, 8 * 1024, 0, 0)
    assert cost.step_time(decode) < bf16.step_time(decode)      # fewer weight bytes to read
    # compute-bound: a weight-only kernel does the same 16-bit math
    assert cost.layer_gemm(8192, 4096, 4096) == pytest.approx(bf16.gemm(8192, 4096, 4096))


def test_h100_fp8_uses_the_fp8_tables():
    plan = plan_deployment(Deployment(model="llama-3.1-8b", gpu="h100", quantization="fp8", kv_cache_dtype="fp8",
                                      max_model_len=8192, policy="vllm-v1"))
    cost = select_cost_model(plan.model, plan.gpu, weight_format=plan.weight_format, kv_cache_dtype="fp8")
    tables = cost.describe()["tables"]
    assert tables == {"layer_gemm": "gemm_fp8", "context": "context_attention_fp8kv",
                      "generation": "generation_attention_fp8kv"}
    assert cost.name.endswith("fp8: fp8 GEMMs, fp8 KV)")
    bf16 = MeasuredCostModel("llama-3.1-8b", "h100")
    # the layers' GEMMs come from the fp8 table, the LM head stays bf16
    assert cost.layer_gemm(2048, 6144, 4096) < bf16.layer_gemm(2048, 6144, 4096)
    assert cost.gemm(32, 128256, 4096) == bf16.gemm(32, 128256, 4096)
    decode = StepShape(0, 0, 0, 64, 64 * 4096, 0, 0)
    assert cost.decode_attention(decode) < bf16.decode_attention(decode)
    # block-scaled FP8 runs the same FP8 GEMM (NVIDIA's block-scaled rows time an eager per-call cost)
    block = MeasuredCostModel("llama-3.1-8b", "h100", weight_format=WeightFormat("fp8", "fp8-block"))
    assert block.describe()["tables"]["layer_gemm"] == "gemm_fp8"
    assert block.layer_gemm(16, 6144, 4096) == cost.layer_gemm(16, 6144, 4096)
    nvfp4 = MeasuredCostModel("llama-3.1-8b", "b200", weight_format=weight_format("nvfp4"))
    assert nvfp4.describe()["tables"]["layer_gemm"] == "gemm_nvfp4"


def test_roofline_reads_the_formats_bytes_at_their_peak():
    bf16 = RooflineCostModel("llama-3.1-8b", "h100")
    fp8 = RooflineCostModel("llama-3.1-8b", "h100", weight_format=weight_format("fp8"), kv_cache_dtype="fp8")
    assert fp8._linear_weights == pytest.approx(bf16._linear_weights / 2, rel=1e-5)
    assert fp8._linear_per_token == pytest.approx(bf16._linear_per_token * 989.4 / 1978)   # FP8 peak, datasheet
    assert fp8._decode_per_key == pytest.approx(bf16._decode_per_key / 2)
    marlin = RooflineCostModel("llama-3.1-8b", "h100", weight_format=weight_format("nvfp4"))
    assert marlin.linear_precision == "16-bit" and marlin._linear_per_token == bf16._linear_per_token
    assert marlin._linear_weights == pytest.approx(bf16._linear_weights * 0.5625 / 2, rel=1e-4)


def test_calibrated_profile_is_refused_for_another_format(tmp_path, monkeypatch):
    monkeypatch.setenv("PLANNER_PROFILE_DIR", str(tmp_path))
    (tmp_path / "cpu").mkdir()
    shipped = Path(__file__).parent.parent / "profiles" / "cpu" / "opt-125m.json"
    (tmp_path / "cpu" / "opt-125m.json").write_text(shipped.read_text())
    opt, cpu = resolve_model("opt-125m"), resolve_gpu("cpu")
    with pytest.raises(PlannerError, match="cannot price --quantization fp8"):
        select_cost_model(opt, cpu, cost_model="calibrated", weight_format=weight_format("fp8"))
    with pytest.raises(PlannerError, match="timed with \\(auto\\), not --kv-cache-dtype fp8"):
        select_cost_model(opt, cpu, profile=tmp_path / "cpu" / "opt-125m.json", kv_cache_dtype="fp8")
    fallback = select_cost_model(opt, cpu, kv_cache_dtype="fp8")      # auto: passed over, and said why
    assert isinstance(fallback, RooflineCostModel) and "passed over" in fallback.profile_note


def test_the_checkpoints_config_sets_the_format(tmp_path):
    folder = tmp_path / "llama-fp8"
    folder.mkdir()
    config = resolve_model("llama-3.1-8b").to_hf_config().to_dict()
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic",
                                     "weight_block_size": [128, 128]}
    (folder / "config.json").write_text(json.dumps(config))
    plan = plan_deployment(Deployment(model=str(folder), gpu="h100", max_model_len=8192, policy="vllm-v1"))
    assert plan.weight_format.scheme == "fp8-block" and "config.json quantization_config" in plan.weight_format.source
    same = plan_deployment(Deployment(model=str(folder / "config.json"), gpu="h100", quantization="fp8",
                                      max_model_len=8192, policy="vllm-v1"))
    assert same.weight_format == plan.weight_format
    with pytest.raises(PlannerError, match=r"model config \(fp8\) does not match .* argument \(awq\)"):
        plan_deployment(Deployment(model=str(folder), gpu="h100", quantization="awq"))


@pytest.mark.parametrize("qc, method, scheme, bytes_4096", [
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}, "awq", "int-group", 8_716_288),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True, "sym": True}, "gptq", "int-group",
     8_650_752 + 8 * 4096),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "nvfp4", "nvfp4", 9_437_192),
    ({"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}, "fp8", "fp8-tensor", 16_777_224),
    ({"quant_method": "compressed-tensors", "config_groups": {"group_0": {"weights": {
        "num_bits": 8, "type": "float", "strategy": "channel"}}}}, "fp8", "fp8-channel", 16_777_216 + 4 * 4096),
    ({"quant_method": "mxfp4"}, "mxfp4", "mxfp4", 8_912_896),
])
def test_configs_read_as_vllm_reads_them(qc, method, scheme, bytes_4096):
    fmt = format_from_config(qc)
    assert (fmt.method, fmt.scheme, fmt.matrix_bytes(4096, 4096)) == (method, scheme, bytes_4096)


def test_unknown_configs_and_ids():
    with pytest.raises(PlannerError, match="quant_method 'bitsandbytes' is not one the planner knows"):
        format_from_config({"quant_method": "bitsandbytes"})
    assert format_from_id("nvidia/Llama-3.1-8B-Instruct-FP8").method == "fp8"
    assert format_from_id("RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8-dynamic").scheme == "fp8-channel"
    assert format_from_id("hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4").method == "awq"
    assert format_from_id("meta-llama/Llama-3.1-8B-Instruct") is None
    plan = plan_deployment(Deployment(model="nvidia/Llama-3.1-8B-Instruct-FP8", gpu="h100", max_model_len=8192,
                                      policy="vllm-v1"))
    assert plan.model.name == "llama-3.1-8b" and plan.weight_format.method == "fp8"
    assert "model id" in plan.weight_format.source
    assert gemm_path(weight_format("gptq"), resolve_gpu("h100")).kernel == "GPTQ Marlin (W4A16)"


def test_deployment_checks_the_names():
    assert Deployment(kv_cache_dtype="fp8_e4m3").kv_cache_dtype == "fp8"
    with pytest.raises(ValueError, match="quantization 'int3' is not supported; choose one of fp8, nvfp4"):
        Deployment(quantization="int3")
    with pytest.raises(ValueError, match="fp8_e5m2"):
        Deployment(kv_cache_dtype="fp8_e5m2")


def test_cli_flags_reach_the_plan_and_result(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100", "--quantization", "fp8",
                                 "--kv-cache-dtype", "fp8", "--policy", "vllm-v1", "--max-model-len", "4096",
                                 "--requests", "20", "--rate", "4", "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["deployment"]["quantization"] == "fp8" and doc["deployment"]["kv_cache_dtype"] == "fp8"
    assert doc["params"]["kv_dtype_bytes"] == 1 and doc["memory_plan"]["kv_dtype_bytes"] == 1
    assert "fp8: fp8 GEMMs, fp8 KV" in doc["cost_model"]
    bad = runner.invoke(app, ["simulate", "--quantization", "int3", "--requests", "5", "--out", str(tmp_path)])
    assert bad.exit_code == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.output
    warned = runner.invoke(app, ["simulate", "--model", "llama-3.1-8b", "--gpu", "a100-80g", "-q", "fp8",
                                 "--max-model-len", "4096", "--requests", "10", "--out", str(tmp_path), "--json"])
    assert warned.exit_code == 0, warned.output
    doc = json.loads(warned.stdout)
    assert any("FP8 Marlin" in w for w in doc["warnings"])
    assert any(n.startswith("weight-only kernels (Marlin)") for n in doc["not_modelled"])


def test_a_qwen_fp8_id_not_on_record_is_block_scaled_as_qwens_releases_are():
    # Qwen/Qwen3-235B-A22B-Instruct-2507-FP8 was priced as per-tensor FP8, whose Hopper MoE kernel NVIDIA timed
    # at 3-7x the roofline: 25.8 ms of experts a decode step where the block-FP8 release takes 5.5
    fmt = format_from_id("Qwen/Qwen3-235B-A22B-Instruct-2507-FP8")
    assert fmt.scheme == "fp8-block" and "block size of 128" in fmt.source
    assert format_from_id("deepseek-ai/DeepSeek-V3.1-FP8").scheme == "fp8-block"
    assert format_from_id("nvidia/Llama-3.1-8B-Instruct-FP8").scheme == "fp8-tensor"     # ModelOpt: per tensor
    plan = plan_deployment(Deployment(model="Qwen/Qwen3-235B-A22B-Instruct-2507-FP8", gpu="h200", tp=8,
                                      enable_expert_parallel=True))
    recorded = plan_deployment(Deployment(model="Qwen/Qwen3-235B-A22B-FP8", gpu="h200", tp=8,
                                          enable_expert_parallel=True))
    assert plan.weight_format.scheme == recorded.weight_format.scheme == "fp8-block"
    with pytest.raises(PlannerError, match="128"):          # its 1536-wide experts split 8 ways: 192, as vLLM refuses
        plan_deployment(Deployment(model="Qwen/Qwen3-235B-A22B-Instruct-2507-FP8", gpu="h200", tp=8))
