"""GLM-5.2 and GLM-5.3: DeepSeek Sparse Attention whose layers share indexers. vLLM builds an indexer (its
three projections, its LayerNorm and its key cache) on 21 of the 78 layers (index_topk_freq 4,
index_skip_topk_offset 3); the other 57 reuse the top-k of the last layer that ran one. The plan holds and
caches only those indexers, and the cost models price the others without theirs."""
import json

import pytest

from engine.deployment import Deployment
from planner.catalog import resolve_model
from planner.catalog.quantization import format_from_config
from planner.catalog.sparse_attention import SparseIndexer
from planner.cost.measured import MeasuredCostModel
from planner.cost.roofline import RooflineCostModel
from planner.cost.shape import StepShape
from planner.deploy.memory import plan_memory
from planner.deploy.plan import plan_deployment
from planner.errors import PlannerError

GLM5 = resolve_model("glm-5")
GLM52 = resolve_model("glm-5.2")
FP8_BLOCK = format_from_config({"quant_method": "fp8", "weight_block_size": [128, 128]})
SHARING = 78 - 21
INDEXER_WEIGHTS = 2048 * 32 * 128 + 6144 * 128 + 6144 * 32        # wq_b, wk, weights_proj


def _write(tmp_path, config: dict) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


def test_the_indexed_layers_are_vllms_and_the_configs():
    """vLLM's rule (a layer runs its own indexer when max(layer - offset + 1, 0) % freq == 0) gives the 21
    layers GLM-5.2's indexer_types marks full: 0, 1, 2, then every fourth from 6 to 74."""
    assert resolve_model("zai-org/GLM-5.3") is GLM52 and resolve_model("zai-org/GLM-5.2-FP8") is GLM52
    assert GLM52.sparse_indexer == SparseIndexer(heads=32, head_dim=128, topk=2048, every=4, offset=3)
    assert GLM52.sparse_indexer.indexed_layers(78) == (0, 1, 2, *range(6, 78, 4))
    assert GLM52.indexer_layers == 21 and GLM5.indexer_layers == 78
    # vLLM's default offset is 2: every fourth layer from the first
    assert SparseIndexer(heads=1, head_dim=128, topk=8, every=4).indexed_layers(10) == (0, 1, 5, 9)


def test_a_config_round_trips_and_disagreements_are_refused(tmp_path):
    config = GLM52.to_hf_config().to_dict()
    assert config["indexer_types"].count("full") == 21
    assert resolve_model(_write(tmp_path, config)).sparse_indexer == GLM52.sparse_indexer
    # indexer_types that do not match vLLM's rule describe a checkpoint vLLM would not load as marked
    with pytest.raises(PlannerError, match="indexer_types marks 78 layers full, but vLLM builds indexers on 21"):
        resolve_model(_write(tmp_path, config | {"indexer_types": ["full"] * 78}))
    with pytest.raises(PlannerError, match="index_topk_pattern"):
        resolve_model(_write(tmp_path, config | {"index_topk_pattern": "FFFS" * 19 + "FS"}))


def test_the_sharing_layers_hold_no_indexer_weights():
    """GLM-5.2 is GLM-5 less 57 indexers (transformers builds 743,377,000,704 parameters from its config); they
    were whole on every TP rank, so each GPU holds their bytes less."""
    assert GLM5.num_params - GLM52.num_params == SHARING * (INDEXER_WEIGHTS + 2 * 128)
    assert GLM52.num_params == 743_377_000_704
    assert (GLM5.weight_bytes_per_gpu(8) - GLM52.weight_bytes_per_gpu(8)
            == SHARING * (INDEXER_WEIGHTS + 2 * 128) * 2)


