"""Prefill/decode disaggregation: a prefill pool and a decode pool in one discrete-event simulation.

The story of a request, as vLLM's disaggregated serving runs it (a proxy in front
of prefill and decode instances joined by a KV connector; NVIDIA Dynamo's
disaggregated serving is the same flow):

1. it arrives at the proxy, which sends it to a prefill replica (the router's
   pick among the prefill pool) with max_tokens=1; the prefill replica queues and
   prefills it as any request (its own scheduler, budget and KV cache) and
   answers with its one token, which the proxy discards;
2. the proxy sends it on to a decode replica (the router's pick among the decode
   pool), whose scheduler gives it blocks for the whole prompt and parks it while
   its KV crosses the link (planner/sim/remote_kv.py): latency + prompt tokens x
   KV bytes per token / (link bandwidth x streams), streams = min of the two TPs;
3. once the KV is there it runs: its first decode-side step computes the last
   prompt token and samples the first output token, which is the first token
   the client sees (the proxy streams the decode instance's answer); it decodes
   to its end there.

So the client's TTFT is prefill queue + prefill + hand-off + decode admission +
transfer + the first decode-side step, and TPOT is the decode pool's. Each
replica is a `SimulatedEngine` with its own scheduler and block manager (a pool
replica of --dp ranks is dp of them, as an aggregated deployment's ranks are:
each rank its own scheduler, cache and seats, a MoE model's ranks stepping in
lockstep, planner/sim/lockstep.py; the pool's router picks among the ranks); the
prefill pool is a `Fleet` of requests cut to one output token (its replicas know
their next arrival where the router allows, as a fleet's do), the decode
replicas step one at a time (the decode batch's proof does not cover remote
admissions). The prefill replica holds a handed-off request's blocks until the
decode replica has read its KV (vLLM's NIXL connector frees them then). Not
modelled: the proxy's and the network's own latency, and transfers sharing a link.

Speculative decoding (--speculative, both pools): the decode replicas speculate as
one deployment does (planner/sim/speculative.py); a draft network (EAGLE or MTP
head, draft model) runs its own first pass over each prompt on the prefill
replica, beside the target's, and its KV crosses with the target's (the KV path's
bytes per token count both), so the decode side drafts from its first step.
`spec_decoding_stats` sums both pools' counters (only the decode pool drafts).
"""
from __future__ import annotations

import random
import time
from collections import namedtuple
from dataclasses import dataclass

import numpy as np
import simpy

from engine.core.metrics import RequestRecord, summarize
from engine.core.sequence import FinishReason, SequenceGroup
from planner.catalog.links import KvLink
from planner.cost.shape import CostModel
from planner.deploy.plan import DeploymentPlan
from planner.documents import json_safe
from planner.sim.clients import unmeasured, unsent
from planner.sim.engine import (Due, Progress, SimResult, SimulatedEngine, Watch, check_all_ended,
                                fleet_spec_decoding, make_engine, run_quietly)
from planner.sim.fleet import Fleet, merged_steps, pool_result
from planner.sim.lockstep import lockstep_groups, lockstep_ranks
from planner.sim.remote_kv import DecodeScheduler, Remote
from planner.sim.router import Router, RouterPolicy
from workloads import Trace, TraceRequest

_Waiting = namedtuple("_Waiting", "arrival first_token finish")   # a request the client has no token of yet


@dataclass(frozen=True)
class Pool:
    """One pool: how many replicas of which plan, priced by which cost model."""

    replicas: int
    plan: DeploymentPlan
    cost_model: CostModel


@dataclass(frozen=True)
class KvPath:
    """How a request's KV crosses from a prefill replica to a decode replica."""

    link: KvLink
    stream_bandwidth: float      # B/s per stream
    streams: int                 # parallel streams: min(prefill TP, decode TP)
    bytes_per_token: int         # the whole model's K and V of one token (all layers, all KV heads)

    def seconds(self, tokens: int) -> tuple[float, float]:
        """(bytes, seconds) of moving `tokens` tokens' KV."""
        num_bytes = tokens * self.bytes_per_token
        return num_bytes, self.link.transfer_seconds(num_bytes, self.stream_bandwidth, self.streams)


class ClientRequest:
    """A request as the client sees it: the decode side's times once it got there, else none yet."""

    __slots__ = ("prefill", "decode", "prefill_replica")

    def __init__(self, prefill: SequenceGroup, prefill_replica: int) -> None:
        self.prefill = prefill
        self.decode: SequenceGroup | None = None
        self.prefill_replica = prefill_replica

    @property
    def group(self) -> SequenceGroup:
        return self.decode if self.decode is not None else self.prefill

    @property
    def times(self):
        if self.decode is not None:
            return self.decode.times
        return _Waiting(self.prefill.times.arrival, None, None)


