"""The `planner` command line: one typer app with a sub-app per concern.

Every command turns bad input (PlannerError, TraceError, ValueError raised on
user input) into one line on stderr and exit code 2, never a traceback.
"""
from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from planner.cli import profile as cli_profile, search as cli_search, serve as cli_serve, simulate as cli_simulate
from planner.cli import explain as cli_explain, validate as cli_validate, workload as cli_workload
from planner.catalog import list_gpus, list_models, model_ids
from planner.cli.from_vllm import translate
from planner.cli.output import fail, one_line
from planner.errors import PlannerError

# Plain click help (rich_markup_mode=None): flags show as `--x / --no-x` with no type column
# (rich's help printed `--prefix-caching <bool>`, which read as if it took a value).
app = typer.Typer(help="Capacity planner for LLM serving on a paged (PagedAttention) engine.",
                  no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  add_completion=False)
app.add_typer(cli_workload.app, name="workload")
app.command("simulate")(cli_simulate.simulate)
app.command("capacity")(cli_simulate.capacity)
app.command("profile")(cli_profile.profile)
app.command("validate")(cli_validate.validate_cmd)
app.command("serve")(cli_serve.serve)
app.command("bench")(cli_serve.bench)
app.command("search")(cli_search.search)
app.command("explain")(cli_explain.explain)

