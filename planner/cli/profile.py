"""`planner profile`: measure the engine on this machine's device and write the profile JSON."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from planner.cli.options import DeploymentChoices, deployment_options
from planner.cli.output import check_writable, fail
from planner.deploy import checks
from planner.errors import PlannerError
from planner.profile.ngram import curve_flags, measure_ngram
from planner.profile.grid import MAX_REPEATS
from planner.profile.options import ProfileOptions
from planner.profile.schema import profile_path, save_profile
from workloads import Trace, TraceError


def _fit_table(profile) -> Table:
    table = Table(title=f"fit: {profile.model.name} on {profile.device.gpu} ({profile.device.device_name})")
    for col in ("component", "points", "chosen", "CV mean err", "CV median err", "other method CV mean"):
        table.add_column(col)
    counts: dict[str, int] = {}
    for m in profile.measurements:
        counts[m.component] = counts.get(m.component, 0) + 1

    def pct(value):
        return "-" if value is None else f"{100 * value:.1f}%"
    for name, fit in profile.fit.items():
        other = "linear" if fit.chosen == "piecewise" else "piecewise"
        table.add_row(name, str(counts.get(name, 0)), fit.chosen, pct(fit.cv[fit.chosen].mean_rel),
                      pct(fit.cv[fit.chosen].median_rel), f"{other} {pct(fit.cv[other].mean_rel)}")
    return table


NGRAM_TRACE = typer.Option(None, "--trace", help="with --speculative ngram:K: a trace file with its answers' "
                                                  "token ids to measure n-gram speculation on")
# What a profile measures depends on these settings only; the others would change nothing in it.
PROFILED = ("model", "gpu", "tp", "block_size", "enable_lora", "max_loras", "max_lora_rank")


@deployment_options
def profile(
    deployments: DeploymentChoices,
    quick: bool = typer.Option(False, "--quick", help="small grid, 5 repetitions: minutes instead of tens of minutes"),
    force: bool = typer.Option(False, "--force", help="profile even if the device is not the GPU named"),
    per_layer: Optional[bool] = typer.Option(None, "--per-layer/--full-model",
                                             help="time 1- and 2-layer models and scale by the layer count "
                                                  "(default: only when the full model does not fit)"),
    repeats: Optional[int] = typer.Option(None, "--repeats", min=1, max=MAX_REPEATS,
                                          help="timed repetitions per grid point"),
    out: Optional[Path] = typer.Option(None, "--out", help="output file (default: profiles/<gpu>/<model>.json, "
                                                           "under $PLANNER_PROFILE_DIR if set)"),
    as_json: bool = typer.Option(False, "--json", help="print the fit summary as one JSON document on stdout"),
    trace: Optional[Path] = NGRAM_TRACE,
) -> None:
    """Time the engine's prefill, decode, host-side, sampling, swap and copy costs; fit the calibrated cost
    model. --gpu (required): a catalog GPU present here, or cpu; --model: the model (default opt-125m).
    --speculative ngram:K --trace FILE: n-gram speculation measured on a trace's text instead."""
    if "speculative" in deployments.given or trace is not None:
        timing = [flag for flag, value in (("--quick", quick), ("--force", force), ("--per-layer", per_layer),
                                           ("--repeats", repeats)) if value]
        return _profile_ngram(deployments, trace, out, as_json, timing)
    try:
        other = sorted(set(deployments.given) - set(PROFILED))
        if other:
            raise PlannerError(f"--{other[0].replace('_', '-')} does not change what `planner profile` measures "
                               f"(it times {', '.join(PROFILED)}); leave it out")
        if "gpu" not in deployments.given:
            raise PlannerError("give --gpu: the catalog GPU present here, or cpu")
        deployment = deployments.one("profile", model="opt-125m")
        checks.gpu(deployment.gpu)     # named before the progress bar starts, which an error would leave a line of
        checks.model(deployment.model)
        if out is not None:
            check_writable(out)        # before the minutes of timing it would hold
        from planner.profile.run import run_profile   # torch: only a profile that runs needs it

        opts = ProfileOptions(deployment, quick=quick, force=force, per_layer=per_layer, repeats=repeats)
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      transient=True, console=Console(stderr=True)) as bar:
            task = bar.add_task("building the model", total=None)

            def advance(description: str, total: int) -> None:
                if bar.tasks[0].total is None:
                    bar.update(task, total=total, completed=0)
                else:
                    bar.advance(task)
                bar.update(task, description=description)
            result = run_profile(opts, advance)
    except (PlannerError, ValueError) as exc:
        raise fail(exc) from None
    try:
        path = save_profile(result, out or profile_path(result.device.gpu, result.model.name))
    except OSError as exc:
        raise fail(exc) from None
    if as_json:
        fits = {name: {"method": fit.chosen, "cv_mean_rel": fit.cv[fit.chosen].mean_rel}
                for name, fit in result.fit.items()}
        sys.stdout.write(json.dumps({"profile": str(path), "gpu": result.device.gpu, "model": result.model.name,
                                     "device_name": result.device.device_name, "block_size": result.block_size,
                                     "fit": fits}) + "\n")
        return
    console = Console()
    console.print(_fit_table(result))
    load, cores = result.device.load_average, os.cpu_count() or 1
    if result.device.kind == "cpu" and load is not None and load > 0.5 * cores:
        console.print(f"[yellow]warning: load average {load:.1f} on {cores} cores while profiling: other "
                      "processes inflate and scatter CPU timings; profile an idle machine for a faithful model[/]")
    if result.device.forced:
        console.print(f"[yellow]forced: measured on {result.device.device_name}, filed as {result.device.gpu}[/]")
    console.print(f"profile written to {path}")


