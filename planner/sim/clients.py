"""A run's clients: a closed loop's, each sending the trace's next request when its previous one ends, and an
open loop's whose turns wait for their answers.

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

`Sessions` are an open loop's clients under the deployment's `turns_after_answers`: every request at its
trace time but a conversation's later turns, each sent once the turn before it has ended (its think time
after, workloads/sessions.py).
"""
from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING, Callable

import simpy

from workloads.clients import ClientKnobs, TurnQueue, pause
from workloads.sessions import TurnsAfterAnswers

# The turnaround `validate --endpoint` simulates its closed loop with when none is given: the order of
# an HTTP round trip on loopback with a short prompt to tokenize. Any turnaround shorter than the
# engine's step gives the same schedule; the point is that it is not 0.
SERVED_TURNAROUND = 0.001

if TYPE_CHECKING:
    from engine.deployment import Deployment
    from planner.sim.engine import Due
    from workloads import TraceRequest


def unmeasured(loop: Clients | None) -> set[str]:
    """The requests of a closed loop's warm-up (--client-warmup-step, or --client-warmup-percent), which a run's
    figures leave out."""
    return loop.waiting.unmeasured if loop is not None else set()


def unsent(loop: Clients | None) -> int:
    """The requests of a run's trace its clients never sent (those its stopped clients left, or the turns after
    a refused one), 0 without clients."""
    return loop.waiting.dropped if loop is not None else 0


def make_clients(env: simpy.Environment, requests, send: Callable[[TraceRequest, float], None], *,
                 concurrency: int | None, deployment: Deployment, seed: int, due: Due | None,
                 all_sent: Callable[[], None], paced: bool = False) -> Clients | None:
    """The clients that send a run's requests through `send`: a closed loop of `concurrency` (`paced`: none
    before its trace time), an open loop's `Sessions` under the deployment's turns_after_answers, or None: the
    open loop's plain arrivals, which the caller sends."""
    if concurrency is not None:
        return ClosedLoop(env, requests, send, clients=concurrency, deployment=deployment, seed=seed, due=due,
                          all_sent=all_sent, paced=paced)
    if deployment.turns_after_answers:
        return Sessions(env, requests, send, due=due, all_sent=all_sent)
    return None


class Clients:
    """What a run's clients send, and when: each request through `send`, some of them later (`_after`), which an
    engine's windows stop before (`due`); `all_sent` once the last has gone or will never go."""

    def __init__(self, env: simpy.Environment, waiting, send: Callable[[TraceRequest, float], None], *,
                 due: Due | None, all_sent: Callable[[], None]) -> None:
        self.env = env
        self.waiting = waiting            # the requests to send (a TurnQueue, or TurnsAfterAnswers)
        self.unsent = len(waiting)        # not yet sent: those the clients hold, and those on their way
        self.dropped = 0                  # of them, those the clients will never send (counted out of unsent)
        self.in_flight: dict[str, tuple[TraceRequest, float]] = {}   # request id -> (the request, when sent)
        self.send = send                  # send(request, arrival time): into an engine's queue, or a router's
        self.due = due                    # told of each send on its way, so an engine's windows stop before it
        self.all_sent = all_sent
        self.on_the_way: list[float] = []   # a heap: when the sends and releases waited for happen

    def _count_dropped(self) -> None:
        """The requests the clients will now never send, counted out of those unsent."""
        newly = self.waiting.dropped - self.dropped
        if newly:
            self.dropped += newly
            self.unsent -= newly
            if not self.unsent:
                self.all_sent()

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


class ClosedLoop(Clients):
    """The clients of a closed loop and the requests they have still to send."""

    def __init__(self, env: simpy.Environment, requests, send: Callable[[TraceRequest, float], None], *,
                 clients: int, deployment: Deployment, seed: int = 0, due: Due | None = None,
                 all_sent: Callable[[], None], paced: bool = False) -> None:
        """`clients` of `deployment`'s kind (its client_turnaround and ClientKnobs)."""
        super().__init__(env, TurnQueue(requests, clients, ClientKnobs.of(deployment), seed), send, due=due,
                         all_sent=all_sent)
        self.paced = paced                # send no request before its trace time
        self.clients = clients
        self.rate, self.seed = deployment.client_request_rate, seed   # a client's own pace (`pause`)
        self.turnaround = deployment.client_turnaround

    def start(self) -> None:
        """The clients send their first requests (those that find no conversation to begin stop: `begin`)."""
        firsts = self.waiting.begin(self.clients)
        for req in firsts:
            self._next(req)
        if len(firsts) < self.clients:
            self._next(None)                # the clients that stopped at once: what they leave, a new phase

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
            self._count_dropped()
            if self.waiting.take_new_phase():     # the warm-up has ended: the benchmark's clients begin
                self.start()
            return
        if self.paced and req.arrival_time > self.env.now:
            self._after(req.arrival_time - self.env.now, lambda: self._send(req, req.arrival_time))
        else:
            self._send(req, self.env.now)


class Sessions(Clients):
    """An open loop whose conversations' later turns wait for their answers (a deployment's
    `turns_after_answers`, workloads/sessions.py): the first turns, and the requests of no conversation, at their
    trace times; each later turn when `TurnsAfterAnswers.due` says, once the turn before it has ended."""

    def __init__(self, env: simpy.Environment, requests, send: Callable[[TraceRequest, float], None], *,
                 due: Due | None = None, all_sent: Callable[[], None]) -> None:
        super().__init__(env, TurnsAfterAnswers(requests), send, due=due, all_sent=all_sent)

    def start(self) -> None:
        self._arrive()

    def _arrive(self) -> None:
        """The first turns due by now sent, stamped with their trace times; the next one sent when it is due."""
        starts = self.waiting.starts
        while starts:
            delay = starts[0].arrival_time - self.env.now
            if delay > 0:
                self._after(delay, self._arrive_next)
                return
            self._arrive_next(then=False)

    def _arrive_next(self, then: bool = True) -> None:
        req = self.waiting.starts.popleft()
        self._send(req, req.arrival_time)
        if then:
            self._arrive()

    def ended(self, request_ids: list[str], refused: set[str] = frozenset()) -> None:
        """These requests ended now (those in `refused` refused): their conversations' next turns sent when due."""
        for request_id in request_ids:
            req, _ = self.in_flight.pop(request_id)
            turn = self.waiting.after(req, request_id in refused)
            if turn is None:
                self._count_dropped()
                continue
            at = TurnsAfterAnswers.due(turn, self.env.now)
            if at > self.env.now:
                self._after(at - self.env.now, lambda turn=turn, at=at: self._send(turn, at))
            else:
                self._send(turn, self.env.now)
