"""CPU KV offloading in the live engine (vLLM's --kv-offloading-size): greedy tokens equal transformers'
when a prompt's prefix, evicted from the GPU's prefix cache, comes back from the CPU tier (fp32, CPU)."""
from __future__ import annotations

from engine import LLM
from test_engine import engine_greedy, hf_greedy, make_prompts, model_dir, reference  # noqa: F401

MAX_TOKENS = 8


def offloading_llm(model_dir, **kwargs) -> LLM:
    llm = LLM(model_dir, block_size=8, max_num_seqs=4, kv_offloading_size=0.01, **kwargs)
    loads, stores, starts = [], [], []
    def observe(out):
        loads.append(len(out.kv_loads))
        stores.append(len(out.kv_stores))
        starts.extend(s.num_computed_tokens for s, n in zip(out.seqs, out.scheduled_tokens()) if n > 1)
    llm.engine.step_observer = observe
    llm.loads, llm.stores, llm.starts = loads, stores, starts
    return llm


def test_a_prefix_lost_on_the_gpu_is_loaded_from_the_cpu_tier(model_dir, reference):
    shared = make_prompts(lens=(67,), seed=7)[0]            # 8 full blocks of 8, and 3 tokens
    first, again = make_prompts(lens=(0, 5), seed=8, prefix=shared)
    others = make_prompts(lens=(70, 66, 69), seed=9)
    # 24 blocks of 8 (23 usable): the three others' prompts take the blocks the first one left in the cache
    llm = offloading_llm(model_dir, num_gpu_blocks=24, max_model_len=96)
    got = [engine_greedy(llm, [p], MAX_TOKENS)[0] for p in (first, *others, again)]
    assert got == [hf_greedy(reference, p, MAX_TOKENS) for p in (first, *others, again)]
    assert sum(llm.loads) == 8                   # the shared prefix's 8 blocks came back from the CPU tier
    assert 64 in llm.starts                      # and the last prompt computed only what follows them
    assert sum(llm.stores) >= 4 * 8              # every prompt's full blocks went to the tier
