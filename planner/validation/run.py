"""`planner validate` in process: the live engine and the simulator on the same trace, side by side.

The live run replays the trace online on this machine's device; the simulator
then runs the same trace once, with the live engine's exact cache size and
limits, priced by the calibrated cost model. Both use the same scheduler and
block manager, so every difference comes from predicted step times. The same
trace is then simulated `spec.seeds` more times with the profile's timing
noise, for the interval each measurement is judged against
(planner/validation/spread.py).

The profile: the one for this device and deployment, checked first (its
fingerprint and a canary); a stale one, or any with `reprofile=True`, is
replaced by a quick profile timed along the live run (between its steps, on a
CPU; around it, on a GPU), which also gives the device's speed through the
run. With `spec.attribution` the error is also split by source (replays of the
live step times, and the simulation without the speed correction).
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from planner.catalog import GpuSpec, ModelSpec, resolve_gpu
from planner.cost.calibrated import CalibratedCostModel
from planner.cost.shape import CostModel
from planner.cost.wrappers import ScaledCostModel
from planner.deploy.parallel import check_parallel
from planner.deploy.plan import plan_deployment
from planner.errors import PlannerError
from planner.profile.check import (ProfileCheck, check_profile, check_settings, engine_dtype, find_profile,
                                   pin_live_device, require_device)
from planner.profile.checkpoints import model_folder
from planner.profile.schema import profile_path
from planner.profile.speed import SpeedLevel, canary_probe
from planner.runs.trace_warnings import trace_warnings
from planner.sim import simulate
from planner.sim.engine import check_adapters_served
from planner.validation.attribution import run_attribution
from planner.validation.compare import COMPARED, LiveRun, Validation, metric
from planner.validation.live import run_live, speculation_curves
from planner.validation.spec import ValidationSpec
from planner.validation.spread import simulate_spread


def check_device(gpu_name: str) -> GpuSpec:
    """The catalog entry for ``gpu_name``, if such a device is here to run the live engine on."""
    gpu = resolve_gpu(gpu_name)
    require_device(gpu)
    return gpu


def load_cost_model(spec: ValidationSpec, model: ModelSpec, profile: str | Path | None = None) -> CalibratedCostModel:
    """The calibrated model of `profile`, else of the profile matching the deployment on its device."""
    d = spec.deployment
    gpu = resolve_gpu(d.gpu)
    given = profile or spec.profile
    path = Path(given) if given else profile_path(gpu.name, model.name)
    if not given:
        found, near_miss = find_profile(path.parent, model, block_size=d.block_size, dtype=engine_dtype(gpu), tp=1)
        if near_miss:
            raise PlannerError(near_miss.replace("not used", "does not match this run"))
        path = found or path
    if not path.exists():
        raise PlannerError(f"no profile at {path}: run `planner profile --gpu {gpu.name} --model {d.model}` "
                           f"first, or pass --profile FILE")
    cost = CalibratedCostModel.from_file(path, model=model, gpu=gpu)
    check_settings(cost.profile, path, block_size=d.block_size, dtype=engine_dtype(gpu), tp=1)
    return cost


def trusted_profile(spec: ValidationSpec, *, refuse_stale: bool, say=print) -> tuple[CalibratedCostModel, ProfileCheck]:
    """The profile validate would use and its check (fingerprint, canary); a stale one is refused when asked."""
    folder, model = model_folder(spec.deployment.model)
    cost_model = load_cost_model(spec, model)
    check = check_profile(cost_model.profile, cost_model.source, model_folder=folder)
    say(check.headline())
    if check.status == "stale" and refuse_stale:
        raise PlannerError(f"profile {cost_model.source} is stale ({check.reason}); run `planner profile "
                           f"--gpu {spec.deployment.gpu}` again, or drop --no-reprofile to re-profile now")
    return cost_model, check


def check_adapters(spec: ValidationSpec, trace) -> None:
    """The simulation's refusal of adapters the deployment does not serve, said before the live run."""
    check_adapters_served(spec.deployment, trace)


def lora_check(spec: ValidationSpec, cost_model: CalibratedCostModel, check: ProfileCheck, *,
               refuse: bool) -> ProfileCheck:
    """`check`, or a stale one when the deployment serves LoRA adapters and the profile did not time
    adapters of its rank (refused when asked)."""
    d = spec.deployment
    if not d.enable_lora or cost_model.lora_rank == d.max_lora_rank:
        return check
    timed = "no LoRA adapter" if cost_model.lora_rank is None else f"adapters of rank {cost_model.lora_rank}"
    reason = f"it timed {timed}, not of --max-lora-rank {d.max_lora_rank}"
    if refuse:
        raise PlannerError(f"profile {cost_model.source}: {reason}; drop --no-reprofile to profile them now")
    return ProfileCheck("stale", reason)


def validate(spec: ValidationSpec, *, reprofile: bool | None = None, profile_out: Path | None = None,
             cost_model: CostModel | None = None, fresh=None, progress=None, say=print) -> Validation:
    """Validate `spec`. `reprofile`: True profiles this device along the run; None does so when the
    profile is stale; False refuses a stale one. `cost_model` prices the run as given, and `fresh` is a
    profile to time along it (planner/profile/along.py), instead of the profile's (tests)."""
    check_device(spec.deployment.gpu)
    check_adapters(spec, spec.trace())
    folder, model = model_folder(spec.deployment.model)
    from engine.llm_engine import check_runnable     # torch: imported only when a live run is on
    check_runnable(spec.deployment, folder)          # refuse what the engine cannot run before profiling
    check_parallel(model, spec.deployment)           # and a layout the simulation would refuse after the run
    check = None
    if cost_model is None and fresh is None:
        if not reprofile:
            cost_model, check = trusted_profile(spec, refuse_stale=reprofile is False, say=say)
            check = lora_check(spec, cost_model, check, refuse=reprofile is False)
        if reprofile or check.status == "stale":
            from planner.profile.along import profile_for_live_run     # torch: only a re-profiling run needs it
            fresh = profile_for_live_run(spec.deployment.gpu, spec.deployment.model, spec.deployment.block_size,
                                         profile_out or Path("profile.json"),
                                         span_s=spec.trace().stats()["duration"], say=say, lora=spec.deployment)
    result = _run_and_compare(spec, folder, model, cost_model, fresh, progress)
    if fresh is not None:
        replaced = f"; the profile it replaces was stale: {check.reason}" if check is not None else ""
        check = ProfileCheck("ok", fresh.describe() + replaced)
        say(check.headline())
    result.profile_check = None if check is None else check.as_dict()
    return result


