"""`planner simulate` and `planner capacity`: run traces through the simulated engine.

`simulate` with one value per option is one run (a summary table and a run
folder under reports/); comma-separated --rate, --block-size or --allocator
values make a sweep over their product, simulated in parallel processes.
`capacity` bisects the request rate for the highest one that meets the SLOs.
With --json, stdout holds exactly one JSON document; progress goes to stderr.
"""
from __future__ import annotations

import itertools
import json
import sys
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from planner.cli.output import fail
from planner.errors import PlannerError
from planner.runs.seeds import intervals, run_seeds
from planner.profile.check import check_cost_model
from planner.report.run import comparison_row, json_safe, write_capacity, write_run, write_sweep
from planner.analysis.capacity import capacity_document, capacity_title
from planner.runs.slos import parse_slos
from planner.runs.spec import RunSpec, analysed_document
from planner.runs.sweep import run_sweep
from planner.sizing.capacity import find_capacity
from workloads import TraceError, parse_workload_params

REPORTS_DIR = Path("reports")

# Options both commands take (typer reads the defaults of the signature).
MODEL = typer.Option("opt-13b", help="model from the catalog (planner list models)")
GPU = typer.Option("a100-40g", help="GPU from the catalog (planner list gpus)")
TP = typer.Option(1, "--tp", help="tensor parallel size")
DEFAULT_WORKLOAD = "sharegpt"   # the same for simulate and capacity (the paper's main workload)
WORKLOAD = typer.Option(DEFAULT_WORKLOAD, help="built-in workload (planner list workloads)")
PARAM = typer.Option(None, "--param", "-p", metavar="KEY=VALUE", help="workload parameter KEY=VALUE (planner workload show NAME "
                                                 "lists them); repeatable")
TRACE = typer.Option(None, "--trace", help="a .jsonl/.csv trace file instead of --workload")
REQUESTS = typer.Option(None, "--requests", "-n", help="request count (default 1000 without --duration)")
DURATION = typer.Option(None, help="seconds of arrivals")
SEED = typer.Option(0, help="random seed (trace and sampled tokens)")
PREEMPTION = typer.Option("recompute", "--preemption-mode", "--preemption", help="recompute or swap")
MAX_NUM_SEQS = typer.Option(256, help="most sequences per step")
MAX_BATCHED = typer.Option(None, help="most tokens per step (default max(max_model_len, 2048))")
UTILIZATION = typer.Option(0.9, help="fraction of GPU memory the engine may use")
PREFIX = typer.Option(False, "--enable-prefix-caching/--no-enable-prefix-caching", "--prefix-caching/--no-prefix-caching",
                      help="automatic prefix caching (--prefix-caching is an alias)")
SIM_SLO = typer.Option(None, "--slo", metavar="LIMIT", help="optional SLO to judge and draw: s/token, or METRIC=SECONDS; repeatable")
PROFILE = typer.Option(None, "--profile", help="profile JSON for the calibrated cost model (default: "
                                                "profiles/<gpu>/<model>.json if present, else roofline)")
STEP_BY_STEP = typer.Option(False, "--step-by-step", help="simulate one step at a time, without decode "
                                                           "fast-forward (same results, slower)")
COST_MODEL = typer.Option(None, "--cost-model", help="calibrated, measured or roofline (default: a calibrated "
                                                     "profile, else measured vLLM tables, else roofline); or "
                                                     "linear:A,B, every step A + B x scheduled tokens seconds")
CHUNKED = typer.Option(False, "--chunked-prefill", help="schedule as vLLM v1 does: a token budget per step, "
                                                       "decodes first, prompts in chunks (default: the paper's policy)")
NUM_GPU_BLOCKS = typer.Option(None, "--num-gpu-blocks", help="KV-cache size in blocks (instead of the memory plan)")
MAX_MODEL_LEN = typer.Option(None, "--max-model-len", help="longest sequence served (default: the model's own)")
OUT = typer.Option(None, "--out", help="output folder (default reports/<command>-<time>-<workload>)")
SEEDS = typer.Option(1, "--seeds", help="simulate K seeds (seed, seed+1, ...) in parallel and report each "
                                        "metric's mean and 90% interval")
