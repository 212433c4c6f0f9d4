"""The plots of run, sweep and capacity reports: latency CDFs, the timeline, KV use, metrics against a setting."""
from __future__ import annotations

from pathlib import Path

from engine.core.metrics import RequestRecord, StepRecord
from planner.analysis.verdict import FULL_FREE_SHARE, queue_series

BREAKDOWN_PARTS = ("token_states", "reserved", "internal_fragmentation", "external_fragmentation", "free")
_BREAKDOWN_COLORS = ("tab:green", "tab:orange", "tab:red", "tab:purple", "lightgray")


def pyplot():
    """matplotlib's pyplot on the Agg backend (slow to import: only a report needs it)."""
    import matplotlib

    matplotlib.use("Agg")   # no display: runs on servers and in CI
    import matplotlib.pyplot as plt

    return plt


def legend(ax, **kwargs) -> None:
    """`ax`'s legend, if anything on it has a label (matplotlib warns on an empty one: a run with nothing to draw,
    say no request finished, would print that warning)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kwargs)


def _cdf(ax, values: list[float], label: str, slos: dict[str, float], prefix: str, missing: str) -> None:
    """The CDF of `values` on `ax`, or where there are none, `missing` in their place (not blank axes)."""
    xs = sorted(values)
    if xs:
        ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))])
    else:
        ax.text(0.5, 0.5, missing, ha="center", va="center", transform=ax.transAxes, color="gray")
    for name, limit in slos.items():
        if name.startswith(prefix):
            ax.axvline(limit, color="tab:red", linestyle="--", label=f"SLO {name} <= {limit:g}")
            legend(ax, loc="lower right", fontsize=8)
    ax.set_xlabel(label)
    ax.set_ylabel("fraction of requests")
    ax.grid(alpha=0.3)


def plot_latency_cdfs(plt, records: list[RequestRecord], path: Path, title: str = "",
                       slos: dict[str, float] | None = None) -> Path:
    done = [r for r in records if r.completed]
    slos = slos or {}
    none = "no request completed"
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    _cdf(axes[0][0], [r.ttft for r in done], "TTFT (s)", slos, "ttft", none)
    _cdf(axes[0][1], [t for r in done if (t := r.tpot) is not None], "TPOT (s)", slos, "tpot",
         "no completed request had a second output token" if done else none)
    _cdf(axes[1][0], [r.e2e for r in done], "end-to-end latency (s)", slos, "e2e", none)
    _cdf(axes[1][1], [r.normalized_latency for r in done], "normalized latency (s/token)", slos, "normalized", none)
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
    legend(queue, loc="upper left", fontsize=8)
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
    legend(batch, loc="upper left", fontsize=8)
    total = kv_slots or 1
    t, used, tokens = _thin(times, [(s.token_states + s.reserved + s.internal_fragmentation) / total for s in steps],
                            [s.token_states / total for s in steps])
    kv.plot(t, tokens, linewidth=0.6, label="token states")
    kv.plot(t, used, linewidth=0.6, label="allocated")
    kv.axhline(1 - FULL_FREE_SHARE, color="tab:red", linestyle=":", label="full (< 5% free)")
    kv.set_ylabel("fraction of KV slots")
    kv.set_xlabel("simulated time (s)")
    kv.set_ylim(0, 1.05)
    legend(kv, loc="upper left", fontsize=8)
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
    legend(ax, loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


AXIS_LABELS = {"rate": "request rate (requests/s)", "concurrency": "concurrent clients", "block_size": "KV block size (tokens)",
               "allocator": "KV allocator"}
PANEL_LABELS = {"normalized_latency": "normalized latency (s/token)", "request_throughput": "throughput (req/s)",
                "ttft_p99": "TTFT p99 (s)", "tpot_p99": "TPOT p99 (s)", "e2e_p99": "E2E p99 (s)",
                "e2e_mean": "E2E mean (s)", "ttft_mean": "TTFT mean (s)", "tpot_mean": "TPOT mean (s)",
                "attainment": "requests within every SLO (share)"}


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
            legend(ax, fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
