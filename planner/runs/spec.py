"""A run's recipe: the deployment, the load, and how its steps are priced.

A `RunSpec` holds plain, picklable values, so a worker process (or a Ray task)
can rebuild everything a run needs on its own. `command()` renders it back as
the `planner` command line that reproduces it, every setting included.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

from engine.deployment import Deployment
from planner.deploy import checks
from planner.errors import PlannerError
from planner.runs.pd import Disaggregation
from planner.runs.slos import check_attainment
from planner.sim.memory_guard import check_trace_size
from planner.sim.router import DEFAULT_ROUTER, DP_BALANCER, RouterPolicy, parse_router
from workloads import RampUp, Trace, TraceError, burstiness_arrival, make_trace
from workloads.make import is_trace_file

DEFAULT_RATE = 1.0          # requests/s for a built-in workload when none is given
DEFAULT_REQUESTS = 1000     # requests for a built-in workload when neither a count nor a duration is given


def check_ramp_up_rate(ramp_up: RampUp | None, rate: float | None) -> None:
    """A ramp-up sets the rate: vllm bench serve refuses one beside it (simulate, validate and bench alike)."""
    if ramp_up is not None and rate is not None:
        raise PlannerError("--ramp-up-strategy sets the request rate, as in vllm bench serve: drop --rate")


@dataclass(frozen=True)
class Load:
    """What arrives: a built-in workload or a trace file, how many requests and how fast."""

    workload: str = "sharegpt"          # a built-in workload, or a .jsonl/.csv trace file
    params: tuple[tuple[str, object], ...] = ()   # -p KEY=VALUE, already typed
    rate: float | None = None           # None: DEFAULT_RATE, or a trace file's own timestamps
    # vllm bench serve's --burstiness: the gaps between arrivals at the rate are gamma-distributed with this
    # shape (1: Poisson; below 1 burstier, above more regular)
    burstiness: float = 1.0
    # vllm bench serve's --ramp-up-strategy/--ramp-up-start-rps/--ramp-up-end-rps: the rate rises request by
    # request over the run (workloads/arrivals.py); instead of `rate`, with a request count
    ramp_up: RampUp | None = None
    requests: int | None = None
    duration: float | None = None       # seconds of arrivals, instead of a request count
    seed: int = 0                       # of the trace and of the sampled tokens
    # A closed loop of this many clients, each sending its next request when its previous one ends (the
    # trace gives lengths and order, not times); with a rate too, at most this many requests in flight, each
    # sent at its arrival time or, if all are out then, when one ends (vllm bench serve's --request-rate with
    # --max-concurrency); None: open loop, the trace's arrival times.
    concurrency: int | None = None

    @property
    def timed(self) -> bool:
        """Arrivals at a rate asked for: a --rate or a ramp-up."""
        return self.rate is not None or self.ramp_up is not None

    @property
    def paced(self) -> bool:
        """A limit on requests in flight over a rate's arrivals (not a closed loop alone)."""
        return self.concurrency is not None and self.timed

    def _arrival(self, rate: float) -> dict:
        """make_trace's keywords past the counts: the workload's params and the arrival process at `rate`
        (or by the ramp-up)."""
        params = dict(self.params)
        process = burstiness_arrival(self.burstiness, self.ramp_up.start_rps if self.ramp_up else rate)
        if process and {"arrival", "cv"} & set(params):
            raise PlannerError("burstiness and the params arrival and cv set the same arrival process: "
                               "give one of them")
        return {**params, **process, "ramp_up": self.ramp_up}

    def check_closed_loop(self) -> None:
        """A built-in workload's --duration times arrivals, and --burstiness shapes them, which a closed loop
        alone does not have."""
        if self.duration is not None and not self.timed and not is_trace_file(self.workload):
            raise PlannerError("--duration is seconds of arrivals, and a closed loop (--concurrency) sends each "
                               "request when the one before ends: give --requests N instead (or a --rate)")
        if self.burstiness != 1 and not self.timed:
            raise PlannerError("--burstiness shapes the gaps between arrivals at a rate, and a closed loop "
                               "(--concurrency) sends each request when the one before ends: drop it (or give a "
                               "--rate)")

    def check_ramp_up(self) -> None:
        """vllm bench's rules for a ramp-up, in the planner's words."""
        check_ramp_up_rate(self.ramp_up, self.rate)
        if self.ramp_up is not None and self.duration is not None:
            raise PlannerError("--ramp-up-strategy raises the rate request by request up to the last: give "
                               "--requests N, not --duration")

    def check_size(self) -> None:
        """Refuse, before making it, a generated trace too large for this machine's memory to simulate."""
        if is_trace_file(self.workload) or self.requests is None and self.duration is None:
            return
        rate = self.ramp_up.end_rps if self.ramp_up else DEFAULT_RATE if self.rate is None else self.rate
        check_trace_size(self.requests, self.duration, rate)

    def check(self) -> None:
        """Refuse in one line, before any work, a load no trace can be made of."""
        if self.concurrency is not None and self.concurrency < 1:
            raise PlannerError(f"concurrency must be >= 1 clients, got {self.concurrency}")
        if self.rate is not None and not self.rate > 0:
            raise PlannerError(f"rate must be > 0 requests/s, got {self.rate}")
        if self.requests is not None and self.requests < 1:
            raise PlannerError(f"requests must be >= 1, got {self.requests}")
        checks.workload(self.workload)
        self.check_ramp_up()
        if self.concurrency is not None:
            self.check_closed_loop()
        self.check_size()

    def trace(self) -> Trace:
        self.check()
        try:
            if is_trace_file(self.workload):
                rate = math.inf if self.rate is None else self.rate
                return make_trace(self.workload, num_requests=self.requests, duration=self.duration, rate=rate,
                                  seed=self.seed, **self._arrival(rate))
            requests = DEFAULT_REQUESTS if self.requests is None and self.duration is None else self.requests
            rate = (self.rate if self.rate is not None else math.inf if self.concurrency is not None or self.ramp_up
                    else DEFAULT_RATE)
            trace = make_trace(self.workload, num_requests=requests, duration=self.duration, rate=rate,
                               seed=self.seed, **self._arrival(rate))
        except TraceError as exc:
            raise PlannerError(str(exc)) from None
        if not len(trace):
            raise PlannerError(f"the {self.workload} trace is empty (duration {self.duration} s at {rate} req/s)")
        return trace


