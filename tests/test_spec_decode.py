"""Speculative decoding with n-gram prompt lookup (issue 26, items 1 and 2).

Greedy outputs with speculation equal those without (and transformers'), under both policies,
with prefix caching and under preemption; the slots of rejected drafts go back to the pool; a
seeded sampled request draws the same tokens; the acceptance counters are consistent.
"""
from __future__ import annotations

import random

import pytest
import torch

from engine import LLM, SamplingParams
from engine.core.speculative import SpecDecodingStats, SpeculativeConfig, propose_ngram
from tiny_models import hf_model, save_tiny_model

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """These tiny models run faster on one thread (two spin on a shared two-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return save_tiny_model("llama", tmp_path_factory.mktemp("llama_spec"))


def prompts_of(lens, seed, prefix=()):
    rng = random.Random(seed)
    return [list(prefix) + [rng.randrange(3, 200) for _ in range(n)] for n in lens]


def repetitive(seed=0, period=6, times=5):
    """A prompt that repeats itself (code editing, say): its own n-grams keep matching."""
    return prompts_of((period,), seed)[0] * times


def run(llm: LLM, prompts, params) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def pair(model_dir, spec=NGRAM, **kwargs) -> tuple[LLM, LLM]:
    """The same engine without and with speculation."""
    return LLM(model_dir, **kwargs), LLM(model_dir, speculative_config=spec, **kwargs)


def check_stats(stats: SpecDecodingStats) -> None:
    per_pos = stats.num_accepted_tokens_per_pos
    assert stats.num_accepted_tokens <= stats.num_draft_tokens <= stats.num_drafts * stats.num_spec_tokens
    assert sum(per_pos) == stats.num_accepted_tokens
    assert all(a >= b for a, b in zip(per_pos, per_pos[1:]))       # non-increasing by position
    assert per_pos[0] <= stats.num_drafts
    if stats.num_drafts:
        assert stats.mean_acceptance_length == pytest.approx(1 + stats.num_accepted_tokens / stats.num_drafts)


# -- the proposer and the config ---------------------------------------------------------------

def test_ngram_proposer_follows_vllms_rule():
    # vLLM's docstring example: [4,2,3] has no earlier match, [2,3] does; three tokens follow it.
    assert propose_ngram([1, 2, 3, 4, 2, 3], 2, 3, 4) == [4, 2, 3]
    # The longest n-gram wins over a shorter one that matches more recently.
    assert propose_ngram([7, 8, 9, 50, 5, 9, 51, 7, 8, 9], 1, 3, 1) == [50]
    # Among occurrences of the longest n-gram, the earliest (vLLM's KMP keeps that one).
    assert propose_ngram([1, 2, 10, 1, 2, 11, 1, 2], 2, 2, 2) == [10, 1]
    # Occurrences may overlap the suffix; the suffix itself never matches.
    assert propose_ngram([5, 5, 5], 1, 2, 3) == [5]
    assert propose_ngram([1, 2, 3], 1, 3, 4) == []
    assert propose_ngram([3, 3], 2, 2, 4) == []               # shorter than min_n + 1
    # Ids past one byte: a match must start on an id boundary of the packed array.
    assert propose_ngram([256, 1, 65536, 9, 256, 1], 2, 2, 2) == [65536, 9]
    assert propose_ngram([1, 0, 0, 0, 7, 1], 1, 1, 1) == [0]


def test_drafts_never_outgrow_the_last_plain_decode():
    """k is capped by max_tokens (the last token is the target's) and by max_model_len - 1."""
    from engine.core.sequence import SequenceGroup
    from engine.core.speculative import NgramProposer
    proposer = NgramProposer(SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_min=1), max_model_len=12)
    group = SequenceGroup("r", [5, 6, 5, 6, 5, 6], SamplingParams(max_tokens=4), 0.0)
    seq = group.seqs[0]
    seq.append(5, 0.0)                                   # 1 output token: 2 more may be drafted
    assert proposer.propose(group, seq) == [6, 5]
    group.params.max_tokens = 100
    assert proposer.propose(group, seq) == [6, 5, 6, 5]
    seq.append(6, 0.0)
    seq.append(5, 0.0)                                   # 9 tokens: 12 - 1 - 9 = 2
    assert proposer.propose(group, seq) == [6, 5]
    group.params.logprobs = 1                            # requests that cannot speculate get none
    assert proposer.propose(group, seq) == []


