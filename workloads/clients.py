"""What a closed loop's clients send next: the trace's requests, conversation by conversation.

A client of a multi-turn conversation sends its next turn only when the answer to the one before has come
(the turn's prompt holds that answer), as vLLM's multi-turn benchmark does
(benchmarks/multi_turn/benchmark_serving_multi_turn.py, `client_main`). Each client keeps its active
conversations, one by default, and sends one request at a time: it takes new conversations while it has
fewer than its share, sends the turn of the one it took last, and puts a conversation with turns left back
behind the others, so a client of several turns to them in rotation (the benchmark's round_robin sampling).
`--max-active-conversations K` over N clients gives each K // N (the benchmark's rule; K < N refused).
A request of no conversation is a conversation of one turn, so a trace without conversations is sent in
its own order, as `vllm bench serve --max-concurrency` sends it (with one conversation a client).
With `early_stop` (the multi-turn benchmark's default; its --no-early-stop turns it off) the clients stop
as soon as one finds no conversation left to take: that client leaves its other conversations, the others
stop after their request under way, and the trace's turns not yet sent are never sent.

The simulator's closed loop, the live engine's and the live fleet's replays, and `planner bench` all draw
from a `TurnQueue`, so they send the same requests in the same order.
"""
from __future__ import annotations

import math
from collections import deque
from typing import Iterable

from .schema import TraceRequest
from .tokens import stream


def check_clients(clients: int | None, max_active_conversations: int | None = None,
                  client_request_rate: float | None = None, conversations: int | None = None,
                  early_stop: bool = False) -> None:
    """A ValueError, in the planner's words, for what vLLM's multi-turn benchmark refuses of `clients` (None:
    an open loop) keeping `max_active_conversations` over a trace of `conversations` (None: not checked),
    or for a client's own rate or early stop without clients."""
    if clients is None:
        knob = ("--max-active-conversations shares conversations among" if max_active_conversations is not None
                else "--client-request-rate paces" if client_request_rate is not None
                else "--client-early-stop stops" if early_stop else None)
        if knob is not None:
            raise ValueError(f"{knob} a closed loop's clients: give their number (--concurrency N; bench: "
                             f"--max-concurrency N)")
    if client_request_rate is not None and not 0 < client_request_rate < math.inf:
        raise ValueError(f"--client-request-rate must be a positive, finite number of requests/s, "
                         f"got {client_request_rate}")
    if max_active_conversations is not None and max_active_conversations < clients:
        raise ValueError(f"--max-active-conversations {max_active_conversations} must be at least the "
                         f"{clients} clients (each keeps K // N conversations, as in vLLM's multi-turn benchmark)")
    if max_active_conversations is not None and conversations is not None and max_active_conversations > conversations:
        raise ValueError(f"--max-active-conversations {max_active_conversations} is more than the trace's "
                         f"{conversations} conversations (vLLM's multi-turn benchmark refuses it too)")


def conversations_per_client(max_active_conversations: int | None, clients: int) -> int:
    """How many conversations each of `clients` keeps active under vLLM's --max-active-conversations K: K // N
    (None: one each)."""
    return 1 if max_active_conversations is None else max_active_conversations // clients


def pause(client_request_rate: float | None, duration: float, request_id: str, seed: int = 0) -> float:
    """How long a client waits after its request `request_id` ended, `duration` s after it was sent, before it
    sends its next: vLLM's multi-turn benchmark's at its --request-rate R (per client; `poisson_sleep`), an
    exponential time of mean 1/R minus the request's duration, none when that is not positive, or without R.
    Drawn from the request's own stream, so every closed loop draws the same for it."""
    mean = 1.0 / client_request_rate - duration if client_request_rate else 0.0
    if mean <= 0:
        return 0.0
    return -mean * math.log1p(-float(stream(seed, "pause", request_id).random()))


def conversations_in(requests: Iterable[TraceRequest]) -> int:
    """A trace's conversations, a request of none counting as one of its own."""
    ids = [req.conversation_id for req in requests]
    return len(set(ids) - {None}) + ids.count(None)


class TurnQueue:
    """The requests the clients have still to send (see the module)."""

    def __init__(self, requests: Iterable[TraceRequest], clients: int | None = None,
                 max_active_conversations: int | None = None, early_stop: bool = False) -> None:
        self.starts: deque[TraceRequest] = deque()      # each conversation's first turn (a lone request), in order
        self.rest: dict[str, deque[TraceRequest]] = {}  # a conversation not yet begun: its later turns, in order
        for req in requests:
            later = self.rest.get(req.conversation_id) if req.conversation_id is not None else None
            if later is not None:
                later.append(req)
                continue
            self.starts.append(req)
            if req.conversation_id is not None:
                self.rest[req.conversation_id] = deque()
        self.unsent = len(self.starts) + sum(map(len, self.rest.values()))
        check_clients(clients, max_active_conversations, conversations=len(self.starts), early_stop=early_stop)
        self.conversations_each = conversations_per_client(max_active_conversations, clients)
        # a sent request's id -> (its client's other active conversations, its own conversation's later turns)
        self.sent: dict[str, tuple[deque[deque[TraceRequest]], deque[TraceRequest]]] = {}
        self.early_stop, self.stopped = early_stop, False

    def __len__(self) -> int:
        """The requests the clients will still send."""
        return 0 if self.stopped else self.unsent

    @property
    def dropped(self) -> int:
        """The trace's requests an early stop left unsent."""
        return self.unsent if self.stopped else 0

    def first(self) -> TraceRequest | None:
        """A new client's first request (None when no conversation is left to begin)."""
        return self._turn(deque())

    def after(self, ended: TraceRequest) -> TraceRequest | None:
        """The next request of the client whose request `ended` (finished or refused) has just ended."""
        active, later = self.sent.pop(ended.request_id)
        if later:
            active.appendleft(later)       # behind the client's other conversations
        return self._turn(active)

    def _turn(self, active: deque[deque[TraceRequest]]) -> TraceRequest | None:
        """The next request of a client with these active conversations (each its turns still to send)."""
        while len(active) < self.conversations_each and not self.stopped:
            if not self.starts:            # none left to take: with early stop, every client stops
                self.stopped = self.early_stop
                break
            first = self.starts.popleft()
            turns = self.rest.pop(first.conversation_id, None) if first.conversation_id is not None else None
            turns = turns if turns is not None else deque()
            turns.appendleft(first)
            active.append(turns)
        if self.stopped or not active:
            return None
        turns = active.pop()               # the conversation taken last, or the one whose turn is due
        req = turns.popleft()
        self.sent[req.request_id] = (active, turns)
        self.unsent -= 1
        return req
