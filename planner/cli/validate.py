"""`planner validate`: the simulator against the live engine, a running server, or a recorded run."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from engine.deployment import Deployment
from planner.cli import options as opt
from planner.cli.options import DeploymentChoices, deployment_options
from planner.cli.output import REPORTS_DIR, check_writable, fail, new_folder
from planner.errors import PlannerError
from planner.validation.compare import Validation
from planner.sim.router import parse_router
from planner.validation.external import validate_endpoint, validate_measured
from planner.validation.fleet import validate_fleet, write_fleet_report
from planner.validation.report import TARGETS, inside_text, interval_text, load_text, write_report
from planner.validation.run import check_device, validate
from planner.validation.spec import ValidationSpec
from planner.validation.spread import DEFAULT_SEEDS
from workloads import TraceError, parse_workload_params

# The in-process validation's device and model: this machine's CPU and a small model with random weights.
DEFAULTS = {"model": "opt-125m", "gpu": "cpu"}
# --quick: the README's main job ends with this (a couple of minutes on 2 cores). Long enough for its own
# verdict to judge: the steady window (the middle 80% of the arrivals, ~20 s) must span 5 mean latencies,
# and simulated with the shipped profile it spans 9.5 (6.7 with every step 30% slower, 5.2 at 60%); the
# 24 requests at 3 req/s of lengths x0.15 it replaced spanned 1.5 and were "too short to judge".
TRACE_DEFAULTS = dict(requests=64, rate=4.0, length_scale=0.25, max_output_len=256)
QUICK = dict(requests=56, rate=2.0, length_scale=0.08, max_output_len=64)


SEEDS = typer.Option(DEFAULT_SEEDS, "--seeds", help="simulate the live run's trace K more times with the "
                     "profile's timing noise (seeded 1..K; a process pool when they are slow) and judge each "
                     "metric against their 90% interval as well as its target; 0: no interval")


REPROFILE = typer.Option(None, "--reprofile/--no-reprofile",
                         help="--reprofile: profile this device (--quick; on a CPU its points "
                              "timed between the live run's steps, on a GPU half right "
                              "before the run and half right after) and validate "
                              "against that profile; default: only when the profile check "
                              "finds the profile stale; --no-reprofile: refuse a stale one")
SPEED_CORRECTION = typer.Option(
    None, "--speed-correction/--no-speed-correction",
    help="follow the device's speed during the live run (always measured and reported): by default the "
         "simulation follows the speed read by a profile timed along the run (on a CPU with --reprofile or "
         "a stale profile), not the canaries timed right before and after the run otherwise; "
         "--speed-correction follows either, --no-speed-correction neither (planner/profile/speed.py)")
ATTRIBUTION = typer.Option(False, "--attribution", help="also split the error by source: replay the "
                                                         "live step times and the host time between "
                                                         "steps, and simulate without the speed "
                                                         "correction (three more simulations)")


@deployment_options
def validate_cmd(
    deployments: DeploymentChoices,
    workload: Optional[str] = typer.Option(None, help="built-in workload or trace file (default sharegpt)"),
    param: Optional[list[str]] = opt.PARAM,
    rate: Optional[float] = typer.Option(None, help="request rate (req/s, Poisson; default 4, --quick 2; "
                                                    "none with --concurrency alone)"),
    burstiness: float = opt.BURSTINESS,
    ramp_up_strategy: Optional[str] = opt.RAMP_UP_STRATEGY, ramp_up_start_rps: Optional[float] = opt.RAMP_UP_START,
    ramp_up_end_rps: Optional[float] = opt.RAMP_UP_END,
    concurrency: Optional[int] = typer.Option(None, "--concurrency", metavar="N",
                                              help="a closed loop of N clients, live and simulated: each sends "
                                                   "its next request the moment its previous one ends; with "
                                                   "--rate, at most N requests in flight (vLLM bench's "
                                                   "--max-concurrency with --request-rate)"),
    requests: Optional[int] = typer.Option(None, help="number of requests (default 64, --quick 56)"),
    seed: int = opt.SEED,
    length_scale: Optional[float] = typer.Option(None, help="scale the workload's lengths (CPU runs must stay "
                                                            "short; default 0.25, --quick 0.08)"),
    max_output_len: Optional[int] = typer.Option(None, help="cap on output lengths after scaling (default 256, "
                                                            "--quick 64)"),
    endpoint: Optional[str] = typer.Option(None, help="validate a running OpenAI-compatible server (ours or vLLM) "
                                                      "instead of the in-process engine; deployment settings not "
                                                      "given come from its /metrics and /v1/models"),
    measured: Optional[Path] = typer.Option(None, help="validate a recorded run: per-request JSONL, a bench "
                                                       "requests.csv, or vLLM bench --save-detailed JSON"),
    served_model_name: Optional[str] = typer.Option(None, help="--endpoint: the model name to send "
                                                               "(default: the first of /v1/models)"),
    profile: Optional[Path] = opt.PROFILE,
    out: Optional[Path] = typer.Option(None, help="report folder (default: reports/validate/<time>-<model>-<workload>)"),
    quick: bool = typer.Option(False, help=f"a short run ({QUICK['requests']} requests at {QUICK['rate']:g} req/s, "
                                           f"lengths x{QUICK['length_scale']:g}: a steady window of ~20 s, long "
                                           f"enough to judge)"),
    reprofile: Optional[bool] = REPROFILE, speed_correction: Optional[bool] = SPEED_CORRECTION,
    attribution: bool = ATTRIBUTION, seeds: int = SEEDS,
    replicas: Optional[int] = typer.Option(None, "--replicas", metavar="K",
                                           help="a live fleet of K engines (stepping in turn, each on its own "
                                                "clock) against the simulated fleet, behind --router"),
    router: Optional[str] = typer.Option(None, "--router", metavar="POLICY", help="with --replicas: round-robin, "
                                         "least-requests, least-kv, prefix-aware or weighted:..."),
    as_json_flag: bool = opt.AS_JSON,
) -> None:
    """Live engine (or a server, or a recorded run) vs simulator on the same trace; writes a report folder."""
    err = Console(stderr=True)
    try:
        if endpoint is not None and measured is not None:
            raise PlannerError("give one of --endpoint and --measured, not both")
        if out is not None:
            check_writable(out, folder=True)     # before the live run whose report it holds
        _refuse_unused(measured=measured is not None, endpoint=endpoint is not None, workload=workload, param=param,
                       rate=rate, burstiness=None if burstiness == 1 else burstiness, concurrency=concurrency,
                       ramp_up_strategy=ramp_up_strategy, requests=requests, length_scale=length_scale,
                       max_output_len=max_output_len, served_model_name=served_model_name, quick=quick,
                       attribution=attribution)
        workload = workload or "sharegpt"
        given = dict(rate=rate, requests=requests, length_scale=length_scale, max_output_len=max_output_len)
        # what the command line gives wins over --quick's values, which win over the defaults
        trace = {**TRACE_DEFAULTS, **(QUICK if quick else {}), **{k: v for k, v in given.items() if v is not None},
                 "workload": workload, "seed": seed, "seeds": seeds, "concurrency": concurrency,
                 "burstiness": burstiness, "ramp_up": opt.ramp_up_of(ramp_up_strategy, ramp_up_start_rps,
                                                                     ramp_up_end_rps),
                 "params": tuple(sorted(parse_workload_params(workload, param).items())) if param else ()}
        if (concurrency is not None or trace["ramp_up"] is not None) and rate is None:
            trace["rate"] = None      # a closed loop alone (its times do not count), or a ramp-up's times
        if replicas is not None or router is not None:
            return _validate_fleet(deployments, {**trace, "speed_correction": speed_correction}, replicas, router,
                                   endpoint or measured, profile, reprofile, out, as_json_flag, err)
        if endpoint is not None or measured is not None:
            return _validate_deployment(deployments, trace, endpoint, measured, served_model_name, profile, reprofile,
                                        out, as_json_flag, err)
        spec = ValidationSpec(deployment=deployments.one("validate", **DEFAULTS), **trace,
                              profile=str(profile) if profile else None, speed_correction=speed_correction,
                              attribution=attribution)
        result, paths, doc = _validate_here(spec, out or _default_folder(spec.deployment.model, workload),
                                            reprofile, err)
    except (PlannerError, TraceError, ValueError, OSError) as exc:
        raise fail(exc) from None
    _print_result(result, paths, doc, as_json_flag)


def _refuse_unused(*, measured: bool, endpoint: bool, attribution: bool, quick: bool, **values) -> None:
    """One line on a flag that would be silently ignored: a recording is its own trace, the model name is sent
    only to a server, and only the in-process run replays its steps for --attribution."""
    if measured:
        unused = [name for name, value in values.items() if value is not None] + (["quick"] if quick else [])
    else:
        unused = ["served_model_name"] if not endpoint and values["served_model_name"] is not None else []
    if attribution and (measured or endpoint):
        unused.append("attribution")
    if unused:
        flags = ", ".join("--" + name.replace("_", "-") for name in unused)
        where = ("--measured (the recording is the trace)" if measured else
                 "--endpoint" if endpoint else "the in-process engine (it is --endpoint's)")
        raise PlannerError(f"{flags}: not used with {where}; drop {'it' if len(unused) == 1 else 'them'}")


def _validate_here(spec: ValidationSpec, folder: Path, reprofile: bool | None,
                   err: Console) -> tuple[Validation, dict, dict]:
    """The in-process validation: the live engine on this machine, then the simulations; the report written."""
    check_device(spec.deployment.gpu)
    err.print(f"validate: {len(spec.trace())} {spec.workload} requests {load_text(spec)} on "
              f"{spec.deployment.gpu} ({spec.deployment.model}); live run first, then the simulation"
              + (f" and {spec.seeds} more with timing noise" if spec.seeds else ""))

    def progress(done: int, total: int) -> None:
        if done == total or done % 8 == 0:
            err.print(f"  live: {done}/{total} requests finished")

    result = validate(spec, reprofile=reprofile, profile_out=folder / "profile.json", progress=progress,
                      say=lambda line: err.print(line, highlight=False, markup=False))
    paths, doc = write_report(result, folder)
    return result, paths, doc


def _validate_fleet(deployments: DeploymentChoices, trace: dict, replicas, router, elsewhere, profile, reprofile,
                    out, as_json_flag: bool, err: Console) -> None:
    """--replicas K: the live fleet in process against the simulated fleet (planner/validation/fleet.py)."""
    if replicas is None:
        raise PlannerError("--router routes between replicas: give --replicas K too")
    opt.check_live_replicas(replicas)
    if elsewhere is not None:
        raise PlannerError("--replicas validates live engines here: drop --endpoint and --measured")
    policy = parse_router(router)
    spec = ValidationSpec(deployment=deployments.one("validate", **DEFAULTS), **trace,
                          profile=str(profile) if profile else None)
    if policy.uses_prefix and not spec.deployment.prefix_caching_on:
        raise PlannerError("the prefix-aware router scores prefix-cache hits: give --enable-prefix-caching")
    check_device(spec.deployment.gpu)
    folder = out or _default_folder(spec.deployment.model, f"{spec.workload}-fleet")
    err.print(f"validate: {len(spec.trace())} {spec.workload} requests {load_text(spec)} on {replicas} live "
              f"{spec.deployment.model} engines ({policy.name}), then the simulated fleet")
    result = validate_fleet(spec, replicas, policy, reprofile=reprofile, profile_out=folder / "profile.json",
                            progress=lambda done, total: done == total and err.print(f"  live: {total} finished"),
                            say=lambda line: err.print(line, highlight=False, markup=False))
    path = write_fleet_report(result, folder)
    doc = result.document()
    if as_json_flag:
        sys.stdout.write(json.dumps({**doc, "report": str(path)}) + "\n")
        return
    Console().print((folder / "report.md").read_text(), highlight=False, markup=False)


def _default_folder(model: str, name: str) -> Path:
    return new_folder(REPORTS_DIR / "validate" / f"{time.strftime('%Y%m%d-%H%M%S')}-{Path(model).name}-"
                                                  f"{Path(name).stem}")


def _validate_deployment(deployments: DeploymentChoices, trace: dict, endpoint, measured, served_model_name,
                         profile, reprofile, out, as_json_flag: bool, err: Console) -> None:
    """--endpoint / --measured: the simulator against a deployment the planner does not run itself.
    --endpoint --reprofile (a server on this machine's device): a quick profile timed half right before the
    bench and half right after it prices the simulation."""
    given = deployments.one("validate", **DEFAULTS)
    flags = {name: getattr(given, name) for name in deployments.given}      # the rest: the server's, or defaults
    base = Deployment(model=given.model, gpu=given.gpu, tp=given.tp)
    spec = ValidationSpec(deployment=base, **trace, profile=str(profile) if profile else None)
    folder = out or _default_folder("endpoint" if endpoint else Path(measured).stem, "")
    if reprofile and (endpoint is None or profile is not None):
        raise PlannerError("--reprofile times this machine's device around a live run: give it with --endpoint "
                           "(a server here) and without --profile")
    if endpoint is not None:
        if reprofile:
            check_device(base.gpu)

        def profile_around(block_size: int):
            from planner.profile.around import ProfileAround     # torch: only a re-profiling run needs it
            return ProfileAround.quick(base.gpu, base.model, block_size, folder / "profile.json",
                                       say=lambda line: err.print(line, highlight=False, markup=False), lora=given)
        err.print(f"validate: {len(spec.trace())} {spec.workload} requests {load_text(spec)} against {endpoint}, "
                  f"then the simulation ({base.model} on {base.gpu})")
        result, sources = validate_endpoint(endpoint, spec, flags, served_model=served_model_name,
                                            profile_around=profile_around if reprofile else None)
    else:
        result, sources = validate_measured(measured, spec, flags)
    paths, doc = write_report(result, folder)
    d = result.spec.deployment
    shown = {k: f"{getattr(d, k, None)} ({src})" for k, src in sources.items()}
    if not as_json_flag and shown:
        err.print("deployment settings: " + ", ".join(f"{k}={v}" for k, v in shown.items()), highlight=False)
    _print_result(result, paths, doc, as_json_flag, {"deployment_sources": shown,
                                                     "source": endpoint if endpoint else str(measured)})


def _print_result(result: Validation, paths: dict, doc: dict, as_json_flag: bool, extra: dict | None = None) -> None:
    if as_json_flag:
        sys.stdout.write(json.dumps({**doc, "report": str(paths["markdown"]), **(extra or {})}) + "\n")
        return
    console = Console()
    console.print(_comparison_table(result))
    if result.spread is not None:
        sp = result.spread
        console.print(f"90% interval: over {len(sp.seeds)} simulations of the trace with the profile's timing "
                      f"noise ({sp.wall_s:.1f} s on {sp.workers} worker(s)); 'in it' shows the nearest edge's "
                      f"error when the measurement is outside", highlight=False)
    s = result.step_error_summary()
    if s:
        console.print(f"per-step error: median |e| {s['median_abs']:.1%}, p90 |e| {s['p90_abs']:.1%}")
    speed = result.speed_level or result.speed_timeline
    if speed is not None:
        console.print(speed.headline(), highlight=False, markup=False)
        raw = result.uncorrected_errors()
        if raw:
            console.print("  errors with the profile as it is: " + ", ".join(
                f"{k} {'–' if e is None else f'{e:+.1%}'}" for k, e in raw.items()), highlight=False, markup=False)
    console.print("[bold]verdict[/bold]")
    for line in doc["verdict"]["lines"]:
        console.print(f"  {line}", highlight=False, markup=False)
    for w in result.warnings:
        console.print(f"  warning: {w}", highlight=False, markup=False)
    console.print(f"report: {paths['markdown']} and {paths['html']}")


def _comparison_table(result: Validation) -> Table:
    table = Table(title=f"simulated vs measured ({result.cost_model})")
    columns = ("metric", "measured", "simulated", "error", "90% interval", "in it", "target")
    for col in columns:
        table.add_column(col, justify="right" if col != "metric" else "left")
    for name, row in result.comparison().items():
        e = row["relative_error"]
        target = TARGETS.get(name)
        table.add_row(name, f"{row['measured']:.4g}" if row["measured"] is not None else "–",
                      f"{row['simulated']:.4g}" if row["simulated"] is not None else "–",
                      "–" if e is None else f"{e:+.1%}", interval_text(row), inside_text(row),
                      f"±{target:.0%}" if target else "")
    return table
