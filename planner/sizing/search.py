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
import math
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

from engine.core.metrics import slo_attainment
from planner.deploy import checks
from planner.deploy.plan import resolved
from planner.errors import PlannerError
from planner.sizing.bracket import lowest_rate
from planner.sizing.capacity import Hint, capacity_limits, search_capacity
from planner.sizing.prices import Price, price_table
from planner.sizing.probe import Probe, Prober, SharedRuns
from planner.documents import SCHEMA_VERSION
from planner.runs.pipeline import Simulation
from planner.report.plots import legend
from planner.runs.spec import RunSpec
from planner.sizing.capacity import find_capacity, find_concurrency
from planner.sizing.speculation import speculation_pays

CSV_COLUMNS = ("gpu", "tp", "block_size", "max_num_seqs", "capacity", "first_miss", "bounded", "cost_per_hour",
               "capacity_per_dollar", "meets_target", "pareto", "probes", "ttft_p99", "tpot_p99",
               "normalized_latency", "note")
Config = tuple                          # (gpu, tp, block_size, max_num_seqs), and replicas in a fleet search
# A fleet search's CSV: the replica count after max_num_seqs; with --replicas auto, no capacity (every fleet
# serves the target) but the count that missed below it and how close the fleet runs to its SLOs.
FLEET_CSV_COLUMNS = CSV_COLUMNS[:4] + ("replicas",) + CSV_COLUMNS[4:]
LAYOUT_COLUMNS = ("dp", "enable_expert_parallel")     # a MoE layout's, after tp (planner/sizing/layouts.py)
AUTO_CSV_COLUMNS = ("gpu", "tp", "block_size", "max_num_seqs", "replicas", "missed_at_replicas", "cost_per_hour",
                    "meets_target", "pareto", "probes", "slo_use", "ttft_p99", "tpot_p99", "normalized_latency",
                    "note")
MAX_REPLICAS = 1024
# A row's max_num_seqs as the policy resolved it on the configuration's GPU, while the row is keyed by None.
RESOLVED_SEQS = "resolved_max_num_seqs"


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
    # A fleet search (the router is base.fleet's): None, every configuration one deployment (as before
    # fleets); a tuple, every configuration that many replicas each (an axis of the grid); "auto", the
    # fewest replicas of each configuration that meet the SLOs at target_rate.
    replicas: tuple[int, ...] | str | None = None
    max_replicas: int = MAX_REPLICAS     # --replicas auto: the most replicas tried

    def __post_init__(self) -> None:
        """The GPUs by their catalog names, once each (`a100` is a100-40g, priced under that name), and every
        value of the grid checked as `simulate` checks it: a bad one is one line before any probe runs, not
        a configuration that fails."""
        object.__setattr__(self, "gpus", tuple(dict.fromkeys(checks.gpu(name).name for name in self.gpus)))
        deployment = self.base.deployment
        for name, values in (("tp", self.tps), ("block_size", self.block_sizes), ("max_num_seqs", self.max_num_seqs)):
            for value in values:
                if value is not None:
                    replace(deployment, **{name: value})    # Deployment's own checks: a ValueError naming it

    @property
    def fleet(self) -> bool:
        return self.replicas is not None

    @property
    def auto(self) -> bool:
        return self.replicas == "auto"

    @property
    def router(self) -> str:
        """The router of the grid's fleets of two or more replicas (a lone deployment of dp ranks balances them
        with vLLM's own, which is not the fleet's router)."""
        return replace(self.base.fleet, replicas=2).router_for(self.base.deployment)

    def configs(self) -> list[Config]:
        if self.fleet and not self.auto:
            return list(itertools.product(self.gpus, self.tps, self.block_sizes, self.max_num_seqs, self.replicas))
        return list(itertools.product(self.gpus, self.tps, self.block_sizes, self.max_num_seqs))


@dataclass(frozen=True)
class ConfigTask:
    """One configuration, as plain values a worker process or Ray task can take."""

    grid: SearchGrid
    gpu: str
    tp: int
    block_size: int
    max_num_seqs: int | None              # None: the policy's default on this GPU
    replicas: int | None = None          # a fleet of this many replicas (None: the base's own fleet)

    def spec(self) -> RunSpec:
        spec = self.grid.base.with_deployment(gpu=self.gpu, tp=self.tp, block_size=self.block_size,
                                              max_num_seqs=self.max_num_seqs)
        return spec if self.replicas is None else spec.with_fleet(replicas=self.replicas)