@dataclass(frozen=True)
class Fleet:
    """Who serves the load: `replicas` identical copies of the deployment behind a router
    (planner/sim/router.py). A topology of the run, not a knob of one replica's deployment."""

    replicas: int = 1
    # None: round-robin over replicas (and a P/D pool's instances); over the data-parallel ranks of one
    # deployment, vLLM's own balancer.
    router: str | None = None

    def router_for(self, deployment: Deployment | None = None, pools: bool = False) -> str:
        """The router's name, the default resolved for `deployment` (`pools`: routing P/D pools' instances)."""
        if self.router is not None:
            return self.router
        ranks = self.replicas == 1 and not pools and deployment is not None and deployment.dp > 1
        return DP_BALANCER if ranks else DEFAULT_ROUTER

    def policy(self, deployment: Deployment | None = None, pools: bool = False) -> RouterPolicy:
        """The router's policy, checked (one line on a bad value) against the replicas' deployment."""
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int) or self.replicas < 1:
            raise PlannerError(f"--replicas must be a whole number >= 1, got {self.replicas!r}")
        policy = parse_router(self.router_for(deployment, pools))
        if policy.uses_prefix and deployment is not None and not deployment.prefix_caching_on:
            raise PlannerError(f"--router {policy.name} scores prefix-cache hits: give --enable-prefix-caching")
        if policy.name == DP_BALANCER and deployment is not None and (deployment.dp < 2 or self.replicas > 1 or pools):
            raise PlannerError(f"--router {DP_BALANCER} is vLLM's balancer of one deployment's data-parallel ranks: "
                               f"give --dp 2 or more and one replica, without --pd (got --dp {deployment.dp}, "
                               f"--replicas {self.replicas}{', --pd' if pools else ''})")
        return policy