class PrefillPool(Fleet):
    """The prefill replicas behind the router: a fleet whose requests stop at one output token."""

    def __init__(self, *args, on_sent, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.on_sent = on_sent
        for engine in self.engines:   # a request is handed to the decode pool whole: not fanned out here
            engine.fan_out = False

    def send(self, req: TraceRequest, arrival: float | None = None, replica: int | None = None) -> None:
        super().send(req.model_copy(update={"output_len": 1}), arrival, replica)    # the proxy's max_tokens=1
        self.on_sent(self.groups[-1])

    def release(self) -> None:
        super().release()
        self.on_sent = None


class DecodePool:
    """The decode replicas behind their router (what planner.sim.fleet.pool_result reads)."""

    def __init__(self, env: simpy.Environment, trace: Trace, pool: Pool, policy: RouterPolicy, *, seed: int,
                 progress: Progress | None, watch: Watch | None, on_loading) -> None:
        self.env, self.trace, self.policy = env, trace, policy
        self.engines: list[SimulatedEngine] = []
        lockstep = lockstep_ranks(pool.plan)               # a MoE replica's ranks step together (as a Fleet's)
        for i in range(pool.replicas * pool.plan.deployment.dp):
            engine = make_engine(env, trace, pool.plan, pool.cost_model, seed=seed, total=len(trace),
                                 progress=progress, fast_forward=False, watch=watch, due=Due(), routed=True,
                                 start=lockstep == 1)
            engine.scheduler = DecodeScheduler(engine.scheduler, lambda g, r, now, i=i: on_loading(i, g, r, now))
            engine.executor.rng = random.Random(f"{seed}/decode/{i}")
            if i:      # the first replica's executor makes every request handed to the pool
                engine.executor.share_answers(self.engines[0].executor)
            if policy.uses_prefix:
                engine.log_kv_events()
            self.engines.append(engine)
        self.lockstep = lockstep_groups(env, self.engines, lockstep)
        self.router = Router(policy, self.engines, pool.plan.block_size)
        self.groups: list[SequenceGroup] = []     # every request handed to the pool, in hand-off order
        self.routes: list[int] = []

    def hand(self, group: SequenceGroup, remote: Remote, now: float) -> None:
        """A prefilled request joins the replica the router picks, parked until its blocks and KV come."""
        chosen = self.router.pick(group, now)
        remote.decode_replica = chosen
        engine = self.engines[chosen]
        self.groups.append(group)
        self.routes.append(chosen)
        engine.routed_count += 1
        engine.scheduler.add_remote(group, remote)
        engine.groups.append(group)
        wake(engine)


def wake(engine: SimulatedEngine) -> None:
    """An engine asleep for want of work looks at its queues again (as a request's arrival wakes it). A lockstep
    group's ranks sleep on one event, which another rank's request may have woken already."""
    if engine.idle is not None:
        if not engine.idle.triggered:
            engine.idle.succeed()
        engine.idle = None


class Disaggregated:
    """The two pools, the link between them, and the clients' view of every request."""

    def __init__(self, env: simpy.Environment, trace: Trace, prefill: Pool, decode: Pool, path: KvPath,
                 policy: RouterPolicy, *, seed: int, concurrency: int | None, fast_forward: bool,
                 progress: Progress | None, watch: Watch | None, paced: bool = False) -> None:
        self.env, self.trace, self.path, self.watch, self.progress = env, trace, path, watch, progress
        self.concurrency, self.paced = concurrency, paced
        self.requests = {r.request_id: r for r in trace.requests}
        self.groups: list[ClientRequest] = []         # every request sent, in sending order (a probe's watch)
        self.by_prefill: dict[int, ClientRequest] = {}
        self.remotes: list[Remote] = []
        self.held: dict[str, tuple] = {}              # request id -> (prefill engine, its blocks still held)
        self.done = 0
        ranks = prefill.replicas * prefill.plan.deployment.dp         # each rank an engine (the Fleet's lockstep)
        self.prefill = PrefillPool(env, trace, prefill.plan, prefill.cost_model, ranks, policy, seed=seed,
                                   concurrency=concurrency, fast_forward=fast_forward, progress=None,
                                   watch=self._prefilled, on_sent=self._sent)
        self.decode = DecodePool(env, trace, decode, policy, seed=seed,
                                 progress=None if progress is None else self._progress,
                                 watch=self._decoded, on_loading=self._loading)
        for engine in self.prefill.engines:
            engine.blocks_lent = lambda engine=engine: any(held is engine for held, _ in self.held.values())

    def release(self) -> None:
        """The pools' engines released and their callbacks into this object cut (`SimulatedEngine.release`)."""
        self.prefill.release()
        for engine in self.decode.engines:
            engine.release()

    def start(self) -> None:
        self.prefill.start(self.concurrency, self.paced)
        if self.prefill.loop is not None:     # a client's request ends at the decode pool, not at the prefill
            for engine in self.prefill.engines:
                engine.on_ended = None
            for engine in self.decode.engines:
                engine.on_ended = self.prefill.loop.ended

    def _sent(self, group: SequenceGroup) -> None:
        client = ClientRequest(group, self.prefill.routes[-1])
        self.groups.append(client)
        self.by_prefill[id(group)] = client

    def _prefilled(self, fleet, now: float, ended: list[SequenceGroup]) -> None:
        """Prefill replicas' ended requests: a finished one goes on to the decode pool, one the prefill
        replica refused (rejected, truncated) ends there for the client."""
        lost = []
        for group in ended:
            client = self.by_prefill[id(group)]
            if group.finish_reason is FinishReason.REJECTED or RequestRecord.from_group(group).truncated:
                lost.append(group)
                continue
            req = self.requests[group.request_id]
            client.decode = self.decode.engines[0].executor.make_group(req, arrival=group.times.arrival)
            remote = Remote(now, client.prefill_replica, -1)
            self.remotes.append(remote)
            self._hold(self.prefill.engines[client.prefill_replica], group)
            self.decode.hand(client.decode, remote, now)
        if lost:
            self._ended(now, lost)
            if self.prefill.loop is not None:
                self.prefill.loop.ended([g.request_id for g in lost],
                                        {g.request_id for g in lost if g.finish_reason is FinishReason.REJECTED})

    def _hold(self, engine: SimulatedEngine, group: SequenceGroup) -> None:
        """The prefill replica keeps the request's KV until the decode replica has read it (vLLM's NIXL
        connector delays freeing a remote-decode request's blocks until the decode side reports the read):
        as many blocks as the prompt fills, taken back as the scheduler frees them (at most what is free:
        a prefix block shared with a running request was never freed)."""
        pool, bs = engine.allocator.gpu, engine.allocator.block_size
        tokens = group.prompt_len
        count = min(-(-tokens // bs), pool.num_free())
        self.held[group.request_id] = (engine, [pool.take(min(bs, tokens - k * bs)) for k in range(count)])

    def _free_held(self, request_id: str) -> None:
        """The decode side is done with the request's KV: its prefill replica takes the blocks back, and
        looks at its queue again (requests may be waiting for those blocks)."""
        if request_id not in self.held:
            return
        engine, blocks = self.held.pop(request_id)
        for block in blocks:
            engine.allocator.gpu.release(block)
        wake(engine)

    def _loading(self, replica: int, group: SequenceGroup, remote: Remote, now: float) -> None:
        """A decode replica gave the request its blocks: the KV starts across the link."""
        remote.num_bytes, remote.seconds = self.path.seconds(remote.tokens)
        self.env.process(self._transfer(self.decode.engines[replica], group, remote))

    def _transfer(self, engine: SimulatedEngine, group: SequenceGroup, remote: Remote):
        yield self.env.timeout(remote.seconds)
        engine.scheduler.kv_arrived(group, self.env.now)
        self._free_held(group.request_id)
        wake(engine)

    def _decoded(self, engine, now: float, ended: list[SequenceGroup]) -> None:
        for group in ended:           # one the decode replica refused never reads its KV: the prefill lets it go
            if group.request_id in self.held:
                self._free_held(group.request_id)
        self._ended(now, ended)

    def _ended(self, now: float, ended: list[SequenceGroup]) -> None:
        self.done += len(ended)
        if self.watch is not None:
            self.watch(self, now, ended)

    def _progress(self, now: float, done: int, total: int) -> None:
        self.progress(now, self.done, len(self.trace))



@dataclass
class PdRun:
    """What only a disaggregated run has: each pool's own result, and every request's hand-off."""

    prefill: SimResult             # the prefill pool's run (its requests stop at one token); .fleet per replica
    decode: SimResult              # the decode pool's run (its requests' times are the client's)
    remotes: list[Remote]          # per request handed to the decode pool, in hand-off order
    handed: list[SequenceGroup]    # the decode pool's requests, in the same order
    path: KvPath
    router: str
    step_pools: list[int]          # per step of the merged steps: 0 the prefill pool, 1 the decode pool

    @property
    def ratio(self) -> str:
        return f"{self.prefill.fleet.replica_count}:{self.decode.fleet.replica_count}"

    def summary(self, span: float) -> dict:
        """result.json's `pd`: each pool's load and waits, the KV transfers, the client's TTFT in parts."""
        prefill, decode = _pool_block(self.prefill, span), _pool_block(self.decode, span)
        done = [r for r in self.prefill.requests if r.completed]
        prefill["queue_wait"] = _stats([r.first_scheduled - r.arrival for r in done])
        prefill["prefill_time"] = _stats([r.first_token - r.first_scheduled for r in done])
        prefill["time_to_kv"] = _stats([r.first_token - r.arrival for r in done])
        del prefill["tpot_mean"], prefill["tpot_p99"]          # its requests end at their first token
        admitted = [r for r in self.remotes if r.admitted_at is not None]
        decode["admission_wait"] = _stats([r.allocated_at - r.handed_at for r in admitted])
        decode["start_wait"] = _stats([r.admitted_at - r.arrived_at for r in admitted])
        # both waits of each request: its wait in the decode pool (the transfer between them is not one)
        decode["wait"] = _stats([r.allocated_at - r.handed_at + r.admitted_at - r.arrived_at for r in admitted])
        decode["tpot"] = {"mean": decode.pop("tpot_mean"), "p99": decode.pop("tpot_p99")}
        decode["first_step"] = _stats([g.times.first_token - r.admitted_at for g, r in zip(self.handed, self.remotes)
                                       if r.admitted_at is not None and g.times.first_token is not None])
        return {"ratio": self.ratio, "router": self.router, "prefill": prefill, "decode": decode,
                "kv_transfer": self._transfers(admitted),
                "ttft_parts_mean": {"prefill_queue": prefill["queue_wait"]["mean"],
                                    "prefill": prefill["prefill_time"]["mean"],
                                    "decode_admission": decode["admission_wait"]["mean"],
                                    "kv_transfer": _stats([r.seconds for r in admitted])["mean"],
                                    "decode_start": decode["start_wait"]["mean"],
                                    "first_decode_step": decode["first_step"]["mean"]}}

    def request_columns(self) -> dict[str, list]:
        """requests.csv's columns of a P/D run, per client request (sending order): the prefill replica that
        prefilled it and the decode replica that decoded it (None: it never got there)."""
        decoded = {g.request_id: r.decode_replica for g, r in zip(self.handed, self.remotes)}
        prefill = self.prefill
        return {"prefill_replica": list(prefill.fleet.routes),
                "decode_replica": [decoded.get(r.request_id) for r in prefill.requests]}

    def step_columns(self) -> dict[str, list]:
        """steps.csv's columns: each step's pool and its replica in that pool (a pool's steps keep their order
        in the merge, so the k-th step of a pool is the k-th of the pool's own steps)."""
        replicas = [iter(self.prefill.fleet.step_replicas), iter(self.decode.fleet.step_replicas)]
        return {"pool": [("prefill", "decode")[p] for p in self.step_pools],
                "replica": [next(replicas[p]) for p in self.step_pools]}

    def _transfers(self, admitted: list[Remote]) -> dict:
        path = self.path
        return {"link": path.link.name, "stream_bandwidth": path.stream_bandwidth, "streams": path.streams,
                "latency": path.link.latency, "kv_bytes_per_token": path.bytes_per_token,
                "count": len(self.remotes), "bytes_total": sum(r.num_bytes for r in self.remotes),
                "bytes": _stats([r.num_bytes for r in admitted]), "seconds": _stats([r.seconds for r in admitted]),
                "source": path.link.source}


def _stats(values: list[float]) -> dict:
    if not values:
        return {"mean": None, "p99": None, "max": None}
    array = np.asarray(values, dtype=float)
    return {"mean": float(array.mean()), "p99": float(np.percentile(array, 99)), "max": float(array.max())}


POOL_METRICS = ("num_completed", "num_rejected", "request_throughput", "mean_batch_size", "mean_prefill_batch_size",
                "kv_utilization", "num_steps", "tpot_mean", "tpot_p99")


def _pool_block(sim: SimResult, span: float) -> dict:
    """One pool's figures: its replicas' shape, how busy they were, and each engine's own row (per dp rank)."""
    fleet = sim.fleet.summary(sim.metrics.duration)
    metrics = sim.metrics.to_dict()
    d = sim.plan.deployment
    replicas, ranks = fleet["replicas"], fleet["engines"]
    busy = sum(s.end - s.start for s in sim.steps)
    return {"replicas": replicas, "gpu": d.gpu, "tp": d.tp, "gpus": replicas * d.gpus, "cost_model": sim.cost_model,
            "num_gpu_blocks": sim.plan.num_gpu_blocks, "max_num_seqs": d.max_num_seqs,
            "num_requests": len(sim.requests), **{k: metrics[k] for k in POOL_METRICS},
            "preemptions": metrics["preemptions"]["total"], "busy_time": busy,
            "utilization": busy / (ranks * span) if span > 0 else None,
            "per_replica": fleet["per_replica"], "load_imbalance": fleet["load_imbalance"],
            "deployment": d.as_dict()}


@dataclass
class PdResult(SimResult):
    """A disaggregated run: the client's requests (each the decode side's times, or the prefill side's
    where it ended there) and both pools' steps; `pd` holds each pool's own result."""

    pd: PdRun | None = None

    @property
    def params(self) -> dict:
        return {**super().params, "pd": self.pd.ratio, "router": self.pd.router}

    def summary(self) -> dict:
        return {**super().summary(), "pd": self.pd.summary(self.simulated_time)}


def simulate_pd(trace: Trace, prefill: Pool, decode: Pool, path: KvPath, policy: RouterPolicy, *, seed: int = 0,
                concurrency: int | None = None, paced: bool = False, fast_forward: bool = True,
                progress: Progress | None = None, watch: Watch | None = None) -> PdResult:
    """`trace` (or a closed loop of `concurrency` clients; `paced`: at most that many requests in flight, none
    sent before its trace time) through a prefill pool and a decode pool, each behind a router of `policy`,
    the KV crossing `path` (see the module)."""
    wall_start = time.perf_counter()
    env = simpy.Environment()
    pools = Disaggregated(env, trace, prefill, decode, path, policy, seed=seed, concurrency=concurrency,
                          fast_forward=fast_forward, progress=progress, watch=watch, paced=paced)
    pools.start()

    def records() -> PdResult:
        if progress is not None:
            progress(env.now, pools.done, len(trace))
        clients = [c.group for c in pools.groups]
        check_all_ended(clients, len(trace) - unsent(pools.prefill.loop))
        return _pd_result(pools, clients, prefill, decode, seed)

    result = run_quietly(env, records, pools.release)
    result.concurrency = concurrency
    result.wall_time = time.perf_counter() - wall_start
    return result


def _pd_result(pools: Disaggregated, clients: list[SequenceGroup], prefill: Pool, decode: Pool,
               seed: int) -> PdResult:
    trace = pools.trace
    parts = [pool_result(pools.prefill, prefill.plan, prefill.cost_model, seed),
             pool_result(pools.decode, decode.plan, decode.cost_model, seed)]
    steps, shapes, num_running, step_pools = merged_steps(parts)
    # (the clients stream from the decode pool's servers)
    warm = unmeasured(pools.prefill.loop)      # (a warm-up's requests out of the figures)
    records = [RequestRecord.from_group(g, decode.plan.deployment.stream_interval) for g in clients
               if g.request_id not in warm]
    engines = pools.prefill.engines + pools.decode.engines
    preemptions = {key: sum(e.scheduler.preemptions[key] for e in engines) for key in ("recompute", "swap")}
    run = PdRun(parts[0], parts[1], pools.remotes, pools.decode.groups, pools.path, pools.prefill.policy.name,
                step_pools)
    return PdResult(
        decode.plan, decode.cost_model.name, trace.name, json_safe(trace.params),
        summarize(records, steps, preemptions), records, steps, shapes, num_running,
        # Nothing is shared without prefix caching, and the decode pool's own ratio would count the blocks of
        # requests parked for their KV (held, not in the batch) as waste: not a sharing figure.
        sharing_saved=0.0, prefix_cache_hit_tokens=parts[0].prefix_cache_hit_tokens,
        prefix_cache_hit_rate=parts[0].prefix_cache_hit_rate,
        kv_blocks_used_at_end=sum(p.kv_blocks_used_at_end for p in parts), simulated_time=pools.env.now,
        wall_time=0.0, fast_forwarded_steps=sum(p.fast_forwarded_steps for p in parts), seed=seed, pd=run,
        spec_decoding=fleet_spec_decoding(engines))
