"""The router in front of a fleet of replicas: which replica serves each request, by the policies operators run.

Policies (`--router`):

- `round-robin`: request i goes to replica i mod K (a Kubernetes Service's spread;
  the vLLM production stack's `roundrobin` routing logic).
- `least-requests`: the replica with the fewest requests in flight, counted by the
  router itself (routed, not yet ended), as the vLLM Router (Rust, forked from
  SGLang's model gateway) measures a worker's load for its `power_of_two` policy and
  the fallback of `cache_aware`; llm-d's `queue-scorer` ranks by the same kind of
  count (the engine's waiting queue) and normalizes it as here, (max - n) / (max - min),
  1 when all are equal (gateway-api-inference-extension, pkg/epp/scheduling/framework/
  plugins/scorer/queue.go).
- `least-kv`: the replica with the lowest KV-cache usage, 1 - usage as llm-d's
  `kv-cache-utilization-scorer` (now `kv-cache-scorer`) scores vLLM's
  `vllm:gpu_cache_usage_perc`.
- `prefix-aware`: the replica whose prefix cache holds the longest run of the prompt's
  leading blocks, as llm-d's `precise-prefix-cache-scorer` counts consecutive block hits
  from block 0 (llm-d-kv-cache-manager, `LongestPrefixScorer`) in an index it keeps from
  vLLM's KV events (BlockStored / BlockRemoved); scored as matched / prompt blocks, as
  the gateway's `prefix-cache-scorer` does. Needs prefix caching on the replicas.
- `session`: the vLLM production stack's `session` routing logic (vllm_router/routers/
  routing_logic.py, `SessionRouter`): every request of one session (a trace's
  `conversation_id`; live, the request's session header, `serve --session-key`) goes to
  the same replica, by a hash of the session over the replicas (rendezvous hashing here,
  a hash ring there: either moves only a leaving replica's sessions); a request of no
  session goes to the least loaded replica (there the lowest QPS, here `least-requests`).
  It keeps a conversation's cached history on one replica without reading any replica.
- `weighted:SCORER=W,...`: llm-d's scheduling profile, a weighted sum of the scorers
  above (`least-requests`, `least-kv`, `prefix-aware`, `session`), the highest sum picked
  (its `max-score-picker`); llm-d's sample profiles weigh `queue-scorer` 1,
  `kv-cache-scorer` 1 and `prefix-cache-scorer` 3 (e.g. `weighted:least-requests=1,
  least-kv=1,prefix-aware=3`).
- `vllm-dp`: vLLM's own balancer of one deployment's data-parallel ranks, the default for
  them (a deployment with `--dp` 2 or more and one replica). vLLM 0.19's API server
  (vllm/v1/engine/core_client.py, `DPLBAsyncMPClient.get_core_engine_for_request`) sends a
  request to the rank with the lowest `4 x waiting + running`, scanning from rank 0 and
  keeping the first lowest (so ties go to rank 0), then counts it as one more waiting request
  on that rank. The counts come from the DP coordinator (vllm/v1/engine/coordinator.py),
  which publishes what each rank's engine core sent after its last step at most every 100 ms
  (`min_stats_update_interval_ms`), each publication replacing the front end's own counts.
  Here a publication falls on every multiple of 100 ms (vLLM's fall 100 ms after the last
  one once the counts change: the same spacing while the ranks are busy).

Ties go to the first tied replica after the last one picked (so equal replicas take
turns; `vllm-dp` keeps its own rule); llm-d's picker draws among ties at random, which a
seeded run could not repeat.

What the router knows is what a real one could: its own count of requests in flight,
and what each replica published at the end of its last step before the arrival (KV
usage per step, as vLLM logs its stats, after the step's finished requests freed their
blocks; KV events per step, as vLLM publishes them),
never a step in progress. The simulator gives the same answers step by step and in
fast-forward (planner/sim/engine.py, `ended_before`, `blocks_used_before`,
`cached_prefix_before`, `request_counts_before`).

The policies, their parsing and the pick rule are engine/core/routing.py's, shared with the
live fleet's proxy (engine/entrypoints/router); this module supplies the simulated replicas'
readings.
"""
from __future__ import annotations

