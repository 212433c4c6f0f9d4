"""Multi-LoRA serving (engine/lora.py) against transformers.

Adapters are written in PEFT's on-disk format here (adapter_config.json and adapter_model.safetensors,
random nonzero A and B), and the reference for an adapter is transformers' greedy generation on a
checkpoint whose weights are merged, W + scaling * B @ A, saved and loaded back: what the adapter
computes by definition, with no LoRA code of its own.
"""
from __future__ import annotations

import itertools
import json
import math

import pytest
import torch
from safetensors.torch import load_file

from engine import LLM, LLMEngine, SamplingParams
from engine.lora import LoRARequest
from lora_helpers import save_adapter
from reference_helpers import hf_greedy, make_prompts
from tiny_models import hf_model, save_tiny_model

MAX_TOKENS = 10
LLAMA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ATTENTION_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
# What each model's adapter targets: every linear layer transformers has in its decoder layers (Phi-3's
# checkpoint fuses q/k/v and gate/up itself; Mixtral's and gpt-oss's experts take none, nor do the
# experts of Qwen3-MoE's sparse layers).
TARGETS = {"llama": LLAMA_TARGETS, "qwen3": LLAMA_TARGETS, "gemma3_text": LLAMA_TARGETS,
           "qwen3_moe": LLAMA_TARGETS, "mixtral": ATTENTION_TARGETS, "gpt_oss": ATTENTION_TARGETS,
           "phi3": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"],
           "opt": ["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"]}
# The adapters by id, beyond save_adapter's defaults. Adapter 2 (llama's) has another rank, rsLoRA scaling
# and only some targets, named by a PEFT regex: q and v, slices of the fused projection, and down_proj.
ADAPTERS = {1: {}, 2: {"r": 4, "alpha": 6, "use_rslora": True, "targets": ["q_proj", "v_proj", "down_proj"],
                       "target_modules": r".*\.(q_proj|v_proj|down_proj)"}}


def merged_model(model_dir, adapter_dir, out_dir):
    """transformers' model of ``model_dir`` with the adapter merged into its weights, saved and loaded."""
    model = hf_model(model_dir)
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    r = config["r"]
    scaling = config["lora_alpha"] / (math.sqrt(r) if config["use_rslora"] else r)
    weights = load_file(str(adapter_dir / "adapter_model.safetensors"))
    with torch.no_grad():
        for key, a in weights.items():
            if key.endswith(".lora_A.weight"):
                b = weights[key.replace("lora_A", "lora_B")]
                name = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
                model.get_submodule(name).weight += scaling * b @ a
    model.save_pretrained(out_dir, safe_serialization=True)
    return hf_model(out_dir)


class Setup:
    """A tiny model, its adapters and their references, built on first use."""

    def __init__(self, kind, root):
        self.kind, self.root = kind, root
        self.dir = save_tiny_model(kind, root / "model")
        self.base = hf_model(self.dir)
        self.adapters, self.refs = {}, {}

    def adapter(self, lora_id) -> LoRARequest:
        """Adapter ``lora_id`` (ADAPTERS), as a request."""
        if lora_id not in self.adapters:
            folder = self.root / f"lora{lora_id}"
            config = dict(ADAPTERS[lora_id])
            save_adapter(folder, self.base, config.pop("targets", TARGETS[self.kind]), seed=lora_id, **config)
            self.adapters[lora_id] = folder
            self.refs[lora_id] = merged_model(self.dir, folder, self.root / f"merged{lora_id}")
        return LoRARequest(f"adapter{lora_id}", lora_id, str(self.adapters[lora_id]))

    def reference(self, prompt, lora: LoRARequest | None, max_tokens=MAX_TOKENS):
        model = self.base if lora is None else self.refs[lora.lora_int_id]
        return hf_greedy(model, prompt, max_tokens)


@pytest.fixture(scope="module")
def setups(tmp_path_factory):
    cache = {}

    def get(kind) -> Setup:
        if kind not in cache:
            cache[kind] = Setup(kind, tmp_path_factory.mktemp(kind))
        return cache[kind]
    return get


