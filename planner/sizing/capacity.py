"""The capacity search of one configuration: bracket the highest rate that meets the SLOs, then bisect.

Without a hint it is `planner capacity`'s search (planner/sizing/bracket.py): from
`start`, double (or halve) the rate until the verdict flips, then bisect until
the bracket [good, bad) is within `rel_tol` of bad.

With a hint, the bracket a similar configuration ended with (same GPU and TP,
a neighbouring block size or batch limit), the search starts there: probe the
hint's good rate, then its bad one. When the capacity has not moved, two
probes close the bracket instead of the six to ten a search from scratch
takes. When it has, the step away from the hint doubles (in log-rate) each
time, then bisection closes the bracket as before. The hint only decides
where to probe, never the answer: every bracket end is a probe of this
configuration, so the result is as sound as the search from scratch, and
where the verdict is monotone in the rate both lie within `rel_tol` of the
same capacity.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import repeat
from typing import Callable, Iterator

from engine.core.metrics import slo_attainment, slo_quantity
from planner.analysis.verdict import binding_slo, rejection_remedy, served_nothing
from planner.deploy.parallel import layout_suffix
from planner.deploy.plan import resolved
from planner.documents import SCHEMA_VERSION, json_safe
from planner.errors import PlannerError
from planner.runs.pipeline import Simulation
from planner.runs.seeds import slo_probability
from planner.runs.slos import meets
from planner.runs.sweep import document_of
from planner.runs.spec import RunSpec
from planner.sizing.bracket import bracket, check_rates
from planner.sizing.probe import LENGTHENINGS, Probe, slos_held, steady_load


@dataclass(frozen=True)
class Hint:
    good: float | None          # the hinting configuration's capacity (None: it met the SLOs at no rate)
    bad: float | None           # its lowest failing rate above that (None: it met them at its highest rate)


@dataclass
class Capacity:
    rate: float | None          # the highest rate found to meet the SLOs (None: not even the lowest)
    bad: float | None           # the lowest rate above it found to miss them (None: none did)
    probes: list[Probe]
    bounded: bool               # False: the SLOs still held at max_rate

    @property
    def doc(self) -> dict | None:
        """The document of the probe at the capacity rate."""
        return next((p.doc for p in self.probes if p.ok and p.rate == self.rate), None)

    def hint(self) -> Hint:
        return Hint(self.rate, self.bad)


class _NothingServed(Exception):
    """A probe rejected every request before any probe met the SLOs: so would every lower rate."""


def search_capacity(probe: Callable[[float], Probe], *, start: float, min_rate: float, max_rate: float,
                    rel_tol: float, hint: Hint | None = None) -> Capacity:
    """The bracket search. A probe that rejects every request (too long for the context or the whole KV
    cache: its lengths, not its rate) ends a search that has found no good rate yet: a lower rate replays
    the same requests, or with --duration fewer of them, and would reject them all too."""
    check_rates(start, min_rate, max_rate, rel_tol)
    probes: list[Probe] = []

    def ok(rate: float) -> bool:
        probes.append(probe(rate))
        if served_nothing(probes[-1].doc) and not any(p.ok for p in probes):
            raise _NothingServed
        return probes[-1].ok

    first, steps = _plan(start, min_rate, max_rate, rel_tol, hint)
    try:
        good, bad, bounded = bracket(ok, first=first, steps=steps, min_rate=min_rate, max_rate=max_rate,
                                     rel_tol=rel_tol)
    except _NothingServed:
        return Capacity(None, probes[-1].rate, probes, bounded=True)
    return Capacity(good, bad, probes, bounded=bounded)


def _plan(start: float, min_rate: float, max_rate: float, rel_tol: float,
          hint: Hint | None) -> tuple[float, Iterator[float]]:
    """The first rate to probe and the factors of the successive steps away from it."""
    if hint is None:
        return start, repeat(2.0)
    if hint.good is None:                  # the neighbour met the SLOs at no rate: start at the bottom
        return min_rate, repeat(2.0)
    first = min(max(hint.good, min_rate), max_rate)
    ratio = hint.bad / hint.good if hint.bad is not None and hint.bad > hint.good else 1 + rel_tol
    return first, _doubling(ratio)


def _doubling(ratio: float) -> Iterator[float]:
    """ratio, ratio^2, ratio^4, ...: the first step lands on the hint's bad rate, later ones gallop."""
    while True:
        yield ratio
        ratio = min(ratio * ratio, 2.0 ** 16)


