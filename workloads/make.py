"""``make_trace``: a workload name (or a trace file) plus arrivals -> a Trace."""

from __future__ import annotations

import inspect
import math
from pathlib import Path

from . import generators as g
from .arrivals import RampUp, arrival_times, check_arrival_args, check_ramp_up
from .chatbot import make_chatbot
from .errors import TraceError
from .schema import TraceRequest
from .tokens import stream
from .trace import Trace
from .trace_files import over_cap

# name -> (generator, one-line description).  The generators' keyword
# arguments are the workload's parameters (and their defaults).
_GENERATORS = {
    "sharegpt": (g.gen_sharegpt, "ShareGPT-like conversations' first turns: long-tailed, mean prompt 161.31 / output 337.99"),
    "alpaca": (g.gen_alpaca, "Alpaca-like short instructions: mean prompt 19.31 / output 58.45"),
    "chatbot": (make_chatbot, "multi-turn conversations: prompt = history (last 1024 tokens), output <= 1024"),
    "prefix": (g.gen_prefix, "few-shot translation prompts sharing an 80-token (shots=1) or 341-token (shots=5) prefix"),
    "parallel": (g.gen_parallel, "Alpaca-like requests asking for n parallel samples (n=4)"),
    "beam": (g.gen_beam, "Alpaca-like requests decoded by beam search (beam_width=4)"),
    "fixed": (g.gen_fixed, "every request the same lengths (prompt_len=128, output_len=128)"),
    "uniform": (g.gen_uniform, "lengths uniform on [prompt_min, prompt_max] and [output_min, output_max]"),
    "random": (g.gen_random, "vllm bench serve's random dataset: input_len / output_len (1024 / 128), each "
                             "uniform within +-range_ratio, after a prefix of prefix_len tokens all share (0)"),
    "prefix_repetition": (g.gen_prefix_repetition, "vllm bench serve's prefix_repetition dataset: num_prefixes "
                                                   "(10) prefixes of prefix_len (256) tokens, each request one of "
                                                   "them + suffix_len (256) of its own, output_len (128)"),
}

WORKLOADS: dict[str, str] = {name: desc for name, (_, desc) in _GENERATORS.items()}

_ARRIVAL_ARGS = {"num_requests", "duration", "rate", "arrival", "cv", "seed"}
# Every built-in workload's own parameter: the share of its requests sent with priority 1 (the rest 0), drawn
# per request from a stream of its own (lengths and arrivals stay as they are); vLLM serves priority 0 first
# under --scheduling-policy priority and ignores priorities under fcfs.
PRIORITY_PARAM = "low_priority_share"
# And the LoRA adapters its requests run with (a deployment with --enable-lora): `loras` adapters (0: none, every
# request the base model), each request's chosen as vLLM bench's --lora-assignment does: "random" (its default:
# each request one at random, here with popularity falling as a power law of exponent `lora_skew`, 0 uniform as
# vLLM bench's random.choice; S-LoRA's evaluation draws adapters from a power law) or "round-robin" (in turn). A
# chatbot conversation keeps one adapter through its turns.
LORA_PARAMS = {"loras": 0, "lora_assignment": "random", "lora_skew": 0.0}
LORA_ASSIGNMENTS = ("random", "round-robin")
# And the tenants that send them (0: none): each conversation (or request) a tenant drawn uniformly from 1..K,
# its requests salted with vLLM's cache_salt "tenant-K", so that no tenant's prompt hits another's cached blocks
# (the isolation vLLM's cache_salt gives a multi-tenant server; docs/vllm.md).
TENANTS_PARAM = "tenants"
TRACE_SUFFIXES = (".jsonl", ".json", ".csv")


def workload_params(name: str) -> dict:
    """The parameters a built-in workload takes, with their defaults."""
    fn, _ = _GENERATORS[name]
    return {
        p.name: p.default
        for p in inspect.signature(fn).parameters.values()
        if p.default is not inspect.Parameter.empty and p.name not in _ARRIVAL_ARGS
    } | {PRIORITY_PARAM: 0.0} | LORA_PARAMS | {TENANTS_PARAM: 0}


# The largest magnitude a workload parameter takes (a billion tokens, turns or prefixes): past it a generator's
# arithmetic overflows or its trace could not be held, so it is refused here in one line.
MAX_PARAM = 10**9


