"""planner validate: the live engine and the simulator on the same trace, side by side.

The live run replays the trace online: each request is released when the
wall clock reaches its arrival time, and the engine steps as fast as it can.
The simulator then runs the same trace with the engine's exact cache size and
limits, stepping with the calibrated cost model. Because both use the same
scheduler and block manager, every difference comes from predicted step times.
"""
from __future__ import annotations

import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from engine.core.metrics import RequestRecord, StepRecord, compute_metrics, percentile
from engine.core.sampling_params import SamplingParams
from planner.catalog import ModelSpec, resolve_gpu
from planner.cost.shape import CostModel, StepShape, step_shape
from planner.errors import PlannerError
from planner.validation.attribution import run_attribution
from planner.profile.checkpoints import model_folder
from planner.profile.check import (check_settings, engine_dtype, find_profile, pin_live_device,
                                    require_device)
from planner.sim import SimConfig, simulate
from planner.cost.wrappers import ScaledCostModel
from planner.profile.speed import SpeedLevel, SpeedTimeline, canary_probe
from workloads import Trace, make_trace

if TYPE_CHECKING:                       # imports torch: only a re-profiling validation needs it
    from planner.profile.along import ProfileAlong
    from planner.profile.around import ProfileAround

# Metrics compared, in report order.
COMPARED = ("request_throughput", "output_token_throughput", "ttft_mean", "ttft_median", "ttft_p99",
            "tpot_mean", "tpot_median", "tpot_p99", "itl_mean", "itl_p99", "e2e_mean", "e2e_median", "e2e_p99",
            "normalized_latency", "mean_batch_size", "mean_prefill_batch_size", "kv_utilization", "preemptions",
            "step_time_median")


@dataclass
class ValidateConfig:
    gpu: str = "cpu"
    model: str = "opt-125m"
    workload: str = "sharegpt"
    rate: float = 4.0
    requests: int = 64
    seed: int = 0
    length_scale: float = 0.25           # CPU runs: shrink lengths so a run takes minutes
    max_prompt_len: int = 512
    max_output_len: int = 256
    block_size: int = 16
    num_gpu_blocks: int | None = None    # small values force memory pressure (preemption)
    preemption_mode: str = "recompute"
    max_num_seqs: int = 32
    kv_cache_memory_bytes: int = 1 << 30
    profile: str | None = None
    enable_chunked_prefill: bool = False         # both sides schedule with vLLM v1's policy
    # Follow the device's speed during the live run (planner/profile/speed.py). None: the timeline of a profile
    # timed along the run, yes; a canary speed level, no (True applies either, False neither).
    speed_correction: bool | None = None
    max_num_batched_tokens: int | None = None
    # The live engine's device and dtype: pinned to the profile's by validate() (planner/profile/check.py).
    device: str = "auto"
    dtype: str = "auto"

    def trace(self) -> Trace:
        if self.rate <= 0:
            raise PlannerError(f"rate must be positive, got {self.rate}")
        if self.requests < 1:
            raise PlannerError(f"requests must be at least 1, got {self.requests}")
        trace = make_trace(self.workload, num_requests=self.requests, rate=self.rate, seed=self.seed)
        return trace.scaled(length_scale=self.length_scale, max_prompt_len=self.max_prompt_len,
                            max_output_len=self.max_output_len)


@dataclass
class LiveRun:
    requests: list[RequestRecord]
    steps: list[StepRecord]
    shapes: list[StepShape]
    metrics: dict
    num_gpu_blocks: int
    num_cpu_blocks: int
    max_model_len: int
    max_num_batched_tokens: int
    kernels: str
    speed: tuple[float | None, float | None] = (None, None)   # canary ratios before and after the run


@dataclass
class Validation:
    config: ValidateConfig
    spec: ModelSpec
    live: LiveRun
    simulated: dict
    sim_steps: list[StepRecord]
    sim_requests: list[RequestRecord]
    cost_model: str
    step_errors: list[float] = field(default_factory=list)   # per live step: predicted / measured - 1
    attribution: dict | None = None      # the error split by source (planner/validation/attribution.py)
    profile_check: dict | None = None    # ProfileCheck.as_dict() of the profile used, when it was checked
    speed_level: SpeedLevel | None = None
    speed_timeline: SpeedTimeline | None = None   # the device's speed through the run (profiled along it)
    uncorrected: dict | None = None      # the simulated metrics without the speed level or timeline

    def comparison(self) -> dict[str, dict[str, float | None]]:
        rows = {}
        for name in COMPARED:
            measured, simulated = _metric(self.live.metrics, name), _metric(self.simulated, name)
            rows[name] = {"measured": measured, "simulated": simulated,
                          "relative_error": _relative(measured, simulated)}
        return rows

    def uncorrected_errors(self) -> dict[str, float | None]:
        """Relative errors of the headline metrics had the simulation used the profile as it is, at one speed."""
        if self.uncorrected is None:
            return {}
        return {name: _relative(_metric(self.live.metrics, name), _metric(self.uncorrected, name))
                for name in ("request_throughput", "e2e_mean", "step_time_median")}

    def step_error_summary(self) -> dict[str, float]:
        errs = [abs(e) for e in self.step_errors]
        if not errs:
            return {}
        return {"median_abs": percentile(errs, 50), "p90_abs": percentile(errs, 90),
                "mean": sum(self.step_errors) / len(self.step_errors), "num_steps": len(errs)}


