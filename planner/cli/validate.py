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

from planner.cli.output import fail
from planner.errors import PlannerError
from planner.profile.check import ProfileCheck
from planner.validation.live import ValidateConfig, check_device, trusted_profile, validate
from workloads import TraceError
from planner.report.html import validation_report
from planner.report.run import json_safe
from planner.report.validation import TARGETS, as_json, write_report
from planner.analysis.verdict import validation_verdict

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
    block_size: Optional[int] = typer.Option(None, help="KV block size (default 16; --endpoint: read from the "
                                                        "server's /metrics where exposed)"),
    num_gpu_blocks: Optional[int] = typer.Option(None, help="KV blocks; small values force preemption"),
    preemption: Optional[str] = typer.Option(None, "--preemption-mode", "--preemption",
                                             help="recompute | swap (default recompute)"),
    max_num_seqs: Optional[int] = typer.Option(None, help="default 32 in-process, 256 (vLLM's) for a deployment"),
    endpoint: Optional[str] = typer.Option(None, help="validate a running OpenAI-compatible server (ours or vLLM) "
                                                      "instead of the in-process engine"),
    measured: Optional[Path] = typer.Option(None, help="validate a recorded run: per-request JSONL, a bench "
                                                       "requests.csv, or vLLM bench --save-detailed JSON"),
    served_model_name: Optional[str] = typer.Option(None, help="--endpoint: the model name to send "
                                                               "(default: the first of /v1/models)"),
    num_cpu_blocks: Optional[int] = typer.Option(None, help="deployment's CPU swap blocks (--endpoint/--measured)"),
    max_num_batched_tokens: Optional[int] = typer.Option(None, help="tokens per step (default: the policy's; "
                                                                    "--endpoint/--measured: the deployment's)"),
    max_model_len: Optional[int] = typer.Option(None, help="deployment's context limit"),
    enable_prefix_caching: Optional[bool] = typer.Option(None, "--enable-prefix-caching/--no-enable-prefix-caching",
                                                         help="deployment's prefix caching"),
    gpu_memory_utilization: Optional[float] = typer.Option(None, help="deployment's memory fraction (sizes the "
                                                                      "KV cache when --num-gpu-blocks is not known)"),
    tp: int = typer.Option(1, "--tp", help="deployment's tensor parallel size (--endpoint/--measured)"),
    profile: Optional[Path] = typer.Option(None, help="profile JSON (default: profiles/<gpu>/<model>.json)"),
    out: Optional[Path] = typer.Option(None, help="report folder (default: reports/validate/<time>-<model>-<workload>)"),
    quick: bool = typer.Option(False, help="a short run (24 requests, short lengths)"),
    reprofile: Optional[bool] = typer.Option(None, "--reprofile/--no-reprofile",
                                             help="--reprofile: profile this device (--quick; on a CPU its points "
                                                  "timed between the live run's steps, on a GPU half right "
                                                  "before the run and half right after) and validate "
                                                  "against that profile; default: only when the profile check "
                                                  "finds the profile stale; --no-reprofile: refuse a stale one"),
    as_json_flag: bool = typer.Option(False, "--json", help="print the comparison as one JSON document"),
    chunked_prefill: Optional[bool] = typer.Option(None, "--chunked-prefill", help="engine and simulator both "
                                                   "schedule as vLLM v1 (chunked prefill; a vLLM v1 deployment does)"),
    speed_correction: Optional[bool] = typer.Option(
        None, "--speed-correction/--no-speed-correction",
        help="follow the device's speed during the live run (always measured and reported): by default the "
             "simulation follows the speed read by a profile timed along the run (on a CPU with --reprofile or "
             "a stale profile), not the canaries timed right before and after the run otherwise; "
             "--speed-correction follows either, --no-speed-correction neither (planner/profile/speed.py)"),
) -> None:
    """Live engine (or a server, or a recorded run) vs simulator on the same trace; writes a Markdown/JSON/PNG report."""
    if endpoint is not None or measured is not None:
        deployment = dict(block_size=block_size, num_gpu_blocks=num_gpu_blocks, num_cpu_blocks=num_cpu_blocks,
                          max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                          max_model_len=max_model_len, preemption_mode=preemption,
                          enable_prefix_caching=enable_prefix_caching, enable_chunked_prefill=chunked_prefill or None,
                          gpu_memory_utilization=gpu_memory_utilization)
        trace_settings = dict(gpu=gpu, model=model, workload=workload, rate=rate, requests=requests, seed=seed,
                              length_scale=length_scale, max_output_len=max_output_len,
                              profile=str(profile) if profile else None)
        if quick:
            trace_settings.update(QUICK)
        return _validate_deployment(endpoint, measured, deployment, trace_settings, tp, served_model_name, out,
                                    as_json_flag)
    block_size = 16 if block_size is None else block_size
    preemption = preemption or "recompute"
    max_num_seqs = 32 if max_num_seqs is None else max_num_seqs
    settings = dict(gpu=gpu, model=model, workload=workload, rate=rate, requests=requests, seed=seed,
                    length_scale=length_scale, max_output_len=max_output_len, block_size=block_size,
                    num_gpu_blocks=num_gpu_blocks, preemption_mode=preemption, max_num_seqs=max_num_seqs,
                    profile=str(profile) if profile else None, enable_chunked_prefill=bool(chunked_prefill),
                    max_num_batched_tokens=max_num_batched_tokens, speed_correction=speed_correction)
    if quick:
        settings.update(QUICK)
    folder = out or Path("reports") / "validate" / f"{time.strftime('%Y%m%d-%H%M%S')}-{Path(model).name}-{workload}"
    err = Console(stderr=True)
    try:
        check_device(gpu)
        check, fresh = None, None
        cfg = ValidateConfig(**settings)
        if not reprofile:
            check = trusted_profile(ValidateConfig(**settings), refuse_stale=reprofile is False, say=err.print)
        if reprofile or check.status == "stale":
            from planner.profile.along import profile_for_live_run   # imports torch: only here
            fresh = profile_for_live_run(gpu, model, block_size, folder / "profile.json",
                                          span_s=cfg.trace().stats()["duration"], say=err.print)
        err.print(f"validate: {cfg.requests} {cfg.workload} requests at {cfg.rate} req/s on {cfg.gpu} "
                  f"({cfg.model}); live run first, then the simulation")

        def progress(done: int, total: int) -> None:
            if done == total or done % 8 == 0:
                err.print(f"  live: {done}/{total} requests finished")

        result = validate(cfg, progress=progress, fresh=fresh)
        if fresh is not None:
            replaced = f"; the profile it replaces was stale: {check.reason}" if check is not None else ""
            check = ProfileCheck("ok", fresh.describe() + replaced)
            err.print(check.headline(), highlight=False, markup=False)
        result.profile_check = check.as_dict()
        report = write_report(result, folder)
    except (PlannerError, TraceError, ValueError, OSError) as exc:
        raise fail(str(exc)) from None
    _print_result(result, report, as_json_flag)


