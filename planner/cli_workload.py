"""`planner workload ...`: list the built-in workloads, show a trace's statistics."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Optional

import typer
from planner.cli_common import fail
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from workloads import WORKLOADS, Trace, TraceError, make_trace, workload_params
from workloads.make import is_trace_file

app = typer.Typer(help="Workloads: built-in request traces and trace files.", no_args_is_help=True)

DEFAULT_REQUESTS = 1000


def _parse_params(name: str, pairs: list[str]) -> dict:
    """KEY=VALUE strings -> typed workload parameters (typed like their defaults)."""
    if not pairs:
        return {}
    if is_trace_file(name):
        raise TraceError("--param: a trace file takes no workload parameters")
    if name not in WORKLOADS:
        raise TraceError(f"workload: unknown name {name!r}; built-in: {', '.join(WORKLOADS)}")
    defaults = workload_params(name)
    out = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or key not in defaults:
            raise TraceError(f"--param {pair!r}: expected KEY=VALUE with KEY one of {', '.join(defaults) or 'none'}")
        kind = type(defaults[key]) if defaults[key] is not None else int
        try:
            out[key] = kind(text)
        except ValueError:
            raise TraceError(f"--param {key}: expected {kind.__name__}, got {text!r}") from None
    return out


def _json_safe(stats: dict) -> dict:
    # JSON has no infinity: an all-at-once trace reports arrival_rate null
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in stats.items()}


def _table(stats: dict) -> Table:
    table = Table(title=f"workload {stats['name']}")
    table.add_column("statistic")
    table.add_column("value", justify="right")
    for key, value in stats.items():
        if key == "name":
            continue
        text = f"{value:,.3f}" if isinstance(value, float) and math.isfinite(value) else str(value)
        table.add_row(key, text)
    return table


def save_histogram(trace: Trace, path: Path) -> Path:
    """PNG with the prompt- and output-length histograms side by side."""
    import matplotlib

    matplotlib.use("Agg")  # no display: this runs on servers and in CI
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in ((axes[0], "prompt_len", "prompt"), (axes[1], "output_len", "output")):
        values = [getattr(r, key) for r in trace.requests]
        ax.hist(values, bins=50, color="tab:blue" if key == "prompt_len" else "tab:orange")
        ax.set_xlabel(f"{label} length (tokens)")
        ax.set_ylabel("requests")
        if values:
            ax.axvline(sum(values) / len(values), color="black", linestyle="--", label="mean")
            ax.legend()
    fig.suptitle(f"{trace.name}: {len(trace)} requests")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


@app.command("list")
def list_workloads(as_json: bool = typer.Option(False, "--json", help="print one JSON document")) -> None:
    """The built-in workloads and their parameters."""
    if as_json:
        rows = [{"name": name, "description": desc, "params": workload_params(name)} for name, desc in WORKLOADS.items()]
        sys.stdout.write(json.dumps(rows) + "\n")
        return
    table = Table(title="built-in workloads (use with --workload NAME)")
    table.add_column("name")
    table.add_column("description")
    table.add_column("parameters (defaults)")
    for name, desc in WORKLOADS.items():
        params = ", ".join(f"{k}={v}" for k, v in workload_params(name).items())
        table.add_row(name, escape(desc), escape(params or "-"))
    Console().print(table)


@app.command("show")
def show(
    name: str = typer.Argument(..., help="a built-in workload name, or a .jsonl/.csv trace file"),
    rate: float = typer.Option(math.inf, help="requests/s (inf: all at t=0; a trace file keeps its times unless set)"),
    requests: Optional[int] = typer.Option(None, "--requests", "-n", help=f"request count (default {DEFAULT_REQUESTS} without --duration)"),
    duration: Optional[float] = typer.Option(None, help="seconds of arrivals"),
    seed: int = typer.Option(0, help="random seed"),
    arrival: str = typer.Option("poisson", help="poisson, gamma or constant (trace: a file's own times)"),
    cv: float = typer.Option(1.0, help="coefficient of variation of gamma inter-arrival gaps"),
    param: list[str] = typer.Option([], "--param", "-p", help="workload parameter KEY=VALUE (repeatable)"),
    save: Optional[Path] = typer.Option(None, help="write the trace (.jsonl or .csv)"),
    hist: Optional[Path] = typer.Option(None, help="write a PNG histogram of the lengths"),
    as_json: bool = typer.Option(False, "--json", help="print statistics as JSON"),
) -> None:
    """Build (or load) a trace and print its statistics."""
    if requests is None and duration is None and not is_trace_file(name):
        requests = DEFAULT_REQUESTS
    try:
        params = _parse_params(name, param)
        trace = make_trace(
            name, num_requests=requests, duration=duration, rate=rate,
            arrival=arrival, cv=cv, seed=seed, **params,
        )
        if save is not None:
            trace.save(save)
        if hist is not None:
            save_histogram(trace, hist)
    except (TraceError, ValueError, OSError) as err:
        raise fail(str(err) or type(err).__name__) from None
    stats = trace.stats()
    if as_json:
        sys.stdout.write(json.dumps(_json_safe(stats), indent=2) + "\n")
        return
    console = Console()
    console.print(_table(stats))
    for label, path in (("trace", save), ("histogram", hist)):
        if path is not None:
            console.print(f"{label} written to {path}")


if __name__ == "__main__":
    app()
