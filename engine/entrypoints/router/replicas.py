"""What the live fleet's proxy knows of each replica, and the router that reads it.

- in flight: the proxy's own count of requests it sent to a replica whose
  responses have not ended (the vLLM Router's load count, llm-d's queue);
- KV-cache usage: the replica's `vllm:kv_cache_usage_perc` from its /metrics
  (what llm-d's kv-cache scorer reads);
- prefix cache: an index of the block keys each replica holds, kept from its
  KV events (`/kv_events`, BlockStored / BlockRemoved as vLLM publishes them;
  llm-d's precise prefix-cache scorer keeps the same index).

KV usage and KV events are read right before a pick that needs them (one
loopback request per replica, shared by picks made meanwhile), so a pick sees
each replica as it stood after its last finished step, as the simulated
router does (planner/sim/router.py); polling on a timer would route on state
up to a period old. A reading that has not come READ_DEADLINE after it began
(a frozen replica, or one whose event loop is busy) is not waited for: the
pick scores that replica by its last reading, and so do the picks after it
until the reading ends (or the health watcher marks the replica down and
drops it). The pick itself is engine/core/routing.py's, the same code
the simulator runs, over the replicas the proxy's health watcher holds up.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httpx

from engine.core.block_keys import ROOT_HASH
from engine.core.routing import BaseRouter, RouterPolicy, leading_held
from engine.entrypoints.router import prometheus

KV_USAGE = "vllm:kv_cache_usage_perc"
READ_DEADLINE = 2.0     # seconds a pick waits on a replica's reading (a loopback read takes milliseconds)
READ_TIMEOUT = 5.0      # seconds a reading itself may take (the health probe's)


@dataclass
class Replica:
    index: int
    url: str
    in_flight: int = 0
    routed: int = 0
    failed: int = 0                        # requests the replica could not be reached for, or that broke off
    retried: int = 0                       # of those, the ones sent on to another replica (nothing had been relayed)
    kv_usage: float = 0.0
    held: set[int] = field(default_factory=set)
    next_event: int = 0
    reading: asyncio.Task | None = None
    reading_since: float = 0.0             # when the reading under way began (time.monotonic)
    down: str | None = None                # why the last request to it failed, until one succeeds
    up: bool = True                        # the health watcher's verdict (proxy.py): False after missed probes
    misses: int = 0                        # health probes in a row it did not answer
    down_marks: int = 0                    # times the watcher marked it down
    # Set while it is down: what requests waiting on it await besides its answer (a new one when it is up).
    lost: asyncio.Event = field(default_factory=asyncio.Event)

    def name(self) -> str:
        return f"replica {self.index} ({self.url})"

    def mark_down(self) -> None:
        """No more picks, and the requests waiting on it stop waiting (a frozen replica keeps its port open,
        so nothing else would end their wait); a reading under way, which may never end, is dropped, and so
        is its prefix-cache index: its next reading starts over (a restarted replica numbers its events
        from 0 again)."""
        self.up = False
        self.down_marks += 1
        self.lost.set()
        if self.reading is not None:
            self.reading.cancel()
        self.held, self.next_event = set(), 0

    def mark_up(self) -> None:
        self.up = True
        self.lost = asyncio.Event()

    def apply_events(self, doc: dict) -> None:
        """A /kv_events answer: events after the last seen, or a whole snapshot."""
        if "snapshot" in doc:
            self.held = set(doc["snapshot"])
        for stored, h in doc.get("events", ()):
            if stored:
                self.held.add(h)
            else:
                self.held.discard(h)
        self.next_event = doc.get("next", self.next_event)


class LiveRouter(BaseRouter):
    """The shared pick rule over the proxy's readings of live replicas."""

    def __init__(self, policy: RouterPolicy, replicas: list[Replica], block_size: int,
                 headers: dict | None = None) -> None:
        super().__init__(policy, len(replicas), block_size)
        self.replicas = replicas
        self.headers = headers          # on reads of /kv_events: the replicas' API key, when they have one

    def replica_ids(self) -> list[int]:
        return [r.index for r in self.replicas]      # (a view over the replicas up keeps their identities)

    def in_flight(self, now: float) -> list[int]:
        return [r.in_flight for r in self.replicas]

    def kv_usage(self, now: float) -> list[float]:
        return [r.kv_usage for r in self.replicas]

    def cached_prefix(self, hashes: list[int], now: float) -> list[int]:
        return [leading_held(hashes, r.held) for r in self.replicas]

    def pick_among(self, up: list[Replica], token_ids: list[int], now: float, *, retry: bool = False,
                   root: int = ROOT_HASH, session: str | None = None) -> Replica:
        """The policy's pick among the replicas that are up: the others are not scored at all (a down
        replica's last readings, or its empty queue, would make it look the best). A retry (the request's
        replica failed before answering) leaves the turn where the request's first pick put it: the turn is
        a request's, so the failed replica's requests go to the next one, as when it is marked down."""
        turn = self.next
        if len(up) == len(self.replicas):
            chosen = self.replicas[self.pick(token_ids, now, root, session)]
        else:
            view = LiveRouter(self.policy, up, self.block_size)
            # The turn passes to the first replica up at or after the one whose turn it was.
            view.next = next((i for i, r in enumerate(up) if r.index >= self.next), 0)
            chosen = up[view.pick(token_ids, now, root, session)]
            self.next = (chosen.index + 1) % self.count
        if retry:
            self.next = turn
        return chosen

    async def refresh(self, client: httpx.AsyncClient, among: list[Replica] | None = None) -> None:
        """Read what the policy scores (KV usage, KV events) from every replica up (of `among`), now."""
        if not (self.policy.uses("least-kv") or self.policy.uses_prefix):
            return
        among = self.replicas if among is None else among
        await asyncio.gather(*(self._refresh_one(client, r) for r in among if r.up))

    async def _refresh_one(self, client: httpx.AsyncClient, replica: Replica) -> None:
        # Picks made while a reading is under way share it (one request per replica at a time).
        if replica.reading is None or replica.reading.done():
            replica.reading = asyncio.ensure_future(self._read(client, replica))
            replica.reading_since = time.monotonic()
        left = replica.reading_since + READ_DEADLINE - time.monotonic()
        # Not cancelled by a pick that is (shared), nor raising when mark_down drops a reading that hangs.
        if left > 0:
            await asyncio.wait((replica.reading,), timeout=left)

    async def _read(self, client: httpx.AsyncClient, replica: Replica) -> None:
        try:
            if self.policy.uses("least-kv"):
                page = prometheus.parse((await client.get(replica.url + "/metrics", timeout=READ_TIMEOUT)).text)
                usage = prometheus.gauge_value(page, KV_USAGE)
                replica.kv_usage = replica.kv_usage if usage is None else usage
            if self.policy.uses_prefix:
                answer = await client.get(replica.url + "/kv_events", params={"after": replica.next_event},
                                          headers=self.headers, timeout=READ_TIMEOUT)
                answer.raise_for_status()
                doc = answer.json()
                replica.apply_events(doc)
        except (httpx.HTTPError, ValueError) as exc:
            replica.down = f"{type(exc).__name__}: {exc}"     # its last reading stays; the request says more
