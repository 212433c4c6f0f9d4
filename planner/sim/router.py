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
- `weighted:SCORER=W,...`: llm-d's scheduling profile, a weighted sum of the scorers
  above (`least-requests`, `least-kv`, `prefix-aware`), the highest sum picked
  (its `max-score-picker`); llm-d's sample profiles weigh `queue-scorer` 1,
  `kv-cache-scorer` 1 and `prefix-cache-scorer` 3 (e.g. `weighted:least-requests=1,
  least-kv=1,prefix-aware=3`).

Ties go to the first tied replica after the last one picked (so equal replicas take
turns); llm-d's picker draws among ties at random, which a seeded run could not repeat.

What the router knows is what a real one could: its own count of requests in flight,
and what each replica published at the end of its last step before the arrival (KV
usage per step, as vLLM logs its stats, after the step's finished requests freed their
blocks; KV events per step, as vLLM publishes them),
never a step in progress. The simulator gives the same answers step by step and in
fast-forward (planner/sim/engine.py, `ended_before`, `blocks_used_before`,
`cached_prefix_before`).

The policies, their parsing and the pick rule are engine/core/routing.py's, shared with the
live fleet's proxy (engine/entrypoints/router); this module supplies the simulated replicas'
readings.
"""
from __future__ import annotations

from bisect import bisect_left

from engine.core.routing import DEFAULT_ROUTER, POLICIES, SCORERS, WEIGHTED, BaseRouter, RouterPolicy, parse_policy
from engine.core.sequence import SequenceGroup
from planner.errors import PlannerError

__all__ = ["DEFAULT_ROUTER", "POLICIES", "SCORERS", "WEIGHTED", "Router", "RouterPolicy", "parse_router"]


def parse_router(text: str | None) -> RouterPolicy:
    """`round-robin`, `least-requests`, `least-kv`, `prefix-aware` or `weighted:SCORER=W,...`."""
    try:
        return parse_policy(text)
    except ValueError as exc:
        raise PlannerError(str(exc)) from None


class Router(BaseRouter):
    """Picks a replica for each request from the simulated engines' published state (see the module)."""

    def __init__(self, policy: RouterPolicy, engines: list, block_size: int) -> None:
        super().__init__(policy, len(engines), block_size)
        self.engines = engines

    def pick(self, group: SequenceGroup, now: float) -> int:
        return super().pick(group.seqs[0].token_ids, now)

    def in_flight(self, now: float) -> list[int]:
        return [e.routed_count - _ended_before(e.ended_at, now) for e in self.engines]

    def kv_usage(self, now: float) -> list[float]:
        return [e.blocks_used_before(now) / e.allocator.num_gpu_blocks for e in self.engines]

    def cached_prefix(self, hashes: list[int], now: float) -> list[int]:
        return [e.cached_prefix_before(hashes, now) for e in self.engines]


def _ended_before(ended_at: list[float], t: float) -> int:
    """SimulatedEngine.ended_before: most often every request ended before `t`, with no search."""
    n = len(ended_at)
    return n if not n or ended_at[-1] < t else bisect_left(ended_at, t)
