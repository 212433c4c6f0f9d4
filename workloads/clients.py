"""What a closed loop's clients send next: the trace's requests, conversation by conversation.

A client of a multi-turn conversation sends its next turn only when the answer to the one before has come
(the turn's prompt holds that answer), as vLLM's multi-turn benchmark does
(benchmarks/multi_turn/benchmark_serving_multi_turn.py: each client keeps its active conversation, sends
its turns one after another, and takes the next conversation when its own has none left). A request of no
conversation is a conversation of one turn, so a trace without conversations is sent in its own order, as
`vllm bench serve --max-concurrency` sends it.

The simulator's closed loop, the live engine's and the live fleet's replays, and `planner bench` all draw
from a `TurnQueue`, so they send the same requests in the same order.
"""
from __future__ import annotations

from collections import deque
from typing import Iterable

from .schema import TraceRequest


class TurnQueue:
    """The requests the clients have still to send (see the module)."""

    def __init__(self, requests: Iterable[TraceRequest]) -> None:
        self.starts: deque[TraceRequest] = deque()      # each conversation's first turn (a lone request), in order
        self.rest: dict[str, deque[TraceRequest]] = {}  # a conversation's later turns, in order
        for req in requests:
            later = self.rest.get(req.conversation_id) if req.conversation_id is not None else None
            if later is not None:
                later.append(req)
                continue
            self.starts.append(req)
            if req.conversation_id is not None:
                self.rest[req.conversation_id] = deque()
        self.unsent = len(self.starts) + sum(map(len, self.rest.values()))

    def __len__(self) -> int:
        return self.unsent

    def first(self) -> TraceRequest | None:
        """A free client's next request: the next conversation's first turn (None when none is left)."""
        if not self.starts:
            return None
        self.unsent -= 1
        return self.starts.popleft()

    def after(self, ended: TraceRequest) -> TraceRequest | None:
        """The next request of the client whose request `ended` (finished or refused) has just ended: its
        conversation's next turn, else the next conversation's first."""
        later = self.rest.get(ended.conversation_id) if ended.conversation_id is not None else None
        if not later:
            return self.first()
        self.unsent -= 1
        return later.popleft()