@dataclass(frozen=True)
class FamilyTask:
    """The configurations of one GPU, TP and max_num_seqs, every block size: one unit of work.

    The first block size starts from `hint` (the bracket of the neighbouring
    max_num_seqs), the others from the first one's bracket, and they share the
    runs the KV cache did not constrain (planner/sizing/probe.py)."""

    grid: SearchGrid
    gpu: str
    tp: int
    max_num_seqs: int | None
    block_sizes: tuple[int, ...]         # the first one is searched first
    hint: Hint | None = None
    replicas: int | None = None          # a fleet search's replica count (None: --replicas auto, or no fleet)

    def configs(self) -> list[ConfigTask]:
        return [ConfigTask(self.grid, self.gpu, self.tp, b, self.max_num_seqs, self.replicas)
                for b in self.block_sizes]


def _row(task: ConfigTask) -> dict:
    row = {"gpu": task.gpu, "tp": task.tp, "block_size": task.block_size, "max_num_seqs": task.max_num_seqs}
    if task.grid.fleet:
        row["replicas"] = task.replicas
        d = task.grid.base.deployment          # a fleet search's one layout, said on each row (as a layout row's)
        if d.dp > 1 or d.enable_expert_parallel:
            row.update(dp=d.dp, enable_expert_parallel=d.enable_expert_parallel)
    row.update({"capacity": None, "first_miss": None, "bounded": True, "probes": 0, "simulations": 0,
                "early_stops": 0, "ttft_p99": None, "tpot_p99": None, "normalized_latency": None, "note": ""})
    return row


def row_key(grid: SearchGrid, row: dict) -> Config:
    """A row's configuration, as `SearchGrid.configs` names it."""
    key = (row["gpu"], row["tp"], row["block_size"], row["max_num_seqs"])
    return key + (row["replicas"],) if grid.fleet and not grid.auto else key


def _max_rate(g: SearchGrid, replicas: int | None = None) -> float:
    """The highest rate a configuration's search tries: --max-rate per replica in a fleet search."""
    return g.max_rate * (replicas or 1)


def _limits(g: SearchGrid, replicas: int | None = None) -> dict:
    top = _max_rate(g, replicas)
    start = min(max(g.target_rate or float(replicas or 1), 0.01), top)
    return dict(start=start, min_rate=lowest_rate(start), max_rate=top, rel_tol=g.tolerance)


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
                       f"still within the SLOs at {_max_rate(g, row.get('replicas')):g} req/s (the highest "
                       f"rate tried)")
    return row


def _prepared(task: ConfigTask, row: dict) -> Simulation | None:
    """The task's simulation, prepared; None with the reason in the row when the configuration cannot run."""
    try:
        simulation = Simulation.prepare(task.spec())
    except (PlannerError, ValueError) as exc:
        row["note"] = str(exc).splitlines()[0]
        return None
    if task.max_num_seqs is None:        # the policy's default for this GPU: say which it was
        row[RESOLVED_SEQS] = simulation.plan.deployment.max_num_seqs
    return simulation


def _resolved(row: dict) -> dict:
    """The row as shown: a configuration that left max_num_seqs to the policy names the value it resolved to
    (while the search runs, rows are keyed by the configuration, where it is None)."""
    if row["max_num_seqs"] is not None or RESOLVED_SEQS not in row:
        return row
    shown = {name: value for name, value in row.items() if name != RESOLVED_SEQS}
    shown["max_num_seqs"] = row[RESOLVED_SEQS]
    return shown


def evaluate(task: ConfigTask) -> dict:
    """The reference: one configuration's capacity by `planner capacity`'s own search, from scratch,
    every probe a full simulation with the full analysis."""
    g, row = task.grid, _row(task)
    if _prepared(task, row) is None:
        return row
    found = find_capacity(task.spec(), g.slos, **_limits(g, task.replicas))
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
    if g.auto:
        return [fewest_replicas(config) for config in task.configs()]
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
        found = search_capacity(shared.prober(config.block_size), hint=first or task.hint,
                                **_limits(g, task.replicas))
        row["simulations"] = sum(p.shared_from is None for p in found.probes)
        row["early_stops"] = sum(p.stopped_early and p.shared_from is None for p in found.probes)
        _fill(row, g, found.rate, found.doc, found.bounded, [(p.rate, p.ok) for p in found.probes])
        first = first or found.hint()
    return rows


