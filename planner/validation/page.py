"""A validation's report.html: the verdict, simulated against measured with the simulated 90% interval, the plots.

Built from comparison.json's document with the shared HTML pieces of
planner/report/html.py, so the page shows exactly what the JSON holds.
"""
from __future__ import annotations

from pathlib import Path

from planner.report.html import DEFINITIONS, bullet_list, esc, fmt, image, page, table, verdict_box

PLOTS = ("timeline.png", "latency_cdf.png", "step_errors.png")


def _error(x) -> str:
    return "-" if x is None else f"{x:+.1%}"


def _inside(row: dict) -> str:
    if row.get("inside_interval") is None:
        return "-"
    return "yes" if row["inside_interval"] else f"no ({_error(row.get('interval_miss'))})"


def _spread_note(doc: dict) -> str:
    spread = doc.get("simulated_spread")
    if not spread:
        return "<p>No simulated interval (no timing noise to draw from, or --seeds 0).</p>"
    seeds = spread["seeds"]
    return (f"<p>90% interval: the 5th to 95th percentile over {len(seeds)} simulations of the same trace with "
            f"the profile's timing noise (seeds {seeds[0]}-{seeds[-1]}; {spread['wall_s']:.1f} s on "
            f"{spread['workers']} worker(s)). When the measurement is outside it, the nearest edge's error "
            f"is shown (same sign as the error column).</p>")


def validation_page(doc: dict, folder: Path, title: str) -> Path:
    """Write report.html into `folder` (beside report.md and the plots) and return its path."""
    verdict = doc["verdict"]
    rows = [[name, fmt(r["measured"]), fmt(r["simulated"]), _error(r["relative_error"]),
             "-" if r.get("interval_low") is None else f"{fmt(r['interval_low'])} - {fmt(r['interval_high'])}",
             _inside(r)]
            for name, r in doc["comparison"].items()]
    body = [verdict_box(verdict["lines"], bad=not verdict["within_targets"]),
            "<h2>Simulated against measured</h2>",
            table(["metric", "measured", "simulated", "error", "simulated 90% interval", "measured in it"], rows),
            _spread_note(doc),
            f"<p>Cost model: <code>{esc(doc.get('cost_model'))}</code>; kernels <code>{esc(doc.get('kernels'))}"
            f"</code>; {fmt(doc.get('num_gpu_blocks'))} KV blocks of {fmt(doc.get('block_size'))} tokens.</p>"]
    if doc.get("warnings"):
        body += ["<h2>Warnings</h2>", bullet_list(doc["warnings"], "warn")]
    for name in PLOTS:
        if (folder / name).is_file():
            body += [f"<h2>{esc(name[:-4].replace('_', ' '))}</h2>", image(folder / name, name)]
    body += ["<h2>Metric definitions</h2>", bullet_list([f"{k}: {d}" for k, d in DEFINITIONS.items()])]
    path = folder / "report.html"
    path.write_text(page(title, body))
    return path
