"""A closed loop of clients: each sends the trace's next request when its previous one ends.

`turnaround` is the deployment's `client_turnaround`: the seconds from a
request's end in the engine to its client's next request in the engine's
queue. With 0 the next request joins the very next step, as clients in the
engine's own process do (validate's live engine). A client of an API server
(`vllm bench serve --max-concurrency N` against `vllm serve`) gets its answer
and sends the next request through HTTP and the tokenizer while the engine
has already scheduled its next step, so the request waits for that step to end
and joins the one after: any turnaround shorter than a step gives that.
"""
from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING, Callable

import simpy

# The turnaround `validate --endpoint` simulates its closed loop with when none is given: the order of
# an HTTP round trip on loopback with a short prompt to tokenize. Any turnaround shorter than the
# engine's step gives the same schedule; the point is that it is not 0.
SERVED_TURNAROUND = 0.001

if TYPE_CHECKING:
    from planner.sim.engine import Due
    from workloads import TraceRequest


class ClosedLoop:
    """The clients of a closed loop and the requests they have still to send."""

    def __init__(self, env: simpy.Environment, requests, send: Callable[[TraceRequest, float], None], *,
                 turnaround: float = 0.0, due: Due | None = None, all_sent: Callable[[], None]) -> None:
        self.env = env
        self.waiting = deque(requests)
        self.send = send                  # send(request, arrival time): into an engine's queue, or a router's
        self.turnaround = turnaround
        self.due = due                    # told of each release on its way, so an engine's windows stop before it
        self.all_sent = all_sent
        self.on_the_way: deque[float] = deque()   # when the releases on their way arrive (in order: one turnaround)

    def release(self, count: int) -> None:
        """`count` clients send their next requests now."""
        for _ in range(min(count, len(self.waiting))):
            self.send(self.waiting.popleft(), self.env.now)
        if not self.waiting:
            self.all_sent()

    def ended(self, count: int) -> None:
        """`count` requests ended now: their clients send their next ones after the turnaround."""
        if not count or not self.waiting:
            return
        if self.turnaround <= 0:
            self.release(count)
            return
        at = self.env.now + self.turnaround         # the very float SimPy's timeout wakes at
        self.on_the_way.append(at)
        if self.due is not None:
            self.due.at = min(self.due.at, at)
        self.env.process(self._release_later(count))

    def _release_later(self, count: int):
        yield self.env.timeout(self.turnaround)
        self.on_the_way.popleft()
        if self.due is not None:
            self.due.at = self.on_the_way[0] if self.on_the_way else math.inf
        self.release(count)
