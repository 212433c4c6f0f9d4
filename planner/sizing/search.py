"""The configuration search: capacity under the SLOs and cost for every point of a grid.

Each configuration (GPU, TP, block size, max_num_seqs) gets a capacity search
(planner/sizing/capacity.py: bracket the rate, then bisect) on the same
seeded workload, and a price: the GPU's $/GPU-hour times TP. With a target
rate the best configuration is the cheapest whose capacity reaches it; with
`max` it is the one that serves the most requests per second per dollar-hour.
Configurations that cannot run at all (the model does not fit, TP the model
cannot split) stay in the table with the reason.

Neighbouring configurations have similar capacities, so the grid is searched
in waves of families (`family_waves`; a family is one GPU, TP and
max_num_seqs with every block size). First the smallest TP's middle
max_num_seqs of each GPU, from scratch; then the larger TPs, then the other
max_num_seqs, one step at a time, each starting from the bracket its neighbour
found, extrapolated along the way (capacity.py's hint, `family_hint`).
Within a family the middle block size goes first and the others start from its
bracket, replaying its runs wherever the KV cache provably never constrained
them (probe.py's SharedRuns). Probes stop as soon as their verdict is certain.
Within a wave the families are independent (the executor runs them in
parallel) and hints come only from earlier waves, so results do not depend on
the executor or the number of workers. `plain` searches each configuration
from scratch with `planner capacity`'s own probes: the reference the fast
search is tested against.
"""
from __future__ import annotations

import csv
import io
import itertools
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

from planner.errors import PlannerError
from planner.sizing.capacity import Hint, search_capacity
from planner.sizing.prices import Price, price_table
from planner.sizing.probe import Prober, SharedRuns
from planner.documents import SCHEMA_VERSION
from planner.runs.pipeline import Simulation
from planner.runs.spec import RunSpec
from planner.sizing.capacity import find_capacity, find_concurrency

CSV_COLUMNS = ("gpu", "tp", "block_size", "max_num_seqs", "capacity", "first_miss", "bounded", "cost_per_hour",
               "capacity_per_dollar", "meets_target", "pareto", "probes", "ttft_p99", "tpot_p99",
               "normalized_latency", "note")
Config = tuple[str, int, int, int]      # (gpu, tp, block_size, max_num_seqs)


@dataclass(frozen=True)
class SearchGrid:
    """What to search: a base run (every deployment setting but the grid's four, and the load), the
    SLOs, and the grid of GPUs, TP sizes, block sizes and batch limits."""

    base: RunSpec
    slos: dict[str, float]
    gpus: tuple[str, ...]
    tps: tuple[int, ...] = (1,)
    block_sizes: tuple[int, ...] = (16,)
    max_num_seqs: tuple[int, ...] = (256,)
    target_rate: float | None = None     # None: "max", the most capacity per dollar
    clients: bool = False                # capacity in concurrent clients (a closed loop), target_rate in clients
    tolerance: float = 0.05              # relative width of the capacity bracket
    max_rate: float = 256.0
    plain: bool = False                  # every configuration from scratch, full probes (the reference)

    def configs(self) -> list[Config]:
        return list(itertools.product(self.gpus, self.tps, self.block_sizes, self.max_num_seqs))


@dataclass(frozen=True)
class ConfigTask:
    """One configuration, as plain values a worker process or Ray task can take."""

    grid: SearchGrid
    gpu: str
    tp: int
    block_size: int
    max_num_seqs: int

    def spec(self) -> RunSpec:
        return self.grid.base.with_deployment(gpu=self.gpu, tp=self.tp, block_size=self.block_size,
                                              max_num_seqs=self.max_num_seqs)


@dataclass(frozen=True)
class FamilyTask:
    """The configurations of one GPU, TP and max_num_seqs, every block size: one unit of work.

    The first block size starts from `hint` (the bracket of the neighbouring
    max_num_seqs), the others from the first one's bracket, and they share the
    runs the KV cache did not constrain (planner/sizing/probe.py)."""

    grid: SearchGrid
    gpu: str
    tp: int
    max_num_seqs: int
    block_sizes: tuple[int, ...]         # the first one is searched first
    hint: Hint | None = None

    def configs(self) -> list[ConfigTask]:
        return [ConfigTask(self.grid, self.gpu, self.tp, b, self.max_num_seqs) for b in self.block_sizes]