Family = tuple                           # (gpu, tp, max_num_seqs), and replicas in a fleet search's grid


def fewest_replicas(task: ConfigTask) -> dict:
    """--replicas auto: the fewest replicas of one configuration that meet the SLOs at the target rate.
    Double from one replica until a fleet meets them, then bisect between the last count that missed and
    the first that met; each probe is a fleet simulation at the target rate (stopped as soon as its
    verdict is certain). The row says the count (None: not even `max_replicas`) and the count below it
    found to miss."""
    g, row = task.grid, _row(task)
    row.update(replicas=None, missed_at_replicas=None, slo_use=None)
    simulation = _prepared(task, row)
    if simulation is None:
        return row
    rate = g.target_rate
    probes: dict[int, Probe] = {}

    def ok(k: int) -> bool:
        fleet = replace(simulation, spec=simulation.spec.with_fleet(replicas=k))
        probes[k] = Prober(fleet, g.slos)(rate)
        row["simulations"] += 1
        row["early_stops"] += probes[k].stopped_early
        return probes[k].ok

    good, bad = None, 0                  # the fewest found to meet; the most found to miss
    k = 1
    while good is None:
        if ok(k):
            good = k
        elif k >= g.max_replicas:
            break
        else:
            bad, k = k, min(2 * k, g.max_replicas)
    row["probes"] = len(probes)
    if good is None:
        row["note"] = f"misses the SLOs at {rate:g} req/s even with {g.max_replicas} replicas"
        return row
    while good - bad > 1:
        middle = (good + bad) // 2
        good, bad = (middle, bad) if ok(middle) else (good, middle)
    row["probes"] = len(probes)
    doc = probes[good].doc
    row.update(replicas=good, missed_at_replicas=bad or None)
    for name in ("ttft_p99", "tpot_p99", "normalized_latency"):
        row[name] = doc.get(name)
    row["slo_use"] = slo_use(doc, g.slos, g.base.slo_attainment)
    return row


def slo_use(doc: dict, slos: dict[str, float], attainment: float | None = None) -> float | None:
    """How close a run came to its SLOs: the largest metric / limit (<= 1 meets them all); judged by an SLO
    attainment A, the share of requests that missed a limit over the 1 - A allowed."""
    if attainment is not None:
        share = slo_attainment(doc)
        if share is None:
            return None
        return (1 - share) / (1 - attainment) if attainment < 1 else (0.0 if share == 1 else math.inf)
    uses = [doc[name] / limit for name, limit in slos.items() if doc.get(name) is not None and limit > 0]
    return max(uses, default=None)


