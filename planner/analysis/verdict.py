"""What a run means, in plain words: the steady state, whether the system keeps up, what bound it.

Definitions (stated in every report):

- Warm-up: from the first arrival until WARMUP_FRACTION of the requests have
  arrived; the engine starts empty, so latencies are flattering and the cache
  is not yet full.
- Drain: after DRAIN_FRACTION of the requests have arrived: the trace's
  thinning tail (a chatbot's last turns trickle in), then nothing new; the
  batch shrinks to the stragglers ("batch size 1 for the last 270 s").
- Steady window: between the two. Steady-state figures count the requests that
  arrived in it (latencies), the tokens and completions that happened in it
  (throughput) and the steps that ran in it (batch size, KV cache).
- Waiting queue: requests that have arrived and not yet been scheduled once;
  in the system: requests that have arrived and not yet finished.
- A count keeps growing when its least-squares slope over the steady window is
  at least GROWTH_SHARE of the arrival rate and adds up to at least MIN_GROWTH
  requests over the window: a stable system has counts that fluctuate around a
  level, an overloaded one a count in the system that grows at (arrival rate -
  service rate). Where it grows depends on the scheduler: a capped batch (the
  paper's max_num_seqs, a full KV cache) leaves the growth in the waiting
  queue; vLLM v1's large max_num_seqs admits it into the running batch, whose
  steps slow down as it grows. Both are overloads. (A test against the count's
  own level would catch a batch creeping up near the knee sooner, but the
  count in the system wanders by 10-30 % of its level over a few minutes even
  when stable: such a test decides on noise.)
- Too short to judge: a steady window shorter than STEADY_LATENCIES latencies of
  the requests that arrived during warm-up. An engine that starts empty fills
  up for about one latency, and that ramp looks like growth until the window is
  long beside it: on a window too short, a growing count in the system with a
  waiting queue that does not grow leaves the run undecided ("inconclusive").
- KV cache full: fewer than FULL_FREE_SHARE of the KV slots are free; the share
  of time is weighted by step duration over the steady window.
- State: "overloaded" when the waiting queue keeps growing, or the count in the
  system does on a window long enough to judge; "unknown" when undecided (or
  without a steady window); "saturated" when neither grows but requests queue
  up anyway (mean waiting queue >= SATURATED_QUEUE) or the cache is full at
  least MEMORY_FULL_SHARE of the time: the engine is at its limit and latency
  pays for it; else "keeps up".
- Bound: "arrival rate" when the engine keeps up (it waits for work);
  otherwise "memory" when the cache was full for at least TIGHT_FULL_SHARE of
  the window or requests were preempted, else "compute" (steps are long, or
  the batch is capped at max_num_seqs); "rejections" when every request was
  rejected (nothing reached the engine: the state is "unknown").
"""
from __future__ import annotations

import math
import re
from bisect import bisect_right
from dataclasses import dataclass
from typing import Callable

from engine.core.metrics import (RequestRecord, StepRecord, compute_metrics, goodput, slo_attainment,
                                 token_time_arrays)
from planner.analysis.ramp import ramp_line, ramp_profile
from workloads import RampUp

WARMUP_FRACTION = 0.10
DRAIN_FRACTION = 0.90
SATURATED_QUEUE = 1.0
TIGHT_FULL_SHARE = 0.2
GROWTH_SHARE = 0.05
MIN_GROWTH = 5.0
FULL_FREE_SHARE = 0.05
QUEUE_SAMPLES = 200
STEADY_LATENCIES = 8
LENGTH_MARGIN = 1.25       # a longer run aims past the bare need: latencies grow as the engine fills up
ENOUGH_REQUESTS = 1000     # what a run too short for a steady window is told to try (the simulator's default)
MEMORY_FULL_SHARE = 0.5
STEADY_KEYS = ("request_throughput", "output_token_throughput", "ttft_mean", "ttft_p99", "tpot_mean",
               "tpot_p99", "itl_mean", "itl_p99", "e2e_mean", "e2e_p99", "normalized_latency", "mean_batch_size",
               "mean_prefill_batch_size", "kv_utilization")


@dataclass(frozen=True)
class Window:
    start: float
    end: float

    @property
    def length(self) -> float:
        return self.end - self.start

    def __contains__(self, t: float) -> bool:
        return self.start <= t <= self.end