@app.command("from-vllm", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def from_vllm_cmd(
    ctx: typer.Context,
    serve: str = typer.Option(..., "--serve", metavar="'vllm serve MODEL ...'",
                              help="the server's command line, as the operator ran it"),
    bench: Optional[str] = typer.Option(None, "--bench", metavar="'vllm bench serve ...'",
                                        help="the load's command line (vLLM bench's defaults where a flag is not "
                                             "given: the random dataset, 1,000 prompts, every one at once)"),
    measured: Optional[str] = typer.Option(None, "--measured", metavar="RESULT.json",
                                           help="instead of --bench: the result file of vllm bench serve "
                                                "--save-result --save-detailed, validated against the simulation"),
    gpu: str = typer.Option(..., "--gpu", help="the GPU the server runs on (planner list gpus)"),
    capacity: bool = typer.Option(False, "--capacity", help="planner capacity instead: the most load of the bench's "
                                                             "kind (its rate, or its clients with --max-concurrency) "
                                                             "within its --goodput SLOs"),
    run: bool = typer.Option(False, "--run", help="run it too; words after -- go to the command (e.g. -- --json)"),
) -> None:
    """The `planner simulate` line of a `vllm serve` and a `vllm bench serve` command line, or the `planner
    validate` line of a recorded vllm bench run (docs/vllm.md)."""
    try:
        translation = translate(serve, bench, gpu, measured, capacity)
    except PlannerError as exc:
        raise fail(exc) from None
    err = Console(stderr=True)
    if translation.ignored:
        err.print(f"left out (no effect on the numbers): {' '.join(translation.ignored)}", highlight=False)
    for flag in translation.not_modelled:
        err.print(f"warning: not modelled, left out: {flag}", highlight=False)
    if translation.searched:
        err.print(f"searched for instead of taken: {', '.join(translation.searched)}", highlight=False)
    words = [*translation.words, *ctx.args]
    # the command lines are the output; with --run they go to stderr, the run's own output (--json's one
    # document) to stdout
    for first in translation.before:
        typer.echo(shlex.join(["planner", *first]), err=run)
    typer.echo(" ".join([translation.command, *ctx.args]), err=run)
    if run:
        # (not standalone: a bad option after -- is main()'s one line, not click's usage block)
        command = typer.main.get_command(app)
        for args in translation.before:       # an import the run reads: what it says, on stderr too
            with contextlib.redirect_stdout(sys.stderr):
                code = command.main(args=args, prog_name="planner", standalone_mode=False)
            if code:
                raise typer.Exit(code)
        code = command.main(args=[translation.verb, *words], prog_name="planner", standalone_mode=False)
        if code:
            raise typer.Exit(code)


list_app = typer.Typer(help="List the catalogs.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(list_app, name="list")


AS_JSON = typer.Option(False, "--json", help="print the catalog as one JSON document")


def _emit(rows: list[dict]) -> None:
    sys.stdout.write(json.dumps(rows) + "\n")


@list_app.command("gpus")
def list_gpus_cmd(as_json: bool = AS_JSON) -> None:
    """Hardware catalog (sources: --json)."""
    gpus = list_gpus()
    if as_json:
        _emit([{"name": g.name, "aliases": list(g.aliases), "family": g.family, "memory_gib": g.memory_bytes / 2**30,
                "memory_bandwidth_tb_s": g.memory_bandwidth / 1e12, "fp16_tflops": g.fp16_flops / 1e12,
                "interconnect_gb_s": g.interconnect_bandwidth / 1e9, "node_gpus": g.node_gpus,
                "measured_system": g.measured_system, "source": g.source} for g in gpus])
        return
    # Five short columns fit 80; the long datasheet sources go below, one per line.
    table = Table(title="GPUs (per device)")
    for col in ("name", "GiB", "TB/s", "fp16 TFLOP/s", "link GB/s", "node", "measured"):
        table.add_column(col, justify="left" if col == "name" else "right", no_wrap=True)
    for g in gpus:
        table.add_row(g.name, f"{g.memory_bytes / 2**30:.1f}", f"{g.memory_bandwidth / 1e12:.2f}",
                      f"{g.fp16_flops / 1e12:.{0 if g.fp16_flops >= 1e13 else 1}f}",
                      f"{g.interconnect_bandwidth / 1e9:.0f}", str(g.node_gpus) if g.kind == "gpu" else "-",
                      "yes" if g.measured_system else "-")
    console = Console()
    console.print(table)
    console.print("node: GPUs joined without NICs (a server's 8, an NVL72 rack's 72); measured: NVIDIA's vLLM op "
                  "tables cover it (else the roofline prices it); GiB as torch reports it", highlight=False)
    console.print("sources (in full: planner list gpus --json):", highlight=False)
    for g in gpus:
        console.print(f"  {g.name}: {g.source.split(':')[0].split(';')[0]}", highlight=False, markup=False)


@list_app.command("models")
def list_models_cmd(as_json: bool = AS_JSON) -> None:
    """Model catalog (true architectures)."""
    models = list_models()
    if as_json:
        _emit([{"name": m.name, "ids": model_ids(m), "model_type": m.model_type, "num_layers": m.num_layers,
                "hidden_size": m.hidden_size, "num_heads": m.num_heads, "num_kv_heads": m.num_kv_heads,
                "num_params": m.num_params, "active_params": m.active_params,
                **({"num_experts": m.num_experts, "num_experts_per_tok": m.num_experts_per_tok,
                    "shared_experts": m.shared_experts} if m.is_moe else {}),
                **({"kv_lora_rank": m.kv_lora_rank, "qk_rope_head_dim": m.qk_rope_head_dim} if m.is_mla else {}),
                "max_position_embeddings": m.max_position_embeddings,
                "kv_bytes_per_token_fp16": m.kv_bytes_per_token(2)} for m in models])
        return
    table = Table(title="Models")
    for col in ("name", "type", "layers", "hidden", "heads/kv", "experts", "params B", "active B", "KV KB/tok"):
        table.add_column(col, justify="left" if col in ("name", "type") else "right", no_wrap=True)
    for m in models:
        table.add_row(m.name, m.model_type, str(m.num_layers), str(m.hidden_size),
                      f"{m.num_heads}/{'MLA' if m.is_mla else m.num_kv_heads}",     # MLA caches one latent
                      f"{m.num_experts_per_tok}/{m.num_experts}" if m.is_moe else "-", f"{m.num_params / 1e9:.2f}",
                      f"{m.active_params / 1e9:.2f}",
                      f"{m.kv_bytes_per_token(2) / 1024:.0f}")
    console = Console()
    console.print(table)
    console.print("experts: top-k / routed experts per MoE layer; active: the parameters one token uses (its "
                  "top-k experts, the embedding included)", highlight=False)
    console.print("--model also finds each by these (and a fine-tuned or quantized variant's id, -Instruct, "
                  "-FP8, ...; or a model folder or its config.json):", highlight=False)
    for m in models:
        if model_ids(m)[1:]:
            console.print(f"  {m.name}: {', '.join(model_ids(m)[1:])}", highlight=False, markup=False)


@list_app.command("workloads")
def list_workloads_cmd(as_json: bool = AS_JSON) -> None:
    """Built-in workloads."""
    cli_workload.list_workloads(as_json)


def _boolean_flag_error(argv: list[str]) -> str | None:
    """`--enable-prefix-caching true`: flags take no value; say how to write it instead."""
    words = {"true", "false", "yes", "no", "on", "off", "1", "0"}
    for flag, value in zip(argv, argv[1:]):
        name = flag.split("=")[0]
        if name in BOOLEAN_FLAGS and ("=" in flag or value.lower() in words):
            canonical = BOOLEAN_FLAGS[name]
            return (f"{name} is a flag and takes no value: write {canonical} to turn it on, "
                    f"--no-{canonical[2:]} to turn it off")
    return None


# Boolean flags of the commands, by every name they answer to: the canonical --x (its --no-x turns it off).
BOOLEAN_FLAGS = {name: canonical for canonical, aliases in {
    "--enable-prefix-caching": ("--enable-prefix-caching", "--prefix-caching", "--no-enable-prefix-caching",
                                "--no-prefix-caching"),
    "--enable-chunked-prefill": ("--enable-chunked-prefill", "--chunked-prefill", "--no-enable-chunked-prefill",
                                 "--no-chunked-prefill"),
} .items() for name in aliases}


def main() -> None:
    problem = _boolean_flag_error(sys.argv[1:])
    if problem:
        typer.echo(f"error: {problem}", err=True)
        sys.exit(2)
    try:
        code = app(standalone_mode=False)
    except typer.TyperException as exc:   # a bad option or value: said in one line, not click's usage block
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        if type(exc).__name__ == "NoArgsIsHelpError":     # `planner` (or a group) alone: its help, as asked
            typer.echo(message)
            sys.exit(0)
        typer.echo(f"error: {' '.join(message.split())}", err=True)
        sys.exit(getattr(exc, "exit_code", 2))
    except typer.Abort:                 # ^C, or end of input at a prompt
        typer.echo("error: aborted", err=True)
        sys.exit(1)
    except (PlannerError, ValueError) as exc:
        typer.echo(f"error: {one_line(exc)}", err=True)
        sys.exit(2)
    except MemoryError:   # whatever the size that slipped past the checks: one line, not a traceback
        typer.echo("error: this run needs more memory than the machine has; ask for a smaller one", err=True)
        sys.exit(1)
    except OverflowError as exc:   # a number too large for the arithmetic that slipped past the checks
        typer.echo(f"error: a value is too large to compute with ({exc}); ask for a smaller one", err=True)
        sys.exit(2)
    except OSError as exc:         # a path that cannot be read or written, said in one line
        where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        typer.echo(f"error: {where}{exc.strerror or exc}", err=True)
        sys.exit(1)
    except Exception as exc:       # a failure no check foresaw: one line that names it, the traceback on request
        if os.environ.get("PLANNER_TRACEBACK"):
            raise
        typer.echo(f"error: {type(exc).__name__}: {' '.join(str(exc).split())} (unexpected; PLANNER_TRACEBACK=1 "
                   f"shows where)", err=True)
        sys.exit(1)
    # a command's own exit status (typer.Exit), or 0 when it returned
    sys.exit(code if isinstance(code, int) and not isinstance(code, bool) else 0)
