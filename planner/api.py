"""The planner's Python API, for notebooks and scripts; the `planner` commands are thin layers over it.

    from planner import Deployment, simulate, capacity, search, validate
    h100 = Deployment(model="llama-3.1-8b", gpu="h100-sxm", policy="vllm-v1", max_model_len=8192)
    run = simulate(h100, workload="sharegpt", rate=8, requests=500)
    run.metrics.tpot_mean, run.verdict["lines"], run.requests_frame()
    capacity(h100, slos={"ttft_p99": 2, "tpot_p99": 0.1}, requests=300).rate
    search(h100, slos={"tpot_p99": 0.1}, gpus=["a100-80g", "h100-sxm"], tps=[1, 2], rate=20).best

Each function takes a `Deployment` and the load as keywords, or a whole
`RunSpec`; each returns a typed result whose `document()` (or `document`) is
the JSON file the command writes.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Callable

from engine.deployment import Deployment, check_type
from planner.errors import PlannerError
from planner.profile.check import check_cost_model
from planner.runs.pipeline import Simulation
from planner.runs.pools import make_executor
from planner.runs.result import RunResult
from planner.runs.seeds import intervals, run_seeds
from planner.runs.slos import parse_slos
from planner.runs.spec import Load, RunSpec
from planner.runs.sweep import run_sweep
from planner.sizing.bracket import lowest_rate
from planner.sizing.capacity import Capacity, capacity_document, find_capacity, find_concurrency
from planner.sizing.search import SearchGrid, SearchResult, run_search
from workloads import RampUp
from workloads.make import WORKLOADS, workload_params

Warn = Callable[[list[str]], None]


def run_spec(target: Deployment | RunSpec | None = None, *, workload: str = "sharegpt", rate: float | None = None,
             requests: int | None = None, duration: float | None = None, seed: int = 0, params: dict | None = None,
             concurrency: int | None = None, burstiness: float = 1.0, ramp_up: RampUp | None = None,
             slos: dict[str, float] | str | None = None, **run) -> RunSpec:
    """A RunSpec from a deployment and the load's keywords (a RunSpec is returned as it is)."""
    if not isinstance(target, (Deployment, RunSpec, type(None))):
        raise ValueError(f"target must be a Deployment or a RunSpec, got {target!r} ({type(target).__name__})")
    workload = os.fspath(workload) if isinstance(workload, os.PathLike) else workload     # a trace file's path
    _check_load(workload, rate, requests, duration, seed, params, concurrency)
    check_type("burstiness", burstiness, float)
    if not isinstance(ramp_up, (RampUp, type(None))):
        raise ValueError(f"ramp_up must be a workloads.RampUp or None, got {ramp_up!r} ({type(ramp_up).__name__})")
    if isinstance(target, RunSpec):
        return target
    load = Load(workload=workload, params=tuple(sorted((params or {}).items())), rate=rate, requests=requests,
                duration=duration, seed=seed, concurrency=concurrency, burstiness=burstiness, ramp_up=ramp_up)
    return RunSpec(deployment=Deployment() if target is None else target, load=load,
                   slos=tuple(_slos(slos).items()), **run)


# make_trace's arrival keywords a load's params may also set (a built-in workload's own come from its generator).
_ARRIVAL_PARAMS = {"arrival": "poisson", "cv": 1.0}


def _check_load(workload, rate, requests, duration, seed, params, concurrency) -> None:
    """The load's keywords of the right type, each refused in one line naming it (their values are checked
    with the trace). A built-in workload's params take its defaults' kinds, as -p KEY=VALUE does (None: int)."""
    check_type("workload", workload, str)
    for name, value in (("rate", rate), ("duration", duration)):
        check_type(name, value, float, optional=True)
    for name, value in (("requests", requests), ("concurrency", concurrency)):
        check_type(name, value, int, optional=True)
    check_type("seed", seed, int)
    if params is None:
        return
    if not isinstance(params, dict) or not all(isinstance(key, str) for key in params):
        raise ValueError(f"params must be a dict of workload parameter names to values, got {params!r}")
    defaults = {**_ARRIVAL_PARAMS, **(workload_params(workload) if workload in WORKLOADS else {})}
    for key, value in params.items():       # an unknown key is the trace's to refuse, naming what it takes
        if key in defaults:
            default = defaults[key]
            check_type(f"params[{key!r}]", value, int if default is None else type(default), default is None)


def _slos(slos: dict[str, float] | str | None) -> dict[str, float]:
    if slos is None:
        return {}
    if not isinstance(slos, (dict, str)):
        raise ValueError(f"slos must be a dict of SLO names to limits in seconds or a string like 'ttft_p99=2', "
                         f"got {slos!r} ({type(slos).__name__})")
    return parse_slos([slos]) if isinstance(slos, str) else parse_slos([f"{k}={v}" for k, v in slos.items()])


def simulate(target: Deployment | RunSpec | None = None, *, seeds: int = 1, progress=None,
             warn: Warn | None = None, **load) -> RunResult:
    """One simulated run (with `seeds` > 1, the first seed's result carrying every metric's interval)."""
    check_type("seeds", seeds, int)
    simulation = Simulation.prepare(run_spec(target, **load))
    trace = simulation.spec.load.trace()
    if warn is not None:
        warn(simulation.warnings(trace))
    result, others = run_seeds(simulation, seeds, progress=progress, trace=trace)
    result.profile_check = check_cost_model(simulation.cost_model, simulation.spec.deployment.model).as_dict()
    if others:
        result.intervals = intervals([result.document(), *others])
    return result


