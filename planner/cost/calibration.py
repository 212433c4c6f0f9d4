"""The measured model's calibrated constants (host time, kernel floor), loaded with the record of where they come from.

The constants live in planner/data/measured_calibration.json, each with its
value, unit, physical meaning and whether it was fitted; the file's `source`
says which public runs the fitted ones were fitted to (NVIDIA's end-to-end
vLLM runs on H100 that aiconfigurator-core ships in systems/silicon_sample.csv),
which runs were held out, the MAPE before and after, and the command that
refits them (bench/bench_silicon_h100.py --fit --write). docs/calibration.md
has the figures. Nothing here is a per-model or per-run factor: each constant
is a time that vLLM spends per kernel, per step or per scheduled sequence.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from planner.errors import PlannerError

CALIBRATION_FILE = "data/measured_calibration.json"
CONSTANTS = ("elementwise_floor_s", "host_step_s", "host_seq_s")


@dataclass(frozen=True)
class Calibration:
    """The fitted constants (seconds) and where they come from."""

    elementwise_floor_s: float    # a memory-bound kernel's time beyond its bytes (launch and ramp, in a graph)
    host_step_s: float            # vLLM's host work per engine step (schedule, inputs, sync, outputs)
    host_seq_s: float             # ... and per scheduled sequence
    source: dict                  # the file's record: runs, rows fitted and held out, figures, how to refit

    def describe(self) -> str:
        return (f"{self.source.get('fitted_to', 'fitted')} ({CALIBRATION_FILE}: "
                f"{', '.join(f'{k}={getattr(self, k) * 1e6:.1f} us' for k in CONSTANTS)})")


@lru_cache(maxsize=1)
def load_calibration() -> Calibration:
    """The shipped constants; a missing or damaged file is a one-line error naming it."""
    try:
        doc = json.loads(resources.files("planner").joinpath(CALIBRATION_FILE).read_text(encoding="utf-8"))
        values = {name: float(doc["constants"][name]["value"]) for name in CONSTANTS}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PlannerError(f"planner/{CALIBRATION_FILE} is unreadable ({type(exc).__name__}: {exc})") from None
    if any(v < 0 for v in values.values()):
        raise PlannerError(f"planner/{CALIBRATION_FILE}: a fitted time is negative")
    return Calibration(**values, source=dict(doc.get("source", {})))
