"""One run, start to end: spec -> (plan, cost model), built once -> simulate -> analysis -> `RunResult`.

`Simulation.prepare(spec)` resolves the deployment and builds its cost model
once; `run()` simulates a load on it (the spec's, or another rate or seed of
it: capacity probes and seeds reuse the preparation). `run(spec)` is the
whole pipeline for one spec; `run_document(spec)` is what a worker process
sends back (the result document, without per-request records).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from planner.analysis.pd import PD_NOTE, with_pd_verdict
from planner.analysis.verdict import analyse_run
from planner.catalog.links import resolve_link
from planner.cost.block_size import factor_source
from planner.cost.calibrated import CalibratedCostModel
from planner.cost.calibration import load_calibration
from planner.cost.lora import LoraCost, LoraPricer
from planner.cost.not_modelled import not_modelled
from planner.cost.offload import OffloadCost, WeightStreamCost
from planner.cost.select import select_cost_model
from planner.cost.shape import CostModel
from planner.cost.wrappers import with_timing_noise
from planner.deploy.plan import DeploymentPlan, plan_deployment
from planner.deploy.speculation import proposer_model
from planner.errors import PlannerError
from planner.runs.result import RunResult
from planner.runs.spec import Load, RunSpec
from planner.runs.trace_warnings import trace_warnings
from planner.sim import SimResult, simulate
from planner.sim.engine import collector_paused
from planner.sim.fleet import simulate_fleet
from planner.sim.memory_guard import check_replicas
from planner.sim.pd import KvPath, Pool, simulate_pd
from planner.sim.pipeline import host_hidden
from workloads import Trace
from workloads.clients import ClientKnobs, check_clients


FLEET_NOTE = ("the router's own latency and the network between router and replicas (a request reaches its "
              "replica the instant it arrives); the router sees its own count of requests in flight and what "
              "each replica published at the end of its last step, never a step in progress")


def with_pool_command(verdict: dict, spec: RunSpec) -> dict:
    """A P/D run's next command: when a pool queues, one more replica of it (a deployment setting suggested for
    the run as a whole could be a pool's own, which the pool's setting would override)."""
    found = verdict["pd"]
    if not found["saturated"]:
        return verdict
    pd = spec.pd
    more = replace(pd, decode=pd.decode + 1) if found["binds"] == "decode" else replace(pd, prefill=pd.prefill + 1)
    first = {"command": spec.command(pd=more), "why": f"one more {found['binds']} replica"}
    lines = [line for line in verdict["lines"] if not line.startswith("Next:")]
    return {**verdict, "next_commands": [first, *verdict["next_commands"]],
            "lines": [*lines, f"Next: {first['command']}  ({first['why']})"]}


def build_cost_model(plan: DeploymentPlan, cost_model: str | None = None, profile: str | None = None) -> CostModel:
    """The cost model pricing `plan` (--cost-model, --profile); its `name` says which source it uses. With
    --enable-lora, a calibrated profile prices the adapters it timed; the measured and roofline models get the
    adapters' kernels added (planner/cost/lora.py)."""
    d = plan.deployment
    base = select_cost_model(plan.model, plan.gpu, tp=d.tp, dtype_bytes=plan.dtype_bytes, block_size=d.block_size,
                             profile=profile, cost_model=cost_model, weight_format=plan.weight_format,
                             kv_cache_dtype=d.kv_cache_dtype, moe=plan.moe_parallel, max_num_seqs=d.max_num_seqs,
                             max_num_batched_tokens=plan.max_num_batched_tokens,
                             async_scheduling=host_hidden(d), node_link=d.node_link,
                             custom_all_reduce=not d.disable_custom_all_reduce, performance_mode=d.performance_mode,
                             speculative_tokens=d.num_speculative_tokens,
                             lora_rank=d.max_lora_rank if d.enable_lora else None)
    if d.enable_lora and not isinstance(base, CalibratedCostModel):
        floor = load_calibration().elementwise_floor_s      # a kernel's launch and ramp in a graph (fitted)
        base = LoraCost(base, LoraPricer(plan.model, plan.gpu, d.tp, d.max_lora_rank, floor, plan.dtype_bytes))
    if plan.offload_blocks and not isinstance(base, CalibratedCostModel):    # (a profile prices them as swaps)
        base = OffloadCost(base, plan.block_bytes_per_gpu / plan.gpu.host_link_bandwidth)
    if plan.cpu_offload_bytes_per_gpu:
        base = WeightStreamCost(base, plan.cpu_offload_bytes_per_gpu, plan.gpu.host_link_bandwidth)
    return base


