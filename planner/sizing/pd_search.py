"""`planner search --pd`: prefill/decode ratios against aggregated serving at a target rate.

For each configuration (GPU, TP) of the search's grid, at --rate R:

- aggregated: the fewest replicas meeting the SLOs (search.py's `fewest_replicas`,
  as `--replicas auto`);
- `--pd P:D,...`: each ratio simulated at R in full, so its verdict says which
  pool binds; the cheapest that meets the SLOs wins;
- `--pd auto`: the fewest prefill replicas P* that meet the SLOs with an ample
  decode pool (as many decode replicas as aggregated serving needs in all:
  decode alone needs fewer), by doubling then bisection; then the fewest decode
  replicas D* with P* (bisection); then one more prefill replica at a time
  while it lets the decode pool shrink enough to cost less (a TTFT shared by
  both pools may trade one for the other). Probes stop as soon as their verdict
  is certain; the winner and its two neighbours with one replica fewer
  ((P*-1):D* and P*:(D*-1)) are then simulated in full, so the report says
  which pool binds when each pool is one short.

A pool costs replicas x TP x its GPU's $/GPU-hour; GPUs are counted the same way,
so "the same GPU count" compares P + D replicas with aggregated replicas of one TP.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from planner.analysis.pd import which_binds
from planner.errors import PlannerError
from planner.runs.pd import Disaggregation
from planner.runs.pipeline import Simulation
from planner.runs.spec import RunSpec
from planner.sizing.probe import Prober
from planner.sizing.search import ConfigTask, SearchGrid, fewest_replicas, slo_use

MAX_POOL = 64                 # --pd auto: the most replicas tried in one pool
MAX_REFINE = 3                # --pd auto: extra prefill replicas tried against a smaller decode pool


@dataclass(frozen=True)
class PdSearch:
    """One configuration's P/D search: the base run (its deployment's GPU and TP, the load, the router, and in
    `pools` the pools' own GPU, TP and link), the SLOs, the target rate and the ratios (or "auto")."""

    base: RunSpec
    pools: Disaggregation
    slos: dict[str, float]
    rate: float
    ratios: tuple[tuple[int, int], ...] | str
    price: Callable[[str], float]            # $/GPU-hour of a GPU
    max_pool: int = MAX_POOL


class PdProbes:
    """Simulations of one configuration at the target rate: the plans and cost models prepared once."""

    def __init__(self, search: PdSearch, on_probe: Callable[[dict], None] | None = None) -> None:
        self.search, self.on_probe = search, on_probe
        spec = replace(search.base, pd=replace(search.pools, prefill=1, decode=1))
        self.simulation = Simulation.prepare(spec)
        self.rows: dict[tuple[int, int, bool], dict] = {}

    def cost(self, prefill: int, decode: int) -> float:
        pools = self.simulation.pools
        return sum(n * pool.plan.deployment.gpus * self.search.price(pool.plan.deployment.gpu)
                   for n, pool in ((prefill, pools.prefill), (decode, pools.decode)))

    def gpus(self, prefill: int, decode: int) -> int:
        pools = self.simulation.pools
        return prefill * pools.prefill.plan.deployment.gpus + decode * pools.decode.plan.deployment.gpus

    def run(self, prefill: int, decode: int, full: bool = False) -> dict:
        """The probe of P:D at the rate (full: no early stop, so the verdict can say which pool binds)."""
        key = (prefill, decode, full)
        if key in self.rows:
            return self.rows[key]
        sim = self.simulation
        pools = replace(sim.pools, prefill=replace(sim.pools.prefill, replicas=prefill),
                        decode=replace(sim.pools.decode, replicas=decode))
        spec = replace(sim.spec, pd=replace(sim.spec.pd, prefill=prefill, decode=decode))
        probe = Prober(replace(sim, spec=spec, pools=pools), self.search.slos, early_stop=not full)(self.search.rate)
        row = {"mode": "pd", "pd": f"{prefill}:{decode}", "prefill": prefill, "decode": decode,
               "gpus": self.gpus(prefill, decode), "cost_per_hour": self.cost(prefill, decode), "meets": probe.ok,
               "stopped_early": probe.stopped_early, "binds": None, "saturated": None,
               "slo_use": (None if probe.stopped_early
                           else slo_use(probe.doc, self.search.slos, spec.slo_attainment)),
               **{name: probe.doc.get(name) for name in self.search.slos},
               "note": probe.doc.get("stopped_because", "")}
        if "pd" in probe.doc:
            found = which_binds(probe.doc["pd"])
            row.update(binds=found["binds"], saturated=found["saturated"])
        self.rows[key] = row
        if not full and probe.ok:              # a met probe ran to its end: it is the full one too
            self.rows[(prefill, decode, True)] = row
        if self.on_probe is not None:
            self.on_probe(row)
        return row

    def ok(self, prefill: int, decode: int) -> bool:
        return self.run(prefill, decode)["meets"]


