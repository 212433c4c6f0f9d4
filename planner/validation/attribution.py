"""Where a validation's error comes from: step-time model, scheduling, or the time between steps.

The simulator is run twice more on the live run's trace, replaying what the
live engine measured instead of predicting it:

  full          steps priced by the cost model (the prediction being validated)
  replay        step i lasts the live run's i-th step duration
  replay+gaps   step i lasts that duration plus the host time the live engine
                spent after it before starting step i+1 (not counting the time
                it slept waiting for a request)

For a metric M the total error full - live then splits exactly into

  (a) step-time model       full - replay          the cost model's step times
  (c) between-step time     replay - replay+gaps   host time and clock reads
                                                   outside a step, which the
                                                   simulator does not model
  (b) scheduling divergence replay+gaps - live     what remains once every
                                                   measured second is replayed:
                                                   the two runs scheduled
                                                   differently (a request
                                                   arriving just before or after
                                                   a step boundary)

each reported as an error relative to the live value and as a share of the
total (shares add up to 1 when the total is not zero).
"""
from __future__ import annotations

from engine.core.metrics import RequestRecord, StepRecord
from planner.cost.shape import CostModel
from planner.cost.wrappers import ReplayCost
from planner.sim import simulate

ATTRIBUTED = ("e2e_mean", "request_throughput", "output_token_throughput")
PARTS = ("step_time_model", "scheduling", "between_steps")


def between_step_gaps(steps: list[StepRecord], requests: list[RequestRecord]) -> list[float]:
    """Host time after each step before the next one starts; 0 where the engine had nothing to run
    (it slept until an arrival, which the simulator models itself) and after the last step."""
    gaps = []
    for prev, nxt in zip(steps, steps[1:]):
        busy = any(r.arrival <= prev.end and not r.rejected and (r.finish is None or r.finish > prev.end)
                   for r in requests)
        gaps.append(max(0.0, nxt.start - prev.end) if busy else 0.0)
    return gaps + [0.0] if steps else []


def attribute(full: dict, replay: dict, replay_gaps: dict, live: dict,
              metrics: tuple[str, ...] = ATTRIBUTED) -> dict:
    """The split of each metric's error (see the module docstring); None where a value is missing."""
    result = {}
    for name in metrics:
        values = [d.get(name) for d in (full, replay, replay_gaps, live)]
        if any(v is None for v in values) or not values[3]:
            result[name] = None
            continue
        f, r, g, m = (float(v) for v in values)
        total = f - m
        parts = {"step_time_model": f - r, "scheduling": g - m, "between_steps": r - g}
        result[name] = {
            "measured": m, "simulated": f, "replay": r, "replay_with_gaps": g,
            "total_error": total / m,
            **{part: {"error": diff / m, "share": diff / total if total else None} for part, diff in parts.items()},
        }
    return result


def run_attribution(trace, plan, cost_model: CostModel, live_steps: list[StepRecord],
                    live_requests: list[RequestRecord], live_metrics: dict, full: dict, *, seed: int = 0,
                    clients: dict | None = None) -> dict:
    """Simulate the replays and split the error of `full` (the cost model's simulation) against live;
    `clients`: how requests reach the engine, as `simulate` takes it (concurrency, paced)."""
    clients = clients or {}
    durations = [s.duration for s in live_steps]
    gaps = between_step_gaps(live_steps, live_requests)
    replay = simulate(trace, plan, ReplayCost(durations, cost_model), seed=seed, **clients).summary()
    replay_gaps = simulate(trace, plan, ReplayCost([d + g for d, g in zip(durations, gaps)], cost_model),
                           seed=seed, **clients).summary()
    doc = attribute(full, replay, replay_gaps, live_metrics)
    doc["between_step_time"] = {"total_s": sum(gaps), "mean_s": sum(gaps) / len(gaps) if gaps else 0.0,
                                "share_of_busy_time": sum(gaps) / (sum(gaps) + sum(durations))
                                if durations else 0.0}
    doc["steps"] = {"live": len(live_steps), "replay": replay.get("num_steps")}
    return doc
