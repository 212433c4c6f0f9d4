"""vLLM v1's waiting queue under ``--scheduling-policy priority``, with the deque methods the schedulers use.

vLLM keeps priority-scheduled waiting requests in a heap ordered by ``Request.__lt__``
(vllm/v1/core/sched/request_queue.py, ``PriorityRequestQueue``): the lower priority value
first, then the earlier arrival (then the request id, which its clock-stamped arrivals never
need; here simultaneous arrivals go in the order added: ``SequenceGroup.priority_key``). A
request "prepended" (preempted back to the queue) takes its place by that order too: there
is no front to put it at.
"""
from __future__ import annotations

import heapq
from collections.abc import Iterator

from engine.core.sequence import SequenceGroup


class PriorityQueue:
    """A heap of waiting requests by ``SequenceGroup.priority_key`` that reads as the FCFS deque does:
    ``[0]`` is the next request, ``popleft`` takes it, ``append``/``appendleft`` both add in order."""

    def __init__(self) -> None:
        self._heap: list[tuple[tuple, SequenceGroup]] = []

    def append(self, group: SequenceGroup) -> None:
        heapq.heappush(self._heap, (group.priority_key, group))

    appendleft = append              # a preempted request goes back by its order, as vLLM's prepend_request

    def extendleft(self, groups) -> None:
        for group in groups:
            self.append(group)

    def popleft(self) -> SequenceGroup:
        return heapq.heappop(self._heap)[1]

    def __getitem__(self, index: int) -> SequenceGroup:
        if index != 0:
            raise IndexError("a priority queue reads only its head")
        return self._heap[0][1]

    def remove(self, group: SequenceGroup) -> None:
        self._heap = [entry for entry in self._heap if entry[1] is not group]
        heapq.heapify(self._heap)

    def __contains__(self, group: object) -> bool:
        return any(entry[1] is group for entry in self._heap)

    def __iter__(self) -> Iterator[SequenceGroup]:
        """In serving order."""
        return (group for _, group in sorted(self._heap, key=lambda entry: entry[0]))

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)
