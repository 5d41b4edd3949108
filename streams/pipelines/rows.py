"""Series keys to bank rows (issue 17): a key -> row map with a free list, and the
event time each row was last seen, in an array, for sweeping stale series at once.

The detector banks (``detectors/leak/bank.py``) hold a series per row; this index says
which. A removed key's row goes on the free list and is handed to the next new key (the
caller resets the banks' row), so the arrays grow only with the number of series alive
at once, not with every series ever seen; per-host sets give a host's rows for its
snapshot, its sweep and a rebalance.

>>> index = RowIndex()
>>> index.add(("h1", 0, "", -1), at=100.0), index.add(("h1", 0, "", 4011), at=100.0)
(0, 1)
>>> index.remove(("h1", 0, "", -1)); index.add(("h2", 3, "", -1), at=160.0)  # reused
0
0
>>> index.stale(now=400.0, older_than_s=250.0).tolist()
[1]
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

import numpy as np
import numpy.typing as npt

K = TypeVar("K", bound=tuple[Hashable, ...])


class RowIndex(Generic[K]):
    """Keys (tuples whose first item is the host or service) to rows, rows to keys."""

    def __init__(self, capacity: int = 1024) -> None:
        self._rows: dict[K, int] = {}
        self._keys: list[K | None] = []
        self._free: list[int] = []
        self._by_owner: dict[Hashable, set[int]] = {}
        # +inf where a row is free: never older than anything, so never stale
        self.last_seen: npt.NDArray[np.float64] = np.full(max(1, capacity), np.inf)

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, key: object) -> bool:
        return key in self._rows

    @property
    def size(self) -> int:
        """Rows in use or free: what the banks must hold (``reserve`` them this many)."""
        return len(self._keys)

    def __iter__(self) -> Iterator[K]:
        """The keys with a row (a copy: safe to remove while iterating)."""
        return iter(list(self._rows))

    def get(self, key: K) -> int | None:
        return self._rows.get(key)

    def key(self, row: int) -> K:
        k = self._keys[row]
        if k is None:
            raise KeyError(f"row {row} is free")
        return k

    def add(self, key: K, *, at: float) -> int:
        """The row of a new ``key`` (a free one first), seen at event time ``at``."""
        if key in self._rows:
            raise KeyError(f"{key!r} has row {self._rows[key]} already")
        if self._free:
            row = self._free.pop()
            self._keys[row] = key
        else:
            row = len(self._keys)
            self._keys.append(key)
            if row >= len(self.last_seen):
                grown = np.full(2 * len(self.last_seen), np.inf)
                grown[: len(self.last_seen)] = self.last_seen
                self.last_seen = grown
        self._rows[key] = row
        self._by_owner.setdefault(key[0], set()).add(row)
        self.last_seen[row] = at
        return row

    def remove(self, key: K) -> int:
        """Free ``key``'s row (returned: the caller resets the banks there)."""
        row = self._rows.pop(key)
        self._keys[row] = None
        self._free.append(row)
        self.last_seen[row] = np.inf
        owned = self._by_owner[key[0]]
        owned.discard(row)
        if not owned:
            del self._by_owner[key[0]]
        return row

    def seen(self, rows: npt.ArrayLike, at: npt.ArrayLike) -> None:
        """Rows seen at event times ``at`` (the newest time of each row is kept)."""
        r = np.asarray(rows, dtype=np.intp)
        np.maximum.at(self.last_seen, r, np.asarray(at, dtype=np.float64))

    def owned(self, owner: Hashable) -> set[int]:
        """The rows of one host or service (a copy)."""
        return set(self._by_owner.get(owner, ()))

    def count(self, owner: Hashable) -> int:
        """How many rows ``owner`` has."""
        owned = self._by_owner.get(owner)
        return len(owned) if owned is not None else 0

    def owners(self) -> Iterator[Hashable]:
        return iter(list(self._by_owner))

    def stale(self, *, now: float, older_than_s: float) -> npt.NDArray[np.intp]:
        """Rows in use last seen more than ``older_than_s`` before ``now``."""
        return np.flatnonzero(self.last_seen[: len(self._keys)] < now - older_than_s)
