"""`planner simulate` and `planner capacity`: run traces through the simulated engine.

`simulate` with one value per option is one run (a summary table and a run
folder under reports/); comma lists of --rate or of any deployment setting
make a sweep over their product, simulated in parallel processes.
`capacity` bisects the request rate for the highest one that meets the SLOs.
With --json, stdout holds exactly one JSON document; progress goes to stderr.
"""
from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from engine.core.metrics import slo_attainment
from planner import api
from planner.cli import options as opt
from planner.cli import pd_options as pdo
from planner.cli.options import DeploymentChoices, deployment_options
from planner.cli.output import (fail, fmt, interval_table, plan_table, print_verdict, run_folder, split_values,
                                stdout, summary_table, unit, warn)
from planner.deploy.parallel import layout_suffix
from planner.errors import PlannerError
from planner.report.capacity import write_capacity
from planner.report.run import write_run
from planner.report.sweep import comparison_row, sweep_document, write_sweep
from planner.runs.slos import parse_slos
from planner.runs.spec import Fleet, Load, RunSpec
from planner.sizing.bracket import check_rates, lowest_rate
from planner.sizing.capacity import capacity_limits, capacity_title, percent
from workloads import RampUp, TraceError, parse_workload_params

# The paper's setting: OPT-13B on one A100-40GB.
DEFAULTS = {"model": "opt-13b", "gpu": "a100-40g"}


def run_specs(deployments: DeploymentChoices, load: Load, *, rates=(None,), concurrencies=(None,),
              replicas=(1,), router: str | None = None, pd=None, **run) -> list[RunSpec]:
    """One spec per deployment, rate, concurrency and replica count: the product of the comma lists given."""
    loads = [replace(load, rate=r, concurrency=c) for r in rates for c in concurrencies]
    fleets = [Fleet(k, Fleet.router if router is None else router) for k in replicas]
    specs = [RunSpec(deployment=d, load=one, fleet=fleet, pd=pd, **run)
             for d in deployments.product(**DEFAULTS) for fleet in fleets for one in loads]
    for spec in specs:
        spec.router()                            # a bad --router fails here, in one line
        if pd is not None:
            pd.check(spec.deployment, spec.fleet.replicas)
    return specs


def load_of(workload: str, trace: Optional[Path], param, requests, duration, seed: int,
            burstiness: float = 1.0, ramp_up: RampUp | None = None) -> Load:
    source = opt.workload_source(workload, trace)
    params = tuple(sorted(parse_workload_params(source, param).items())) if param else ()
    return Load(workload=source, params=params, requests=requests, duration=duration, seed=seed,
                burstiness=burstiness, ramp_up=ramp_up)


@contextmanager
def _progress_bar(err: Console):
    """A callback for the simulator that drives a transient progress bar on stderr, shown from its
    first report (so an error before the simulation starts stays the only line printed)."""
    bar = Progress(TextColumn("simulating"), BarColumn(), MofNCompleteColumn(), TextColumn("requests"),
                   TextColumn("t={task.fields[now]:,.0f} s"), console=err, transient=True)
    task = None

    def report(now: float, done: int, total: int) -> None:
        nonlocal task
        if task is None:
            bar.start()
            task = bar.add_task("simulate", total=total, now=0.0)
        bar.update(task, completed=done, total=total, now=now)

    try:
        yield report
    finally:
        if task is not None:
            bar.stop()


