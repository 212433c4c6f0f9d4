"""A fleet: K identical replicas of one deployment behind a router, in one discrete-event simulation.

Each replica is a `SimulatedEngine` with its own scheduler, block manager and
prefix cache, all processes of one `simpy.Environment`; one arrival process
(or, in a closed loop, the clients) sends each request through the router
(planner/sim/router.py) to a replica. A router whose picks do not depend on
the replicas' state (round-robin over an open-loop trace) routes the whole
trace up front, and every replica then knows its next arrival as a lone
deployment does; otherwise a replica plans its decode steps without knowing
when its next request comes, and a request routed to it cuts the plan at the
step that starts after it (SimulatedEngine.cut), which is where step-by-step
simulation would have admitted it. One replica is exactly the single-deployment
simulation (`simulate_fleet` runs that very code for K = 1). The dp ranks of a
mixture-of-experts deployment are replicas too, each dp of them driven in
lockstep by one process (planner/sim/lockstep.py), as vLLM aligns their forward passes.

Results: the fleet's requests and steps together (the metrics of the whole
fleet), and `FleetRun` with each replica's own result, the replica of every
request, and the load imbalance (max / mean over replicas of requests, output
tokens, busy time and KV utilization; 1.0 is an even split).
"""
from __future__ import annotations

import math
import random
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import simpy

from engine.core.metrics import RequestRecord, TokenGaps, pick_columns, summarize
from planner.cost.shape import CostModel
from planner.deploy.plan import DeploymentPlan
from planner.documents import json_safe
from planner.errors import PlannerError
from planner.sim.engine import (Due, Progress, SimResult, SimulatedEngine, Watch, check_all_ended,
                                fleet_spec_decoding, make_engine, offload_summary, prefix_counts, replica_result,
                                run_quietly, simulate)
from planner.sim.clients import Clients, make_clients, unmeasured, unsent
from planner.sim.lockstep import lockstep_groups, lockstep_ranks
from planner.sim.memory_guard import check_replicas
from planner.sim.router import RouterPolicy, make_router, parse_router
from planner.sim.lazy_log import ShapeLog, StepLog
from workloads import Trace

# Per replica in result.json (`fleet.per_replica`): the replica's own metrics under these names.
REPLICA_METRICS = ("num_completed", "request_throughput", "output_token_throughput", "ttft_mean", "ttft_p99",
                   "tpot_mean", "tpot_p99", "e2e_mean", "e2e_p99", "normalized_latency", "mean_batch_size",
                   "kv_utilization", "num_steps")


@dataclass
class FleetRun:
    """What only a fleet has: the router, each replica's own result, and where each request went."""

    router: str
    replicas: list[SimResult]      # each engine's requests (in arrival order) and steps: a replica's dp ranks each
    routes: list[int]              # per request of the trace (in trace order): the engine that served it
    step_replicas: list[int]       # per step of the fleet's merged steps: the engine that took it
    ranks: int = 1                 # engines per replica (its --dp ranks)

    @property
    def replica_count(self) -> int:
        """The replicas as the command line counts them (--replicas), not their engines."""
        return len(self.replicas) // self.ranks

    def summary(self, span: float | None = None) -> dict:
        """result.json's `fleet`: per replica, its share and metrics; the imbalance across them. With the fleet's
        `span`, each replica's throughputs are over it, so that they add up to the fleet's (a replica's own span,
        first arrival to last finish, is shorter)."""
        total = len(self.routes)
        rows = []
        for i, sim in enumerate(self.replicas):
            metrics = sim.metrics
            busy = sum(s.end - s.start for s in sim.steps)
            output_tokens = sum(r.output_len for r in sim.requests if r.completed)
            row = {"replica": i, "num_requests": len(sim.requests),
                   "request_share": len(sim.requests) / total if total else 0.0,
                   **{k: metrics[k] for k in REPLICA_METRICS}, "output_tokens": output_tokens,
                   "busy_time": busy, "preemptions": metrics.preemptions["total"],
                   "prefix_cache_hit_tokens": sim.prefix_cache_hit_tokens,
                   "prefix_cache_hit_rate": sim.prefix_cache_hit_rate}
            if span:
                row.update(request_throughput=metrics.num_completed / span,
                           output_token_throughput=output_tokens / span)
            rows.append(row)
        imbalance = {name: _max_over_mean([row[key] or 0.0 for row in rows]) for name, key in
                     (("requests", "num_requests"), ("output_tokens", "output_tokens"),
                      ("busy_time", "busy_time"), ("kv_utilization", "kv_utilization"))}
        return {"replicas": self.replica_count, "engines": len(self.replicas), "router": self.router,
                "per_replica": rows,
                "load_imbalance": imbalance}


