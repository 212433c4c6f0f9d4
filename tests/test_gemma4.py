"""Gemma 4 (full-attention layers with heads of their own shape, the key as value, experts beside a dense MLP):
config reading, memory, and what each cost model prices (planner/catalog/gemma4.py)."""
import dataclasses

import pytest
from typer.testing import CliRunner

from planner.catalog import resolve_model
from planner.catalog.kept_layers import kept_fractions
from planner.catalog.models import ModelSpec
from planner.catalog.quantization import recorded_format
from planner.cli.app import app
from planner.cost.measured import MeasuredCostModel
from planner.cost.shape import StepShape
from planner.deploy.memory import kv_block_layout
from planner.errors import PlannerError

# a small Gemma 4 config.json as Google ships them: a text_config with both kinds of layer and experts, and a
# vision tower
TEXT = {"model_type": "gemma4_text", "hidden_size": 256, "num_hidden_layers": 6, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 64, "global_head_dim": 128, "num_global_key_value_heads": 1,
        "attention_k_eq_v": True, "intermediate_size": 384, "vocab_size": 1000, "max_position_embeddings": 4096,
        "sliding_window": 128, "layer_types": ["sliding_attention"] * 2 + ["full_attention"]
        + ["sliding_attention"] * 2 + ["full_attention"], "hidden_size_per_layer_input": 0,
        "num_kv_shared_layers": 0, "enable_moe_block": True, "num_experts": 8, "top_k_experts": 2,
        "moe_intermediate_size": 96, "tie_word_embeddings": True}
VISION = {"model_type": "gemma4_vision", "hidden_size": 96, "intermediate_size": 192, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 24, "patch_size": 16,
          "position_embedding_size": 512}
SMALL = {"model_type": "gemma4", "text_config": TEXT, "vision_config": VISION, "tie_word_embeddings": True}


def _transformers_count(config: dict) -> int:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    fields = {k: v for k, v in config.items() if k != "model_type"}
    with torch.device("meta"):
        model = transformers.Gemma4ForConditionalGeneration(transformers.Gemma4Config(**fields))
    return sum(p.numel() for p in model.parameters())


def test_config_counted_as_transformers_builds_it():
    spec = ModelSpec.from_hf_config(SMALL, "small")
    g = spec.global_attention
    assert (spec.sliding_layers, spec.full_attention_layers, spec.head_size, spec.num_kv_heads) == (4, 2, 64, 2)
    assert (g.head_size, g.kv_heads, g.k_eq_v) == (128, 1, True)
    assert spec.is_moe and spec.shared_expert_width == 384 and spec.norms_per_layer == 7
    # the checkpoint has no V projection on its full layers; vLLM holds one, filled with the key's weights
    assert spec.num_params == _transformers_count(SMALL)
    assert spec.copied_value_params == 2 * 128 * 256
    dense_text = {k: v for k, v in TEXT.items() if k not in ("num_experts", "top_k_experts", "moe_intermediate_size")}
    dense = dict(SMALL, text_config=dict(dense_text, enable_moe_block=False, attention_k_eq_v=False))
    d = ModelSpec.from_hf_config(dense, "dense")
    assert not d.is_moe and d.norms_per_layer == 4 and d.num_params == _transformers_count(dense)
    assert d.copied_value_params == 0


def test_transformers_config_reads_back():
    """transformers 5 writes the full layers' shape into per_layer_config; that reads as config.json does."""
    spec = ModelSpec.from_hf_config(SMALL, "small")
    back = ModelSpec.from_hf_config(spec.to_hf_config(), "small")
    assert dataclasses.replace(back, vision_params=spec.vision_params) == spec


@pytest.mark.parametrize("change, words", [
    ({"hidden_size_per_layer_input": 256}, "per-layer input embeddings"),
    ({"num_kv_shared_layers": 2}, "KV shared"),
    ({"layer_types": ["sliding_attention"] * 5}, "layer_types"),
    ({"global_head_dim": 128, "num_global_key_value_heads": 3}, "divide"),
])
def test_unmodelled_or_broken_configs_refused(change, words):
    with pytest.raises(PlannerError, match=words):
        ModelSpec.from_hf_config(dict(SMALL, text_config=dict(TEXT, **change)), "small")


def test_cli_refuses_a_small_gemma4_in_one_line(tmp_path):
    import json
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(SMALL, text_config=dict(TEXT, hidden_size_per_layer_input=256))))
    result = CliRunner().invoke(app, ["simulate", "--model", str(path), "--gpu", "h100", "--workload", "random",
                                      "--requests", "4"])
    assert result.exit_code != 0 and "E2B and E4B" in result.output and "Traceback" not in result.output


