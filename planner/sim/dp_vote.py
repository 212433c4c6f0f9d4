"""The dp ranks' vote on dual-batch overlap, for a lockstep group (planner/sim/lockstep.py).

A cost model with --enable-dbo prices each rank's step as that rank alone would run it: in two microbatches
where its own tokens pass vLLM's thresholds (planner/cost/dbo.py). vLLM's dp ranks split together or not at
all (`DualBatch.agreed`); where the vote fails, the steps that would have split are priced whole by the same
model without the split (its `whole()`). A plan's steps are re-priced as the plan priced them (a priced run
through the whole model's `decode_step_times`, else shape by shape), which gives the floats a step-by-step
run's `step_time` gives: the models' contract (planner/sim/decode_run.py).
"""
from __future__ import annotations

from planner.cost.shape import StepShape
from planner.sim.batch import Plan
from planner.sim.decode_run import DecodeRun, run_pricer


class DpVote:
    """The vote of one lockstep group's ranks, and the whole prices of the steps it keeps whole."""

    def __init__(self, cost_model) -> None:
        self.dbo = cost_model.dual_batch
        self.padding = cost_model.split_padding
        self.whole = cost_model.whole()
        self.run_pricer = run_pricer(self.whole)

    @classmethod
    def of(cls, cost_model) -> DpVote | None:
        """The vote where the model splits steps; None otherwise. The class is asked, not the object: a
        wrapper (noise, a speed factor) that forwards what it lacks to its base must not price without it."""
        if getattr(type(cost_model), "whole", None) is None or cost_model.dual_batch is None:
            return None
        return cls(cost_model)

    def _ballot(self, tokens: int, seqs: int, decode_only: bool) -> tuple[int, int, bool, int]:
        return tokens, seqs, decode_only, self.padding(tokens)

    def step_ballot(self, shape: StepShape) -> tuple[int, int, bool, int]:
        return self._ballot(shape.total_tokens, shape.batch_size, not shape.prefill_tokens)

    def plan_ballot(self, plan: Plan) -> tuple[int, int, bool, int]:
        """A plan's steps all decode the same members: one ballot for all of them."""
        source = plan.source
        if isinstance(source, DecodeRun):
            return self._ballot(source.num, source.num, True)
        return self.step_ballot(source[0])

    def wants(self, ballot: tuple[int, int, bool, int]) -> bool:
        return self.dbo.splits(ballot[0], ballot[1], ballot[2])

    def agreed(self, ballots: list[tuple[int, int, bool, int]], ranks: int) -> bool:
        """Whether the busy ranks' `ballots` split the group's step; the `ranks` without one run a dummy batch."""
        return self.dbo.agreed(ballots, idle=len(ballots) < ranks)

    def step_price(self, shape: StepShape, extra: float) -> float:
        """A step's price run whole (`extra`: its seconds beyond the shape's price)."""
        price = self.whole.step_time(shape)
        return price + extra if extra else price

    def plan_prices(self, plan: Plan, offset: int, count: int) -> list[float]:
        """Steps offset .. offset + count - 1 of `plan`, run whole."""
        source = plan.source
        if isinstance(source, DecodeRun):
            if self.run_pricer is not None:
                low, counts, sums = source.chunk(offset, count)
                return self.run_pricer(source.num, low, counts, sums).tolist()
            shapes = source.shapes(offset + count)[offset:]
        else:
            shapes = source[offset:offset + count]
        return [self.whole.step_time(shape) for shape in shapes]
