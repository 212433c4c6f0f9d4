"""A quick profile timed along a live run: points between the run's steps, the trace clock paused."""
from __future__ import annotations

import time

import pytest

from engine.deployment import Deployment

from planner.errors import PlannerError
from planner.profile.schema import load_profile
from planner.profile.along import ProfileAlong, drift_across, profile_for_live_run, speed_timeline
from planner.profile.around import ProfileAround
from planner.profile.run import ProfileOptions, ProfileSession
from planner.validation.live import TraceClock, run_live
from planner.validation.spec import ValidationSpec
from tests.test_calibrated import make_profile
from tests.test_profile import TINY_GRID, tiny_model  # noqa: F401  (the fixture)
from tiny_models import save_tiny_model
from workloads import make_trace

# It reads the wall clock (a live engine, a server, a time limit): scripts/test.sh runs it alone.
pytestmark = pytest.mark.serial


def _along(model, tmp_path, span_s=1.0, repeats=3) -> ProfileAlong:
    options = ProfileOptions(Deployment(model=str(model), gpu="cpu"), quick=True, repeats=repeats, grid_overrides=TINY_GRID)
    return ProfileAlong(options, tmp_path / "p.json", span_s, say=lambda *_: None)


def test_points_are_timed_before_between_and_after_the_run_until_the_grid_is_repeated(tiny_model, tmp_path):
    along = _along(tiny_model, tmp_path)
    with pytest.raises(RuntimeError):
        along.between_steps(0.01, 0.0)
    along.before_run()                          # nothing timed before the live engine loads
    with pytest.raises(RuntimeError):
        along.between_steps(0.01, 0.0)
    first = load_profile(along.before_steps())  # no live runner: on a copy of the model built for it
    # Before the run: the warm-up round and one measured round of every point, already a usable profile.
    assert first.grid.repeats == 1 and all(len(m.samples_s) == 1 for m in first.measurements)
    assert 0 < along.duty <= 4
    for k in range(3):                       # 0.9 s of live steps: not yet a slice's worth
        along.between_steps(0.3, 0.5 * k)
    assert along.profiling_s == 0 and not along.slices
    for k in range(3, 20):
        along.between_steps(0.3, 0.5 * k)
        if along.sliced_at_s == along.busy_s:     # a slice now: profiling caught up with the run
            assert along.profiling_s >= along.duty * along.busy_s or along.session.timer.rounds_done == 1 + 3 * 3
    times = [now for now, _ in along.slices]
    assert times[0] == 1.5 and all(b - a >= 1.5 for a, b in zip(times, times[1:]))
    profile = load_profile(along.after_run())
    assert profile.grid.repeats >= 3 and min(len(m.samples_s) for m in profile.measurements) >= 3
    assert {m.component for m in profile.measurements} == {m.component for m in first.measurements}
    assert "between its steps" in profile.grid.notes[-1]
    assert along.drift is not None and f"x{along.drift:.3f}" in along.describe()
    assert f"of its {profile.grid.repeats} rounds" in along.describe()


def test_the_speed_timeline_reads_each_slices_forward_passes_against_their_medians():
    medians = [0.1, 0.2, 0.0]                  # point 2: a host-side point, left out
    slow = [(0, 0.11), (1, 0.22)] * 4 + [(2, 5.0)] * 9
    fast = [(0, 0.09), (1, 0.18)] * 4
    timeline = speed_timeline([(1.0, slow), (3.0, fast), (4.0, fast[:3])], medians)
    assert timeline.times == [1.0, 3.0] and timeline.factors == pytest.approx([1.1, 0.9])
    assert timeline(0.0) == pytest.approx(1.1) and timeline(2.0) == pytest.approx(1.0)
    assert timeline(9.0) == pytest.approx(0.9)
    assert speed_timeline([(1.0, fast[:3])], medians) is None


