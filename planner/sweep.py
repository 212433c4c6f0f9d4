"""Many simulations: a recipe per run, sweeps in parallel processes, and the capacity search.

A `RunSpec` is everything a run needs as plain, picklable values, so a worker
process can rebuild the trace, configuration and cost model on its own.
`find_capacity` bisects the request rate for the highest one that still meets
the SLOs, the way the paper reads a system's capacity off its
normalized-latency curve (the rate before latency shoots up).
"""
from __future__ import annotations

import math
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from itertools import repeat
from typing import Callable

from engine.core.metrics import failed_requests
from planner.cost.select import select_cost_model
from planner.cost.shape import CostModel
from planner.errors import PlannerError
from planner import guardrails
from planner.bracket import bracket, check_rates
from planner.block_size_factors import factor_source
from planner.report_sim import json_safe, result_document
from planner.verdict import analyse_run, binding_slo
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
            from planner.intervals import with_timing_noise
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


def run_document(spec: RunSpec) -> dict:
    """Run one spec and return its analysed result document (what a worker process sends back)."""
    return analysed_document(spec, spec.run())


def run_sweep(specs: list[RunSpec], workers: int | None = None,
              on_done: Callable[[RunSpec, dict], None] | None = None) -> list[dict]:
    """Result documents of all specs, in the given order, simulated in parallel processes."""
    for spec in specs:
        spec.check()
    workers = max(1, min(workers or os.cpu_count() or 1, len(specs)))
    if workers == 1:
        docs = []
        for spec in specs:
            docs.append(run_document(spec))
            if on_done is not None:
                on_done(spec, docs[-1])
        return docs
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(run_document, spec) for spec in specs]
        docs = []
        for spec, future in zip(specs, futures):
            docs.append(future.result())
            if on_done is not None:
                on_done(spec, docs[-1])
        return docs


# -- capacity ----------------------------------------------------------------------

SLO_METRICS = ("normalized_latency", "ttft_mean", "ttft_median", "ttft_p99", "tpot_mean", "tpot_median",
               "tpot_p99", "itl_p99", "e2e_mean", "e2e_median", "e2e_p99")


def parse_slos(texts: list[str]) -> dict[str, float]:
    """'0.2' (normalized latency, s/token) or 'METRIC=SECONDS', e.g. 'ttft_p99=2'."""
    slos: dict[str, float] = {}
    for text in texts:
        name, sep, value = text.partition("=")
        if not sep:
            name, value = "normalized_latency", text
        name = name.strip()
        if name not in SLO_METRICS:
            raise PlannerError(f"--slo {text!r}: unknown metric {name!r}; choose one of {', '.join(SLO_METRICS)}")
        try:
            limit = float(value)
        except ValueError:
            raise PlannerError(f"--slo {text!r}: {value!r} is not a number of seconds") from None
        if not limit > 0:
            raise PlannerError(f"--slo {text!r}: the limit must be > 0")
        slos[name] = limit
    if not slos:
        raise PlannerError("give at least one --slo, e.g. --slo 0.2 or --slo ttft_p99=2")
    return slos


def meets(doc: dict, slos: dict[str, float]) -> bool:
    """Every SLO holds, nothing was left undone (a run that rejected or truncated requests fails),
    and the engine keeps up: a queue that keeps growing means the SLOs hold only because the trace ends."""
    if failed_requests(doc) or (doc.get("verdict") or {}).get("overloaded"):
        return False
    return all(doc.get(name) is not None and doc[name] <= limit for name, limit in slos.items())


@dataclass
class CapacityResult:
    rate: float | None            # the highest rate found to meet the SLOs (None: not even the lowest)
    doc: dict | None              # its result document
    probes: list[tuple[float, bool, dict]]   # (rate, met, result document) in the order simulated
    bounded: bool                 # False: the SLOs still held at max_rate


def find_capacity(spec: RunSpec, slos: dict[str, float], *, start: float = 1.0, min_rate: float = 0.01,
                  max_rate: float = 256.0, rel_tol: float = 0.02,
                  on_probe: Callable[[float, bool, dict], None] | None = None, seeds: int = 1,
                  confidence: float = 0.9) -> CapacityResult:
    """Bracket the capacity by doubling or halving the rate from `start`, then bisect
    until the bracket is within `rel_tol`. Every probe replays the same seeded trace
    (same lengths, same arrival pattern) at its rate, so only the rate changes.
    With `seeds` > 1 each probe runs that many seeds, and a rate meets the SLOs
    when at least a fraction `confidence` of them do (planner/intervals.py)."""
    check_rates(start, min_rate, max_rate, rel_tol)
    if not 0 < confidence <= 1:
        raise PlannerError(f"confidence must be in (0, 1], got {confidence}")
    spec.check()
    probes: list[tuple[float, bool, dict]] = []

    def probe(rate: float) -> bool:
        from planner.intervals import slo_probability
        probability, docs = slo_probability(spec, rate, slos, seeds)
        doc = {**docs[0], "slo_probability": probability, "seeds": seeds}
        ok = probability >= confidence
        probes.append((rate, ok, doc))
        if on_probe is not None:
            on_probe(rate, ok, doc)
        return ok

    good, _, bounded = bracket(probe, first=start, steps=repeat(2.0), min_rate=min_rate, max_rate=max_rate,
                               rel_tol=rel_tol)
    if good is None or not bounded:
        return CapacityResult(good, probes[-1][2] if good is not None else None, probes, bounded=bounded)
    best = next(doc for r, ok, doc in probes if r == good and ok)
    return CapacityResult(good, best, probes, bounded=True)