TIMING_NOISE = typer.Option(False, "--timing-noise", help="scatter each step's time by the profile's residual "
                                                         "spread (seeded: reproducible)")
AS_JSON = typer.Option(False, "--json", help="print one JSON document on stdout; progress on stderr")


def _stdout() -> Console:
    # Piped output has no terminal width to fit; do not squeeze the tables into 80 columns.
    console = Console()
    return console if console.is_terminal else Console(width=160)


def _split(text: str, kind, name: str) -> list:
    values = []
    for part in text.split(","):
        part = part.strip()
        try:
            values.append(kind(part))
        except ValueError:
            raise PlannerError(f"--{name}: {part!r} is not a valid {kind.__name__}") from None
    if not values:
        raise PlannerError(f"--{name}: no value given")
    return values


def _default_out(command: str, source: str) -> Path:
    return REPORTS_DIR / f"{command}-{time.strftime('%Y%m%d-%H%M%S')}-{Path(source).stem}"


def _plan_table(plan: dict | None, metrics: dict) -> Table:
    """The memory plan: where each GPU's memory goes, and the totals over all tensor-parallel GPUs."""
    tp = plan["tp"] if plan else 1
    table = Table(title="memory plan" + (f" ({plan['model']} on {tp} x {plan['gpu']})" if plan else ""))
    table.add_column("item")
    table.add_column("per GPU", justify="right")
    if tp > 1:
        table.add_column(f"all {tp} GPUs", justify="right")
    if plan is None:
        table.add_row("KV blocks (given)", f"{metrics['num_gpu_blocks']:,}")
        return table

    def row(name: str, per_gpu: str, total: str = "") -> None:
        table.add_row(name, per_gpu, *([total] if tp > 1 else []))

    gib = "{:.2f} GiB".format
    row("usable", f"{gib(plan['usable_gib_per_gpu'])} ({plan['gpu_memory_utilization']:.0%})",
        gib(plan["usable_gib_per_gpu"] * tp))
    row("weights", gib(plan["weights_gib_per_gpu"]), gib(plan["weights_gib_per_gpu"] * tp))
    row("activations", gib(plan["activations_gib_per_gpu"]), gib(plan["activations_gib_per_gpu"] * tp))
    if "non_torch_gib_per_gpu" in plan:
        row("non-torch (CUDA, cuBLAS, NCCL)", gib(plan["non_torch_gib_per_gpu"]),
            gib(plan["non_torch_gib_per_gpu"] * tp))
    row("KV cache", gib(plan["kv_gib_per_gpu"]), gib(plan["kv_gib_total"]))
    row("KV blocks x block size", f"{plan['num_gpu_blocks']:,} x {plan['block_size']}", "same blocks")
    row("KV token slots", f"{plan['kv_token_slots']:,}" + (f" (1/{tp} of heads)" if tp > 1 else ""),
        f"{plan['kv_token_slots']:,}")
    row("CPU swap blocks", f"{plan['num_cpu_blocks']:,}", f"{plan['num_cpu_blocks']:,}")
    return table


def _unit(metric: str) -> str:
    return " s/token" if metric == "normalized_latency" else " s"


def _fmt(value, unit: str = "", digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}{unit}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}{unit}"
    return f"{value}{unit}"