def _profile_ngram(deployments: DeploymentChoices, trace_path: Path | None, out: Path | None, as_json: bool,
                   timing: list[str]) -> None:
    """`profile --speculative ngram:K --trace FILE`: the curves, the counts, and the flags to simulate with."""
    try:
        if trace_path is None or "speculative" not in deployments.given:
            raise PlannerError("measuring n-gram speculation takes both --speculative ngram:K and --trace FILE")
        unused = timing + ["--" + name.replace("_", "-") for name in sorted(set(deployments.given) - {"speculative"})]
        if unused:
            them = "it" if len(unused) == 1 else "them"
            raise PlannerError(f"{', '.join(unused)}: not used when measuring n-gram speculation on a trace (it "
                               f"reads the trace's text, no device and no model); drop {them}")
        speculative = deployments.one("profile").speculative
        if out is not None:
            check_writable(out)
        stats = measure_ngram(Trace.load(trace_path), speculative)
        flags = curve_flags(stats, speculative)
        document = {"trace": str(trace_path), "speculative": speculative, **stats.as_dict(), "flags": flags}
        if out is not None:
            out.write_text(json.dumps(document, indent=1) + "\n")
    except (PlannerError, TraceError, ValueError, OSError) as exc:
        raise fail(exc) from None
    if as_json:
        sys.stdout.write(json.dumps(document) + "\n")
        return
    console = Console()
    table = Table(title=f"n-gram speculation ({speculative}) measured on {trace_path}")
    for col in ("position", "drafted (conditional)", "accepted (conditional)"):
        table.add_column(col)
    for i, (d, a) in enumerate(zip(stats.draft_rates(), stats.acceptance_rates()), 1):
        table.add_row(str(i), f"{d:.3f}", f"{a:.3f}")
    console.print(table)
    persistence = stats.draft_persistence()
    console.print(f"{stats.num_lookups} lookups, {stats.num_drafts} drafts ({stats.num_draft_tokens} tokens), "
                  f"mean acceptance length {stats.mean_acceptance_length or 1:.3f}; a draft right after a draft: "
                  f"{'-' if persistence is None else f'{persistence:.3f}'}", highlight=False)
    console.print("simulate with: " + " ".join(flags), highlight=False, soft_wrap=True)
