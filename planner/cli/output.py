"""What the commands print: one-line errors, tables, the verdict block, output folders.

Every command turns bad input into one line on stderr (`error: ...`) and exit
code 2, never a traceback; tables go to stdout, progress to stderr.
"""
from __future__ import annotations

import atexit
import itertools
import tempfile
import time
from pathlib import Path

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from planner.deploy.parallel import layout_suffix
from planner.errors import PlannerError

REPORTS_DIR = Path("reports")


def fail(message: str | Exception) -> typer.Exit:
    """Print ``error: message`` (one line, `one_line`) on stderr; the caller raises the returned Exit."""
    typer.echo(f"error: {one_line(message)}", err=True)
    return typer.Exit(2)


def one_line(message: str | Exception) -> str:
    """A message's first line. An exception is said by its message; a file system error as "PATH: what went
    wrong", without its errno; a pydantic validation error by its first error's field and words."""
    if isinstance(message, OSError) and message.strerror:
        message = message.strerror if message.filename is None else f"{message.filename}: {message.strerror}"
    elif isinstance(message, ValidationError) and message.errors():
        first = message.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ()))
        message = f"{message.title}: {where + ': ' if where else ''}{first.get('msg', 'invalid value')}"
    elif isinstance(message, Exception):
        message = str(message) or type(message).__name__
    return message.splitlines()[0] if message else "invalid input"


def check_writable(path: Path, flag: str = "--out", folder: bool = False) -> None:
    """Refuse, before any work, a file `path` (or with `folder`, a run folder) that could not be written
    when the work is done, leaving nothing behind: the nearest folder that exists on its way must take a
    file (what is missing below it is made later)."""
    if path.is_dir() and not folder:
        raise PlannerError(f"{flag} {path}: a folder, not a file")
    if folder and path == Path("."):                # also what an empty value ('') becomes
        raise PlannerError(f"{flag} {str(path)!r}: give a folder for the run's files, not the current one")
    existing = path if folder else path.parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise PlannerError(f"{flag} {path}: {existing} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=existing):     # (permission bits alone do not say, e.g. for root)
            pass
    except OSError as exc:
        raise PlannerError(f"{flag} {path}: cannot write in {existing}: {exc.strerror}") from None


def stdout() -> Console:
    # Piped output has no terminal width to fit; do not squeeze the tables into 80 columns.
    console = Console()
    return console if console.is_terminal else Console(width=160)


def split_values(text: str, kind, name: str) -> list:
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


def default_out(command: str, source: str) -> Path:
    return new_folder(REPORTS_DIR / f"{command}-{time.strftime('%Y%m%d-%H%M%S')}-{Path(source).stem}")


def new_folder(path: Path) -> Path:
    """`path`, or `path`-2, -3, ...: a folder made now, so that two runs started in the same second do not
    write their files into one."""
    for suffix in itertools.count(1):
        folder = path if suffix == 1 else path.with_name(f"{path.name}-{suffix}")
        try:
            folder.mkdir(parents=True)
            atexit.register(_remove_if_empty, folder)      # (a run refused after this leaves no empty folder)
            return folder
        except FileExistsError:
            continue
        except OSError as exc:
            raise PlannerError(f"{folder}: cannot make the run's folder ({exc.strerror or exc})") from None


def run_folder(out: Path | None, command: str, source: str) -> Path:
    """The folder a run's files go to: `--out`, checked before any work (a file, an unwritable place and the
    current folder, which `--out ""` names too, are refused in one line), or a new one under reports/."""
    if out is None:
        return default_out(command, source)
    check_writable(out, folder=True)
    return out


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()           # (only an empty one goes)
    except OSError:
        pass


def plan_table(plan: dict | None, metrics: dict) -> Table:
    """The memory plan: where each GPU's memory goes, and the totals over all tp (x pp) GPUs (one dp rank's:
    each rank holds the same, its own KV blocks)."""
    tp = plan["tp"] if plan else 1
    gpus = tp * plan.get("pp", 1) if plan else 1          # pipeline stages hold their layers' share each
    dp = plan.get("dp", 1) if plan else 1
    title = f" ({plan['model']} on {tp} x {plan['gpu']}{layout_suffix(plan.get('pp'), dp)})" if plan else ""
    table = Table(title="memory plan" + title)
    table.add_column("item")
    table.add_column("per GPU", justify="right")
    if gpus > 1:
        each = "each dp rank's" if dp > 1 else "all"
        table.add_column(f"{each} {gpus} GPUs", justify="right")
    if plan is None:
        table.add_row("KV blocks (given)", f"{metrics['num_gpu_blocks']:,}")
        return table

    def row(name: str, per_gpu: str, total: str = "") -> None:
        table.add_row(name, per_gpu, *([total] if gpus > 1 else []))

    gib = "{:.2f} GiB".format
    row("usable", f"{gib(plan['usable_gib_per_gpu'])} ({plan['gpu_memory_utilization']:.0%})",
        gib(plan["usable_gib_per_gpu"] * gpus))
    row("weights", gib(plan["weights_gib_per_gpu"]), gib(plan["weights_gib_per_gpu"] * gpus))
    row("activations", gib(plan["activations_gib_per_gpu"]), gib(plan["activations_gib_per_gpu"] * gpus))
    if "non_torch_gib_per_gpu" in plan:
        row("non-torch (CUDA, cuBLAS, NCCL)", gib(plan["non_torch_gib_per_gpu"]),
            gib(plan["non_torch_gib_per_gpu"] * gpus))
    row("KV cache", gib(plan["kv_gib_per_gpu"]), gib(plan["kv_gib_total"]))
    given = plan.get("num_gpu_blocks_given")
    if given is not None:
        row("KV blocks x block size", f"{given:,} x {plan['block_size']} (given; memory holds "
            f"{plan['num_gpu_blocks']:,})", "same blocks")
    else:
        row("KV blocks x block size", f"{plan['num_gpu_blocks']:,} x {plan['block_size']}", "same blocks")
    share = plan.get("kv_head_share", tp)
    row("KV token slots", f"{plan['kv_token_slots']:,}" + (f" (1/{share} of heads)" if share > 1 else ""),
        f"{plan['kv_token_slots']:,}")
    row("CPU swap blocks", f"{plan['num_cpu_blocks']:,}", f"{plan['num_cpu_blocks']:,}")
    return table


def unit(metric: str) -> str:
    return " s/token" if metric == "normalized_latency" else " s"


def fmt(value, unit: str = "", digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}{unit}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}{unit}"
    return f"{value}{unit}"