def steady_window(records: list[RequestRecord]) -> Window | None:
    """[arrival at WARMUP_FRACTION of the requests, arrival at DRAIN_FRACTION]; None when that has no length."""
    arrivals = sorted(r.arrival for r in records)
    if len(arrivals) < 10:
        return None
    start = arrivals[math.ceil(WARMUP_FRACTION * len(arrivals))]
    end = arrivals[min(len(arrivals) - 1, math.floor(DRAIN_FRACTION * len(arrivals)))]
    return Window(start, end) if end > start else None


def queue_series(records: list[RequestRecord], times: list[float]) -> tuple[list[int], list[int]]:
    """(waiting, in system) at each time: waiting = arrived, not yet scheduled once (a rejected request
    waits until it is rejected); in system = not finished."""
    arrived = sorted(r.arrival for r in records)
    started = sorted(r.first_scheduled if r.first_scheduled is not None else
                     r.finish if r.finish is not None else math.inf for r in records)
    finished = sorted(r.finish if r.finish is not None else math.inf for r in records)
    waiting, in_system = [], []
    for t in times:
        a = bisect_right(arrived, t)
        waiting.append(a - bisect_right(started, t))
        in_system.append(a - bisect_right(finished, t))
    return waiting, in_system


def _slope(xs: list[float], ys: list[float]) -> float:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0


def queue_trend(records: list[RequestRecord], window: Window) -> dict:
    """The waiting queue and the requests in the system over the steady window: their slopes, and whether
    either keeps growing."""
    times = [window.start + window.length * i / (QUEUE_SAMPLES - 1) for i in range(QUEUE_SAMPLES)]
    waiting, in_system = queue_series(records, times)
    slope, in_system_slope = _slope(times, waiting), _slope(times, in_system)
    arrivals = sum(1 for r in records if r.arrival in window)
    rate = arrivals / window.length

    def grows(slope: float) -> bool:
        return slope * window.length >= MIN_GROWTH and slope >= GROWTH_SHARE * rate
    waiting_growing, in_system_growing = grows(slope), grows(in_system_slope)
    return {"slope": slope, "growth": slope * window.length, "mean_waiting": sum(waiting) / len(waiting),
            "max_waiting": max(waiting), "mean_in_system": sum(in_system) / len(in_system),
            "in_system_slope": in_system_slope, "in_system_growth": in_system_slope * window.length,
            "waiting_growing": waiting_growing, "in_system_growing": in_system_growing,
            "growing": waiting_growing or in_system_growing, "arrival_rate": rate}


def warmup_latency(records: list[RequestRecord], window: Window | None) -> float | None:
    """The mean latency (E2E) of the completed requests that arrived before the steady window: about how long
    the engine takes to fill up from empty. (Not the whole run's mean: under an overload that grows with the
    trace, and no trace would be long enough beside it.)"""
    if window is None:
        return None
    latencies = [r.e2e for r in records if r.arrival < window.start and r.completed]
    return sum(latencies) / len(latencies) if latencies else None


def too_short(window: Window | None, latency: float | None) -> bool:
    """Whether a steady window is too short beside the warm-up's latency to tell the engine filling up from
    an overload."""
    return bool(window is not None and latency and window.length < STEADY_LATENCIES * latency)


def steady_requests(submitted: int, window: Window | None, latency: float | None) -> int | None:
    """How many requests of the same arrivals give a steady window of STEADY_LATENCIES warm-up latencies,
    with LENGTH_MARGIN over; None when `submitted` already do."""
    if not too_short(window, latency):
        return None
    return math.ceil(submitted * LENGTH_MARGIN * STEADY_LATENCIES * latency / window.length)


def judge_growth(trend: dict | None, short: bool) -> tuple[bool, bool]:
    """(overloaded, inconclusive). A waiting queue that keeps growing is an overload on any window; requests
    piling up in the running batch are one only on a window long enough that the engine filling up from
    empty cannot explain them, and leave a shorter one undecided."""
    if trend is None or not trend["growing"]:
        return False, False
    if trend["waiting_growing"] or not short:
        return True, False
    return False, True


def _full(step: StepRecord) -> bool:
    total = (step.token_states + step.reserved + step.internal_fragmentation + step.external_fragmentation
             + step.free)
    return total > 0 and step.free < FULL_FREE_SHARE * total


