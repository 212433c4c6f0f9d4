"""Gemma 2 in the planner: Gemma 3's block without q/k norms, every other layer sliding, soft-capped logits."""
import json

import pytest

from planner.catalog import resolve_model
from planner.cost.elementwise import step_kernels
from planner.cost.measured import MeasuredCostModel
from planner.cost.shape import StepShape

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("name", ["gemma-2-2b", "gemma-2-27b"])
def test_a_released_config_counts_like_transformers(tmp_path, name):
    entry = resolve_model(name)
    config = transformers.Gemma2Config(
        hidden_size=entry.hidden_size, num_hidden_layers=entry.num_layers, num_attention_heads=entry.num_heads,
        num_key_value_heads=entry.num_kv_heads, head_dim=entry.head_size, intermediate_size=entry.intermediate_size)
    with torch.device("meta"):
        hf = transformers.Gemma2ForCausalLM(config)
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(config.to_json_string())
    spec = resolve_model(str(folder))
    assert spec.num_params == sum(p.numel() for p in hf.parameters()) == entry.num_params
    assert (spec.model_type, spec.sliding_layers, spec.sliding_window) == ("gemma2", entry.num_layers // 2, 4096)
    assert spec.qk_norm is None


def test_half_the_layers_keep_at_most_the_window():
    m = resolve_model("gemma-2-9b")
    per_layer = 2 * 8 * 256 * 2
    assert m.kv_bytes_per_context(8000) == (21 * 8000 + 21 * 4096) * per_layer


def test_measured_model_prices_gemmas_block():
    model = MeasuredCostModel("gemma-2-9b", "h100-sxm")
    names = {t.name for t in model.ledger(StepShape(decode_seqs=8, decode_context=8 * 6000)).terms}
    assert {"embedding scale", "GELU-tanh and mul", "post-feedforward RMSNorm"} <= names
    assert "q/k RMSNorm" not in names
    assert {k.name for k in step_kernels(resolve_model("gemma-2-9b"), 1, 2)} <= names