import math
from bisect import bisect_left

from engine.core.routing import (DEFAULT_ROUTER, DP_BALANCER, POLICIES, SCORERS, WEIGHTED, BaseRouter, RouterPolicy,
                                 parse_policy)
from engine.core.sequence import SequenceGroup
from planner.errors import PlannerError

__all__ = ["DEFAULT_ROUTER", "DP_BALANCER", "POLICIES", "SCORERS", "WEIGHTED", "DpBalancer", "Router", "RouterPolicy",
           "make_router", "parse_router"]

PUBLISH_INTERVAL = 0.1     # s between the DP coordinator's publications of the ranks' request counts
WAITING_WEIGHT = 4         # vLLM's score: 4 x waiting + running


def parse_router(text: str | None) -> RouterPolicy:
    """`round-robin`, `least-requests`, `least-kv`, `prefix-aware`, `session`, `weighted:SCORER=W,...` or
    `vllm-dp`."""
    name = (text or "").strip().lower()
    if name == DP_BALANCER:
        return RouterPolicy(DP_BALANCER)
    try:
        return parse_policy(text)
    except ValueError as exc:
        also = "" if name.startswith(WEIGHTED + ":") else f"; for a deployment's --dp ranks also {DP_BALANCER}"
        raise PlannerError(f"{exc}{also}") from None


def make_router(policy: RouterPolicy, engines: list, block_size: int):
    """The router of `policy` over the simulated engines."""
    return DpBalancer(engines) if policy.name == DP_BALANCER else Router(policy, engines, block_size)


class Router(BaseRouter):
    """Picks a replica for each request from the simulated engines' published state (see the module)."""

    def __init__(self, policy: RouterPolicy, engines: list, block_size: int) -> None:
        super().__init__(policy, len(engines), block_size)
        self.engines = engines

    def pick(self, group: SequenceGroup, now: float, session: str | None = None) -> int:
        return super().pick(group.seqs[0].token_ids, now, group.seqs[0].cache_root, session)

    def in_flight(self, now: float) -> list[int]:
        return [e.routed_count - _ended_before(e.ended_at, now) for e in self.engines]

    def kv_usage(self, now: float) -> list[float]:
        return [e.blocks_used_before(now) / e.allocator.num_gpu_blocks for e in self.engines]

    def cached_prefix(self, hashes: list[int], now: float) -> list[int]:
        return [e.cached_prefix_before(hashes, now) for e in self.engines]


class DpBalancer:
    """vLLM's internal load balancer over a deployment's data-parallel ranks (`vllm-dp`, see the module): the
    lowest 4 x waiting + running of the counts last published, plus the requests sent since."""

    def __init__(self, engines: list) -> None:
        self.engines = engines
        self.publication = -1                 # the publication the counts hold (its multiple of the interval)
        self.counts: list[list[int]] = []     # [waiting, running] per rank, as the front end keeps them

    def pick(self, group: SequenceGroup, now: float, session: str | None = None) -> int:
        # (vLLM's balancer reads no session)
        publication = math.floor(now / PUBLISH_INTERVAL)
        if publication != self.publication:
            self.publication = publication
            at = publication * PUBLISH_INTERVAL
            self.counts = [list(engine.request_counts_before(at)) for engine in self.engines]
        counts = self.counts
        chosen = min(range(len(counts)), key=lambda i: WAITING_WEIGHT * counts[i][0] + counts[i][1])
        counts[chosen][0] += 1                # one more waiting there until the next publication
        return chosen


def _ended_before(ended_at: list[float], t: float) -> int:
    """SimulatedEngine.ended_before: most often every request ended before `t`, with no search."""
    n = len(ended_at)
    return n if not n or ended_at[-1] < t else bisect_left(ended_at, t)
