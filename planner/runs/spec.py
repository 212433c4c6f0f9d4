"""Many simulations: a recipe per run, sweeps in parallel processes, and the capacity search.

A `RunSpec` is everything a run needs as plain, picklable values, so a worker
process can rebuild the trace, configuration and cost model on its own.
`find_capacity` bisects the request rate for the highest one that still meets
the SLOs, the way the paper reads a system's capacity off its
normalized-latency curve (the rate before latency shoots up).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

from planner.cost.select import select_cost_model
from planner.cost.shape import CostModel
from planner.cost.wrappers import with_timing_noise
from planner.errors import PlannerError
from planner.runs import checks as guardrails
from planner.cost.block_size import factor_source
from planner.report.run import json_safe, result_document
from planner.analysis.verdict import analyse_run
from planner.sim import SimConfig, SimResult, simulate
from workloads import Trace, TraceError, make_trace
from workloads.make import is_trace_file

DEFAULT_RATE = 1.0          # requests/s for a built-in workload when none is given
DEFAULT_REQUESTS = 1000     # requests for a built-in workload when neither a count nor a duration is given


@dataclass(frozen=True)
class RunSpec:
    model: str = "opt-13b"
    gpu: str = "a100-40g"
    tp: int = 1
    workload: str = "chatbot"           # a built-in workload, or a .jsonl/.csv trace file
    rate: float | None = None           # None: DEFAULT_RATE, or a trace file's own timestamps
    requests: int | None = None
    duration: float | None = None
    seed: int = 0
    block_size: int = 16
    allocator: str = "paged"
    preemption_mode: str = "recompute"
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = False
    profile: str | None = None
    workload_params: tuple[tuple[str, object], ...] = ()   # -p KEY=VALUE, already typed
    slos: tuple[tuple[str, float], ...] = ()               # drawn on plots and judged in the verdict
    # --cost-model: None (auto), calibrated, measured, roofline, or linear:A,B (A + B x scheduled tokens)
    cost_model_option: str | None = None
    max_model_len: int | None = None    # None: the model's own
    step_by_step: bool = False          # no decode fast-forward (same results, slower)
    chunked_prefill: bool = False       # vLLM v1's policy (engine/core/chunked_scheduler.py)
    num_gpu_blocks: int | None = None   # the KV cache size directly, instead of the memory plan
    timing_noise: bool = False          # step times scatter like the profile's measurements (seeded)

    def trace(self) -> Trace:
        if self.rate is not None and not self.rate > 0:
            raise PlannerError(f"rate must be > 0 requests/s, got {self.rate}")
        if self.requests is not None and self.requests < 1:
            raise PlannerError(f"requests must be >= 1, got {self.requests}")
        if is_trace_file(self.workload):
            rate = math.inf if self.rate is None else self.rate
            return make_trace(self.workload, num_requests=self.requests, duration=self.duration, rate=rate,
                              seed=self.seed, **dict(self.workload_params))
        requests = DEFAULT_REQUESTS if self.requests is None and self.duration is None else self.requests
        rate = DEFAULT_RATE if self.rate is None else self.rate
        trace = make_trace(self.workload, num_requests=requests, duration=self.duration, rate=rate, seed=self.seed,
                           **dict(self.workload_params))
        if not len(trace):
            raise PlannerError(f"the {self.workload} trace is empty (duration {self.duration} s at {rate} req/s)")
        return trace

    def config(self) -> SimConfig:
        model = guardrails.model(self.model)
        guardrails.check_tp(model, self.tp)
        return SimConfig(model, guardrails.gpu(self.gpu), tp=self.tp, block_size=self.block_size,
                         allocator=self.allocator, preemption_mode=self.preemption_mode,
                         max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
                         gpu_memory_utilization=self.gpu_memory_utilization,
                         enable_prefix_caching=self.enable_prefix_caching, seed=self.seed,
                         max_model_len=self.max_model_len, fast_forward=not self.step_by_step,
                         enable_chunked_prefill=self.chunked_prefill, num_gpu_blocks=self.num_gpu_blocks)

    def cost_model(self, config: SimConfig) -> CostModel:
        model = select_cost_model(config.model, config.gpu, tp=config.tp, dtype_bytes=config.dtype_bytes,
                                  block_size=config.block_size, profile=self.profile,
                                  cost_model=self.cost_model_option)
        if self.timing_noise:
            model = with_timing_noise(model, self.seed)
        return model

    def check(self) -> list[str]:
        """Fail fast, with the one-line error, before any process is started; return the warnings."""
        guardrails.workload(self.workload)
        config = self.config()
        warnings = guardrails.check_config(config)   # what vLLM would refuse; the model must fit
        self.cost_model(config)
        return warnings

    def command(self, capacity: bool = False, **changes) -> str:
        """The `planner simulate` (or `capacity`) line of this run, with some options changed."""
        spec = replace(self, **changes)
        default = RunSpec()
        words = ["planner", "capacity" if capacity else "simulate"]
        names = {"workload": "--trace" if is_trace_file(spec.workload) else "--workload", "requests": "--requests",
                 "cost_model_option": "--cost-model"}
        for f in ("model", "gpu", "tp", "workload", "rate", "requests", "duration", "seed", "block_size",
                  "allocator", "preemption_mode", "max_num_seqs", "max_num_batched_tokens",
                  "gpu_memory_utilization", "max_model_len", "profile", "cost_model_option"):
            value = getattr(spec, f)
            if capacity and f == "rate":
                continue
            if value is not None and (value != getattr(default, f) or f in ("model", "gpu", "workload")):
                words += [names.get(f, "--" + f.replace("_", "-")), str(value)]
        if spec.enable_prefix_caching:
            words.append("--enable-prefix-caching")
        if spec.timing_noise:
            words.append("--timing-noise")
        for key, value in spec.workload_params:
            words += ["-p", f"{key}={value}"]
        slos = spec.slos or (() if not capacity else (("normalized_latency", 0.1),))
        if capacity:
            words += [w for k, v in slos for w in ("--slo", f"{k}={v}")]
        return " ".join(words)

    def run(self, progress: Callable | None = None, trace: Trace | None = None) -> SimResult:
        """Simulate this spec (on `trace` when the caller already built it)."""
        config = self.config()
        if trace is None:
            try:
                trace = self.trace()
            except TraceError as exc:
                raise PlannerError(str(exc)) from None
        return simulate(trace, config, self.cost_model(config), progress=progress)


def analysed_document(spec: RunSpec, result: SimResult, warnings: list[str] | None = None) -> dict:
    """The result document with the steady state, the verdict, warnings and the cost model's blind spots."""
    doc = result_document(result)
    doc.update(analyse_run(doc, result.requests, result.steps, spec.command, dict(spec.slos) or None))
    doc["warnings"] = spec.check() if warnings is None else warnings
    doc["not_modelled"] = guardrails.not_modelled(
        doc.get("cost_model", ""), spec.block_size, spec.enable_prefix_caching, spec.preemption_mode, spec.tp,
        factor_source("cpu" if spec.gpu == "cpu" else "cuda"))
    doc["command"] = spec.command()
    return json_safe(doc)