def _block_order(grid: SearchGrid) -> tuple[int, ...]:
    """The middle block size first (the one the others start from), then the rest in grid order."""
    blocks = sorted(grid.block_sizes)
    middle = blocks[len(blocks) // 2]
    return (middle, *[b for b in grid.block_sizes if b != middle])


def hint_parent(grid: SearchGrid, family: Family) -> Family | None:
    """The family whose bracket this one starts from: one step closer to the middle max_num_seqs;
    at the middle one, the next smaller TP; None for the smallest TP's middle (searched from scratch)."""
    gpu, tp, max_num_seqs, *fleet = family
    seqs, tps = sorted(grid.max_num_seqs), sorted(grid.tps)
    centre, i = len(seqs) // 2, seqs.index(max_num_seqs)
    if i != centre:
        return gpu, tp, seqs[i + (1 if i < centre else -1)], *fleet
    j = tps.index(tp)
    if j:
        return gpu, tps[j - 1], max_num_seqs, *fleet
    if fleet:                            # the smallest TP of a fleet: from the next fewer replicas
        counts = sorted(grid.replicas)
        n = counts.index(fleet[0])
        return None if n == 0 else (gpu, tp, max_num_seqs, counts[n - 1])
    return None


def family_waves(grid: SearchGrid) -> list[list[FamilyTask]]:
    """The families in waves, each after the one holding its `hint_parent`: the smallest TP's
    middle max_num_seqs of each GPU first, from scratch; then the larger TPs, one at a time;
    then, from each, the other max_num_seqs, one step at a time. The plain search: one wave."""
    order = _block_order(grid)
    if grid.fleet and not grid.auto:
        families = [(g, tp, m, k) for g, tp in itertools.product(grid.gpus, grid.tps) for m in grid.max_num_seqs
                    for k in grid.replicas]
        make = lambda f: FamilyTask(grid, *f[:3], order, replicas=f[3])   # noqa: E731
    else:
        families = [(g, tp, m) for g, tp in itertools.product(grid.gpus, grid.tps) for m in grid.max_num_seqs]
        make = lambda f: FamilyTask(grid, *f, order)                       # noqa: E731
    if grid.plain or grid.auto:          # --replicas auto: every configuration counts from one replica
        return [[make(f) for f in families]]

    def depth(family: Family) -> int:
        parent = hint_parent(grid, family)
        return 0 if parent is None else 1 + depth(parent)

    depths = {f: depth(f) for f in families}
    return [[make(f) for f in families if depths[f] == d] for d in range(max(depths.values()) + 1)]


def family_hint(grid: SearchGrid, family: FamilyTask, found: dict[Config, dict]) -> Hint | None:
    """Where a family's search starts: its parent's bracket, moved by how capacity changed over
    the previous step in the same direction (capacity changes with TP and max_num_seqs at a slowly
    changing rate until memory or compute caps it); a first step in TP guesses it scales with TP, and a
    first step in a fleet's replicas that it scales with the replica count."""
    key = (family.gpu, family.tp, family.max_num_seqs)
    if family.replicas is not None:
        key += (family.replicas,)
    parent = None if grid.plain or grid.auto else hint_parent(grid, key)
    if parent is None:
        return None

    def row(f: Family) -> dict:
        return found[(f[0], f[1], family.block_sizes[0], f[2], *f[3:])]

    def axis(a: Family, b: Family) -> int:
        return next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)

    near = row(parent)
    if not near["probes"]:
        return None                      # it could not run: nothing to go by
    if near["capacity"] is None:
        return Hint(None, near["first_miss"])
    grandparent = hint_parent(grid, parent)
    step = axis(parent, key)             # 1: TP, 2: max_num_seqs, 3: replicas
    same_direction = grandparent is not None and axis(grandparent, parent) == step
    scale = key[step] / parent[step] if step in (1, 3) else 1.0
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
    speculation: dict | None = None      # --speculative: does it pay (planner/sizing/speculation.py)

    def document(self) -> dict:
        """The --json document: best, configs, and what they were computed from."""
        best = None
        g, load = self.grid, self.grid.base.load
        if self.best is not None:
            keys = ("gpu", "tp", "block_size", "max_num_seqs", "capacity", "cost_per_hour")
            if g.auto:
                keys = ("gpu", "tp", "block_size", "max_num_seqs", "replicas", "missed_at_replicas",
                        "cost_per_hour", "slo_use")
            elif g.fleet:
                keys = keys[:4] + ("replicas",) + keys[4:]
            # with the row's pipeline stages and layout where it has them (a layout search adds its own)
            extra = [k for k in ("pp", *LAYOUT_COLUMNS) if k in self.best]
            best = {k: self.best[k] for k in (*keys, *extra)}
        fleet = {}
        if g.fleet:
            fleet = {"replicas": "auto" if g.auto else list(g.replicas),
                     "router": g.router}
            if g.auto:
                fleet["max_replicas"] = g.max_replicas
        speculation = {} if self.speculation is None else {"speculation": self.speculation}
        return {"schema_version": SCHEMA_VERSION, "best": best, **fleet, **speculation, "configs": self.configs,
                "target_rate": g.target_rate if g.target_rate is not None else "max",
                "capacity_unit": "clients" if g.clients else "req/s",
                "slos": g.slos, "slo_attainment": g.base.slo_attainment, "model": g.base.deployment.model,
                "workload": load.workload,
                "duration": load.duration, "requests": load.requests, "seed": load.seed,
                "deployment": shared_settings(g.base.deployment), "tolerance": g.tolerance,
                "prices": {gpu: asdict(p) for gpu, p in self.prices.items()},
                "executor": self.executor, "wall_time": self.wall_time}

    def columns(self) -> tuple[str, ...]:
        """configs.csv's columns: a fleet search's add the replica count, and its layout's dp and EP if any."""
        columns = AUTO_CSV_COLUMNS if self.grid.auto else FLEET_CSV_COLUMNS if self.grid.fleet else CSV_COLUMNS
        d = self.grid.base.deployment
        if self.grid.fleet and (d.dp > 1 or d.enable_expert_parallel):
            columns = columns[:2] + LAYOUT_COLUMNS + columns[2:]
        return columns

    def csv_text(self) -> str:
        out = io.StringIO()
        columns = self.columns()
        writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for row in self.configs:
            writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in columns})
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


