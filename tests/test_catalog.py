"""Hardware and model catalogs: names resolve, numbers are the published ones, HF configs round-trip."""

import dataclasses
import json

import pytest

from decilm_reference import decilm_model
from planner.catalog import GIB, ModelSpec, gpu_variant_for_memory, list_gpus, list_models, resolve_gpu, resolve_model
from planner.errors import PlannerError

REQUIRED_GPUS = ["a100-40g", "a100-80g", "h100-sxm", "h200", "l4", "a10g", "cpu"]
REQUIRED_MODELS = ["opt-125m", "opt-1.3b", "opt-6.7b", "opt-13b", "opt-30b", "opt-66b", "opt-175b",
                   "llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b", "mistral-7b", "gpt2"]


# ---- GPUs -------------------------------------------------------------------

def test_required_gpus_present_with_sources():
    names = {g.name for g in list_gpus()}
    assert set(REQUIRED_GPUS) <= names
    for g in list_gpus():
        assert g.source, g.name
        assert g.memory_bytes > 0 and g.memory_bandwidth > 0 and g.host_link_bandwidth > 0
        if g.kind == "gpu":
            assert g.fp16_flops > g.fp32_flops, g.name       # tensor cores beat plain FP32
            assert g.interconnect_bandwidth > 0


def test_datasheet_numbers():
    a100 = resolve_gpu("a100-40g")
    assert a100.memory_bytes == 40536 * 2**20          # what torch reports, not the nominal 40 GiB
    assert a100.memory_bandwidth == pytest.approx(1.555e12)
    assert a100.fp16_flops == pytest.approx(312e12)
    assert resolve_gpu("h100-sxm").fp16_flops == pytest.approx(989.4e12)   # dense, not the sparse 1979
    assert resolve_gpu("a100-80g").memory_bandwidth > a100.memory_bandwidth
    assert a100.peak_flops(4) == a100.fp32_flops
    with pytest.raises(PlannerError):
        a100.peak_flops(3)


def test_memory_is_what_torch_reports_not_the_marketing_size():
    # L4 and A10G are sold as 24 GB; CUDA sees about 22 GiB (issue 13, defect 6)
    for name in ("l4", "a10g"):
        assert 21.5 * GIB < resolve_gpu(name).memory_bytes < 22.5 * GIB
    assert resolve_gpu("rtx-4090").memory_bytes == 25_250_627_584
    for g in list_gpus():
        if g.kind == "gpu":
            assert g.memory_bytes < 1.0 * round(g.memory_bytes / GIB + 2) * GIB and g.memory_source, g.name


@pytest.mark.parametrize("alias, name", [("a100", "a100-40g"), ("h100", "h100-sxm"), ("A100-40G", "a100-40g"),
                                         ("a100_80gb", "a100-80g")])
def test_gpu_aliases(alias, name):
    assert resolve_gpu(alias).name == name


def test_unknown_gpu_lists_known_names():
    with pytest.raises(PlannerError, match=r"unknown GPU 'a1000'; known: a100-40g, .*h200"):
        resolve_gpu("a1000")


@pytest.mark.parametrize("device, reported, expected", [
    ("a100", 42_505_273_344, "a100-40g"),                       # what torch reports for a 40 GB A100
    ("NVIDIA A100-SXM4-80GB", 85_198_045_184, "a100-80g"),
    ("NVIDIA A100-SXM4-40GB", 42_505_273_344, "a100-40g"),
    ("NVIDIA H100 80GB HBM3", 85_520_809_984, "h100-sxm"),
    ("NVIDIA H200", 150_754_820_096, "h200"),
    ("NVIDIA L4", 23_580_639_232, "l4"),
])
def test_gpu_variant_for_memory(device, reported, expected):
    assert gpu_variant_for_memory(device, reported).name == expected


def test_gpu_variant_rejects_unknown_family_and_near_names():
    assert gpu_variant_for_memory("NVIDIA L40S", 48 * GIB).name == "l40s"   # must not match "l4"
    with pytest.raises(PlannerError, match="unknown GPU family"):
        gpu_variant_for_memory("Tesla V100-SXM2-32GB", 32 * GIB)
    with pytest.raises(PlannerError):
        gpu_variant_for_memory("a100", 0)


# ---- models -----------------------------------------------------------------

def test_required_models_present():
    assert set(REQUIRED_MODELS) <= {m.name for m in list_models()}


