"""The configuration search: capacity under the SLOs and cost for every point of a grid.

Each configuration (GPU, TP, block size, max_num_seqs) gets the capacity
search `planner capacity` runs (planner/sweep.py's `find_capacity`: bracket the
rate, then bisect), on the same seeded workload, and a price: the GPU's
$/GPU-hour times TP. With a target rate the best configuration is the
cheapest whose capacity reaches it; with `max` it is the one that serves the
most requests per second per dollar-hour. Configurations that cannot run at
all (the model does not fit, TP the model cannot split) stay in the table with
the reason.
"""
from __future__ import annotations

import csv
import io
import itertools
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Callable

from planner.errors import PlannerError
from planner.search.prices import Price, price_table
from planner.sweep import RunSpec, find_capacity

CSV_COLUMNS = ("gpu", "tp", "block_size", "max_num_seqs", "capacity", "bounded", "cost_per_hour",
               "capacity_per_dollar", "meets_target", "pareto", "probes", "ttft_p99", "tpot_p99",
               "normalized_latency", "note")


@dataclass(frozen=True)
class SearchGrid:
    """What to search: one model and workload, the SLOs, and the grid of configurations."""

    model: str
    workload: str                        # a built-in workload or a trace file
    slos: dict[str, float]
    gpus: tuple[str, ...]
    tps: tuple[int, ...] = (1,)
    block_sizes: tuple[int, ...] = (16,)
    max_num_seqs: tuple[int, ...] = (256,)
    target_rate: float | None = None     # None: "max", the most capacity per dollar
    duration: float | None = 600.0       # seconds of arrivals per probe (10 minutes)
    requests: int | None = None
    seed: int = 0
    preemption_mode: str = "recompute"
    enable_prefix_caching: bool = False
    tolerance: float = 0.05              # relative width of the capacity bracket
    max_rate: float = 256.0

    def configs(self) -> list[tuple[str, int, int, int]]:
        return list(itertools.product(self.gpus, self.tps, self.block_sizes, self.max_num_seqs))


@dataclass(frozen=True)
class ConfigTask:
    """One configuration's capacity search, as plain values a worker process or Ray task can take."""

    grid: SearchGrid
    gpu: str
    tp: int
    block_size: int
    max_num_seqs: int

    def spec(self) -> RunSpec:
        g = self.grid
        return _run_spec(model=g.model, gpu=self.gpu, tp=self.tp, workload=g.workload, duration=g.duration,
                         requests=g.requests, seed=g.seed, block_size=self.block_size,
                         max_num_seqs=self.max_num_seqs, preemption_mode=g.preemption_mode,
                         enable_prefix_caching=g.enable_prefix_caching)


def _run_spec(**values) -> RunSpec:
    """A RunSpec by the canonical knob names (older RunSpecs spell two of them differently)."""
    names = {f.name for f in fields(RunSpec)}
    older = {"preemption_mode": "preemption", "enable_prefix_caching": "prefix_caching"}
    return RunSpec(**{(k if k in names else older[k]): v for k, v in values.items()})


def evaluate(task: ConfigTask) -> dict:
    """Capacity of one configuration under the grid's SLOs (runs in a worker)."""
    g = task.grid
    row: dict = {"gpu": task.gpu, "tp": task.tp, "block_size": task.block_size, "max_num_seqs": task.max_num_seqs,
                 "capacity": None, "bounded": True, "probes": 0, "ttft_p99": None, "tpot_p99": None,
                 "normalized_latency": None, "note": ""}
    spec = task.spec()
    try:
        spec.check()
    except (PlannerError, ValueError) as exc:
        row["note"] = str(exc).splitlines()[0]
        return row
    start = min(max(g.target_rate or 1.0, 0.01), g.max_rate)
    found = find_capacity(spec, g.slos, start=start, min_rate=min(0.01, start), max_rate=g.max_rate,
                          rel_tol=g.tolerance)
    row["probes"] = len(found.probes)
    row["bounded"] = found.bounded
    if found.rate is None:
        row["note"] = f"misses the SLOs even at {found.probes[-1][0]:.3g} req/s"
        return row
    row["capacity"] = found.rate
    for name in ("ttft_p99", "tpot_p99", "normalized_latency"):
        row[name] = found.doc.get(name)
    if not found.bounded:
        row["note"] = f"still within the SLOs at {g.max_rate:g} req/s (the highest rate tried)"
    return row