def test_only_an_indexer_caches_keys():
    """Per token: every layer's latent (fp8_ds_mla, 656 bytes), and the 132-byte FP8 indexer key on the 21
    layers with an indexer; the 64-token blocks hold that much, so the same memory holds more tokens."""
    assert GLM52.kv_bytes_per_token(1) == 78 * 656 + 21 * 132
    assert GLM52.kv_bytes_per_context(1000, 1) == 1000 * (78 * 656 + 21 * 132)
    memory = plan_memory(GLM52, "h200", tp=8, weight_format=FP8_BLOCK, block_size=64, kv_dtype_bytes=1)
    assert memory.block_bytes_per_gpu == (78 * 656 + 21 * 132) * 64
    glm5 = plan_memory(GLM5, "h200", tp=8, weight_format=FP8_BLOCK, block_size=64, kv_dtype_bytes=1)
    assert memory.num_gpu_blocks > glm5.num_gpu_blocks


def test_the_measured_model_prices_a_sharing_layer_as_the_module_less_its_indexer():
    """NVIDIA timed GLM-5's module, an indexer on every layer. A sharing layer's price is that module less its
    indexer's GEMMs, kernel and scoring, so it no longer grows with the context (sparse attention reads 2,048
    keys however long it is) while the module's does: the indexer scores every key."""
    model = MeasuredCostModel(GLM52, "h200", tp=8, weight_format=FP8_BLOCK)
    full = MeasuredCostModel(GLM5, "h200", tp=8, weight_format=FP8_BLOCK)
    share = SHARING / 78
    for batch in (8, 64):
        module = [full.generation_attention(batch, c) for c in (4096, 131072)]
        sharing = [(model.generation_attention(batch, c) - (1 - share) * m) / share for c, m in zip((4096, 131072), module)]
        assert module[1] > 1.15 * module[0]
        assert sharing[1] == pytest.approx(sharing[0], rel=0.1) and 0 < sharing[0] < module[0]
    step = StepShape(decode_seqs=64, decode_context=64 * 32768)
    assert model.ledger(step).total == pytest.approx(model.step_time(step))
    assert model.step_time(step) < full.step_time(step)
    assert any("21 of 78 layers run an indexer" in note for note in model.notes)
    assert not any(t.name.startswith("indexer ") for t in model.ledger(step).terms)     # inside the module


@pytest.mark.parametrize("make", [MeasuredCostModel, RooflineCostModel])
def test_a_cached_prefix_costs_only_the_indexing_layers_more_scores(make):
    """A chunk after a cached prefix: its extra (query, key) pairs are scored on the 21 indexing layers."""
    model = make(GLM52, "h200", tp=8, weight_format=FP8_BLOCK)
    fresh = StepShape(prefill_seqs=1, prefill_tokens=2048, prefill_attn_pairs=2048 * 2049 // 2)
    cached = StepShape(prefill_seqs=1, prefill_tokens=2048, prefill_attn_pairs=2048 * 2049 // 2 + 2048 * 30000)
    extra = model.step_time(cached) - model.step_time(fresh)
    glm5 = make(GLM5, "h200", tp=8, weight_format=FP8_BLOCK)
    glm5_extra = glm5.step_time(cached) - glm5.step_time(fresh)
    assert extra == pytest.approx(glm5_extra * 21 / 78, rel=1e-6)


def test_the_roofline_scores_keys_on_the_indexing_layers_alone():
    """By the roofline a longer context costs only the indexer's scores of the extra keys: on 21 layers of 78."""
    def growth(model):
        short, long = (model.step_time(StepShape(decode_seqs=64, decode_context=64 * c)) for c in (8192, 65536))
        return long - short
    glm52, glm5 = (RooflineCostModel(m, "h200", tp=8, weight_format=FP8_BLOCK) for m in (GLM52, GLM5))
    assert growth(glm52) == pytest.approx(growth(glm5) * 21 / 78, rel=1e-6)


def test_the_plan_runs_glm52_at_its_context():
    plan = plan_deployment(Deployment(model="zai-org/GLM-5.2-FP8", gpu="h200", tp=8, max_model_len=131072))
    assert plan.block_size == 64 and plan.memory.block_bytes_per_gpu == (78 * 1152 + 21 * 132) * 64