PIPELINE_NOTE = ("pipeline parallelism: each stage priced as the whole step x its share of the layers (the "
                 "embedding, LM head and sampler spread with them; a roofline or profile price, which holds the "
                 "host's time, split with them too, where the measured model hides it behind the batches in "
                 "flight), the hidden states sent at the link's rate; stepped one batch at a time")


@dataclass(frozen=True)
class Pools:
    """--pd: the prefill pool, the decode pool and the KV's path between them, planned once."""

    prefill: Pool
    decode: Pool
    path: KvPath


def plan_pools(spec: RunSpec) -> tuple[DeploymentPlan, DeploymentPlan]:
    """The prefill pool's plan and the decode pool's (each its own GPU, TP and settings); a pool's refusal is
    said for the pool, with its own flag where it set its TP."""
    pd = spec.pd
    pd.check(spec.deployment, spec.fleet.replicas)
    plans = []
    for name, deployment in zip(("prefill", "decode"), pd.pools(spec.deployment)):
        try:
            plans.append(plan_deployment(deployment))
        except PlannerError as exc:
            own_tp = getattr(pd, f"{name}_tp") is not None
            raise PlannerError(f"the {name} pool: "
                               + (str(exc).replace("(--tp)", f"(--{name}-tp)") if own_tp else str(exc))) from None
    return plans[0], plans[1]


def prepare_pools(spec: RunSpec) -> Pools:
    """Each pool's plan and cost model, and the link's price of a KV transfer."""
    pd = spec.pd
    pools = [Pool(replicas, plan, build_cost_model(plan, spec.cost_model, spec.profile))
             for replicas, plan in zip((pd.prefill, pd.decode), plan_pools(spec))]
    prefill, decode = pools
    # both pools' block tables, refused in one line before any engine is built if they cannot fit at all
    # (a replica of --dp ranks is dp engines, each with its own tables)
    check_replicas(sum(p.replicas * p.plan.deployment.dp for p in pools),
                   max(p.plan.simulated_blocks for p in pools),
                   f"a --pd ratio of fewer replicas than {pd.ratio}")
    link = resolve_link(pd.kv_link)
    path = KvPath(link, link.stream_bandwidth(prefill.plan.gpu, decode.plan.gpu),
                  min(prefill.plan.deployment.tp, decode.plan.deployment.tp), transferred_kv_bytes(prefill.plan))
    return Pools(prefill, decode, path)


def transferred_kv_bytes(plan: DeploymentPlan) -> int:
    """The KV bytes of one token a prefill replica hands over: the target's, and a draft network's (an EAGLE or
    MTP head, a draft model: planner/deploy/speculation.py) when speculating, which drafts from the prompt's."""
    proposer = proposer_model(plan.deployment, plan.model)
    draft = proposer[0].kv_bytes_per_token(plan.kv_dtype_bytes) if proposer is not None else 0
    return plan.model.kv_bytes_per_token(plan.kv_dtype_bytes) + draft