def _max_over_mean(values: list[float]) -> float | None:
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean > 0 else None


class Fleet:
    """The replicas, the router and the arrivals of one fleet simulation."""

    def __init__(self, env: simpy.Environment, trace: Trace, plan: DeploymentPlan, cost_model: CostModel,
                 replicas: int, policy: RouterPolicy, *, seed: int, concurrency: int | None, fast_forward: bool,
                 progress: Progress | None, watch: Watch | None, lockstep: bool = True) -> None:
        self.env, self.trace, self.policy = env, trace, policy
        # Picks known in advance: every replica knows its own next arrival, as a lone deployment does (an open
        # loop's, whose requests are sent in trace order: not when turns wait for their answers).
        open_loop = concurrency is None and not plan.deployment.turns_after_answers
        self.pre_routed = not policy.reads_engines and open_loop
        self.due = Due()
        self.progress = progress
        self.watch = watch
        # A MoE deployment's dp ranks (consecutive replicas) step together; other replicas on their own.
        dp = lockstep_ranks(plan) if lockstep else 1
        self.engines: list[SimulatedEngine] = [
            make_engine(env, trace, plan, cost_model, seed=seed, total=len(trace),
                        progress=None if progress is None else self._progress, fast_forward=fast_forward,
                        watch=None if watch is None else self._watch,
                        due=None if self.pre_routed else self.due, routed=not self.pre_routed, start=dp == 1)
            for _ in range(replicas)]
        self.lockstep = lockstep_groups(env, self.engines, dp)
        for i, engine in enumerate(self.engines):
            if i:                                      # replica 0 samples as a lone deployment does
                engine.executor.share_answers(self.engines[0].executor)   # wherever each turn goes
                engine.executor.rng = random.Random(f"{seed}/{i}")
            if policy.uses_prefix:
                engine.log_kv_events()
        self.router = make_router(policy, self.engines, plan.block_size)
        self.groups: list = []                         # every request sent, in sending order
        self.routes: list[int] = []
        self.loop: Clients | None = None
        self.deployment, self.seed = plan.deployment, seed     # (its clients' knobs)

    def release(self) -> None:
        """A finished run's engines released, and the callbacks that hold this fleet (its clients', a P/D
        run's watch) cut (`SimulatedEngine.release`)."""
        for engine in self.engines:
            engine.release()
        self.loop = self.watch = self.progress = None

    def _progress(self, now: float, done: int, total: int) -> None:
        self.progress(now, sum(e.done for e in self.engines), len(self.trace))

    def _watch(self, engine, now: float, ended: list) -> None:
        self.watch(self, now, ended)              # a fleet's watch sees every request (self.groups)

    def send(self, req, arrival: float | None = None, replica: int | None = None) -> None:
        """One request, now: to the router's pick (or `replica`), which admits it at its next step."""
        group = self.engines[0].executor.make_group(req, arrival)
        chosen = self.router.pick(group, self.env.now, req.conversation_id) if replica is None else replica
        self.routes.append(chosen)
        engine = self.engines[chosen]
        engine.routed_count += 1
        self.groups.append(engine.submit(group))

    def arrivals(self, routes: list[int] | None):
        """Release each trace request at its arrival time to its replica (`routes`: known in advance)."""
        env = self.env
        if routes is not None:      # each replica's next arrival, as its own arrival process would say
            pending = [deque(r.arrival_time for r, j in zip(self.trace.requests, routes) if j == i)
                       for i in range(len(self.engines))]
            for engine, times in zip(self.engines, pending):
                engine.due.at = times[0] if times else math.inf
        for n, req in enumerate(self.trace.requests):
            delay = req.arrival_time - env.now
            if delay > 0:
                self.due.at = env.now + delay
                yield env.timeout(delay)
                self.due.at = math.inf
            if routes is None:
                self.send(req)
                continue
            replica = routes[n]
            times = pending[replica]
            times.popleft()
            self.engines[replica].due.at = times[0] if times else math.inf
            self.send(req, replica=replica)
        self._all_sent()

    def _all_sent(self) -> None:
        for engine in self.engines:
            engine.arrivals_done = True

    def start(self, concurrency: int | None, paced: bool = False) -> None:
        self.loop = make_clients(self.env, self.trace.requests, lambda req, at: self.send(req, arrival=at),
                                 concurrency=concurrency, deployment=self.deployment, seed=self.seed, due=self.due,
                                 all_sent=self._all_sent, paced=paced)
        if self.loop is None:
            count = len(self.engines)
            routes = [n % count for n in range(len(self.trace))] if self.pre_routed else None
            self.env.process(self.arrivals(routes))
            return
        for engine in self.engines:
            engine.on_ended = self.loop.ended
        self.loop.start()


