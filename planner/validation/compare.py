"""A validation's result: the live run, the simulation of the same trace, and their comparison."""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.metrics import RequestRecord, StepRecord, percentile
from planner.catalog import ModelSpec
from planner.cost.shape import StepShape
from planner.profile.speed import SpeedLevel, SpeedTimeline
from planner.validation.spec import ValidationSpec
from planner.validation.spread import Spread, place

# Metrics compared, in report order.
COMPARED = ("request_throughput", "output_token_throughput", "ttft_mean", "ttft_median", "ttft_p99",
            "tpot_mean", "tpot_median", "tpot_p99", "itl_mean", "itl_p99", "e2e_mean", "e2e_median", "e2e_p99",
            "normalized_latency", "mean_batch_size", "mean_prefill_batch_size", "kv_utilization", "preemptions",
            "step_time_median")


@dataclass
class LiveRun:
    requests: list[RequestRecord]
    steps: list[StepRecord]
    shapes: list[StepShape]
    metrics: dict
    num_gpu_blocks: int
    num_cpu_blocks: int
    max_model_len: int
    max_num_batched_tokens: int
    kernels: str
    speed: tuple[float | None, float | None] = (None, None)   # canary ratios before and after the run
    spec_decoding: dict | None = None    # the engine's SpecDecodingStats (vLLM's names) with --speculative ngram:K
    max_num_seqs: int | None = None      # the limits the engine resolved for its device (None: a recorded run's
    enable_prefix_caching: bool | None = None   # own deployment, resolved by the plan)
    kv_offload: dict | None = None       # the CPU tier's counters (OffloadStats.as_dict) with --kv-offloading-size


@dataclass
class Validation:
    spec: ValidationSpec
    model: ModelSpec
    live: LiveRun
    simulated: dict
    sim_steps: list[StepRecord]
    sim_requests: list[RequestRecord]
    cost_model: str
    step_errors: list[float] = field(default_factory=list)   # per live step: predicted / measured - 1
    attribution: dict | None = None      # the error split by source (planner/validation/attribution.py)
    profile_check: dict | None = None    # ProfileCheck.as_dict() of the profile used, when it was checked
    speed_level: SpeedLevel | None = None
    speed_timeline: SpeedTimeline | None = None   # the device's speed through the run (profiled along it)
    uncorrected: dict | None = None      # the simulated metrics without the speed level or timeline
    spread: Spread | None = None         # K simulations with timing noise (planner/validation/spread.py)
    warnings: list[str] = field(default_factory=list)   # the trace's on the deployment (runs/trace_warnings.py)

    def comparison(self) -> dict[str, dict[str, float | bool | None]]:
        """Per metric: measured, simulated (noiseless), relative_error, and against the noisy simulations'
        interval: interval_low, interval_high, inside_interval, interval_miss (None without a spread)."""
        rows = {}
        intervals = self.spread.intervals if self.spread is not None else {}
        for name in COMPARED:
            measured, simulated = metric(self.live.metrics, name), metric(self.simulated, name)
            bounds = intervals.get(name)
            inside, miss = place(measured, bounds)
            rows[name] = {"measured": measured, "simulated": simulated,
                          "relative_error": _relative(measured, simulated),
                          "interval_low": bounds["low"] if bounds else None,
                          "interval_high": bounds["high"] if bounds else None,
                          "inside_interval": inside, "interval_miss": miss}
        return rows

    def uncorrected_errors(self) -> dict[str, float | None]:
        """Relative errors of the headline metrics had the simulation used the profile as it is, at one speed."""
        if self.uncorrected is None:
            return {}
        return {name: _relative(metric(self.live.metrics, name), metric(self.uncorrected, name))
                for name in ("request_throughput", "e2e_mean", "step_time_median")}

    def step_error_summary(self) -> dict[str, float]:
        errs = [abs(e) for e in self.step_errors]
        if not errs:
            return {}
        return {"median_abs": percentile(errs, 50), "p90_abs": percentile(errs, 90),
                "mean": sum(self.step_errors) / len(self.step_errors), "num_steps": len(errs)}


def _relative(measured: float | None, simulated: float | None) -> float | None:
    return None if measured is None or simulated is None or measured == 0 else simulated / measured - 1


def metric(metrics: dict, name: str) -> float | None:
    value = metrics.get(name)
    if name == "preemptions" and isinstance(value, dict):
        return float(value.get("total", 0))
    return None if value is None else float(value)
