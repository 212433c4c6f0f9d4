"""`planner workload ...`: list the built-in workloads, show a trace's statistics, import real traces."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Optional

import typer
from planner.cli.output import fail
from planner.sim.memory_guard import check_trace_size
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from workloads import (MOONCAKE_BLOCK, WORKLOADS, Trace, TraceError, import_burstgpt, import_conversations,
                       import_csv_trace, import_custom, import_mooncake, import_sharegpt, import_sonnet, make_trace,
                       parse_workload_params, workload_params)
from workloads.make import is_trace_file

app = typer.Typer(help="Workloads: built-in request traces and trace files.", no_args_is_help=True)

DEFAULT_REQUESTS = 1000

# The -p KEY=VALUE parser, kept under this name for the commands that import it from here.
_parse_params = parse_workload_params


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
    if requests is not None and requests < 1:
        raise fail(f"--requests: must be >= 1, got {requests}")
    if duration is not None and not (duration > 0 and math.isfinite(duration)):
        raise fail(f"--duration: must be a finite number of seconds > 0, got {duration}")
    if hist is not None and (hist.suffix.lower() != ".png" or hist.is_dir()):
        raise fail(f"--hist {str(hist)!r}: give a .png file to write the histogram to")
    try:
        params = parse_workload_params(name, param)
        if not is_trace_file(name):
            check_trace_size(requests, duration, rate)
        trace = make_trace(
            name, num_requests=requests, duration=duration, rate=rate,
            arrival=arrival, cv=cv, seed=seed, **params,
        )
        if save is not None:
            trace.save(save)
        if hist is not None:
            save_histogram(trace, hist)
    except (TraceError, ValueError, OSError) as err:
        raise fail(err) from None
    stats = trace.stats()
    if as_json:
        sys.stdout.write(json.dumps(_json_safe(stats), indent=2) + "\n")
        return
    console = Console()
    console.print(_table(stats))
    for label, path in (("trace", save), ("histogram", hist)):
        if path is not None:
            console.print(f"{label} written to {path}")


IMPORT_FORMATS = ("azure", "sharegpt", "conversations", "custom", "sonnet", "burstgpt", "mooncake", "csv")
TEXT_FORMATS = ("sharegpt", "custom", "sonnet")   # prompts as text, sampled by vLLM bench's rules
TOKENIZED_FORMATS = (*TEXT_FORMATS, "conversations")   # text: a tokenizer counts it
SAMPLED_FORMATS = (*TEXT_FORMATS, "burstgpt")     # requests drawn by a seed, arrivals generated (vLLM bench's way)
TIMED_FORMATS = (*SAMPLED_FORMATS, "conversations")     # arrivals generated
# the import flags that only some formats take (the others refuse them in one line)
FLAG_FORMATS = {"--tokenizer": TOKENIZED_FORMATS, "--output-len": TOKENIZED_FORMATS,
                "--no-oversample": ("sharegpt", "custom"), "--disable-shuffle": ("sharegpt", "custom"),
                "--skip-chat-template": ("custom",), "--input-len": ("sonnet",), "--prefix-len": ("sonnet",),
                "--seed": TIMED_FORMATS, "--rate": TIMED_FORMATS, "--arrival": TIMED_FORMATS, "--cv": TIMED_FORMATS,
                "--keep-times": ("burstgpt",), "--drop-zero": ("azure", "mooncake"), "--max-turns": ("conversations",),
                "--hash-block-size": ("mooncake",)}


def import_trace(path: Path, fmt: str, *, tokenizer: Path | None = None, requests: int | None = None,
                 duration: float | None = None, seed: int = 0, rate: float = math.inf, arrival: str = "poisson",
                 cv: float = 1.0, drop_zero: bool = False, output_len: int | None = None,
                 skip_chat_template: bool = False, oversample: bool = True, shuffle: bool = True,
                 keep_times: bool = False, input_len: int | None = None, prefix_len: int | None = None,
                 max_turns: int | None = None, hash_block_size: int = MOONCAKE_BLOCK) -> Trace:
    """A trace from a file in one of IMPORT_FORMATS (what `planner workload import` runs)."""
    if fmt not in IMPORT_FORMATS:
        raise TraceError(f"--format: unknown format {fmt!r}; choose one of {', '.join(IMPORT_FORMATS)}")
    if not path.is_file():
        raise TraceError(f"{path}: {'a folder, not a file' if path.is_dir() else 'no such file'}")
    if fmt == "azure":
        return import_csv_trace(path, num_requests=requests, duration=duration, drop_zero=drop_zero)
    if fmt == "mooncake":
        return import_mooncake(path, num_requests=requests, duration=duration, drop_zero=drop_zero,
                               block_size=hash_block_size)
    if fmt == "burstgpt":
        return import_burstgpt(path, requests, seed, keep_times=keep_times, duration=duration, arrival=arrival,
                               rate=rate, cv=cv)
    if fmt in TOKENIZED_FORMATS and tokenizer is None:
        raise TraceError(f"--tokenizer: a {fmt} file holds text; give a local tokenizer folder to count its tokens")
    timing = dict(arrival=arrival, rate=rate, cv=cv)
    if fmt == "conversations":
        trace = import_conversations(path, tokenizer, requests, seed, **timing, max_turns=max_turns,
                                     output_len=output_len)
        return trace.head(duration=duration) if duration is not None else trace
    if fmt in TEXT_FORMATS:
        if fmt == "sonnet":
            lengths = {name: value for name, value in (("input_len", input_len), ("output_len", output_len),
                                                       ("prefix_len", prefix_len)) if value is not None}
            trace = import_sonnet(path, tokenizer, requests or DEFAULT_REQUESTS, seed, **lengths, **timing)
            return trace.head(duration=duration) if duration is not None else trace
        timing.update(oversample=oversample, shuffle=shuffle)
        if fmt == "sharegpt":
            trace = import_sharegpt(path, tokenizer, requests or DEFAULT_REQUESTS, seed, fixed_output_len=output_len,
                                    **timing)
        else:
            trace = import_custom(path, tokenizer, requests or DEFAULT_REQUESTS, seed,
                                  skip_chat_template=skip_chat_template,
                                  **({"output_len": output_len} if output_len is not None else {}), **timing)
        return trace.head(duration=duration) if duration is not None else trace
    if path.suffix.lower() != ".csv":
        raise TraceError(f"{path}: --format csv reads a .csv file (columns as in the README)")
    return Trace.load(path).head(num_requests=requests, duration=duration)


@app.command("import")
def import_command(
    path: Path = typer.Argument(..., help="the file to import"),
    fmt: str = typer.Option(..., "--format", "-f", help="azure (TIMESTAMP, ContextTokens, GeneratedTokens CSV), "
                                                       "sharegpt (JSON dump, needs --tokenizer), conversations (vLLM's "
                                                       "multi-turn benchmark's JSON, its generation config or a "
                                                       "ShareGPT dump: every turn a request, needs a chat "
                                                       "--tokenizer), custom (vLLM bench's JSONL of "
                                                       "{\"prompt\": ...}, needs --tokenizer), sonnet "
                                                       "(vLLM bench's poem lines, needs --tokenizer), burstgpt "
                                                       "(BurstGPT's CSV, sampled as vLLM bench does), mooncake "
                                                       "(Mooncake's JSONL of timestamp, input_length, output_length "
                                                       "and hash_ids, as aiperf's mooncake_trace replays it) or csv "
                                                       "(our columns)"),
    output: Path = typer.Option(..., "--output", "-o", help="the trace to write (.jsonl or .csv)"),
    tokenizer: Optional[Path] = typer.Option(None, help="sharegpt, conversations, custom, sonnet: a local tokenizer "
                                                                "folder"),
    output_len: Optional[int] = typer.Option(None, "--output-len",
                                             help="sharegpt: every output this long instead of the answer's length "
                                                  "(vLLM bench's --sharegpt-output-len); custom: every output's "
                                                  "length (--custom-output-len) [default: 256]; sonnet: "
                                                  "--sonnet-output-len [default: 150]; conversations: every "
                                                  "answer this long, in its request and in the history after it "
                                                  "(the multi-turn benchmark's --limit-max-tokens)"),
    input_len: Optional[int] = typer.Option(None, "--input-len",
                                            help="sonnet: the most prompt tokens (vLLM bench's --sonnet-input-len) "
                                                 "[default: 550]"),
    prefix_len: Optional[int] = typer.Option(None, "--prefix-len",
                                             help="sonnet: the tokens every prompt shares (--sonnet-prefix-len) "
                                                  "[default: 200]"),
    skip_chat_template: bool = typer.Option(False, "--skip-chat-template",
                                            help="custom: send the prompts as they are, not in the tokenizer's "
                                                 "chat template (vLLM bench's flag)"),
    disable_shuffle: bool = typer.Option(False, "--disable-shuffle",
                                         help="sharegpt, custom: take the file's requests in its order, not "
                                              "shuffled by the seed (vLLM bench's flag)"),
    oversample: bool = typer.Option(True, "--oversample/--no-oversample",
                                    help="sharegpt, custom: fill the count with copies of random requests when the "
                                         "file has too few, as vLLM bench does (--no-oversample: a shorter trace)"),
    requests: Optional[int] = typer.Option(None, "--requests", "-n",
                                           help=f"keep the first N requests (sharegpt, custom, sonnet, burstgpt: "
                                                f"sample N, default {DEFAULT_REQUESTS}; conversations: the first "
                                                f"conversations' turns, default all)"),
    duration: Optional[float] = typer.Option(None, help="keep requests arriving in the first SECONDS"),
    seed: int = typer.Option(0, help="sampled formats (sharegpt, custom, sonnet, burstgpt): sampling and arrival "
                                     "seed; conversations: arrival seed, and a generation config's (the multi-turn "
                                     "benchmark's --seed)"),
    rate: float = typer.Option(math.inf, help="sampled formats and conversations: requests/s of the generated "
                                              "arrivals (inf: all at t=0; a conversation's later turns wait for "
                                              "their answers and a think time, as the chatbot workload's)"),
    arrival: str = typer.Option("poisson", help="sampled formats and conversations: poisson, gamma or constant"),
    cv: float = typer.Option(1.0, help="sampled formats and conversations: coefficient of variation of gamma "
                                       "gaps"),
    keep_times: bool = typer.Option(False, "--keep-times",
                                    help="burstgpt: the log's own arrivals (its GPT-4 rows in order at their "
                                         "timestamps) instead of vLLM bench's sample at generated arrivals"),
    drop_zero: bool = typer.Option(False, "--drop-zero", help="azure, mooncake: skip rows with a zero length"),
    hash_block_size: int = typer.Option(MOONCAKE_BLOCK, "--hash-block-size",
                                        help="mooncake: the tokens each of a line's hash_ids covers (its traces': "
                                             "512)"),
    max_turns: Optional[int] = typer.Option(None, "--max-turns",
                                            help="conversations: the most messages of a conversation sent, "
                                                 "questions and answers both (vLLM's multi-turn benchmark's "
                                                 "--max-turns)"),
    as_json: bool = typer.Option(False, "--json", help="print the trace's statistics as JSON"),
) -> None:
    """Convert a real trace into this project's trace format (then use it with --trace)."""
    if requests is not None and requests < 1:
        raise fail(f"--requests: must be >= 1, got {requests}")
    if duration is not None and not (duration > 0 and math.isfinite(duration)):
        raise fail(f"--duration: must be a finite number of seconds > 0, got {duration}")
    if output.resolve() == path.resolve():
        raise fail(f"--output {output}: the file being imported; write the trace to another file")
    given = {"--tokenizer": tokenizer is not None, "--output-len": output_len is not None,
             "--no-oversample": not oversample, "--disable-shuffle": disable_shuffle,
             "--skip-chat-template": skip_chat_template, "--input-len": input_len is not None,
             "--prefix-len": prefix_len is not None, "--seed": seed != 0, "--rate": rate != math.inf,
             "--arrival": arrival != "poisson", "--cv": cv != 1.0, "--keep-times": keep_times, "--drop-zero": drop_zero,
             "--max-turns": max_turns is not None, "--hash-block-size": hash_block_size != MOONCAKE_BLOCK}
    unused = [flag for flag, formats in FLAG_FORMATS.items() if given[flag] and fmt not in formats]
    if unused:
        raise fail(f"{', '.join(unused)}: not used with --format {fmt}; drop {'it' if len(unused) == 1 else 'them'}")
    timed = [flag for flag in ("--seed", "--rate", "--arrival", "--cv") if given[flag] and keep_times]
    if timed:
        raise fail(f"{', '.join(timed)}: not used with --keep-times (the log's own arrivals); drop "
                   f"{'it' if len(timed) == 1 else 'them'}")
    try:
        trace = import_trace(path, fmt, tokenizer=tokenizer, requests=requests, duration=duration, seed=seed,
                             rate=rate, arrival=arrival, cv=cv, drop_zero=drop_zero, output_len=output_len,
                             skip_chat_template=skip_chat_template, oversample=oversample,
                             shuffle=not disable_shuffle, keep_times=keep_times, input_len=input_len,
                             prefix_len=prefix_len, max_turns=max_turns, hash_block_size=hash_block_size)
        if not len(trace):
            raise TraceError(f"{path}: no requests to import")
        trace.save(output)
    except (TraceError, ValueError, OSError) as err:
        raise fail(err) from None
    stats = trace.stats()
    if as_json:
        sys.stdout.write(json.dumps(_json_safe(stats | {"output": str(output)}), indent=2) + "\n")
        return
    console = Console()
    console.print(_table(stats))
    dropped, empty = trace.params.get("dropped_rows"), trace.params.get("empty_prompts")
    if dropped:
        console.print(f"skipped {dropped} rows with a zero length")
    if empty:
        console.print(f"left out {empty} drawn rows with no request tokens (vLLM's server rejects an empty prompt)")
    console.print(f"trace written to {output} (use it with: planner simulate --trace {output})", highlight=False)


if __name__ == "__main__":
    app()