def simulate_fleet(trace: Trace, plan: DeploymentPlan, cost_model: CostModel, *, replicas: int = 1,
                   router: str | RouterPolicy | None = None, seed: int = 0, concurrency: int | None = None,
                   paced: bool = False, fast_forward: bool = True, progress: Progress | None = None,
                   watch: Watch | None = None, lockstep: bool = True) -> SimResult:
    """`replicas` copies of `plan` behind `router` (a policy name, see planner/sim/router.py), fed `trace`
    (or, with `concurrency`, a closed loop of that many clients; `paced`: at most that many requests in flight,
    none sent before its trace time). One replica is `simulate` itself. A MoE
    plan's dp ranks (each `plan.deployment.dp` consecutive replicas) step in lockstep (planner/sim/lockstep.py);
    `lockstep=False` runs them on their own clocks (what that leaves out: bench/bench_dp_lockstep.py)."""
    policy = router if isinstance(router, RouterPolicy) else parse_router(router)
    if replicas < 1:
        raise PlannerError(f"--replicas must be >= 1, got {replicas}")
    if policy.uses_prefix and not plan.deployment.enable_prefix_caching:
        raise PlannerError("the prefix-aware router scores prefix-cache hits: give --enable-prefix-caching")
    if replicas == 1:
        return simulate(trace, plan, cost_model, seed=seed, concurrency=concurrency, paced=paced,
                        fast_forward=fast_forward, progress=progress, watch=watch)
    return run_fleet(trace, plan, cost_model, replicas, policy, seed=seed, concurrency=concurrency, paced=paced,
                     fast_forward=fast_forward, progress=progress, watch=watch, lockstep=lockstep)


def run_fleet(trace: Trace, plan: DeploymentPlan, cost_model: CostModel, replicas: int, policy: RouterPolicy,
              *, seed: int = 0, concurrency: int | None = None, paced: bool = False, fast_forward: bool = True,
              progress: Progress | None = None, watch: Watch | None = None, lockstep: bool = True) -> SimResult:
    """The fleet simulation for any number of replicas (one included: tests hold it to `simulate`)."""
    wall_start = time.perf_counter()
    check_replicas(replicas, plan.simulated_blocks)
    env = simpy.Environment()
    fleet = Fleet(env, trace, plan, cost_model, replicas, policy, seed=seed, concurrency=concurrency,
                  fast_forward=fast_forward, progress=progress, watch=watch, lockstep=lockstep)
    fleet.start(concurrency, paced)

    def records() -> SimResult:
        if progress is not None:
            progress(env.now, sum(e.done for e in fleet.engines), len(trace))
        check_all_ended(fleet.groups, len(trace) - unsent(fleet.loop))
        return _fleet_result(fleet, plan, cost_model, seed, unmeasured(fleet.loop))

    result = run_quietly(env, records, fleet.release)
    result.concurrency = concurrency
    result.wall_time = time.perf_counter() - wall_start
    return result