def greedy(llm, prompts, loras, max_tokens=MAX_TOKENS, n=1):
    params = SamplingParams(temperature=0, max_tokens=max_tokens, n=n)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False, lora_request=loras)
    return [[c.token_ids for c in o.outputs] if n > 1 else o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("kind", list(TARGETS))
def test_one_adapter_matches_the_merged_checkpoint(setups, kind):
    setup = setups(kind)
    lora = setup.adapter(1)
    prompts = make_prompts((7, 19, 12), seed=1)
    llm = LLM(setup.dir, enable_lora=True, max_lora_rank=8)
    got = greedy(llm, prompts, lora)
    assert got == [setup.reference(p, lora) for p in prompts]
    # The adapter changes what the model says (else the comparison above proves nothing).
    assert got != [setup.reference(p, None) for p in prompts]


def test_a_batch_mixing_two_adapters_and_the_base_model(setups):
    setup = setups("llama")
    one, two = setup.adapter(1), setup.adapter(2)
    prompts = make_prompts((9, 17, 5, 21, 13, 8), seed=2)
    loras = [one, two, None, two, one, None]
    llm = LLM(setup.dir, enable_lora=True, max_loras=2, max_lora_rank=8)
    assert greedy(llm, prompts, loras) == [setup.reference(p, lora) for p, lora in zip(prompts, loras)]
    assert llm.engine.list_loras() == {1, 2}


def test_more_adapters_than_max_loras_take_turns(setups):
    """max_loras=1: the scheduler runs one adapter a step (with base-model requests beside it), and the
    runner swaps adapters on the device between steps."""
    setup = setups("llama")
    one, two = setup.adapter(1), setup.adapter(2)
    prompts = make_prompts((9, 17, 5, 12), seed=8)
    loras = [one, two, None, one]
    llm = LLM(setup.dir, enable_lora=True, max_loras=1, max_lora_rank=8)
    adapters_per_step = []
    llm.engine.step_observer = lambda out: adapters_per_step.append({g.lora_id for g in out.groups} - {0})
    assert greedy(llm, prompts, loras) == [setup.reference(p, lora) for p, lora in zip(prompts, loras)]
    assert max(map(len, adapters_per_step)) == 1


def test_adapters_under_preemption(setups):
    setup = setups("llama")
    one, two = setup.adapter(1), setup.adapter(2)
    prompts = make_prompts((20, 14, 18, 9, 22, 16), seed=3)
    loras = [one, two, None, one, two, None]
    # 9 blocks of 8 slots cannot hold the six sequences' ~180 tokens at once.
    llm = LLM(setup.dir, enable_lora=True, max_loras=2, max_lora_rank=8, block_size=8, num_gpu_blocks=9,
              max_model_len=64)
    got = greedy(llm, prompts, loras, max_tokens=16)
    assert llm.engine.scheduler.preemptions["recompute"] > 0
    assert got == [setup.reference(p, lora, 16) for p, lora in zip(prompts, loras)]


def test_prefix_caching_keeps_each_adapters_kv_apart(setups):
    """One 20-token prompt (two full blocks of 8) under adapter 1, adapter 2, the base model, then
    adapter 1 again: each run equals its own reference, and only the repeat hits cached blocks."""
    setup = setups("llama")
    one, two = setup.adapter(1), setup.adapter(2)
    prompt = make_prompts((20,), seed=4)[0]
    llm = LLM(setup.dir, enable_lora=True, max_loras=2, max_lora_rank=8, block_size=8, num_gpu_blocks=32,
              max_model_len=64, enable_prefix_caching=True)
    computed = []
    llm.engine.step_observer = lambda out: computed.extend(
        s.num_tokens - s.num_computed_tokens for s in out.seqs if s.num_computed_tokens < s.prompt_len)
    first_prefill = []
    for lora in (one, two, None, one):
        computed.clear()
        assert greedy(llm, [prompt], lora) == [setup.reference(prompt, lora)]
        first_prefill.append(computed[0])
    assert first_prefill == [20, 20, 20, 4]


@pytest.mark.parametrize("tier", [False, True])
def test_an_adapter_loaded_again_under_its_name_computes_its_own_kv(setups, tier):
    """Blocks are keyed by the adapter's name, as vLLM keys them. When an adapter is unloaded and another
    is loaded under its name (vLLM's load_inplace, or a new id), the new one computes its own KV: the old
    one's blocks leave the prefix cache and the CPU tier (vLLM issue #42125: there they are served to the
    new one). The base model's cached blocks stay."""
    setup = setups("llama")
    one, two = setup.adapter(1), setup.adapter(2)
    prompt, base_prompt = make_prompts((20, 20), seed=8)
    llm = LLM(setup.dir, enable_lora=True, max_loras=2, max_lora_rank=8, block_size=8, num_gpu_blocks=32,
              max_model_len=64, enable_prefix_caching=True, **({"kv_offloading_size": 0.01} if tier else {}))
    engine = llm.engine
    computed = []
    engine.step_observer = lambda out: computed.extend(
        s.num_tokens - s.num_computed_tokens for s in out.seqs if s.num_computed_tokens < s.prompt_len)

    def run(p, lora, reference, salt=None):
        computed.clear()
        params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
        out = llm.generate([{"prompt_token_ids": p} | ({"cache_salt": salt} if salt else {})], params,
                           use_tqdm=False, lora_request=lora)[0]
        assert out.outputs[0].token_ids == setup.reference(p, reference)
        return computed[0]
    assert run(prompt, LoRARequest("x", 1, one.lora_path), one) == 20
    assert run(prompt, LoRARequest("x", 1, one.lora_path), one, salt="tenant") == 20   # (salted: its own blocks)
    assert run(base_prompt, None, None) == 20
    assert engine.remove_lora(1)
    assert run(prompt, LoRARequest("x", 1, two.lora_path), two) == 20     # in place: the same name and id
    assert run(prompt, LoRARequest("x", 1, two.lora_path), two, salt="tenant") == 20
    assert run(base_prompt, None, None) == 4                                # 2 blocks of 8 still cached
    assert run(prompt, LoRARequest("x", 1, two.lora_path), two) == 4
    assert engine.remove_lora(1)
    assert run(prompt, LoRARequest("x", 3, two.lora_path), two) == 20     # a new id under the name
    if tier:
        assert engine.allocator.offload.stats.blocks_loaded == 0
    # one name is one adapter while it is loaded: another folder under it would be served its blocks
    assert "is loaded already as lora_int_id 3" in refusal(lambda: engine.add_lora(LoRARequest("x", 4, one.lora_path)))
    assert engine.add_lora(LoRARequest("x", 4, two.lora_path))             # (the same folder: the same KV)


def test_parallel_samples_inherit_the_adapter(setups):
    setup = setups("llama")
    lora = setup.adapter(1)
    prompt = make_prompts((11,), seed=5)[0]
    llm = LLM(setup.dir, enable_lora=True, max_lora_rank=8)
    assert greedy(llm, [prompt], lora, n=2) == [[setup.reference(prompt, lora)] * 2]


def test_speculative_decoding_verifies_with_the_adapter(setups):
    """Draft rows of a verification step run with their sequence's adapter."""
    setup = setups("llama")
    one, two = setup.adapter(1), setup.adapter(2)
    prompts = make_prompts((14, 10, 12), seed=6)
    loras = [one, two, None]
    llm = LLM(setup.dir, enable_lora=True, max_loras=2, max_lora_rank=8,
              speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
                                  "prompt_lookup_max": 2})
    assert greedy(llm, prompts, loras) == [setup.reference(p, lora) for p, lora in zip(prompts, loras)]
    assert llm.engine.spec_decoding_stats.num_draft_tokens > 0


