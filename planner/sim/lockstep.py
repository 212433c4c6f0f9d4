"""The data-parallel ranks of a mixture-of-experts deployment, stepping in lockstep.

vLLM runs the dp ranks of a MoE deployment as separate engine cores whose forward passes are aligned:
every MoE layer gathers all ranks' tokens, so no rank's step ends before the slowest rank's, and while
any rank has requests the idle ones run dummy batches to keep the collectives whole (vLLM's
docs/serving/data_parallel_deployment.md; the ranks of a dense model are independent). Here the ranks
of one deployment are `SimulatedEngine`s, each with its own scheduler, block manager and prefix cache,
driven by one process that takes a step on every rank with work at once, as long as the longest of
them. A rank with nothing to run adds nothing (a dummy batch of one token is no longer than the busy
ranks' steps). A request that reaches a rank mid-step joins at the group's next step.

Fast-forward keeps its meaning and its cost. A rank whose decode batch proves a plan of decode steps
(planner/sim/batch.py) holds it in flight: the group takes its steps one by one, each as long as the
longest of the ranks' steps at that moment (the plan's own prices), while the other ranks plan, step
and finish as they go; the plan is taken (its steps recorded, its requests finished) only when it runs
out or a request reaches its rank, at the group's clock. While every busy rank holds a plan the group
sleeps through a segment of such steps at once, up to the first plan that runs out or the first step
starting at or after the next arrival any rank knows of. Each end is summed one step at a time from
the last, so a run is the same with and without `--step-by-step`. Fast-forward windows (the paper's
policy) are not used in lockstep: such ranks step one at a time.

With --enable-dbo the ranks vote on each group step (planner/sim/dp_vote.py): they split it into two
microbatches together or not at all, and where the vote fails the steps that would have split are priced whole.
"""
from __future__ import annotations

from itertools import accumulate

import simpy

from planner.cost.shape import reads_context_histogram
from planner.sim.batch import Plan
from planner.sim.dp_vote import DpVote
from planner.sim.engine import IDLE, PLAN, Move, SimulatedEngine, Sleeper, kept_before


class InFlight:
    """A rank's plan the group is stepping through: the group's ends of the steps run so far. It is also
    the rank's `pending` (what a router reads of the rank's steps not yet taken)."""

    __slots__ = ("plan", "ends", "requests")

    def __init__(self, plan: Plan, requests: int) -> None:
        self.plan = plan
        self.ends: list[float] = []
        self.requests = requests           # requests the rank had when the plan was made

    def next_price(self) -> float:
        return self.plan.prices[len(self.ends)]

    def taken(self, steps: int) -> int:
        return self.plan.taken(steps)