def test_the_simulation_follows_the_device_speed():
    from planner.catalog import resolve_gpu, resolve_model
    from planner.cost.linear import LinearCostModel
    from planner.sim import simulate
    from sim_helpers import sim_plan

    trace = make_trace("sharegpt", num_requests=8, rate=2.0, seed=0).scaled(length_scale=0.1, max_output_len=16)
    config = sim_plan(resolve_model("opt-125m"), resolve_gpu("a100-40g"))
    cost = LinearCostModel(0.01, 0.0001)
    plain = simulate(trace, config, cost)
    steady = simulate(trace, config, cost, device_speed=lambda t: 1.0)
    assert [s.end for s in steady.steps] == pytest.approx([s.end for s in plain.steps])
    # Twice as slow from t = 1 s: every step that starts then takes twice its price.
    slowed = simulate(trace, config, cost, device_speed=lambda t: 2.0 if t >= 1.0 else 1.0)
    for step, shape in zip(slowed.steps, slowed.shapes):
        factor = 2.0 if step.start >= 1.0 else 1.0
        assert step.end - step.start == pytest.approx(cost.step_time(shape) * factor)
    assert slowed.metrics["e2e_mean"] > plain.metrics["e2e_mean"]


def test_a_run_far_longer_than_its_arrivals_stops_sampling_at_three_times_the_rounds(tiny_model, tmp_path):
    along = _along(tiny_model, tmp_path, span_s=1e-3, repeats=2)
    along.before_steps()
    for _ in range(100):
        along.between_steps(1.0, 0.0)             # each step "took" a second: the duty is never met
    timer = along.session.timer
    assert timer.rounds_started == timer.rounds_done == timer.warmup + 3 * 2
    along.after_run()


def test_drift_compares_the_later_half_of_each_points_repetitions_with_the_earlier():
    profile = make_profile()
    ms = [m.model_copy(update={"samples_s": [1.0, 1.0, 1.1, 1.1]}) for m in profile.measurements]
    assert drift_across(profile.model_copy(update={"measurements": ms})) == pytest.approx(1.1)


def test_a_model_profiled_per_layer_cannot_be_timed_along_a_run(tiny_model):
    with pytest.raises(PlannerError, match="cannot be interleaved"):
        ProfileSession(ProfileOptions(Deployment(model=str(tiny_model), gpu="cpu"), quick=True, per_layer=True,
                                      grid_overrides=TINY_GRID))


def test_a_cpu_is_profiled_along_the_run_a_gpu_around_it(tmp_path):
    assert isinstance(profile_for_live_run("cpu", "opt-125m", 16, tmp_path / "p.json", 8.0), ProfileAlong)
    assert isinstance(profile_for_live_run("h200", "opt-125m", 16, tmp_path / "p.json", 8.0), ProfileAround)


def test_paused_time_is_not_trace_time():
    clock = TraceClock()
    clock.start()
    with clock.paused():
        time.sleep(0.2)
    assert clock() < 0.1


def test_work_between_steps_takes_no_trace_time(tmp_path):
    # 0.2 s of "profiling" after every step: were the clock running, every request's latency and the
    # run's duration would include it (long enough that the run's own work, slow on a loaded machine,
    # stays well inside the bound).
    spec = ValidationSpec(workload="alpaca", requests=4, rate=50, length_scale=0.1, max_output_len=8)
    trace = make_trace("alpaca", num_requests=4, rate=50, seed=0).scaled(length_scale=0.1, max_output_len=8)
    calls, runners = [], []

    class Profiler:
        def before_steps(self, runner):
            runners.append(runner)

        def between_steps(self, busy_s, now):
            calls.append(busy_s)
            time.sleep(0.2)

    folder = str(save_tiny_model("opt", tmp_path))
    live = run_live(trace, folder, spec, device="cpu", dtype="auto", profiler=Profiler())
    assert len(runners) == 1 and runners[0].model_path == folder      # the live engine's runner, once
    assert len(calls) == len(live.steps) >= 4 and all(b > 0 for b in calls)
    assert max(r.finish for r in live.requests) < 0.2 * len(calls) / 2
