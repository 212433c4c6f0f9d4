"""Does speculative decoding pay at the target load? `planner search --speculative`'s answer.

A verify step prices k + 1 rows per speculating sequence. At small batches a decode step is bound by
reading the weights, so the extra rows are nearly free and TPOT falls by about the acceptance
length; as the batch grows the step turns compute-bound, the rows cost their full price, and the
longer verify steps eat the gain (and the drafts' KV slots and budget crowd out requests). So once
the grid's best configuration is found with speculation on, it is simulated again with it off:

- its capacity without speculation (the same capacity search, the same SLOs);
- mean TPOT, throughput and mean batch with and without speculation at fractions of the load
  (the target rate or clients; with `--rate max`, the capacity found), on the same seeded trace;
- the lowest of those loads at which speculation's TPOT is no better than without it: where it
  stops paying, with the batch it runs there.
"""
from __future__ import annotations

from dataclasses import replace

from planner.runs.pipeline import Simulation
from planner.runs.spec import RunSpec
from planner.runs.sweep import document_of
from planner.sizing.capacity import find_capacity, find_concurrency

LOAD_FRACTIONS = (0.125, 0.25, 0.5, 0.75, 1.0)


def speculation_pays(spec: RunSpec, slos: dict[str, float], *, load: float, clients: bool,
                     limits: dict) -> dict:
    """The comparison for one configuration (`spec`, speculation on) at fractions of `load` (req/s, or
    clients with `clients`); `limits` are the capacity search's (start, min_rate, max_rate, rel_tol)."""
    off = spec.with_deployment(speculative="none")      # off, with its curves
    if clients:
        capacity_off = find_concurrency(off, slos)
    else:
        capacity_off = find_capacity(off, slos, **limits)
    on_sim, off_sim = Simulation.prepare(spec), Simulation.prepare(off)
    points = []
    for load_point in _loads(load, clients):
        with_load = (replace(spec.load, rate=None, concurrency=int(load_point)) if clients
                     else replace(spec.load, rate=load_point, concurrency=None))
        on, plain = document_of(on_sim, with_load), document_of(off_sim, with_load)
        points.append({"load": load_point, **_side(on, "speculative"), **_side(plain, "plain")})
    stops = next((p for p in points if p["tpot_mean_speculative"] >= p["tpot_mean_plain"]), None)
    at_load = points[-1]
    return {"speculative": spec.deployment.speculative, "load_unit": "clients" if clients else "req/s",
            "capacity_without": capacity_off.rate, "points": points,
            "pays_at_load": at_load["tpot_mean_speculative"] < at_load["tpot_mean_plain"],
            "stops_paying_at": None if stops is None else stops["load"],
            "stops_paying_batch": None if stops is None else stops["mean_batch_size_speculative"]}


def _loads(load: float, clients: bool) -> list[float]:
    """Fractions of the load; whole and distinct client counts in a closed loop."""
    if clients:
        return sorted({max(1, round(f * load)) for f in LOAD_FRACTIONS})
    return [f * load for f in LOAD_FRACTIONS]


def _side(doc: dict, name: str) -> dict:
    return {f"{key}_{name}": doc.get(key) for key in ("tpot_mean", "request_throughput", "mean_batch_size")}


def summary_lines(verdict: dict, capacity_with: float | None) -> list[str]:
    """The verdict in plain words, for the terminal."""
    unit, spec = verdict["load_unit"], verdict["speculative"]
    lines = [f"speculation ({spec}): capacity {_num(capacity_with)} {unit} with it, "
             f"{_num(verdict['capacity_without'])} {unit} without, on the best configuration"]
    for p in verdict["points"]:
        lines.append(f"  at {_num(p['load'])} {unit}: mean TPOT {_ms(p['tpot_mean_speculative'])} with, "
                     f"{_ms(p['tpot_mean_plain'])} without (mean batch {_num(p['mean_batch_size_speculative'])})")
    if verdict["stops_paying_at"] is None:
        lines.append(f"  it pays at every load up to {_num(verdict['points'][-1]['load'])} {unit}")
    else:
        lines.append(f"  it stops paying at {_num(verdict['stops_paying_at'])} {unit} (mean batch "
                     f"{_num(verdict['stops_paying_batch'])}): from there TPOT is no better than without it")
    return lines


def _num(x) -> str:
    return "-" if x is None else f"{x:.3g}"


def _ms(seconds) -> str:
    return "-" if seconds is None else f"{1000 * seconds:.1f} ms"