def test_an_adapter_saved_as_a_pytorch_bin(setups):
    setup = setups("llama")
    one = setup.adapter(1)
    folder = setup.root / "bin"
    folder.mkdir()
    (folder / "adapter_config.json").write_text((setup.adapters[1] / "adapter_config.json").read_text())
    torch.save(load_file(str(setup.adapters[1] / "adapter_model.safetensors")), folder / "adapter_model.bin")
    prompt = make_prompts((9,), seed=7)[0]
    llm = LLM(setup.dir, enable_lora=True, max_lora_rank=8)
    assert greedy(llm, [prompt], LoRARequest("bin", 7, str(folder))) == [setup.reference(prompt, one)]


# -- one-line refusals ----------------------------------------------------------------------------------
def refusal(call) -> str:
    with pytest.raises(ValueError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.fixture(scope="module")
def engine(setups):
    return LLMEngine(setups("llama").dir, enable_lora=True, max_loras=2, max_lora_rank=8)


BAD_IDS = itertools.count(100)


def bad_adapter(setup, name, targets=LLAMA_TARGETS, **config):
    """A rank-4 llama adapter in its own folder under an id of its own, its config changed by ``config``."""
    folder = save_adapter(setup.root / name, setup.base, targets, r=4, alpha=8, **config)
    return LoRARequest(name, next(BAD_IDS), folder)


def test_adapters_the_engine_cannot_serve_are_refused_in_one_line(setups, engine):
    setup = setups("llama")
    prompt = {"prompt_token_ids": [5, 6, 7]}

    def add(lora):
        return refusal(lambda: engine.add_request(lora.lora_name, prompt, lora_request=lora))

    wide = add(LoRARequest("wide", 80, save_adapter(setup.root / "wide", setup.base, LLAMA_TARGETS, r=16)))
    assert "LoRA rank 16 is greater than max_lora_rank 8" in wide and str(setup.root / "wide") in wide
    missing = setup.root / "missing"
    assert "no such folder" in add(LoRARequest("missing", 81, str(missing)))
    missing.mkdir()
    assert "no adapter_config.json" in add(LoRARequest("missing", 81, str(missing)))
    no_weights = bad_adapter(setup, "no_weights")
    (setup.root / "no_weights" / "adapter_model.safetensors").unlink()
    assert "no adapter weights" in add(no_weights)
    assert "target modules lm_head cannot be applied" in add(bad_adapter(setup, "head", target_modules=["lm_head"]))
    # A regex names no module: the weights say what the adapter targets.
    head_weights = bad_adapter(setup, "head_weights", LLAMA_TARGETS + ["lm_head"], target_modules=".*")
    assert "module lm_head cannot be applied" in add(head_weights)
    assert "DoRA" in add(bad_adapter(setup, "dora", use_dora=True))
    assert "bias 'all' is not supported" in add(bad_adapter(setup, "bias", bias="all"))
    assert "modules_to_save" in add(bad_adapter(setup, "saved", modules_to_save=["lm_head"]))
    assert not engine.has_unfinished_requests()


def test_request_level_lora_errors(setups, engine):
    setup = setups("llama")
    prompt = {"prompt_token_ids": [5, 6, 7]}
    assert "lora_int_id must be an integer >= 1" in refusal(lambda: LoRARequest("zero", 0, setup.dir))
    one = setup.adapter(1)
    engine.add_lora(one)
    other = LoRARequest("other", 1, str(setup.root / "elsewhere"))
    assert "lora_int_id 1 is already adapter 'adapter1'" in refusal(
        lambda: engine.add_request("reused", prompt, lora_request=other))
    assert engine.add_lora(LoRARequest("same folder, another name", 1, one.lora_path)) is False
    assert 1 in engine.list_loras()
    assert engine.remove_lora(1) is True
    assert 1 not in engine.list_loras()
    assert engine.remove_lora(1) is False           # nothing left to remove
    plain = LLM(setup.dir)
    assert "give enable_lora=True" in refusal(lambda: plain.generate([prompt], lora_request=one, use_tqdm=False))
    assert "got 2 LoRA requests for 1 prompts" in refusal(
        lambda: plain.generate([prompt], lora_request=[one, None], use_tqdm=False))


def test_models_without_lora_support_are_refused_at_start(setups):
    gpt2 = setups("gpt2").dir
    assert "not supported for model_type 'gpt2'" in refusal(lambda: LLM(gpt2, enable_lora=True))
