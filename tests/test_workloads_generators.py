"""Built-in workloads: distribution targets, filters, sharing structure, parameters."""

import re
from collections import Counter

import numpy as np
import pytest

from workloads import WORKLOADS, TraceError, make_trace, workload_params
from workloads import generators as g
from workloads.lengths import filtered_means, solve_mus

N = 10_000


def means(trace):
    return (
        float(np.mean([r.prompt_len for r in trace])),
        float(np.mean([r.output_len for r in trace])),
    )


def assert_within(actual, target, rel=0.03):
    assert abs(actual - target) <= rel * target, f"{actual:.2f} is not within {rel:.0%} of {target}"


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(
    "name,targets",
    [("sharegpt", (161.31, 337.99)), ("alpaca", (19.31, 58.45)), ("parallel", (19.31, 58.45)), ("beam", (19.31, 58.45))],
)
def test_paper_means_over_10k_requests(name, targets, seed):
    trace = make_trace(name, num_requests=N, seed=seed)
    prompt, output = means(trace)
    assert_within(prompt, targets[0])
    assert_within(output, targets[1])


@pytest.mark.parametrize("name", ["sharegpt", "alpaca"])
def test_vllm_filter_holds(name):
    trace = make_trace(name, num_requests=N, seed=3)
    p = np.array([r.prompt_len for r in trace])
    o = np.array([r.output_len for r in trace])
    assert p.min() >= 4 and o.min() >= 4 and p.max() <= 1024 and (p + o).max() <= 2048


def test_sharegpt_is_long_tailed():
    trace = make_trace("sharegpt", num_requests=N, seed=0)
    s = trace.stats()
    # mean well above median and a p99 several times the mean: the paper's "long tail"
    assert s["prompt_len_mean"] > 1.4 * s["prompt_len_median"]
    assert s["output_len_p99"] > 4 * s["output_len_mean"]


def test_calibrated_constants_are_what_the_solver_gives():
    for targets, sigmas, mus in (
        (g.SHAREGPT_TARGETS, g.SHAREGPT_SIGMAS, g.SHAREGPT_MUS),
        (g.ALPACA_TARGETS, g.ALPACA_SIGMAS, g.ALPACA_MUS),
    ):
        solved = solve_mus(targets[0], sigmas[0], targets[1], sigmas[1])
        assert solved == pytest.approx(mus, abs=1e-6)
        exact = filtered_means(mus[0], sigmas[0], mus[1], sigmas[1])
        assert exact[:2] == pytest.approx(targets, rel=1e-6)


def test_filtered_means_agree_with_sampling():
    # the exact sums and the sampler describe the same distribution
    mp, mo = 4.0, 5.0
    exact_p, exact_o, _ = filtered_means(mp, 1.0, mo, 1.2)
    from workloads.lengths import sample_filtered_pairs

    p, o = sample_filtered_pairs(np.random.default_rng(0), 200_000, mp, 1.0, mo, 1.2)
    assert p.mean() == pytest.approx(exact_p, rel=0.01)
    assert o.mean() == pytest.approx(exact_o, rel=0.01)


@pytest.mark.parametrize("shots,prefix_len", [(1, 80), (5, 341)])
def test_prefix_workload(shots, prefix_len):
    trace = make_trace("prefix", num_requests=N, shots=shots, seed=0)
    assert {r.prefix_len for r in trace} == {prefix_len}
    assert {r.prefix_id for r in trace} == {f"prefix-{prefix_len}-0"}
    unique_mean = float(np.mean([r.prompt_len - r.prefix_len for r in trace]))
    _, output = means(trace)
    assert_within(unique_mean, g.PREFIX_TARGETS[0])
    assert_within(output, g.PREFIX_TARGETS[1])
    several = make_trace("prefix", num_requests=300, num_prefixes=3, prefix_len=50)
    assert len({r.prefix_id for r in several}) == 3 and {r.prefix_len for r in several} == {50}


def test_parallel_and_beam_set_their_width():
    assert {r.n for r in make_trace("parallel", num_requests=20, n=6)} == {6}
    beam = make_trace("beam", num_requests=20, beam_width=2)
    assert {(r.beam_width, r.n) for r in beam} == {(2, 1)}


def test_fixed_and_uniform():
    fixed = make_trace("fixed", num_requests=100, prompt_len=512, output_len=7)
    assert {(r.prompt_len, r.output_len) for r in fixed} == {(512, 7)}
    uni = make_trace("uniform", num_requests=N, prompt_min=10, prompt_max=90, output_min=100, output_max=300)
    p = [r.prompt_len for r in uni]
    o = [r.output_len for r in uni]
    assert min(p) == 10 and max(p) == 90 and min(o) == 100 and max(o) == 300
    assert_within(float(np.mean(p)), 50.0)
    assert_within(float(np.mean(o)), 200.0)