def sweep(specs: list[RunSpec], *, on_done=None, warn: Warn | None = None) -> list[dict]:
    """The result documents of several runs, simulated in parallel processes."""
    docs = run_sweep(specs, on_done=on_done)
    if warn is not None:
        warn(sorted({w for doc in docs for w in doc.get("warnings", [])}))
    return docs


@dataclass
class CapacityResult:
    spec: RunSpec
    slos: dict[str, float]
    found: Capacity
    document: dict                        # capacity.json

    @property
    def rate(self) -> float | None:
        """The highest request rate found to meet the SLOs (None: not even the lowest tried)."""
        return self.found.rate

    @property
    def binding_slo(self) -> str | None:
        return self.document["binding_slo"]


def capacity(target: Deployment | RunSpec | None = None, *, slos: dict[str, float] | str | None = None,
             start_rate: float = 1.0, max_rate: float = 256.0, tolerance: float = 0.02, seeds: int = 1,
             confidence: float = 0.9, clients: bool = False, on_probe=None, warn: Warn | None = None,
             slo_attainment: float | None = None, **load) -> CapacityResult:
    """The highest request rate within the SLOs (`slos` here, or the RunSpec's own); with `clients`, the
    most concurrent clients (a closed loop: `planner capacity --concurrency max`). With `slo_attainment`
    (or the RunSpec's), each SLO is a per-request limit and that share of the requests must meet them all
    (DistServe's SLO attainment; vLLM bench's goodput counts the same requests)."""
    check_type("seeds", seeds, int)
    check_type("slo_attainment", slo_attainment, float, optional=True)
    spec = run_spec(target, slos=slos, **load)
    if slo_attainment is not None:
        spec = replace(spec, slo_attainment=slo_attainment)
    _no_ramp_up(spec, "capacity() searches the request rate")
    limits = dict(spec.slos)
    if not limits:
        raise PlannerError("give at least one SLO, e.g. slos={'ttft_p99': 2}")
    if clients:
        if seeds != 1:
            raise PlannerError("--seeds applies to a rate search; a concurrency search runs one seed")
        found = find_concurrency(spec, limits, on_probe=on_probe, warn=warn)
    else:
        found = find_capacity(spec, limits, start=start_rate, max_rate=max_rate, rel_tol=tolerance,
                              min_rate=lowest_rate(start_rate), on_probe=on_probe, seeds=seeds,
                              confidence=confidence, warn=warn)
    doc = capacity_document(spec, limits, found, clients)
    doc.update(seeds=seeds, confidence=confidence)
    return CapacityResult(spec, limits, found, doc)


def search(target: Deployment | RunSpec | None = None, *, slos: dict[str, float] | str, gpus=None, tps=None,
           block_sizes=None, max_num_seqs=None, rate: float | None = None, tolerance: float = 0.05,
           max_rate: float = 256.0, plain: bool = False, executor: str = "local", workers: int | None = None,
           ray_address: str | None = None, prices: dict[str, float] | None = None, on_done=None,
           clients: int | None = None, **load) -> SearchResult:
    """The cheapest configuration (GPU x TP x block size x max_num_seqs) serving `rate` req/s within the
    SLOs (`rate=None`: the most capacity per dollar), or with `clients`, that many concurrent clients. The
    grid's axes default to the deployment's own."""
    if clients is not None and rate is not None:
        raise PlannerError("give a target rate or a number of clients, not both")
    load.setdefault("duration", 600.0 if load.get("requests") is None else None)
    spec = run_spec(target, **load)
    _no_ramp_up(spec, "search() sizes for a steady rate")
    if spec.fleet.replicas > 1 or spec.pd is not None:     # the grid prices one deployment a row
        raise PlannerError("search() sizes one deployment a configuration: a RunSpec with a fleet or P/D pools "
                           "is searched by `planner search --replicas` or `planner search --pd`")
    d = spec.deployment
    grid = SearchGrid(base=spec, slos=_slos(slos), gpus=tuple(gpus or (d.gpu,)), tps=tuple(tps or (d.tp,)),
                      block_sizes=tuple(block_sizes or (d.block_size,)),
                      max_num_seqs=tuple(max_num_seqs or (d.max_num_seqs,)),
                      target_rate=rate if clients is None else clients, clients=clients is not None,
                      tolerance=tolerance, max_rate=max_rate, plain=plain)
    return run_grid(grid, executor, workers=workers, ray_address=ray_address, prices=prices, on_done=on_done)


def _no_ramp_up(spec: RunSpec, what: str) -> None:
    if spec.load.ramp_up is not None:
        raise PlannerError(f"{what}; a ramp-up sets a rising one: run simulate() with it, or drop ramp_up")


def run_grid(grid: SearchGrid, executor: str = "local", *, workers: int | None = None,
             ray_address: str | None = None, prices: dict | None = None, on_done=None) -> SearchResult:
    """Search `grid` on an executor (local processes or Ray), closed when done."""
    runner = make_executor(executor, workers=workers, ray_address=ray_address)
    try:
        return run_search(grid, runner, prices=prices, on_done=on_done)
    finally:
        close = getattr(runner, "close", None)
        if close is not None:
            close()
