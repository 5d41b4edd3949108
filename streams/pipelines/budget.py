"""One series budget per worker, shared by its pipelines.

Each pipeline caps its own series (``max_series``), but a worker holds several: without a
shared budget, ``RAGWATCH_MAX_SERIES=100000`` let one worker hold 100k GPU + 100k request
+ 100k engine series (4.4 GB). :class:`SeriesBudget` counts what the pipelines hold now
(their own counts, so eviction, hand-over and snapshots need no bookkeeping) and says how
many more may start.

>>> budget = SeriesBudget(3)
>>> gpus, services = {"a": 1}, {"x": 1, "y": 2}
>>> budget.watch(lambda: len(gpus))
>>> budget.watch(lambda: len(services))
>>> budget.room()
0
>>> del services["y"]
>>> budget.room()
1
"""

from __future__ import annotations

from collections.abc import Callable


class SeriesBudget:
    """How many more series the watched pipelines may start, ``limit`` in all."""

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"a series budget must be >= 0, got {limit}")
        self.limit = limit
        self._counts: list[Callable[[], int]] = []

    def watch(self, count: Callable[[], int]) -> None:
        """Count what ``count()`` says a pipeline holds against the budget."""
        self._counts.append(count)

    def room(self) -> int:
        return max(0, self.limit - sum(count() for count in self._counts))
