"""Sweep marks: how far in event time every input partition has been read.

A pipeline sweeps hosts and services that went silent by event time. Kafka keeps order
only per partition, and a worker catching up (after a restart, a rebalance, or a topic
read ahead of another) reads partitions at different paces: a host on a partition read
an hour behind looks silent to a sweep judged on the newest event time anywhere. So each
pipeline sweeps against the *slowest* partition of its topic that is being read: one
read from within the last ``idle_s`` (wall seconds). A partition nothing arrives on for
longer (its hosts stopped sending, or it has none) does not hold the others back.

>>> clock = iter([0.0, 0.0, 0.0, 40.0, 40.0]).__next__
>>> marks = SweepMarks(idle_s=30.0, clock=clock)
>>> marks.read("gpu", 0, 1000.0); marks.read("gpu", 1, 400.0)
>>> marks.mark("gpu")                       # partition 1 is behind
400.0
>>> marks.read("gpu", 0, 1100.0)            # 40 s later: partition 1 has gone idle
>>> marks.mark("gpu")
1100.0
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field


@dataclass
class SweepMarks:
    """Per (topic, partition): the newest event time read, and the wall time of that."""

    idle_s: float = 30.0
    clock: Callable[[], float] = time.monotonic
    _marks: dict[tuple[str, Hashable], tuple[float, float]] = field(default_factory=dict)

    def read(self, topic: str, partition: Hashable, ts: float) -> None:
        """A message of event time ``ts`` was read from ``topic[partition]``."""
        mark = self._marks.get((topic, partition))
        if mark is None or ts > mark[0]:
            self._marks[(topic, partition)] = (ts, self.clock())

    def mark(self, topic: str, default: float | None = None) -> float | None:
        """The sweep mark of ``topic``: the slowest of its live partitions (``default``
        if none is live: nothing is read, keep the previous mark)."""
        now = self.clock()
        live = [
            ts for (t, _), (ts, at) in self._marks.items() if t == topic and now - at < self.idle_s
        ]
        return min(live) if live else default

    def forget(self, partitions: Iterable[tuple[str, Hashable]]) -> None:
        """Partitions this worker no longer reads (a rebalance gave them away)."""
        for tp in partitions:
            self._marks.pop(tp, None)