def test_lookup_counters_measure_drafting_runs_and_per_position_rates():
    """The counters a simulation needs beyond vLLM's: lookups, proposals before caps, drafts in runs,
    and the verified tokens that make acceptance conditional per position."""
    from engine.core.sequence import SequenceGroup
    from engine.core.speculative import NgramProposer
    stats = SpecDecodingStats(4)
    proposer = NgramProposer(SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_min=1), 100, stats)
    group = SequenceGroup("r", [1, 2, 3, 4, 5], SamplingParams(max_tokens=3), 0.0)
    seq = group.seqs[0]
    seq.append(9, 0.0)
    assert proposer.propose(group, seq) == []            # 9 never occurred: a lookup without a draft
    seq.append(2, 0.0)
    assert proposer.propose(group, seq) == []            # max_tokens reached: not a lookup
    group.params.max_tokens = 100
    assert proposer.propose(group, seq) == [3, 4, 5, 9]  # 2 occurred: a draft, counted before caps
    assert proposer.propose(group, seq) == [3, 4, 5, 9]  # right after a draft
    assert stats.num_lookups == 3 and stats.num_proposed_tokens_per_pos == [2, 2, 2, 2]
    assert (stats.num_lookups_after_draft, stats.num_drafts_after_draft) == (1, 1)
    assert stats.draft_rates() == [0.5, 1.0, 1.0, 1.0] and stats.draft_persistence() == 1.0
    stats.observe_draft(4, 1)        # token 0 accepted, token 1 rejected, 2 and 3 never verified
    stats.observe_draft(2, 2)        # a draft cut to 2 tokens, both accepted
    assert stats.num_verified_tokens_per_pos == [2, 2, 0, 0]
    assert stats.acceptance_rates() == [1.0, 0.5, 0.0, 0.0]
    total = stats.merged([stats])
    assert total.num_lookups == 6 and total.num_verified_tokens_per_pos == [4, 4, 0, 0]
    assert total.acceptance_rates() == stats.acceptance_rates()


def test_the_counters_start_afresh_after_a_warm_up(llama_dir):
    """validate's warm-up request must not count: reset_spec_stats gives the proposer fresh counters too."""
    llm = LLM(llama_dir, block_size=8, num_gpu_blocks=64, speculative_config=NGRAM)
    run(llm, [repetitive()], SamplingParams(temperature=0, max_tokens=8))
    scheduler = llm.engine.scheduler
    assert scheduler.spec_stats.num_lookups > 0
    scheduler.reset_spec_stats()
    assert scheduler.spec_stats.num_lookups == 0 and scheduler.proposer.stats is scheduler.spec_stats
    run(llm, [repetitive(3)], SamplingParams(temperature=0, max_tokens=8))
    assert scheduler.spec_stats.num_lookups > 0


