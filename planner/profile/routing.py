"""How many experts the engine's MoE layers touch per forward pass, measured while profiling.

A forward hook on each sparse block's router (engine/models/moe.py) sees the router's logits [T, E]
and counts the distinct experts among each token's top k (softmax keeps the order, so these are the
experts the block runs). Measured on prompts of a grid of token counts, averaged over the MoE layers,
and written into the profile beside the uniform-routing expectation E (1 - (1 - k/E) ** T) the cost
models use: a random-weight checkpoint routes close to uniformly, a trained one need not.
"""
from __future__ import annotations

import random
import statistics

import torch

from engine.model_runner import ModelRunner
from planner.catalog import ModelSpec
from planner.catalog.routing import experts_touched
from planner.profile import pieces
from planner.profile.schema import ExpertsTouched


def measure_experts_touched(runner: ModelRunner, spec: ModelSpec, token_counts: list[int],
                            seed: int = 0) -> list[ExpertsTouched]:
    """Per token count, the mean distinct experts per MoE layer in one prefill of that many tokens."""
    from engine.models.moe import SparseMoeBlock       # torch side: only a MoE profile needs it

    blocks = [m for m in runner.model.modules() if isinstance(m, SparseMoeBlock)]
    if not blocks:
        return []
    counts: list[int] = []

    def count(module, inputs, logits: torch.Tensor) -> None:
        ids = torch.topk(logits, spec.num_experts_per_tok, dim=-1).indices
        counts.append(int(torch.unique(ids).numel()))

    handles = [b.router.register_forward_hook(count) for b in blocks]
    rng, found = random.Random(seed), []
    try:
        for tokens in sorted(set(token_counts)):
            counts.clear()
            runner.execute(pieces.prefill_inputs(runner, tokens, 1, rng))
            found.append(ExpertsTouched(tokens=tokens, measured=statistics.fmean(counts),
                                        uniform=experts_touched(tokens, spec.num_experts, spec.num_experts_per_tok)))
    finally:
        for handle in handles:
            handle.remove()
    return found
