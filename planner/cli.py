"""The `planner` command line: one typer app with a sub-app per concern.

Every command turns bad input (PlannerError, TraceError, ValueError raised on
user input) into one line on stderr and exit code 2, never a traceback.
"""
from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.table import Table

from planner import cli_profile, cli_serve, cli_simulate, cli_validate, cli_workload
from planner.catalog import list_gpus, list_models
from planner.errors import PlannerError

app = typer.Typer(help="Capacity planner for LLM serving on a paged (PagedAttention) engine.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
app.add_typer(cli_workload.app, name="workload")
app.command("simulate")(cli_simulate.simulate)
app.command("capacity")(cli_simulate.capacity)
app.command("profile")(cli_profile.profile)
app.command("validate")(cli_validate.validate_cmd)
app.command("serve")(cli_serve.serve)
app.command("bench")(cli_serve.bench)

list_app = typer.Typer(help="List the catalogs.", no_args_is_help=True)
app.add_typer(list_app, name="list")


@list_app.command("gpus")
def list_gpus_cmd() -> None:
    """Hardware catalog."""
    table = Table(title="GPUs")
    for col in ("name", "memory GiB (torch)", "bandwidth TB/s", "fp16 TFLOP/s", "interconnect GB/s",
                "measured vLLM data", "source"):
        table.add_column(col)
    for g in list_gpus():
        table.add_row(g.name, f"{g.memory_bytes / 2**30:.2f}", f"{g.memory_bandwidth / 1e12:.2f}",
                      f"{g.fp16_flops / 1e12:.0f}", f"{g.interconnect_bandwidth / 1e9:.0f}",
                      g.measured_system or "- (roofline)", g.source)
    Console().print(table)


@list_app.command("models")
def list_models_cmd() -> None:
    """Model catalog (true architectures)."""
    table = Table(title="Models")
    for col in ("name", "type", "layers", "hidden", "heads/kv", "params (B)", "KV KB/token (fp16)"):
        table.add_column(col)
    for m in list_models():
        table.add_row(m.name, m.model_type, str(m.num_layers), str(m.hidden_size),
                      f"{m.num_heads}/{m.num_kv_heads}", f"{m.num_params / 1e9:.2f}",
                      f"{m.kv_bytes_per_token(2) / 1024:.0f}")
    Console().print(table)


@list_app.command("workloads")
def list_workloads_cmd() -> None:
    """Built-in workloads."""
    cli_workload.list_workloads()


def main() -> None:
    try:
        app()
    except (PlannerError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
