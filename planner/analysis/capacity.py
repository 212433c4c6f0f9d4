"""What a capacity search found, in words: the rate, what it gives, the binding limit (capacity.json)."""
from __future__ import annotations

from planner.analysis.verdict import binding_slo
from planner.report.run import json_safe
from planner.runs.spec import RunSpec
from planner.sizing.capacity import CapacityResult

def capacity_title(spec: RunSpec, slos: dict[str, float]) -> str:
    limits = ", ".join(f"{k} <= {v:g}" for k, v in slos.items())
    return (f"{spec.model} on {spec.tp} x {spec.gpu}, {spec.workload} (block {spec.block_size}, {spec.allocator}), "
            f"SLO {limits}")


def capacity_document(spec: RunSpec, slos: dict[str, float], found: CapacityResult) -> dict:
    """capacity.json: the rate, what it gives, the binding limit, the probes, the verdict in words."""
    at = found.doc or {}
    binding = binding_slo(slos, found.probes, found.rate)
    first_miss = min((r for r, ok, _ in found.probes if not ok and (found.rate is None or r > found.rate)),
                     default=None)
    cost_model = (at or found.probes[-1][2]).get("cost_model")
    lines = []
    if found.rate is None:
        lines.append(f"The SLOs are not met even at {found.probes[-1][0]:.3g} req/s (the lowest rate tried).")
    else:
        lines.append(f"Capacity: {found.rate:.3g} req/s"
                     + ("" if found.bounded else " (still within the SLOs at the highest rate tried; raise "
                                                  "--max-rate)") + ".")
        lines.append(f"At that rate: {at.get('output_token_throughput', 0):,.0f} output tok/s, "
                     f"TTFT mean {at.get('ttft_mean', 0):.3g} s / p99 {at.get('ttft_p99', 0):.3g} s, "
                     f"TPOT mean {at.get('tpot_mean', 0):.3g} s / p99 {at.get('tpot_p99', 0):.3g} s, "
                     f"normalized latency {at.get('normalized_latency', 0):.3g} s/token.")
    if binding is not None:
        miss = next(d for r, ok, d in found.probes if r == first_miss)
        if binding == "num_rejected":
            lines.append(f"Binding limit: requests are rejected at {first_miss:.3g} req/s.")
        elif binding == "queue_growth":
            lines.append(f"Binding limit: throughput. At {first_miss:.3g} req/s every SLO still held, but the "
                         f"waiting queue kept growing: the SLOs would fail on a longer run.")
        else:
            lines.append(f"Binding limit: {binding} <= {slos[binding]:g} (at {first_miss:.3g} req/s it reached "
                         f"{miss.get(binding, float('nan')):.3g}).")
    lines.append(f"Cost model: {cost_model}.")
    verdict = {"capacity_rate": found.rate, "binding_slo": binding, "first_missing_rate": first_miss,
               "cost_model": cost_model}
    if at.get("verdict"):
        run_lines = [line for line in at["verdict"]["lines"] if not line.startswith("Next:")]
        lines += [f"At capacity: {line}" for line in run_lines[1:3]]
    if found.rate is None:
        nxt = spec.command(tp=spec.tp * 2, capacity=True)
        lines.append(f"Next: {nxt}  (more GPUs, or relax the SLOs)")
    else:
        nxt = spec.command(rate=round(found.rate, 3))
        lines.append(f"Next: {nxt}  (the full report at capacity: timeline, steady state)")
    verdict.update(next_command=nxt, lines=lines)
    return json_safe({
        "capacity_rate": found.rate, "bounded": found.bounded, "slos": slos, "binding_slo": binding,
        "cost_model": cost_model,
        "at_capacity_summary": {k: at.get(k) for k in ("request_throughput", "output_token_throughput", "ttft_mean",
                                                       "ttft_p99", "tpot_mean", "tpot_p99", "normalized_latency")},
        "verdict": verdict,
        "probes": [{"rate": r, "meets": ok, "slo_probability": d.get("slo_probability"),
                    **{k: d.get(k) for k in slos}, "num_rejected": d.get("num_rejected"),
                    "num_truncated": d.get("num_truncated"),
                    "request_throughput": d.get("request_throughput"),
                    "state": (d.get("verdict") or {}).get("state")} for r, ok, d in found.probes],
        "at_capacity": found.doc,
    })