def _summary_table(doc: dict, wall_time: float) -> Table:
    m, p = doc, doc["params"]
    st = doc.get("steady_state") or {}
    v = doc.get("verdict") or {}
    table = Table(title=f"simulated {p['num_requests']} requests of {p['trace']} on {p['model']} / "
                        f"{p['tp']} x {p['gpu']} ({p['allocator']}, block {p['block_size']}, {m['cost_model']})")
    table.add_column("metric")
    table.add_column("whole run", justify="right")
    table.add_column("steady state", justify="right")

    def both(key: str, unit: str = "", digits: int = 3) -> tuple[str, str]:
        return _fmt(m.get(key), unit, digits), _fmt(st.get(key), unit, digits)

    rows = [
        ("requested rate", _fmt(v.get("requested_rate"), " req/s"), ""),
        ("offered rate (trace arrivals)", _fmt(v.get("offered_rate"), " req/s"), ""),
        ("completed / rejected / truncated", f"{m['num_completed']} / {m['num_rejected']} / {m['num_truncated']}",
         ""),
        ("request throughput (served)", *both("request_throughput", " req/s")),
        ("output token throughput", *both("output_token_throughput", " tok/s", 1)),
        ("normalized latency", *both("normalized_latency", " s/token", 4)),
        ("TTFT mean", *both("ttft_mean", " s")), ("TTFT p99", *both("ttft_p99", " s")),
        ("TPOT mean", *both("tpot_mean", " s", 4)), ("TPOT p99", *both("tpot_p99", " s", 4)),
        ("ITL mean", *both("itl_mean", " s", 4)), ("ITL p99", *both("itl_p99", " s", 4)),
        ("E2E mean", *both("e2e_mean", " s")),
        ("mean batch size (decode steps)", *both("mean_batch_size", "", 2)),
        ("mean batch size (prefill steps)", *both("mean_prefill_batch_size", "", 2)),
        ("KV utilization", *both("kv_utilization", "", 3)),
        ("KV cache full (share of time)", "", _fmt(st.get("kv_full_share"), "", 3)),
        ("preemptions (recompute / swap)", f"{m['preemptions']['recompute']} / {m['preemptions']['swap']}",
         _fmt(st.get("preemptions"))),
        ("memory saved by sharing", f"{m['sharing_saved']:.1%}", ""),
        ("prefix-cache hit rate", f"{m['prefix_cache_hit_rate']:.1%}", ""),
        ("steps", _fmt(m.get("num_steps")), ""),
        ("simulated time", _fmt(m["simulated_time"], " s", 1),
         f"{st['window']['start']:.0f}-{st['window']['end']:.0f} s" if st.get("window") else "-"),
        ("wall time", f"{wall_time:.2f} s", ""),
    ]
    for row in rows:
        table.add_row(*row)
    return table


def print_verdict(console: Console, verdict: dict, warnings: list[str] = (), notes: list[str] = ()) -> None:
    """The verdict block in plain words, then the rejected reasons, warnings and blind spots."""
    console.print("[bold]verdict[/bold]")
    for line in verdict.get("lines", []):
        console.print(f"  {line}", highlight=False, markup=False)
    for entry in verdict.get("rejected") or []:
        console.print(f"  {entry['count']} requests: {entry['reason']}", highlight=False, markup=False)
    for w in warnings:
        console.print(f"  warning: {w}", highlight=False, markup=False)
    if notes:
        console.print("  the cost model does not capture: " + "; ".join(notes), highlight=False, markup=False)


