"""A closed loop of clients: each sends the trace's next request when its previous one ends.

`turnaround` is the deployment's `client_turnaround`: the seconds from a
request's end in the engine to its client's next request in the engine's
queue. With 0 the next request joins the very next step, as clients in the
engine's own process do (validate's live engine). A client of an API server
(`vllm bench serve --max-concurrency N` against `vllm serve`) gets its answer
and sends the next request through HTTP and the tokenizer while the engine
has already scheduled its next step, so the request waits for that step to end
and joins the one after: any turnaround shorter than a step gives that.

A closed loop alone sends the trace's requests in order, their times aside, and a conversation's turns
one after another by the client that began it (workloads/clients.py, as vLLM's multi-turn benchmark,
`max_active_conversations` of them active among the clients, each client stopping as that benchmark's
do: `unsent(loop)` says how many were never sent; after a warm-up, new clients start the benchmark's
phase, and `unmeasured(loop)` are the requests a run's figures leave out).
`paced` (a request rate too: `vllm bench serve --request-rate R
--max-concurrency N`) sends none before its trace time and keeps at most N
in flight: a request due while N are out waits for one of them to end. Its
clock starts when it is sent, as vLLM's benchmark starts it once the request
holds a slot.
"""
from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING, Callable

import simpy

from workloads.clients import ClientKnobs, TurnQueue, pause

# The turnaround `validate --endpoint` simulates its closed loop with when none is given: the order of
# an HTTP round trip on loopback with a short prompt to tokenize. Any turnaround shorter than the
# engine's step gives the same schedule; the point is that it is not 0.
SERVED_TURNAROUND = 0.001

if TYPE_CHECKING:
    from engine.deployment import Deployment
    from planner.sim.engine import Due
    from workloads import TraceRequest


def unmeasured(loop: ClosedLoop | None) -> set[str]:
    """The requests of a closed loop's warm-up (--client-warmup-step, or --client-warmup-percent), which a run's
    figures leave out."""
    return loop.waiting.unmeasured if loop is not None else set()


def unsent(loop: ClosedLoop | None) -> int:
    """The requests of a run's trace its closed loop never sent (those its stopped clients left), 0 without
    one."""
    return loop.waiting.dropped if loop is not None else 0


class ClosedLoop:
    """The clients of a closed loop and the requests they have still to send."""

    def __init__(self, env: simpy.Environment, requests, send: Callable[[TraceRequest, float], None], *,
                 clients: int, deployment: Deployment, seed: int = 0, due: Due | None = None,
                 all_sent: Callable[[], None], paced: bool = False) -> None:
        """`clients` of `deployment`'s kind (its client_turnaround and ClientKnobs)."""
        self.env = env
        self.paced = paced                # send no request before its trace time
        self.clients = clients
        self.waiting = TurnQueue(requests, clients, ClientKnobs.of(deployment), seed)
        self.unsent = len(self.waiting)   # not yet sent: those the clients hold, and those on their way
        self.dropped = 0                  # of them, those the clients will never send (counted out of unsent)
        self.in_flight: dict[str, tuple[TraceRequest, float]] = {}   # request id -> (the request, when sent)
        self.rate, self.seed = deployment.client_request_rate, seed   # a client's own pace (`pause`)
        self.send = send                  # send(request, arrival time): into an engine's queue, or a router's
        self.turnaround = deployment.client_turnaround
        self.due = due                    # told of each send on its way, so an engine's windows stop before it
        self.all_sent = all_sent
        self.on_the_way: list[float] = []   # a heap: when the sends and releases waited for happen

    def start(self) -> None:
        """The clients send their first requests."""
        for _ in range(self.clients):
            self._next(self.waiting.first())

    def ended(self, request_ids: list[str], refused: set[str] = frozenset()) -> None:
        """These requests ended now (those in `refused` refused): their clients send their next ones after
        the turnaround (and the pause of their own pace)."""
        ended = [self.in_flight.pop(request_id) for request_id in request_ids]
        if not ended or not self.waiting:
            return
        if self.rate is not None:
            for req, sent in ended:
                wait = self.turnaround + pause(self.rate, self.env.now - sent, req.request_id, self.seed)
                if wait > 0:
                    self._after(wait, lambda req=req: self._after_ended([req], refused))
                else:
                    self._after_ended([req], refused)
            return
        ended = [req for req, _ in ended]
        if self.turnaround <= 0:
            self._after_ended(ended, refused)
            return
        self._after(self.turnaround, lambda: self._after_ended(ended, refused))

    def _after_ended(self, ended: list[TraceRequest], refused: set[str]) -> None:
        for req in ended:
            self._next(self.waiting.after(req, req.request_id in refused))

    def _next(self, req: TraceRequest | None) -> None:
        """A client's next request sent now, or paced, when it comes due."""
        if req is None:          # the client stopped: what it left (or, the last or early, the rest) never sent
            newly = self.waiting.dropped - self.dropped
            if newly:
                self.dropped += newly
                self.unsent -= newly
                if not self.unsent:
                    self.all_sent()
            if self.waiting.take_new_phase():     # the warm-up has ended: the benchmark's clients begin
                self.start()
            return
        if self.paced and req.arrival_time > self.env.now:
            self._after(req.arrival_time - self.env.now, lambda: self._send(req, req.arrival_time))
        else:
            self._send(req, self.env.now)

    def _send(self, req: TraceRequest, at: float) -> None:
        self.in_flight[req.request_id] = (req, at)
        self.send(req, at)
        self.unsent -= 1
        if not self.unsent:
            self.all_sent()

    def _after(self, delay: float, action: Callable[[], None]) -> None:
        at = self.env.now + delay                   # the very float SimPy's timeout wakes at
        heapq.heappush(self.on_the_way, at)
        if self.due is not None:
            self.due.at = min(self.due.at, at)
        self.env.process(self._wait(delay, action))

    def _wait(self, delay: float, action: Callable[[], None]):
        yield self.env.timeout(delay)
        heapq.heappop(self.on_the_way)              # the earliest: this one (or a tie)
        if self.due is not None:
            self.due.at = self.on_the_way[0] if self.on_the_way else math.inf
        action()
