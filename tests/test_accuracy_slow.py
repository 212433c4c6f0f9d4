"""Accuracy as a test: short live validations after a fresh profile must meet the targets.

Each case validates as `planner validate --reprofile` does: a quick profile,
half of it right before the live run and half right after. Slow (four quick
profiles and live runs of opt-125m: about ten minutes on 2 cores) and
meaningful only on a quiet machine, so it is marked slow and left out of CI's
default run: `pytest -m slow tests/test_accuracy_slow.py`.
"""
from __future__ import annotations

import pytest

from planner.cli_validate import QUICK
from planner.profile_check import check_profile
from planner.profile_schema import load_profile
from planner.profiling.around import ProfileAround
from planner.validate import ValidateConfig, validate

TARGETS = {"request_throughput": 0.05, "e2e_mean": 0.10, "step_time_median": 0.10}


# What `scripts/main.sh` runs (validate --quick), and validate's default settings for both workloads and
# both scheduling policies.
CASES = {"main.sh": dict(workload="sharegpt", **QUICK), "sharegpt": dict(workload="sharegpt"),
         "alpaca": dict(workload="alpaca"), "sharegpt, chunked prefill": dict(workload="sharegpt",
                                                                             enable_chunked_prefill=True)}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_validation_after_a_fresh_profile_meets_the_targets(tmp_path, case):
    around = ProfileAround.quick("cpu", "opt-125m", 16, tmp_path / "p.json", say=lambda *_: None)
    v = validate(ValidateConfig(gpu="cpu", model="opt-125m", **CASES[case]), around=around)
    # The profile was just measured here: its fingerprint matches this machine.
    assert check_profile(load_profile(around.path), around.path, canary=False).reason.startswith("fingerprint")
    rows = v.comparison()
    errors = {name: rows[name]["relative_error"] for name in TARGETS}
    where = ", ".join(f"{name} {err:+.1%}" for name, err in errors.items()) + f"; attribution {v.attribution}"
    for name, limit in TARGETS.items():
        assert abs(errors[name]) <= limit, where