def test_speculative_config_defaults_and_errors():
    c = SpeculativeConfig.of({"method": "ngram", "num_speculative_tokens": 3})
    assert (c.prompt_lookup_min, c.prompt_lookup_max) == (5, 5)          # vLLM's defaults
    assert SpeculativeConfig(prompt_lookup_max=4).prompt_lookup_min == 4
    assert SpeculativeConfig(prompt_lookup_min=2).prompt_lookup_max == 2
    assert SpeculativeConfig.of(None) is None
    with pytest.raises(ValueError, match="not supported"):
        SpeculativeConfig(method="eagle")
    with pytest.raises(ValueError, match="draft model's folder"):
        SpeculativeConfig(method="draft_model")
    assert SpeculativeConfig.of({"model": "m", "num_speculative_tokens": 2}).method == "draft_model"   # vLLM's rule
    with pytest.raises(ValueError, match="<="):
        SpeculativeConfig(prompt_lookup_min=4, prompt_lookup_max=2)
    with pytest.raises(ValueError, match="not a setting of method 'ngram'"):
        SpeculativeConfig.of({"method": "ngram", "model": "x"})
    with pytest.raises(ValueError, match="unknown"):
        SpeculativeConfig.of({"method": "ngram", "draft_tensor_parallel_size": 1})


def test_off_by_default(llama_dir):
    llm = LLM(llama_dir, block_size=8, num_gpu_blocks=64)
    seen = []
    llm.engine.step_observer = lambda out: seen.append(out.spec_token_ids)
    run(llm, [repetitive()], SamplingParams(temperature=0, max_tokens=8))
    assert llm.engine.spec_decoding_stats is None and llm.engine.scheduler.proposer is None
    assert seen and all(s is None for s in seen)


def test_the_deployments_speculative_setting_reaches_the_engine(llama_dir):
    # `planner serve` and `validate` build the engine from the deployment: its --speculative ngram:K is
    # vLLM's speculative_config with k drafts; methods only the simulator models are refused in one line.
    from engine.deployment import Deployment
    from engine.llm_engine import LLMEngine

    engine = LLMEngine(llama_dir, Deployment(model=llama_dir, block_size=8, num_gpu_blocks=64,
                                             speculative="ngram:3"))
    assert engine.speculative_config == SpeculativeConfig(num_speculative_tokens=3)
    assert engine.spec_decoding_stats is not None
    with pytest.raises(ValueError, match="ngram or a draft model only"):
        LLMEngine(llama_dir, Deployment(model=llama_dir, block_size=8, num_gpu_blocks=64, speculative="eagle:3"))
    with pytest.raises(ValueError, match="--draft-model"):
        LLMEngine(llama_dir, Deployment(model=llama_dir, block_size=8, num_gpu_blocks=64, speculative="draft:3"))


# -- draft-model speculation ---------------------------------------------------------------------

def test_a_draft_model_that_is_the_target_drafts_what_it_samples(llama_dir):
    """The target as its own draft: every greedy draft is accepted, k + 1 tokens per verify step, and the
    outputs are the target's own (also as the deployment's --speculative draft:K --draft-model)."""
    from engine.deployment import Deployment
    prompts = prompts_of((20, 7, 33), seed=4)
    params = SamplingParams(temperature=0, max_tokens=30)
    base = LLM(llama_dir, block_size=8, num_gpu_blocks=200)
    spec = LLM(llama_dir, deployment=Deployment(model=llama_dir, block_size=8, num_gpu_blocks=200,
                                                speculative="draft:3", draft_model=llama_dir))
    want = run(base, prompts, params)
    assert run(spec, prompts, params) == want
    stats = spec.engine.spec_decoding_stats
    assert stats.num_drafts > 0 and stats.num_accepted_tokens == stats.num_draft_tokens
    assert stats.draft_rates()[0] == 1.0 and spec.engine.scheduler.proposer._seen == {}   # caches dropped