def _interval_table(found: dict, seeds: int, first_seed: int) -> Table:
    table = Table(title=f"over {seeds} seeds ({first_seed}..{first_seed + seeds - 1}): mean and 90% interval")
    for col in ("metric", "mean", "low (5%)", "high (95%)"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for name, iv in found.items():
        table.add_row(name, *[_fmt(iv[k], "", 4) for k in ("mean", "low", "high")])
    return table


@contextmanager
def _progress_bar(err: Console, total: int):
    """A callback for simulate() that drives a transient progress bar on stderr."""
    with Progress(TextColumn("simulating"), BarColumn(), MofNCompleteColumn(), TextColumn("requests"),
                  TextColumn("t={task.fields[now]:,.0f} s"), console=err, transient=True) as bar:
        task = bar.add_task("simulate", total=total, now=0.0)

        def report(now: float, done: int, total: int) -> None:
            bar.update(task, completed=done, now=now)

        yield report


def _workload_params(workload: str, pairs: list[str] | None) -> tuple:
    """-p KEY=VALUE pairs, typed like the workload's defaults."""
    if not pairs:
        return ()
    return tuple(sorted(parse_workload_params(workload, pairs).items()))


def _warn(err: Console, warnings: list[str]) -> None:
    for w in warnings:
        err.print(f"warning: {w}", highlight=False, markup=False)


def simulate(
    model: str = MODEL, gpu: str = GPU, tp: int = TP, workload: str = WORKLOAD,
    trace: Optional[Path] = TRACE, param: Optional[list[str]] = PARAM,
    rate: Optional[str] = typer.Option(None, help="requests/s, or a comma list to sweep (default 1.0; "
                                                  "a trace file keeps its own times)"),
    requests: Optional[int] = REQUESTS, duration: Optional[float] = DURATION, seed: int = SEED,
    block_size: str = typer.Option("16", help="KV block size in tokens, or a comma list to sweep"),
    allocator: str = typer.Option("paged", help="paged, orca-max, orca-pow2, orca-oracle, or a comma list"),
    preemption_mode: str = PREEMPTION, max_num_seqs: int = MAX_NUM_SEQS,
    max_num_batched_tokens: Optional[int] = MAX_BATCHED, gpu_memory_utilization: float = UTILIZATION,
    enable_prefix_caching: bool = PREFIX, profile: Optional[Path] = PROFILE, step_by_step: bool = STEP_BY_STEP,
    chunked_prefill: bool = CHUNKED, num_gpu_blocks: Optional[int] = NUM_GPU_BLOCKS,
    cost_model: Optional[str] = COST_MODEL, max_model_len: Optional[int] = MAX_MODEL_LEN,
    slo: Optional[list[str]] = SIM_SLO, out: Optional[Path] = OUT, as_json: bool = AS_JSON,
    seeds: int = SEEDS, timing_noise: bool = TIMING_NOISE,
) -> None:
    """Simulate a workload on the paged engine (or sweep rates, block sizes, allocators)."""
    err = Console(stderr=True)
    try:
        rates = _split(rate, float, "rate") if rate is not None else [None]
        sizes = _split(block_size, int, "block-size")
        allocators = _split(allocator, str, "allocator")
        source = str(trace) if trace else workload
        slos = parse_slos(slo) if slo else {}
        base = RunSpec(model=model, gpu=gpu, tp=tp, workload=source, requests=requests, duration=duration,
                       seed=seed, preemption_mode=preemption_mode, max_num_seqs=max_num_seqs,
                       max_num_batched_tokens=max_num_batched_tokens,
                       gpu_memory_utilization=gpu_memory_utilization, enable_prefix_caching=enable_prefix_caching,
                       step_by_step=step_by_step,
                       profile=str(profile) if profile else None, workload_params=_workload_params(source, param),
                       slos=tuple(slos.items()), cost_model_option=cost_model, max_model_len=max_model_len,
                       chunked_prefill=chunked_prefill, num_gpu_blocks=num_gpu_blocks,
                       timing_noise=timing_noise)
        specs = [replace(base, rate=r, block_size=b, allocator=a)
                 for a, b, r in itertools.product(allocators, sizes, rates)]
        out_dir = out or _default_out("sweep" if len(specs) > 1 else "sim", base.workload)
        if len(specs) > 1:
            _sweep(specs, out_dir, as_json, err, slos)
            return
        spec = specs[0]
        warnings = spec.check()
        _warn(err, warnings)
        check = check_cost_model(spec.cost_model(spec.config()), spec.model)
        requests_trace = spec.trace()
        with _progress_bar(err, len(requests_trace)) as progress:
            result, seed_docs = run_seeds(spec, seeds, lambda: spec.run(progress=progress, trace=requests_trace))
        result.metrics["profile_check"] = check.as_dict()
        doc = analysed_document(spec, result, warnings)
        if seeds > 1:
            doc["intervals"] = result.metrics["intervals"] = intervals([doc] + seed_docs[1:])
        paths = write_run(result, out_dir, doc, slos)
    except (PlannerError, TraceError, ValueError, OSError) as exc:
        raise fail(str(exc) or type(exc).__name__) from None
    if as_json:
        sys.stdout.write(json.dumps(doc) + "\n")
        err.print(check.headline(), style="yellow" if check.status == "stale" else None, highlight=False)
        err.print(f"run folder: {out_dir} (report.html)", highlight=False)
        return
    console = _stdout()
    console.print(check.headline(), style="bold yellow" if check.status == "stale" else None, highlight=False)
    console.print(_plan_table(result.memory_plan, result.metrics))
    console.print(_summary_table(doc, result.wall_time))
    if "intervals" in doc:
        console.print(_interval_table(doc["intervals"], seeds, spec.seed))
    print_verdict(console, doc["verdict"], warnings, doc["not_modelled"])
    console.print(f"report: {paths['report']}", highlight=False)
    console.print(f"run folder: {out_dir} ({', '.join(p.name for p in paths.values())})", highlight=False)


def _sweep(specs: list[RunSpec], out_dir: Path, as_json: bool, err: Console, slos: dict[str, float]) -> None:
    _warn(err, sorted({w for spec in specs for w in spec.check()}))
    err.print(f"sweeping {len(specs)} runs in parallel processes ...", highlight=False)

    def done(spec: RunSpec, doc: dict) -> None:
        err.print(f"  {spec.allocator}, block {spec.block_size}, rate {spec.rate}: normalized latency "
                  f"{_fmt(doc.get('normalized_latency'), ' s/token', 4)} ({doc['wall_time']:.1f} s wall)",
                  highlight=False)

    docs = run_sweep(specs, on_done=done)
    paths = write_sweep(docs, out_dir, slos)
    verdict = json.loads(paths["runs"].read_text())["verdict"]
    if as_json:
        sys.stdout.write(json.dumps(json_safe({"verdict": verdict, "runs": docs})) + "\n")
        err.print(f"sweep folder: {out_dir} (report.html)", highlight=False)
        return
    table = Table(title=f"sweep: {len(docs)} runs")
    columns = {"allocator": "allocator", "block_size": "block", "rate": "rate", "request_throughput": "req/s",
               "normalized_latency": "s/token", "ttft_p99": "TTFT p99", "tpot_p99": "TPOT p99",
               "mean_batch_size": "batch", "kv_utilization": "KV util", "preemptions_total": "preempt",
               "num_rejected": "rejected", "num_truncated": "truncated"}
    for col, title in columns.items():
        table.add_column(title, justify="left" if col == "allocator" else "right")
    table.add_column("verdict")
    for i, doc in enumerate(docs):
        row = comparison_row(doc)
        state = doc.get("verdict", {}).get("state", "?")
        table.add_row(*[_fmt(row.get(c), "", 3) for c in columns],
                      state + (" *best*" if i == verdict.get("best_index") else ""))
    console = _stdout()
    console.print(table)
    console.print("[bold]verdict[/bold]")
    for line in verdict["lines"]:
        console.print(f"  {line}", highlight=False, markup=False)
    notes = list(dict.fromkeys(n for doc in docs for n in doc.get("not_modelled", [])))
    console.print(f"  cost model: {docs[0].get('cost_model')}; it does not capture: " + "; ".join(notes),
                  highlight=False, markup=False)
    console.print(f"report: {paths['report']}", highlight=False)
    console.print(f"sweep folder: {out_dir} ({', '.join(p.name for p in paths.values())})", highlight=False)


def capacity(
    slo: list[str] = typer.Option(..., "--slo", metavar="LIMIT", help="normalized latency limit in s/token (e.g. 0.2), or "
                                                     "METRIC=SECONDS (e.g. ttft_p99=2, tpot_p99=0.1); repeatable"),
    model: str = MODEL, gpu: str = GPU, tp: int = TP, workload: str = WORKLOAD,
    trace: Optional[Path] = TRACE, param: Optional[list[str]] = PARAM, requests: Optional[int] = REQUESTS,
    duration: Optional[float] = DURATION,
    seed: int = SEED, block_size: int = typer.Option(16, help="KV block size in tokens"),
    allocator: str = typer.Option("paged", help="paged, orca-max, orca-pow2 or orca-oracle"),
    preemption_mode: str = PREEMPTION, max_num_seqs: int = MAX_NUM_SEQS,
    max_num_batched_tokens: Optional[int] = MAX_BATCHED, gpu_memory_utilization: float = UTILIZATION,
    enable_prefix_caching: bool = PREFIX, profile: Optional[Path] = PROFILE, step_by_step: bool = STEP_BY_STEP,
    chunked_prefill: bool = CHUNKED, num_gpu_blocks: Optional[int] = NUM_GPU_BLOCKS,
    start_rate: float = typer.Option(1.0, help="first rate tried (requests/s)"),
    max_rate: float = typer.Option(256.0, help="highest rate tried"),
    tolerance: float = typer.Option(0.02, help="stop when the bracket is this close (relative)"),
    out: Optional[Path] = OUT, as_json: bool = AS_JSON, cost_model: Optional[str] = COST_MODEL,
    max_model_len: Optional[int] = MAX_MODEL_LEN, seeds: int = SEEDS, timing_noise: bool = TIMING_NOISE,
    confidence: float = typer.Option(0.9, help="with --seeds: the SLOs must hold in at least this fraction "
                                               "of the seeds"),
) -> None:
    """Highest request rate whose latency stays within the SLOs, found by bisection."""
    err = Console(stderr=True)
    try:
        slos = parse_slos(slo)
        source = str(trace) if trace else workload
        spec = RunSpec(model=model, gpu=gpu, tp=tp, workload=source, requests=requests, duration=duration,
                       seed=seed, block_size=block_size, allocator=allocator, preemption_mode=preemption_mode,
                       max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                       gpu_memory_utilization=gpu_memory_utilization, enable_prefix_caching=enable_prefix_caching,
                       step_by_step=step_by_step,
                       profile=str(profile) if profile else None, workload_params=_workload_params(source, param),
                       slos=tuple(slos.items()), cost_model_option=cost_model, max_model_len=max_model_len,
                       chunked_prefill=chunked_prefill, num_gpu_blocks=num_gpu_blocks,
                       timing_noise=timing_noise)
        _warn(err, spec.check())

        def probed(rate: float, ok: bool, doc: dict) -> None:
            shown = ", ".join(f"{k} {_fmt(doc.get(k), _unit(k), 4)}" for k in slos)
            grows = "; the queue keeps growing" if (doc.get("verdict") or {}).get("overloaded") else ""
            if seeds > 1:
                grows += f"; met by {doc['slo_probability']:.0%} of {seeds} seeds"
            err.print(f"  {rate:8.3f} req/s: {'meets' if ok else 'misses'} ({shown}{grows})", highlight=False)

        err.print(f"searching the capacity of {spec.model} / {spec.tp} x {spec.gpu} on {spec.workload} "
                  f"({', '.join(f'{k} <= {v}' for k, v in slos.items())}) ...", highlight=False)
        found = find_capacity(spec, slos, start=start_rate, max_rate=max_rate, rel_tol=tolerance,
                              min_rate=min(0.01, start_rate), on_probe=probed, seeds=seeds, confidence=confidence)
        doc = capacity_document(spec, slos, found)
        doc.update(seeds=seeds, confidence=confidence)
        out_dir = out or _default_out("capacity", spec.workload)
        paths = write_capacity(doc, out_dir, capacity_title(spec, slos))
    except (PlannerError, TraceError, ValueError, OSError) as exc:
        raise fail(str(exc) or type(exc).__name__) from None
    if as_json:
        sys.stdout.write(json.dumps(doc) + "\n")
        err.print(f"capacity folder: {out_dir} (report.html)", highlight=False)
        return
    console = _stdout()
    console.print("[bold]verdict[/bold]")
    for line in doc["verdict"]["lines"]:
        console.print(f"  {line}", highlight=False, markup=False)
    console.print(f"report: {paths['report']}", highlight=False)
    console.print(f"written to {paths['capacity']}", highlight=False)
