"""Routing statistics of a mixture of experts: how many distinct experts T tokens touch, and how the
routed (token, expert) pairs spread over expert-parallel ranks (the derivation: planner/cost/moe.py).

Uniform routing: E (1 - (1 - k/E) ** T). A power-law skew gives expert e (by popularity rank) the
share p_e ~ (e + 1) ** -skew of the pairs; its probability of being in one token's top k is k p_e,
capped at 1 with the excess spread over the others so the k picks add up. The cost models price
steps with these; `planner profile` holds the engine's measured counts up to them.
"""
from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=64)
def popularity(experts: int, skew: float) -> tuple[float, ...]:
    """Each expert's share of the routed (token, expert) pairs, most popular first."""
    weights = [(e + 1) ** -skew for e in range(experts)]
    total = sum(weights)
    return tuple(w / total for w in weights)


@lru_cache(maxsize=64)
def rank_experts(experts: int, ep: int) -> tuple[int, ...]:
    """Popularity ranks of the experts on EP rank 0 (the busiest): 0, ep, 2 ep, ..."""
    return tuple(range(0, experts, ep))


@lru_cache(maxsize=64)
def inclusion(experts: int, top_k: int, skew: float) -> tuple[float, ...]:
    """Each expert's probability of being in one token's top k: k x popularity, capped at 1, the excess
    spread over the uncapped experts in proportion, so the probabilities sum to k."""
    q = [top_k * p for p in popularity(experts, skew)]
    while any(x > 1.0 + 1e-12 for x in q):
        capped = [x >= 1.0 for x in q]
        free = sum(x for x, c in zip(q, capped) if not c)
        scale = (top_k - sum(capped)) / free
        q = [1.0 if c else x * scale for x, c in zip(q, capped)]
    return tuple(q)


def experts_touched(tokens: float, experts: int, top_k: int, skew: float = 0.0,
                    among: tuple[int, ...] | None = None) -> float:
    """Expected distinct experts (of `among`, default all) that `tokens` tokens route to."""
    if tokens <= 0:
        return 0.0
    if skew == 0.0:
        local = experts if among is None else len(among)
        return local * (1.0 - (1.0 - top_k / experts) ** tokens)
    q = inclusion(experts, top_k, skew)
    ids = range(experts) if among is None else among
    return sum(1.0 - (1.0 - q[e]) ** tokens for e in ids)


def pair_share(experts: int, top_k: int, ep: int, skew: float) -> float:
    """The busiest EP rank's share of the routed pairs (1/ep when routing is uniform and experts divide)."""
    q = inclusion(experts, top_k, skew)
    return sum(q[e] for e in rank_experts(experts, ep)) / top_k
