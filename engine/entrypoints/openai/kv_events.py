"""The server's KV events: which prefix-cache blocks entered and left the cache, for a router.

vLLM publishes BlockStored / BlockRemoved events over ZMQ and llm-d's precise
prefix-cache scorer keeps an index of every replica's blocks from them. Here
the block pool logs the same events (engine/core/block_pool.py), the engine
loop moves them into this log after each step (on the event-loop thread, so
the step's worker thread never races a reader), and `GET /kv_events?after=N`
hands a router the events numbered after N. A router that fell behind the
kept window, or that talks to a restarted server, gets the whole cache as a
snapshot instead. Keys are engine/core/block_manager.py's chained hashes,
the same in every process.
"""
from __future__ import annotations

from collections import deque
from itertools import islice

KEPT_EVENTS = 100_000     # events kept for readers; one further behind gets a snapshot


class KvEventLog:
    def __init__(self, engine, kept: int = KEPT_EVENTS) -> None:
        allocator = engine.allocator
        self.enabled = bool(getattr(allocator, "enable_prefix_caching", False))
        self.block_size = allocator.block_size
        self.pool = allocator.gpu
        if self.enabled:
            self.pool.events = []
        self.events: deque = deque(maxlen=kept)
        self.next = 0                      # the number the next event gets
        self.held: set[int] = set()        # the cache as the events so far describe it

    def drain(self) -> None:
        """Take the events the last step (or request changes) made; call between steps only."""
        events = self.pool.events
        if not events:
            return
        for stored, h in events:
            if stored:
                self.held.add(h)
            else:
                self.held.discard(h)
            self.events.append((int(stored), h))
        self.next += len(events)
        events.clear()

    def since(self, after: int) -> dict:
        """The events numbered `after` and later, or a snapshot when those are no longer kept."""
        doc = {"enabled": self.enabled, "block_size": self.block_size, "next": self.next}
        first = self.next - len(self.events)
        if first <= after <= self.next:
            doc["events"] = [list(e) for e in islice(self.events, after - first, None)]
        else:
            doc["snapshot"] = list(self.held)
        return doc
