"""What a deployment does with a trace that its reader might not expect, said as warnings beside the plan's.

A setting can be right for one trace and do nothing for another; the run goes on (its figures are what the
setting gives), and the warning says why they may not be the ones asked for. The simulation and `planner
validate` read these, so a live run and its simulation warn alike (and `planner bench`, the turns' warning).
"""
from __future__ import annotations

from engine.deployment import Deployment
from workloads import Trace


def trace_warnings(trace: Trace, deployment: Deployment, concurrency: int | None) -> list[str]:
    """The warnings of `trace` run on `deployment` by `concurrency` clients (None: an open loop)."""
    found = turns_warnings(trace, deployment.turns_after_answers, concurrency)
    if deployment.prefix_caching_on:
        found += _hash_block_warnings(trace, deployment.block_size)
    return found


def turns_warnings(trace: Trace, turns_after_answers: bool, concurrency: int | None) -> list[str]:
    """--turns-after-answers on an open loop (`planner bench` too) over a trace with no later turn to time."""
    if not turns_after_answers or concurrency is not None:
        return []
    if any(r.conversation_id is not None and r.turn > 0 for r in trace):
        return []
    return ["--turns-after-answers: the trace has no conversation with a later turn, so every request is sent at "
            "its arrival time, as without it"]


def _hash_block_warnings(trace: Trace, block_size: int) -> list[str]:
    """Prompts made of hash blocks (a Mooncake trace's) that are not whole KV blocks: two prompts that share
    k hash blocks share k x hash_block_size tokens, and a prefix cache holds only the whole KV blocks of those,
    so part of the trace's reuse is lost (counted for an unbounded cache, as Trace.stats counts the reuse)."""
    sizes = sorted({r.hash_block_size for r in trace if r.hash_ids is not None and r.hash_block_size % block_size})
    if not sizes:
        return []
    shared, cached = trace.hashed_reuse(), trace.hashed_reuse(block_size)
    if not shared:
        return []
    return [f"the trace's prompts share blocks of {' and '.join(map(str, sizes))} tokens (hash_block_size), not "
            f"whole {block_size}-token KV blocks: a prefix cache can hold {cached / shared:.0%} of the {shared:,} "
            f"prompt tokens they share (hash blocks of a multiple of {block_size} tokens would keep them all)"]