def parse_workload_params(name: str, pairs: list[str] | tuple[str, ...]) -> dict:
    """``KEY=VALUE`` strings (the CLI's ``-p/--param``) -> typed parameters of workload ``name``.

    Each value is converted to the type of the parameter's default.  Used by
    ``planner workload show``, ``simulate`` and ``capacity`` alike.
    """
    if not pairs:
        return {}
    if is_trace_file(name):
        raise TraceError("--param: a trace file takes no workload parameters")
    if name not in _GENERATORS:
        raise TraceError(f"workload: unknown name {name!r}; built-in: {', '.join(WORKLOADS)}")
    defaults = workload_params(name)
    out = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or key not in defaults:
            raise TraceError(f"--param {pair!r}: expected KEY=VALUE with KEY one of {', '.join(defaults) or 'none'}")
        kind = type(defaults[key]) if defaults[key] is not None else int
        try:
            out[key] = kind(text.strip())
        except ValueError:
            raise TraceError(f"--param {key}: expected {kind.__name__}, got {text!r}") from None
        if not isinstance(out[key], str) and not abs(out[key]) <= MAX_PARAM:      # (NaN too)
            raise TraceError(f"--param {key}: {text.strip()} is beyond any workload; give a value of at most "
                             f"{MAX_PARAM:,}")
    return out


def is_trace_file(name: str) -> bool:
    return Path(name).suffix.lower() in TRACE_SUFFIXES


def make_trace(
    name: str,
    *,
    num_requests: int | None = None,
    duration: float | None = None,
    rate: float = math.inf,
    arrival: str = "poisson",
    cv: float = 1.0,
    seed: int = 0,
    ramp_up: RampUp | None = None,
    **params,
) -> Trace:
    """Build workload ``name`` (see WORKLOADS) or load the trace file ``name``.

    The same arguments give the same trace, byte for byte once saved: lengths
    and arrivals come from separate streams seeded by (seed, purpose), so
    changing the arrival process does not change the lengths.

    A trace file (.jsonl/.csv) keeps its own timestamps (``arrival="trace"``)
    unless a finite rate is given, which re-times it with the chosen process;
    num_requests/duration then cut it.  Generated workloads have no timestamps
    of their own, so ``arrival="trace"`` is an error for them.  A ramp-up
    (vllm bench's, arrivals.RampUp) times either instead of a rate.
    """
    if is_trace_file(name):
        return _from_file(name, num_requests, duration, rate, arrival, cv, seed, ramp_up, params)
    if name not in _GENERATORS:
        raise TraceError(f"workload: unknown name {name!r}; built-in: {', '.join(WORKLOADS)} (or a .jsonl/.csv file)")
    allowed = workload_params(name)
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise TraceError(
            f"{unknown[0]}: not a parameter of workload {name!r} (it takes: {', '.join(allowed) or 'none'})"
        )
    if arrival == "trace":
        raise TraceError(f"arrival: workload {name!r} is generated and has no timestamps; use poisson, gamma or constant")
    if num_requests is None and duration is None:
        raise TraceError("num_requests/duration: give a request count, a duration, or both")
    if ramp_up is not None:
        check_ramp_up(ramp_up, rate, num_requests, duration)
        if name == "chatbot":
            raise TraceError("ramp-up: a chatbot turn follows its conversation's previous turn, so the trace "
                             "cannot be timed request by request; give another workload or a rate")
    else:
        check_arrival_args(arrival, rate, cv, num_requests, duration)
    share = params.pop(PRIORITY_PARAM, 0.0)
    if not 0.0 <= share <= 1.0:
        raise TraceError(f"{PRIORITY_PARAM}: the share of requests sent with priority 1 must be from 0 to 1, "
                         f"got {share}")
    lora = {key: params.pop(key, default) for key, default in LORA_PARAMS.items()}
    _check_lora_params(**lora)
    tenants = params.pop(TENANTS_PARAM, 0)
    if tenants < 0:
        raise TraceError(f"{TENANTS_PARAM}: the number of tenants must be 0 (none: no request salted) or more, "
                         f"got {tenants}")
    used = allowed | params | {PRIORITY_PARAM: share} | lora | {TENANTS_PARAM: tenants}
    shared = {PRIORITY_PARAM, TENANTS_PARAM, *LORA_PARAMS}        # every workload's, not the generator's
    generated = {k: v for k, v in used.items() if k not in shared}
    fn, _ = _GENERATORS[name]
    if name == "chatbot":
        requests = fn(num_requests=num_requests, duration=duration, rate=rate, arrival=arrival, cv=cv, seed=seed,
                      **generated)
    else:
        times = arrival_times(
            stream(seed, "arrivals"), arrival=arrival, rate=rate, cv=cv, num_requests=num_requests, duration=duration,
            ramp_up=ramp_up,
        )
        fields = fn(stream(seed, "lengths", name), len(times), **generated)
        requests = [
            TraceRequest(request_id=f"{name}-{i}", arrival_time=float(t), **f)
            for i, (t, f) in enumerate(zip(times, fields))
        ]
    for req in requests:
        over = over_cap(req)
        if over is not None:
            field, problem = over
            raise TraceError(f"workload {name!r} with {_shown(generated)}: a request's {field} {problem}")
    if share:
        low = stream(seed, "priorities").random(len(requests)) < share
        requests = [r.model_copy(update={"priority": 1}) if flag else r for r, flag in zip(requests, low)]
    if lora["loras"]:
        requests = with_loras(requests, stream(seed, "loras"), **lora)
    if tenants:
        requests = with_tenants(requests, stream(seed, "tenants"), tenants)
    record = {
        "workload": name, "num_requests": num_requests, "duration": duration,
        "rate": rate, "arrival": arrival, "cv": cv, "seed": seed, **(ramp_up.record() if ramp_up else {}), **used,
    }
    return Trace(requests, name=name, params=record)