def steady_metrics(records: list[RequestRecord], steps: list[StepRecord], window: Window,
                   preemptions_in_window: int, engines: int = 1) -> dict:
    """The DESIGN.md metrics restricted to the steady window (see the module docstring). The busy and KV-full
    shares are an engine's (a fleet's or P/D pools' steps are its `engines`' together), each step counted for
    its part inside the window."""
    arrived = [r for r in records if r.arrival in window]
    in_steps = [s for s in steps if s.start in window]
    m = compute_metrics(arrived, in_steps)
    done_in = sum(1 for r in records if r.completed and r.finish in window)
    tokens_in = _tokens_in(records, window)
    m["request_throughput"] = done_in / window.length
    m["output_token_throughput"] = tokens_in / window.length
    inside = [min(s.end, window.end) - s.start for s in in_steps]
    busy = sum(inside)
    full = sum(t for s, t in zip(in_steps, inside) if _full(s))
    out = {k: m.get(k) for k in STEADY_KEYS}
    out["kv_full_share"] = full / (window.length * engines)
    out["busy_share"] = busy / (window.length * engines)
    out["preemptions"] = preemptions_in_window
    out["num_requests"] = len(arrived)
    return out


def _engines(doc: dict) -> int:
    """The engines whose steps a run's document holds: a fleet's (its replicas' dp ranks), both P/D pools', or one."""
    if doc.get("pd"):
        return sum(len(doc["pd"][pool]["per_replica"]) for pool in ("prefill", "decode"))
    return len(doc["fleet"]["per_replica"]) if doc.get("fleet") else 1


def _tokens_in(records: list[RequestRecord], window: Window) -> float:
    """Output tokens made in the window: each request's output_len shared out over its token times
    (one entry per step that produced tokens, n of them for n parallel sequences), those inside
    counted. Millions of times: they are read into one array and tested there."""
    import numpy as np
    made = [r for r in records if not r.rejected and r.token_times]
    if not made:
        return 0
    lengths, times = token_time_arrays(made)
    inside = ((times >= window.start) & (times <= window.end)).astype(np.int64)
    counts = np.add.reduceat(inside, np.cumsum(lengths) - lengths).tolist()
    return sum(r.output_len / len(r.token_times) * count for r, count in zip(made, counts))


def _capped_share(steps: list[StepRecord], window: Window | None, max_seqs: int) -> float:
    """Share of decode-step time in the window with the batch at max_num_seqs."""
    decode = [s for s in steps if not s.is_prefill and (window is None or s.start in window)]
    total = sum(s.duration for s in decode)
    return sum(s.duration for s in decode if s.num_seqs >= max_seqs) / total if total > 0 else 0.0


def _preemptions_in(steps: list[StepRecord], window: Window | None) -> int:
    return sum(s.preempted for s in steps if window is None or s.start in window)


def _truncation_reason(r: RequestRecord, max_model_len: int | None) -> str:
    held = r.prompt_len + (getattr(r, "seq_output_len", 0) or r.output_len)
    if max_model_len and held >= max_model_len:
        return f"truncated: output clipped at the context limit (max_model_len {max_model_len})"
    return "truncated: the sequence outgrew the whole KV cache"


def summarize_reasons(records: list[RequestRecord], max_model_len: int | None = None) -> list[dict]:
    """Rejected and truncated requests grouped by reason (numbers generalized), with a count and one example."""
    groups: dict[str, dict] = {}
    for r in records:
        if r.rejected:
            reason = r.reject_reason or "rejected, no reason given"
        elif getattr(r, "truncated", False):
            reason = _truncation_reason(r, max_model_len)
        else:
            continue
        key = re.sub(r"\d+", "N", reason)
        entry = groups.setdefault(key, {"reason": reason, "count": 0, "example_request": r.request_id})
        entry["count"] += 1
    return sorted(groups.values(), key=lambda e: -e["count"])


def _fmt_rate(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.3g} req/s"