def _row(task: ConfigTask) -> dict:
    return {"gpu": task.gpu, "tp": task.tp, "block_size": task.block_size, "max_num_seqs": task.max_num_seqs,
            "capacity": None, "first_miss": None, "bounded": True, "probes": 0, "simulations": 0,
            "early_stops": 0, "ttft_p99": None, "tpot_p99": None, "normalized_latency": None, "note": ""}


def _limits(g: SearchGrid) -> dict:
    start = min(max(g.target_rate or 1.0, 0.01), g.max_rate)
    return dict(start=start, min_rate=min(0.01, start), max_rate=g.max_rate, rel_tol=g.tolerance)


def _fill(row: dict, g: SearchGrid, rate: float | None, doc: dict | None, bounded: bool,
          rates: list[tuple[float, bool]]) -> dict:
    row["probes"] = len(rates)
    row["bounded"] = bounded
    row["first_miss"] = min((r for r, ok in rates if not ok and (rate is None or r > rate)), default=None)
    if rate is None:
        row["note"] = f"misses the SLOs even at {rates[-1][0]:.3g} {'clients' if g.clients else 'req/s'}"
        return row
    row["capacity"] = rate
    for name in ("ttft_p99", "tpot_p99", "normalized_latency"):
        row[name] = doc.get(name)
    if not bounded:
        row["note"] = ("still within the SLOs at the most clients tried" if g.clients else
                       f"still within the SLOs at {g.max_rate:g} req/s (the highest rate tried)")
    return row


def _prepared(task: ConfigTask, row: dict) -> Simulation | None:
    """The task's simulation, prepared; None with the reason in the row when the configuration cannot run."""
    try:
        return Simulation.prepare(task.spec())
    except (PlannerError, ValueError) as exc:
        row["note"] = str(exc).splitlines()[0]
        return None


def evaluate(task: ConfigTask) -> dict:
    """The reference: one configuration's capacity by `planner capacity`'s own search, from scratch,
    every probe a full simulation with the full analysis."""
    g, row = task.grid, _row(task)
    if _prepared(task, row) is None:
        return row
    found = find_capacity(task.spec(), g.slos, **_limits(g))
    row["simulations"] = len(found.probes)
    return _fill(row, g, found.rate, found.doc, found.bounded, [(p.rate, p.ok) for p in found.probes])


def evaluate_clients(task: ConfigTask) -> dict:
    """One configuration's capacity in concurrent clients (`planner capacity --concurrency max`'s search)."""
    g, row = task.grid, _row(task)
    if _prepared(task, row) is None:
        return row
    found = find_concurrency(task.spec(), g.slos)
    row["simulations"] = len(found.probes)
    return _fill(row, g, found.rate, found.doc, found.bounded, [(p.rate, p.ok) for p in found.probes])


def evaluate_family(task: FamilyTask) -> list[dict]:
    """Capacities of a family's configurations (runs in a worker), in `block_sizes` order."""
    g = task.grid
    if g.clients:
        return [evaluate_clients(config) for config in task.configs()]
    if g.plain:
        return [evaluate(config) for config in task.configs()]
    rows, probers = [], {}
    for config in task.configs():
        row = _row(config)
        simulation = _prepared(config, row)
        if simulation is not None:
            probers[config.block_size] = Prober(simulation, g.slos)
        rows.append(row)
    shared = SharedRuns(probers)
    first = None                         # the bracket of the first block size searched
    for config, row in zip(task.configs(), rows):
        if config.block_size not in probers:
            continue
        found = search_capacity(shared.prober(config.block_size), hint=first or task.hint, **_limits(g))
        row["simulations"] = sum(p.shared_from is None for p in found.probes)
        row["early_stops"] = sum(p.stopped_early and p.shared_from is None for p in found.probes)
        _fill(row, g, found.rate, found.doc, found.bounded, [(p.rate, p.ok) for p in found.probes])
        first = first or found.hint()
    return rows


Family = tuple[str, int, int]            # (gpu, tp, max_num_seqs)


