"""What the engine's tests hold it to: greedy runs of transformers (and of the engine, to compare)
on random prompts, and dense attention written from the definition."""
from __future__ import annotations

import random

import torch

from engine import LLM, SamplingParams


def make_prompts(lens, seed, prefix=()):
    """One prompt per length: ``prefix`` and then random ids (3..199, clear of the special ids 0-2)."""
    rng = random.Random(seed)
    return [list(prefix) + [rng.randrange(3, 200) for _ in range(n)] for n in lens]


def hf_greedy(model, prompt, max_tokens, eos=2):
    """transformers' greedy continuation of one prompt."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=max_tokens,
                             pad_token_id=0, eos_token_id=eos)
    return out[0, len(prompt):].tolist()


def engine_greedy(llm, prompts, max_tokens):
    """The engine's greedy continuations of the prompts, in one batch."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def greedy_runners(default_max_tokens: int):
    """``(engine_greedy, hf_greedy)`` generating ``default_max_tokens`` unless a call says otherwise
    (each test module compares at its own length)."""
    def engine(llm, prompts, max_tokens=default_max_tokens):
        return engine_greedy(llm, prompts, max_tokens)

    def hf(model, prompt, max_tokens=default_max_tokens):
        return hf_greedy(model, prompt, max_tokens)

    return engine, hf


def prefix_cached_greedy(model_dir, max_tokens):
    """Greedy runs with prefix caching over four prompts that share a 19-token prefix
    (two full blocks of 8 and a bit): the first alone, then the rest, which can hit
    its cached blocks. Returns the prompts, the two runs' outputs, and the tokens
    each prefill of the second run computed."""
    shared = make_prompts((19,), seed=7)[0]
    prompts = make_prompts((4, 9, 1, 6), seed=3, prefix=shared)
    llm = LLM(model_dir, block_size=8, num_gpu_blocks=64, enable_prefix_caching=True)
    first = engine_greedy(llm, prompts[:1], max_tokens)
    computed = []
    llm.engine.step_observer = lambda out: computed.extend(
        s.num_tokens - s.num_computed_tokens for s in out.seqs if out.is_prefill)
    rest = engine_greedy(llm, prompts[1:], max_tokens)
    return prompts, first, rest, computed


def dense_attention(query, dense, num_kv_heads, scale=None, sinks=None):
    """float64, one head at a time, from the definition: softmax(q.k * scale) over the
    sequence's keys (``dense``: per sequence, keys and values [tokens, kv heads, head
    size]); with ``sinks``, each head's sink logit joins the softmax as a token
    without a value. ``scale`` defaults to 1 / sqrt(head size)."""
    num_seqs, num_heads, head_size = query.shape
    scale = head_size**-0.5 if scale is None else scale
    group = num_heads // num_kv_heads
    out = torch.zeros(num_seqs, num_heads, head_size, dtype=torch.float64)
    for i, (keys, values) in enumerate(dense):
        for h in range(num_heads):
            logits = keys[:, h // group].double() @ query[i, h].double() * scale
            if sinks is None:
                weights = torch.softmax(logits, dim=0)
            else:
                weights = torch.softmax(torch.cat([logits, sinks[h:h + 1].double()]), dim=0)[:-1]
            out[i, h] = weights @ values[:, h // group].double()
    return out


def transformers_param_count(spec) -> int:
    """Parameters of the model transformers builds from a catalog spec's config, on the meta device (no
    memory), for holding the planner's count to it."""
    import transformers

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(spec.to_hf_config())
    return sum(p.numel() for p in model.parameters())