@pytest.mark.parametrize("model", list_models(), ids=lambda m: m.name)
def test_param_count_matches_published(model):
    # computed from the shapes; some published sizes are rounded ("13B", "8.2B"), the others are exact
    assert model.num_params == pytest.approx(model.published_params, rel=0.03)
    if model.published_params % 10**6:
        assert model.num_params == model.published_params


def test_kv_bytes_per_token():
    assert resolve_model("opt-13b").kv_bytes_per_token(2) == 800 * 1024     # the paper's 800 KB
    assert resolve_model("llama-2-70b").kv_bytes_per_token(2) == 2 * 80 * 8 * 128 * 2   # GQA: 8 KV heads
    assert resolve_model("opt-13b").kv_bytes_per_token(4) == 2 * 800 * 1024


def test_weight_bytes_and_flops():
    m = resolve_model("opt-13b")
    assert m.weight_bytes(2) == 2 * m.num_params
    # ~2 FLOPs per parameter per token, attention adds with context
    assert m.flops_per_token() == pytest.approx(2 * m.num_params, rel=0.02)
    assert m.flops_per_token(1000) - m.flops_per_token() == 4 * 40 * 5120 * 1000
    # TP shards everything but norms, position table and row-parallel biases, which each GPU holds whole
    assert m.weight_bytes_per_gpu(4) * 4 - m.weight_bytes() == 3 * m.replicated_params * 2
    assert 0 < m.replicated_params < 0.002 * m.num_params
    assert m.weight_bytes_per_gpu(1) == m.weight_bytes()


@pytest.mark.parametrize("name, expected", [("facebook/opt-13b", "opt-13b"), ("Llama-2-7b-hf", "llama-2-7b"),
                                            ("OPT-125M", "opt-125m"), ("gpt2-small", "gpt2")])
def test_model_lookup_by_alias_and_hf_id(name, expected):
    assert resolve_model(name).name == expected


# Ids operators serve today, as `vllm serve` takes them; a fine-tune or distillation has its base model's shapes.
@pytest.mark.parametrize("name, expected", [
    ("Qwen/Qwen2.5-72B-Instruct", "qwen2.5-72b"), ("Qwen/Qwen2.5-32B-Instruct-AWQ", "qwen2.5-32b"),
    ("Qwen/Qwen2.5-14B", "qwen2.5-14b"), ("Qwen/QwQ-32B", "qwen2.5-32b"), ("Qwen/Qwen3-4B-Instruct-2507", "qwen3-4b"),
    ("Qwen/Qwen3-1.7B-FP8", "qwen3-1.7b"), ("mistralai/Mistral-Small-24B-Instruct-2501", "mistral-small-24b"),
    ("meta-llama/Llama-3.1-405B-Instruct-FP8", "llama-3.1-405b"),
    ("microsoft/phi-4", "phi-4"), ("microsoft/Phi-4-reasoning-plus", "phi-4"),
    ("mistralai/Mistral-Nemo-Instruct-2407", "mistral-nemo-12b"),
    ("deepseek-ai/DeepSeek-R1-Distill-Llama-70B", "llama-3.1-70b"),
    ("deepseek-ai/DeepSeek-R1-Distill-Llama-8B", "llama-3.1-8b"),
    ("deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", "qwen2.5-32b"),
    ("deepseek-ai/DeepSeek-R1-Distill-Qwen-14B", "qwen2.5-14b"),
    ("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", "qwen2.5-7b"),
])
def test_served_ids_resolve_to_their_architecture(name, expected):
    assert resolve_model(name).name == expected


def test_an_unknown_distillation_is_not_called_deepseek_v3():
    # DeepSeek-R1-Distill-Qwen-1.5B is a Qwen2.5 model: refusing it for MLA would be wrong
    with pytest.raises(PlannerError, match="base model's architecture") as info:
        resolve_model("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B")
    assert "MLA" not in str(info.value) and "DeepSeek-V3" not in str(info.value)


def test_unknown_model():
    """The error counts the catalog rather than listing it (the line stays readable) and says where it is shown."""
    with pytest.raises(PlannerError, match=r"unknown model 'opt-14b'; \d+ known \(planner list models shows") as info:
        resolve_model("opt-14b")
    assert len(str(info.value)) < 200 and "opt-125m" not in str(info.value)


def test_invalid_shapes_rejected():
    m = resolve_model("llama-2-70b")
    with pytest.raises(PlannerError):
        dataclasses.replace(m, num_kv_heads=7)
    with pytest.raises(PlannerError):
        dataclasses.replace(m, model_type="bloom")


# ---- Hugging Face configs ---------------------------------------------------