def _block_order(grid: SearchGrid) -> tuple[int, ...]:
    """The middle block size first (the one the others start from), then the rest in grid order."""
    blocks = sorted(grid.block_sizes)
    middle = blocks[len(blocks) // 2]
    return (middle, *[b for b in grid.block_sizes if b != middle])


def hint_parent(grid: SearchGrid, family: Family) -> Family | None:
    """The family whose bracket this one starts from: one step closer to the middle max_num_seqs;
    at the middle one, the next smaller TP; None for the smallest TP's middle (searched from scratch)."""
    gpu, tp, max_num_seqs = family
    seqs, tps = sorted(grid.max_num_seqs), sorted(grid.tps)
    centre, i = len(seqs) // 2, seqs.index(max_num_seqs)
    if i != centre:
        return gpu, tp, seqs[i + (1 if i < centre else -1)]
    j = tps.index(tp)
    return None if j == 0 else (gpu, tps[j - 1], max_num_seqs)


def family_waves(grid: SearchGrid) -> list[list[FamilyTask]]:
    """The families in waves, each after the one holding its `hint_parent`: the smallest TP's
    middle max_num_seqs of each GPU first, from scratch; then the larger TPs, one at a time;
    then, from each, the other max_num_seqs, one step at a time. The plain search: one wave."""
    order = _block_order(grid)
    families = [(g, tp, m) for g, tp in itertools.product(grid.gpus, grid.tps) for m in grid.max_num_seqs]
    if grid.plain:
        return [[FamilyTask(grid, *f, order) for f in families]]

    def depth(family: Family) -> int:
        parent = hint_parent(grid, family)
        return 0 if parent is None else 1 + depth(parent)

    depths = {f: depth(f) for f in families}
    return [[FamilyTask(grid, *f, order) for f in families if depths[f] == d]
            for d in range(max(depths.values()) + 1)]


def family_hint(grid: SearchGrid, family: FamilyTask, found: dict[Config, dict]) -> Hint | None:
    """Where a family's search starts: its parent's bracket, moved by how capacity changed over
    the previous step in the same direction (capacity changes with TP and max_num_seqs at a slowly
    changing rate until memory or compute caps it); a first step in TP guesses it scales with TP."""
    key = (family.gpu, family.tp, family.max_num_seqs)
    parent = None if grid.plain else hint_parent(grid, key)
    if parent is None:
        return None

    def row(f: Family) -> dict:
        return found[f[0], f[1], family.block_sizes[0], f[2]]

    near = row(parent)
    if not near["probes"]:
        return None                      # it could not run: nothing to go by
    if near["capacity"] is None:
        return Hint(None, near["first_miss"])
    grandparent = hint_parent(grid, parent)
    along_tp = parent[1] != key[1]
    same_direction = grandparent is not None and (grandparent[1] != parent[1]) == along_tp
    scale = key[1] / parent[1] if along_tp else 1.0
    if same_direction and near["bounded"] and row(grandparent)["capacity"]:
        scale = near["capacity"] / row(grandparent)["capacity"]
    bad = near["first_miss"]
    return Hint(near["capacity"] * scale, None if bad is None else bad * scale)


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
        g, load = self.grid, self.grid.base.load
        return {"schema_version": SCHEMA_VERSION, "best": best, "configs": self.configs,
                "target_rate": g.target_rate if g.target_rate is not None else "max",
                "capacity_unit": "clients" if g.clients else "req/s",
                "slos": g.slos, "model": g.base.deployment.model, "workload": load.workload,
                "duration": load.duration, "requests": load.requests, "seed": load.seed,
                "deployment": g.base.deployment.as_dict(), "tolerance": g.tolerance,
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
    total = len(grid.configs())
    if not total:
        raise PlannerError("the grid is empty")
    started = time.perf_counter()
    done = 0

    def report(i: int, rows: list[dict]) -> None:
        nonlocal done
        for row in rows:
            done += 1
            if on_done is not None:
                on_done(row, done, total)

    found: dict[Config, dict] = {}
    for wave in family_waves(grid):
        tasks = []
        for family in wave:
            tasks.append(replace(family, hint=family_hint(grid, family, found)))
        for family, rows in zip(tasks, executor.map(evaluate_family, tasks, report)):
            for row in rows:
                found[row["gpu"], row["tp"], row["block_size"], row["max_num_seqs"]] = row
    rows = [found[config] for config in grid.configs()]
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
    ax.set_title(f"{result.grid.base.deployment.model}, {result.grid.base.load.workload}: capacity under {slos}",
                 fontsize=10)
    ax.set_xlabel("cost ($/hour, on-demand list price)")
    ax.set_ylabel("capacity (requests/s within the SLOs)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