def analyse_run(doc: dict, records: list[RequestRecord], steps: list[StepRecord],
                command: Callable[..., str] | None = None, slos: dict[str, float] | None = None,
                attainment: float | None = None, most_clients: int | None = None) -> dict:
    """The steady-state block and the verdict of one run, from its records and result document.

    `command(**changes)` renders the CLI line of this run with some options changed,
    for the "next command to try" (a closed loop's, no more clients than `most_clients`); `slos` adds whether
    each limit holds, and with an SLO `attainment`, whether that share of the requests was within every limit.
    """
    params = doc.get("params", {})
    requested = params.get("trace_params", {}).get("rate")
    requested = requested if isinstance(requested, (int, float)) and math.isfinite(requested) else None
    ramp = _ramp_up_of(params.get("trace_params", {}))
    ramp_up = ramp.describe() if ramp else None
    timed = requested is not None or ramp_up is not None      # arrivals spread at a rate asked for
    arrivals = sorted(r.arrival for r in records)
    offered = ((len(arrivals) - 1) / (arrivals[-1] - arrivals[0])
               if len(arrivals) > 1 and arrivals[-1] > arrivals[0] else None)
    window = steady_window(records)
    steady = trend = None
    if window is not None:
        steady = steady_metrics(records, steps, window, _preemptions_in(steps, window), _engines(doc))
        steady["window"] = {"start": window.start, "end": window.end,
                            "warmup": f"until {WARMUP_FRACTION:.0%} of the requests had arrived",
                            "drain": f"after {DRAIN_FRACTION:.0%} of the requests had arrived"}
        trend = queue_trend(records, window)
    latency = warmup_latency(records, window)
    short = too_short(window, latency) and not params.get("concurrency")
    enough = steady_requests(len(records), window, latency) if short else None
    clients = params.get("concurrency")
    # with a rate too, the clients' limit on requests in flight holds arrivals back when it is mostly reached
    gate = clients if clients and timed and (doc.get("mean_concurrency") or 0) >= 0.9 * clients else None
    nothing_served = served_nothing(doc)
    load = (_all_rejected() if nothing_served else
            _load(trend, short, steady, steps, window, params.get("max_num_seqs"), None if timed else clients, gate))
    slo_status = good = None
    if slos:
        slo_status = {k: {"limit": v, "value": doc.get(k), "met": doc.get(k) is not None and doc[k] <= v,
                          "steady_value": (steady or {}).get(k)} for k, v in slos.items()}
        good = goodput([r for r in records if r.completed], slos, doc.get("duration"))
    judged = None
    if slos and attainment is not None:
        share = slo_attainment({**good, "num_submitted": doc.get("num_submitted")})
        judged = {"target": attainment, "share": share, "met": share is not None and share >= attainment}
    next_commands = (_next_after_rejections(records, params, command) if nothing_served else
                     _next_commands(load["bound"], params, requested, doc.get("request_throughput"), command,
                                    enough, timed, most_clients))
    # (a P/D run's deployment settings may be a pool's own: the pools' remedy is said with their verdict)
    if command is not None and "max_num_seqs" in load["bound_reason"] and not params.get("pd"):
        next_commands.insert(0, {"command": command(max_num_seqs=2 * params["max_num_seqs"]),
                                 "why": "let the batch grow past max_num_seqs"})
    verdict = {"requested_rate": requested, "ramp_up": ramp_up,
               "ramp_up_profile": ramp_profile(records, ramp) if ramp else None, "offered_rate": offered,
               "served_rate": doc.get("request_throughput"),
               "concurrency": params.get("concurrency"), "mean_concurrency": doc.get("mean_concurrency"),
               "served_rate_steady": steady["request_throughput"] if steady else None, "window_too_short": short,
               "warmup_latency": latency, "steady_requests": enough,
               **load, "queue": trend, "preemptions": doc.get("preemptions", {}).get("total", 0), "slos": slo_status,
               "goodput": good, "slo_attainment": judged,
               "rejected": summarize_reasons(records, params.get("max_model_len")),
               "num_rejected": doc.get("num_rejected", 0), "num_truncated": doc.get("num_truncated", 0),
               "next_commands": next_commands}
    verdict["lines"] = _verdict_lines(verdict, doc, steady, window)
    return {"steady_state": steady, "verdict": verdict}