@deployment_options
@pdo.pool_options
def simulate(
    deployments: DeploymentChoices, workload: str = opt.WORKLOAD, trace: Optional[Path] = opt.TRACE,
    param: Optional[list[str]] = opt.PARAM,
    rate: Optional[str] = typer.Option(None, help="requests/s, or a comma list to sweep (default 1.0; "
                                                  "a trace file keeps its own times)"),
    burstiness: float = opt.BURSTINESS, concurrency: Optional[str] = opt.CONCURRENCY,
    ramp_up_strategy: Optional[str] = opt.RAMP_UP_STRATEGY, ramp_up_start_rps: Optional[float] = opt.RAMP_UP_START,
    ramp_up_end_rps: Optional[float] = opt.RAMP_UP_END,
    replicas: Optional[str] = opt.REPLICAS, router: Optional[str] = opt.ROUTER,
    pd: Optional[str] = pdo.PD, pools: Optional[dict] = None,
    requests: Optional[int] = opt.REQUESTS, duration: Optional[float] = opt.DURATION, seed: int = opt.SEED,
    profile: Optional[Path] = opt.PROFILE, cost_model: Optional[str] = opt.COST_MODEL,
    step_by_step: bool = opt.STEP_BY_STEP, slo: Optional[list[str]] = opt.SLO, seeds: int = opt.SEEDS,
    slo_attainment: Optional[float] = opt.SLO_ATTAINMENT,
    timing_noise: bool = opt.TIMING_NOISE, out: Optional[Path] = opt.OUT, as_json: bool = opt.AS_JSON,
) -> None:
    """Simulate a workload on the paged engine, a fleet of replicas behind a router, or prefill and decode
    pools (--pd) (or sweep rates, replica counts and any deployment setting)."""
    err = Console(stderr=True)
    try:
        disaggregated = pdo.disaggregation(pd, pools)
        slos = parse_slos(slo) if slo else {}
        if slo_attainment is not None and not slos:
            raise PlannerError("--slo-attainment judges the share of requests within the --slo limits: give --slo")
        rates = tuple(split_values(rate, float, "rate")) if rate is not None else (None,)
        clients = tuple(split_values(concurrency, int, "concurrency")) if concurrency is not None else (None,)
        ramp_up = opt.ramp_up_of(ramp_up_strategy, ramp_up_start_rps, ramp_up_end_rps)
        load = load_of(workload, trace, param, requests, duration, seed, burstiness, ramp_up)
        specs = run_specs(deployments, load,
                          rates=rates, concurrencies=clients, replicas=opt.replica_counts(replicas), router=router,
                          pd=disaggregated, cost_model=cost_model, profile=str(profile) if profile else None,
                          timing_noise=timing_noise, slos=tuple(slos.items()), step_by_step=step_by_step,
                          slo_attainment=slo_attainment)
        out_dir = run_folder(out, "sweep" if len(specs) > 1 else "sim", specs[0].load.workload)
        if len(specs) > 1:
            return _sweep(specs, out_dir, as_json, err, slos)
        with _progress_bar(err) as progress:
            result = api.simulate(specs[0], seeds=seeds, progress=progress, warn=lambda w: warn(err, w))
        paths = write_run(result, out_dir)
    except (PlannerError, TraceError, ValueError, OSError) as exc:
        raise fail(exc) from None
    _print_run(result, paths, out_dir, as_json, err, seeds)


def _print_run(result, paths: dict, out_dir: Path, as_json: bool, err: Console, seeds: int) -> None:
    doc = result.document()
    check = result.profile_check or {}
    headline = f"profile check: {check.get('status')} ({check.get('reason')})"
    stale = check.get("status") == "stale"
    if as_json:
        sys.stdout.write(json.dumps(doc) + "\n")
        err.print(headline, style="yellow" if stale else None, highlight=False, markup=False)
        err.print(f"run folder: {out_dir} (report.html)", highlight=False)
        return
    console = stdout()
    console.print(headline, style="bold yellow" if stale else None, highlight=False, markup=False)
    console.print(plan_table(doc["memory_plan"], doc))
    console.print(summary_table(doc, result.sim.wall_time))
    if doc.get("fleet"):
        console.print(replica_table(doc["fleet"]))
    if doc.get("pd"):
        console.print(pool_table(doc["pd"]))
    if result.intervals:
        console.print(interval_table(result.intervals, seeds, result.spec.load.seed))
    print_verdict(console, doc["verdict"], result.warnings, result.not_modelled)
    console.print(f"report: {paths['report']}", highlight=False)
    console.print(f"run folder: {out_dir} ({', '.join(p.name for p in paths.values())})", highlight=False)


