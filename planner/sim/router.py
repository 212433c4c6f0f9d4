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
usage per step, as vLLM logs its stats; KV events per step, as vLLM publishes them),
never a step in progress. The simulator gives the same answers step by step and in
fast-forward (planner/sim/engine.py, `ended_before`, `blocks_used_before`,
`cached_prefix_before`).
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from engine.core.block_manager import prompt_block_hashes
from engine.core.sequence import SequenceGroup
from planner.errors import PlannerError

SCORERS = ("least-requests", "least-kv", "prefix-aware")
POLICIES = ("round-robin", *SCORERS)
WEIGHTED = "weighted"
DEFAULT_ROUTER = "round-robin"


@dataclass(frozen=True)
class RouterPolicy:
    """A routing policy: round-robin, or weights over the scorers (one scorer alone: weight 1)."""

    name: str                                  # as given, normalized ("weighted:least-requests=1,...")
    weights: tuple[tuple[str, float], ...] = ()

    @property
    def round_robin(self) -> bool:
        return not self.weights

    @property
    def uses_prefix(self) -> bool:
        return any(name == "prefix-aware" and w > 0 for name, w in self.weights)

    @property
    def reads_engines(self) -> bool:
        """Does a pick depend on the replicas' state (else every pick is known in advance)?"""
        return bool(self.weights)


def parse_router(text: str | None) -> RouterPolicy:
    """`round-robin`, `least-requests`, `least-kv`, `prefix-aware` or `weighted:SCORER=W,...`."""
    text = (text or DEFAULT_ROUTER).strip().lower()
    if text in POLICIES:
        return RouterPolicy(text, () if text == "round-robin" else ((text, 1.0),))
    if not text.startswith(WEIGHTED + ":"):
        raise PlannerError(f"--router {text!r}: choose {', '.join(POLICIES)}, or {WEIGHTED}:SCORER=W,... "
                           f"over {', '.join(SCORERS)}")
    weights: dict[str, float] = {}
    for part in text[len(WEIGHTED) + 1:].split(","):
        name, _, value = part.partition("=")
        name = name.strip()
        if name in weights:
            raise PlannerError(f"--router {text!r}: {name} is weighted twice")
        if name not in SCORERS:
            raise PlannerError(f"--router {text!r}: {name!r} is not a scorer; the weighted mix takes "
                               f"{', '.join(SCORERS)}")
        try:
            weight = float(value)
        except ValueError:
            raise PlannerError(f"--router {text!r}: the weight of {name} must be a number, e.g. {name}=2") from None
        if not weight >= 0 or weight == float("inf"):
            raise PlannerError(f"--router {text!r}: weights must be finite and >= 0")
        weights[name] = weight
    if not any(weights.values()):
        raise PlannerError(f"--router {text!r}: give at least one scorer a weight above 0")
    canonical = ",".join(f"{k}={v:g}" for k, v in weights.items())
    return RouterPolicy(f"{WEIGHTED}:{canonical}", tuple(weights.items()))


class Router:
    """Picks a replica for each request from the engines' published state (see the module)."""

    def __init__(self, policy: RouterPolicy, engines: list, block_size: int) -> None:
        self.policy = policy
        self.engines = engines
        self.block_size = block_size
        self.next = 0                      # the replica whose turn it is

    def pick(self, group: SequenceGroup, now: float) -> int:
        count = len(self.engines)
        if self.policy.round_robin or count == 1:
            chosen = self.next
        else:
            scores = self.scores(group, now)
            best = max(scores)
            chosen = next(i % count for i in range(self.next, self.next + count) if scores[i % count] == best)
        self.next = (chosen + 1) % count
        return chosen

    def scores(self, group: SequenceGroup, now: float) -> list[float]:
        """Each replica's weighted score for `group` arriving at `now`."""
        total = [0.0] * len(self.engines)
        for name, weight in self.policy.weights:
            if weight:
                for i, score in enumerate(SCORE[name](self, group, now)):
                    total[i] += weight * score
        return total

    def _least_requests(self, group: SequenceGroup, now: float) -> list[float]:
        counts = [e.routed_count - _ended_before(e.ended_at, now) for e in self.engines]
        low, high = min(counts), max(counts)
        return [1.0 if high == low else (high - n) / (high - low) for n in counts]

    def _least_kv(self, group: SequenceGroup, now: float) -> list[float]:
        return [1.0 - e.blocks_used_before(now) / e.allocator.num_gpu_blocks for e in self.engines]

    def _prefix_aware(self, group: SequenceGroup, now: float) -> list[float]:
        hashes = prompt_block_hashes(group.seqs[0].token_ids, self.block_size)
        if not hashes:
            return [0.0] * len(self.engines)
        return [e.cached_prefix_before(hashes, now) / len(hashes) for e in self.engines]


def _ended_before(ended_at: list[float], t: float) -> int:
    """SimulatedEngine.ended_before: most often every request ended before `t`, with no search."""
    n = len(ended_at)
    return n if not n or ended_at[-1] < t else bisect_left(ended_at, t)


SCORE = {"least-requests": Router._least_requests, "least-kv": Router._least_kv,
         "prefix-aware": Router._prefix_aware}