def slo_front(rows: list[dict]) -> list[dict]:
    """--replicas auto: the fleets no other one beats on both cost and SLO use (both lower)."""
    feasible = sorted((r for r in rows if r.get("replicas") is not None and r.get("slo_use") is not None),
                      key=lambda r: (r["cost_per_hour"], r["slo_use"]))
    front, best_use = [], float("inf")
    for row in feasible:
        if row["slo_use"] < best_use:
            front.append(row)
            best_use = row["slo_use"]
    return front


def choose_best(rows: list[dict], target_rate: float | None) -> dict | None:
    feasible = [r for r in rows if r["capacity"] is not None]
    if target_rate is not None:
        meeting = [r for r in feasible if r["capacity"] >= target_rate]
        return min(meeting, key=lambda r: (r["cost_per_hour"], -r["capacity"]), default=None)
    return max(feasible, key=lambda r: (r["capacity_per_dollar"], -r["cost_per_hour"]), default=None)


def check_fleet(grid: SearchGrid) -> None:
    """A fleet search's settings, each bad one a one-line error before anything runs."""
    if grid.auto:
        if grid.clients or grid.target_rate is None:
            raise PlannerError("--replicas auto finds the fewest replicas serving a target rate: give --rate "
                               "REQUESTS_PER_S (not 'max' or --concurrency), or a list of counts, e.g. "
                               "--replicas 1,2,4")
        if isinstance(grid.max_replicas, bool) or not isinstance(grid.max_replicas, int) or grid.max_replicas < 1:
            raise PlannerError(f"--max-replicas must be a whole number >= 1, got {grid.max_replicas!r}")
    elif isinstance(grid.replicas, str) or not grid.replicas:
        raise PlannerError(f"--replicas must be 'auto' or whole numbers >= 1, got {grid.replicas!r}")
    else:
        for k in grid.replicas:
            if isinstance(k, bool) or not isinstance(k, int) or k < 1:
                raise PlannerError(f"--replicas must be whole numbers >= 1 or 'auto', got {k!r}")
    grid.base.router()                              # a bad --router


def run_search(grid: SearchGrid, executor, *, prices: dict[str, float] | None = None,
               on_done: Callable[[dict, int, int], None] | None = None) -> SearchResult:
    """Evaluate every configuration of the grid on `executor`; price and rank them."""
    if not grid.slos:
        raise PlannerError("give at least one --slo, e.g. --slo ttft_p99=2,tpot_p99=0.1")
    if grid.target_rate is not None and not grid.target_rate > 0:
        raise PlannerError(f"--rate must be > 0 requests/s or 'max', got {grid.target_rate}")
    if not 0 < grid.tolerance < 1:
        raise PlannerError(f"--tolerance must be in (0, 1), got {grid.tolerance}")
    if grid.fleet:
        check_fleet(grid)
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
                on_done(_resolved(row), done, total)

    found: dict[Config, dict] = {}
    for wave in family_waves(grid):
        tasks = []
        for family in wave:
            tasks.append(replace(family, hint=family_hint(grid, family, found)))
        for family, rows in zip(tasks, executor.map(evaluate_family, tasks, report)):
            for row in rows:
                found[row_key(grid, row)] = row
    rows = [_resolved(found[config]) for config in grid.configs()]
    if grid.base.deployment.pp > 1:           # every configuration's stages, for its label and price
        rows = [{**row, "pp": grid.base.deployment.pp} for row in rows]
    if grid.auto:
        return _rank_fewest(grid, rows, table, executor, started)
    per_tp = grid.base.deployment.pp * grid.base.deployment.dp      # GPUs for each TP rank of a row
    for row in rows:
        # A fleet costs its replicas x TP x PP x DP GPUs.
        gpus = row["tp"] * per_tp * (row["replicas"] if grid.fleet else 1)
        row["cost_per_hour"] = round(table[row["gpu"]].usd_per_gpu_hour * gpus, 4)
        row["capacity_per_dollar"] = (row["capacity"] / row["cost_per_hour"]
                                      if row["capacity"] is not None and row["cost_per_hour"] > 0 else None)
        row["meets_target"] = (row["capacity"] is not None and grid.target_rate is not None
                               and row["capacity"] >= grid.target_rate)
        row["pareto"] = False
    for row in pareto_front(rows):
        row["pareto"] = True
    best = choose_best(rows, grid.target_rate)
    return SearchResult(grid, rows, best, table, executor.name, time.perf_counter() - started,
                        speculation=_speculation(grid, best))