def test_a_different_draft_model_keeps_greedy_and_seeded_outputs(llama_dir, tmp_path):
    """Another random model of the same vocabulary: drafts mostly rejected, outputs unchanged, greedy and
    seeded; a draft model of another vocabulary is refused in one line."""
    other = save_tiny_model("qwen3", tmp_path / "draft")
    prompts = prompts_of((12, 25), seed=5)
    draft = {"method": "draft_model", "model": other, "num_speculative_tokens": 3}
    base, spec = pair(llama_dir, draft, block_size=8, num_gpu_blocks=200)
    for params in (SamplingParams(temperature=0, max_tokens=24),
                   SamplingParams(temperature=0.9, seed=11, max_tokens=24)):
        assert run(spec, prompts, params) == run(base, prompts, params)
    check_stats(spec.engine.spec_decoding_stats)
    gpt2 = save_tiny_model("gpt2", tmp_path / "gpt2")
    import json
    config = json.loads((tmp_path / "gpt2" / "config.json").read_text())
    config["vocab_size"] = 300
    (tmp_path / "gpt2" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="vocabulary of 300"):
        LLM(llama_dir, speculative_config={"model": gpt2, "num_speculative_tokens": 2}, block_size=8,
            num_gpu_blocks=64)


def test_a_draft_model_drafts_only_within_its_own_positions(llama_dir, tmp_path):
    """A GPT-2 draft of 24 learned positions beside a target of more: a sequence past them is decoded by the
    target alone, the batch unharmed (it died with an IndexError), greedy outputs unchanged."""
    from tiny_models import CONFIGS
    model_cls, config = CONFIGS["gpt2"]
    short = config()
    short.n_positions = 24
    torch.manual_seed(0)
    model_cls(short).save_pretrained(tmp_path / "short")
    prompts = prompts_of((12, 30), seed=3)
    draft = {"method": "draft_model", "model": str(tmp_path / "short"), "num_speculative_tokens": 3}
    base, spec = pair(llama_dir, draft, block_size=8, num_gpu_blocks=200)
    params = SamplingParams(temperature=0, max_tokens=20)
    assert run(spec, prompts, params) == run(base, prompts, params)
    assert 0 < spec.engine.spec_decoding_stats.num_draft_tokens


# -- greedy outputs are unchanged ----------------------------------------------------------------

def test_greedy_identical_and_drafts_accepted(llama_dir):
    prompts = prompts_of((20, 7, 33, 12), seed=0) + [repetitive(1), repetitive(2, period=4, times=8)]
    params = SamplingParams(temperature=0, max_tokens=40)
    base, spec = pair(llama_dir, block_size=8, num_gpu_blocks=200)
    want = run(base, prompts, params)
    outs = spec.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == want
    stats = spec.engine.spec_decoding_stats
    check_stats(stats)
    assert stats.num_accepted_tokens > 0 and stats.num_drafts > 0
    # Some request got its tokens in fewer steps than tokens.
    assert any(len(o.metrics.token_times) < len(o.outputs[0].token_ids) for o in outs)
    # ... and transformers' greedy tokens.
    reference = hf_model(llama_dir)
    for prompt, tokens in list(zip(prompts, want))[-2:]:
        with torch.no_grad():
            out = reference.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=40,
                                     pad_token_id=0, eos_token_id=2)
        assert tokens == out[0, len(prompt):].tolist()


def test_stops_inside_accepted_drafts(llama_dir):
    """A stop token or max_tokens reached among the accepted drafts ends the output right there."""
    prompts = [repetitive(1), repetitive(2, period=4, times=8)]
    base, spec = pair(llama_dir, block_size=8, num_gpu_blocks=200)
    full = run(base, prompts, SamplingParams(temperature=0, max_tokens=30))
    for max_tokens in (1, 2, 5, 13):
        params = SamplingParams(temperature=0, max_tokens=max_tokens)
        assert run(spec, prompts, params) == [t[:max_tokens] for t in full]
    stop = [SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[t[9]]) for t in full]
    assert run(spec, prompts, stop) == run(base, prompts, stop)