@pytest.mark.parametrize("model", list_models(), ids=lambda m: m.name)
def test_hf_config_builds_the_counted_model(model):
    """A one-layer model built (on the meta device, no memory) from the config has exactly the
    parameters the spec counts for one layer, and the config reads back to the same spec."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    # Nemotron-H, Gemma 4, MiMo-V2-Flash, DeepSeek-V4: every layer, whole (on the meta device)
    if model.block_pattern or model.global_attention or model.compressed_attention:
        with torch.device("meta"):
            # a DeciLM (Llama-Nemotron Super) from Llama's parts: transformers has no class for it
            hf = (decilm_model(model.to_hf_config()) if model.model_type == "nemotron-nas" else
                  transformers.AutoModelForCausalLM.from_config(model.to_hf_config()))
        assert sum(p.numel() for p in hf.parameters()) == model.num_params - model.vision_params
        back = ModelSpec.from_hf_config(model.to_hf_config(), name=model.name)
        assert dataclasses.replace(back, hf_id=model.hf_id, published_params=model.published_params,
                                   source=model.source, aliases=model.aliases, vision_params=model.vision_params,
                                   published_active_params=model.published_active_params,
                                   checkpoint_quantization=model.checkpoint_quantization) == model
        return
    # gpt-oss and Llama 4: their one layer a sliding (chunked) one
    sliding = "chunked_attention" if model.model_type == "llama4_text" else "sliding_attention"
    one_layer = dict(layer_types=[sliding]) if model.sliding_layers else {}
    if model.model_type in ("glm4_moe_lite", "deepseek_v32", "glm_moe_dsa"):
        one_layer["mlp_layer_types"] = ["sparse"]     # GLM-4.7-Flash, DeepSeek-V3.2, GLM-5 list their layers' kinds
    elif model.is_mla:
        one_layer["first_k_dense_replace"] = 0        # DeepSeek's one layer: a MoE one, with its shared expert
    layers = 1
    if model.linear_attention is not None:            # Qwen3.5: one period, three Gated DeltaNet layers and attention
        layers, one_layer["layer_types"] = 4, ["linear_attention"] * 3 + ["full_attention"]
    config = model.to_hf_config(num_hidden_layers=layers, **one_layer)
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(config)
    # the config is the text decoder's (a multimodal Gemma 3's vision tower is counted from its own config, below)
    one = dataclasses.replace(model, num_layers=layers, sliding_layers=min(1, model.sliding_layers), vision_params=0,
                              dense_layers=0 if model.is_mla else min(1, model.dense_layers),   # Maverick: layer 0 dense
                              linear_attention=model.linear_attention and dataclasses.replace(
                                  model.linear_attention, layers=layers - 1))
    assert sum(p.numel() for p in hf.parameters()) == one.num_params
    back = ModelSpec.from_hf_config(model.to_hf_config(), name=model.name)
    keep = dict(hf_id=model.hf_id, published_params=model.published_params, source=model.source,
                aliases=model.aliases, published_active_params=model.published_active_params,
                checkpoint_quantization=model.checkpoint_quantization,   # what config.json's shapes do not say
                vision_params=model.vision_params,                       # nor the text decoder's config
                # Kimi-K2 is DeepSeek-V3's architecture under its own model_type
                model_type="kimi_k2" if model.model_type == "kimi_k2" else back.model_type)
    assert dataclasses.replace(back, **keep) == model


def test_hf_config_types_and_overrides():
    transformers = pytest.importorskip("transformers")
    assert isinstance(resolve_model("opt-13b").to_hf_config(), transformers.OPTConfig)
    assert isinstance(resolve_model("gpt2").to_hf_config(), transformers.GPT2Config)
    assert isinstance(resolve_model("mistral-7b").to_hf_config(), transformers.MistralConfig)
    cfg = resolve_model("llama-3-8b").to_hf_config(num_hidden_layers=2)
    assert isinstance(cfg, transformers.LlamaConfig)
    assert (cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim) == (2, 8, 128)
    assert cfg.rope_parameters["rope_theta"] == 500000.0
    assert resolve_model("gpt2").to_hf_config(num_hidden_layers=1).n_layer == 1
    with pytest.raises(PlannerError, match="unknown config field"):
        resolve_model("opt-125m").to_hf_config(num_layerz=1)


def test_local_model_folder(tmp_path):
    config = resolve_model("mistral-7b").to_hf_config().to_dict()
    (tmp_path / "my-mistral").mkdir()
    (tmp_path / "my-mistral" / "config.json").write_text(json.dumps(config))
    spec = resolve_model(str(tmp_path / "my-mistral"))
    assert spec.name == "my-mistral"
    assert spec.num_params == resolve_model("mistral-7b").num_params
    assert spec.sliding_window == 4096
    with pytest.raises(PlannerError, match="no config.json"):
        ModelSpec.from_model_dir(tmp_path)


def test_a_damaged_or_incomplete_config_is_named_not_a_traceback(tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama", "hidden_size": ')
    for given in (folder, folder / "config.json"):
        with pytest.raises(PlannerError, match=r"broken/config.json: not valid JSON \(line 1"):
            resolve_model(str(given))
    config = resolve_model("llama-3.1-8b").to_hf_config().to_dict()
    for missing in ("num_attention_heads", "hidden_size"):
        (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != missing}))
        with pytest.raises(PlannerError, match=f"config field {missing} must be a positive integer, got None"):
            resolve_model(str(folder))
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": "32"}))
    with pytest.raises(PlannerError, match="num_layers must be a positive integer, got '32'"):
        resolve_model(str(folder))
    (folder / "config.json").write_text("[1, 2]")
    with pytest.raises(PlannerError, match="not a model config"):
        resolve_model(str(folder))
    with pytest.raises(PlannerError, match="no such config file or model folder"):
        resolve_model(str(tmp_path / "elsewhere" / "config.json"))


def test_a_config_file_under_another_name_is_read(tmp_path):
    config = resolve_model("qwen3-8b").to_hf_config().to_dict()
    (tmp_path / "qwen3-8b-variant.json").write_text(json.dumps(config))
    spec = resolve_model(str(tmp_path / "qwen3-8b-variant.json"))
    assert spec.name == "qwen3-8b-variant"
    assert spec.num_params == resolve_model("qwen3-8b").num_params


def test_unsupported_configs():
    opt350 = {"model_type": "opt", "hidden_size": 1024, "word_embed_proj_dim": 512, "num_attention_heads": 16,
              "num_hidden_layers": 24, "ffn_dim": 4096, "vocab_size": 50272, "max_position_embeddings": 2048,
              "do_layer_norm_before": False}
    with pytest.raises(PlannerError, match="not supported"):
        ModelSpec.from_hf_config(opt350, name="opt-350m")
    with pytest.raises(PlannerError, match="unsupported model_type 'bloom'"):
        ModelSpec.from_hf_config({"model_type": "bloom"})


@pytest.mark.parametrize("model, change, words", [
    ("qwen3-8b", {"rope_parameters": None, "rope_theta": "x"}, "could not convert string to float: 'x'"),
    ("glm-5", {"qk_rope_head_dim": [64]}, "a field holds a value of the wrong type or range (TypeError"),
    ("glm-5", {"first_k_dense_replace": [3]}, "a field holds a value of the wrong type or range (TypeError"),
    ("deepseek-v4-flash", {"rms_norm_eps": [1e-6]}, "norm_eps must be a positive number, got [1e-06]"),
    ("qwen3-8b", {"rms_norm_eps": float("nan")}, "norm_eps must be a positive number, got nan"),
    ("qwen3-8b", {"model_type": {"name": "qwen3"}}, "not a model config (a JSON object with a model_type)"),
])
def test_a_config_field_of_the_wrong_type_is_named_in_one_line(tmp_path, model, change, words):
    """What the readers do not check field by field still comes back as one line with the value, not a
    TypeError from deep inside (a sweep over every field of NVIDIA's 117 configs found none left)."""
    config = resolve_model(model).to_hf_config().to_dict() | change
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(PlannerError) as error:
        resolve_model(str(path))
    assert words in str(error.value) and "\n" not in str(error.value)


def test_catalog_is_one_generic_lookup_for_gpus_and_models():
    from planner.catalog import Catalog
    from planner.catalog.gpus import gpu_catalog
    from planner.catalog.models import model_catalog
    assert isinstance(gpu_catalog(), Catalog) and isinstance(model_catalog(), Catalog)
    assert model_catalog().get("Qwen/Qwen3-8B").name == "qwen3-8b"
    assert gpu_catalog().find("H100_SXM") is resolve_gpu("h100-sxm")
    with pytest.raises(PlannerError, match=r"unknown GPU 'v100'; known: a100-40g, a100-80g"):
        gpu_catalog().get("v100")


@pytest.mark.parametrize("given, expected", [
    ("Qwen/Qwen3-32B", "qwen3-32b"), ("Qwen/Qwen3-14B", "qwen3-14b"), ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"),
    ("mistralai/Mistral-7B-Instruct-v0.3", "mistral-7b-v0.3"), ("meta-llama/Llama-3.1-70B-Instruct", "llama-3.1-70b"),
    ("nvidia/Llama-3.1-8B-Instruct-FP8", "llama-3.1-8b"), ("meta-llama/Llama-3.3-70B-Instruct", "llama-3.1-70b"),
    ("facebook/opt-125m", "opt-125m"), ("meta-llama/Meta-Llama-3.1-405B", "llama-3.1-405b"),
    ("meta-llama/Meta-Llama-3-8B-Instruct", "llama-3-8b"), ("Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8", "qwen3-coder-480b-a35b"),
    ("mistralai/Mixtral-8x22B-Instruct-v0.1", "mixtral-8x22b"), ("nvidia/MiniMax-M2.7-NVFP4", "minimax-m2.7"),
    ("Qwen/Qwen3-Next-80B-A3B-Instruct", "qwen3-next-80b-a3b"),
])
def test_hugging_face_ids_and_their_fine_tuned_or_quantized_variants_find_the_base_model(given, expected):
    assert resolve_model(given).name == expected


def test_a_config_json_file_is_a_model_as_its_folder_is(tmp_path):
    import json
    (tmp_path / "config.json").write_text(json.dumps(resolve_model("qwen2.5-7b").to_hf_config().to_dict()))
    from_file, from_folder = resolve_model(str(tmp_path / "config.json")), resolve_model(str(tmp_path))
    assert from_file == from_folder
    assert from_file.model_type == "qwen2" and from_file.num_params == resolve_model("qwen2.5-7b").num_params


def test_a_mimo_config_is_qwen2s_architecture(tmp_path):
    """Xiaomi's MiMo-7B (model_type mimo): vLLM runs it as Qwen2 (MiMoForCausalLM subclasses Qwen2ForCausalLM),
    its multi-token-prediction layer loaded only to draft."""
    config = resolve_model("qwen2.5-7b").to_hf_config().to_dict() | {"model_type": "mimo",
                                                                      "num_nextn_predict_layers": 1}
    (tmp_path / "config.json").write_text(json.dumps(config))
    mimo = resolve_model(str(tmp_path / "config.json"))
    assert mimo.model_type == "qwen2" and mimo.num_params == resolve_model("qwen2.5-7b").num_params


def test_did_you_mean_names_only_what_list_models_shows():
    from planner.catalog import model_ids
    from planner.deploy import checks
    shown = {i for m in list_models() for i in model_ids(m)}
    message = str(pytest.raises(PlannerError, checks.model, "qwen3-14").value)
    suggested = message.rsplit("did you mean ", 1)[1].rstrip("?)")
    assert suggested in shown


# google/gemma-3-27b-it's config.json as released: the text_config lists only what differs from transformers'
# Gemma3TextConfig defaults (vocabulary, positions and RoPE base come from them), as vLLM reads it.
GEMMA3_27B = {
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "mm_tokens_per_image": 256,
    "text_config": {"head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504, "model_type": "gemma3_text",
                    "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16,
                    "query_pre_attn_scalar": 168, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                      "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
                      "patch_size": 14, "vision_use_head": False},
}


def test_a_multimodal_gemma3_config_counts_the_vision_tower_it_loads(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    (tmp_path / "config.json").write_text(json.dumps(GEMMA3_27B))
    spec = resolve_model(str(tmp_path / "config.json"))
    with torch.device("meta"):
        hf = transformers.Gemma3ForConditionalGeneration(transformers.Gemma3Config(
            **{k: v for k, v in GEMMA3_27B.items() if k != "model_type"}))
    assert spec.num_params == sum(p.numel() for p in hf.parameters())        # 27.4B, the vision tower's 0.42B in it
    assert spec.vision_params == sum(p.numel() for n, p in hf.named_parameters() if "language_model" not in n
                                     and "lm_head" not in n)
    # every 6th layer attends to everything; the other 52 keep 1,024 tokens of KV
    assert (spec.sliding_layers, spec.window, spec.vocab_size) == (52, 1024, 262208)
    assert spec == dataclasses.replace(resolve_model("google/gemma-3-27b-it"), name=spec.name, hf_id=None,
                                       aliases=(), published_params=None, source="")
    # a sequence's KV stops growing in the sliding layers past the window
    assert spec.kv_bytes_per_context(8192) == 2 * (10 * 8192 + 52 * 1024) * 16 * 128 * 2
