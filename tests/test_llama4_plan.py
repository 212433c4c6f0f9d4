"""Llama 4 Scout and Maverick in the planner: ids, counts, chunked attention, the measured model's MoE rows."""
import json

import pytest

from planner.catalog import resolve_model
from planner.catalog.models import ModelSpec
from planner.cost.measured import MeasuredCostModel
from planner.cost.shape import StepShape
from planner.errors import PlannerError


def test_ids_resolve():
    assert resolve_model("meta-llama/Llama-4-Scout-17B-16E-Instruct").name == "llama-4-scout"
    assert resolve_model("meta-llama/Llama-4-Maverick-17B-128E-Instruct-FP8").name == "llama-4-maverick"


@pytest.mark.parametrize("name, experts, step", [("llama-4-scout", 16, 1), ("llama-4-maverick", 128, 2)])
def test_a_released_config_counts_like_transformers(tmp_path, name, experts, step):
    """The multimodal config.json (text_config + vision_config) counts what transformers' whole model holds,
    the vision encoder and projector included, and reads back to the catalog's entry."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    entry = resolve_model(name)
    config = transformers.Llama4Config(text_config=dict(num_local_experts=experts, interleave_moe_layer_step=step,
                                                        max_position_embeddings=entry.max_position_embeddings))
    with torch.device("meta"):
        hf = transformers.Llama4ForConditionalGeneration(config)
    path = tmp_path / name / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config.to_dict()))
    spec = resolve_model(str(path))
    assert spec.num_params == sum(p.numel() for p in hf.parameters()) == entry.num_params
    assert spec.vision_params == entry.vision_params == 455_178_240
    assert (spec.num_experts, spec.moe_layers, spec.shared_experts) == (experts, 48 // step, 1)
    assert (spec.sliding_layers, spec.sliding_window) == (36, 8192)


def test_chunked_layers_keep_at_most_a_chunk():
    m = resolve_model("llama-4-scout")
    per_layer = 2 * 8 * 128 * 2
    assert m.kv_bytes_per_context(4000) == 48 * 4000 * per_layer
    assert m.kv_bytes_per_context(20000) == (12 * 20000 + 36 * 8192) * per_layer


def test_a_config_without_shapes_is_named():
    with pytest.raises(PlannerError, match="hidden_size"):
        ModelSpec.from_hf_config({"model_type": "llama4", "text_config": {"num_hidden_layers": 4}}, name="bad")


def test_measured_model_prices_experts_and_shared_expert_from_tables():
    model = MeasuredCostModel("llama-4-scout", "h100", tp=4)
    names = {t.name: t for t in model.ledger(StepShape(decode_seqs=16, decode_context=16 * 2048)).terms}
    assert names["experts (fused MoE)"].source == "table" and "top-1 of 16" in names["experts (fused MoE)"].detail
    assert names["shared expert gate+up GEMM"].detail.endswith("x48 layers")
    assert "gate+up GEMM" not in names          # Scout has no dense layer