def _check_lora_params(loras: int, lora_assignment: str, lora_skew: float) -> None:
    if loras < 0:
        raise TraceError(f"loras: the number of LoRA adapters must be 0 (none) or more, got {loras}")
    if lora_assignment not in LORA_ASSIGNMENTS:
        raise TraceError(f"lora_assignment: {lora_assignment!r} is not one of {', '.join(LORA_ASSIGNMENTS)} "
                         f"(vLLM bench's --lora-assignment)")
    if not 0.0 <= lora_skew <= 4.0:
        raise TraceError(f"lora_skew: a power-law exponent from 0 (uniform) to 4, got {lora_skew}")
    if lora_skew and lora_assignment != "random":
        raise TraceError("lora_skew: only a random assignment is skewed; round-robin takes each adapter in turn")


def _senders(requests: list[TraceRequest]) -> list[str]:
    """Who sends each request: its conversation, or the request alone (a conversation keeps one adapter and
    one tenant through its turns)."""
    return [r.conversation_id if r.conversation_id is not None else f"\0{i}" for i, r in enumerate(requests)]


def with_tenants(requests: list[TraceRequest], rng, tenants: int) -> list[TraceRequest]:
    """`requests` each salted with the cache_salt of one of tenants 1..`tenants`, drawn uniformly per sender."""
    keys = _senders(requests)
    first_seen = list(dict.fromkeys(keys))
    drawn = dict(zip(first_seen, rng.integers(1, tenants + 1, size=len(first_seen))))
    return [r.model_copy(update={"cache_salt": f"tenant-{drawn[key]}"}) for r, key in zip(requests, keys)]


def with_loras(requests: list[TraceRequest], rng, loras: int, lora_assignment: str = "random",
               lora_skew: float = 0.0) -> list[TraceRequest]:
    """`requests` each with one of adapters 1..`loras`: drawn (adapter i with probability ~ i ** -lora_skew)
    or in turn, one per conversation (a request without one is its own)."""
    keys = _senders(requests)
    first_seen = list(dict.fromkeys(keys))
    if lora_assignment == "round-robin":
        chosen = {key: 1 + i % loras for i, key in enumerate(first_seen)}
    else:
        weights = [(i + 1.0) ** -lora_skew for i in range(loras)]
        drawn = rng.choice(loras, size=len(first_seen), p=[w / sum(weights) for w in weights])
        chosen = {key: 1 + int(d) for key, d in zip(first_seen, drawn)}
    return [r.model_copy(update={"lora": chosen[key]}) for r, key in zip(requests, keys)]


def _shown(params: dict) -> str:
    return ", ".join(f"{key}={value}" for key, value in params.items()) or "its defaults"


def _from_file(path, num_requests, duration, rate, arrival, cv, seed, ramp_up, params) -> Trace:
    if params:
        raise TraceError(f"{sorted(params)[0]}: a trace file takes no workload parameters")
    if duration is not None and not 0 < duration < math.inf:     # (NaN too: it compares False)
        raise TraceError(f"duration: must be a positive number of seconds of the trace to keep, got {duration}")
    trace = Trace.load(path)
    if ramp_up is not None:
        check_ramp_up(ramp_up, rate, num_requests or len(trace), duration)
        return trace.head(num_requests=num_requests).retimed(arrival=arrival, cv=cv, seed=seed, ramp_up=ramp_up)
    if arrival != "trace" and math.isfinite(rate):
        trace = trace.head(num_requests=num_requests).retimed(arrival=arrival, rate=rate, cv=cv, seed=seed)
    return trace.head(num_requests=num_requests, duration=duration)
