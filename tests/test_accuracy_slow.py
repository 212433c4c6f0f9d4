"""Accuracy as a test: a fresh quick profile, then short live validations, must meet the targets.

Slow (a quick profile of opt-125m and four live runs: about five minutes on 2
cores) and meaningful only on a quiet machine, so it is marked slow and left out
of CI's default run: `pytest -m slow tests/test_accuracy_slow.py`.
"""
from __future__ import annotations

import pytest

from planner.cli_validate import QUICK
from planner.profile_check import check_profile
from planner.profile_schema import load_profile, save_profile
from planner.profiling.run import ProfileOptions, run_profile
from planner.validate import ValidateConfig, validate

TARGETS = {"request_throughput": 0.05, "e2e_mean": 0.10, "step_time_median": 0.10}


@pytest.fixture(scope="module")
def fresh_profile(tmp_path_factory):
    path = save_profile(run_profile(ProfileOptions(gpu="cpu", model="opt-125m", quick=True)),
                        tmp_path_factory.mktemp("profile") / "p.json")
    # The profile was just measured here: its fingerprint matches this machine.
    assert check_profile(load_profile(path), path, canary=False).reason.startswith("fingerprint matches")
    return path


# What `scripts/main.sh` runs (validate --quick), and validate's default settings for both workloads and
# both scheduling policies.
CASES = {"main.sh": dict(workload="sharegpt", **QUICK), "sharegpt": dict(workload="sharegpt"),
         "alpaca": dict(workload="alpaca"), "sharegpt, chunked prefill": dict(workload="sharegpt",
                                                                             enable_chunked_prefill=True)}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_validation_after_a_fresh_profile_meets_the_targets(fresh_profile, case):
    v = validate(ValidateConfig(gpu="cpu", model="opt-125m", profile=str(fresh_profile), **CASES[case]))
    rows = v.comparison()
    errors = {name: rows[name]["relative_error"] for name in TARGETS}
    where = ", ".join(f"{name} {err:+.1%}" for name, err in errors.items()) + f"; attribution {v.attribution}"
    for name, limit in TARGETS.items():
        assert abs(errors[name]) <= limit, where