def test_chatbot_structure():
    trace = make_trace("chatbot", num_requests=3000, rate=2.0, seed=0)
    assert len(trace) == 3000
    by_conv = {}
    for r in trace:
        assert r.prompt_len <= 1024 and r.output_len <= 1024
        by_conv.setdefault(r.conversation_id, []).append(r)
    assert 500 < len(by_conv) < 1000  # mean 4 turns per conversation
    for turns in by_conv.values():
        turns.sort(key=lambda r: r.turn)
        assert [r.turn for r in turns] == list(range(len(turns)))
        for prev, cur in zip(turns, turns[1:]):
            # arrives after the previous answer (output_len * 0.05 s) plus a think time
            assert cur.arrival_time >= prev.arrival_time + prev.output_len * 0.05 - 1e-6
            if cur.prefix_len:  # untruncated: the prompt is the whole history + the new message
                assert cur.prefix_len == prev.prompt_len + prev.output_len < cur.prompt_len
            else:
                assert cur.prompt_len == 1024
    # long conversations hit the 1024-token window
    assert sum(r.prompt_len == 1024 for r in trace) > 100


def test_chatbot_duration_bound_and_rate():
    trace = make_trace("chatbot", duration=600.0, rate=4.0, seed=1)
    assert max(r.arrival_time for r in trace) < 600.0
    # conversations start at rate / mean_turns; over a window the request rate is close to rate
    assert 3.0 < len(trace) / 600.0 < 5.0


def test_unknown_workload_and_parameters():
    with pytest.raises(TraceError, match="unknown name 'nope'"):
        make_trace("nope", num_requests=1)
    with pytest.raises(TraceError, match="colour: not a parameter of workload 'alpaca'"):
        make_trace("alpaca", num_requests=1, colour=3)
    with pytest.raises(TraceError, match="shots"):
        make_trace("prefix", num_requests=1, shots=3)
    with pytest.raises(TraceError, match="num_requests/duration"):
        make_trace("alpaca")
    with pytest.raises(TraceError, match="arrival"):
        make_trace("alpaca", num_requests=5, arrival="trace")


@pytest.mark.parametrize("name, params, message", [
    ("fixed", {"prompt_len": 10**11}, "'fixed' with prompt_len=100000000000, output_len=128: a request's prompt_len "
                                      "100,000,000,000 is over the cap of 10,000,000 tokens"),
    ("random", {"output_len": 10**8}, "a request's output_len 100,000,000 is over the cap"),
    ("prefix", {"prefix_len": 10**11}, "a request's prompt_len 100,000,000,0"),
    ("parallel", {"n": 10**11}, "a request's n 100,000,000,000 is over the cap of 1,024 sequences"),
    ("beam", {"beam_width": 2000}, "a request's beam_width 2,000 is over the cap of 1,024 sequences"),
])
def test_generated_requests_keep_a_trace_files_caps(name, params, message):
    """A parameter's typo (1e11 tokens) is refused as a file's would be, not left to exhaust memory in a run."""
    with pytest.raises(TraceError, match=re.escape(message)):
        make_trace(name, num_requests=4, **params)
    assert len(make_trace(name, num_requests=4)) == 4


def test_every_workload_is_listed_and_builds():
    assert set(WORKLOADS) == {"sharegpt", "alpaca", "chatbot", "prefix", "parallel", "beam", "fixed", "uniform",
                              "random", "prefix_repetition"}
    for name in WORKLOADS:
        trace = make_trace(name, num_requests=30, rate=1.0)
        assert len(trace) == 30 and trace.name == name
        assert trace.params["workload"] == name and set(workload_params(name)) <= set(trace.params)


def test_lengths_do_not_depend_on_arrivals():
    a = make_trace("sharegpt", num_requests=200, rate=1.0, seed=5)
    b = make_trace("sharegpt", num_requests=200, arrival="gamma", cv=3.0, rate=9.0, seed=5)
    assert [r.prompt_len for r in a] == [r.prompt_len for r in b]
    # a shorter trace's lengths are a prefix of a longer one's (its times are scaled to its own count, as
    # vllm bench scales them: workloads/arrivals.py)
    c = make_trace("sharegpt", num_requests=50, rate=1.0, seed=5)
    assert [(r.prompt_len, r.output_len) for r in c] == [(r.prompt_len, r.output_len) for r in a.requests[:50]]