def find_capacity(spec: RunSpec, slos: dict[str, float], *, start: float = 1.0, min_rate: float = 0.01,
                  max_rate: float = 256.0, rel_tol: float = 0.02, on_probe: Callable[[Probe], None] | None = None,
                  seeds: int = 1, confidence: float = 0.9, warn=None) -> Capacity:
    """`planner capacity`: double or halve the rate from `start` until the verdict flips, then bisect
    until the bracket is within `rel_tol`. Every probe replays the same seeded trace (same lengths, same
    arrival pattern) at its rate, so only the rate changes. With `seeds` > 1 each probe runs that many
    seeds, and a rate meets the SLOs when at least a fraction `confidence` of them do."""
    if not 0 < confidence <= 1:
        raise PlannerError(f"confidence must be in (0, 1], got {confidence}")
    simulation = Simulation.prepare(judged(spec, slos))
    if warn is not None:
        warn(simulation.warnings(simulation.spec.load.trace()))

    def probe(rate: float) -> Probe:
        found = full_probe(simulation, rate, slos, seeds, confidence)
        if on_probe is not None:
            on_probe(found)
        return found

    return search_capacity(probe, start=start, min_rate=min_rate, max_rate=max_rate, rel_tol=rel_tol)


def full_probe(simulation: Simulation, rate: float, slos: dict[str, float], seeds: int = 1,
               confidence: float = 1.0) -> Probe:
    """`planner capacity`'s probe: full analysed runs of every seed at `rate`, on a longer trace while a seed
    met its SLOs on a steady window too short to judge (planner/sizing/probe.py, `steady_load`)."""
    given = load = replace(simulation.spec.load, rate=rate)
    for _ in range(LENGTHENINGS + 1):
        probability, docs = slo_probability(simulation, load, slos, seeds)
        longer = [steady_load(load, d["num_submitted"], d["verdict"]["steady_requests"])
                  for d in docs if slos_held(d, slos, simulation.spec.slo_attainment)]
        longer = [x for x in longer if x is not None]
        if not longer:
            break
        load = max(longer, key=lambda x: x.requests)
    return Probe(rate, probability >= confidence, {**docs[0], "slo_probability": probability, "seeds": seeds},
                 lengthened_to=None if load is given else load.requests)


def find_concurrency(spec: RunSpec, slos: dict[str, float], *, max_clients: int = 4096,
                     on_probe: Callable[[Probe], None] | None = None, warn=None) -> Capacity:
    """`planner capacity --concurrency max`: the most concurrent clients (a closed loop) within the SLOs.
    Double from one client until the SLOs fail, then bisect over whole clients. The result's `rate`
    holds the number of clients."""
    spec = judged(spec, slos)
    simulation = Simulation.prepare(spec)
    if warn is not None:
        clients = replace(spec.load, rate=None, concurrency=1)     # (the trace is each probe's)
        warn(simulation.warnings(clients.trace(), clients))
    probes: list[Probe] = []

    def ok(clients: int) -> bool:
        doc = document_of(simulation, replace(spec.load, rate=None, concurrency=clients))
        probes.append(Probe(clients, meets(doc, slos, spec.slo_attainment), doc))
        if on_probe is not None:
            on_probe(probes[-1])
        return probes[-1].ok

    if not ok(1):
        return Capacity(None, 1, probes, bounded=True)
    # more clients than the trace has requests send them all at once, as that many do: no further to look;
    # nor past --max-active-conversations, which each client needs one of
    most_active = spec.deployment.max_active_conversations or max_clients
    max_clients = min(max_clients, probes[0].doc["num_submitted"], most_active)
    good, bad = 1, None
    while bad is None and good < max_clients:
        clients = min(2 * good, max_clients)
        good, bad = (clients, None) if ok(clients) else (good, clients)
    if bad is None:
        return Capacity(good, None, probes, bounded=False)
    while bad - good > 1:
        middle = (good + bad) // 2
        good, bad = (middle, bad) if ok(middle) else (good, middle)
    return Capacity(good, bad, probes, bounded=True)


def judged(spec: RunSpec, slos: dict[str, float]) -> RunSpec:
    """The spec whose runs count the requests within `slos` (their goodput), when an SLO attainment judges
    them by that count (a search's configurations carry no SLOs of their own)."""
    return spec if spec.slo_attainment is None else replace(spec, slos=tuple(slos.items()))


