"""Simulation results on disk: result.json, per-request and per-step CSV, PNG plots.

One run writes a folder; a sweep writes one comparison folder (table, CSV and
the paper-style normalized-latency-against-rate plot). JSON never holds NaN or
infinity (not valid JSON): they become null.
"""
from __future__ import annotations

import csv
import json
import math
from dataclasses import fields
from pathlib import Path

from engine.core.metrics import RequestRecord, StepRecord
from planner.cost.shape import StepShape
from planner.sim import SimResult

BREAKDOWN_PARTS = ("token_states", "reserved", "internal_fragmentation", "external_fragmentation", "free")
_BREAKDOWN_COLORS = ("tab:green", "tab:orange", "tab:red", "tab:purple", "lightgray")


def json_safe(value):
    """NaN and infinity -> None, recursively (JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def result_document(result: SimResult) -> dict:
    """The run as one JSON document: the metrics (docs/architecture.md) at the top level, then how it was run."""
    doc = dict(result.metrics)
    doc["memory_plan"] = result.memory_plan
    doc["wall_time"] = result.wall_time
    doc["simulated_seconds_per_wall_second"] = (result.metrics["simulated_time"] / result.wall_time
                                               if result.wall_time > 0 else None)
    return json_safe(doc)


def write_run(result: SimResult, out_dir: Path) -> dict[str, Path]:
    """Write a run's folder; returns the files by kind."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"result": out_dir / "result.json", "requests": out_dir / "requests.csv",
             "steps": out_dir / "steps.csv"}
    paths["result"].write_text(json.dumps(result_document(result), indent=2) + "\n")
    _write_requests(result.requests, paths["requests"])
    _write_steps(result.steps, result.shapes, paths["steps"], result.num_running)
    plt = _pyplot()
    paths["latency_cdf"] = _plot_latency_cdfs(plt, result.requests, out_dir / "latency_cdf.png")
    paths["timeline"] = _plot_timeline(plt, result.steps, result.metrics.get("kv_token_slots"),
                                       out_dir / "timeline.png")
    label = _run_label(result.params)
    paths["memory_breakdown"] = plot_memory_breakdown(
        plt, [(label, result.metrics.get("memory_breakdown"))], out_dir / "memory_breakdown.png")
    return paths


def _write_requests(records: list[RequestRecord], path: Path) -> None:
    columns = ["request_id", "arrival", "prompt_len", "output_len", "num_seqs", "seq_output_len", "first_scheduled",
               "first_token", "finish", "ttft", "tpot", "itl_mean", "itl_p50", "itl_p99", "e2e", "normalized_latency",
               "num_preemptions", "rejected", "reject_reason", "truncated"]
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for r in records:
            ran = not r.rejected and r.finish is not None and r.first_token is not None
            writer.writerow([r.request_id, r.arrival, r.prompt_len, r.output_len, r.num_seqs, r.seq_output_len,
                             r.first_scheduled, r.first_token, r.finish, r.ttft if ran else None,
                             r.tpot if ran else None, r.itl_mean, r.itl_p50, r.itl_p99, r.e2e if ran else None,
                             r.normalized_latency if ran else None, r.num_preemptions, r.rejected,
                             r.reject_reason, r.truncated])


def _write_steps(steps: list[StepRecord], shapes: list[StepShape], path: Path,
                 num_running: list[int] | None = None) -> None:
    step_cols = [f.name for f in fields(StepRecord)]
    shape_cols = ["prefill_attn_pairs", "decode_context", "copy_blocks"]
    running = num_running if num_running and len(num_running) == len(steps) else [None] * len(steps)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(step_cols + ["duration"] + shape_cols + ["num_running"])
        for step, shape, n in zip(steps, shapes, running):
            writer.writerow([getattr(step, c) for c in step_cols] + [step.end - step.start]
                            + [getattr(shape, c) for c in shape_cols] + [n])


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")   # no display: runs on servers and in CI
    import matplotlib.pyplot as plt

    return plt


def _run_label(params: dict) -> str:
    return f"{params.get('allocator', '?')} (block {params.get('block_size', '?')})"


def _cdf(ax, values: list[float], label: str) -> None:
    xs = sorted(values)
    if xs:
        ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))])
    ax.set_xlabel(label)
    ax.set_ylabel("fraction of requests")
    ax.grid(alpha=0.3)


