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

from planner import api
from planner.cli import options as opt
from planner.cli.options import DeploymentChoices, deployment_options
from planner.cli.output import default_out, fail
from planner.cli.simulate import load_of
from planner.errors import PlannerError
from planner.runs.pools import EXECUTORS
from planner.runs.spec import RunSpec
from planner.sizing.prices import parse_price_overrides
from planner.sizing.search import plot_pareto
from workloads import TraceError


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


# The grid's axes and their defaults; every other deployment setting takes one value.
AXES = {"gpu": ("a100-80g", "h100-sxm"), "tp": (1, 2, 4), "block_size": (16,), "max_num_seqs": (256,)}


@deployment_options
def search(
    deployments: DeploymentChoices,
    slo: list[str] = typer.Option(..., "--slo", help="SLOs, METRIC=SECONDS, comma-separated or repeated "
                                                     "(e.g. ttft_p99=2,tpot_p99=0.1); a bare number is "
                                                     "normalized latency in s/token"),
    workload: str = opt.WORKLOAD, trace: Optional[Path] = opt.TRACE, param: Optional[list[str]] = opt.PARAM,
    rate: str = typer.Option("max", "--rate", help="target requests/s, or 'max' for the most capacity per dollar"),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", metavar="N",
                                              help="target N concurrent clients (a closed loop) instead of a "
                                                   "request rate: each configuration's capacity is the most "
                                                   "clients it serves within the SLOs"),
    duration: Optional[float] = typer.Option(600.0, help="seconds of arrivals in each simulated probe"),
    requests: Optional[int] = typer.Option(None, "--requests", "-n", help="requests per probe instead of "
                                                                           "--duration"),
    seed: int = opt.SEED, profile: Optional[Path] = opt.PROFILE, cost_model: Optional[str] = opt.COST_MODEL,
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
    out: Optional[Path] = opt.OUT, as_json: bool = opt.AS_JSON,
) -> None:
    """Cheapest configuration (--gpu x --tp x --block-size x --max-num-seqs, comma lists) that serves --rate
    within the SLOs; every other deployment setting applies to all of them."""
    err = Console(stderr=True)
    try:
        if trace is not None and not trace.is_file():
            raise PlannerError(f"--trace {trace}: no such file")
        axes = {name: deployments.values(name) or default for name, default in AXES.items()}
        base = deployments.without(*AXES).one("search", model="opt-13b")
        load = load_of(workload, trace, param, requests, None if requests is not None else duration, seed)
        spec = RunSpec(deployment=base, load=load, cost_model=cost_model, profile=str(profile) if profile else None)
        folder = out or default_out("search", load.workload)
        total = len(axes["gpu"]) * len(axes["tp"]) * len(axes["block_size"]) * len(axes["max_num_seqs"])
        err.print(f"searching {total} configurations of {base.model} on {load.workload} ({executor} executor); "
                  f"each configuration's row goes to {folder}/configs.csv as it finishes", highlight=False)
        progress = SearchProgress(err, folder, "clients" if concurrency is not None else "req/s")
        result = api.search(spec, slos=",".join(slo), gpus=axes["gpu"], tps=axes["tp"],
                            block_sizes=axes["block_size"], max_num_seqs=axes["max_num_seqs"],
                            rate=None if concurrency is not None else _rate(rate), clients=concurrency,
                            tolerance=tolerance, max_rate=max_rate, plain=plain, executor=executor,
                            workers=workers, ray_address=ray_address, prices=parse_price_overrides(price),
                            on_done=progress)
    except (PlannerError, TraceError, ValueError) as exc:
        raise fail(str(exc)) from None
    _write(result, folder, err)
    if as_json:
        typer.echo(json.dumps(result.document()))
        return
    _print_summary(result)


class SearchProgress:
    """Each configuration as it finishes: a line with the count done and an ETA on stderr, and its row
    appended to configs.partial.csv, so an interrupted search keeps what it found."""

    def __init__(self, err: Console, folder: Path, unit: str = "req/s") -> None:
        self.err, self.folder, self.unit, self.started = err, folder, unit, time.perf_counter()
        folder.mkdir(parents=True, exist_ok=True)
        self.partial = folder / "configs.partial.csv"
        self.partial.write_text(",".join(PARTIAL_COLUMNS) + "\n")

    def __call__(self, row: dict, done: int, total: int) -> None:
        elapsed = time.perf_counter() - self.started
        eta = elapsed / done * (total - done)
        what = f"{row['capacity']:.3g} {self.unit}" if row["capacity"] is not None else row["note"]
        self.err.print(f"  [{done}/{total}, {elapsed:.0f} s, ETA {eta:.0f} s] {row['gpu']} x{row['tp']}, block "
                       f"{row['block_size']}, max seqs {row['max_num_seqs']}: {what}", highlight=False)
        with self.partial.open("a") as f:
            f.write(",".join("" if row.get(k) is None else str(row[k]).replace(",", ";") for k in PARTIAL_COLUMNS)
                    + "\n")


PARTIAL_COLUMNS = ("gpu", "tp", "block_size", "max_num_seqs", "capacity", "first_miss", "bounded", "probes", "note")


def _write(result, folder: Path, err: Console) -> None:
    for gpu, cost in result.prices.items():
        if not cost.verified:
            err.print(f"note: the price of {gpu} (${cost.usd_per_gpu_hour:g}/GPU-hour) is unverified: no public "
                      f"source was found for it; give your own with --price {gpu}=DOLLARS_PER_GPU_HOUR",
                      highlight=False)
    (folder / "configs.csv").write_text(result.csv_text())
    (folder / "search.json").write_text(json.dumps(result.document(), indent=2))
    (folder / "configs.partial.csv").unlink(missing_ok=True)
    plot_pareto(result, folder / "pareto.png")
    err.print(f"wrote {folder}/configs.csv, pareto.png, search.json ({result.wall_time:.1f} s)", highlight=False)


def _print_summary(result) -> None:
    console = Console() if Console().is_terminal else Console(width=160)
    unit = "clients" if result.grid.clients else "req/s"
    table = Table(title="configurations (Pareto front first, then by cost)")
    for col in ("gpu", "tp", "block", "max seqs", f"capacity {unit}", "$/hour", f"{unit} per $/h", "note"):
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
        console.print(f"No configuration reaches {target:g} {unit} within the SLOs." if target is not None
                      else "No configuration meets the SLOs at any load tried.")
        return
    why = f"cheapest reaching {target:g} {unit}" if target is not None else "most capacity per dollar"
    console.print(f"Best ({why}): {b['gpu']} x{b['tp']}, block size {b['block_size']}, max_num_seqs "
                  f"{b['max_num_seqs']}: {b['capacity']:.3g} {unit} at ${b['cost_per_hour']:.2f}/hour.",
                  highlight=False)