def _load(trend: dict | None, short: bool, steady: dict | None, steps: list[StepRecord], window: Window | None,
          max_seqs: int | None, clients: int | None = None, gate: int | None = None) -> dict:
    """The run's state (keeps up, saturated, overloaded, unknown) and what bound it, with the reason (`clients`:
    a closed loop's; `gate`: the limit on requests in flight that held a rate's arrivals back)."""
    kv_full = steady["kv_full_share"] if steady else None
    growing, inconclusive = judge_growth(trend, short)
    saturated = bool(trend and not growing and not inconclusive
                     and (trend["mean_waiting"] >= SATURATED_QUEUE or (kv_full or 0) >= MEMORY_FULL_SHARE))
    if trend is None:
        bound = "unknown"
        why = "too few requests or no arrival spread (e.g. all at once) to define a steady window"
    elif inconclusive:
        bound = "unknown"
        why = ("requests piled up over a steady window too short to tell the engine filling up from an "
               "overload")
    elif not growing and not saturated:
        bound = "arrival rate"
        why = (f"the engine keeps up with its {clients} clients, each waiting on its own request" if clients
               else f"the engine keeps up; the limit of {gate} requests in flight holds the arrivals back" if gate
               else "the engine keeps up and waits for requests")
    elif (kv_full or 0) >= TIGHT_FULL_SHARE or (steady and steady["preemptions"] > 0):
        bound = "memory"
        why = (f"the KV cache was full {kv_full:.0%} of the steady window"
               + (f" with {steady['preemptions']} preemptions" if steady["preemptions"] else "")
               + ": the batch cannot grow")
    elif max_seqs and _capped_share(steps, window, max_seqs) >= 0.5:
        bound = "compute"
        why = f"the batch is capped at max_num_seqs={max_seqs}"
    else:
        bound = "compute"
        why = "steps take too long for the arrival rate while memory is not full"
    state = ("overloaded" if growing else "saturated" if saturated else "keeps up" if trend and not inconclusive
             else "unknown")
    return {"state": state, "overloaded": growing, "inconclusive": inconclusive, "saturated": saturated,
            "kv_full_share": kv_full, "bound": bound, "bound_reason": why}


def _all_rejected() -> dict:
    """The load of a run whose every request was rejected: nothing reached the engine to judge."""
    return {"state": "unknown", "overloaded": False, "inconclusive": False, "saturated": False, "kv_full_share": None,
            "bound": "rejections", "bound_reason": "every request was rejected before it reached the engine"}


def served_nothing(doc: dict) -> bool:
    """Whether a run (its result document) rejected every request it was sent."""
    return bool(doc.get("num_submitted")) and doc.get("num_rejected") == doc["num_submitted"]


def rejection_remedy(reasons: list[dict], tp: int, own_max_model_len: bool) -> tuple[dict, str] | None:
    """The change of settings (and why) that would admit a run's rejected requests, by the commonest of its
    `reasons` (summarize_reasons: the scheduler's words, engine/core/scheduler.py); None when no setting of
    the run's helps. `own_max_model_len`: the run set a context limit of its own (--max-model-len)."""
    reason = reasons[0]["reason"] if reasons else ""
    if "exceeds the model's limit" in reason:
        # past a limit of the run's own: the model's; past the model's own: shorter prompts or another model
        return ({"max_model_len": None}, "the model's own context length") if own_max_model_len else None
    if "more KV cache than the whole cache" in reason:
        return {"tp": 2 * tp}, "twice the GPUs, more than twice the KV cache"
    return None


def _next_after_rejections(records: list[RequestRecord], params: dict,
                           command: Callable[..., str] | None) -> list[dict]:
    """What to run next when every request was rejected."""
    if command is None:
        return []
    remedy = rejection_remedy(summarize_reasons(records), params.get("tp", 1), "--max-model-len" in command().split())
    if remedy is None:
        return []
    changes, why = remedy
    return [{"command": command(**changes), "why": why}]


def _ramp_up_of(trace_params: dict) -> RampUp | None:
    """The ramp-up a trace was timed by, None without one."""
    strategy = trace_params.get("ramp_up_strategy")
    if strategy is None:
        return None
    return RampUp(strategy, trace_params["ramp_up_start_rps"], trace_params["ramp_up_end_rps"])


def _process_text(trace_params: dict) -> str:
    """The arrival process in words where it was not Poisson's: ' (gamma arrivals, burstiness B)'."""
    arrival, cv = trace_params.get("arrival"), trace_params.get("cv")
    if arrival == "gamma" and isinstance(cv, (int, float)) and cv > 0:
        return f" (gamma arrivals, burstiness {1 / cv ** 2:.3g})"
    return f" ({arrival} arrivals)" if arrival == "constant" else ""