@dataclass
class Simulation:
    """A spec made ready to run: its deployment plan and cost model, built once (with --pd, both pools';
    `plan` and `cost_model` are then the decode pool's)."""

    spec: RunSpec
    plan: DeploymentPlan
    cost_model: CostModel
    pools: Pools | None = None

    @classmethod
    def prepare(cls, spec: RunSpec) -> Simulation:
        spec.router()                             # a bad --replicas or --router fails before any planning
        if spec.deployment.pp > 1 and spec.pd is not None:
            raise PlannerError(f"--pp {spec.deployment.pp} with --pd is not modelled (a pool's engines step one "
                               f"batch at a time)")
        if spec.deployment.enable_lora and spec.pd is not None:
            raise PlannerError("--enable-lora with --pd is not modelled (the decode pool's admission of "
                               "transferred requests and their adapters)")
        if spec.deployment.kv_offloading_size and spec.pd is not None:
            raise PlannerError("--kv-offloading-size with --pd is not modelled (vLLM's disaggregated serving "
                               "takes the KV connector that CPU offloading would use)")
        if spec.pd is not None:
            pools = prepare_pools(spec)
            return cls(spec, pools.decode.plan, pools.decode.cost_model, pools)
        plan = plan_deployment(spec.deployment)
        return cls(spec, plan, build_cost_model(plan, spec.cost_model, spec.profile))

    def warnings(self, trace: Trace, load: Load | None = None) -> list[str]:
        """The plan's warnings, and those of running `trace` (of `load`, default the spec's) on it."""
        concurrency = (load or self.spec.load).concurrency
        return [*self.plan.warnings, *trace_warnings(trace, self.spec.deployment, concurrency)]

    def simulate(self, load: Load | None = None, *, trace: Trace | None = None, progress=None,
                 watch: Callable | None = None) -> SimResult:
        """Simulate `load` (default: the spec's) on this deployment; `trace` if the caller built it. The
        result's `warnings` are those of its trace on this deployment (the plan's are the plan's)."""
        load = load or self.spec.load
        # refused before the trace is made: client knobs without a closed loop
        check_clients(load.concurrency, ClientKnobs.of(self.spec.deployment))
        with collector_paused():        # the trace's requests too
            trace = trace if trace is not None else load.trace()
            sim = self._simulate(load, trace, progress, watch)
        sim.warnings = trace_warnings(trace, self.spec.deployment, load.concurrency)
        return sim

    def _simulate(self, load: Load, trace: Trace, progress, watch) -> SimResult:
        cost = with_timing_noise(self.cost_model, load.seed) if self.spec.timing_noise else self.cost_model
        fleet = self.spec.fleet
        if self.pools is not None:
            return self._simulate_pd(load, trace, progress, watch)
        replicas = fleet.replicas * self.plan.deployment.dp   # each dp replica: its own scheduler and cache
        if replicas > 1:
            return simulate_fleet(trace, self.plan, cost, replicas=replicas,
                                  router=self.spec.router(), seed=load.seed,
                                  concurrency=load.concurrency, paced=load.paced,
                                  fast_forward=not self.spec.step_by_step,
                                  progress=progress, watch=watch)
        return simulate(trace, self.plan, cost, seed=load.seed, concurrency=load.concurrency, paced=load.paced,
                        fast_forward=not self.spec.step_by_step, progress=progress, watch=watch)

    def _simulate_pd(self, load: Load, trace: Trace, progress, watch) -> SimResult:
        pools = self.pools
        if self.spec.timing_noise:
            pools = replace(pools, **{name: replace(pool, cost_model=with_timing_noise(pool.cost_model, load.seed))
                                      for name, pool in (("prefill", pools.prefill), ("decode", pools.decode))})
        return simulate_pd(trace, pools.prefill, pools.decode, pools.path, self.spec.router(),
                           seed=load.seed, concurrency=load.concurrency, paced=load.paced,
                           fast_forward=not self.spec.step_by_step,
                           progress=progress, watch=watch)

    def analyse(self, sim: SimResult, spec: RunSpec | None = None) -> RunResult:
        """The verdict, steady state, warnings and blind spots of `sim` (a run of `spec`, default this one)."""
        spec = spec or self.spec
        summary = sim.summary()
        analysis = analyse_run(summary, sim.requests, sim.steps, spec.command, dict(spec.slos) or None,
                               spec.slo_attainment, spec.deployment.max_active_conversations)
        d = spec.deployment
        notes = not_modelled(sim.cost_model, d.block_size, d.prefix_caching_on, d.preemption_mode, d.tp,
                             factor_source("cpu" if self.plan.gpu.kind == "cpu" else "cuda"))
        if sim.fleet is not None:
            notes = [*notes, FLEET_NOTE]
        if d.pp > 1:
            notes = [*notes, PIPELINE_NOTE]
        verdict = analysis["verdict"]
        if "pd" in summary:
            notes = [*notes, PD_NOTE]
            verdict = with_pool_command(with_pd_verdict(verdict, summary["pd"]), spec)
        return RunResult(spec, sim, analysis["steady_state"], verdict, [*self.plan.warnings, *sim.warnings], notes)

    def run(self, load: Load | None = None, **options) -> RunResult:
        sim = self.simulate(load, **options)
        return self.analyse(sim, self.spec if load is None else replace(self.spec, load=load))


def run(spec: RunSpec, **options) -> RunResult:
    """Simulate and analyse one spec."""
    return Simulation.prepare(spec).run(**options)


def run_document(spec: RunSpec) -> dict:
    """One spec's result document (what a worker process sends back: no per-request records)."""
    return run(spec).document()
