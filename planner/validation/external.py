"""Validation against a deployment the planner does not run: a live endpoint, or a recorded run.

- ``validate_endpoint``: `planner bench` replays the trace against the
  endpoint; the simulator runs the same trace with the deployment's settings
  (flags first, else what the server exposes on /metrics and /v1/models).
- ``validate_measured``: a recorded run (per-request JSONL, the planner's own
  requests.csv, or vLLM bench's ``--save-detailed`` JSON) is turned into the
  trace it replayed and the per-request records it measured.

Both produce the same ``Validation`` as the in-process run, so the report and
its comparison table are the same.
"""
from __future__ import annotations

import csv
import math
import re
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from pathlib import Path

import httpx

from engine.core.metrics import RequestRecord, compute_metrics
from engine.deployment import Deployment
from engine.unicode_text import has_lone_surrogate
from planner.documents import read_json
from planner.bench.client import BenchConfig, api_base, bench_metrics, run_bench
from planner.deploy.plan import plan_deployment
from planner.errors import PlannerError
from planner.profile.check import ProfileCheck
from planner.runs.pipeline import build_cost_model
from planner.runs.trace_warnings import trace_warnings
from planner.sim import simulate
from planner.sim.clients import SERVED_TURNAROUND
from planner.validation.compare import COMPARED, LiveRun, Validation, metric
from planner.validation.spec import ValidationSpec
from planner.validation.spread import simulate_spread
from workloads import Trace, TraceRequest
from workloads.clients import ClientKnobs
from workloads.trace_files import MAX_ARRIVAL_TIME, MAX_TOKENS


# The engine settings a flag or a server may tell: the deployment's, bar what it runs on.
SETTINGS = tuple(f.name for f in fields(Deployment) if f.name not in ("model", "gpu", "tp"))


def merge_settings(layers: list[tuple[dict, str]]) -> tuple[dict, dict[str, str]]:
    """Each setting's first value over `layers` ((values, source), most trusted first: the flags, then
    /metrics, then /v1/models), typed (Prometheus labels are strings), and where each came from."""
    values: dict = {}
    sources: dict[str, str] = {}
    for given, source in layers:
        for name in SETTINGS:
            raw = given.get(name)
            if name in values or raw in (None, "", "None"):
                continue
            try:
                values[name] = raw if isinstance(raw, bool) else Deployment.parse_value(name, raw)
            except ValueError:
                continue
            sources[name] = source
    return values, sources


_LABELS = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass
class EndpointReading:
    """What a server tells of itself, where it does: deployment settings from /metrics and /v1/models,
    its preemptions so far, and the torch threads its engine computes with (ours)."""

    metrics: dict
    models: dict
    preemptions: float | None = None
    threads: int | None = None
    adapters: tuple[str, ...] = ()     # its LoRA adapters, as /v1/models lists them (entries with a parent)


def read_endpoint_settings(endpoint: str, timeout: float = 10.0) -> EndpointReading:
    """The server's /metrics and /v1/models, read (what it does not expose stays empty). A server that takes the
    connection and then says nothing is refused at the first read, not after every read's timeout."""
    base = api_base(endpoint)
    metrics: dict = {}
    preemptions = threads = None
    try:
        text = httpx.get(base[:-3] + "/metrics", timeout=timeout).text
        for line in text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in ("vllm:cache_config_info", "planner:scheduler_config_info"):
                metrics.update(dict(_LABELS.findall(line)))
            elif name == "vllm:num_preemptions_total":
                count = float(line.rsplit(" ", 1)[-1])
                preemptions = (preemptions or 0.0) + count if math.isfinite(count) else preemptions
            elif name == "planner:engine_threads":
                threads = int(float(line.rsplit(" ", 1)[-1]))
    except httpx.TimeoutException:
        raise PlannerError(f"{base[:-3]}/metrics: no answer within {timeout:g} s (the server takes connections "
                           f"but does not answer)") from None
    except (httpx.HTTPError, ValueError, OverflowError):
        pass   # not every server exposes /metrics, nor a page that makes sense
    models: dict = {}
    adapters: tuple[str, ...] = ()
    try:
        data = httpx.get(base + "/models", timeout=timeout).json()["data"]
        if data[0].get("max_model_len"):
            models["max_model_len"] = data[0]["max_model_len"]
        # vLLM lists the base model, then each LoRA adapter with its base model as `parent`, in id order
        adapters = tuple(str(entry["id"]) for entry in data[1:] if entry.get("parent"))
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError, AttributeError):
        pass   # a list not shaped as vLLM's: the settings it would give stay unknown
    return EndpointReading(metrics, models, preemptions, threads, adapters)