def _verdict_lines(v: dict, doc: dict, steady: dict | None, window: Window | None) -> list[str]:
    """The verdict in plain words, one line per finding."""
    trend, requested, offered = v["queue"], v["requested_rate"], v["offered_rate"]
    asked = f"requested {_fmt_rate(requested)}" if requested else v["ramp_up"]       # (None: no rate asked for)
    process = _process_text(doc.get("params", {}).get("trace_params", {})) if asked else ""
    if v["concurrency"] and asked:
        rate_line = (f"{asked}{process}, at most {v['concurrency']} requests in flight "
                     f"({v['mean_concurrency'] or 0:.1f} on average)")
    elif v["concurrency"]:
        rate_line = (f"closed loop of {v['concurrency']} clients ({v['mean_concurrency'] or 0:.1f} requests in flight "
                     f"on average)")
    else:
        rate_line = f"{asked}{process}" if asked else "trace timestamps (no rate requested)"
        rate_line += f"; the trace offers {_fmt_rate(offered)}"
        if trend is not None and offered and abs(trend["arrival_rate"] / offered - 1) > 0.1:
            rate_line += f" ({_fmt_rate(trend['arrival_rate'])} in the steady window)"
    rate_line += f"; served {_fmt_rate(v['served_rate'])} over the whole run"
    if steady:
        rate_line += f", {_fmt_rate(steady['request_throughput'])} in the steady window"
    lines = [rate_line + "."]
    curve = ramp_line(v["ramp_up_profile"] or [])
    if curve:
        lines.append(curve)
    if v["bound"] == "rejections":
        n = v["num_rejected"]
        which = "its one request was" if n == 1 else f"every one of the {n} requests was"
        lines.append(f"NOTHING SERVED: {which} rejected (reasons below).")
    else:
        lines += _load_lines(v, doc, window)
    judged = v["slo_attainment"]
    if judged:
        lines.append(f"SLO attainment {'met' if judged['met'] else 'missed'}: {100 * (judged['share'] or 0):.4g}% of "
                     f"the requests within every limit (target {100 * judged['target']:.4g}%). Goodput "
                     f"{_fmt_rate(v['goodput']['request_goodput'])}.")
    elif v["slos"]:
        missed = [k for k, s in v["slos"].items() if not s["met"]]
        good, submitted = v["goodput"], doc.get("num_submitted") or 0
        share = f": {good['num_good'] / submitted:.0%} of the requests within every limit" if submitted else ""
        lines.append(("SLOs met" if not missed else f"SLOs missed: {', '.join(missed)}")
                     + f". Goodput {_fmt_rate(good['request_goodput'])}{share}.")
    if (v["num_rejected"] or v["num_truncated"]) and v["bound"] != "rejections":
        rejected = v["num_rejected"]
        lines.append(f"{rejected} request{'' if rejected == 1 else 's'} rejected, {v['num_truncated']} truncated "
                     f"(reasons below).")
    if v["next_commands"]:
        lines.append(f"Next: {v['next_commands'][0]['command']}  ({v['next_commands'][0]['why']})")
    return lines


def _load_lines(v: dict, doc: dict, window: Window | None) -> list[str]:
    """The lines on the run's load: its queue, whether its window could judge it, its memory, what bound it."""
    lines, trend = [], v["queue"]
    if trend is not None:
        lines.append(_queue_line(v, trend, doc))
    if v["window_too_short"]:
        lines.append(f"Caution: the steady window ({window.length:.3g} s) is shorter than {STEADY_LATENCIES} "
                     f"latencies of the warm-up's requests ({v['warmup_latency']:.3g} s each): too short to judge; "
                     f"give --requests {v['steady_requests']} or more.")
    kv_full, preemptions = v["kv_full_share"], v["preemptions"]
    if kv_full is not None:
        tight = v["state"] == "keeps up" and (kv_full >= TIGHT_FULL_SHARE or preemptions > 0)
        lines.append(f"KV cache full {kv_full:.0%} of the steady window; {preemptions} preemptions in the run"
                     + (" (memory is tight: latency suffers before the queue grows)." if tight else "."))
    lines.append(f"Bound by {v['bound']}: {v['bound_reason']}.")
    return lines


def _queue_line(v: dict, trend: dict, doc: dict) -> str:
    if v["inconclusive"]:
        return (f"UNDECIDED: requests piled up in the system (+{trend['in_system_growth']:.0f} over the steady "
                f"window, {trend['in_system_slope']:.3g} req/s), but the window is too short to tell the engine "
                f"filling up from an overload.")
    if v["overloaded"] and trend["waiting_growing"]:
        return (f"OVERLOADED: the waiting queue keeps growing (+{trend['growth']:.0f} requests over "
                f"the steady window, {trend['slope']:.3g} req/s); latencies grow with the run's length.")
    if v["overloaded"]:
        return (f"OVERLOADED: requests pile up in the running batch (+{trend['in_system_growth']:.0f} in the system "
                f"over the steady window, {trend['in_system_slope']:.3g} req/s): completions fall behind arrivals, "
                f"and every step slows as the batch grows; latencies grow with the run's length.")
    if v["saturated"]:
        return (f"SATURATED: the waiting queue does not keep growing but requests queue up (mean "
                f"{trend['mean_waiting']:.1f}, max {trend['max_waiting']} waiting; TTFT p99 "
                f"{doc.get('ttft_p99') or 0:.3g} s): the engine runs at its limit.")
    return f"Keeps up: the waiting queue stays short (mean {trend['mean_waiting']:.1f}, max {trend['max_waiting']})."