def test_mixed_requests_that_cannot_speculate(llama_dir):
    """Logprobs, n > 1 and sampled requests run beside drafted ones, each as it would alone."""
    prompts = [repetitive(1), repetitive(3), prompts_of((9,), 4)[0]]
    params = [SamplingParams(temperature=0, max_tokens=20), SamplingParams(temperature=0, max_tokens=20, logprobs=2),
              SamplingParams(n=2, temperature=0.9, seed=5, max_tokens=12)]
    base, spec = pair(llama_dir, block_size=8, num_gpu_blocks=200)
    a = base.generate(prompts, params, use_tqdm=False)
    b = spec.generate(prompts, params, use_tqdm=False)
    assert [[c.token_ids for c in o.outputs] for o in a] == [[c.token_ids for c in o.outputs] for o in b]
    assert [len(p) for p in b[1].outputs[0].logprobs] == [len(p) for p in a[1].outputs[0].logprobs]
    assert spec.engine.spec_decoding_stats.num_drafts > 0


def test_seeded_sampling_draws_the_same_tokens(llama_dir):
    """Each output token costs one draw of the request's generator, accepted draft or not, so a
    seeded request samples what it samples without speculation."""
    prompts = [repetitive(1), repetitive(2, period=4, times=8), prompts_of((15,), 6)[0]]
    params = [SamplingParams(temperature=0.7, top_k=20, seed=s, max_tokens=30) for s in (1, 2, 3)]
    base, spec = pair(llama_dir, block_size=8, num_gpu_blocks=200)
    assert run(spec, prompts, params) == run(base, prompts, params)
    check_stats(spec.engine.spec_decoding_stats)


def test_rejection_rule_keeps_the_target_distribution():
    """Accept draft d with probability p(d), else a token from p without d, renormalized: the
    output's first token is distributed as p itself (vocabulary of 5, 1500 draws; the bounds are
    about 4 standard deviations)."""
    from engine.core.scheduler import SchedulerOutput
    from engine.core.sequence import SequenceGroup
    from engine.sampler import Sampler
    logits = torch.tensor([[1.0, 2.0, 0.5, 1.5, -1.0], [0.0, 0.0, 3.0, 0.0, 0.0]])
    p = logits[0].softmax(-1)
    sampler = Sampler(torch.device("cpu"), seed=0)
    group = SequenceGroup("r", [1, 2, 3], SamplingParams(temperature=1.0, max_tokens=8), 0.0)
    seq = group.seqs[0]
    counts = torch.zeros(5)
    accepted = 0
    n = 1500
    for _ in range(n):
        out = SchedulerOutput(False, [group], [seq], 2, spec_token_ids={seq.seq_id: [1]})
        tokens = sampler.verify(out, logits, [2], zero_logprobs=False)[seq.seq_id]
        counts[tokens[0][0]] += 1
        accepted += tokens[0][0] == 1
        assert len(tokens) == (2 if tokens[0][0] == 1 else 1)
    assert torch.allclose(counts / n, p, atol=0.05)
    assert abs(accepted / n - float(p[1])) < 0.05


# -- KV: lookahead slots, rollback, prefix caching, chunked prefill, preemption -------------------