def _compare(spec: ValidationSpec, trace: Trace, records: list[RequestRecord], measured: dict, kernels: str,
             settings: dict) -> Validation:
    """Simulate `trace` on the deployment the settings describe and set it beside what was measured."""
    deployment = Deployment.of(spec.deployment, **settings)
    spec = replace(spec, deployment=deployment)
    plan = plan_deployment(deployment, refuse=False)        # it ran: whatever vLLM refuses, it did not
    cost = build_cost_model(plan, None, spec.profile)
    sim = simulate(trace, plan, cost, seed=spec.seed, **spec.clients)
    live = LiveRun(records, [], [], measured, plan.num_gpu_blocks, plan.num_cpu_blocks, plan.max_model_len,
                   plan.max_num_batched_tokens, kernels, max_num_seqs=plan.deployment.max_num_seqs)
    result = Validation(spec, plan.model, live, sim.summary(), sim.steps, sim.requests, cost.name,
                        warnings=trace_warnings(trace, plan.deployment, spec.concurrency))
    result.spread = simulate_spread(trace, plan, cost, seeds=spec.seeds, sim_seed=spec.seed, metric_of=metric,
                                    metrics=COMPARED, clients=spec.clients)
    return result


# -- a live endpoint ----------------------------------------------------------------------
@contextmanager
def torch_threads(count: int | None):
    """Torch computing with `count` threads for a while (None: as it is)."""
    if count is None:
        yield
        return
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _adapters_for(trace: Trace, reading: EndpointReading, settings: dict) -> tuple[str, ...]:
    """The names to send a trace's LoRA adapters under: the server's, in its /v1/models order (adapter k the
    k-th, as the server numbers them); () for a trace without adapters. Refused in one line when the server
    lists too few, or the deployment was not said to serve them."""
    top = max((r.lora for r in trace.requests), default=0)
    if not top:
        return ()
    if not settings.get("enable_lora"):
        raise PlannerError("the trace's requests run LoRA adapters: give --enable-lora, --max-loras and "
                           "--max-lora-rank as the server runs them")
    if len(reading.adapters) < top:
        raise PlannerError(f"the trace's requests run LoRA adapters 1 to {top}, and the server lists "
                           f"{len(reading.adapters)} (/v1/models entries with a parent): serve as many, or give "
                           f"-p loras={len(reading.adapters)}")
    return reading.adapters[:top]


def validate_endpoint(endpoint: str, spec: ValidationSpec, flags: dict, *, served_model: str | None = None,
                      progress=None, profile_around=None) -> tuple[Validation, dict[str, str]]:
    """`planner bench` replays the spec's trace against the endpoint; the simulator runs it with the
    deployment's settings (`flags` first, then what the server exposes). `profile_around(block_size)`, if
    given, makes a ProfileAround for the server's block size: it profiles this machine's device right before and right
    after the bench, and its profile prices the simulation.
    Returns the validation and where each setting came from."""
    reading = read_endpoint_settings(endpoint)
    served = {"client_turnaround": SERVED_TURNAROUND} if spec.concurrency is not None else {}
    settings, sources = merge_settings([(flags, "flag"), (reading.metrics, "/metrics"),
                                        (reading.models, "/v1/models"), (served, "a served client's")])
    trace = spec.trace()
    fresh = None
    if profile_around is not None:
        fresh = profile_around(settings.get("block_size", spec.deployment.block_size))
        with torch_threads(reading.threads):    # the profile times the engine as the server runs it
            fresh.before_run()
    clients = {f.name: flags[f.name] for f in fields(ClientKnobs) if f.name in flags}
    results, _ = run_bench(trace, BenchConfig(endpoint, served_model, seed=spec.seed,
                                              max_concurrency=spec.concurrency, **clients,
                                              lora_modules=_adapters_for(trace, reading, settings)), progress)
    if fresh is not None:
        with torch_threads(reading.threads):
            spec = replace(spec, profile=str(fresh.after_run()))
    if not any(r.success for r in results):
        first = next((r.error for r in results if r.error), "no answer")
        raise PlannerError(f"every request to {endpoint} failed (the first: {first}): nothing measured to compare")
    measured = bench_metrics(results)
    after = read_endpoint_settings(endpoint).preemptions
    if reading.preemptions is not None and after is not None:
        measured["preemptions"] = {"total": after - reading.preemptions}
    result = _compare(spec, trace, [r.record() for r in results], measured, f"endpoint {endpoint}", settings)
    if fresh is not None:     # the report says how the profile was timed, and how far the device drifted
        result.profile_check = ProfileCheck("ok", fresh.describe()).as_dict()
    return result, sources


