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
from engine.deployment import Deployment
from planner.cost.shape import StepShape
from planner.analysis.verdict import FULL_FREE_SHARE, queue_series, steady_window, sweep_verdict
from planner.documents import SCHEMA_VERSION, json_safe
from planner.report.html import capacity_report, run_report, sweep_report
from planner.runs.result import RunResult

BREAKDOWN_PARTS = ("token_states", "reserved", "internal_fragmentation", "external_fragmentation", "free")
_BREAKDOWN_COLORS = ("tab:green", "tab:orange", "tab:red", "tab:purple", "lightgray")


def run_title(params: dict) -> str:
    """'opt-13b on 1 x a100-40g, chatbot at 1.0 req/s (paged, block 16)': what every plot title says."""
    rate = (params.get("trace_params") or {}).get("rate")
    at = f" at {rate:g} req/s" if isinstance(rate, (int, float)) and math.isfinite(rate) else ""
    return (f"{params.get('model')} on {params.get('tp')} x {params.get('gpu')}, {params.get('trace')}{at} "
            f"({params.get('allocator')}, block {params.get('block_size')})")


def write_run(result: RunResult, out_dir: Path) -> dict[str, Path]:
    """Write a run's folder (result.json, CSVs, plots, report.html); returns the files by kind."""
    sim, doc = result.sim, result.document()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"result": out_dir / "result.json", "requests": out_dir / "requests.csv",
             "steps": out_dir / "steps.csv"}
    paths["result"].write_text(json.dumps(doc, indent=2) + "\n")
    _write_requests(sim.requests, paths["requests"])
    _write_steps(sim.steps, sim.shapes, paths["steps"], sim.num_running)
    plt = _pyplot()
    title = run_title(sim.params)
    paths["latency_cdf"] = _plot_latency_cdfs(plt, sim.requests, out_dir / "latency_cdf.png", title,
                                              dict(result.spec.slos))
    paths["timeline"] = plot_timeline(plt, sim.requests, sim.steps, doc.get("kv_token_slots"),
                                      out_dir / "timeline.png", title, steady_window(sim.requests))
    paths["memory_breakdown"] = plot_memory_breakdown(
        plt, [(_run_label(sim.params), sim.metrics.memory_breakdown)], out_dir / "memory_breakdown.png",
        title=f"KV-cache use: {title}")
    paths["report"] = out_dir / "report.html"
    paths["report"].write_text(run_report(doc, paths, f"Simulation: {title}"))
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


def _cdf(ax, values: list[float], label: str, slos: dict[str, float], prefix: str) -> None:
    xs = sorted(values)
    if xs:
        ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))])
    for name, limit in slos.items():
        if name.startswith(prefix):
            ax.axvline(limit, color="tab:red", linestyle="--", label=f"SLO {name} <= {limit:g}")
            ax.legend(loc="lower right", fontsize=8)
    ax.set_xlabel(label)
    ax.set_ylabel("fraction of requests")
    ax.grid(alpha=0.3)


