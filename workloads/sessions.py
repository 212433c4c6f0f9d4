"""An open loop whose users wait for their answers (a deployment's `turns_after_answers`).

An open loop sends every request at its trace time, a conversation's later turns too: their times are
estimates (the chatbot workload's: the answer at an assumed speed, then the user's think time), so under load
a turn can be sent before the answer its prompt continues has ended. A user cannot do that. With
`turns_after_answers` a run sends each conversation's first turn, and every request of no conversation, at its
trace time, and each later turn once the turn before it has ended:

- its `think_time` after that end when the trace gives one (the chatbot and conversation workloads draw it:
  the user reading the answer and typing the next message; aiperf's multi-turn trace formats carry one per
  turn as `delay`, in ms), its trace time then only the estimate an open loop sends it at;
- otherwise at its trace time, or at that end if the answer comes later: never before the answer.

A refused turn (rejected: too long for the model, or no room for it) ends its conversation, as vLLM's
multi-turn benchmark drops a conversation whose request failed: its user got no answer to go on from, so its
later turns are never sent (`dropped`). A trace without conversations is sent exactly as the open loop sends it.

The simulator (planner/sim/clients.py `Sessions`), the live engine's and the live fleet's replays and
`planner bench` all draw from `TurnsAfterAnswers`, so they send the same turns by the same rule.
"""
from __future__ import annotations

from collections import deque
from typing import Iterable

from .schema import TraceRequest


class TurnsAfterAnswers:
    """The requests still to send: the first turns (and lone requests) at their trace times, in trace order,
    and each later turn once its conversation's turn before it has ended (`after`, `due`)."""

    def __init__(self, requests: Iterable[TraceRequest]) -> None:
        self.starts: deque[TraceRequest] = deque()    # sent at their trace times, in trace order
        self.following: dict[str, TraceRequest] = {}  # a turn's request id -> its conversation's next turn
        last: dict[str, TraceRequest] = {}            # a conversation's last turn so far
        for req in requests:
            before = last.get(req.conversation_id) if req.conversation_id is not None else None
            if before is None:
                self.starts.append(req)
            else:
                self.following[before.request_id] = req
            if req.conversation_id is not None:
                last[req.conversation_id] = req
        self.dropped = 0          # the turns never to be sent (those after a refused turn)

    unmeasured: frozenset[str] = frozenset()      # (TurnQueue's: an open loop has no warm-up)

    def __len__(self) -> int:
        """The requests still to send: the first turns not yet sent, and the later turns not yet released."""
        return len(self.starts) + len(self.following)

    def after(self, ended: TraceRequest, refused: bool = False) -> TraceRequest | None:
        """The turn that follows `ended` (which has just ended, or was `refused`), to send at `due`; None when
        its conversation has no more, or `ended` was refused: then its later turns are never sent."""
        turn = self.following.pop(ended.request_id, None)
        if not refused:
            return turn
        while turn is not None:
            self.dropped += 1
            turn = self.following.pop(turn.request_id, None)
        return None

    @staticmethod
    def due(turn: TraceRequest, ended_at: float) -> float:
        """When `turn` is sent, its previous turn having ended at `ended_at` (see the module)."""
        if turn.think_time is not None:
            return ended_at + turn.think_time
        return max(turn.arrival_time, ended_at)