def _run_and_compare(spec: ValidationSpec, folder: str, model: ModelSpec, cost_model: CostModel | None, fresh,
                     progress) -> Validation:
    """The live run (profiled along it with `fresh`), then the simulations of the same trace."""
    trace = spec.trace()
    device, dtype, probe = live_setup(resolve_gpu(spec.deployment.gpu), cost_model, fresh)
    live = run_live(trace, folder, spec, device=device, dtype=dtype, progress=progress, speed_probe=probe,
                    profiler=fresh)
    timeline = None
    if fresh is not None:
        cost_model = load_cost_model(spec, model, fresh.after_run())
        timeline = fresh.timeline
        if timeline is not None:
            timeline.applied = spec.speed_correction is not False
    level = SpeedLevel(*live.speed, applied=spec.speed_correction is True) if probe else None
    return _compare(spec, trace, model, live, cost_model, level, timeline)


def _compare(spec: ValidationSpec, trace, model: ModelSpec, live: LiveRun, cost_model: CostModel,
             level: SpeedLevel | None, timeline) -> Validation:
    """The simulation of the live run's trace (and its noisy seeds, and the attribution when asked), priced as
    the run's speed says, beside what was measured."""
    factor = level.factor if level is not None and level.applied else None
    priced = ScaledCostModel(cost_model, factor) if factor is not None else cost_model
    speed = timeline if timeline is not None and timeline.applied else None
    plan = _plan_of(spec, live)
    sim = simulate(trace, plan, priced, seed=spec.seed, **spec.clients, device_speed=speed)
    step_errors = [priced.step_time(shape) * (speed(step.start) if speed else 1.0) / step.duration - 1
                   for shape, step in zip(live.shapes, live.steps) if step.duration > 0]
    result = Validation(spec, model, live, sim.summary(), sim.steps, sim.requests, priced.name, step_errors,
                        speed_level=level, speed_timeline=timeline,
                        warnings=trace_warnings(trace, plan.deployment, spec.concurrency))
    result.spread = simulate_spread(trace, plan, cost_model, seeds=spec.seeds, sim_seed=spec.seed, metric_of=metric,
                                    metrics=COMPARED, speed_factor=factor, timeline=speed, clients=spec.clients)
    if spec.attribution:
        result.attribution = run_attribution(trace, plan, priced, live.steps, live.requests, live.metrics,
                                             result.simulated, seed=spec.seed, clients=spec.clients)
        if priced is not cost_model or speed is not None:
            result.uncorrected = simulate(trace, plan, cost_model, seed=spec.seed, **spec.clients).summary()
    return result


def _plan_of(spec: ValidationSpec, live: LiveRun):
    """The deployment as the live engine ran it: its exact cache and limits (no refusals: it ran). With
    --speculative ngram:K, the simulation drafts and accepts by the curves the live run measured (those not
    given by --acceptance and --draft-rates)."""
    deployment = spec.deployment
    if deployment.speculative is not None:
        measured = speculation_curves(live.spec_decoding)
        deployment = deployment.replace(**{name: curve for name, curve in measured.items()
                                           if getattr(deployment, name) is None})
    return plan_deployment(deployment.replace(num_gpu_blocks=live.num_gpu_blocks,
                                              num_cpu_blocks=live.num_cpu_blocks,
                                              max_model_len=live.max_model_len,
                                              max_num_batched_tokens=live.max_num_batched_tokens,
                                              async_scheduling=False,    # as the live engine schedules
                                              **live_limits(live.max_num_seqs, live.enable_prefix_caching)),
                           refuse=False)


def live_limits(max_num_seqs: int | None, enable_prefix_caching: bool | None) -> dict:
    """The limits a live engine resolved for its own device, for the simulation that replays it (those a
    recorded run does not say are left to the plan)."""
    found = {"max_num_seqs": max_num_seqs, "enable_prefix_caching": enable_prefix_caching}
    return {name: value for name, value in found.items() if value is not None}


def live_setup(gpu: GpuSpec, cost_model: CostModel | None, fresh) -> tuple[str, str, Callable | None]:
    """The live engine's device and dtype, and the canary probe to time beside its run: a profile timed
    along or around the run (`fresh`, started here) gives its own device and measures the device's drift
    itself; any other profile pins the device and is set beside canaries."""
    if fresh is not None:
        fresh.before_run()
        return (*fresh.live_device(), None)
    profile = getattr(cost_model, "profile", None)
    if profile is None:
        return (*_default_device(gpu), None)
    return (*pin_live_device(gpu, profile), canary_probe(profile))


def _default_device(gpu: GpuSpec) -> tuple[str, str]:
    """Where the live engine runs without a profile to pin it: fp16 on a GPU, the checkpoint's dtype on a CPU."""
    return ("cuda", "float16") if gpu.kind == "gpu" else ("cpu", "auto")
