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

from planner.cli_common import fail
from planner.errors import PlannerError
from planner.report_sim import comparison_row, json_safe, result_document, write_run, write_sweep
from planner.sim import SimResult
from planner.sweep import RunSpec, find_capacity, parse_slos, run_sweep
from workloads import TraceError

REPORTS_DIR = Path("reports")

# Options both commands take (typer reads the defaults of the signature).
MODEL = typer.Option("opt-13b", help="model from the catalog (planner list models)")
GPU = typer.Option("a100-40g", help="GPU from the catalog (planner list gpus)")
TP = typer.Option(1, "--tp", help="tensor parallel size")
WORKLOAD = typer.Option("chatbot", help="built-in workload (planner workload list)")
TRACE = typer.Option(None, "--trace", help="a .jsonl/.csv trace file instead of --workload")
REQUESTS = typer.Option(None, "--requests", "-n", help="request count (default 1000 without --duration)")
DURATION = typer.Option(None, help="seconds of arrivals")
SEED = typer.Option(0, help="random seed (trace and sampled tokens)")
PREEMPTION = typer.Option("recompute", "--preemption", help="recompute or swap")
MAX_NUM_SEQS = typer.Option(256, help="most sequences per step")
MAX_BATCHED = typer.Option(None, help="most tokens per step (default max(max_model_len, 2048))")
UTILIZATION = typer.Option(0.9, help="fraction of GPU memory the engine may use")
PREFIX = typer.Option(False, "--prefix-caching", help="enable automatic prefix caching")
PROFILE = typer.Option(None, "--profile", help="profile JSON for the calibrated cost model (default: "
                                                "profiles/<gpu>/<model>.json if present, else roofline)")
OUT = typer.Option(None, "--out", help="output folder (default reports/<command>-<time>-<workload>)")
AS_JSON = typer.Option(False, "--json", help="print one JSON document on stdout; progress on stderr")
CHUNKED = typer.Option(False, "--chunked-prefill", help="schedule as vLLM v1 does: a token budget per step, "
                                                       "decodes first, prompts in chunks (default: the paper's policy)")
NUM_GPU_BLOCKS = typer.Option(None, "--num-gpu-blocks", help="KV-cache size in blocks (instead of the memory plan)")
COST_MODEL = typer.Option(None, "--cost-model", help="linear:A,B: every step takes A + B x scheduled tokens "
                                                     "seconds (what-ifs and checks against other simulators)")


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
    """The memory plan, as `planner capacity` prints it: where each GPU's memory goes."""
    table = Table(title="memory plan (per GPU)")
    table.add_column("item")
    table.add_column("value", justify="right")
    if plan is None:
        table.add_row("KV blocks (given)", f"{metrics['num_gpu_blocks']:,}")
    else:
        table.add_row("model / GPU", f"{plan['model']} on {plan['tp']} x {plan['gpu']}")
        table.add_row("usable", f"{plan['usable_gib_per_gpu']:.2f} GiB ({plan['gpu_memory_utilization']:.0%})")
        table.add_row("weights", f"{plan['weights_gib_per_gpu']:.2f} GiB")
        table.add_row("activations", f"{plan['activations_gib_per_gpu']:.2f} GiB")
        table.add_row("KV cache", f"{plan['kv_gib_per_gpu']:.2f} GiB ({plan['kv_gib_total']:.2f} GiB total)")
        table.add_row("KV blocks x block size", f"{plan['num_gpu_blocks']:,} x {plan['block_size']}")
        table.add_row("KV token slots", f"{plan['kv_token_slots']:,}")
        table.add_row("CPU swap blocks", f"{plan['num_cpu_blocks']:,}")
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


def _summary_table(result: SimResult) -> Table:
    m = result.metrics
    p = result.params
    table = Table(title=f"simulated {p['num_requests']} requests of {p['trace']} on {p['model']} / "
                        f"{p['tp']} x {p['gpu']} ({p['allocator']}, block {p['block_size']}, {m['cost_model']})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("completed / rejected / truncated", f"{m['num_completed']} / {m['num_rejected']} / {m['num_truncated']}"),
        ("request throughput", _fmt(m.get("request_throughput"), " req/s")),
        ("output token throughput", _fmt(m.get("output_token_throughput"), " tok/s", 1)),
        ("normalized latency", _fmt(m.get("normalized_latency"), " s/token", 4)),
        ("TTFT mean / p99", f"{_fmt(m.get('ttft_mean'), ' s')} / {_fmt(m.get('ttft_p99'), ' s')}"),
        ("TPOT mean / p99", f"{_fmt(m.get('tpot_mean'), ' s', 4)} / {_fmt(m.get('tpot_p99'), ' s', 4)}"),
        ("ITL mean / p99", f"{_fmt(m.get('itl_mean'), ' s', 4)} / {_fmt(m.get('itl_p99'), ' s', 4)}"),
        ("E2E mean / p99", f"{_fmt(m.get('e2e_mean'), ' s')} / {_fmt(m.get('e2e_p99'), ' s')}"),
        ("mean batch size (decode / prefill steps)",
         f"{_fmt(m.get('mean_batch_size'), '', 2)} / {_fmt(m.get('mean_prefill_batch_size'), '', 2)}"),
        ("KV utilization", _fmt(m.get("kv_utilization"), "", 3)),
        ("memory saved by sharing", f"{m['sharing_saved']:.1%}"),
        ("prefix-cache hit rate", f"{m['prefix_cache_hit_rate']:.1%}"),
        ("preemptions (recompute / swap)", f"{m['preemptions']['recompute']} / {m['preemptions']['swap']}"),
        ("steps", _fmt(m.get("num_steps"))),
        ("simulated time", _fmt(m["simulated_time"], " s", 1)),
        ("wall time", f"{result.wall_time:.2f} s"),
    ]
    for name, value in rows:
        table.add_row(name, value)
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