def _fleet_result(fleet: Fleet, plan: DeploymentPlan, cost_model: CostModel, seed: int,
                  warm: set[str] = frozenset()) -> SimResult:
    """The fleet's result: every request and step together, each replica's own result beside; the `warm`
    requests (a closed loop's warm-up) out of the figures."""
    trace = fleet.trace
    records, routes, mine = [], [], [[] for _ in fleet.engines]
    for group, replica in zip(fleet.groups, fleet.routes):
        if group.request_id not in warm:
            records.append(RequestRecord.from_group(group, plan.deployment.stream_interval))
            routes.append(replica)
            mine[replica].append(records[-1])
    # Each replica's step fields and token times read once, for its own metrics and the fleet's.
    columns = [engine.step_columns() for engine in fleet.engines]
    gaps = TokenGaps([r for r in records if r.completed])
    parts = [replica_result(plan, cost_model, trace, seed, engine, own, cols, gaps)
             for engine, own, cols in zip(fleet.engines, mine, columns)]
    positions, replicas = _merge_order(parts, np.concatenate([c["start"] for c in columns]))
    order, step_replicas = positions.tolist(), replicas.tolist()
    steps, shapes = _merged_logs(parts, order)
    num_running = _pick([n for p in parts for n in p.num_running], order)
    preemptions = {key: sum(e.scheduler.preemptions[key] for e in fleet.engines) for key in ("recompute", "swap")}
    logical = sum(e.logical_token_time for e in fleet.engines)
    physical = sum(e.physical_token_time for e in fleet.engines)
    counts = [prefix_counts(e) for e in fleet.engines]
    hit, held = sum(c[0] for c in counts), sum(c[1] for c in counts)
    return SimResult(
        plan, cost_model.name, trace.name, json_safe(trace.params), summarize(records, steps, preemptions, pick_columns(columns, positions), gaps),
        records, steps, shapes, num_running,
        sharing_saved=1 - physical / logical if logical > 0 else 0.0, prefix_cache_hit_tokens=hit,
        prefix_cache_hit_rate=hit / held if held else 0.0,
        kv_blocks_used_at_end=sum(p.kv_blocks_used_at_end for p in parts), simulated_time=fleet.env.now,
        wall_time=0.0, fast_forwarded_steps=sum(p.fast_forwarded_steps for p in parts), seed=seed,
        spec_decoding=fleet_spec_decoding(fleet.engines), kv_offload=offload_summary(plan, fleet.engines),
        fleet=FleetRun(fleet.policy.name, parts, routes, step_replicas, plan.deployment.dp))


def _merge_order(parts: list[SimResult], starts: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The fleet's steps in start order (ties: by replica, then by step), as positions in the replicas'
    steps laid end to end, and the replica of each: a stable sort of the starts (hundreds of thousands of
    steps, where a heap merge of tuples took seconds). `starts`: those starts, already read."""
    if starts is None:
        starts = np.fromiter((s.start for p in parts for s in p.steps), dtype=np.float64,
                             count=sum(len(p.steps) for p in parts))
    replica = np.repeat(np.arange(len(parts)), [len(p.steps) for p in parts])
    order = np.argsort(starts, kind="stable")
    return order, replica[order]


def _pick(values: list, order: list[int]) -> list:
    return list(map(values.__getitem__, order))


def _merged_logs(parts: list[SimResult], order: list[int]) -> tuple[StepLog, ShapeLog]:
    """The parts' step records and shapes in the merged steps' `order`, picked when first read (the
    replicas' own logs build their plans' records and shapes only then: planner/sim/lazy_log.py)."""
    return (StepLog.later(lambda: _pick([s for p in parts for s in p.steps], order), len(order)),
            ShapeLog.later(lambda: _pick([s for p in parts for s in p.shapes], order), len(order)))


def pool_result(pool, plan: DeploymentPlan, cost_model: CostModel, seed: int) -> SimResult:
    """The result of a pool of replicas of one plan (a `Fleet`, or any object with its `trace`, `env`,
    `engines`, `groups`, `routes` and `policy`): planner/sim/pd.py's prefill and decode pools."""
    return _fleet_result(pool, plan, cost_model, seed)


def merged_steps(parts: list[SimResult]) -> tuple[list, list, list, list[int]]:
    """The steps, shapes and running counts of several runs in start order, and the part of each step."""
    positions, parts_of = _merge_order(parts)
    order = positions.tolist()
    return (*_merged_logs(parts, order),
            _pick([n for p in parts for n in p.num_running], order), parts_of.tolist())