def _check_slots(llm: LLM) -> None:
    """Between steps each running sequence holds blocks for its computed tokens only (plus, for a
    prompt not yet computed, its scheduled chunk): rejected drafts' slots were given back."""
    engine = llm.engine
    bs = engine.allocator.block_size
    for group in engine.scheduler.running:
        seq = group.seqs[0]
        if seq.num_tokens > seq.prompt_len and seq.num_computed_tokens == seq.num_tokens - 1:
            assert len(engine.allocator.block_table(seq)) == -(-seq.num_computed_tokens // bs)


def step_all(llm: LLM, prompts, params) -> dict[str, list[int]]:
    engine = llm.engine
    for i, p in enumerate(prompts):
        engine.add_request(str(i), {"prompt_token_ids": p}, params)
    outs = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            outs[o.request_id] = o.outputs[0].token_ids
        _check_slots(llm)
    return [outs[str(i)] for i in range(len(prompts))]


@pytest.mark.parametrize("policy", [{}, {"enable_chunked_prefill": True, "max_num_batched_tokens": 32,
                                          "max_num_seqs": 8}])
def test_rejected_slots_are_given_back(llama_dir, policy):
    prompts = prompts_of((20, 33), seed=0) + [repetitive(1), repetitive(2, period=4, times=8)]
    params = SamplingParams(temperature=0, max_tokens=30)
    base, spec = pair(llama_dir, block_size=8, num_gpu_blocks=200, **policy)
    assert step_all(spec, prompts, params) == step_all(base, prompts, params)
    stats = spec.engine.spec_decoding_stats
    assert stats.num_accepted_tokens < stats.num_draft_tokens      # some drafts were rejected
    assert spec.engine.allocator.num_free_blocks() == base.engine.allocator.num_free_blocks()
    assert spec.engine.allocator.token_slots_used() == base.engine.allocator.token_slots_used() == 0


def test_chunked_prefill_counts_drafts_in_the_budget(llama_dir):
    prompts = prompts_of((70, 37, 50), seed=4) + [repetitive(1), repetitive(2, period=4, times=8)]
    params = SamplingParams(temperature=0, max_tokens=24)
    budget = 16
    base, spec = pair(llama_dir, block_size=8, num_gpu_blocks=200, enable_chunked_prefill=True,
                      max_num_batched_tokens=budget, max_num_seqs=8)
    steps = []
    spec.engine.step_observer = lambda out: steps.append((list(out.scheduled_tokens()), out.spec_token_ids))
    assert run(spec, prompts, params) == run(base, prompts, params)
    assert all(sum(counts) <= budget for counts, _ in steps)
    drafted = [(counts, s) for counts, s in steps if s]
    assert drafted and any(any(n > 1 + 4 for n in counts) or len(counts) > len(s) for counts, s in drafted)
    # A step mixing a prompt chunk with verified drafts happened.
    assert any(len(counts) > len(s) and max(counts) > 5 for counts, s in drafted)
    check_stats(spec.engine.spec_decoding_stats)


@pytest.mark.parametrize("policy", [{}, {"enable_chunked_prefill": True, "max_num_batched_tokens": 64,
                                          "max_num_seqs": 8}])
def test_prefix_caching(llama_dir, policy):
    shared = repetitive(5, period=8, times=3)
    prompts = prompts_of((5, 11, 3), seed=8, prefix=shared)
    params = SamplingParams(temperature=0, max_tokens=30)
    base, spec = pair(llama_dir, block_size=8, num_gpu_blocks=200, enable_prefix_caching=True, **policy)
    first = run(spec, prompts[:1], params)
    assert first == run(base, prompts[:1], params)
    assert run(spec, prompts[1:], params) == run(base, prompts[1:], params)
    # The second round hit the first's blocks (registered from accepted tokens only): fewer
    # prompt tokens were computed than the prompts hold, as without speculation.
    computed = sum(r.prefill_tokens for r in spec.engine.steps)
    assert computed == sum(r.prefill_tokens for r in base.engine.steps) < sum(map(len, prompts))
    assert spec.engine.spec_decoding_stats.num_accepted_tokens > 0


@pytest.mark.parametrize("policy,blocks", [({"policy": "paper"}, 14),
                                           ({"policy": "paper", "preemption_mode": "swap", "swap_space": 0.01}, 14),
                                           ({"enable_chunked_prefill": True, "max_num_batched_tokens": 32,
                                             "max_num_seqs": 8}, 15)])
def test_preemption_with_a_tiny_cache(llama_dir, policy, blocks):
    prompts = [repetitive(1, period=6, times=5), repetitive(2, period=4, times=8), prompts_of((28,), 3)[0]]
    params = SamplingParams(temperature=0, max_tokens=40)
    base, spec = pair(llama_dir, block_size=8, num_gpu_blocks=blocks, max_model_len=80, **policy)
    want = run(base, prompts, params)
    assert run(spec, prompts, params) == want
    assert spec.engine.scheduler.preemptions[policy.get("preemption_mode", "recompute")] > 0
    assert spec.engine.allocator.num_free_blocks() == base.engine.allocator.num_free_blocks()
    check_stats(spec.engine.spec_decoding_stats)
    assert spec.engine.spec_decoding_stats.num_accepted_tokens > 0


def test_metrics_page_has_vllms_spec_decode_counters(llama_dir):
    from engine.entrypoints.openai.metrics import ServerStats, render
    llm = LLM(llama_dir, block_size=8, num_gpu_blocks=64, speculative_config=NGRAM)
    run(llm, [repetitive(1)], SamplingParams(temperature=0, max_tokens=20))
    stats = llm.engine.spec_decoding_stats
    page = render(llm.engine, ServerStats(), "m")
    assert f'vllm:spec_decode_num_drafts_total{{model_name="m"}} {stats.num_drafts}' in page
    assert f'vllm:spec_decode_num_draft_tokens_total{{model_name="m"}} {stats.num_draft_tokens}' in page
    assert f'vllm:spec_decode_num_accepted_tokens_total{{model_name="m"}} {stats.num_accepted_tokens}' in page
    assert (f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="m",position="0"}} '
            f'{stats.num_accepted_tokens_per_pos[0]}') in page
    plain = LLM(llama_dir, block_size=8, num_gpu_blocks=64)
    assert "spec_decode" not in render(plain.engine, ServerStats(), "m")


