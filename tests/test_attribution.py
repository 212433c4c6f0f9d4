"""Error attribution: the replay cost model and the exact split of a validation's error."""
from __future__ import annotations

import pytest

from engine.core.metrics import RequestRecord
from planner.cost.wrappers import ReplayCost
from planner.validation.attribution import attribute, between_step_gaps
from planner.cost.shape import StepShape


class Fixed:
    name = "fixed"

    def step_time(self, shape):
        return 9.0


def test_replay_returns_the_measured_durations_in_order_then_falls_back():
    replay = ReplayCost([0.1, 0.2], Fixed())
    assert [replay.step_time(StepShape()) for _ in range(3)] == [0.1, 0.2, 9.0]


def test_parts_add_up_to_the_total_and_shares_to_one():
    a = attribute({"e2e_mean": 1.3}, {"e2e_mean": 1.1}, {"e2e_mean": 1.05}, {"e2e_mean": 1.0},
                  metrics=("e2e_mean",))["e2e_mean"]
    assert a["total_error"] == pytest.approx(0.3)
    assert a["step_time_model"]["error"] == pytest.approx(0.2)        # full vs replay
    assert a["between_steps"]["error"] == pytest.approx(0.05)         # replay vs replay + gaps
    assert a["scheduling"]["error"] == pytest.approx(0.05)            # replay + gaps vs live
    assert a["step_time_model"]["share"] == pytest.approx(2 / 3)
    none = attribute({"x": 1.0}, {"x": 1.0}, {"x": 1.0}, {"x": 1.0}, metrics=("x",))["x"]
    assert none["total_error"] == 0 and none["scheduling"]["share"] is None
    assert attribute({}, {}, {}, {}, metrics=("x",))["x"] is None


class SimpleStep:
    def __init__(self, start, end):
        self.start, self.end = start, end


def test_gaps_count_host_time_only_while_requests_wait():
    steps = [SimpleStep(0.0, 1.0), SimpleStep(1.2, 2.0), SimpleStep(5.0, 6.0)]
    r1 = RequestRecord(request_id="a", arrival=0.0, prompt_len=1, output_len=1, finish=1.9)
    r2 = RequestRecord(request_id="b", arrival=4.0, prompt_len=1, output_len=1, finish=5.9)
    # After step 1 request a waits: 0.2 s of host time. After step 2 nothing is running (idle until 4.0).
    assert between_step_gaps(steps, [r1, r2]) == pytest.approx([0.2, 0.0, 0.0])
