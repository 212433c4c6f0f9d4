"""`planner validate --replicas K [--router POLICY]`: a live fleet and the simulated fleet on the same trace.

The live fleet is K real engines stepping in turn on their own clocks
(fleet_live.py says why: on a shared CPU, K processes would time each other);
the simulated fleet is `simulate_fleet` with the live engines' exact cache
and limits, priced by the calibrated cost model, behind the same policy object
(engine/core/routing.py). Its profile is the one validate would use: the
shipped one when its check passes, else (or with --reprofile) a quick
profile timed between the live fleet's steps, so the simulator is priced by
the machine as it ran. Compared: fleet throughput (target 5%), mean E2E
(10%), each replica's share of the requests (5 percentage points), and the
prefix-cache hit rate (10%); TTFT and TPOT are reported beside them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from engine.core.routing import RouterPolicy
from planner.catalog import resolve_gpu
from planner.cost.shape import CostModel
from planner.cost.wrappers import ScaledCostModel
from planner.deploy.plan import plan_deployment
from planner.documents import json_safe
from planner.profile.checkpoints import model_folder
from planner.profile.speed import SpeedLevel
from planner.runs.trace_warnings import trace_warnings
from planner.sim.engine import SimResult
from planner.sim.fleet import simulate_fleet
from planner.validation.fleet_live import LiveFleet, run_live_fleets
from planner.validation.run import (check_adapters, check_device, live_limits, live_setup, load_cost_model,
                                   lora_check, trusted_profile)
from planner.validation.report import warning_lines
from planner.validation.spec import ValidationSpec

# Relative error allowed per fleet metric (issue 25); None: reported, not judged.
FLEET_TARGETS = {"request_throughput": 0.05, "output_token_throughput": None, "e2e_mean": 0.10,
                 "ttft_mean": None, "tpot_mean": None, "prefix_cache_hit_rate": 0.10}
SPLIT_TARGET_PP = 5.0      # each replica's share of the requests, percentage points


@dataclass
class FleetValidation:
    spec: ValidationSpec
    policy: str
    live: LiveFleet
    sim: SimResult
    cost_model: str
    profile_note: str
    speed: str = ""            # the device's speed level during the run, and whether the simulation followed it
    uncorrected: dict | None = None   # with the speed level applied: the fleet simulated at the profile's speed

    def simulated_shares(self) -> list[float]:
        count = len(self.live.replicas)
        routes = self.sim.fleet.routes if self.sim.fleet is not None else [0] * len(self.live.routes)
        return [routes.count(i) / len(routes) for i in range(count)]

    def comparison(self) -> dict:
        """Per metric: measured, simulated, relative error, target, within; and the per-replica split."""
        measured = {**self.live.metrics, "prefix_cache_hit_rate": self.live.prefix_cache_hit_rate}
        simulated = {**self.sim.summary(), "prefix_cache_hit_rate": self.sim.prefix_cache_hit_rate}
        rows = {}
        for name, target in FLEET_TARGETS.items():
            m, s = measured.get(name), simulated.get(name)
            error = None if m is None or s is None or m == 0 else s / m - 1
            rows[name] = {"measured": m, "simulated": s, "relative_error": error, "target": target,
                          "within": None if target is None or error is None else abs(error) <= target}
        total = len(self.live.routes)
        split = []
        for i, sim_share in enumerate(self.simulated_shares()):
            live_share = self.live.routes.count(i) / total if total else 0.0
            diff = 100 * (sim_share - live_share)
            split.append({"replica": i, "live_share": live_share, "simulated_share": sim_share,
                          "difference_pp": diff, "within": abs(diff) <= SPLIT_TARGET_PP})
        return {"metrics": rows, "split": split}

    def document(self) -> dict:
        d = self.spec.deployment
        return json_safe({"model": d.model, "gpu": d.gpu, "replicas": len(self.live.replicas), "router": self.policy,
                          "workload": self.spec.workload, "workload_params": dict(self.spec.params),
                          "requests": self.spec.requests,
                          "rate": self.spec.request_rate,
                          "burstiness": self.spec.burstiness, "concurrency": self.spec.concurrency,
                          "ramp_up": self.spec.ramp_up.record() if self.spec.ramp_up else None,
                          "length_scale": self.spec.length_scale, "max_output_len": self.spec.max_output_len,
                          "seed": self.spec.seed, "enable_prefix_caching": d.prefix_caching_on,
                          "cost_model": self.cost_model, "profile": self.profile_note, "speed": self.speed,
                          "live_kind": "in-process replicas stepping in turn (planner/validation/fleet_live.py)",
                          "simulated_without_speed_level": self.uncorrected, "warnings": self.sim.warnings,
                          **self.comparison()})


def validate_fleet(spec: ValidationSpec, replicas: int, policy: RouterPolicy, *, reprofile: bool | None = None,
                   profile_out: Path | None = None, cost_model: CostModel | None = None, progress=None,
                   say=print) -> FleetValidation:
    """The live fleet, then its simulation (see the module). `cost_model` prices it as given (tests, studies)."""
    return validate_fleets(spec, replicas, [policy], reprofile=reprofile, profile_out=profile_out,
                           cost_model=cost_model, progress=progress, say=say)[0]


def validate_fleets(spec: ValidationSpec, replicas: int, policies: list[RouterPolicy], *,
                    reprofile: bool | None = None, profile_out: Path | None = None,
                    cost_model: CostModel | None = None, progress=None, say=print) -> list[FleetValidation]:
    """One live fleet per policy, replayed together so a drifting machine slows them alike
    (fleet_live.run_live_fleets), then each one's simulation."""
    check_device(spec.deployment.gpu)
    folder, model = model_folder(spec.deployment.model)
    gpu = resolve_gpu(spec.deployment.gpu)
    trace = spec.trace()
    check_adapters(spec, trace)
    fresh, note = None, "given"
    if cost_model is None:
        check = None
        if not reprofile:
            cost_model, check = trusted_profile(spec, refuse_stale=reprofile is False, say=say)
            check = lora_check(spec, cost_model, check, refuse=reprofile is False)
            note = check.headline()
        if reprofile or check.status == "stale":
            from planner.profile.along import profile_for_live_run  # torch: only a re-profiling run needs it
            fresh = profile_for_live_run(spec.deployment.gpu, spec.deployment.model, spec.deployment.block_size,
                                         profile_out or Path("profile.json"), span_s=trace.stats()["duration"],
                                         say=say, lora=spec.deployment)
    device, dtype, probe = live_setup(gpu, cost_model, fresh)
    lives = run_live_fleets(trace, folder, spec, replicas, policies, device=device, dtype=dtype, profiler=fresh,
                            progress=progress, speed_probe=probe)
    speed, unscaled = "", None
    if fresh is not None:
        cost_model = load_cost_model(spec, model, fresh.after_run())
        note = fresh.describe()
    elif probe is not None:
        level = SpeedLevel(*lives[0].speed, applied=spec.speed_correction is True and None not in lives[0].speed)
        speed = level.headline()
        if level.applied:
            unscaled, cost_model = cost_model, ScaledCostModel(cost_model, level.factor)
    return [_simulated(spec, trace, live, policy, cost_model, unscaled, note, speed)
            for live, policy in zip(lives, policies)]