def _round_rate(x: float) -> str:
    return f"{x:.3g}"


def _next_closed_loop_commands(bound: str, params: dict, command: Callable[..., str],
                               most: int | None = None) -> list[dict]:
    """What to run next after a closed loop: more or fewer clients (never a rate: the clients set it), no more
    than `most` (the conversations they keep active: vLLM's multi-turn benchmark refuses more clients)."""
    clients = params["concurrency"]
    most = most or math.inf

    def counts(*factors: float) -> str:
        return ",".join(str(n) for n in dict.fromkeys(min(most, max(1, round(clients * f))) for f in factors))
    if bound == "arrival rate":
        return [{"command": command(concurrency=counts(1, 2, 4, 8)), "why": "find where more clients start to wait"},
                {"command": command(capacity=True, concurrency="max"),
                 "why": "the most concurrent clients within an SLO"}]
    if bound in ("memory", "compute"):
        tp = params.get("tp", 1)
        if params.get("pd"):        # more GPUs for a P/D run: its binding pool's replicas (planner/runs/pipeline.py)
            return [{"command": command(concurrency=counts(0.25, 0.5, 0.75)), "why": "client counts this setup serves"}]
        return [{"command": command(concurrency=counts(0.25, 0.5, 0.75)), "why": "client counts this setup serves"},
                {"command": command(tp=tp * 2), "why": "twice the GPUs" + (", more than twice the KV cache"
                                                                         if bound == "memory" else "")}]
    return []


def _next_commands(bound: str, params: dict, requested: float | None, served: float | None,
                   command: Callable[..., str] | None, enough: int | None = None,
                   timed: bool = False, most_clients: int | None = None) -> list[dict]:
    """`enough`: the requests a steady window long enough to judge needs, when the run's was too short."""
    if command is None:
        return []
    if params.get("concurrency"):
        return _next_closed_loop_commands(bound, params, command, most_clients)
    base = requested or served or 1.0
    trace_file = "--trace" in command().split()          # a trace file holds only the requests it has
    longer = {"requests": enough, "duration": None} if enough and not trace_file else {}
    if bound == "arrival rate":
        rates = ",".join(_round_rate(base * f) for f in (1, 1.5, 2, 3))
        return [{"command": command(rate=rates, **longer), "why": "find where the queue starts to grow"},
                {"command": command(capacity=True), "why": "the highest rate within an SLO"}]
    if bound in ("memory", "compute"):
        lower = ",".join(_round_rate(base * f) for f in (0.5, 0.75, 0.9))
        cmds = [{"command": command(rate=lower, **longer), "why": "rates this setup can sustain"}]
        tp = params.get("tp", 1)
        if params.get("pd"):        # more GPUs for a P/D run: its binding pool's replicas (planner/runs/pipeline.py)
            return cmds
        if bound == "memory":
            cmds.append({"command": command(tp=tp * 2), "why": "twice the GPUs, more than twice the KV cache"})
        else:
            cmds.append({"command": command(tp=tp * 2), "why": "split the compute over more GPUs"})
        return cmds
    if timed:     # arrivals spread already: too few of them for a steady window
        if trace_file:
            return []
        return [{"command": command(requests=enough or ENOUGH_REQUESTS, duration=None),
                 "why": "enough requests for a steady window"}]
    return [{"command": command(rate=_round_rate(base)), "why": "give a rate so arrivals spread out"}]


# -- sweeps and capacity ------------------------------------------------------------------

