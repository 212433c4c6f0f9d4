"""GLM-4.5/4.6/4.7 and GLM-4.5-Air in the planner: ids, counts, partial rotary, and experts no table timed."""
import json
import re
from unittest import mock

import pytest

from engine.deployment import Deployment
from planner.api import run_spec
from planner.catalog import resolve_model
from planner.catalog.models import ModelSpec
from planner.catalog.quantization import weight_format
from planner.cost import tables
from planner.cost.elementwise import step_kernels
from planner.cost.measured import MeasuredCostModel
from planner.cost.shape import StepShape
from planner.deploy.memory import rotary_cache_bytes
from planner.errors import PlannerError
from planner.runs.pipeline import Simulation

# zai-org/GLM-4.5's config.json as released (the MTP layer's count aside, GLM-4.6 and 4.7 are this with a
# longer max_position_embeddings)
GLM45 = dict(model_type="glm4_moe", architectures=["Glm4MoeForCausalLM"], attention_bias=True, head_dim=128,
             hidden_size=5120, partial_rotary_factor=0.5, intermediate_size=12288, max_position_embeddings=131072,
             moe_intermediate_size=1536, norm_topk_prob=True, num_attention_heads=96, n_group=1, topk_group=1,
             n_routed_experts=160, n_shared_experts=1, routed_scaling_factor=2.5, num_experts_per_tok=8,
             first_k_dense_replace=3, num_hidden_layers=92, num_key_value_heads=8, rms_norm_eps=1e-5,
             rope_theta=1000000, num_nextn_predict_layers=1, tie_word_embeddings=False, use_qk_norm=True,
             vocab_size=151552)


def test_ids_resolve():
    assert resolve_model("zai-org/GLM-4.5").name == "glm-4.5"
    assert resolve_model("zai-org/GLM-4.7-FP8").name == "glm-4.6"
    assert resolve_model("zai-org/GLM-4.5-Air").name == "glm-4.5-air"


