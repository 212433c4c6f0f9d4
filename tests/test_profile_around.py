"""A quick profile timed in two halves around a live run: the halves' samples pool into one profile."""
from __future__ import annotations

import pytest

from planner.errors import PlannerError
from planner.profile.around import ProfileAround, pool_profiles
from planner.profile.run import ProfileOptions
from tests.test_calibrated import make_profile, synthetic_measurements


def _scaled(profile, factor, samples=3):
    """The same grid timed again on a device `factor` times slower: `samples` repetitions per point."""
    ms = [m.model_copy(update={"median_s": m.median_s * factor, "samples_s": [m.median_s * factor] * samples})
          for m in profile.measurements]
    return profile.model_copy(update={"measurements": ms})


def test_pooled_profile_rests_on_both_halves_samples_and_reports_the_drift():
    before = _scaled(make_profile(), 1.0)
    after = _scaled(make_profile(), 1.2, samples=4)
    pooled, drift = pool_profiles(before, after)
    assert drift == pytest.approx(1.2)
    assert pooled.grid.repeats == before.grid.repeats + after.grid.repeats
    for b, m in zip(before.measurements, pooled.measurements):
        assert len(m.samples_s) == 7
        assert m.median_s == pytest.approx(b.median_s * 1.2)          # the median of 3 x t and 4 x 1.2 t
    # The fit is redone on the pooled medians, not copied from a half.
    assert pooled.fit["decode"].model_dump() != before.fit["decode"].model_dump()


def test_points_only_one_half_timed_are_dropped_and_settings_must_agree():
    before, after = make_profile(), make_profile(synthetic_measurements()[:-1])
    pooled, _ = pool_profiles(before, after)
    assert len(pooled.measurements) == len(before.measurements) - 1
    with pytest.raises(PlannerError, match="differ in block_size"):
        pool_profiles(before, after.model_copy(update={"block_size": 32}))


def test_profile_around_times_a_half_before_and_after_and_saves_the_pool(tmp_path, monkeypatch):
    from planner.profile import around

    halves = iter([_scaled(make_profile(), 1.0), _scaled(make_profile(), 0.9)])
    seen = []
    monkeypatch.setattr(around, "run_profile", lambda opts: seen.append(opts) or next(halves))
    a = ProfileAround.quick("cpu", "opt-125m", 16, tmp_path / "p.json", say=lambda *_: None)
    with pytest.raises(RuntimeError):
        a.after_run()
    assert a.before_run().exists() and a.drift is None
    path = a.after_run()
    assert [o.repeats for o in seen] == [3, 3] and all(o.quick for o in seen)
    assert a.drift == pytest.approx(0.9) and "x0.900" in a.describe()
    assert "two halves" in path.read_text()
    assert isinstance(seen[0], ProfileOptions)


def test_halves_may_differ_in_free_memory_and_load_but_not_in_device():
    before = make_profile()
    busier = before.device.model_copy(update={"memory_bytes": 1 << 29, "load_average": 1.5})
    pool_profiles(before, before.model_copy(update={"device": busier}))
    other = before.device.model_copy(update={"device_name": "another cpu"})
    with pytest.raises(PlannerError, match="differ in device"):
        pool_profiles(before, before.model_copy(update={"device": other}))