@pytest.mark.parametrize("name", ["sharegpt", "alpaca", "chatbot", "prefix", "parallel", "beam", "fixed", "uniform",
                                  "random"])
def test_builtin_workloads_give_the_same_outputs(llama_dir, name):
    """Each built-in workload's first requests (prompts cut to 64 tokens, outputs to 16), with the
    sampling parameters the trace asks for (greedy; n parallel samples; beam search), give the
    same outputs with and without speculation, with prefix caching on."""
    from workloads.make import make_trace
    trace = make_trace(name, num_requests=4, seed=0)
    prompts = [trace.prompt_token_ids(r, 200)[-64:] for r in trace.requests]
    params = [r.sampling_params(max_tokens=min(r.output_len, 16), seed=7) for r in trace.requests]
    policy = "paper" if name == "beam" else "vllm-v1"     # vLLM v1 has no beam search
    base, spec = pair(llama_dir, block_size=8, num_gpu_blocks=256, enable_prefix_caching=True, policy=policy)
    outputs = [[[c.token_ids for c in o.outputs] for o in llm.generate(prompts, params, use_tqdm=False)]
               for llm in (base, spec)]
    assert outputs[0] == outputs[1]
    check_stats(spec.engine.spec_decoding_stats)


@pytest.mark.filterwarnings("ignore:.*max_tokens exceeds the model")
@pytest.mark.parametrize("policy,blocks", [({}, 9), ({"enable_chunked_prefill": True, "max_num_seqs": 8}, 9)])
def test_a_request_that_fills_the_whole_cache_still_finishes(llama_dir, policy, blocks):
    """Drafts never ask for more slots than the request's last plain decode, so one that fits
    the cache alone is never preempted by its own lookahead (no livelock)."""
    prompt = repetitive(2, period=4, times=8)                        # 32 tokens
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)   # ends at the context, 64
    base, spec = pair(llama_dir, block_size=8, num_gpu_blocks=blocks, max_model_len=64, **policy)
    engine = spec.engine
    engine.add_request("r", {"prompt_token_ids": prompt}, params)
    outs = []
    for _ in range(64):
        outs += engine.step()
        if not engine.has_unfinished_requests():
            break
    assert outs and outs[0].outputs[0].token_ids == run(base, [prompt], params)[0]
    assert len(outs[0].outputs[0].token_ids) == 32 and outs[0].outputs[0].finish_reason == "length"
    assert sum(engine.scheduler.preemptions.values()) == 0
    assert engine.spec_decoding_stats.num_accepted_tokens > 0