def _speculation(grid: SearchGrid, best: dict | None) -> dict | None:
    """With --speculative: whether it pays on the best configuration, and from which load it stops."""
    if grid.base.deployment.speculative is None or best is None or best["capacity"] is None:
        return None
    task = ConfigTask(grid, best["gpu"], best["tp"], best["block_size"], best["max_num_seqs"], best.get("replicas"))
    return speculation_pays(task.spec(), grid.slos, load=grid.target_rate or best["capacity"], clients=grid.clients,
                            limits=_limits(grid, best.get("replicas")))


def _rank_fewest(grid: SearchGrid, rows: list[dict], table: dict[str, Price], executor,
                 started: float) -> SearchResult:
    """--replicas auto: each configuration's fewest replicas priced (replicas x TP x PP x DP x $/GPU-hour); the
    best is the cheapest fleet (ties: the one furthest within its SLOs), the front cost against SLO use."""
    per_tp = grid.base.deployment.pp * grid.base.deployment.dp
    for row in rows:
        k = row["replicas"]
        gpus = row["tp"] * per_tp * (k or 0)
        row["cost_per_hour"] = None if k is None else round(table[row["gpu"]].usd_per_gpu_hour * gpus, 4)
        row["meets_target"] = k is not None
        row["pareto"] = False
    for row in slo_front(rows):
        row["pareto"] = True
    feasible = [r for r in rows if r["replicas"] is not None]
    best = min(feasible, key=lambda r: (r["cost_per_hour"], r["slo_use"] if r["slo_use"] is not None
                                        else float("inf")), default=None)
    return SearchResult(grid, rows, best, table, executor.name, time.perf_counter() - started)


GRID_AXES = ("gpu", "tp", "block_size", "max_num_seqs")
PER_GPU_DEFAULTS = ("max_num_batched_tokens",)     # vLLM's default depends on each row's GPU


def shared_settings(deployment) -> dict:
    """The settings every configuration of a search shares: the deployment without the grid's axes, vLLM's
    defaults resolved but those that depend on each row's GPU (left as given: None for the default)."""
    given = deployment.as_dict()
    return {k: (given[k] if k in PER_GPU_DEFAULTS else v) for k, v in resolved(deployment).as_dict().items()
            if k not in GRID_AXES}


def every_refused(rows: list[dict]) -> dict | None:
    """The first row when every configuration was refused before it could run (no probe: a setting that none
    of the search's GPUs and TPs admits, or a model none holds); None when any ran."""
    if rows and all(row["probes"] == 0 for row in rows):
        return rows[0]
    return None


def fleet_label(row: dict) -> str:
    """'h100-sxm x2' for one deployment (with pipeline stages 'h100-sxm x2 pp2', with dp ranks 'h100-sxm x2
    dp2 EP'), '4 x (h100-sxm x2)' for a fleet of 4 replicas."""
    one = (f"{row['gpu']} x{row['tp']}" + (f" pp{row['pp']}" if row.get("pp", 1) > 1 else "")
           + (f" dp{row['dp']}" if row.get("dp", 1) > 1 else "") + (" EP" if row.get("enable_expert_parallel") else ""))
    return one if row.get("replicas") is None else f"{row['replicas']} x ({one})"


