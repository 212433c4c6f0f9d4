"""A simulated run's typed result, its versioned JSON document and its tables.

`RunResult` holds the simulation (records and metrics), the analysis (steady
state and verdict), warnings and the cost model's blind spots. `document()`
is result.json (`schema_version`, fields in docs/results.md): the metrics at
the top level, then how the run was made. The per-request, per-step and
summary tables are pandas DataFrames for notebooks.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from engine.core.metrics import StepRecord, compute_metrics
from planner.documents import SCHEMA_VERSION, json_safe
from planner.runs.spec import RunSpec
from planner.sim import SimResult
from planner.sim.pd import PdResult


# What result.json's by_priority gives each priority class of the requests (vLLM's request priority).
PRIORITY_METRICS = ("num_submitted", "num_completed", "request_throughput", "ttft_mean", "ttft_median", "ttft_p99",
                    "tpot_mean", "tpot_p99", "e2e_mean", "e2e_p99")


def by_priority(requests: list, priority: int) -> dict:
    """The latencies of the requests of one priority (throughput over their own span)."""
    m = compute_metrics([r for r in requests if r.priority == priority], [])
    return {k: m[k] for k in PRIORITY_METRICS}


@dataclass
class RunResult:
    spec: RunSpec
    sim: SimResult
    steady_state: dict | None            # the metrics over the steady window (planner/analysis/verdict.py)
    verdict: dict                        # the run in plain words: state, what bound it, what to try next
    warnings: list[str] = field(default_factory=list)
    not_modelled: list[str] = field(default_factory=list)
    profile_check: dict | None = None    # the check of the profile priced with (planner/profile/check.py)
    intervals: dict | None = None        # with several seeds: each metric's mean and 90% interval

    @property
    def metrics(self):
        return self.sim.metrics

    def document(self) -> dict:
        """result.json: JSON-ready (NaN and infinity as null)."""
        sim = self.sim
        good = self.verdict.get("goodput") or {}       # with SLOs: vLLM bench's request_goodput and num_good
        doc = {"schema_version": SCHEMA_VERSION, **sim.summary(), **good, "memory_plan": sim.plan.memory_summary(),
               "wall_time": sim.wall_time,
               "simulated_seconds_per_wall_second": sim.simulated_time / sim.wall_time if sim.wall_time > 0 else None,
               "steady_state": self.steady_state, "verdict": self.verdict, "warnings": self.warnings,
               "not_modelled": self.not_modelled, "command": self.spec.command(),
               "deployment": sim.plan.deployment.as_dict()}      # the policy's defaults resolved for the GPU
        classes = sorted({r.priority for r in sim.requests})
        if len(classes) > 1:
            doc["by_priority"] = {str(p): by_priority(sim.requests, p) for p in classes}
        if self.profile_check is not None:
            doc["profile_check"] = self.profile_check
        if self.intervals is not None:
            doc["intervals"] = self.intervals
        return json_safe(doc)

    def request_columns(self) -> dict[str, list]:
        """The per-request columns only a fleet (its replica) or a P/D run (both pools' replicas) has."""
        if isinstance(self.sim, PdResult):
            return self.sim.pd.request_columns()
        return {} if self.sim.fleet is None else {"replica": self.sim.fleet.routes}

    def step_columns(self) -> dict[str, list]:
        """The per-step columns only a fleet (the replica) or a P/D run (the pool and its replica) has."""
        if isinstance(self.sim, PdResult):
            return self.sim.pd.step_columns()
        return {} if self.sim.fleet is None else {"replica": self.sim.fleet.step_replicas}

    def requests_frame(self):
        """One row per request: times, lengths and latencies (pandas)."""
        import pandas as pd            # pandas is slow to import and only tables need it
        rows = []
        extra = self.request_columns()
        for i, r in enumerate(self.sim.requests):
            ran = r.completed
            rows.append({**r.as_dict(), "ttft": r.ttft if ran else None, "tpot": r.tpot if ran else None,
                         "e2e": r.e2e if ran else None,
                         "normalized_latency": r.normalized_latency if ran else None,
                         **{name: values[i] for name, values in extra.items()}})
        return pd.DataFrame(rows)

    def steps_frame(self):
        """One row per engine step: its batch, tokens, KV use and duration (pandas)."""
        import pandas as pd
        names = [f.name for f in fields(StepRecord)]
        extra = self.step_columns()
        return pd.DataFrame([{**{n: getattr(s, n) for n in names}, "duration": s.end - s.start,
                              **{name: values[i] for name, values in extra.items()}}
                             for i, s in enumerate(self.sim.steps)])

    def summary_frame(self):
        """The headline metrics, whole run and steady state, one row each (pandas)."""
        import pandas as pd
        whole = {k: v for k, v in self.sim.metrics.to_dict().items() if isinstance(v, (int, float))}
        steady = {k: v for k, v in (self.steady_state or {}).items() if isinstance(v, (int, float))}
        return pd.DataFrame([whole, steady], index=["whole run", "steady state"])
