"""Sweep marks: how far in event time every input partition has been read.

A pipeline sweeps hosts and services that went silent by event time. Kafka keeps order
only per partition, and a worker catching up (after a restart, a rebalance, or a topic
read ahead of another) reads partitions at different paces: a host on a partition read
an hour behind looks silent to a sweep judged on the newest event time anywhere. So each
pipeline sweeps against the *slowest* partition of its topic that is being read: one
read from within the last ``idle_s`` (wall seconds), or within ``wait_s`` with messages
still to read (its high watermark past the last offset read). A partition nothing arrives
on for longer and nothing waits on (its hosts stopped sending, or it has none) does not
hold the others back; one that waits its turn behind the others' backlog does, for
minutes (a transaction's commit marker also leaves the high watermark past the last
message: that partition is not waited for beyond ``wait_s``).

>>> clock = iter([0.0, 0.0, 0.0, 40.0, 40.0]).__next__
>>> marks = SweepMarks(idle_s=30.0, clock=clock)
>>> marks.read("gpu", 0, 1000.0); marks.read("gpu", 1, 400.0)
>>> marks.mark("gpu")                       # partition 1 is behind
400.0
>>> marks.read("gpu", 0, 1100.0)            # 40 s later: partition 1 has gone idle
>>> marks.mark("gpu")
1100.0

A partition read again from an older offset (a rebalance) is being read, and keeps its
mark:

>>> clock = iter([0.0, 0.0, 20.0, 40.0, 40.0]).__next__
>>> marks = SweepMarks(idle_s=30.0, clock=clock)
>>> marks.read("gpu", 0, 1000.0); marks.read("gpu", 1, 400.0)
>>> marks.read("gpu", 1, 100.0); marks.read("gpu", 0, 1100.0)
>>> marks.mark("gpu")
400.0

With the high watermarks, a partition read up to offset 9 of 500 is not idle:

>>> clock = iter([0.0, 0.0, 40.0, 40.0, 700.0, 700.0]).__next__
>>> marks = SweepMarks(idle_s=30.0, clock=clock, highwater=lambda topic, p: 500)
>>> marks.read("gpu", 0, 1000.0, offset=499); marks.read("gpu", 1, 400.0, offset=9)
>>> marks.read("gpu", 0, 1100.0, offset=499)
>>> marks.mark("gpu")
400.0
>>> marks.read("gpu", 0, 1200.0, offset=499)   # partition 1 not read for wait_s (600 s)
>>> marks.mark("gpu")
1200.0
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple


def _unknown(topic: str, partition: int) -> int | None:
    return None


class _Mark(NamedTuple):
    ts: float  # the newest event time read
    at: float  # the wall time of the last read
    offset: int | None  # the offset of the last read (None: not known)


@dataclass
class SweepMarks:
    """Per (topic, partition): the newest event time read, the wall time and offset of the
    last read. ``highwater``: a partition's high watermark as the consumer last fetched
    it (None: unknown; a broker's may lag a batch behind, which only makes a partition
    look idle sooner, as without it)."""

    idle_s: float = 30.0
    wait_s: float = 600.0
    clock: Callable[[], float] = time.monotonic
    highwater: Callable[[str, int], int | None] = _unknown
    _marks: dict[tuple[str, int], _Mark] = field(default_factory=dict)

    def read(self, topic: str, partition: int, ts: float, offset: int | None = None) -> None:
        """A message of event time ``ts`` (at ``offset``) was read from
        ``topic[partition]``: its mark is the newest event time read from it, and it is
        live from now, whatever ``ts`` is. A partition read again from its committed
        offset (a rebalance, even one that leaves it here) goes over messages older than
        its mark, for minutes under load: it is being read, and its hosts are no more
        silent than they were."""
        mark = self._marks.get((topic, partition))
        newest = ts if mark is None else max(ts, mark.ts)
        self._marks[(topic, partition)] = _Mark(newest, self.clock(), offset)

    def mark(self, topic: str, default: float | None = None) -> float | None:
        """The sweep mark of ``topic``: the slowest of its live partitions (``default``
        if none is live: nothing is read, keep the previous mark)."""
        now = self.clock()
        live = [
            m.ts for (t, p), m in self._marks.items() if t == topic and self._live(t, p, m, now)
        ]
        return min(live) if live else default

    def _live(self, topic: str, partition: int, mark: _Mark, now: float) -> bool:
        """Read lately, or messages wait on it past the last one read (a worker busy with
        the others' backlog reads it in turn, minutes apart under load)."""
        since = now - mark.at
        if since < self.idle_s:
            return True
        if since >= self.wait_s or mark.offset is None:
            return False
        high = self.highwater(topic, partition)
        return high is not None and mark.offset + 1 < high

    def forget(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Partitions this worker no longer reads (a rebalance gave them away)."""
        for tp in partitions:
            self._marks.pop(tp, None)