def _policy_text(params: dict, deployment: dict) -> str:
    """The policy and the batch limits it ran with (resolved for the GPU where the user left them), and
    whether it scheduled ahead (vLLM's default on a GPU: it moves TPOT by the host's share of a step)."""
    caching = ", prefix caching" if params.get("enable_prefix_caching") else ""
    ahead = ", async scheduling" if deployment.get("async_scheduling") else ""
    whole = ", no chunked prefill" if params.get("policy") == "vllm-v1" and not params.get("enable_chunked_prefill") \
        else ""
    return (f"policy {params.get('policy')}: {params.get('max_num_batched_tokens')} tokens / "
            f"{params.get('max_num_seqs')} seqs per step{whole}{caching}{ahead}")


def summary_table(doc: dict, wall_time: float) -> Table:
    m, p = doc, doc["params"]
    st = doc.get("steady_state") or {}
    v = doc.get("verdict") or {}
    policy = _policy_text(p, doc.get("deployment") or {})
    table = Table(title=f"simulated {p['num_requests']} requests of {p['trace']} on {p['model']} / "
                        f"{p['tp']} x {p['gpu']}{layout_suffix(p.get('pp'), p.get('dp'))} ({policy}, {p['allocator']}, "
                        f"block {p['block_size']}, {m['cost_model']})")
    table.add_column("metric")
    table.add_column("whole run", justify="right")
    table.add_column("steady state", justify="right")

    def both(key: str, unit: str = "", digits: int = 3) -> tuple[str, str]:
        return fmt(m.get(key), unit, digits), fmt(st.get(key), unit, digits)

    rows = [
        ("requested rate", fmt(v.get("requested_rate"), " req/s"), ""),
        ("offered rate (trace arrivals)", fmt(v.get("offered_rate"), " req/s"), ""),
        ("completed / rejected / truncated", f"{m['num_completed']} / {m['num_rejected']} / {m['num_truncated']}",
         ""),
        ("request throughput (served)", *both("request_throughput", " req/s")),
        *([("goodput (within every SLO)", fmt(m["request_goodput"], " req/s"), "")] if "request_goodput" in m
          else []),
        ("output token throughput", *both("output_token_throughput", " tok/s", 1)),
        ("peak output token throughput (1 s)", fmt(m.get("max_output_tokens_per_s"), " tok/s", 0), ""),
        ("peak concurrent requests (1 s)", fmt(m.get("max_concurrent_requests")), ""),
        ("normalized latency", *both("normalized_latency", " s/token", 4)),
        ("TTFT mean", *both("ttft_mean", " s")), ("TTFT p99", *both("ttft_p99", " s")),
        ("TPOT mean", *both("tpot_mean", " s", 4)), ("TPOT p99", *both("tpot_p99", " s", 4)),
        ("ITL mean", *both("itl_mean", " s", 4)), ("ITL p99", *both("itl_p99", " s", 4)),
        ("E2E mean", *both("e2e_mean", " s")),
        ("mean batch size (decode steps)", *both("mean_batch_size", "", 2)),
        ("mean batch size (prefill steps)", *both("mean_prefill_batch_size", "", 2)),
        ("KV utilization", *both("kv_utilization", "", 3)),
        ("KV cache full (share of time)", "", fmt(st.get("kv_full_share"), "", 3)),
        ("preemptions (recompute / swap)", f"{m['preemptions']['recompute']} / {m['preemptions']['swap']}",
         fmt(st.get("preemptions"))),
        ("memory saved by sharing", f"{m['sharing_saved']:.1%}", ""),
        ("prefix-cache hit rate", f"{m['prefix_cache_hit_rate']:.1%}", ""),
        ("steps", fmt(m.get("num_steps")), ""),
        ("simulated time", fmt(m["simulated_time"], " s", 1),
         f"{st['window']['start']:.0f}-{st['window']['end']:.0f} s" if st.get("window") else "-"),
        ("wall time", f"{wall_time:.2f} s", ""),
    ]
    spec = doc.get("spec_decoding_stats")
    if spec:            # speculative decoding's counters, vLLM's names (docs/speculative.md)
        rows[-3:-3] = [
            (f"speculative ({spec['method']}:{spec['num_speculative_tokens']}) mean acceptance length",
             f"{fmt(spec.get('mean_acceptance_length'), '', 3)} (curve {spec['expected_mean_acceptance_length']:.3f})",
             ""),
            ("drafts / draft tokens / accepted", f"{spec['num_drafts']} / {spec['num_draft_tokens']} / "
                                                 f"{spec['num_accepted_tokens']}", ""),
            ("draft acceptance rate", fmt(spec.get("acceptance_rate"), "", 3), ""),
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
        count, example = entry["count"], entry["example_request"]     # (the reason is the example's own words)
        which = f"1 request ({example})" if count == 1 else f"{count} requests, e.g. {example}"
        console.print(f"  {which}: {entry['reason']}", highlight=False, markup=False)
    for w in warnings:
        console.print(f"  warning: {w}", highlight=False, markup=False)
    if notes:
        console.print("  the cost model does not capture: " + "; ".join(notes), highlight=False, markup=False)


def interval_table(found: dict, seeds: int, first_seed: int) -> Table:
    table = Table(title=f"over {seeds} seeds ({first_seed}..{first_seed + seeds - 1}): mean and 90% interval")
    for col in ("metric", "mean", "low (5%)", "high (95%)"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for name, iv in found.items():
        table.add_row(name, *[fmt(iv[k], "", 4) for k in ("mean", "low", "high")])
    return table


def warn(err: Console, warnings: list[str]) -> None:
    """Each warning on one line of stderr, as an error is (the terminal wraps it; a log keeps it whole)."""
    for w in warnings:
        err.print(f"warning: {w}", highlight=False, markup=False, soft_wrap=True)
