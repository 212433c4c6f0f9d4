"""The chunked policy makes vLLM 0.19.0's decisions, step for step.

tests/data/vllm_0_19_scheduler_golden.json holds step logs that vLLM's own v1
Scheduler produced on the CPU with a fake model runner
(scripts/vllm_scheduler_golden.py) for random cases with chunked prompts,
tight caches (preemption), prefix sharing and reserve_full_isl on and off,
without chunked prefill (--no-enable-chunked-prefill) and with
long_prefill_token_threshold.
Replaying each case through our scheduler must give the same log: the tokens
per request in scheduling order, the preemptions, the finishes and the clock.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_replay import all_cases, replay

GOLDEN = json.loads((Path(__file__).parent / "data" / "vllm_0_19_scheduler_golden.json").read_text())


def test_golden_cases_are_the_generated_ones():
    # The golden file must describe the cases all_cases builds today.
    assert [{k: v for k, v in c.items() if k != "vllm_steps"} for c in GOLDEN["cases"]] == all_cases()


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: c["name"])
def test_same_steps_as_vllm(case):
    ours = replay(case)
    theirs = case["vllm_steps"]
    for i, (mine, vllm) in enumerate(zip(ours, theirs)):
        assert list(mine["tokens"].items()) == list(vllm["tokens"].items()), f"step {i}"
        assert mine == vllm, f"step {i}"
    assert len(ours) == len(theirs)


def test_the_cases_exercise_what_matters():
    steps = [s for c in GOLDEN["cases"] for s in c["vllm_steps"]]
    assert sum(len(s["preempted"]) for s in steps) > 0
    assert any(len(s["tokens"]) > 1 and 1 in s["tokens"].values() and max(s["tokens"].values()) > 1
               for s in steps)                                      # mixed steps
    assert any(c["config"]["caching"] for c in GOLDEN["cases"])
    assert any(not c["config"].get("chunked", True) for c in GOLDEN["cases"])
    assert any(c["config"].get("threshold") for c in GOLDEN["cases"])