def capacity_title(spec: RunSpec, slos: dict[str, float]) -> str:
    d = spec.deployment
    limits = capacity_limits(spec, slos)
    return (f"{d.model} on {d.tp} x {d.gpu}{layout_suffix(d.pp, d.dp)}, {spec.load.workload} (block {d.block_size}, "
            f"{d.allocator}), SLO {limits}")


def capacity_document(spec: RunSpec, slos: dict[str, float], found: Capacity, clients: bool = False) -> dict:
    """capacity.json: the rate (or with `clients`, the concurrency), what it gives, the binding limit, the
    probes, the verdict in words."""
    at = found.doc or {}
    probes = [(p.rate, p.ok, p.doc) for p in found.probes]
    attainment = spec.slo_attainment
    binding = binding_slo(slos, probes, found.rate, attainment)
    cost_model = (at or probes[-1][2]).get("cost_model")
    lines = _capacity_lines(found, at, probes[-1][0], clients)
    if attainment is not None:
        lines.insert(1, f"Judged by SLO attainment: {capacity_limits(spec, slos)}, the engine keeping up.")
    if binding is not None:
        miss = next(d for r, ok, d in probes if r == found.bad)
        lines.append(_binding_line(binding, slos, f"{found.bad:.3g} {_unit(clients)}", miss, attainment))
    lines.append(f"Cost model: {cost_model}.")
    if at.get("verdict"):
        run_lines = [line for line in at["verdict"]["lines"] if not line.startswith("Next:")]
        pools = 1 if at["verdict"].get("pd") else 0     # a P/D run's first line says which pool binds: kept
        lines += [f"At capacity: {line}" for line in run_lines[:pools] + run_lines[1 + pools:3 + pools]]
    nxt = _next_command(spec, found, clients)
    lines.append(nxt)
    command = nxt.split("  (")[0].removeprefix("Next: ") if nxt.startswith("Next: ") else None
    key = "concurrency" if clients else "rate"
    verdict = {f"capacity_{key}": found.rate, "binding_slo": binding, f"first_missing_{key}": found.bad,
               "cost_model": cost_model, "next_command": command, "lines": lines}
    return json_safe({
        "schema_version": SCHEMA_VERSION, "capacity_rate": None if clients else found.rate,
        "capacity_concurrency": found.rate if clients else None, "bounded": found.bounded, "slos": slos,
        "slo_attainment": attainment,
        "binding_slo": binding, "cost_model": cost_model,
        "at_capacity_summary": {k: at.get(k) for k in ("request_throughput", "request_goodput",
                                                       "output_token_throughput", "ttft_mean", "ttft_p99", "tpot_mean",
                                                       "tpot_p99", "normalized_latency", "mean_concurrency")},
        "verdict": verdict,
        "probes": [{key: r, "meets": ok, "slo_probability": d.get("slo_probability"),
                    **{k: d.get(k) for k in slos}, "attainment": slo_attainment(d),
                    "num_rejected": d.get("num_rejected"),
                    "num_truncated": d.get("num_truncated"), "request_throughput": d.get("request_throughput"),
                    "state": (d.get("verdict") or {}).get("state"), "requests": d.get("num_submitted")}
                   for r, ok, d in probes],
        "at_capacity": found.doc, "deployment": resolved(spec.deployment).as_dict(),
    })


def _unit(clients: bool) -> str:
    return "clients" if clients else "req/s"


def _next_command(spec: RunSpec, found: Capacity, clients: bool) -> str:
    if found.rate is None:
        def search(**changes) -> str:     # this search again, some settings changed: of clients if it was
            return spec.command(capacity=True, **({"concurrency": "max"} if clients else {}), **changes)
        lowest = found.probes[-1].doc      # its rejections are its requests' lengths, not its rate: the remedy
        if lowest.get("num_rejected") and spec.pd is None:
            d = spec.deployment
            remedy = rejection_remedy(_rejections(lowest), d.tp, d.max_model_len is not None)
            if remedy is not None:
                changes, why = remedy
                return f"Next: {search(**changes)}  ({why})"
            if served_nothing(lowest):
                return "No setting of this run admits its requests: shorter prompts, or a model with a longer context."
        if spec.pd is not None:       # a pool's own --*-tp would override a run-wide --tp: more replicas instead
            more = replace(spec.pd, prefill=spec.pd.prefill + 1, decode=spec.pd.decode + 1)
            return f"Next: {search(pd=more)}  (a replica more in each pool, or relax the SLOs)"
        return f"Next: {search(tp=spec.deployment.tp * 2)}  (more GPUs, or relax the SLOs)"
    at = {"concurrency": found.rate, "rate": None} if clients else {"rate": round(found.rate, 3)}
    lengthened = next((p.lengthened_to for p in found.probes if p.ok and p.rate == found.rate), None)
    if lengthened is not None:            # the run at capacity is the probe's: its trace was lengthened
        at.update(requests=lengthened, duration=None)
    return f"Next: {spec.command(**at)}  (the full report at capacity: timeline, steady state)"