def capacity_title(spec: RunSpec, slos: dict[str, float]) -> str:
    limits = ", ".join(f"{k} <= {v:g}" for k, v in slos.items())
    return (f"{spec.model} on {spec.tp} x {spec.gpu}, {spec.workload} (block {spec.block_size}, {spec.allocator}), "
            f"SLO {limits}")


def capacity_document(spec: RunSpec, slos: dict[str, float], found: CapacityResult) -> dict:
    """capacity.json: the rate, what it gives, the binding limit, the probes, the verdict in words."""
    at = found.doc or {}
    binding = binding_slo(slos, found.probes, found.rate)
    first_miss = min((r for r, ok, _ in found.probes if not ok and (found.rate is None or r > found.rate)),
                     default=None)
    cost_model = (at or found.probes[-1][2]).get("cost_model")
    lines = []
    if found.rate is None:
        lines.append(f"The SLOs are not met even at {found.probes[-1][0]:.3g} req/s (the lowest rate tried).")
    else:
        lines.append(f"Capacity: {found.rate:.3g} req/s"
                     + ("" if found.bounded else " (still within the SLOs at the highest rate tried; raise "
                                                  "--max-rate)") + ".")
        lines.append(f"At that rate: {at.get('output_token_throughput', 0):,.0f} output tok/s, "
                     f"TTFT mean {at.get('ttft_mean', 0):.3g} s / p99 {at.get('ttft_p99', 0):.3g} s, "
                     f"TPOT mean {at.get('tpot_mean', 0):.3g} s / p99 {at.get('tpot_p99', 0):.3g} s, "
                     f"normalized latency {at.get('normalized_latency', 0):.3g} s/token.")
    if binding is not None:
        miss = next(d for r, ok, d in found.probes if r == first_miss)
        if binding == "num_rejected":
            lines.append(f"Binding limit: requests are rejected at {first_miss:.3g} req/s.")
        elif binding == "queue_growth":
            lines.append(f"Binding limit: throughput. At {first_miss:.3g} req/s every SLO still held, but the "
                         f"waiting queue kept growing: the SLOs would fail on a longer run.")
        else:
            lines.append(f"Binding limit: {binding} <= {slos[binding]:g} (at {first_miss:.3g} req/s it reached "
                         f"{miss.get(binding, float('nan')):.3g}).")
    lines.append(f"Cost model: {cost_model}.")
    verdict = {"capacity_rate": found.rate, "binding_slo": binding, "first_missing_rate": first_miss,
               "cost_model": cost_model}
    if at.get("verdict"):
        run_lines = [line for line in at["verdict"]["lines"] if not line.startswith("Next:")]
        lines += [f"At capacity: {line}" for line in run_lines[1:3]]
    if found.rate is None:
        nxt = spec.command(tp=spec.tp * 2, capacity=True)
        lines.append(f"Next: {nxt}  (more GPUs, or relax the SLOs)")
    else:
        nxt = spec.command(rate=round(found.rate, 3))
        lines.append(f"Next: {nxt}  (the full report at capacity: timeline, steady state)")
    verdict.update(next_command=nxt, lines=lines)
    return json_safe({
        "capacity_rate": found.rate, "bounded": found.bounded, "slos": slos, "binding_slo": binding,
        "cost_model": cost_model,
        "at_capacity_summary": {k: at.get(k) for k in ("request_throughput", "output_token_throughput", "ttft_mean",
                                                       "ttft_p99", "tpot_mean", "tpot_p99", "normalized_latency")},
        "verdict": verdict,
        "probes": [{"rate": r, "meets": ok, "slo_probability": d.get("slo_probability"),
                    **{k: d.get(k) for k in slos}, "num_rejected": d.get("num_rejected"),
                    "num_truncated": d.get("num_truncated"),
                    "request_throughput": d.get("request_throughput"),
                    "state": (d.get("verdict") or {}).get("state")} for r, ok, d in found.probes],
        "at_capacity": found.doc,
    })
