"""Routing policies shared by the simulated fleet and the live fleet's proxy (pure Python, no clock).

One policy object and one pick rule serve both: planner/sim/router.py reads
the simulated replicas' published state, engine/entrypoints/router reads the
live replicas' (its own in-flight counts, their /metrics, their KV events).
Each subclass supplies the three readings; the scoring, the weights and the
tie rule live here once, so a live pick and a simulated pick of the same
state are the same pick. The policies and their sources are described in
planner/sim/router.py and docs/fleets.md.

It lives in engine/core because the engine (which must not import the
planner) runs the proxy and the planner's simulator imports the engine core.
"""
from __future__ import annotations

from dataclasses import dataclass
from hashlib import blake2b

from engine.core.block_keys import ROOT_HASH, prompt_block_hashes

SCORERS = ("least-requests", "least-kv", "prefix-aware", "session")
POLICIES = ("round-robin", *SCORERS)
WEIGHTED = "weighted"
DEFAULT_ROUTER = "round-robin"
# vLLM's own balancer of one deployment's data-parallel ranks (the simulator's: planner/sim/router.py).
DP_BALANCER = "vllm-dp"
# The request header a live fleet's `session` routing reads its session from, unless `serve --session-key` names
# another (the vLLM production stack's router takes it from --session-key too).
SESSION_HEADER = "x-session-id"


@dataclass(frozen=True)
class RouterPolicy:
    """A routing policy: round-robin, or weights over the scorers (one scorer alone: weight 1)."""

    name: str                                  # as given, normalized ("weighted:least-requests=1,...")
    weights: tuple[tuple[str, float], ...] = ()

    @property
    def round_robin(self) -> bool:
        return not self.weights and self.name != DP_BALANCER

    @property
    def uses_prefix(self) -> bool:
        return self.uses("prefix-aware")

    def uses(self, scorer: str) -> bool:
        return any(name == scorer and w > 0 for name, w in self.weights)

    @property
    def reads_engines(self) -> bool:
        """Does a pick depend on the replicas' state (else every pick is known in advance)?"""
        return bool(self.weights) or self.name == DP_BALANCER


def parse_policy(text: str | None) -> RouterPolicy:
    """`round-robin`, `least-requests`, `least-kv`, `prefix-aware`, `session` or `weighted:SCORER=W,...`;
    ValueError (one line) for anything else."""
    text = (DEFAULT_ROUTER if text is None else text).strip().lower()     # (an empty value is a mistake)
    if text in POLICIES:
        return RouterPolicy(text, () if text == "round-robin" else ((text, 1.0),))
    if not text.startswith(WEIGHTED + ":"):
        raise ValueError(f"--router {text!r}: choose {', '.join(POLICIES)}, or {WEIGHTED}:SCORER=W,... "
                         f"over {', '.join(SCORERS)}")
    weights: dict[str, float] = {}
    for part in text[len(WEIGHTED) + 1:].split(","):
        name, _, value = part.partition("=")
        name = name.strip()
        if name in weights:
            raise ValueError(f"--router {text!r}: {name} is weighted twice")
        if name not in SCORERS:
            raise ValueError(f"--router {text!r}: {name!r} is not a scorer; the weighted mix takes "
                             f"{', '.join(SCORERS)}")
        try:
            weight = float(value)
        except ValueError:
            raise ValueError(f"--router {text!r}: the weight of {name} must be a number, e.g. {name}=2") from None
        if not weight >= 0 or weight == float("inf"):
            raise ValueError(f"--router {text!r}: weights must be finite and >= 0")
        weights[name] = weight
    if not any(weights.values()):
        raise ValueError(f"--router {text!r}: give at least one scorer a weight above 0")
    canonical = ",".join(f"{k}={v:g}" for k, v in weights.items())
    return RouterPolicy(f"{WEIGHTED}:{canonical}", tuple(weights.items()))


class BaseRouter:
    """Picks a replica for a prompt from three readings a subclass supplies (see the module):
    `in_flight(now)` requests per replica, `kv_usage(now)` the fraction of KV blocks in use per
    replica, `cached_prefix(hashes, now)` how many of the prompt's leading block keys each holds."""

    def __init__(self, policy: RouterPolicy, count: int, block_size: int) -> None:
        self.policy = policy
        self.count = count
        self.block_size = block_size
        self.next = 0                      # the replica whose turn it is

    def pick(self, token_ids: list[int], now: float, root: int = ROOT_HASH, session: str | None = None) -> int:
        """The replica for a prompt whose block keys chain from `root` (cache_root's: its LoRA adapter's and
        cache salt's), of the `session` (a conversation's id) if it has one."""
        count = self.count
        if self.policy.round_robin or count == 1:
            chosen = self.next
        else:
            scores = self.scores(token_ids, now, root, session)
            best = max(scores)
            # Ties go to the first tied replica after the last one picked: equal replicas take turns.
            chosen = next(i % count for i in range(self.next, self.next + count) if scores[i % count] == best)
        self.next = (chosen + 1) % count
        return chosen

    def scores(self, token_ids: list[int], now: float, root: int = ROOT_HASH,
               session: str | None = None) -> list[float]:
        """Each replica's weighted score for a prompt arriving at `now`."""
        total = [0.0] * self.count
        for name, weight in self.policy.weights:
            if weight:
                for i, score in enumerate(self._score(name, token_ids, now, root, session)):
                    total[i] += weight * score
        return total

    def _score(self, name: str, token_ids: list[int], now: float, root: int, session: str | None) -> list[float]:
        if name == "least-requests" or (name == "session" and session is None):
            return least_requests_scores(self.in_flight(now))
        if name == "session":
            owner = session_owner(session, self.replica_ids())
            return [float(i == owner) for i in range(self.count)]
        if name == "least-kv":
            return [1.0 - usage for usage in self.kv_usage(now)]
        hashes = prompt_block_hashes(token_ids, self.block_size, root)
        if not hashes:
            return [0.0] * self.count
        return [held / len(hashes) for held in self.cached_prefix(hashes, now)]

    def replica_ids(self) -> list[int]:
        """Each replica's identity, which a session's owner is hashed with (its index in the whole fleet)."""
        return list(range(self.count))

    def in_flight(self, now: float) -> list[int]:
        raise NotImplementedError

    def kv_usage(self, now: float) -> list[float]:
        raise NotImplementedError

    def cached_prefix(self, hashes: list[int], now: float) -> list[int]:
        raise NotImplementedError


def least_requests_scores(counts: list[int]) -> list[float]:
    """llm-d's queue scorer: (max - n) / (max - min), 1 when all are equal."""
    low, high = min(counts), max(counts)
    return [1.0 if high == low else (high - n) / (high - low) for n in counts]


def session_owner(session: str, replica_ids: list[int]) -> int:
    """The position (in `replica_ids`) of the replica a session goes to: the highest of BLAKE2b(replica, session)
    (rendezvous hashing, the same in every process). Like the vLLM production stack's hash ring it moves only the
    sessions of a replica that leaves: the others keep theirs."""
    def weight(replica: int) -> bytes:
        return blake2b(f"{replica}\0{session}".encode(), digest_size=8).digest()
    return max(range(len(replica_ids)), key=lambda i: weight(replica_ids[i]))


def leading_held(hashes: list[int], held) -> int:
    """How many of `hashes`, from the first, are in `held` (llm-d's longest consecutive prefix)."""
    count = 0
    for h in hashes:
        if h not in held:
            break
        count += 1
    return count