class Lockstep(Sleeper):
    """One deployment's data-parallel ranks, their steps taken together by one process."""

    def __init__(self, env: simpy.Environment, engines: list[SimulatedEngine]) -> None:
        self.env, self.engines = env, engines
        self.flying: dict[SimulatedEngine, InFlight] = {}     # the ranks holding a plan in flight
        self.segment: tuple[float, list[float]] | None = None   # (start, ends) of the steps slept through
        self.wake_at = 0.0
        self.rank = {engine: i for i, engine in enumerate(engines)}
        self.vote = DpVote.of(engines[0].cost_model)     # the ranks' vote on dual-batch overlap, if they split
        for engine in engines:
            engine.group = self
        self.process = env.process(self.run())

    def run(self):
        """The group's process: each rank without a plan in flight says what it does next; then one
        group step (some rank steps one at a time), a segment of the plans in flight, or sleep while
        every rank is idle."""
        engines, flying = self.engines, self.flying
        cost_model = engines[0].cost_model
        step_time = cost_model.step_time
        histogram = reads_context_histogram(cost_model)
        while True:
            single = []
            for engine in engines if len(flying) < len(engines) else ():
                if engine in flying:
                    continue
                if engine.held:
                    engine._admit_held()
                move = self._move(engine, step_time, histogram)
                if move.kind is PLAN:
                    flying[engine] = engine.pending = InFlight(move.plan, len(engine.groups))
                elif move.kind is not IDLE:
                    single.append((engine, move))
            if single:
                yield from self._run_single(single)
            elif flying:
                yield from self._run_segment(min(engine.horizon for engine in engines),
                                             min(engine.ahead for engine in engines))
            elif all([engine.check_done() for engine in engines]):
                return
            else:
                yield from self._sleep()

    @staticmethod
    def _move(engine: SimulatedEngine, step_time, histogram: bool) -> Move:
        """The rank's next move; an idle rank first counts what its scheduler ended and looks again."""
        if not (engine.scheduler.has_unfinished() or engine.held):
            return IDLE_MOVE
        while True:
            move = engine.next_move(step_time, histogram, engine.horizon, windows=False, ahead=engine.ahead)
            if move.kind is not IDLE or not engine.settle(move.out):
                return move

    def _sleep(self):
        """Every rank idle: sleep until a request reaches any of them."""
        idle = self.env.event()
        for engine in self.engines:
            engine.idle = idle
        yield idle
        for engine in self.engines:
            engine.idle = None

    def _run_single(self, single: list[tuple[SimulatedEngine, Move]]):
        """One group step: the ranks stepping one at a time and each plan's next step, as long as the longest."""
        flying = list(self.flying.values())
        start = self.env.now
        prices = [move.price for _, move in single] + [f.next_price() for f in flying]
        if self.vote is not None:
            prices = self._voted_step(single, flying, prices)
        yield self.env.timeout(max(prices))
        end = self.env.now
        self._took_steps(start, [end])
        for f in flying:
            f.ends.append(end)
        taken = [(engine, 1, move.finish(end)) for engine, move in single]
        yield from self._after(end, taken + self._land())

    def _run_segment(self, horizon: float, ahead: int):
        """Every busy rank holds a plan: sleep through their steps together, each as long as the ranks'
        longest then, up to the first plan that runs out, none starting at or after `horizon` but the
        `ahead` first of those."""
        flying = list(self.flying.values())
        steps = min([len(f.plan.prices) - len(f.ends) for f in flying])
        start = self.env.now
        prices = [f.plan.prices[len(f.ends):len(f.ends) + steps] for f in flying]
        if self.vote is not None:
            prices = self._voted_segment(flying, steps, prices)
        # Each end summed from the last, as stepping one group step at a time does (accumulate adds in order).
        ends = list(accumulate(prices[0] if len(prices) == 1 else map(max, *prices), initial=start))
        del ends[0]
        del ends[kept_before(start, ends, horizon, ahead):]
        for f in flying:
            f.ends += ends
        if ends:
            self.segment = (start, ends)
            yield from self.sleep_until(ends[-1])
            self.segment = None
            if ends:                                       # none when a request cut them all
                self._took_steps(start, ends)
        yield from self._after(ends[-1] if ends else start, self._land())   # none left: cut at its start

    def _voted_step(self, single: list[tuple[SimulatedEngine, Move]], flying: list[InFlight],
                    prices: list[float]) -> list[float]:
        """The prices of one group step after the ranks' vote: the steps that would split, whole if it fails."""
        vote = self.vote
        ballots = [vote.step_ballot(move.shape) for _, move in single] + [vote.plan_ballot(f.plan) for f in flying]
        if vote.agreed(ballots, len(self.engines)):
            return prices
        whole = [vote.step_price(move.shape, move.extra) if vote.wants(ballot) else price
                 for (_, move), ballot, price in zip(single, ballots, prices)]
        n = len(single)
        whole += [vote.plan_prices(f.plan, len(f.ends), 1)[0] if vote.wants(ballot) else price
                  for f, ballot, price in zip(flying, ballots[n:], prices[n:])]
        return whole

    def _voted_segment(self, flying: list[InFlight], steps: int, prices: list[list[float]]) -> list[list[float]]:
        """A segment's prices after the ranks' vote, the same for all its steps (each plan's members are fixed)."""
        vote = self.vote
        ballots = [vote.plan_ballot(f.plan) for f in flying]
        if vote.agreed(ballots, len(self.engines)):
            return prices
        return [vote.plan_prices(f.plan, len(f.ends), steps) if vote.wants(ballot) else these
                for f, ballot, these in zip(flying, ballots, prices)]

    def _took_steps(self, start: float, ends: list[float]) -> None:
        for engine in self.engines:
            engine.took_steps(start, ends)

    def _land(self) -> list[tuple[SimulatedEngine, int, list]]:
        """Take the plans that ran out or whose rank a request reached: (rank, steps, requests finished)."""
        landed = []
        done = [(engine, f) for engine, f in self.flying.items()
                if len(f.ends) == len(f.plan.prices) or len(engine.groups) != f.requests]
        for engine, f in done:
            del self.flying[engine]
            engine.pending = None
            plan = f.plan
            if f.ends:
                plan.truncate(len(f.ends))
                plan.ends = f.ends
                landed.append((engine, len(f.ends), engine.take_plan(plan)))
        return landed

    def _after(self, end: float, taken: list[tuple[SimulatedEngine, int, list]]):
        """After the group's steps end at `end`: each rank's ended requests, progress and watch; one yield
        if a request is due at this very instant, so it joins before the next schedule; the plans of the
        ranks a request reached meanwhile, taken up to here."""
        while True:
            while taken:
                if len(taken) > 1:
                    taken.sort(key=lambda t: self.rank[t[0]])     # in rank order, as stepping one at a time does
                sent = self._requests()
                for engine, count, finished in taken:
                    engine.after_steps(count, end, finished)
                # A client whose request finished sends its next at once: its rank's plan is taken here.
                taken = self._land() if self._requests() != sent else []
            if not any(engine.due.at <= end for engine in self.engines):
                return
            sent = self._requests()
            yield self.env.timeout(0)
            taken = self._land() if self._requests() != sent else []

    def _requests(self) -> int:
        """Requests sent to the ranks so far."""
        return sum(len(engine.groups) for engine in self.engines)

    def cut(self, t: float, ahead: int) -> None:
        """A request reached a rank at `t`: the segment slept through ends with the step under way then
        (and `ahead` more: the rank's step scheduled ahead)."""
        if self.segment is None:
            return
        start, ends = self.segment
        keep = kept_before(start, ends, t, ahead, cut=True)
        dropped = len(ends) - keep
        if dropped:
            for f in self.flying.values():
                del f.ends[len(f.ends) - dropped:]
            del ends[keep:]
            self.wake_at = ends[-1] if keep else start
            self.process.interrupt()


IDLE_MOVE = Move(IDLE)


def lockstep_ranks(plan) -> int:
    """How many consecutive engines of `plan`'s deployment step together: a MoE model's dp ranks; else 1."""
    return plan.deployment.dp if plan.model.is_moe else 1


def lockstep_groups(env: simpy.Environment, engines: list[SimulatedEngine], ranks: int) -> list[Lockstep]:
    """The groups of `ranks` consecutive engines, each stepped by one Lockstep (none when ranks is 1; the
    engines were made with start=False)."""
    return [Lockstep(env, engines[i:i + ranks]) for i in range(0, len(engines), ranks)] if ranks > 1 else []