@dataclass
class SearchResult:
    grid: SearchGrid
    configs: list[dict]                  # one row per configuration, in grid order
    best: dict | None                    # None: no configuration meets the target
    prices: dict[str, Price]
    executor: str
    wall_time: float = 0.0
    notes: list[str] = field(default_factory=list)

    def document(self) -> dict:
        """The --json document: best, configs, and what they were computed from."""
        best = None
        if self.best is not None:
            best = {k: self.best[k] for k in ("gpu", "tp", "block_size", "max_num_seqs", "capacity",
                                               "cost_per_hour")}
        g = self.grid
        return {"best": best, "configs": self.configs,
                "target_rate": g.target_rate if g.target_rate is not None else "max",
                "slos": g.slos, "model": g.model, "workload": g.workload, "duration": g.duration,
                "requests": g.requests, "seed": g.seed, "preemption_mode": g.preemption_mode,
                "enable_prefix_caching": g.enable_prefix_caching, "tolerance": g.tolerance,
                "prices": {gpu: asdict(p) for gpu, p in self.prices.items()},
                "executor": self.executor, "wall_time": self.wall_time}

    def csv_text(self) -> str:
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for row in self.configs:
            writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in CSV_COLUMNS})
        return out.getvalue()


def pareto_front(rows: list[dict]) -> list[dict]:
    """Configurations no other one beats on both cost (lower) and capacity (higher)."""
    feasible = sorted((r for r in rows if r["capacity"] is not None),
                      key=lambda r: (r["cost_per_hour"], -r["capacity"]))
    front, best_capacity = [], -1.0
    for row in feasible:
        if row["capacity"] > best_capacity:
            front.append(row)
            best_capacity = row["capacity"]
    return front


def choose_best(rows: list[dict], target_rate: float | None) -> dict | None:
    feasible = [r for r in rows if r["capacity"] is not None]
    if target_rate is not None:
        meeting = [r for r in feasible if r["capacity"] >= target_rate]
        return min(meeting, key=lambda r: (r["cost_per_hour"], -r["capacity"]), default=None)
    return max(feasible, key=lambda r: (r["capacity_per_dollar"], -r["cost_per_hour"]), default=None)


def run_search(grid: SearchGrid, executor, *, prices: dict[str, float] | None = None,
               on_done: Callable[[dict, int, int], None] | None = None) -> SearchResult:
    """Evaluate every configuration of the grid on `executor`; price and rank them."""
    if not grid.slos:
        raise PlannerError("give at least one --slo, e.g. --slo ttft_p99=2,tpot_p99=0.1")
    if grid.target_rate is not None and not grid.target_rate > 0:
        raise PlannerError(f"--rate must be > 0 requests/s or 'max', got {grid.target_rate}")
    if not 0 < grid.tolerance < 1:
        raise PlannerError(f"--tolerance must be in (0, 1), got {grid.tolerance}")
    table = price_table(list(grid.gpus), prices or {})
    tasks = [ConfigTask(grid, *config) for config in grid.configs()]
    if not tasks:
        raise PlannerError("the grid is empty")
    started = time.perf_counter()
    done = 0

    def report(i: int, row: dict) -> None:
        nonlocal done
        done += 1
        if on_done is not None:
            on_done(row, done, len(tasks))

    rows = executor.map(evaluate, tasks, report)
    for row in rows:
        row["cost_per_hour"] = round(table[row["gpu"]].usd_per_gpu_hour * row["tp"], 4)
        row["capacity_per_dollar"] = (row["capacity"] / row["cost_per_hour"]
                                      if row["capacity"] is not None and row["cost_per_hour"] > 0 else None)
        row["meets_target"] = (row["capacity"] is not None and grid.target_rate is not None
                               and row["capacity"] >= grid.target_rate)
        row["pareto"] = False
    for row in pareto_front(rows):
        row["pareto"] = True
    best = choose_best(rows, grid.target_rate)
    return SearchResult(grid, rows, best, table, executor.name, time.perf_counter() - started)


def plot_pareto(result: SearchResult, path) -> None:
    """Cost per hour against capacity, every configuration a point, the Pareto front a line."""
    import matplotlib
    matplotlib.use("Agg")  # no display: this runs on servers and in CI
    import matplotlib.pyplot as plt

    rows = [r for r in result.configs if r["capacity"] is not None]
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for gpu in result.grid.gpus:
        mine = [r for r in rows if r["gpu"] == gpu]
        if mine:
            ax.scatter([r["cost_per_hour"] for r in mine], [r["capacity"] for r in mine], s=22, alpha=0.7,
                       label=gpu)
    front = pareto_front(rows)
    if front:
        ax.step([r["cost_per_hour"] for r in front], [r["capacity"] for r in front], where="post",
                color="black", linewidth=1, label="Pareto front")
    if result.grid.target_rate is not None:
        ax.axhline(result.grid.target_rate, color="gray", linestyle="--", linewidth=1, label="target rate")
    if result.best is not None:
        b = result.best
        ax.scatter([b["cost_per_hour"]], [b["capacity"]], s=160, facecolors="none", edgecolors="red",
                   linewidths=2, label=f"best: {b['gpu']} x{b['tp']}, block {b['block_size']}, "
                                        f"max seqs {b['max_num_seqs']}")
    slos = ", ".join(f"{k} <= {v:g}" for k, v in result.grid.slos.items())
    ax.set_title(f"{result.grid.model}, {result.grid.workload}: capacity under {slos}", fontsize=10)
    ax.set_xlabel("cost ($/hour, on-demand list price)")
    ax.set_ylabel("capacity (requests/s within the SLOs)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
