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
import json
import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path

import httpx

from engine.core.metrics import RequestRecord, compute_metrics
from planner.catalog import ModelSpec, resolve_gpu
from planner.cost.select import select_cost_model
from planner.errors import PlannerError
from planner.sim import SimConfig, simulate
from planner.validation.live import LiveRun, ValidateConfig, Validation
from workloads import Trace, TraceRequest


@dataclass
class Deployment:
    """Engine settings of the measured deployment, and where each came from."""

    block_size: int | None = None
    num_gpu_blocks: int | None = None
    num_cpu_blocks: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    preemption_mode: str | None = None
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = None
    gpu_memory_utilization: float | None = None
    sources: dict[str, str] = field(default_factory=dict)

    def fill(self, values: dict, source: str) -> None:
        """Set the settings still unset from ``values`` (strings from Prometheus labels are converted)."""
        for f in fields(self):
            if f.name == "sources" or getattr(self, f.name) is not None or values.get(f.name) in (None, "", "None"):
                continue
            raw = values[f.name]
            try:
                if f.name == "preemption_mode":
                    value = str(raw)
                elif f.name in ("enable_prefix_caching", "enable_chunked_prefill"):
                    value = raw if isinstance(raw, bool) else str(raw).lower() == "true"
                elif f.name == "gpu_memory_utilization":
                    value = float(raw)
                else:
                    value = int(float(raw))
            except ValueError:
                continue
            setattr(self, f.name, value)
            self.sources[f.name] = source


_LABELS = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def read_endpoint_settings(endpoint: str, timeout: float = 30.0) -> tuple[dict, dict, float | None]:
    """(settings from /metrics, settings from /v1/models, vllm:num_preemptions_total) where exposed."""
    from planner.bench.client import api_base

    base = api_base(endpoint)
    metrics: dict = {}
    preemptions = None
    try:
        text = httpx.get(base[:-3] + "/metrics", timeout=timeout).text
        for line in text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in ("vllm:cache_config_info", "planner:scheduler_config_info"):
                metrics.update(dict(_LABELS.findall(line)))
            elif name == "vllm:num_preemptions_total":
                preemptions = (preemptions or 0.0) + float(line.rsplit(" ", 1)[-1])
    except (httpx.HTTPError, ValueError):
        pass   # not every server exposes /metrics
    models: dict = {}
    try:
        entry = httpx.get(base + "/models", timeout=timeout).json()["data"][0]
        if entry.get("max_model_len"):
            models["max_model_len"] = entry["max_model_len"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError):
        pass
    return metrics, models, preemptions


def _simulate(trace: Trace, spec: ModelSpec, gpu_name: str, dep: Deployment, seed: int, tp: int,
              profile: str | None):
    gpu = resolve_gpu(gpu_name)
    block_size = dep.block_size or 16
    cfg = SimConfig(model=spec, gpu=gpu, tp=tp, block_size=block_size,
                    preemption_mode=dep.preemption_mode or "recompute", max_num_seqs=dep.max_num_seqs or 256,
                    max_num_batched_tokens=dep.max_num_batched_tokens,
                    gpu_memory_utilization=dep.gpu_memory_utilization or 0.9,
                    enable_prefix_caching=bool(dep.enable_prefix_caching),
                    enable_chunked_prefill=bool(dep.enable_chunked_prefill), num_gpu_blocks=dep.num_gpu_blocks,
                    num_cpu_blocks=dep.num_cpu_blocks, max_model_len=dep.max_model_len, seed=seed)
    cost = select_cost_model(spec, gpu, tp=tp, block_size=block_size, profile=profile)
    return simulate(trace, cfg, cost), cfg, cost


def _validation(vcfg: ValidateConfig, spec: ModelSpec, records: list[RequestRecord], measured: dict,
                sim, sim_cfg: SimConfig, cost, kernels: str) -> Validation:
    gpu_blocks, cpu_blocks, _ = sim_cfg.cache_size()
    live = LiveRun(records, [], [], measured, gpu_blocks, cpu_blocks, sim_cfg.max_model_len,
                   sim_cfg.max_num_batched_tokens, kernels)
    return Validation(vcfg, spec, live, sim.metrics, sim.steps, sim.requests, cost.name)


