"""A run's step shapes, kept lazily: a decode plan's steps stand as the run that describes them until read.

Building a `StepShape` (a dataclass with a histogram tuple) costs about
what pricing a step costs, and a fleet takes millions of bulk decode steps
whose shapes nobody reads during the simulation (the metrics come from the
step records; steps.csv, capacity probes and validation read shapes after
it). So the engine logs a priced plan (planner/sim/decode_run.py) as one
entry, and the log builds those shapes the first time anything reads it; a
fleet's merged shapes are picked from its replicas' logs the same way. A
`ShapeLog` reads as a list of StepShape (length, index, iteration, equality
with a list or another log) and pickles as a plain list.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from planner.cost.shape import StepShape


class ShapeLog(Sequence):
    """Step shapes in step order; entries (run, steps) stand for a priced run's first `steps` shapes."""

    __slots__ = ("_builder", "_items", "_lazy", "_size")

    def __init__(self, shapes: Sequence[StepShape] = ()) -> None:
        self._items: list = list(shapes)
        self._size = len(self._items)
        self._lazy = False
        self._builder: Callable[[], list[StepShape]] | None = None

    @classmethod
    def later(cls, builder: Callable[[], list[StepShape]], size: int) -> ShapeLog:
        """`size` shapes that `builder()` makes when first read (a fleet's shapes in merged order)."""
        log = cls()
        log._builder, log._size, log._lazy = builder, size, True
        return log

    def append(self, shape: StepShape) -> None:
        self._items.append(shape)
        self._size += 1

    def extend(self, shapes: Sequence[StepShape]) -> None:
        self._items.extend(shapes)
        self._size += len(shapes)

    def add_run(self, run, steps: int) -> None:
        """A priced run's first `steps` steps (`run.shapes(steps)` builds them)."""
        self._items.append((run, steps))
        self._size += steps
        self._lazy = True

    def _list(self) -> list[StepShape]:
        if self._lazy:
            if self._builder is not None:
                self._items, self._builder = self._builder(), None
            else:
                shapes: list[StepShape] = []
                for item in self._items:
                    if type(item) is tuple:
                        shapes += item[0].shapes(item[1])
                    else:
                        shapes.append(item)
                self._items = shapes
            self._lazy = False
        return self._items

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, index):
        return self._list()[index]

    def __iter__(self):
        return iter(self._list())

    def __eq__(self, other) -> bool:
        if isinstance(other, ShapeLog):
            return len(other) == self._size and self._list() == other._list()
        if isinstance(other, list):
            return self._list() == other
        return NotImplemented

    __hash__ = None

    def __reduce__(self):
        return list, (self._list(),)

    def __repr__(self) -> str:
        return f"ShapeLog({self._list()!r})"