def _simulated(spec: ValidationSpec, trace, live: LiveFleet, policy: RouterPolicy, cost_model: CostModel,
               unscaled: CostModel | None, note: str, speed: str) -> FleetValidation:
    """The simulated fleet of the live one's trace, cache and limits, beside it."""
    engine = live.replicas[0].engine
    replicas = len(live.replicas)
    plan = plan_deployment(spec.deployment.replace(num_gpu_blocks=engine.runner.num_gpu_blocks,
                                                   num_cpu_blocks=engine.runner.num_cpu_blocks,
                                                   max_model_len=engine.max_model_len,
                                                   max_num_batched_tokens=engine.scheduler.config.max_num_batched_tokens,
                                                   async_scheduling=engine.deployment.async_scheduling,
                                                   **live_limits(engine.deployment.max_num_seqs,
                                                                 engine.deployment.enable_prefix_caching)),
                           refuse=False)
    sim = simulate_fleet(trace, plan, cost_model, replicas=replicas, router=policy, seed=spec.seed, **spec.clients)
    sim.warnings = trace_warnings(trace, plan.deployment, spec.concurrency)
    uncorrected = None
    if unscaled is not None:
        other = simulate_fleet(trace, plan, unscaled, replicas=replicas, router=policy, seed=spec.seed,
                               **spec.clients).summary()
        uncorrected = {name: other.get(name) for name in FLEET_TARGETS}
    return FleetValidation(spec, policy.name, live, sim, cost_model.name, note, speed, uncorrected)


def write_fleet_report(result: FleetValidation, folder: Path) -> Path:
    """fleet.json (the comparison) and report.md (its tables) in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    doc = result.document()
    (folder / "fleet.json").write_text(json.dumps(doc, indent=2) + "\n")
    (folder / "report.md").write_text(fleet_markdown(doc))
    return folder / "fleet.json"


def fleet_markdown(doc: dict) -> str:
    lines = [f"# Fleet validation: {doc['replicas']} x {doc['model']} on {doc['gpu']}, router {doc['router']}", "",
             f"{doc['requests']} {doc['workload']} requests at {doc['rate']} req/s; live: {doc['live_kind']}; "
             f"simulated with {doc['cost_model']} ({doc['profile']}). {doc['speed']}", "",
             "| metric | live | simulated | error | target |", "|---|---|---|---|---|"]
    for name, row in doc["metrics"].items():
        target = "" if row["within"] is None else f"{row['target']:.0%} {'ok' if row['within'] else 'MISSED'}"
        error = "" if row["relative_error"] is None else f"{row['relative_error']:+.1%}"
        lines.append(f"| {name} | {_num(row['measured'])} | {_num(row['simulated'])} | {error} | {target} |")
    lines += ["", "| replica | live share | simulated share | difference (pp) | within 5 pp |", "|---|---|---|---|---|"]
    for row in doc["split"]:
        lines.append(f"| {row['replica']} | {row['live_share']:.1%} | {row['simulated_share']:.1%} | "
                     f"{row['difference_pp']:+.1f} | {'yes' if row['within'] else 'NO'} |")
    lines += warning_lines(doc["warnings"])
    return "\n".join(lines) + "\n"


def _num(value) -> str:
    return "–" if value is None else f"{value:.4g}"
