"""vLLM API parity of the offline API: keywords, stop strings, logprobs, clear errors."""
from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from serve_helpers import save_byte_model


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    folder = save_byte_model(tmp_path_factory.mktemp("byte-llama"))
    return LLM(folder, tensor_parallel_size=1, dtype="float32", seed=0, trust_remote_code=False,
               gpu_memory_utilization=0.9, max_model_len=128, enforce_eager=True, enable_prefix_caching=False,
               max_num_seqs=16, max_num_batched_tokens=256, swap_space=0.01, block_size=8, num_gpu_blocks=64)


def greedy(max_tokens=16, **kw):
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **kw)


def test_unsupported_values_are_refused_with_a_reason(tmp_path):
    folder = save_byte_model(tmp_path / "m")
    for kwargs, match in (({"tensor_parallel_size": 2}, "one device"), ({"quantization": "awq"}, "quantization"),
                          ({"kv_cache_dtype": "int8"}, "kv_cache_dtype")):
        with pytest.raises(ValueError, match=match):
            LLM(folder, **kwargs)


def test_stop_strings_end_the_text_where_they_occur(llm):
    full = llm.generate("Once upon", greedy(), use_tqdm=False)[0].outputs[0]
    stop = full.text[4:6]
    assert stop not in full.text[:4]   # a stop string that first completes at characters 4..6
    cut = llm.generate("Once upon", greedy(stop=[stop, "\u0000never"]), use_tqdm=False)[0].outputs[0]
    assert (cut.text, cut.finish_reason, cut.stop_reason) == (full.text[:4], "stop", stop)
    assert cut.token_ids == full.token_ids[:len(cut.token_ids)] and len(cut.token_ids) < len(full.token_ids)
    kept = llm.generate("Once upon", greedy(stop=stop, include_stop_str_in_output=True),
                        use_tqdm=False)[0].outputs[0]
    assert kept.text == full.text[:6]
    assert llm.engine.allocator.num_free_blocks() == 64 - 1   # the stopped sequence's blocks are back (all but vLLM v1's null block)


def test_stop_token_ids_report_the_token(llm):
    full = llm.generate("abc", greedy(), use_tqdm=False)[0].outputs[0]
    token = full.token_ids[3]
    out = llm.generate("abc", greedy(stop_token_ids=[token]), use_tqdm=False)[0].outputs[0]
    assert out.token_ids == full.token_ids[:full.token_ids.index(token) + 1]
    assert (out.finish_reason, out.stop_reason) == ("stop", token)


def test_logprobs_are_shaped_as_vllm_returns_them(llm):
    out = llm.generate("xyz", SamplingParams(temperature=1.0, seed=3, max_tokens=6, ignore_eos=True, logprobs=3),
                       use_tqdm=False)[0].outputs[0]
    assert len(out.logprobs) == 6
    for token, position in zip(out.token_ids, out.logprobs):
        assert token in position and 3 <= len(position) <= 4
        ranked = sorted((lp for lp in position.values() if lp.rank <= 3), key=lambda lp: lp.rank)
        assert [lp.rank for lp in ranked] == [1, 2, 3]
        assert ranked[0].logprob >= ranked[1].logprob >= ranked[2].logprob
        chosen = position[token]
        if len(position) == 4:   # sampled outside the top 3: its own rank in the whole vocabulary
            assert chosen.rank > 3 and chosen.logprob <= ranked[-1].logprob
        else:
            assert chosen in ranked
        assert chosen.decoded_token == llm.get_tokenizer().decode([token])
    assert out.cumulative_logprob == pytest.approx(sum(p[t].logprob for p, t in zip(out.logprobs, out.token_ids)))
    plain = llm.generate("xyz", greedy(6), use_tqdm=False)[0].outputs[0]
    assert plain.logprobs is None


def test_max_tokens_past_the_context_warns_and_ends_with_length(llm):
    with pytest.warns(UserWarning, match="1 of 2 prompts: prompt \\+ max_tokens exceeds .*max_model_len 128"):
        outs = llm.generate([[5] * 120, [5] * 4], greedy(max_tokens=20), use_tqdm=False)
    assert outs[0].outputs[0].finish_reason == "length" and len(outs[0].outputs[0].token_ids) == 8
    assert len(outs[1].outputs[0].token_ids) == 20
