"""`planner search`: which GPU, TP, block size and batch limit serve this traffic within the SLOs, cheapest.

Every configuration of the grid gets the capacity search of `planner capacity`
and a price; the result is the cheapest configuration that reaches --rate (or,
with --rate max, the most capacity per dollar), a CSV table of all of them, a
Pareto plot of cost against capacity, and with --json one document on stdout.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from planner.cli.output import fail
from planner.cli.simulate import _split
from planner.errors import PlannerError
from planner.sizing import EXECUTORS, SearchGrid, make_executor, parse_price_overrides, run_search
from planner.sizing.search import plot_pareto
from planner.runs.slos import parse_slos
from workloads import TraceError

REPORTS_DIR = Path("reports")


def _values(text: str, kind, flag: str) -> tuple:
    """A comma list, each value once, in the given order."""
    return tuple(dict.fromkeys(_split(text, kind, flag.removeprefix("--"))))


def _rate(text: str) -> float | None:
    if text.strip().lower() == "max":
        return None
    try:
        rate = float(text)
    except ValueError:
        raise PlannerError(f"--rate: {text!r} is neither a number of requests/s nor 'max'") from None
    if not rate > 0:
        raise PlannerError(f"--rate must be > 0 requests/s, got {text}")
    return rate


def search(
    slo: list[str] = typer.Option(..., "--slo", help="SLOs, METRIC=SECONDS, comma-separated or repeated "
                                                     "(e.g. ttft_p99=2,tpot_p99=0.1); a bare number is "
                                                     "normalized latency in s/token"),
    model: str = typer.Option("opt-13b", help="model from the catalog (planner list models)"),
    workload: str = typer.Option("sharegpt", help="built-in workload (planner workload list)"),
    trace: Optional[Path] = typer.Option(None, "--trace", help="a .jsonl/.csv trace file instead of --workload"),
    gpus: str = typer.Option("a100-80g,h100-sxm", "--gpus", help="GPUs to try, comma-separated"),
    tp: str = typer.Option("1,2,4", "--tp", help="tensor parallel sizes to try"),
    block_size: str = typer.Option("16", "--block-size", help="KV block sizes to try"),
    max_num_seqs: str = typer.Option("256", "--max-num-seqs", help="batch limits (sequences per step) to try"),
    rate: str = typer.Option("max", "--rate", help="target requests/s, or 'max' for the most capacity per dollar"),
    duration: Optional[float] = typer.Option(600.0, help="seconds of arrivals in each simulated probe"),
    requests: Optional[int] = typer.Option(None, "--requests", "-n", help="requests per probe instead of "
                                                                           "--duration"),
    seed: int = typer.Option(0, help="random seed (trace and sampled tokens)"),
    preemption_mode: str = typer.Option("recompute", "--preemption-mode", help="recompute or swap"),
    enable_prefix_caching: bool = typer.Option(False, "--enable-prefix-caching/--no-enable-prefix-caching",
                                               help="automatic prefix caching"),
    price: list[str] = typer.Option([], "--price", help="GPU=DOLLARS per GPU-hour, overriding "
                                                       "planner/data/prices.json; repeatable"),
    tolerance: float = typer.Option(0.05, help="stop each capacity search when its bracket is this close"),
    max_rate: float = typer.Option(256.0, help="highest rate tried"),
    plain: bool = typer.Option(False, "--plain", help="search every configuration from scratch with full "
                                                      "simulations (no hints, early stops or shared runs): "
                                                      "slower, the reference the default search is tested against"),
    executor: str = typer.Option("local", "--executor", help=f"where simulations run: {' or '.join(EXECUTORS)}"),
    workers: Optional[int] = typer.Option(None, "--workers", help="processes (local) or CPUs of a new local "
                                                                   "Ray (default: all cores)"),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="join this Ray cluster ('auto': the "
                                                                          "one running here)"),
    out: Optional[Path] = typer.Option(None, "--out", help="output folder (default reports/search-<time>-<workload>)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON document on stdout; progress on stderr"),
) -> None:
    """Cheapest configuration (GPU, TP, block size, max_num_seqs) that serves --rate within the SLOs."""
    err = Console(stderr=True)
    try:
        slos = parse_slos([s for text in slo for s in text.split(",") if s.strip()])
        source = str(trace) if trace else workload
        if trace is not None and not trace.is_file():
            raise PlannerError(f"--trace {trace}: no such file")
        grid = SearchGrid(model=model, workload=source, slos=slos, gpus=_values(gpus, str, "--gpus"),
                          tps=_values(tp, int, "--tp"), block_sizes=_values(block_size, int, "--block-size"),
                          max_num_seqs=_values(max_num_seqs, int, "--max-num-seqs"), target_rate=_rate(rate),
                          duration=None if requests is not None else duration, requests=requests, seed=seed,
                          preemption_mode=preemption_mode, enable_prefix_caching=enable_prefix_caching,
                          tolerance=tolerance, max_rate=max_rate, plain=plain)
        overrides = parse_price_overrides(price)
        runner = make_executor(executor, workers=workers, ray_address=ray_address)
        err.print(f"searching {len(grid.configs())} configurations of {model} on {source} "
                  f"({runner.name} executor)", highlight=False)

        def done(row: dict, n: int, total: int) -> None:
            what = (f"{row['capacity']:.3g} req/s" if row["capacity"] is not None else row["note"])
            err.print(f"  [{n}/{total}] {row['gpu']} x{row['tp']}, block {row['block_size']}, max seqs "
                      f"{row['max_num_seqs']}: {what}", highlight=False)

        try:
            result = run_search(grid, runner, prices=overrides, on_done=done)
        finally:
            close = getattr(runner, "close", None)
            if close is not None:
                close()
    except (PlannerError, TraceError, ValueError) as exc:
        raise fail(str(exc)) from None

    for gpu, cost in result.prices.items():
        if not cost.verified:
            err.print(f"note: the price of {gpu} (${cost.usd_per_gpu_hour:g}/GPU-hour) is unverified: no public "
                      f"source was found for it; give your own with --price {gpu}=DOLLARS_PER_GPU_HOUR",
                      highlight=False)
    folder = out or REPORTS_DIR / f"search-{time.strftime('%Y%m%d-%H%M%S')}-{Path(source).stem}"
    folder.mkdir(parents=True, exist_ok=True)
    document = result.document()
    (folder / "configs.csv").write_text(result.csv_text())
    (folder / "search.json").write_text(json.dumps(document, indent=2))
    plot_pareto(result, folder / "pareto.png")
    err.print(f"wrote {folder}/configs.csv, pareto.png, search.json ({result.wall_time:.1f} s)", highlight=False)
    if as_json:
        typer.echo(json.dumps(document))
        return
    _print_summary(result)


def _print_summary(result) -> None:
    console = Console() if Console().is_terminal else Console(width=160)
    table = Table(title="configurations (Pareto front first, then by cost)")
    for col in ("gpu", "tp", "block", "max seqs", "capacity req/s", "$/hour", "req/s per $/h", "note"):
        table.add_column(col)
    rows = sorted(result.configs, key=lambda r: (not r["pareto"], r["capacity"] is None, r["cost_per_hour"],
                                                 -(r["capacity"] or 0)))
    for r in rows:
        table.add_row(r["gpu"], str(r["tp"]), str(r["block_size"]), str(r["max_num_seqs"]),
                      "-" if r["capacity"] is None else f"{r['capacity']:.3g}", f"{r['cost_per_hour']:.2f}",
                      "-" if r["capacity_per_dollar"] is None else f"{r['capacity_per_dollar']:.3g}",
                      ("Pareto " if r["pareto"] else "") + r["note"])
    console.print(table)
    target = result.grid.target_rate
    b = result.best
    if b is None:
        console.print(f"No configuration reaches {target:g} req/s within the SLOs." if target is not None
                      else "No configuration meets the SLOs at any rate tried.")
        return
    why = f"cheapest reaching {target:g} req/s" if target is not None else "most capacity per dollar"
    console.print(f"Best ({why}): {b['gpu']} x{b['tp']}, block size {b['block_size']}, max_num_seqs "
                  f"{b['max_num_seqs']}: {b['capacity']:.3g} req/s at ${b['cost_per_hour']:.2f}/hour.",
                  highlight=False)
