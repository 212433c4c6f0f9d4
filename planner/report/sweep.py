"""A sweep's folder: sweep.json (every run and the verdict), comparison.csv, plots against each setting swept."""
from __future__ import annotations

import csv
import json
from dataclasses import fields
from pathlib import Path

from engine.deployment import Deployment
from planner.analysis.verdict import sweep_verdict
from planner.deploy.parallel import layout_suffix
from planner.documents import SCHEMA_VERSION, json_safe
from planner.report.html import sweep_report
from planner.report.plots import plot_against, plot_memory_breakdown, pyplot

# What a sweep may vary: the request rate and every deployment setting.
SWEEPABLE = ("rate", "concurrency", "replicas", *(f.name for f in fields(Deployment)))
METRIC_COLUMNS = ("num_completed", "num_rejected", "num_truncated", "request_throughput", "output_token_throughput",
                  "normalized_latency", "ttft_p99", "tpot_p99", "e2e_mean", "mean_batch_size", "kv_utilization",
                  "sharing_saved", "preemptions_total", "wall_time", "state", "steady_normalized_latency")


def comparison_row(run: dict) -> dict:
    """One sweep run (a result document) flattened: its settings, then the comparison table's metrics."""
    params = run.get("params", {})
    row = {**run.get("deployment", {}), "rate": params.get("trace_params", {}).get("rate"),
           "concurrency": params.get("concurrency"), "replicas": params.get("replicas", 1),
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
    return (f"{p.get('model')} on {p.get('tp')} x {p.get('gpu')}{layout_suffix(p.get('pp'), p.get('dp'))}, "
            f"{p.get('trace')} {' '.join(fixed[:1])}"
            f"{' (' + ', '.join(fixed[1:]) + ')' if fixed[1:] else ''}: sweep of {', '.join(swept) or 'one run'}")


def sweep_document(runs: list[dict]) -> dict:
    """sweep.json: the runs' result documents and the sweep's verdict (the best run, a line per run)."""
    swept = swept_variables([comparison_row(r) for r in runs])
    # the verdict names a run by its swept settings: a fleet's replica count as if a deployment setting
    labelled = [{**r, "deployment": {**r.get("deployment", {}), "replicas": r.get("params", {}).get("replicas", 1)}}
                for r in runs] if "replicas" in swept else runs
    return json_safe({"schema_version": SCHEMA_VERSION, "verdict": sweep_verdict(labelled, swept), "runs": runs})


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
    plt = pyplot()
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
