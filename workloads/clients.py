"""What a closed loop's clients send next: the trace's requests, conversation by conversation.

A client of a multi-turn conversation sends its next turn only when the answer to the one before has come
(the turn's prompt holds that answer), as vLLM's multi-turn benchmark does
(benchmarks/multi_turn/benchmark_serving_multi_turn.py, `client_main`). Each client keeps its active
conversations, one by default, and sends one request at a time: it takes new conversations while it has
fewer than its share, sends the turn of the one it took last, and puts a conversation with turns left back
behind the others, so a client of several turns to them in rotation (the benchmark's round_robin sampling).
Under its random sampling (`conversation_sampling` "random") a client sends the turn of an active
conversation picked as the benchmark's client picks it: Python's `random.choice` over its conversations in
the order it took them, from a generator seeded with the run's seed plus the client's number plus one (each
phase's clients numbered from 0 in the order they start).
`--max-active-conversations K` over N clients gives each K // N (the benchmark's rule; K < N refused).
A request of no conversation is a conversation of one turn, so a trace without conversations is sent in
its own order, as `vllm bench serve --max-concurrency` sends it (with one conversation a client).

A client stops, as the benchmark's does, when it finds no conversation left to take (leaving the turns of
its other active conversations unsent) or when it has sent its `client_max_requests` (the benchmark's
--max-num-requests M, M // N a client); a turn the server refused ends its conversation. With
`client_early_stop` (the benchmark's default; its --no-early-stop turns it off) the first client to stop
stops them all, each after its request under way, and the trace's turns not yet sent are never sent.

With `client_warmup_step` (the benchmark's --warmup-step) a warm-up comes first: the clients, one
conversation each and no early stop, send every conversation's first turn alone; when all have ended, N
new clients run the benchmark on the conversations' later turns, in the order their first turns ended (the
benchmark's conversations come back from its warm-up in that order), those of one turn done. The warm-up's
requests (`warmup_ids`) are left out of a run's figures (`measured`), as the benchmark leaves them out; the
clients' limit counts each phase's requests apart, as each phase's clients are new. Without a warm-up step,
`client_warmup_percent` X (the benchmark's --warmup-percentages X%) leaves out instead the first X% of the
answered requests in the order they were sent (its samples sorted by start time, int(X% of them) dropped).

The simulator's closed loop, the live engine's and the live fleet's replays, and `planner bench` all draw
from a `TurnQueue`, so they send the same requests in the same order.
"""
from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, fields
from typing import Iterable

from .schema import TraceRequest
from .tokens import stream


CONVERSATION_SAMPLING = ("round_robin", "random")    # vLLM's multi-turn benchmark's ConversationSampling


@dataclass(frozen=True)
class ClientKnobs:
    """How a run's clients behave, as a Deployment and `planner bench`'s BenchConfig hold them, under the same
    names: a closed loop's (vLLM's multi-turn benchmark's settings; see the module), and an open loop's
    `turns_after_answers` (workloads/sessions.py)."""

    max_active_conversations: int | None = None   # K in all, K // N each; None: one each
    client_request_rate: float | None = None      # each client's own rate (`pause`); None: no pause
    client_early_stop: bool = False               # the first client to stop stops them all
    client_max_requests: int | None = None        # the most requests a client sends; None: no limit
    client_warmup_step: bool = False              # first turns first, unmeasured
    conversation_sampling: str = "round_robin"    # which active conversation a client turns to: or "random"
    client_warmup_percent: float = 0.0            # the first X% of the answered requests left out of the figures
    turns_after_answers: bool = False             # open loop: a conversation's later turn waits for its answer

    @classmethod
    def of(cls, holder) -> "ClientKnobs":
        """The knobs of a Deployment or a BenchConfig (any object with these fields)."""
        return cls(**{f.name: getattr(holder, f.name) for f in fields(cls)})