def test_random_takes_vllm_bench_lengths_within_the_range_ratio():
    exact = make_trace("random", num_requests=50, input_len=300, output_len=40)
    assert {(r.prompt_len, r.output_len) for r in exact.requests} == {(300, 40)}
    spread = make_trace("random", num_requests=2000, input_len=300, output_len=40, range_ratio=0.5)
    prompts = [r.prompt_len for r in spread.requests]
    assert min(prompts) >= 150 and max(prompts) <= 450 and 280 < sum(prompts) / len(prompts) < 320
    with pytest.raises(TraceError, match="range_ratio"):
        make_trace("random", num_requests=5, range_ratio=1.5)


def test_random_prefix_len_puts_one_shared_prefix_before_every_prompt():
    # vllm bench serve --random-prefix-len: prompt = the same prefix_len tokens + the request's own input
    trace = make_trace("random", num_requests=20, input_len=300, output_len=40, range_ratio=0.5, prefix_len=128)
    plain = make_trace("random", num_requests=20, input_len=300, output_len=40, range_ratio=0.5)
    assert [r.prompt_len for r in trace] == [r.prompt_len + 128 for r in plain]     # the same draws, prefixed
    ids = [trace.prompt_token_ids(r, 32000, 0) for r in trace]
    assert all(i[:128] == ids[0][:128] for i in ids) and len({tuple(i[128:136]) for i in ids}) == 20
    with pytest.raises(TraceError, match="prefix_len"):
        make_trace("random", num_requests=5, prefix_len=-1)


@pytest.mark.parametrize("name", WORKLOADS)
def test_a_window_without_arrivals_makes_an_empty_trace(name):
    # (the planner then says the trace is empty; sampling zero lengths once crashed in numpy)
    assert len(make_trace(name, duration=0.0, rate=1.0, seed=0)) == 0


def test_low_priority_share_marks_requests_without_moving_lengths_or_arrivals():
    # every workload's -p low_priority_share=S: that share at priority 1 (vLLM's request priority), drawn from a
    # stream of its own, so the lengths and arrival times are those of the same trace without it
    plain = make_trace("random", num_requests=2000, rate=4.0, seed=3)
    marked = make_trace("random", num_requests=2000, rate=4.0, seed=3, low_priority_share=0.25)
    assert [r.model_copy(update={"priority": 0}) for r in marked] == plain.requests
    assert sum(r.priority for r in marked) / 2000 == pytest.approx(0.25, abs=0.03)
    assert marked.stats()["priority_1_share"] == sum(r.priority for r in marked) / 2000
    assert "priority_1_share" not in plain.stats() and {r.priority for r in plain} == {0}
    with pytest.raises(TraceError, match="low_priority_share: the share of requests sent with priority 1"):
        make_trace("alpaca", num_requests=5, rate=1.0, low_priority_share=1.5)


def test_prefix_repetition_is_vllm_benchs_dataset():
    # PrefixRepetitionRandomDataset: K prefixes of P tokens, each prompt one of them + S tokens of its own, O out;
    # each prefix an equal share of the requests, shuffled
    trace = make_trace("prefix_repetition", num_requests=40, prefix_len=64, suffix_len=32, num_prefixes=4,
                       output_len=10, seed=3)
    assert {(r.prompt_len, r.output_len, r.prefix_len) for r in trace} == {(96, 10, 64)}
    by_prefix = {}
    for r in trace:
        by_prefix.setdefault(r.prefix_id, []).append(trace.prompt_token_ids(r, 32000, 3))
    assert sorted(len(v) for v in by_prefix.values()) == [10, 10, 10, 10]
    assert [r.prefix_id for r in trace][:4] != sorted(r.prefix_id for r in trace)[:4]      # shuffled
    for ids in by_prefix.values():
        assert all(i[:64] == ids[0][:64] for i in ids) and len({tuple(i[64:]) for i in ids}) == len(ids)
    assert len({tuple(ids[0][:64]) for ids in by_prefix.values()}) == 4
    defaults = make_trace("prefix_repetition", num_requests=13)
    assert {(r.prompt_len, r.output_len, r.prefix_len) for r in defaults} == {(512, 128, 256)}
    assert sorted(Counter(r.prefix_id for r in defaults).values()) == [1] * 7 + [2] * 3      # 13 over 10
    with pytest.raises(TraceError, match="num_prefixes"):
        make_trace("prefix_repetition", num_requests=5, num_prefixes=0)