def plot_pareto(result: SearchResult, path) -> None:
    """Cost per hour against capacity, every configuration a point, the Pareto front a line."""
    import matplotlib
    matplotlib.use("Agg")  # no display: this runs on servers and in CI
    import matplotlib.pyplot as plt

    if result.grid.auto:
        return _plot_fewest(result, path, plt)
    fleet = result.grid.fleet
    rows = [r for r in result.configs if r["capacity"] is not None]
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for gpu in result.grid.gpus:
        mine = [r for r in rows if r["gpu"] == gpu]
        if mine:
            ax.scatter([r["cost_per_hour"] for r in mine], [r["capacity"] for r in mine], s=22, alpha=0.7,
                       label=gpu)
            for r in mine if fleet else ():      # which fleet each point is: replicas x (GPU x TP)
                ax.annotate(f"{r['replicas']}x TP{r['tp']}", (r["cost_per_hour"], r["capacity"]), fontsize=6,
                            xytext=(3, 3), textcoords="offset points")
    front = pareto_front(rows)
    if front:
        ax.step([r["cost_per_hour"] for r in front], [r["capacity"] for r in front], where="post",
                color="black", linewidth=1, label="Pareto front")
    if result.grid.target_rate is not None:
        ax.axhline(result.grid.target_rate, color="gray", linestyle="--", linewidth=1, label="target rate")
    if result.best is not None:
        b = result.best
        ax.scatter([b["cost_per_hour"]], [b["capacity"]], s=160, facecolors="none", edgecolors="red",
                   linewidths=2, label=f"best: {fleet_label(b)}, block {b['block_size']}, "
                                        f"max seqs {b['max_num_seqs']}")
    slos = capacity_limits(result.grid.base, result.grid.slos)
    what = f"fleets ({result.grid.router} router)" if fleet else "capacity"
    ax.set_title(f"{result.grid.base.deployment.model}, {result.grid.base.load.workload}: {what} under {slos}",
                 fontsize=10)
    ax.set_xlabel("cost ($/hour, on-demand list price)")
    ax.set_ylabel("capacity (requests/s within the SLOs)")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:      # none when no configuration ran (matplotlib would warn)
        legend(ax, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_fewest(result: SearchResult, path, plt) -> None:
    """--replicas auto: every configuration's fewest replicas at the target rate, cost against the SLO
    metric they reach (the one SLO's value; with several, the largest metric / limit), the front a line."""
    g = result.grid
    rows = [r for r in result.configs if r["replicas"] is not None and r["slo_use"] is not None]
    one = len(g.slos) == 1 and g.base.slo_attainment is None
    (name, limit), = g.slos.items() if one else ((None, 1.0),)
    scale = limit if name is not None else 1.0       # SLO use x limit: the metric itself, in seconds
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for gpu in g.gpus:
        mine = [r for r in rows if r["gpu"] == gpu]
        if mine:
            ax.scatter([r["cost_per_hour"] for r in mine], [r["slo_use"] * scale for r in mine], s=22, alpha=0.7,
                       label=gpu)
        for r in mine:
            ax.annotate(f"{r['replicas']}x TP{r['tp']}", (r["cost_per_hour"], r["slo_use"] * scale), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")
    front = slo_front(rows)
    if front:
        ax.step([r["cost_per_hour"] for r in front], [r["slo_use"] * scale for r in front], where="post",
                color="black", linewidth=1, label="Pareto front")
    ax.axhline(limit if name is not None else 1.0, color="gray", linestyle="--", linewidth=1, label="SLO limit")
    if result.best is not None:
        b = result.best
        ax.scatter([b["cost_per_hour"]], [b["slo_use"] * scale], s=160, facecolors="none", edgecolors="red",
                   linewidths=2, label=f"best: {fleet_label(b)}, block {b['block_size']}, "
                                        f"max seqs {b['max_num_seqs']}")
    slos = capacity_limits(g.base, g.slos)
    router = g.router
    ax.set_title(f"{g.base.deployment.model}, {g.base.load.workload}: fewest replicas ({router} "
                 f"router) for {g.target_rate:g} req/s under {slos}", fontsize=10)
    ax.set_xlabel("fleet cost ($/hour: replicas x TP x on-demand list price)")
    use = ("share of requests missing a limit / the share allowed" if g.base.slo_attainment is not None
           else "largest metric / limit")
    ax.set_ylabel(f"{name} at {g.target_rate:g} req/s (s)" if name is not None else
                  f"SLO use at {g.target_rate:g} req/s ({use}; <= 1 meets)")
    ax.grid(True, alpha=0.3)
    legend(ax, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