# -- a recorded run ----------------------------------------------------------------------
class MeasuredFileError(PlannerError):
    pass


@dataclass
class Measured:
    request_id: str
    arrival: float
    prompt_len: int
    output_len: int
    first_token: float | None
    finish: float | None
    failed: bool = False
    error: str | None = None


ALIASES = {"arrival": ("arrival_time", "arrival", "queued_time", "queued", "start"),
           "prompt_len": ("prompt_len", "input_len", "prompt_tokens"),
           "output_len": ("output_len", "output_tokens", "completion_tokens"),
           "first_token": ("first_token_time", "first_token"),
           "finish": ("finish_time", "finish", "end_time")}


def _number(value, where: str, key: str) -> float:
    if isinstance(value, bool):          # JSON's true would read as 1
        raise MeasuredFileError(f"{where}: field {key!r} is not a number: {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise MeasuredFileError(f"{where}: field {key!r} is not a number: {value!r}") from None
    if not math.isfinite(number):
        raise MeasuredFileError(f"{where}: field {key!r} is out of range: {value!r}")
    return number


def _tokens(value, where: str, key: str) -> int:
    """A token count, held to a trace file's cap (a recording's 1e308 would be simulated token by token)."""
    number = _number(value, where, key)
    if not 0 <= number <= MAX_TOKENS:
        raise MeasuredFileError(f"{where}: field {key!r} is out of range: {value!r} (0 to {MAX_TOKENS:,} tokens)")
    if number != int(number):
        raise MeasuredFileError(f"{where}: field {key!r} is not a whole number of tokens: {value!r}")
    return int(number)


def _field(row: dict, name: str, where: str, *, required: bool = True, kind=float):
    for key in ALIASES[name]:
        if key in row and row[key] not in (None, ""):
            return _tokens(row[key], where, key) if kind is int else _number(row[key], where, key)
    if required:
        raise MeasuredFileError(f"{where}: field {ALIASES[name][0]!r} is missing (also accepted: "
                                f"{', '.join(ALIASES[name][1:])})")
    return None


def _from_row(row: dict, i: int, where: str) -> Measured:
    failed = str(row.get("rejected", "")).lower() == "true" or str(row.get("success", "true")).lower() == "false"
    req = Measured(str(row.get("request_id") or i), _field(row, "arrival", where),
                   _field(row, "prompt_len", where, kind=int),
                   _field(row, "output_len", where, kind=int, required=not failed) or 0,
                   _field(row, "first_token", where, required=not failed),
                   _field(row, "finish", where, required=not failed), failed,
                   row.get("error") or row.get("reject_reason") or None)
    if has_lone_surrogate(req.request_id):
        raise MeasuredFileError(f"{where}: request_id holds a lone UTF-16 surrogate (not valid Unicode)")
    if req.prompt_len < 1:      # a failed request's too: the simulation replays it
        raise MeasuredFileError(f"{where}: prompt_len must be at least 1")
    if not failed and not req.arrival <= req.first_token <= req.finish:
        raise MeasuredFileError(f"{where}: times must satisfy arrival <= first_token <= finish")
    if not failed and req.output_len < 1:
        raise MeasuredFileError(f"{where}: output_len must be at least 1")
    return req


def _read_jsonl(path: Path) -> list[Measured]:
    out = []
    for line_no, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not raw.strip():
            continue
        try:
            row = read_json(raw)
        except ValueError as exc:
            raise MeasuredFileError(f"{path}:{line_no}: {exc}") from None
        if not isinstance(row, dict):
            raise MeasuredFileError(f"{path}:{line_no}: expected a JSON object per line")
        out.append(_from_row(row, len(out), f"{path}:{line_no}"))
    return out


def _read_csv(path: Path) -> list[Measured]:
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        try:
            rows = list(reader)
        except csv.Error as exc:     # (a cell past the csv module's limit, a NUL byte)
            # (line_num: the last line read whole; the row at fault is the next)
            raise MeasuredFileError(f"{path}:{reader.line_num + 1}: not a CSV row ({exc})") from None
    out = []
    for i, row in enumerate(rows):
        if None in row:
            raise MeasuredFileError(f"{path}:{i + 2}: more cells than the header has")
        r = dict(row)
        if r.get("start"):   # planner bench: the request was sent at start, not its trace arrival
            r["arrival"] = r["start"]
        out.append(_from_row(r, i, f"{path}:{i + 2}"))
    return out


def _read_vllm_detailed(path: Path, doc: dict) -> list[Measured]:
    need = ("input_lens", "output_lens", "ttfts", "itls", "start_times")
    for key in need:
        if key not in doc:
            why = " (vLLM bench writes it in newer versions; arrival times are unknown without it)" \
                if key == "start_times" else " (run vLLM bench with --save-detailed)"
            raise MeasuredFileError(f"{path}: field {key!r} is missing{why}")
        if not isinstance(doc[key], list) or len(doc[key]) != len(doc["input_lens"]):
            raise MeasuredFileError(f"{path}: field {key!r} must be a list as long as 'input_lens'")
    errors = doc.get("errors") or [""] * len(doc["input_lens"])
    if not isinstance(errors, list) or len(errors) != len(doc["input_lens"]):
        raise MeasuredFileError(f"{path}: field 'errors' must be a list as long as 'input_lens'")
    bad = next((i for i, e in enumerate(errors) if not (e is None or isinstance(e, str))), None)
    if bad is not None:
        raise MeasuredFileError(f"{path}: entry {bad}: field 'errors' must hold a message or null, not {errors[bad]!r}")
    starts = [_number(t, f"{path}: entry {i}", "start_times") for i, t in enumerate(doc["start_times"])]
    origin = min(starts, default=0.0)
    out = []
    for i, (p, o, ttft, itl, start) in enumerate(zip(doc["input_lens"], doc["output_lens"], doc["ttfts"],
                                                      doc["itls"], starts)):
        where = f"{path}: entry {i}"
        arrival = start - origin
        failed = bool(errors[i]) or not o
        first = finish = None
        if not failed:
            if not isinstance(itl, list):
                raise MeasuredFileError(f"{where}: field 'itls' must be a list of inter-token latencies")
            gaps = [_number(x, where, "itls") for x in itl]
            tokens = _tokens(o, where, "output_lens")
            if len(gaps) >= tokens:                  # (n tokens: at most n - 1 gaps)
                raise MeasuredFileError(f"{where}: 'itls' holds {len(gaps)} gaps, more than its {tokens} output "
                                        f"tokens allow")
            first = arrival + _number(ttft, where, "ttfts")
            if first < arrival or any(g < 0 for g in gaps):
                raise MeasuredFileError(f"{where}: 'ttfts' and 'itls' must not be negative")
            finish = first + sum(gaps)
        prompt_len = _tokens(p, where, "input_lens")
        if prompt_len < 1:            # a failed request's too: the simulation replays it
            raise MeasuredFileError(f"{where}: field 'input_lens' must be at least 1")
        out.append(Measured(str(i), arrival, prompt_len, _tokens(o or 0, where, "output_lens"), first, finish,
                            failed, errors[i] or None))
    return out


def read_measured(path: str | Path) -> list[Measured]:
    """Per-request measurements from a JSONL, a requests.csv, or a vLLM bench --save-detailed JSON."""
    path = Path(path)
    if not path.is_file():
        raise MeasuredFileError(f"{path}: {'a folder, not a file' if path.is_dir() else 'no such file'}")
    try:
        if path.suffix == ".csv":
            rows = _read_csv(path)
        else:
            text = path.read_text(encoding="utf-8")
            try:
                doc = read_json(text)
            except ValueError:      # (JSON Lines, or damaged: read line by line, which names the line)
                doc = None
            if isinstance(doc, dict) and "input_lens" in doc:
                rows = _read_vllm_detailed(path, doc)
            else:
                rows = _read_jsonl(path)
    except UnicodeDecodeError as exc:
        raise MeasuredFileError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if not rows:
        raise MeasuredFileError(f"{path}: no requests in it")
    origin = min(r.arrival for r in rows)
    late = max(rows, key=lambda r: r.arrival)
    if late.arrival - origin > MAX_ARRIVAL_TIME:
        raise MeasuredFileError(f"{path}: request {late.request_id} arrives {late.arrival - origin:g} s after the "
                                f"first, over the cap of {MAX_ARRIVAL_TIME:,.0f} s")
    ids = Counter(r.request_id for r in rows)
    twice = next((i for i, n in ids.items() if n > 1), None)
    if twice is not None:
        raise MeasuredFileError(f"{path}: request_id {twice!r} appears {ids[twice]} times (each request once)")
    slow = next((r for r in rows if not r.failed and r.finish - origin > 2 * MAX_ARRIVAL_TIME), None)
    if slow is not None:
        raise MeasuredFileError(f"{path}: request {slow.request_id} ends {slow.finish - origin:g} s after the first "
                                f"arrival, over the cap of {2 * MAX_ARRIVAL_TIME:,.0f} s")
    for r in rows:   # time 0 = the first arrival
        r.arrival -= origin
        if r.first_token is not None:
            r.first_token -= origin
            r.finish -= origin
    rows.sort(key=lambda r: r.arrival)
    return rows


def measured_records(rows: list[Measured]) -> list[RequestRecord]:
    records = []
    for r in rows:
        if r.failed:
            records.append(RequestRecord(r.request_id, r.arrival, r.prompt_len, 0, finish=r.arrival,
                                         rejected=True, reject_reason=r.error or "failed"))
            continue
        # Only first-token and finish times are recorded: spread the tokens evenly
        # between them, so TPOT is (finish - first token) / (output_len - 1).
        n = r.output_len
        gap = (r.finish - r.first_token) / (n - 1) if n > 1 else 0.0
        records.append(RequestRecord(r.request_id, r.arrival, r.prompt_len, n, first_token=r.first_token,
                                     finish=r.finish, token_times=[r.first_token + i * gap for i in range(n)]))
    return records


def validate_measured(path: str | Path, spec: ValidationSpec, flags: dict) -> tuple[Validation, dict[str, str]]:
    """A recorded run turned into the trace it replayed and the records it measured, then simulated."""
    rows = read_measured(path)
    if all(r.failed for r in rows):
        raise MeasuredFileError(f"{path}: every request in it failed: nothing measured to compare")
    trace = Trace([TraceRequest(request_id=f"{i}-{r.request_id}", arrival_time=r.arrival, prompt_len=r.prompt_len,
                                output_len=max(r.output_len, 1)) for i, r in enumerate(rows)], name=Path(path).name)
    records = measured_records(rows)
    measured = compute_metrics(records, [])
    for key in [k for k in measured if k.startswith("itl_")]:
        measured.pop(key)      # not recorded: gaps between tokens are unknown
    measured.pop("preemptions", None)
    settings, sources = merge_settings([(flags, "flag")])
    spec = replace(spec, workload=Path(path).name, recording=str(path), requests=len(rows), length_scale=1.0)
    return _compare(spec, trace, records, measured, f"recorded run {Path(path).name}", settings), sources