def test_catalog_counts_and_ids():
    moe, dense = resolve_model("google/gemma-4-26B-A4B-it"), resolve_model("nvidia/Gemma-4-31B-IT-NVFP4")
    assert (moe.name, dense.name) == ("gemma-4-26b-a4b", "gemma-4-31b")
    assert moe.num_params == 25_805_933_872 and dense.num_params == 31_273_086_512
    assert moe.active_params - moe.vision_params == pytest.approx(moe.published_active_params, rel=0.01)   # the card: 3.8B


def test_kv_cache_per_kind_of_layer():
    m = resolve_model("gemma-4-26b-a4b")            # 5 full layers (2 KV heads of 512), 25 sliding (8 of 256)
    assert m.kv_bytes_per_token(2) == 5 * 2 * 2 * 512 * 2 + 25 * 2 * 8 * 256 * 2
    assert m.kv_bytes_per_context(8192) == 5 * 8192 * 4096 + 25 * 1024 * 8192
    assert m.flops_per_token(4096) - m.flops_per_token(0) == (5 * 4 * 16 * 512 * 4096 + 25 * 4 * 16 * 256 * 1024)
    block, reserve = kv_block_layout(m, tp=2, kv_dtype_bytes=2, block_size=16, max_num_seqs=8)
    assert block == 5 * 16 * 2 * 1 * 512 * 2                    # a block holds the full layers' K and V
    assert reserve == 8 * (64 + 1) * 25 * 16 * 2 * 4 * 256 * 2  # the windows of 8 sequences' sliding layers


def test_weights_hold_the_copied_values():
    dense = resolve_model("gemma-4-31b")
    assert dense.weight_bytes_per_gpu(1) == 2 * (dense.num_params + dense.copied_value_params)
    assert dense.copied_value_params == 10 * 4 * 512 * 5376


def test_nvfp4_releases_keep_their_attention_and_mlps_in_16_bits():
    moe = resolve_model("gemma-4-26b-a4b")
    fmt = recorded_format("nvidia/Gemma-4-26B-A4B-NVFP4")
    kept = kept_fractions(moe, fmt.excluded)
    assert set(kept["attention"]) == {1.0} and set(kept["shared_experts"]) == {1.0}
    dense = resolve_model("gemma-4-31b")
    kept = kept_fractions(dense, recorded_format("nvidia/Gemma-4-31B-IT-NVFP4").excluded)
    assert set(kept["attention"]) == {1.0} and "mlp" not in kept


def _measured(model, tp=1):
    return MeasuredCostModel(model, "h100", tp=tp)


def test_measured_attention_each_kind_at_its_own_table():
    """Within the window every layer reads every key, so the model's attention is its full layers' share of
    a model whose layers all have the full layers' heads and its sliding layers' share of one whose all have
    the sliding layers' heads."""
    m = resolve_model("gemma-4-26b-a4b")
    g = m.global_attention
    wide = dataclasses.replace(m, head_size=g.head_size, num_kv_heads=g.kv_heads, global_attention=None)
    narrow = dataclasses.replace(m, global_attention=None)
    costs = [_measured(x) for x in (m, wide, narrow)]
    decode = StepShape(decode_seqs=32, decode_context=32 * 1000)
    prefill = StepShape(prefill_seqs=2, prefill_tokens=1000, prefill_attn_pairs=2 * 500 * 501)
    for step, price in ((decode, "decode_attention"), (prefill, "_prefill_attention")):
        mixed, full, sliding = (getattr(c, price)(step) for c in costs)
        assert mixed == pytest.approx((5 * full + 25 * sliding) / 30, rel=1e-9)
        assert full != pytest.approx(sliding, rel=0.05)      # the 512-wide heads are timed apart


def test_ledger_names_each_kind_and_three_allreduces_a_layer():
    terms = {t.name: t for t in _measured(resolve_model("gemma-4-26b-a4b"), tp=2).ledger(
        StepShape(decode_seqs=8, decode_context=8 * 2048)).terms}
    assert {"qkv (full layers) GEMM", "qkv (sliding layers) GEMM", "MLP gate+up GEMM", "experts (fused MoE)",
            "KV-cache write (full layers)", "q/k/v RMSNorm (sliding layers)"} <= set(terms)
    assert "n=5120 k=2816, x5 layers" in terms["qkv (full layers) GEMM"].detail    # (8 + 2 x 1) x 512 per GPU
    assert terms["all-reduce"].count == 3 * 30 + 1
    dense = {t.name: t for t in _measured(resolve_model("gemma-4-31b"), tp=2).ledger(
        StepShape(decode_seqs=8, decode_context=8 * 2048)).terms}
    assert dense["all-reduce"].count == 2 * 60 + 1 and "MLP gate+up GEMM" not in dense


def test_cli_simulates_gemma4():
    result = CliRunner().invoke(app, ["simulate", "--model", "google/gemma-4-26B-A4B-it", "--gpu", "h100",
                                      "--tp", "2", "--workload", "random", "--concurrency", "8", "--requests", "16",
                                      "--max-model-len", "8192"])
    assert result.exit_code == 0, result.output
    assert "TPOT mean" in result.output
