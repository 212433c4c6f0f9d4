"""A named catalog of typed entries: look up by name or alias, list in file order.

The GPU and model catalogs are both this: entries of one dataclass type,
found by normalized name, with the same one-line error naming what is known.
"""
from __future__ import annotations

from typing import Callable, Generic, Iterable, Iterator, TypeVar

from planner.errors import PlannerError

T = TypeVar("T")
LISTED_AT_MOST = 24     # an unknown name's error lists a catalog this small (the GPUs), and counts a bigger one


def normalize(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


class Catalog(Generic[T]):
    """Entries of type T in file order, indexed by each key `keys(entry)` returns (first entry wins)."""

    def __init__(self, kind: str, entries: Iterable[T], keys: Callable[[T], Iterable[str]],
                 name: Callable[[T], str] = lambda e: e.name) -> None:   # type: ignore[attr-defined]
        self.kind = kind
        self._entries = tuple(entries)
        self._name = name
        self._index: dict[str, T] = {}
        for entry in self._entries:
            for key in keys(entry):
                self._index.setdefault(normalize(key), entry)

    def __iter__(self) -> Iterator[T]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        return [self._name(e) for e in self._entries]

    def find(self, name: str) -> T | None:
        return self._index.get(normalize(str(name)))

    def get(self, name: str, hint: str = "") -> T:
        """The entry called `name`, or a one-line error naming the known entries (counting them where a list
        would bury the line: `hint` then says where they are shown)."""
        entry = self.find(name)
        if entry is None:
            known = f"{len(self)} known" if len(self) > LISTED_AT_MOST else f"known: {', '.join(self.names())}"
            raise PlannerError(f"unknown {self.kind} {name!r}; {known}{hint}")
        return entry