# -- a live endpoint ----------------------------------------------------------------------
def validate_endpoint(endpoint: str, trace: Trace, vcfg: ValidateConfig, spec: ModelSpec, dep: Deployment, *,
                      tp: int = 1, served_model: str | None = None, progress=None) -> tuple[Validation, Deployment]:
    from planner.bench.client import BenchConfig, bench_metrics, run_bench

    from_metrics, from_models, before = read_endpoint_settings(endpoint)
    dep.fill(from_metrics, "/metrics")
    dep.fill(from_models, "/v1/models")
    results, _ = run_bench(trace, BenchConfig(endpoint, served_model, seed=vcfg.seed), progress)
    measured = bench_metrics(results)
    _, _, after = read_endpoint_settings(endpoint)
    if before is not None and after is not None:
        measured["preemptions"] = {"total": after - before}
    sim, sim_cfg, cost = _simulate(trace, spec, vcfg.gpu, dep, vcfg.seed, tp, vcfg.profile)
    return _validation(vcfg, spec, [r.record() for r in results], measured, sim, sim_cfg, cost,
                       f"endpoint {endpoint}"), dep


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


def _field(row: dict, name: str, where: str, *, required: bool = True, kind=float):
    for key in ALIASES[name]:
        if key in row and row[key] not in (None, ""):
            try:
                value = kind(float(row[key])) if kind is int else float(row[key])
            except (TypeError, ValueError):
                raise MeasuredFileError(f"{where}: field {key!r} is not a number: {row[key]!r}") from None
            if not math.isfinite(value) or (kind is int and value < 0):
                raise MeasuredFileError(f"{where}: field {key!r} is out of range: {row[key]!r}")
            return value
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
    if not failed and req.prompt_len < 1:
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
            row = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise MeasuredFileError(f"{path}:{line_no}: invalid JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise MeasuredFileError(f"{path}:{line_no}: expected a JSON object per line")
        out.append(_from_row(row, len(out), f"{path}:{line_no}"))
    return out


def _read_csv(path: Path) -> list[Measured]:
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
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
    origin = min(doc["start_times"]) if doc["start_times"] else 0.0
    out = []
    for i, (p, o, ttft, itl, start) in enumerate(zip(*(doc[k] for k in need))):
        where = f"{path}: entry {i}"
        try:
            arrival = float(start) - origin
            failed = bool(errors[i]) or not o
            first = None if failed else arrival + float(ttft)
            finish = None if failed else first + sum(float(x) for x in itl)
            out.append(Measured(str(i), arrival, int(p), int(o or 0), first, finish, failed, errors[i] or None))
        except (TypeError, ValueError):
            raise MeasuredFileError(f"{where}: a field among {', '.join(need)} is not a number") from None
    return out


def read_measured(path: str | Path) -> list[Measured]:
    """Per-request measurements from a JSONL, a requests.csv, or a vLLM bench --save-detailed JSON."""
    path = Path(path)
    if not path.is_file():
        raise MeasuredFileError(f"{path}: no such file")
    if path.suffix == ".csv":
        rows = _read_csv(path)
    else:
        text = path.read_text(encoding="utf-8")
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:
            doc = None
        if isinstance(doc, dict) and "input_lens" in doc:
            rows = _read_vllm_detailed(path, doc)
        else:
            rows = _read_jsonl(path)
    if not rows:
        raise MeasuredFileError(f"{path}: no requests in it")
    origin = min(r.arrival for r in rows)
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


def validate_measured(path: str | Path, vcfg: ValidateConfig, spec: ModelSpec, dep: Deployment, *,
                      tp: int = 1) -> Validation:
    rows = read_measured(path)
    trace = Trace([TraceRequest(request_id=f"{i}-{r.request_id}", arrival_time=r.arrival, prompt_len=r.prompt_len,
                                output_len=max(r.output_len, 1)) for i, r in enumerate(rows)], name=Path(path).name)
    records = measured_records(rows)
    measured = compute_metrics(records, [])
    for key in [k for k in measured if k.startswith("itl_")]:
        measured.pop(key)      # not recorded: gaps between tokens are unknown
    measured.pop("preemptions", None)
    sim, sim_cfg, cost = _simulate(trace, spec, vcfg.gpu, dep, vcfg.seed, tp, vcfg.profile)
    return _validation(vcfg, spec, records, measured, sim, sim_cfg, cost, f"recorded run {Path(path).name}")