def _relative(measured: float | None, simulated: float | None) -> float | None:
    return None if measured is None or simulated is None or measured == 0 else simulated / measured - 1


def _metric(metrics: dict, name: str) -> float | None:
    value = metrics.get(name)
    if name == "preemptions" and isinstance(value, dict):
        return float(value.get("total", 0))
    return None if value is None else float(value)


class TraceClock:
    """Seconds since ``start()``, less the time spent ``paused()``: the trace's own time axis, read by
    the live engine."""

    def __init__(self) -> None:
        self.origin = time.perf_counter()

    def start(self) -> None:
        self.origin = time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self.origin

    @contextmanager
    def paused(self):
        """Work done inside (profiling between steps) takes no trace time: arrivals and stamps skip it."""
        stopped = time.perf_counter()
        try:
            yield
        finally:
            self.origin += time.perf_counter() - stopped


def run_live(trace: Trace, folder: str, cfg: ValidateConfig, *, progress=None, speed_probe=None,
             between_steps=None) -> LiveRun:
    """Replay ``trace`` online against the wall clock on the real engine.

    ``between_steps(busy_s, now)``, if given, is called after each step with the step's wall time and the
    trace time, with the trace clock paused (a profile timed along the run: planner/profile/along.py).

    ``speed_probe(runner) -> ratio``, if given, times the device on the engine's own runner right
    before the run (its KV cache still empty) and right after it (planner/profile/speed.py).
    """
    from cuda_ext import ops_for
    from engine.llm_engine import LLMEngine

    shapes: list[StepShape] = []
    clock = TraceClock()
    # The device and dtype `planner profile` times (planner.profile.device): fp16 on a GPU; when a
    # profile prices the run, validate() has pinned both to the profile's (cfg.device, cfg.dtype).
    on_gpu = resolve_gpu(cfg.gpu).kind == "gpu"
    device = cfg.device if cfg.device != "auto" else ("cuda" if on_gpu else "cpu")
    dtype = cfg.dtype if cfg.dtype != "auto" else ("float16" if on_gpu else "auto")
    engine = LLMEngine(folder, block_size=cfg.block_size, num_gpu_blocks=cfg.num_gpu_blocks,
                       device=device, dtype=dtype,
                       preemption_mode=cfg.preemption_mode, max_num_seqs=cfg.max_num_seqs,
                       kv_cache_memory_bytes=cfg.kv_cache_memory_bytes, seed=cfg.seed,
                       enable_chunked_prefill=cfg.enable_chunked_prefill,
                       max_num_batched_tokens=cfg.max_num_batched_tokens, clock=clock,
                       step_observer=lambda out: shapes.append(step_shape(out)))
    vocab = engine.runner.vocab_size
    groups = []
    before = speed_probe(engine.runner) if speed_probe else None
    _warm_up(engine, vocab)
    shapes.clear()
    pending = deque(trace.requests)
    done = 0
    clock.start()   # trace time 0: the first arrival is due now
    while pending or engine.has_unfinished_requests():
        now = engine.clock()
        while pending and pending[0].arrival_time <= now:
            req = pending.popleft()
            engine.add_request(req.request_id, {"prompt_token_ids": trace.prompt_token_ids(req, vocab, cfg.seed)},
                               req.sampling_params(), arrival_time=req.arrival_time, output_len_hint=req.output_len)
            groups.append(engine.groups[req.request_id])
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, pending[0].arrival_time - engine.clock()))
            continue
        began = time.perf_counter()
        finished = engine.step()
        if between_steps is not None:
            busy_s, now = time.perf_counter() - began, clock()
            with clock.paused():
                between_steps(busy_s, now)
        done += len(finished)
        if progress is not None and finished:
            progress(done, len(trace))
    after = speed_probe(engine.runner) if speed_probe else None
    requests = [RequestRecord.from_group(g) for g in groups]
    steps = engine.steps
    return LiveRun(requests, steps, shapes, compute_metrics(requests, steps, engine.scheduler.preemptions),
                   engine.runner.num_gpu_blocks, engine.runner.num_cpu_blocks, engine.max_model_len,
                   engine.scheduler.config.max_num_batched_tokens, ops_for(engine.runner.device).backend,
                   (before, after))