@dataclass(frozen=True)
class RunSpec:
    deployment: Deployment = field(default_factory=Deployment)
    load: Load = field(default_factory=Load)
    # --cost-model: None (auto), calibrated, measured, roofline, or linear:A,B (A + B x scheduled tokens)
    cost_model: str | None = None
    profile: str | None = None          # the calibrated model's profile file (default: found by the run's settings)
    timing_noise: bool = False          # step times scatter like the profile's measurements (seeded)
    slos: tuple[tuple[str, float], ...] = ()   # drawn on plots and judged in the verdict
    step_by_step: bool = False          # no decode fast-forward (same results, slower)
    fleet: Fleet = field(default_factory=Fleet)   # replicas and router (one replica: a lone deployment)
    pd: Disaggregation | None = None    # prefill and decode pools (planner/runs/pd.py); None: aggregated
    # capacity's criterion: this share of the requests within every SLO's per-request limit (None: the SLOs'
    # own statistics); planner/runs/slos.py, `meets`
    slo_attainment: float | None = None

    def __post_init__(self) -> None:
        check_attainment(self.slo_attainment)

    def with_load(self, **changes) -> RunSpec:
        return replace(self, load=replace(self.load, **changes))

    def router(self) -> RouterPolicy:
        """The policy that routes this run's requests (over replicas, dp ranks or P/D pools' instances), checked."""
        return self.fleet.policy(self.deployment, pools=self.pd is not None)

    def with_fleet(self, **changes) -> RunSpec:
        return replace(self, fleet=replace(self.fleet, **changes))

    def with_deployment(self, **changes) -> RunSpec:
        return replace(self, deployment=self.deployment.replace(**changes))

    def command(self, capacity: bool = False, **changes) -> str:
        """The `planner simulate` (or `capacity`) line of this run, every setting it used, some changed:
        deployment settings and `rate` (a number or a comma list)."""
        load_changes = {k: changes.pop(k) for k in list(changes) if k in _LOAD_FIELDS}
        fleet = replace(self.fleet, **{k: changes.pop(k) for k in list(changes) if k in _FLEET_FIELDS})
        pd = changes.pop("pd", self.pd)
        spec = replace(self, deployment=self.deployment.replace(**changes), load=self.load, fleet=fleet, pd=pd)
        load = replace(spec.load, **{k: v for k, v in load_changes.items() if k != "rate"})
        rate = load_changes.get("rate", load.rate)
        if capacity or rate is not None:        # (a rate, or capacity's search of one, replaces a ramp-up)
            load = replace(load, ramp_up=None)
        words = ["planner", "capacity" if capacity else "simulate"]
        words += deployment_flags(spec.deployment)
        words += ["--trace" if is_trace_file(load.workload) else "--workload", load.workload]
        for key, value in load.params:
            words += ["-p", f"{key}={value}"]
        if rate is not None and not capacity:
            words += ["--rate", str(rate)]
        if load.ramp_up is not None:
            words += ramp_up_flags(load.ramp_up)
        if load.burstiness != 1:
            words += ["--burstiness", str(load.burstiness)]
        if load.concurrency is not None:
            words += ["--concurrency", str(load.concurrency)]
        for name in ("requests", "duration"):
            if getattr(load, name) is not None:
                words += [f"--{name}", str(getattr(load, name))]
        if load.seed:
            words += ["--seed", str(load.seed)]
        if spec.cost_model is not None:
            words += ["--cost-model", spec.cost_model]
        if spec.profile is not None:
            words += ["--profile", spec.profile]
        if spec.timing_noise:
            words.append("--timing-noise")
        if spec.step_by_step:
            words.append("--step-by-step")
        words += fleet_flags(spec.fleet, spec.deployment, spec.pd is not None)
        if spec.pd is not None:
            words += spec.pd.flags()
        slos = spec.slos or ((("normalized_latency", 0.1),) if capacity else ())
        words += [w for name, limit in slos for w in ("--slo", f"{name}={limit:g}")]
        if spec.slo_attainment is not None:
            words += ["--slo-attainment", f"{spec.slo_attainment:g}"]
        return " ".join(words)


_LOAD_FIELDS = {f.name for f in fields(Load)}
_FLEET_FIELDS = {f.name for f in fields(Fleet)}


def ramp_up_flags(ramp_up: RampUp) -> list[str]:
    """vllm bench serve's (and the planner's) flags for a ramp-up."""
    return ["--ramp-up-strategy", ramp_up.strategy, "--ramp-up-start-rps", str(ramp_up.start_rps),
            "--ramp-up-end-rps", str(ramp_up.end_rps)]


def fleet_flags(fleet: Fleet, deployment: Deployment, pools: bool = False) -> list[str]:
    """--replicas and --router, when they are not a lone deployment's (the router when not the default)."""
    words = ["--replicas", str(fleet.replicas)] if fleet.replicas != 1 else []
    if fleet.router_for(deployment, pools) != Fleet(fleet.replicas).router_for(deployment, pools):
        words += ["--router", fleet.router]
    return words


def deployment_flags(deployment: Deployment) -> list[str]:
    """The command-line flags that rebuild `deployment`: the model and GPU, then every changed setting."""
    words = ["--model", deployment.model, "--gpu", deployment.gpu]
    for name, value in deployment.changed().items():
        if name in ("model", "gpu"):
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            words.append(flag if value else "--no-" + flag[2:])
        else:
            words += [flag, str(value)]
    return words