def _rejections(doc: dict) -> list[dict]:
    """A probe's rejected requests grouped by reason, commonest first (planner/analysis/verdict.py)."""
    return (doc.get("verdict") or {}).get("rejected") or []


def _capacity_lines(found: Capacity, at: dict, lowest: float, clients: bool) -> list[str]:
    unit = _unit(clients)
    if found.rate is None:
        last = found.probes[-1].doc
        if served_nothing(last):
            first = (_rejections(last) or [None])[0]
            example = f" ({first['example_request']}: {first['reason']})" if first else ""
            return [f"No capacity: every request was rejected at {lowest:.3g} {unit}, as it would be at any "
                    f"{'number' if clients else 'rate'}{example}."]
        return [f"The SLOs are not met even at {lowest:.3g} {unit} (the lowest tried)."]
    served = f" (serving {at.get('request_throughput', 0):.3g} req/s)" if clients else ""
    capacity = f"Capacity: {found.rate:.3g} {unit}{served}"
    if found.bounded:
        first = capacity + "."
    elif clients and found.rate >= at.get("num_submitted", float("inf")):
        first = (f"Capacity: at least {found.rate:.0f} {unit}{served}: all the trace's {found.rate:.0f} requests in "
                 f"flight at once still meet the SLOs; give more --requests to look further.")
    else:
        first = capacity + " (still within the SLOs at the most tried; raise the limit)."
    return [first,
            f"At capacity: {at.get('output_token_throughput', 0):,.0f} output tok/s, "
            f"TTFT mean {at.get('ttft_mean', 0):.3g} s / p99 {at.get('ttft_p99', 0):.3g} s, "
            f"TPOT mean {at.get('tpot_mean', 0):.3g} s / p99 {at.get('tpot_p99', 0):.3g} s, "
            f"normalized latency {at.get('normalized_latency', 0):.3g} s/token."]


def percent(share: float) -> str:
    return f"{100 * share:.4g}%"


def capacity_limits(spec: RunSpec, slos: dict[str, float]) -> str:
    """The SLOs in words: their statistics' limits, or with an SLO attainment, each request's."""
    if spec.slo_attainment is None:
        return ", ".join(f"{k} <= {v:g}" for k, v in slos.items())
    per_request = ", ".join(f"{slo_quantity(k)} <= {v:g} {'s/token' if k == 'normalized_latency' else 's'}"
                            for k, v in slos.items())
    return f"{per_request} per request, for {percent(spec.slo_attainment)} of the requests"


def _binding_line(binding: str, slos: dict[str, float], first_miss: str, miss: dict,
                  attainment: float | None = None) -> str:
    """What failed first above the capacity (`first_miss`: where, with its unit)."""
    if binding == "slo_attainment":
        return (f"Binding limit: SLO attainment >= {percent(attainment)} (at {first_miss} "
                f"{percent(slo_attainment(miss))} of the requests met every limit).")
    if binding == "num_rejected":
        return f"Binding limit: requests are rejected at {first_miss}."
    if binding == "queue_growth":
        return (f"Binding limit: throughput. At {first_miss} every SLO still held, but requests kept piling up "
                f"(arrivals outpaced completions): the SLOs would fail on a longer run.")
    return (f"Binding limit: {binding} <= {slos[binding]:g} (at {first_miss} it reached "
            f"{_beside(miss.get(binding, float('nan')), slos[binding])}).")


def _beside(value: float, limit: float) -> str:
    """`value` to 3 significant digits, or as many more as it takes not to read as the limit it passed."""
    for digits in range(3, 10):
        text = f"{value:.{digits}g}"
        if text != f"{limit:g}" and float(text) != limit:
            return text
    return f"{value!r}"