def _plot_latency_cdfs(plt, records: list[RequestRecord], path: Path, title: str = "",
                       slos: dict[str, float] | None = None) -> Path:
    done = [r for r in records if r.completed]
    slos = slos or {}
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    _cdf(axes[0][0], [r.ttft for r in done], "TTFT (s)", slos, "ttft")
    _cdf(axes[0][1], [t for r in done if (t := r.tpot) is not None], "TPOT (s)", slos, "tpot")
    _cdf(axes[1][0], [r.e2e for r in done], "end-to-end latency (s)", slos, "e2e")
    _cdf(axes[1][1], [r.normalized_latency for r in done], "normalized latency (s/token)", slos, "normalized")
    fig.suptitle(f"latency CDFs, {len(done)} completed requests\n{title}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


MAX_POINTS = 3000    # plotted points per series (evenly thinned): enough for the eye, small PNGs


def _thin(xs: list, *series: list) -> tuple[list, ...]:
    every = max(1, len(xs) // MAX_POINTS)
    return (xs[::every], *(s[::every] for s in series))


def plot_timeline(plt, records: list[RequestRecord], steps: list[StepRecord], kv_slots: int | None, path: Path,
                  title: str = "", window=None) -> Path:
    """Waiting queue and requests in the system; batch size with its rolling mean; KV-cache use.

    The steady window (planner/analysis/verdict.py) is shaded; preemptions are red ticks.
    """
    fig, (queue, batch, kv) = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    times = [s.start for s in steps]
    if times:
        waiting, in_system = queue_series(records, times)
        t, w, n = _thin(times, waiting, in_system)
        queue.plot(t, w, linewidth=0.8, label="waiting (not yet scheduled)")
        queue.plot(t, n, linewidth=0.8, label="in the system (not finished)")
    queue.set_ylabel("requests")
    queue.legend(loc="upper left", fontsize=8)
    sizes = [s.batch_size for s in steps]
    k = max(1, len(steps) // 200)
    rolling, acc = [], 0.0
    for i, b in enumerate(sizes):
        acc += b - (sizes[i - k] if i >= k else 0)
        rolling.append(acc / min(i + 1, k))
    t, b, r = _thin(times, sizes, rolling)
    batch.plot(t, b, linewidth=0.4, alpha=0.4, label="per step")
    batch.plot(t, r, linewidth=1.2, label=f"rolling mean ({k} steps)")
    preempt = [s.start for s in steps if s.preempted]
    if preempt:
        batch.plot(preempt, [0] * len(preempt), "|", color="tab:red", label="preemption")
    batch.set_ylabel("batch size (requests)")
    batch.legend(loc="upper left", fontsize=8)
    total = kv_slots or 1
    t, used, tokens = _thin(times, [(s.token_states + s.reserved + s.internal_fragmentation) / total for s in steps],
                            [s.token_states / total for s in steps])
    kv.plot(t, tokens, linewidth=0.6, label="token states")
    kv.plot(t, used, linewidth=0.6, label="allocated")
    kv.axhline(1 - FULL_FREE_SHARE, color="tab:red", linestyle=":", label="full (< 5% free)")
    kv.set_ylabel("fraction of KV slots")
    kv.set_xlabel("simulated time (s)")
    kv.set_ylim(0, 1.05)
    kv.legend(loc="upper left", fontsize=8)
    for ax in (queue, batch, kv):
        ax.grid(alpha=0.3)
        if window is not None:
            ax.axvspan(window.start, window.end, color="tab:green", alpha=0.07)
    fig.suptitle(f"queue, batch and KV cache over time (shaded: steady window)\n{title}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_memory_breakdown(plt, runs: list[tuple[str, dict | None]], path: Path, title: str = "") -> Path:
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
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# -- sweeps -----------------------------------------------------------------------

# What a sweep may vary: the request rate and every deployment setting.
SWEEPABLE = ("rate", *(f.name for f in fields(Deployment)))
METRIC_COLUMNS = ("num_completed", "num_rejected", "num_truncated", "request_throughput", "output_token_throughput",
                  "normalized_latency", "ttft_p99", "tpot_p99", "e2e_mean", "mean_batch_size", "kv_utilization",
                  "sharing_saved", "preemptions_total", "wall_time", "state", "steady_normalized_latency")
AXIS_LABELS = {"rate": "request rate (requests/s)", "block_size": "KV block size (tokens)",
               "allocator": "KV allocator"}


def comparison_row(run: dict) -> dict:
    """One sweep run (a result document) flattened: its settings, then the comparison table's metrics."""
    row = {**run.get("deployment", {}), "rate": run.get("params", {}).get("trace_params", {}).get("rate"),
           "preemptions_total": run.get("preemptions", {}).get("total"),
           "state": (run.get("verdict") or {}).get("state"),
           "steady_normalized_latency": (run.get("steady_state") or {}).get("normalized_latency")}
    for col in METRIC_COLUMNS:
        row.setdefault(col, run.get(col))
    return row


def swept_variables(rows: list[dict]) -> list[str]:
    """The settings that take more than one value across the sweep."""
    return [k for k in SWEEPABLE if len({r.get(k) for r in rows}) > 1]


def sweep_title(runs: list[dict], swept: list[str]) -> str:
    p = runs[0].get("params", {}) if runs else {}
    fixed = []
    rate = (p.get("trace_params") or {}).get("rate")
    if "rate" not in swept and isinstance(rate, (int, float)):
        fixed.append(f"at {rate:g} req/s")
    if "block_size" not in swept:
        fixed.append(f"block {p.get('block_size')}")
    if "allocator" not in swept:
        fixed.append(str(p.get("allocator")))
    return (f"{p.get('model')} on {p.get('tp')} x {p.get('gpu')}, {p.get('trace')} {' '.join(fixed[:1])}"
            f"{' (' + ', '.join(fixed[1:]) + ')' if fixed[1:] else ''}: sweep of {', '.join(swept) or 'one run'}")


def sweep_document(runs: list[dict]) -> dict:
    """sweep.json: the runs' result documents and the sweep's verdict (the best run, a line per run)."""
    swept = swept_variables([comparison_row(r) for r in runs])
    return json_safe({"schema_version": SCHEMA_VERSION, "verdict": sweep_verdict(runs, swept), "runs": runs})


def write_sweep(doc: dict, out_dir: Path, slos: dict[str, float] | None = None) -> dict[str, Path]:
    """Comparison CSV, sweep.json, plots against each swept variable, report.html."""
    runs, verdict = doc["runs"], doc["verdict"]
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = [comparison_row(r) for r in runs]
    swept = verdict["swept"]
    paths = {"runs": out_dir / "sweep.json", "comparison": out_dir / "comparison.csv"}
    paths["runs"].write_text(json.dumps(doc, indent=2) + "\n")
    with paths["comparison"].open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*swept, *METRIC_COLUMNS], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    plt = _pyplot()
    title = sweep_title(runs, swept)
    plots: dict[str, Path] = {}
    for x in swept or ["rate"]:
        plots[f"metrics_vs_{x}"] = plot_against(plt, rows, x, [v for v in swept if v != x], verdict["best_index"],
                                                slos or {}, out_dir / f"metrics_vs_{x}.png", title)
    plots["memory_breakdown"] = plot_memory_breakdown(plt, _memory_bars(runs, rows, swept),
                                                      out_dir / "memory_breakdown.png", title=f"KV-cache use: {title}")
    paths.update(plots)
    columns = {**{k: k.replace("_", " ") for k in swept}, "request_throughput": "req/s",
               "normalized_latency": "s/token", "steady_normalized_latency": "steady s/token",
               "ttft_p99": "TTFT p99", "tpot_p99": "TPOT p99", "mean_batch_size": "batch", "kv_utilization": "KV util",
               "preemptions_total": "preempt", "num_rejected": "rejected"}
    paths["report"] = out_dir / "report.html"
    paths["report"].write_text(sweep_report(runs, verdict, plots, f"Sweep: {title}", columns, rows))
    return paths


def _memory_bars(runs: list[dict], rows: list[dict], swept: list[str]) -> list[tuple[str, dict | None]]:
    """One bar per combination of the swept settings other than the rate, at the highest rate swept:
    where memory matters most."""
    keys = [k for k in swept if k != "rate"] or ["allocator", "block_size"]
    top: dict[tuple, tuple[dict, dict]] = {}
    for run, row in zip(runs, rows):
        key = tuple(row.get(k) for k in keys)
        if key not in top or (row["rate"] or 0) >= (top[key][1]["rate"] or 0):
            top[key] = (run, row)
    return [(", ".join(f"{k} {v}" for k, v in zip(keys, key)) + f" ({row['rate']} req/s)", run.get("memory_breakdown"))
            for key, (run, row) in top.items()]


PANEL_LABELS = {"normalized_latency": "normalized latency (s/token)", "request_throughput": "throughput (req/s)",
                "ttft_p99": "TTFT p99 (s)", "tpot_p99": "TPOT p99 (s)", "e2e_p99": "E2E p99 (s)",
                "e2e_mean": "E2E mean (s)", "ttft_mean": "TTFT mean (s)", "tpot_mean": "TPOT mean (s)"}


def plot_against(plt, rows: list[dict], x: str, series_by: list[str], best: int | None,
                 slos: dict[str, float], path: Path, title: str) -> Path:
    """2x2 panels of metrics against the swept variable `x`, one line per combination of the
    other swept variables; the best run starred, SLO limits dashed."""
    keys = list(dict.fromkeys(["normalized_latency", "request_throughput",
                               *[k for k in slos if k in PANEL_LABELS or k in rows[0]], "ttft_p99", "tpot_p99"]))[:4]
    categorical = any(isinstance(r.get(x), (str, bool)) for r in rows)
    cats = list(dict.fromkeys(r[x] for r in rows)) if categorical else []

    def xpos(row):
        return cats.index(row[x]) if categorical else row[x]

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    for ax, key in zip([a for pair in axes for a in pair], keys):
        series: dict[tuple, list[tuple]] = {}
        for row in rows:
            if row.get(x) is not None and row.get(key) is not None:
                series.setdefault(tuple(row.get(v) for v in series_by), []).append((xpos(row), row[key]))
        for label, points in sorted(series.items(), key=lambda kv: str(kv[0])):
            points.sort()
            name = ", ".join(f"{val} req/s" if v == "rate" else f"{v.replace('_', ' ')} {val}"
                             for v, val in zip(series_by, label)) or None
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
        if best is not None and rows[best].get(key) is not None:
            ax.plot([xpos(rows[best])], [rows[best][key]], marker="*", markersize=16, color="gold",
                    markeredgecolor="black", linestyle="none", label="best")
        if key in slos:
            ax.axhline(slos[key], color="tab:red", linestyle="--", label=f"SLO {slos[key]:g}")
        if categorical:
            ax.set_xticks(range(len(cats)), [str(c) for c in cats])
        elif x == "block_size":
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted({r[x] for r in rows}), [str(v) for v in sorted({r[x] for r in rows})])
        ax.set_xlabel(AXIS_LABELS.get(x, x.replace("_", " ")))
        ax.set_ylabel(PANEL_LABELS.get(key, key))
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# -- capacity ---------------------------------------------------------------------

def write_capacity(doc: dict, out_dir: Path, title: str) -> dict[str, Path]:
    """capacity.json, the probes plotted against rate (SLO limits, the capacity marked), report.html."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"capacity": out_dir / "capacity.json"}
    paths["capacity"].write_text(json.dumps(json_safe(doc), indent=2) + "\n")
    plt = _pyplot()
    probes = sorted(doc["probes"], key=lambda p: p["rate"])
    keys = list(doc["slos"]) + ["request_throughput"]
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 4), squeeze=False)
    for ax, key in zip(axes[0], keys):
        pts = [(p["rate"], p.get(key), p["meets"]) for p in probes if p.get(key) is not None]
        ax.plot([r for r, _, _ in pts], [v for _, v, _ in pts], color="tab:blue", linewidth=1)
        for r, v, ok in pts:
            ax.plot([r], [v], marker="o", color="tab:green" if ok else "tab:red", linestyle="none")
        if key in doc["slos"]:
            ax.axhline(doc["slos"][key], color="tab:red", linestyle="--", label=f"SLO {doc['slos'][key]:g}")
        if doc.get("capacity_rate") is not None:
            ax.axvline(doc["capacity_rate"], color="black", linestyle=":",
                       label=f"capacity {doc['capacity_rate']:.3g} req/s")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("request rate (requests/s)")
        ax.set_ylabel(PANEL_LABELS.get(key, key))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"capacity search (green: meets the SLOs, red: misses)\n{title}", fontsize=10)
    fig.tight_layout()
    paths["capacity_plot"] = out_dir / "capacity.png"
    fig.savefig(paths["capacity_plot"], dpi=100)
    plt.close(fig)
    paths["report"] = out_dir / "report.html"
    paths["report"].write_text(capacity_report(json_safe(doc), {"capacity_plot": paths["capacity_plot"]},
                                               f"Capacity: {title}"))
    return paths