def simulate(
    model: str = MODEL, gpu: str = GPU, tp: int = TP, workload: str = WORKLOAD,
    trace: Optional[Path] = TRACE,
    rate: Optional[str] = typer.Option(None, help="requests/s, or a comma list to sweep (default 1.0; "
                                                  "a trace file keeps its own times)"),
    requests: Optional[int] = REQUESTS, duration: Optional[float] = DURATION, seed: int = SEED,
    block_size: str = typer.Option("16", help="KV block size in tokens, or a comma list to sweep"),
    allocator: str = typer.Option("paged", help="paged, orca-max, orca-pow2, orca-oracle, or a comma list"),
    preemption: str = PREEMPTION, max_num_seqs: int = MAX_NUM_SEQS,
    max_num_batched_tokens: Optional[int] = MAX_BATCHED, gpu_memory_utilization: float = UTILIZATION,
    prefix_caching: bool = PREFIX, profile: Optional[Path] = PROFILE, out: Optional[Path] = OUT,
    as_json: bool = AS_JSON, chunked_prefill: bool = CHUNKED, num_gpu_blocks: Optional[int] = NUM_GPU_BLOCKS,
    cost_model: Optional[str] = COST_MODEL,
) -> None:
    """Simulate a workload on the paged engine (or sweep rates, block sizes, allocators)."""
    err = Console(stderr=True)
    try:
        rates = _split(rate, float, "rate") if rate is not None else [None]
        sizes = _split(block_size, int, "block-size")
        allocators = _split(allocator, str, "allocator")
        base = RunSpec(model=model, gpu=gpu, tp=tp, workload=str(trace) if trace else workload,
                       requests=requests, duration=duration, seed=seed, preemption=preemption,
                       max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                       gpu_memory_utilization=gpu_memory_utilization, prefix_caching=prefix_caching,
                       profile=str(profile) if profile else None, chunked_prefill=chunked_prefill,
                       num_gpu_blocks=num_gpu_blocks, cost_model_option=cost_model)
        specs = [replace(base, rate=r, block_size=b, allocator=a)
                 for a, b, r in itertools.product(allocators, sizes, rates)]
        out_dir = out or _default_out("sweep" if len(specs) > 1 else "sim", base.workload)
        if len(specs) > 1:
            _sweep(specs, out_dir, as_json, err)
            return
        spec = specs[0]
        spec.check()
        requests_trace = spec.trace()
        with _progress_bar(err, len(requests_trace)) as progress:
            result = spec.run(progress=progress, trace=requests_trace)
        paths = write_run(result, out_dir)
    except (PlannerError, TraceError, ValueError, OSError) as exc:
        raise fail(str(exc) or type(exc).__name__) from None
    if as_json:
        sys.stdout.write(json.dumps(result_document(result)) + "\n")
        err.print(f"run folder: {out_dir}", highlight=False)
        return
    console = _stdout()
    console.print(_plan_table(result.memory_plan, result.metrics))
    console.print(_summary_table(result))
    console.print(f"run folder: {out_dir} ({', '.join(p.name for p in paths.values())})", highlight=False)


def _sweep(specs: list[RunSpec], out_dir: Path, as_json: bool, err: Console) -> None:
    err.print(f"sweeping {len(specs)} runs in parallel processes ...", highlight=False)

    def done(spec: RunSpec, doc: dict) -> None:
        err.print(f"  {spec.allocator}, block {spec.block_size}, rate {spec.rate}: normalized latency "
                  f"{_fmt(doc.get('normalized_latency'), ' s/token', 4)} ({doc['wall_time']:.1f} s wall)",
                  highlight=False)

    docs = run_sweep(specs, on_done=done)
    paths = write_sweep(docs, out_dir)
    if as_json:
        sys.stdout.write(json.dumps(json_safe({"runs": docs})) + "\n")
        err.print(f"sweep folder: {out_dir}", highlight=False)
        return
    table = Table(title=f"sweep: {len(docs)} runs")
    columns = {"allocator": "allocator", "block_size": "block", "rate": "rate", "request_throughput": "req/s",
               "normalized_latency": "s/token", "ttft_p99": "TTFT p99", "tpot_p99": "TPOT p99",
               "mean_batch_size": "batch", "kv_utilization": "KV util", "preemptions_total": "preempt",
               "num_rejected": "rejected", "num_truncated": "truncated"}
    for col, title in columns.items():
        table.add_column(title, justify="left" if col == "allocator" else "right")
    for doc in docs:
        row = comparison_row(doc)
        table.add_row(*[_fmt(row.get(c), "", 3) for c in columns])
    console = _stdout()
    console.print(table)
    console.print(f"sweep folder: {out_dir} ({', '.join(p.name for p in paths.values())})", highlight=False)


