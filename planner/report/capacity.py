"""A capacity search's folder: capacity.json, the probes plotted against the rate, report.html."""
from __future__ import annotations

import json
from pathlib import Path

from planner.documents import json_safe
from planner.report.html import capacity_report
from planner.report.plots import PANEL_LABELS, legend, pyplot


def write_capacity(doc: dict, out_dir: Path, title: str) -> dict[str, Path]:
    """capacity.json, the probes plotted against rate (SLO limits, the capacity marked), report.html."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"capacity": out_dir / "capacity.json"}
    paths["capacity"].write_text(json.dumps(json_safe(doc), indent=2) + "\n")
    plt = pyplot()
    x = "rate" if doc.get("capacity_concurrency") is None and doc["probes"] and "rate" in doc["probes"][0] \
        else "concurrency"
    capacity, unit = doc.get(f"capacity_{x}"), "req/s" if x == "rate" else "clients"
    probes = sorted(doc["probes"], key=lambda p: p[x])
    span = (probes[0][x] / 1.25, probes[-1][x] * 1.25)     # every panel's: one may have no point to plot
    attainment = doc.get("slo_attainment")       # judged by the share of requests within every limit
    keys = (["attainment"] if attainment is not None else []) + list(doc["slos"]) + ["request_throughput"]
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 4), squeeze=False)
    for ax, key in zip(axes[0], keys):
        pts = [(p[x], p.get(key), p["meets"]) for p in probes if p.get(key) is not None]
        if not pts:           # e.g. a latency when no probe served a request
            ax.text(0.5, 0.62, "no probe gave a value", transform=ax.transAxes, ha="center", color="gray")
        ax.plot([r for r, _, _ in pts], [v for _, v, _ in pts], color="tab:blue", linewidth=1)
        for r, v, ok in pts:
            ax.plot([r], [v], marker="o", color="tab:green" if ok else "tab:red", linestyle="none")
        if key in doc["slos"]:
            limit = doc["slos"][key]
            ax.axhline(limit, color="tab:red", linestyle="--",
                       label=f"SLO {limit:g}" if attainment is None else f"each request's limit {limit:g}")
        if key == "attainment":
            ax.axhline(attainment, color="tab:red", linestyle="--", label=f"SLO attainment {100 * attainment:.4g}%")
        if capacity is not None:
            ax.axvline(capacity, color="black", linestyle=":", label=f"capacity {capacity:.3g} {unit}")
        ax.set_xscale("log", base=2)
        ax.set_xlim(*span)
        ax.set_xlabel("request rate (requests/s)" if x == "rate" else "concurrent clients")
        ax.set_ylabel(PANEL_LABELS.get(key, key))
        ax.grid(alpha=0.3)
        legend(ax, fontsize=8)
    fig.suptitle(f"capacity search (green: meets the SLOs, red: misses)\n{title}", fontsize=10)
    fig.tight_layout()
    paths["capacity_plot"] = out_dir / "capacity.png"
    fig.savefig(paths["capacity_plot"], dpi=100)
    plt.close(fig)
    paths["report"] = out_dir / "report.html"
    paths["report"].write_text(capacity_report(json_safe(doc), {"capacity_plot": paths["capacity_plot"]},
                                               f"Capacity: {title}"))
    return paths