def replica_table(fleet: dict) -> Table:
    """A fleet's replicas side by side (result.json's fleet.per_replica) and the load imbalance."""
    imbalance = ", ".join(f"{k.replace('_', ' ')} {fmt(v, '', 3)}" for k, v in fleet["load_imbalance"].items())
    table = Table(title=f"{fleet['replicas']} replicas, router {fleet['router']} (load imbalance, max / mean: "
                        f"{imbalance})")
    columns = {"replica": "replica", "num_requests": "requests", "request_share": "share",
               "request_throughput": "req/s", "ttft_mean": "TTFT mean", "ttft_p99": "TTFT p99",
               "tpot_mean": "TPOT mean", "mean_batch_size": "batch", "kv_utilization": "KV util",
               "prefix_cache_hit_rate": "prefix hits", "preemptions": "preempted"}
    for title in columns.values():
        table.add_column(title, justify="right")
    for row in fleet["per_replica"]:
        table.add_row(*[fmt(row.get(c), "", 3) for c in columns])
    return table


def pool_table(pd: dict) -> Table:
    """Both pools of a disaggregated run side by side (result.json's pd) and the KV transfers."""
    kv = pd["kv_transfer"]
    seconds = kv["seconds"]["mean"]
    moved = "" if seconds is None else (f", KV {kv['bytes']['mean'] / 1e9:.2f} GB in {seconds * 1e3:.1f} ms mean "
                                        f"over {kv['link']} x{kv['streams']}")
    table = Table(title=f"P/D {pd['ratio']}, router {pd['router']}{moved}")
    for title in ("pool", "replicas", "GPU x TP", "requests", "busy", "wait mean", "wait p99", "batch",
                  "KV util", "TPOT mean", "preempted"):
        table.add_column(title, justify="right")
    for name, wait in (("prefill", "queue_wait"), ("decode", "wait")):
        pool = pd[name]
        mean, p99 = pool[wait]["mean"], pool[wait]["p99"]
        batch = pool["mean_prefill_batch_size"] if name == "prefill" else pool["mean_batch_size"]
        dp = pool["deployment"]["dp"]
        table.add_row(name, str(pool["replicas"]), f"{pool['gpu']} x{pool['tp']}" + (f" x dp{dp}" if dp > 1 else ""),
                      str(pool["num_requests"]),
                      fmt(pool["utilization"], "", 3), fmt(mean, " s", 4), fmt(p99, " s", 4), fmt(batch, "", 3),
                      fmt(pool["kv_utilization"], "", 3), fmt(pool.get("tpot", {}).get("mean"), " s", 4),
                      str(pool["preemptions"]))
    return table


def _sweep(specs: list[RunSpec], out_dir: Path, as_json: bool, err: Console, slos: dict[str, float]) -> None:
    for spec in specs:           # (a bad value of a swept list refused before the sweep says it starts)
        spec.load.check()
    err.print(f"sweeping {len(specs)} runs in parallel processes ...", highlight=False)

    def done(spec: RunSpec, doc: dict) -> None:
        load = ", ".join(f"{name} {value}" for name, value in (("rate", spec.load.rate),
                                                              ("concurrency", spec.load.concurrency))
                         if value is not None) or f"rate {spec.load.rate}"
        if spec.fleet.replicas > 1:
            load += f", {spec.fleet.replicas} replicas"
        err.print(f"  {', '.join(f'{k} {v}' for k, v in spec.deployment.changed().items())}, {load}: normalized "
                  f"latency {fmt(doc.get('normalized_latency'), ' s/token', 4)} ({doc['wall_time']:.1f} s wall)",
                  highlight=False)

    doc = sweep_document(api.sweep(specs, on_done=done, warn=lambda w: warn(err, w)))
    paths = write_sweep(doc, out_dir, slos)
    if as_json:
        sys.stdout.write(json.dumps(doc) + "\n")
        err.print(f"sweep folder: {out_dir} (report.html)", highlight=False)
        return
    _print_sweep(doc, paths, out_dir)