def check_clients(clients: int | None, knobs: ClientKnobs, conversations: int | None = None) -> None:
    """A ValueError, in the planner's words, for what vLLM's multi-turn benchmark refuses of `clients` (None:
    an open loop) with `knobs` over a trace of `conversations` (None: not checked), or for a client's knob
    without clients."""
    k = knobs.max_active_conversations
    if clients is None:
        knob = ("--max-active-conversations shares conversations among" if k is not None
                else "--client-request-rate paces" if knobs.client_request_rate is not None
                else "--client-early-stop stops" if knobs.client_early_stop
                else "--client-max-requests limits" if knobs.client_max_requests is not None
                else "--client-warmup-step warms up" if knobs.client_warmup_step
                else "--conversation-sampling random picks the conversations of"
                if knobs.conversation_sampling == "random"
                else "--client-warmup-percent leaves out the first requests of" if knobs.client_warmup_percent
                else None)
        if knob is not None:
            raise ValueError(f"{knob} a closed loop's clients: give their number (--concurrency N; bench: "
                             f"--max-concurrency N)")
    elif knobs.turns_after_answers:
        raise ValueError("--turns-after-answers times an open loop's conversations: a closed loop's clients "
                         "already send a conversation's next turn once its answer has ended (leave out "
                         "--concurrency; bench: --max-concurrency)")
    if knobs.client_request_rate is not None and not 0 < knobs.client_request_rate < math.inf:
        raise ValueError(f"--client-request-rate must be a positive, finite number of requests/s, "
                         f"got {knobs.client_request_rate}")
    if knobs.conversation_sampling not in CONVERSATION_SAMPLING:
        raise ValueError(f"--conversation-sampling must be one of {', '.join(CONVERSATION_SAMPLING)} (vLLM's "
                         f"multi-turn benchmark's), got {knobs.conversation_sampling!r}")
    if not 0 <= knobs.client_warmup_percent < 100:
        raise ValueError(f"--client-warmup-percent must be at least 0 and below 100, got "
                         f"{knobs.client_warmup_percent}")
    if knobs.client_warmup_percent and knobs.client_warmup_step:
        raise ValueError("--client-warmup-percent and --client-warmup-step: vLLM's multi-turn benchmark takes its "
                         "--warmup-percentages only without its --warmup-step; give one")
    if knobs.client_max_requests is not None and knobs.client_max_requests < 1:
        raise ValueError(f"--client-max-requests must be at least 1 request a client, got "
                         f"{knobs.client_max_requests}")
    if k is not None and k < clients:
        raise ValueError(f"--max-active-conversations {k} must be at least the "
                         f"{clients} clients (each keeps K // N conversations, as in vLLM's multi-turn benchmark)")
    if k is not None and conversations is not None and k > conversations:
        raise ValueError(f"--max-active-conversations {k} is more than the trace's "
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


class _Client:
    """One client of a TurnQueue: its active conversations (each its turns still to send), its count of
    requests sent, and under random sampling its own generator (None: round robin)."""

    def __init__(self, picker: random.Random | None = None) -> None:
        self.active: deque[deque[TraceRequest]] = deque()
        self.sent = 0
        self.picker = picker

    def pick(self) -> deque[TraceRequest]:
        """The active conversation whose turn goes next: round robin takes the one taken last or due (out of
        `active`, to go back behind the others); random sampling leaves it in its place."""
        return self.active.pop() if self.picker is None else self.picker.choice(self.active)

    def drop(self, turns: deque[TraceRequest]) -> None:
        """A conversation picked at random is done with (its turns ended, refused, or warmed)."""
        del self.active[next(i for i, active in enumerate(self.active) if active is turns)]


class TurnQueue:
    """The requests the clients have still to send (see the module)."""

    def __init__(self, requests: Iterable[TraceRequest], clients: int | None = None,
                 knobs: ClientKnobs = ClientKnobs(), seed: int = 0) -> None:
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
        check_clients(clients, knobs, conversations=len(self.starts))
        self.clients, self.knobs, self.seed = clients, knobs, seed
        self.max_requests = knobs.client_max_requests
        self.sent: dict[str, tuple[_Client, deque[TraceRequest]]] = {}   # a sent request's client, conversation
        self.stopped = False
        self.left = 0                  # turns of the conversations stopped clients left active
        self.warming = knobs.client_warmup_step
        self.warmup_ids: set[str] = set()          # the warm-up's requests
        self.sent_order: list[str] = []            # every request sent, in the order sent
        self.refused: set[str] = set()             # the requests the server refused
        self.warmed: list[deque[TraceRequest]] = []    # warmed conversations' later turns, as their first ended
        self.new_phase = False         # set when the warm-up has ended: new clients are to start
        self._phase()

    def _phase(self) -> None:
        """The current phase's clients: none stopped yet; one conversation each and no early stop in the warm-up."""
        self.clients_left = self.clients if self.clients is not None else math.inf    # (None: not counted)
        self.clients_begun = 0         # this phase's clients so far: the next one's number
        self.conversations_each = 1 if self.warming else \
            conversations_per_client(self.knobs.max_active_conversations, self.clients)
        self.early_stop = self.knobs.client_early_stop and not self.warming

    def __len__(self) -> int:
        """The requests the clients will still send."""
        return 0 if self.stopped else self.unsent - self.left

    @property
    def dropped(self) -> int:
        """The trace's requests the clients will never send (those stopped clients left, or all of them once
        every client has stopped)."""
        return self.unsent if self.stopped else self.left

    def first(self) -> TraceRequest | None:
        """A new client's first request (None when no conversation is left to begin)."""
        picker = None
        if self.knobs.conversation_sampling == "random":     # the benchmark's client_main seeds its own
            picker = random.Random(self.seed + self.clients_begun + 1)
        self.clients_begun += 1
        return self._turn(_Client(picker))

    def after(self, ended: TraceRequest, refused: bool = False) -> TraceRequest | None:
        """The next request of the client whose request `ended` (finished, or `refused`) has just ended. A
        refused turn ends its conversation, as the benchmark drops it: its later turns are never sent."""
        client, later = self.sent.pop(ended.request_id)
        if refused:
            self.refused.add(ended.request_id)
        goes_on = bool(later) and not refused and not self.warming     # the client's conversation still
        if client.picker is not None and not goes_on:
            client.drop(later)
        if later and refused:
            self.left += len(later)
        elif later and self.warming:
            self.warmed.append(later)           # its first turn done: the rest waits for the benchmark
        elif goes_on and client.picker is None:
            client.active.appendleft(later)     # behind the client's other conversations
        return self._turn(client)

    def take_new_phase(self) -> bool:
        """Whether the warm-up has just ended, so N new clients are to start now (asked once)."""
        began, self.new_phase = self.new_phase, False
        return began

    @property
    def unmeasured(self) -> set[str]:
        """The requests a run's figures leave out: the warm-up step's, or the first `client_warmup_percent` of
        the answered ones as sent (the benchmark's samples are its answered requests)."""
        if not self.knobs.client_warmup_percent:
            return self.warmup_ids
        answered = [request_id for request_id in self.sent_order if request_id not in self.refused]
        return set(answered[:int(self.knobs.client_warmup_percent / 100 * len(answered))])

    def measured(self, records: list) -> list:
        """The records (anything with a request_id) a run's figures count: the warm-up's left out."""
        left_out = self.unmeasured
        return [r for r in records if r.request_id not in left_out] if left_out else records

    def _turn(self, client: _Client) -> TraceRequest | None:
        """The client's next request, or None when it stops."""
        if self.stopped:
            return None
        if self.max_requests is not None and client.sent >= self.max_requests:
            return self._stop(client)
        while len(client.active) < self.conversations_each:
            if not self.starts:            # none left to take: the client stops
                return self._stop(client)
            first = self.starts.popleft()
            turns = self.rest.pop(first.conversation_id, None) if first.conversation_id is not None else None
            turns = turns if turns is not None else deque()
            turns.appendleft(first)
            client.active.append(turns)
        turns = client.pick()
        req = turns.popleft()
        self.sent[req.request_id] = (client, turns)
        self.sent_order.append(req.request_id)
        self.unsent -= 1
        client.sent += 1
        if self.warming:
            self.warmup_ids.add(req.request_id)
        return req

    def _stop(self, client: _Client) -> None:
        """The client stops, leaving its active conversations; with early stop, or as the last, all have (the
        last of the warm-up's begins the benchmark's phase)."""
        self.left += sum(map(len, client.active))
        client.active.clear()
        self._clients_stopped(1)
        return None

    def begin(self, clients: int) -> list[TraceRequest]:
        """The first requests of `clients` new clients, in order (`first`'s); those that find no conversation
        left to begin stop at once, all together: a billion clients over a trace of eight requests send eight,
        without a billion calls."""
        firsts = []
        for begun in range(clients):
            if self.stopped or not self.starts:     # this client and every one after it would stop at `first`
                self.clients_begun += clients - begun
                if not self.stopped:                # (with early stop, the first of them stops all the others)
                    self._clients_stopped(1 if self.early_stop else clients - begun)
                break
            req = self.first()
            if req is not None:
                firsts.append(req)
        return firsts

    def _clients_stopped(self, count: int) -> None:
        """`count` clients stopped: the warm-up's last begins the benchmark's phase; the last of all (or, with
        early stop, any) stops them all."""
        self.clients_left -= count
        if self.warming and self.clients_left == 0:
            self._after_warmup()
        else:
            self.stopped = self.early_stop or self.clients_left == 0

    def _after_warmup(self) -> None:
        """The benchmark's phase: the warmed conversations' later turns, in the order their first turns ended;
        the conversations the warm-up never began (its clients' limit) are never sent."""
        self.left += len(self.starts) + sum(map(len, self.rest.values()))
        self.starts, self.rest = deque(), {}
        for turns in self.warmed:
            first = turns.popleft()
            self.starts.append(first)
            self.rest[first.conversation_id] = turns
        self.warmed.clear()
        self.warming = False
        self._phase()
        self.new_phase = bool(self.starts)
        self.stopped = not self.starts
