"""`planner validate`: run the live engine and the simulator on one trace and compare."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from planner.cli_common import fail
from planner.errors import PlannerError
from planner.validate import ValidateConfig, check_device, validate
from workloads import TraceError
from planner.report_html import validation_report
from planner.report_sim import json_safe
from planner.validate_report import TARGETS, as_json, write_report
from planner.verdict import validation_verdict

# --quick: the README's main job ends with this (a couple of minutes on 2 cores).
QUICK = dict(requests=24, rate=3.0, length_scale=0.15, max_output_len=96)


def validate_cmd(
    gpu: str = typer.Option("cpu", help="device to validate on: cpu, or a catalog GPU present here"),
    model: str = typer.Option("opt-125m", help="catalog model (random weights) or a local model folder"),
    workload: str = typer.Option("sharegpt", help="built-in workload or trace file"),
    rate: float = typer.Option(4.0, help="request rate (req/s, Poisson)"),
    requests: int = typer.Option(64, help="number of requests"),
    seed: int = typer.Option(0),
    length_scale: float = typer.Option(0.25, help="scale the workload's lengths (CPU runs must stay short)"),
    max_output_len: int = typer.Option(256, help="cap on output lengths after scaling"),
    block_size: int = typer.Option(16),
    num_gpu_blocks: Optional[int] = typer.Option(None, help="KV blocks; small values force preemption"),
    preemption: str = typer.Option("recompute", "--preemption-mode", "--preemption", help="recompute | swap"),
    max_num_seqs: int = typer.Option(32),
    profile: Optional[Path] = typer.Option(None, help="profile JSON (default: profiles/<gpu>/<model>.json)"),
    out: Optional[Path] = typer.Option(None, help="report folder (default: reports/validate/<time>-<model>-<workload>)"),
    quick: bool = typer.Option(False, help="a short run (24 requests, short lengths)"),
    reprofile: bool = typer.Option(False, help="profile this device (--quick) first and validate against "
                                               "that profile: CPU speed drifts, so calibrate right before"),
    as_json_flag: bool = typer.Option(False, "--json", help="print the comparison as one JSON document"),
    chunked_prefill: bool = typer.Option(False, "--chunked-prefill", help="engine and simulator both schedule "
                                                                         "as vLLM v1 (chunked prefill)"),
    max_num_batched_tokens: Optional[int] = typer.Option(None, help="tokens per step (default: the policy's)"),
) -> None:
    """Live engine vs simulator on the same trace; writes a Markdown/JSON/PNG report."""
    settings = dict(gpu=gpu, model=model, workload=workload, rate=rate, requests=requests, seed=seed,
                    length_scale=length_scale, max_output_len=max_output_len, block_size=block_size,
                    num_gpu_blocks=num_gpu_blocks, preemption_mode=preemption, max_num_seqs=max_num_seqs,
                    profile=str(profile) if profile else None, enable_chunked_prefill=chunked_prefill,
                    max_num_batched_tokens=max_num_batched_tokens)
    if quick:
        settings.update(QUICK)
    folder = out or Path("reports") / "validate" / f"{time.strftime('%Y%m%d-%H%M%S')}-{Path(model).name}-{workload}"
    err = Console(stderr=True)
    try:
        check_device(gpu)
        if reprofile:
            settings["profile"] = str(_profile_now(gpu, model, folder / "profile.json", err))
        cfg = ValidateConfig(**settings)
        err.print(f"validate: {cfg.requests} {cfg.workload} requests at {cfg.rate} req/s on {cfg.gpu} "
                  f"({cfg.model}); live run first, then the simulation")

        def progress(done: int, total: int) -> None:
            if done == total or done % 8 == 0:
                err.print(f"  live: {done}/{total} requests finished")

        result = validate(cfg, progress=progress)
        report = write_report(result, folder)
    except (PlannerError, TraceError, ValueError, OSError) as exc:
        raise fail(str(exc)) from None
    verdict = validation_verdict(result, TARGETS)
    comparison = report.parent / "comparison.json"      # the validation's result file gets the verdict too
    if comparison.is_file():
        comparison.write_text(json.dumps({**json.loads(comparison.read_text()), "verdict": json_safe(verdict)},
                                         indent=2) + "\n")
    html = validation_report(json_safe(as_json(result)), verdict, report.parent,
                             f"Validation: {result.spec.name} on {result.config.gpu}, {result.config.workload} at "
                             f"{result.config.rate:g} req/s")
    if as_json_flag:
        doc = as_json(result)
        doc["report"] = str(report)
        doc["verdict"] = json_safe(verdict)
        sys.stdout.write(json.dumps(doc) + "\n")
        return
    table = Table(title=f"simulated vs measured ({result.cost_model})")
    for col in ("metric", "measured", "simulated", "error", "target"):
        table.add_column(col, justify="right" if col != "metric" else "left")
    for name, row in result.comparison().items():
        e = row["relative_error"]
        target = TARGETS.get(name)
        table.add_row(name, f"{row['measured']:.4g}" if row["measured"] is not None else "–",
                      f"{row['simulated']:.4g}" if row["simulated"] is not None else "–",
                      "–" if e is None else f"{e:+.1%}", f"±{target:.0%}" if target else "")
    console = Console()
    console.print(table)
    s = result.step_error_summary()
    if s:
        console.print(f"per-step error: median |e| {s['median_abs']:.1%}, p90 |e| {s['p90_abs']:.1%}")
    console.print("[bold]verdict[/bold]")
    for line in verdict["lines"]:
        console.print(f"  {line}", highlight=False, markup=False)
    console.print(f"report: {report} and {html}")


def _profile_now(gpu: str, model: str, path: Path, err: Console) -> Path:
    from planner.profile_schema import save_profile
    from planner.profiling.run import ProfileOptions, run_profile

    err.print(f"validate: profiling {model} on {gpu} first (--quick)")
    return save_profile(run_profile(ProfileOptions(gpu=gpu, model=model, quick=True)), path)