def _plot_latency_cdfs(plt, records: list[RequestRecord], path: Path) -> Path:
    done = [r for r in records if r.completed]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    _cdf(axes[0][0], [r.ttft for r in done], "TTFT (s)")
    _cdf(axes[0][1], [t for r in done if (t := r.tpot) is not None], "TPOT (s)")
    _cdf(axes[1][0], [r.e2e for r in done], "end-to-end latency (s)")
    _cdf(axes[1][1], [r.normalized_latency for r in done], "normalized latency (s/token)")
    fig.suptitle(f"latency CDFs ({len(done)} completed requests)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _plot_timeline(plt, steps: list[StepRecord], kv_slots: int | None, path: Path) -> Path:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    times = [s.start for s in steps]
    top.plot(times, [s.batch_size for s in steps], linewidth=0.6)
    top.set_ylabel("batch size (requests)")
    preempt = [s.start for s in steps if s.preempted]
    if preempt:
        top.plot(preempt, [0] * len(preempt), "|", color="tab:red", label="preemption")
        top.legend(loc="upper right")
    total = kv_slots or 1
    bottom.plot(times, [s.token_states / total for s in steps], linewidth=0.6, label="token states")
    used = [(s.token_states + s.reserved + s.internal_fragmentation) / total for s in steps]
    bottom.plot(times, used, linewidth=0.6, label="allocated")
    bottom.set_ylabel("fraction of KV slots")
    bottom.set_xlabel("simulated time (s)")
    bottom.set_ylim(0, 1.05)
    bottom.legend(loc="upper right")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_memory_breakdown(plt, runs: list[tuple[str, dict | None]], path: Path) -> Path:
    """Stacked bars: the time-averaged share of KV slots per use, one bar per run (allocator)."""
    fig, ax = plt.subplots(figsize=(10, 1.4 + 0.5 * len(runs)))
    for row, (_, breakdown) in enumerate(runs):
        left = 0.0
        for part, color in zip(BREAKDOWN_PARTS, _BREAKDOWN_COLORS):
            width = (breakdown or {}).get(part, 0.0)
            ax.barh(row, width, left=left, color=color, label=part if row == 0 else None)
            left += width
    ax.set_yticks(range(len(runs)), [label for label, _ in runs])
    ax.set_xlim(0, 1)
    ax.set_xlabel("fraction of KV-cache slots (time-averaged)")
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# -- sweeps -----------------------------------------------------------------------

COMPARISON_COLUMNS = ("allocator", "block_size", "rate", "num_completed", "num_rejected", "num_truncated",
                      "request_throughput",
                      "output_token_throughput", "normalized_latency", "ttft_p99", "tpot_p99", "e2e_mean",
                      "mean_batch_size", "kv_utilization", "sharing_saved", "preemptions_total", "wall_time")


def comparison_row(run: dict) -> dict:
    """One sweep run (a result document) flattened to the comparison table's columns."""
    params = run.get("params", {})
    row = {"allocator": params.get("allocator"), "block_size": params.get("block_size"),
           "rate": params.get("trace_params", {}).get("rate"),
           "preemptions_total": run.get("preemptions", {}).get("total")}
    for col in COMPARISON_COLUMNS:
        row.setdefault(col, run.get(col))
    return row


def write_sweep(runs: list[dict], out_dir: Path) -> dict[str, Path]:
    """Comparison CSV, all result documents, and plots across the sweep's runs."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"runs": out_dir / "sweep.json", "comparison": out_dir / "comparison.csv"}
    paths["runs"].write_text(json.dumps(json_safe(runs), indent=2) + "\n")
    rows = [comparison_row(r) for r in runs]
    with paths["comparison"].open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COMPARISON_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    plt = _pyplot()
    paths["normalized_latency"] = _plot_against_rate(plt, rows, "normalized_latency",
                                                     "normalized latency (s/token)",
                                                     out_dir / "normalized_latency_vs_rate.png")
    paths["throughput"] = _plot_against_rate(plt, rows, "request_throughput", "throughput (requests/s)",
                                             out_dir / "throughput_vs_rate.png")
    # One bar per (allocator, block size), at the highest rate swept: where memory matters most.
    top: dict[tuple, dict] = {}
    for run, row in zip(runs, rows):
        key = (row["allocator"], row["block_size"])
        if key not in top or (row["rate"] or 0) >= (comparison_row(top[key])["rate"] or 0):
            top[key] = run
    bars = [(f"{a} (block {b}, {comparison_row(r)['rate']} req/s)", r.get("memory_breakdown"))
            for (a, b), r in top.items()]
    paths["memory_breakdown"] = plot_memory_breakdown(plt, bars, out_dir / "memory_breakdown.png")
    return paths


def _plot_against_rate(plt, rows: list[dict], key: str, ylabel: str, path: Path) -> Path:
    """One line per (allocator, block size) against request rate, as the paper's Fig. 12 plots it."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    series: dict[tuple, list[tuple[float, float]]] = {}
    for row in rows:
        if row["rate"] is not None and row.get(key) is not None:
            series.setdefault((row["allocator"], row["block_size"]), []).append((row["rate"], row[key]))
    sizes = {b for _, b in series}
    for (allocator, block), points in sorted(series.items(), key=lambda kv: (str(kv[0][0]), kv[0][1] or 0)):
        points.sort()
        label = allocator if len(sizes) <= 1 else f"{allocator}, block {block}"
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    ax.set_xlabel("request rate (requests/s)")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if series:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