def _warm_up(engine, vocab: int) -> None:
    """One throw-away request so one-time costs (kernel build, allocator warm-up) stay out of the timings."""
    engine.add_request("__warmup__", {"prompt_token_ids": list(range(4, 4 + min(32, vocab - 4)))},
                       SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    engine.steps.clear()


def load_cost_model(cfg: ValidateConfig, spec: ModelSpec) -> CostModel:
    from planner.cost.calibrated import CalibratedCostModel, profile_path

    gpu = resolve_gpu(cfg.gpu)
    path = Path(cfg.profile) if cfg.profile else profile_path(gpu.name, spec.name)
    if not cfg.profile:
        found, near_miss = find_profile(path.parent, spec, block_size=cfg.block_size, dtype=engine_dtype(gpu), tp=1)
        if near_miss:
            raise PlannerError(near_miss.replace("not used", "does not match this run"))
        path = found or path
    if not path.exists():
        raise PlannerError(f"no profile at {path}: run `planner profile --gpu {gpu.name} --model {cfg.model}` "
                           f"first, or pass --profile FILE")
    model = CalibratedCostModel.from_file(path, model=spec, gpu=gpu)
    check_settings(model.profile, path, block_size=cfg.block_size, dtype=engine_dtype(gpu), tp=1)
    return model


def trusted_profile(cfg: ValidateConfig, *, refuse_stale: bool, say=print):
    """Check the profile validate would use (fingerprint, canary); a stale one is refused when asked."""
    from planner.profile.check import check_profile

    folder, spec = model_folder(cfg.model)
    model = load_cost_model(cfg, spec)
    check = check_profile(model.profile, model.source, model_folder=folder)
    say(check.headline())
    if check.status == "stale" and refuse_stale:
        raise PlannerError(f"profile {model.source} is stale ({check.reason}); run `planner profile "
                           f"--gpu {cfg.gpu}` again, or drop --no-reprofile to re-profile now")
    return check


def check_device(gpu_name: str):
    """The catalog entry for ``gpu_name``, if such a device is here to run the live engine on."""
    gpu = resolve_gpu(gpu_name)
    require_device(gpu)
    return gpu


def validate(cfg: ValidateConfig, *, progress=None, cost_model: CostModel | None = None,
             fresh: ProfileAround | ProfileAlong | None = None) -> Validation:
    """Run both and compare. ``cost_model`` defaults to the calibrated model of the profile; with
    ``fresh``, of a profile of this device taken now: along the live run (before it, between its steps,
    after it) on a CPU, around it on a GPU (planner/profile/along.py)."""
    trace = cfg.trace()
    gpu = check_device(cfg.gpu)
    folder, spec = model_folder(cfg.model)
    if fresh is not None:
        cfg.profile = str(fresh.before_run())
    if cost_model is None:
        cost_model = load_cost_model(cfg, spec)
    profile = getattr(cost_model, "profile", None)
    if profile is not None and (cfg.device, cfg.dtype) == ("auto", "auto"):
        cfg.device, cfg.dtype = pin_live_device(gpu, profile)
    # A profile taken along or around the run measures the device's drift across it itself (fresh.drift).
    probe = canary_probe(profile) if profile is not None and fresh is None else None
    live = run_live(trace, folder, cfg, progress=progress, speed_probe=probe,
                    between_steps=fresh.between_steps if fresh is not None else None)
    timeline = None
    if fresh is not None:
        cfg.profile = str(fresh.after_run())
        cost_model = load_cost_model(cfg, spec)
        timeline = fresh.timeline
        if timeline is not None:
            timeline.applied = cfg.speed_correction is not False
    level = SpeedLevel(*live.speed, applied=cfg.speed_correction is True) if probe else None
    raw_model = cost_model
    if level is not None and level.applied and level.factor is not None:
        cost_model = ScaledCostModel(cost_model, level.factor)
    sim_cfg = SimConfig(model=spec, gpu=gpu, block_size=cfg.block_size, preemption_mode=cfg.preemption_mode,
                        max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=live.max_num_batched_tokens,
                        num_gpu_blocks=live.num_gpu_blocks, num_cpu_blocks=live.num_cpu_blocks,
                        max_model_len=live.max_model_len, seed=cfg.seed,
                        enable_chunked_prefill=cfg.enable_chunked_prefill)
    speed = timeline if timeline is not None and timeline.applied else None
    sim = simulate(trace, sim_cfg, cost_model, device_speed=speed)
    step_errors = [cost_model.step_time(shape) * (speed(step.start) if speed else 1.0) / step.duration - 1
                   for shape, step in zip(live.shapes, live.steps) if step.duration > 0]
    attribution = run_attribution(trace, sim_cfg, cost_model, live.steps, live.requests, live.metrics, sim.metrics)
    corrected = cost_model is not raw_model or speed is not None
    uncorrected = simulate(trace, sim_cfg, raw_model).metrics if corrected else None
    return Validation(cfg, spec, live, sim.metrics, sim.steps, sim.requests, cost_model.name, step_errors,
                      attribution, speed_level=level, speed_timeline=timeline, uncorrected=uncorrected)