def sweep_verdict(runs: list[dict], swept: list[str]) -> dict:
    """The best run of a sweep and one line per run.

    Best: among the runs that keep up (queue short, nothing rejected; saturated or undecided runs only
    when none keeps up), the highest served rate when the rate is swept, else the lowest steady
    normalized latency.
    """
    def ok(run: dict, allow_saturated: bool) -> bool:
        v = run.get("verdict", {})
        closed_loop = bool(v.get("concurrency"))    # its clients wait on their own requests: queues are expected
        at_limit = v.get("saturated") or v.get("inconclusive")      # (undecided: maybe overloaded)
        return (not v.get("overloaded") and (allow_saturated or closed_loop or not at_limit)
                and not run.get("num_rejected"))

    def latency(run: dict) -> float:
        s = run.get("steady_state") or {}
        value = s.get("normalized_latency") or run.get("normalized_latency")
        return value if value is not None else math.inf

    candidates = ([i for i, r in enumerate(runs) if ok(r, False)]
                  or [i for i, r in enumerate(runs) if ok(r, True)])
    best = None
    if candidates:
        if "rate" in swept or "concurrency" in swept:
            best = max(candidates, key=lambda i: ((runs[i].get("request_throughput") or 0), -latency(runs[i])))
        else:
            best = min(candidates, key=lambda i: latency(runs[i]))
    rule_short = "highest served rate that keeps up" if {"rate", "concurrency"} & set(swept) else "lowest latency that keeps up"
    lines = []
    for run in runs:
        v = run.get("verdict", {})
        lines.append(f"{run_label(run, swept)}: {v.get('state', '?')}, "
                     f"bound by {v.get('bound', '?')}, served {_fmt_rate(run.get('request_throughput'))}")
    summary = (f"Best: {run_label(runs[best], swept)} ({rule_short}: {_fmt_rate(runs[best].get('request_throughput'))}"
               f" served, {(latency(runs[best])):.4g} s/token steady normalized latency)" if best is not None
               else "No run keeps up: every configuration is overloaded or rejects requests; lower the rate.")
    rule = ("highest served rate among runs that keep up" if {"rate", "concurrency"} & set(swept)
            else "lowest steady normalized latency among runs that keep up")
    notes = []
    if "block_size" in swept:
        full = max((r.get("verdict", {}).get("kv_full_share") or 0) for r in runs)
        notes.append("Block size acts twice: on memory (a sequence wastes at most one partly filled block; "
                     "this matters only while the KV cache is full, here at most "
                     f"{full:.0%} of the time) and, in the roofline and calibrated cost models, on decode-attention "
                     "kernel speed (factors measured on our kernel; see the cost model notes).")
        if _identical(runs):
            notes.append("The block sizes gave identical results: the cache never filled and the cost model has "
                         "no kernel factor for these sizes.")
    return {"best_index": best, "best_rule": rule, "lines": [summary] + lines + notes, "swept": swept}


def _identical(runs: list[dict]) -> bool:
    keys = ("normalized_latency", "request_throughput", "mean_batch_size")
    return len(runs) > 1 and all(all(r.get(k) == runs[0].get(k) for k in keys) for r in runs)


def run_label(run: dict, swept: list[str]) -> str:
    """'rate 2.0, block 16, orca-max': the settings that tell a sweep's runs apart."""
    p, deployment = run.get("params", {}), run.get("deployment", {})
    parts = []
    for key in swept or ["allocator", "block_size", "rate"]:
        if key == "rate":
            parts.append(f"rate {p.get('trace_params', {}).get('rate')}")
        elif key == "concurrency":
            parts.append(f"concurrency {p.get('concurrency')}")
        elif key == "block_size":
            parts.append(f"block {p.get('block_size')}")
        elif key == "allocator":
            parts.append(str(p.get("allocator")))
        else:
            parts.append(f"{key.replace('_', ' ')} {deployment.get(key)}")
    return ", ".join(parts)


def binding_slo(slos: dict[str, float], probes: list[tuple[float, bool, dict]], capacity: float | None,
                attainment: float | None = None) -> str | None:
    """What fails first above the capacity: at the lowest failing rate, the SLO furthest over its limit,
    'num_rejected' when requests were rejected, 'queue_growth' when every SLO held but requests kept piling up
    (or piled up on a window too short to tell); judged by an SLO `attainment`, 'slo_attainment' when too few
    requests met every limit."""
    above = sorted((r, d) for r, ok, d in probes if not ok and (capacity is None or r > capacity))
    if not above:
        return None
    _, doc = above[0]
    if attainment is not None:
        share = slo_attainment(doc)
        return "slo_attainment" if share is None or share < attainment else "queue_growth"
    if doc.get("num_rejected"):
        return "num_rejected"
    ratios = {k: (doc.get(k) or math.inf) / v for k, v in slos.items()}
    worst = max(ratios, key=ratios.get)
    verdict = doc.get("verdict") or {}
    if ratios[worst] <= 1 and (verdict.get("overloaded") or verdict.get("inconclusive")):
        return "queue_growth"
    return worst
