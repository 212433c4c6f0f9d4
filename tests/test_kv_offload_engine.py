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


def test_the_server_answers_from_the_cpu_tier_as_it_did_from_the_gpu(tmp_path):
    # `planner serve --kv-offloading-size`: a prompt asked again after three others pushed its blocks out of a
    # 24-block GPU cache gets the same greedy text, its prefix loaded from the CPU tier
    import openai
    from engine.entrypoints.openai.server import BackgroundServer
    from engine.llm_engine import LLMEngine
    from serve_helpers import save_byte_model

    folder = save_byte_model(tmp_path / "byte-llama")
    engine = LLMEngine(folder, block_size=8, num_gpu_blocks=24, max_num_seqs=4, max_model_len=96,
                       kv_offloading_size=0.01)
    prompts = ["".join(chr(97 + (i * 7 + k) % 26) for i in range(70)) for k in range(4)]
    with BackgroundServer(engine, "tiny", folder) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=60)

        def complete(prompt):
            return client.completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0,
                                              extra_body={"ignore_eos": True}).choices[0].text
        first = complete(prompts[0])
        for other in prompts[1:]:
            complete(other)
        again = complete(prompts[0])
    assert again == first
    assert engine.allocator.offload.stats.blocks_loaded >= 8
