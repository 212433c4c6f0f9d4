"""A run's step records and step shapes, kept lazily: a decode plan's steps stand as one entry until read.

Building a `StepShape` (a dataclass with a histogram tuple) costs about
what pricing a step costs, and a `StepRecord` a fifth of it; a fleet takes
millions of bulk decode steps whose records and shapes nobody reads during
the simulation (the metrics come from the plans' columns in bulk:
planner/sim/batch.py `plan_columns`; steps.csv, capacity probes and
validation read them after it). So the engine logs a priced plan as one
entry, and the log builds those items the first time anything reads it; a
fleet's merged logs are picked from its replicas' logs the same way. A log
reads as a list (length, index, iteration, equality with a list or another
log) and pickles as a plain list.
"""
from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterator, Sequence

from engine.core.metrics import StepRecord
from planner.cost.shape import StepShape


class LazyLog(Sequence):
    """Items (of the subclass's `item` type) in step order; any other entry stands for `_expand(entry)`."""

    __slots__ = ("_builder", "_items", "_lazy", "_size")
    item: type = object

    def __init__(self, items: Sequence = ()) -> None:
        self._items: list = list(items)
        self._size = len(self._items)
        self._lazy = False
        self._builder: Callable[[], list] | None = None

    @classmethod
    def later(cls, builder: Callable[[], list], size: int) -> LazyLog:
        """`size` items that `builder()` makes when first read (a fleet's, in merged order)."""
        log = cls()
        log._builder, log._size, log._lazy = builder, size, True
        return log

    def append(self, item) -> None:
        self._items.append(item)
        self._size += 1

    def extend(self, items: Sequence) -> None:
        self._items.extend(items)
        self._size += len(items)

    def add_bulk(self, entry, count: int) -> None:
        """An entry standing for the next `count` items."""
        self._items.append(entry)
        self._size += count
        self._lazy = True

    @abstractmethod
    def _expand(self, entry) -> list:
        """The items a bulk entry stands for."""

    def entries(self) -> list:
        """The log as kept: plain items and bulk entries, in order (not built)."""
        if self._builder is not None:
            return self._list()
        return self._items

    def _list(self) -> list:
        if self._lazy:
            if self._builder is not None:
                self._items, self._builder = self._builder(), None
            else:
                items: list = []
                plain = self.item
                for entry in self._items:
                    if type(entry) is plain:
                        items.append(entry)
                    else:
                        items += self._expand(entry)
                self._items = items
            self._lazy = False
        return self._items

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, index):
        return self._list()[index]

    def __iter__(self) -> Iterator:
        return iter(self._list())

    def __eq__(self, other) -> bool:
        if isinstance(other, LazyLog):
            return len(other) == self._size and self._list() == other._list()
        if isinstance(other, list):
            return self._list() == other
        return NotImplemented

    __hash__ = None

    def __reduce__(self):
        return list, (self._list(),)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._list()!r})"


class ShapeLog(LazyLog):
    """Step shapes; an entry (run, steps) stands for a priced run's first `steps` shapes
    (planner/sim/decode_run.py `DecodeRun.shapes`)."""

    __slots__ = ()
    item = StepShape

    def add_run(self, run, steps: int) -> None:
        self.add_bulk((run, steps), steps)

    def _expand(self, entry: tuple) -> list[StepShape]:
        run, steps = entry
        return run.shapes(steps)


class StepLog(LazyLog):
    """Step records; a plan's steps are one entry (planner/sim/batch.py `PlanTaken`, which builds them)."""

    __slots__ = ("block_size", "num_gpu_blocks")
    item = StepRecord

    def __init__(self, items: Sequence[StepRecord] = (), block_size: int = 0, num_gpu_blocks: int = 0) -> None:
        super().__init__(items)
        self.block_size, self.num_gpu_blocks = block_size, num_gpu_blocks

    def add_plan(self, taken) -> None:
        self.add_bulk(taken, len(taken.ends))

    def kept_records(self) -> list[StepRecord] | None:
        """The steps not taken in a plan, in order, while the plans' are not built (else None)."""
        if not self._lazy:
            return None
        return [entry for entry in self._items if type(entry) is StepRecord]

    def last_before(self, t: float) -> tuple[float, int] | None:
        """(end, KV blocks used) of the last step that ended before `t`; None if none did."""
        for entry in reversed(self.entries()):
            if type(entry) is StepRecord:
                if entry.end < t:
                    return entry.end, entry.kv_blocks_used
            else:
                found = entry.last_before(t)
                if found is not None:
                    return found
        return None

    def _expand(self, taken) -> list[StepRecord]:
        return taken.records(self.block_size, self.num_gpu_blocks)