def capacity(
    slo: list[str] = typer.Option(..., "--slo", help="normalized latency limit in s/token (e.g. 0.2), or "
                                                     "METRIC=SECONDS (e.g. ttft_p99=2, tpot_p99=0.1); repeatable"),
    model: str = MODEL, gpu: str = GPU, tp: int = TP, workload: str = typer.Option("sharegpt", help=WORKLOAD.help),
    trace: Optional[Path] = TRACE, requests: Optional[int] = REQUESTS, duration: Optional[float] = DURATION,
    seed: int = SEED, block_size: int = typer.Option(16, help="KV block size in tokens"),
    allocator: str = typer.Option("paged", help="paged, orca-max, orca-pow2 or orca-oracle"),
    preemption: str = PREEMPTION, max_num_seqs: int = MAX_NUM_SEQS,
    max_num_batched_tokens: Optional[int] = MAX_BATCHED, gpu_memory_utilization: float = UTILIZATION,
    prefix_caching: bool = PREFIX, profile: Optional[Path] = PROFILE,
    chunked_prefill: bool = CHUNKED, num_gpu_blocks: Optional[int] = NUM_GPU_BLOCKS,
    cost_model: Optional[str] = COST_MODEL,
    start_rate: float = typer.Option(1.0, help="first rate tried (requests/s)"),
    max_rate: float = typer.Option(256.0, help="highest rate tried"),
    tolerance: float = typer.Option(0.02, help="stop when the bracket is this close (relative)"),
    out: Optional[Path] = OUT, as_json: bool = AS_JSON,
) -> None:
    """Highest request rate whose latency stays within the SLOs, found by bisection."""
    err = Console(stderr=True)
    try:
        slos = parse_slos(slo)
        spec = RunSpec(model=model, gpu=gpu, tp=tp, workload=str(trace) if trace else workload,
                       requests=requests, duration=duration, seed=seed, block_size=block_size,
                       allocator=allocator, preemption=preemption, max_num_seqs=max_num_seqs,
                       max_num_batched_tokens=max_num_batched_tokens,
                       gpu_memory_utilization=gpu_memory_utilization, prefix_caching=prefix_caching,
                       profile=str(profile) if profile else None, chunked_prefill=chunked_prefill,
                       num_gpu_blocks=num_gpu_blocks, cost_model_option=cost_model)

        def probed(rate: float, ok: bool, doc: dict) -> None:
            shown = ", ".join(f"{k} {_fmt(doc.get(k), _unit(k), 4)}" for k in slos)
            err.print(f"  {rate:8.3f} req/s: {'meets' if ok else 'misses'} ({shown})", highlight=False)

        err.print(f"searching the capacity of {spec.model} / {spec.tp} x {spec.gpu} on {spec.workload} "
                  f"({', '.join(f'{k} <= {v}' for k, v in slos.items())}) ...", highlight=False)
        found = find_capacity(spec, slos, start=start_rate, max_rate=max_rate, rel_tol=tolerance,
                              min_rate=min(0.01, start_rate), on_probe=probed)
        doc = json_safe({"capacity_rate": found.rate, "bounded": found.bounded, "slos": slos,
                         "probes": [{"rate": r, "meets": ok, **{k: d.get(k) for k in slos},
                                     "num_rejected": d.get("num_rejected"),
                                     "num_truncated": d.get("num_truncated")} for r, ok, d in found.probes],
                         "at_capacity": found.doc})
        out_dir = out or _default_out("capacity", spec.workload)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "capacity.json").write_text(json.dumps(doc, indent=2) + "\n")
    except (PlannerError, TraceError, ValueError, OSError) as exc:
        raise fail(str(exc) or type(exc).__name__) from None
    if as_json:
        sys.stdout.write(json.dumps(doc) + "\n")
        return
    console = _stdout()
    if found.rate is None:
        console.print(f"the SLOs are not met even at {found.probes[-1][0]:.3f} req/s")
    else:
        bound = "" if found.bounded else " (still met at the highest rate tried; raise --max-rate)"
        shown = ", ".join(f"{k} {_fmt(found.doc.get(k), _unit(k), 4)}" for k in slos)
        console.print(f"capacity: {found.rate:.3f} req/s{bound}; {shown}", highlight=False)
    console.print(f"written to {out_dir / 'capacity.json'}", highlight=False)