def _print_result(result, report: Path, as_json_flag: bool, extra: dict | None = None) -> None:
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
        doc.update(extra or {})
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
    speed = result.speed_level or result.speed_timeline
    if speed is not None:
        console.print(speed.headline(), highlight=False, markup=False)
        raw = result.uncorrected_errors()
        if raw:
            console.print("  errors with the profile as it is: " + ", ".join(
                f"{k} {'–' if e is None else f'{e:+.1%}'}" for k, e in raw.items()), highlight=False, markup=False)
    console.print("[bold]verdict[/bold]")
    for line in verdict["lines"]:
        console.print(f"  {line}", highlight=False, markup=False)
    console.print(f"report: {report} and {html}")


def _validate_deployment(endpoint, measured, deployment: dict, trace_settings: dict, tp: int, served_model_name,
                         out: Optional[Path], as_json_flag: bool) -> None:
    """--endpoint / --measured: the simulator against a deployment the planner does not run itself."""
    from planner.catalog import ModelSpec, resolve_model
    from planner.validation.external import Deployment, validate_endpoint, validate_measured

    if endpoint is not None and measured is not None:
        raise fail("give one of --endpoint and --measured, not both")
    err = Console(stderr=True)
    name = Path(measured).stem if measured else "endpoint"
    folder = out or Path("reports") / "validate" / f"{time.strftime('%Y%m%d-%H%M%S')}-{name}"
    if measured is not None:
        trace_settings["workload"] = Path(measured).name
    dep = Deployment()
    dep.fill({k: v for k, v in deployment.items() if v is not None}, "flag")
    try:
        model = trace_settings["model"]
        spec = ModelSpec.from_model_dir(Path(model)) if (Path(model) / "config.json").exists() else resolve_model(model)
        vcfg = ValidateConfig(**trace_settings, block_size=dep.block_size or 16,
                              preemption_mode=dep.preemption_mode or "recompute",
                              max_num_seqs=dep.max_num_seqs or 256, num_gpu_blocks=dep.num_gpu_blocks)
        if endpoint is not None:
            trace = vcfg.trace()
            err.print(f"validate: {len(trace)} {vcfg.workload} requests at {vcfg.rate} req/s against {endpoint}, "
                      f"then the simulation ({spec.name} on {vcfg.gpu})")
            result, dep = validate_endpoint(endpoint, trace, vcfg, spec, dep, tp=tp, served_model=served_model_name)
        else:
            result = validate_measured(measured, vcfg, spec, dep, tp=tp)
        # The report shows the settings the simulator used.
        result.config.block_size = dep.block_size or 16
        result.config.max_num_seqs = dep.max_num_seqs or 256
        result.config.preemption_mode = dep.preemption_mode or "recompute"
        report = write_report(result, folder)
    except (PlannerError, TraceError, ValueError, OSError) as exc:
        raise fail(str(exc)) from None
    sources = {k: f"{getattr(dep, k)} ({src})" for k, src in dep.sources.items()}
    if not as_json_flag and sources:
        err.print("deployment settings: " + ", ".join(f"{k}={v}" for k, v in sources.items()), highlight=False)
    _print_result(result, report, as_json_flag, {"deployment": sources,
                                                 "source": endpoint if endpoint else str(measured)})
