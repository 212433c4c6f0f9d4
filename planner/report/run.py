"""A simulated run's folder: result.json, per-request and per-step CSV, PNG plots, report.html.

JSON never holds NaN or infinity (not valid JSON): they become null.
"""
from __future__ import annotations

import csv
import json
import math
from dataclasses import fields
from pathlib import Path

from engine.core.metrics import RequestRecord, StepRecord
from planner.analysis.verdict import steady_window
from planner.cost.shape import StepShape
from planner.deploy.parallel import layout_suffix
from planner.report.html import run_report
from planner.report.plots import plot_latency_cdfs, plot_memory_breakdown, plot_timeline, pyplot
from planner.runs.result import RunResult


def run_title(params: dict) -> str:
    """'opt-13b on 1 x a100-40g, chatbot at 1.0 req/s (paged, block 16)': what every plot title says."""
    rate = (params.get("trace_params") or {}).get("rate")
    at = f" at {rate:g} req/s" if isinstance(rate, (int, float)) and math.isfinite(rate) else ""
    where = f"{params.get('tp')} x {params.get('gpu')}{layout_suffix(params.get('pp'), params.get('dp'))}"
    if params.get("replicas"):
        where = f"{params['replicas']} replicas of {where} ({params.get('router')})"
    if params.get("pd"):
        where = f"prefill:decode {params['pd']} pools of {where}"
    return (f"{params.get('model')} on {where}, {params.get('trace')}{at} "
            f"({params.get('allocator')}, block {params.get('block_size')})")


def write_run(result: RunResult, out_dir: Path) -> dict[str, Path]:
    """Write a run's folder (result.json, CSVs, plots, report.html); returns the files by kind."""
    sim, doc = result.sim, result.document()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"result": out_dir / "result.json", "requests": out_dir / "requests.csv",
             "steps": out_dir / "steps.csv"}
    paths["result"].write_text(json.dumps(doc, indent=2) + "\n")
    _write_requests(sim.requests, paths["requests"], result.request_columns())
    _write_steps(sim.steps, sim.shapes, paths["steps"], sim.num_running, result.step_columns())
    plt = pyplot()
    title = run_title(sim.params)
    paths["latency_cdf"] = plot_latency_cdfs(plt, sim.requests, out_dir / "latency_cdf.png", title,
                                              dict(result.spec.slos))
    paths["timeline"] = plot_timeline(plt, sim.requests, sim.steps, doc.get("kv_token_slots"),
                                      out_dir / "timeline.png", title, steady_window(sim.requests))
    paths["memory_breakdown"] = plot_memory_breakdown(
        plt, [(_run_label(sim.params), sim.metrics.memory_breakdown)], out_dir / "memory_breakdown.png",
        title=f"KV-cache use: {title}")
    paths["report"] = out_dir / "report.html"
    paths["report"].write_text(run_report(doc, paths, f"Simulation: {title}"))
    return paths


def _write_requests(records: list[RequestRecord], path: Path, extra: dict[str, list] | None = None) -> None:
    """requests.csv; a fleet's adds the replica that served each request, a P/D run's both pools' replicas."""
    extra = extra or {}
    columns = ["request_id", "arrival", "prompt_len", "output_len", "num_seqs", "seq_output_len", "first_scheduled",
               "first_token", "finish", "ttft", "tpot", "itl_mean", "itl_p50", "itl_p99", "e2e", "normalized_latency",
               "num_preemptions", "rejected", "reject_reason", "truncated"]
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns + list(extra))
        for i, r in enumerate(records):
            ran = not r.rejected and r.finish is not None and r.first_token is not None
            writer.writerow([r.request_id, r.arrival, r.prompt_len, r.output_len, r.num_seqs, r.seq_output_len,
                             r.first_scheduled, r.first_token, r.finish, r.ttft if ran else None,
                             r.tpot if ran else None, *r.itl_stats(), r.e2e if ran else None,
                             r.normalized_latency if ran else None, r.num_preemptions, r.rejected,
                             r.reject_reason, r.truncated] + [values[i] for values in extra.values()])


def _write_steps(steps: list[StepRecord], shapes: list[StepShape], path: Path,
                 num_running: list[int] | None = None, extra: dict[str, list] | None = None) -> None:
    """steps.csv; a fleet's holds every replica's steps by start time, with the replica (a P/D run's also
    the pool)."""
    extra = extra or {}
    step_cols = [f.name for f in fields(StepRecord)]
    shape_cols = ["prefill_attn_pairs", "prefill_context", "decode_context", "copy_blocks"]
    running = num_running if num_running and len(num_running) == len(steps) else [None] * len(steps)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(step_cols + ["duration"] + shape_cols + ["num_running"]
                        + list(extra))
        for i, (step, shape, n) in enumerate(zip(steps, shapes, running)):
            writer.writerow([getattr(step, c) for c in step_cols] + [step.end - step.start]
                            + [getattr(shape, c) for c in shape_cols] + [n]
                            + [values[i] for values in extra.values()])
def _run_label(params: dict) -> str:
    return f"{params.get('allocator', '?')} (block {params.get('block_size', '?')})"