def _print_sweep(doc: dict, paths: dict, out_dir: Path) -> None:
    runs, verdict = doc["runs"], doc["verdict"]
    table = Table(title=f"sweep: {len(runs)} runs")
    columns = {**{k: k.replace("_", " ") for k in verdict["swept"]}, "request_throughput": "req/s",
               "normalized_latency": "s/token", "ttft_p99": "TTFT p99", "tpot_p99": "TPOT p99",
               "mean_batch_size": "batch", "kv_utilization": "KV util", "preemptions_total": "preempt",
               "num_rejected": "rejected", "num_truncated": "truncated"}
    for col, title in columns.items():
        table.add_column(title, justify="left" if col == "allocator" else "right")
    table.add_column("verdict")
    for i, run in enumerate(runs):
        row = comparison_row(run)
        state = run.get("verdict", {}).get("state", "?")
        table.add_row(*[fmt(row.get(c), "", 3) for c in columns],
                      state + (" *best*" if i == verdict.get("best_index") else ""))
    console = stdout()
    console.print(table)
    console.print("[bold]verdict[/bold]")
    for line in verdict["lines"]:
        console.print(f"  {line}", highlight=False, markup=False)
    notes = list(dict.fromkeys(n for run in runs for n in run.get("not_modelled", [])))
    console.print(f"  cost model: {runs[0].get('cost_model')}; it does not capture: " + "; ".join(notes),
                  highlight=False, markup=False)
    console.print(f"report: {paths['report']}", highlight=False)
    console.print(f"sweep folder: {out_dir} ({', '.join(p.name for p in paths.values())})", highlight=False)


MOST_CLIENTS = typer.Option(None, "--concurrency", metavar="max",
                            help="max: the most concurrent clients (a closed loop, each sending its next request "
                                 "when its previous one ends) within the SLOs, instead of the highest request rate")


CAPACITY_SLOS = typer.Option(..., "--slo", metavar="LIMIT",
                             help="normalized latency limit in s/token (e.g. 0.2), or METRIC=SECONDS (e.g. "
                                  "ttft_p99=2,tpot_p99=0.1); comma-separated or repeated")
CONFIDENCE = typer.Option(0.9, help="with --seeds: the SLOs must hold in at least this fraction of the seeds")


