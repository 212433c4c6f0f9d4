"""Accuracy as a test: a fresh quick profile, then a short live validation, must meet the targets.

Slow (a quick profile of opt-125m and a live run: several minutes on 2 cores)
and meaningful only on a quiet machine, so it is marked slow and left out of CI's
default run: `pytest -m slow tests/test_accuracy_slow.py`.
"""
from __future__ import annotations

import pytest

from planner.profile_check import check_profile
from planner.profile_schema import load_profile, save_profile
from planner.profiling.run import ProfileOptions, run_profile
from planner.validate import ValidateConfig, validate


@pytest.mark.slow
@pytest.mark.parametrize("workload", ["sharegpt", "alpaca"])
def test_validation_after_a_fresh_profile_meets_the_targets(tmp_path, workload):
    path = save_profile(run_profile(ProfileOptions(gpu="cpu", model="opt-125m", quick=True)), tmp_path / "p.json")
    # The profile was just measured here: its fingerprint matches this machine.
    assert check_profile(load_profile(path), path, canary=False).reason.startswith("fingerprint matches")
    cfg = ValidateConfig(gpu="cpu", model="opt-125m", workload=workload, requests=24, rate=3.0, length_scale=0.15,
                         max_output_len=96, profile=str(path))
    v = validate(cfg)
    rows = v.comparison()
    throughput, e2e = rows["request_throughput"]["relative_error"], rows["e2e_mean"]["relative_error"]
    where = f"throughput {throughput:+.1%}, mean E2E {e2e:+.1%}, attribution {v.attribution}"
    assert abs(throughput) <= 0.05, where
    assert abs(e2e) <= 0.10, where