def fewest(ok: Callable[[int], bool], low: int, high: int) -> int | None:
    """The fewest k in [low, high] with ok(k), ok assumed monotone: doubling from `low`, then bisection."""
    bad, k = low - 1, low
    while not ok(k):
        if k >= high:
            return None
        bad, k = k, min(2 * k, high)
    good = k
    while good - bad > 1:
        middle = (good + bad) // 2
        good, bad = (middle, bad) if ok(middle) else (good, middle)
    return good


def auto_ratio(probes: PdProbes, ample: int) -> tuple[int, int] | None:
    """--pd auto's cheapest P:D (see the module), or None when even `ample` of each misses."""
    prefill = fewest(lambda p: probes.ok(p, ample), 1, probes.search.max_pool)
    if prefill is None:
        return None
    decode = fewest(lambda d: probes.ok(prefill, d), 1, ample)
    best = (prefill, decode)
    for extra in range(1, MAX_REFINE + 1):
        p = prefill + extra
        cheaper = [d for d in range(1, best[1]) if probes.cost(p, d) < probes.cost(*best)]
        if not cheaper:
            break
        d = fewest(lambda d, p=p: probes.ok(p, d), 1, cheaper[-1])
        if d is not None:
            best = (p, d)
    return best


def aggregated_row(grid: SearchGrid, gpu: str, tp: int, price: Callable[[str], float]) -> dict:
    """Aggregated serving of the same configuration: its fewest replicas at the rate."""
    d = grid.base.deployment
    row = fewest_replicas(ConfigTask(grid, gpu, tp, d.block_size, d.max_num_seqs))
    count = row["replicas"]
    gpus = None if count is None else count * d.replace(tp=tp).gpus
    return {"mode": "aggregated", "pd": None, "replicas": count, "missed_at_replicas": row["missed_at_replicas"],
            "gpus": gpus, "cost_per_hour": None if count is None else gpus * price(gpu), "meets": count is not None,
            "slo_use": row["slo_use"], "probes": row["probes"], **{n: row.get(n) for n in grid.slos},
            "note": row["note"]}


def search_config(search: PdSearch, aggregated: dict, on_probe=None) -> dict:
    """One configuration: the P/D ratios tried, the cheapest meeting the SLOs, its neighbours' binding pools,
    and aggregated serving beside it."""
    try:
        probes = PdProbes(search, on_probe)
    except PlannerError as exc:
        return {"aggregated": aggregated, "best": None, "probes": [], "neighbours": [], "note": str(exc)}
    if search.ratios == "auto":
        ample = aggregated["replicas"] or search.max_pool
        best = auto_ratio(probes, ample)
    else:
        met = [r for r in (probes.run(p, d, full=True) for p, d in search.ratios) if r["meets"]]
        cheapest = min(met, key=lambda r: (r["cost_per_hour"], r["gpus"]), default=None)
        best = None if cheapest is None else (cheapest["prefill"], cheapest["decode"])
    neighbours = []
    if best is not None:
        p, d = best
        neighbours = [probes.run(*pair, full=True) for pair in ((p, d), (p - 1, d), (p, d - 1)) if min(pair) >= 1]
    note = "" if best is not None else f"no P:D tried meets the SLOs at {search.rate:g} req/s"
    return {"aggregated": aggregated, "best": None if best is None else probes.run(*best, full=True),
            "probes": list({id(r): r for r in probes.rows.values()}.values()),
            "neighbours": neighbours, "note": note}