@deployment_options
@pdo.pool_options
def capacity(
    deployments: DeploymentChoices,
    slo: list[str] = CAPACITY_SLOS,
    workload: str = opt.WORKLOAD, trace: Optional[Path] = opt.TRACE, param: Optional[list[str]] = opt.PARAM,
    requests: Optional[int] = opt.REQUESTS, duration: Optional[float] = opt.DURATION, seed: int = opt.SEED,
    profile: Optional[Path] = opt.PROFILE, cost_model: Optional[str] = opt.COST_MODEL,
    step_by_step: bool = opt.STEP_BY_STEP, seeds: int = opt.SEEDS, timing_noise: bool = opt.TIMING_NOISE,
    start_rate: float = typer.Option(1.0, help="first rate tried (requests/s)"),
    max_rate: float = typer.Option(256.0, help="highest rate tried"),
    tolerance: float = typer.Option(0.02, help="stop when the bracket is this close (relative)"),
    burstiness: float = opt.BURSTINESS, confidence: float = CONFIDENCE,
    slo_attainment: Optional[float] = opt.SLO_ATTAINMENT, concurrency: Optional[str] = MOST_CLIENTS,
    replicas: Optional[str] = opt.REPLICAS, router: Optional[str] = opt.ROUTER,
    pd: Optional[str] = pdo.PD, pools: Optional[dict] = None,
    out: Optional[Path] = opt.OUT, as_json: bool = opt.AS_JSON,
) -> None:
    """Highest request rate (or, --concurrency max, the most concurrent clients) within the SLOs, of one
    deployment or a fleet of --replicas behind --router."""
    err = Console(stderr=True)
    try:
        slos = parse_slos(slo)
        counts = opt.replica_counts(replicas)
        if len(counts) > 1:
            raise PlannerError("--replicas takes one count for `planner capacity` (a comma list sweeps in "
                               "`planner simulate` and spans the grid of `planner search`)")
        if concurrency not in (None, "max"):
            raise PlannerError(f"--concurrency {concurrency}: capacity takes --concurrency max (the most clients "
                               f"within the SLOs); `planner simulate --concurrency N` runs N clients")
        spec = RunSpec(deployment=deployments.one("capacity", **DEFAULTS),
                       load=load_of(workload, trace, param, requests, duration, seed, burstiness),
                       cost_model=cost_model,
                       profile=str(profile) if profile else None, timing_noise=timing_noise,
                       slos=tuple(slos.items()), step_by_step=step_by_step, fleet=Fleet(counts[0], router),
                       pd=pdo.disaggregation(pd, pools), slo_attainment=slo_attainment)
        pdo.check_spec(spec)
        out_dir = run_folder(out, "capacity", spec.load.workload)
        if concurrency == "max":
            spec.load.check_closed_loop()          # before the search says it starts
        else:
            check_rates(start_rate, lowest_rate(start_rate), max_rate, tolerance)    # (as api.capacity will)

        probed = _probe_printer(err, slos, seeds, clients=concurrency == "max", attainment=slo_attainment)
        d = spec.deployment
        fleet = f"{spec.fleet.replicas} replicas of " if spec.fleet.replicas > 1 else ""
        fleet = f"P/D {spec.pd.ratio} of " if spec.pd is not None else fleet
        err.print(f"searching the capacity of {d.model} / {fleet}{d.tp} x {d.gpu}{layout_suffix(d.pp, d.dp)} on "
                  f"{spec.load.workload} "
                  f"({capacity_limits(spec, slos)}) ...", highlight=False)
        doc = api.capacity(spec, start_rate=start_rate, max_rate=max_rate, tolerance=tolerance, on_probe=probed,
                           seeds=seeds, confidence=confidence, clients=concurrency == "max",
                           warn=lambda w: warn(err, w)).document
        paths = write_capacity(doc, out_dir, capacity_title(spec, slos))
    except (PlannerError, TraceError, ValueError, OSError) as exc:
        raise fail(exc) from None
    if as_json:
        sys.stdout.write(json.dumps(doc) + "\n")
        err.print(f"capacity folder: {out_dir} (report.html)", highlight=False)
        return
    console = stdout()
    console.print("[bold]verdict[/bold]")
    for line in doc["verdict"]["lines"]:
        console.print(f"  {line}", highlight=False, markup=False)
    console.print(f"report: {paths['report']}", highlight=False)
    console.print(f"written to {paths['capacity']}", highlight=False)


def _probe_printer(err: Console, slos: dict, seeds: int, *, clients: bool, attainment: float | None = None):
    """What capacity prints as each probe ends: the load tried, met or missed, the SLO metrics (and the share
    of requests within them all, judged by attainment)."""
    def probed(probe) -> None:
        doc = probe.doc
        shown = ", ".join(f"{k} {fmt(doc.get(k), unit(k), 4)}" for k in slos)
        if attainment is not None:
            shown = f"{percent(slo_attainment(doc))} of the requests within every limit; {shown}"
        grows = "; requests pile up" if (doc.get("verdict") or {}).get("overloaded") else ""
        if probe.lengthened_to is not None:
            grows += f"; on {probe.lengthened_to:,} requests for a steady window"
        if seeds > 1:
            grows += f"; met by {doc['slo_probability']:.0%} of {seeds} seeds"
        where = f"{probe.rate:8d} clients" if clients else f"{probe.rate:8.3f} req/s"
        err.print(f"  {where}: {'meets' if probe.ok else 'misses'} ({shown}{grows})", highlight=False)
    return probed