@pytest.mark.parametrize("air", [False, True])
def test_a_released_config_counts_like_transformers(tmp_path, air):
    """The Hub's config.json (partial_rotary_factor at the top level) reads to the catalog entry and counts
    what transformers builds from it, parameter for parameter."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    fields = dict(GLM45, **(dict(hidden_size=4096, intermediate_size=10944, moe_intermediate_size=1408,
                                 n_routed_experts=128, first_k_dense_replace=1, num_hidden_layers=46,
                                 use_qk_norm=False, routed_scaling_factor=1.0) if air else {}))
    path = tmp_path / "GLM" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(fields))
    spec = resolve_model(str(path))
    entry = resolve_model("glm-4.5-air" if air else "glm-4.5")
    config = transformers.Glm4MoeConfig(**{k: v for k, v in fields.items() if k not in ("model_type", "architectures")})
    with torch.device("meta"):
        hf = transformers.Glm4MoeForCausalLM(config)
    assert spec.num_params == sum(p.numel() for p in hf.parameters()) == entry.num_params
    assert (spec.partial_rotary_dims, spec.rotary_dims, spec.attention_bias) == (64, 64, True)
    assert spec.qk_norm == (None if air else "per head")
    assert (spec.dense_layers, spec.shared_experts) == ((1, 1) if air else (3, 1))
    # the catalog entry builds back to the same transformers model (the engine's and profiler's path)
    with torch.device("meta"):
        back = transformers.Glm4MoeForCausalLM(entry.to_hf_config())
    assert sum(p.numel() for p in back.parameters()) == entry.num_params


def test_published_counts():
    glm, air = resolve_model("glm-4.5"), resolve_model("glm-4.5-air")
    assert glm.num_params == pytest.approx(355e9, rel=0.01)       # the MTP layer (~3B) is not loaded to serve
    assert air.num_params == pytest.approx(106e9, rel=0.01)
    assert glm.active_params == pytest.approx(32e9, rel=0.06)     # embedding included here, not in the card's


def test_kv_cache_and_rotary_follow_the_heads():
    glm = resolve_model("glm-4.6")
    assert glm.kv_bytes_per_token() == 92 * 2 * 8 * 128 * 2
    assert rotary_cache_bytes(glm) == 202752 * 64 * 2                # half of each head rotates
    kernels = {k.name: k for k in step_kernels(glm, 8, 2)}
    assert kernels["rotary embedding"].bytes_per_token == 2 * (12 + 1) * 64 * 2
    assert kernels["q/k RMSNorm"].bytes_per_token == 2 * (12 + 1) * 128 * 2


def test_a_bad_rotary_factor_is_named():
    with pytest.raises(PlannerError, match="partial_rotary_factor"):
        ModelSpec.from_hf_config(dict(GLM45, partial_rotary_factor=1.5), name="bad")


def test_experts_no_table_timed_are_priced_at_the_tables_efficiency():
    model = MeasuredCostModel("glm-4.5-air", "h100-sxm", tp=4)
    terms = {t.name: t for t in model.ledger(StepShape(decode_seqs=32, decode_context=32 * 2048)).terms}
    experts = terms["experts (fused MoE)"]
    assert experts.source == "scaled" and re.search(r"over its \d+ timed shapes", experts.detail)
    assert terms["qkv GEMM"].source == "table" and terms["attention (decode)"].source == "table"
    assert "efficiency" in model.name


@pytest.mark.parametrize("name, tp, quantization", [("qwen3-30b-a3b", 1, None), ("qwen3-235b-a22b", 8, "fp8")])
def test_a_hidden_shape_is_priced_near_its_own_rows(name, tp, quantization):
    """Hide a timed shape's rows: priced like an untimed shape it comes within 30% of its own rows at decode
    sizes (the plain roofline misses per-tensor FP8 on Hopper by 4-5x)."""
    fmt = weight_format(quantization) if quantization else None
    own = MeasuredCostModel(name, "h100-sxm", tp=tp, weight_format=fmt)
    m = own.model
    shape = (m.hidden_size, m.moe_intermediate_size, m.num_experts_per_tok, m.num_experts)
    load = tables.load_rows

    def rows(system, kind):
        return [r for r in load(system, kind) if kind != "moe" or
                (r["hidden_size"], r["inter_size"], r["topk"], r["num_experts"]) != shape]
    with mock.patch.object(tables, "load_rows", rows):
        hidden = MeasuredCostModel(name, "h100-sxm", tp=tp, weight_format=fmt)
    assert own._moe.efficiency is None and hidden._moe.efficiency is not None
    for tokens in (8, 32, 128):
        assert hidden._moe.experts(tokens) == pytest.approx(own._moe.experts(tokens), rel=0.3)


def test_glm_plans_and_simulates_on_h200():
    spec = run_spec(Deployment(model="zai-org/GLM-4.6", gpu="h200", tp=8, max_model_len=8192),
                    workload="random", concurrency=8, requests=24)
    simulation = Simulation.prepare(spec)
    assert "efficiency" in simulation.cost_model.name             # measured tables, not the roofline
    assert simulation.simulate().metrics.num_completed == 24


def test_glm_flash_is_deepseek_v3s_architecture(tmp_path):
    """GLM-4.7-Flash (glm4_moe_lite): latent attention and shared experts; the Hub's config.json says
    first_k_dense_replace, transformers 5 writes mlp_layer_types, and both read to the catalog's count."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    entry = resolve_model("zai-org/GLM-4.7-Flash")
    config = transformers.Glm4MoeLiteConfig()
    with torch.device("meta"):
        hf = transformers.Glm4MoeLiteForCausalLM(config)
    written = config.to_dict()
    hub = {k: v for k, v in written.items() if k != "mlp_layer_types"} | {"first_k_dense_replace": 1}
    for i, fields in enumerate((written, hub)):
        path = tmp_path / f"flash{i}" / "config.json"
        path.parent.mkdir()
        path.write_text(json.dumps(fields))
        assert resolve_model(str(path)).num_params == sum(p.numel() for p in hf.parameters()) == entry.num_params
    assert entry.is_mla and entry.kv_bytes_per_token() == 47 * 576 * 2


def test_a_llama_like_config_reads_its_partial_rotary():
    """Phi-4-mini's config rotates 3/4 of each 128-wide head: the rotary kernel and cos/sin cache cover 96
    dims, whether the factor sits at the top level (the Hub) or in rope_parameters (transformers 5)."""
    fields = dict(model_type="phi3", hidden_size=3072, num_hidden_layers=32, num_attention_heads=24,
                  num_key_value_heads=8, intermediate_size=8192, vocab_size=200064, max_position_embeddings=131072,
                  tie_word_embeddings=True)
    for where in (dict(partial_rotary_factor=0.75),
                  dict(rope_parameters=dict(rope_type="default", rope_theta=1e4, partial_rotary_factor=0.75))):
        spec = ModelSpec.from_hf_config(dict(fields, **where), name="phi-4-mini")
        assert (spec.head_size, spec.rotary_dims) == (128, 96)
        assert rotary_cache_bytes(spec) == 131072 * 96 * 2
        assert spec.to_hf_config().rope_parameters["partial_rotary_factor"] == 0.75
    assert ModelSpec.from_hf_config(fields, name="full").rotary_dims == 128
