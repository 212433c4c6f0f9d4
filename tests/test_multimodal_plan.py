"""Vision-language checkpoints in the planner: the text decoder read as its own architecture, the vision encoder
and projector counted into the weights, exactly as transformers builds the whole model."""
import json

import pytest

from engine.deployment import Deployment
from planner.api import run_spec
from planner.catalog import resolve_model
from planner.errors import PlannerError
from planner.runs.pipeline import Simulation

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# model_type -> (its config's overrides, the architecture its decoder is read as)
CASES = {
    "qwen3_vl_moe": ({}, "qwen3_moe"),
    "qwen3_vl": ({}, "qwen3"),
    "qwen2_5_vl": ({}, "qwen2"),
    "mistral3": ({}, "mistral"),
    "llava": ({}, "llama"),
    "glm4v_moe": ({"text_config": {"head_dim": 128}}, "glm4_moe"),   # GLM-4.5V's heads
    # Kimi-K2.5: a MoonViT encoder beside DeepSeek-V3's decoder, here two layers of it with 16 experts
    "kimi_k25": ({"text_config": {"num_hidden_layers": 2, "n_routed_experts": 16, "first_k_dense_replace": 1}},
                 "deepseek_v3"),
}


def saved(tmp_path, name: str, fields: dict) -> str:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(fields))
    return str(folder)


@pytest.mark.parametrize("kind", list(CASES))
def test_a_vision_language_config_counts_like_transformers(tmp_path, kind):
    overrides, decoder = CASES[kind]
    config = transformers.AutoConfig.for_model(kind, **overrides)
    with torch.device("meta"):
        model = transformers.AutoModelForImageTextToText.from_config(config)
    spec = resolve_model(saved(tmp_path, kind, json.loads(config.to_json_string())))
    assert spec.model_type == decoder
    assert spec.num_params == sum(p.numel() for p in model.parameters())
    vision = sum(p.numel() for n, p in model.named_parameters() if "language_model" not in n and "lm_head" not in n)
    assert spec.vision_params == vision > 0


def test_a_flat_qwen2_5_vl_config_reads_the_same(tmp_path):
    """Qwen2.5-VL's released config.json keeps the text fields at the top level beside vision_config."""
    nested = json.loads(transformers.Qwen2_5_VLConfig().to_json_string())
    flat = {**nested.pop("text_config"), **nested, "model_type": "qwen2_5_vl"}
    a = resolve_model(saved(tmp_path, "nested", json.loads(transformers.Qwen2_5_VLConfig().to_json_string())))
    b = resolve_model(saved(tmp_path, "flat", flat))
    assert (a.num_params, a.vision_params, a.num_layers) == (b.num_params, b.vision_params, b.num_layers)


def test_a_broken_text_config_is_named_in_one_line(tmp_path):
    fields = json.loads(transformers.Qwen3VLConfig().to_json_string())
    fields["text_config"]["num_hidden_layers"] = "two"
    with pytest.raises(PlannerError, match="num_hidden_layers") as info:
        resolve_model(saved(tmp_path, "bad", fields))
    assert "\n" not in str(info.value)


def test_the_vision_weights_take_memory_and_the_run_simulates(tmp_path):
    fields = json.loads(transformers.Qwen3VLMoeConfig().to_json_string())
    folder = saved(tmp_path, "Qwen3-VL-MoE", fields)
    spec = run_spec(Deployment(model=folder, gpu="h100-sxm", max_model_len=4096), workload="random",
                    concurrency=4, requests=8)
    simulation = Simulation.prepare(spec)
    model = resolve_model(folder)
    assert model.vision_params > 0
    # bf16 weights on one GPU: the decoder's and the vision tower's (and the rotary table beside them)
    assert simulation.plan.memory.weight_bytes_per_gpu >= 2 * model.num_params
    assert simulation.simulate().metrics.num_completed == 8
