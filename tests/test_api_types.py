"""The Python API refuses a value of the wrong type in one line naming the setting (a ValueError), instead of a
TypeError from deep inside a run or a nonsense value taken silently ('no' as true, 1.5 GPUs)."""
from __future__ import annotations

import math

import pytest

from engine.deployment import Deployment
from planner import RunSpec, simulate

SMALL = dict(model="opt-125m", gpu="a100-40g")


@pytest.mark.parametrize("field, value", [
    ("tp", "2"), ("pp", "x"), ("dp", "x"), ("max_num_seqs", "4"), ("max_num_batched_tokens", "x"),
    ("max_model_len", "x"), ("num_gpu_blocks", "x"), ("num_cpu_blocks", "x"), ("num_redundant_experts", "x"),
    ("dbo_decode_token_threshold", "x"), ("dbo_prefill_token_threshold", "x"),
    ("gpu_memory_utilization", "0.9"), ("gpu_memory_utilization", None), ("swap_space", "4"), ("swap_space", None),
    ("moe_skew", "0"), ("moe_skew", None), ("client_turnaround", "0"), ("client_turnaround", None),
    ("draft_persistence", "x"),
    # numbers that are not whole, or not numbers at all
    ("tp", 1.5), ("pp", 2.5), ("block_size", 16.0), ("max_num_seqs", 1.5), ("max_num_batched_tokens", 2048.5),
    ("num_gpu_blocks", 1.5), ("max_num_batched_tokens", math.inf), ("tp", None), ("pp", None), ("dp", None),
    # booleans, both ways
    ("async_scheduling", "no"), ("enable_prefix_caching", "yes"), ("enable_prefix_caching", 2), ("enable_eplb", 1),
    ("tp", True), ("gpu_memory_utilization", True),
    # strings
    ("model", 5), ("gpu", None), ("dtype", ["float16"]), ("policy", None), ("speculative", 3),
])
def test_a_deployment_setting_of_the_wrong_type_is_refused_naming_it(field, value):
    with pytest.raises(ValueError, match=f"^{field} must be"):
        Deployment(**{**SMALL, field: value})
    with pytest.raises(ValueError, match=f"^{field} must be"):
        Deployment(**SMALL).replace(**{field: value})     # a changed copy is checked as well


@pytest.mark.parametrize("knobs", [
    dict(tp=1), dict(tp=2, pp=2, dp=1), dict(max_num_seqs=None, max_num_batched_tokens=None, max_model_len=None,
                                             num_gpu_blocks=None, num_cpu_blocks=None, enable_prefix_caching=None,
                                             async_scheduling=None, quantization=None, speculative=None),
    dict(gpu_memory_utilization=1, swap_space=8, moe_skew=1, client_turnaround=0),      # an int where a float is
    dict(enable_prefix_caching=False, async_scheduling=True, max_num_seqs=64, max_num_batched_tokens=4096),
    dict(speculative="ngram:3", acceptance="0.8,0.6", draft_persistence=0.5), dict(dtype="half"),
])
def test_values_of_the_right_type_still_make_a_deployment(knobs):
    d = Deployment(**SMALL, **knobs)
    assert d.tp == knobs.get("tp", 1)


@pytest.fixture(scope="module")
def small():
    return Deployment(**SMALL)


@pytest.mark.parametrize("keyword, value", [
    ("requests", 1.5), ("requests", "4"), ("requests", math.nan), ("rate", "x"), ("duration", "10"),
    ("concurrency", "4"), ("concurrency", 1.5), ("concurrency", math.nan), ("seed", "x"), ("seed", 1.5),
    ("seeds", "2"), ("seeds", 1.5), ("workload", 5), ("workload", None), ("params", [1]), ("params", {1: 2}),
    ("slos", 5), ("slos", ["ttft_p99=2"]),
])
def test_a_simulate_keyword_of_the_wrong_type_is_refused_naming_it(small, keyword, value):
    with pytest.raises(ValueError, match=f"^{keyword} must be"):
        simulate(small, **{keyword: value})


@pytest.mark.parametrize("workload, params", [
    ("random", {"input_len": "x"}), ("random", {"input_len": 1.5}), ("random", {"range_ratio": "0.1"}),
    ("fixed", {"prompt_len": None}), ("chatbot", {"mean_turns": True}), ("sharegpt", {"arrival": 5}),
    ("sharegpt", {"cv": "2"}),
])
def test_a_workload_parameter_of_the_wrong_type_is_refused_naming_it(small, workload, params):
    with pytest.raises(ValueError, match=r"^params\['%s'\] must be" % next(iter(params))):
        simulate(small, workload=workload, requests=4, rate=2, params=params)


@pytest.mark.parametrize("target", [{}, 5, "opt-125m", [Deployment()]])
def test_the_target_must_be_a_deployment_or_a_run_spec(target):
    with pytest.raises(ValueError, match="^target must be a Deployment or a RunSpec"):
        simulate(target, requests=4, rate=2)


def test_a_simulation_with_keywords_of_the_right_type_runs(small):
    run = simulate(small, workload="sharegpt", requests=4, rate=2)
    assert run.metrics.num_completed == 4
    again = simulate(RunSpec(deployment=small).with_load(requests=4, rate=2.0), seeds=1)
    assert again.metrics.num_completed == 4
    typed = simulate(small, workload="random", requests=4, rate=2, seed=3, concurrency=None,
                     params={"input_len": 64, "output_len": 8, "range_ratio": 0, "arrival": "gamma", "cv": 2},
                     slos={"ttft_p99": 2})
    assert typed.metrics.num_completed == 4
