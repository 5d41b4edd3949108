"""Offsets committed only behind snapshots: a message is acked (and its offset becomes
committable) once the snapshot of its host or service that includes it is written.

Faust acks a message when its agent moves on, and commits acked offsets every few seconds;
snapshots are written every ``RAGWATCH_SNAPSHOT_INTERVAL``. Committed offsets could then run
ahead of the snapshots, and a worker killed in between restarted from a snapshot older than
its committed offsets: the messages in the gap were never seen by the detectors again (at a
fast replay, minutes of event time; a rolling throughput window with such a hole reads as a
drop and pages). Holding the acks closes the gap: after a crash or a rebalance, whoever
takes the partition restores the snapshot and reads again everything after it (what the
snapshot already holds is dropped by the pipelines as not newer than what they saw).

The messages' bytes are released once processed; only the ack handles are held, at most
``limit`` of them (beyond, everything held is acked with a warning: offsets then run ahead
of snapshots, as they would without this module, instead of memory growing while Redis is
away).

>>> class Msg:
...     value = b"x"
>>> class Ev:
...     def __init__(self): self.value, self.message = b"x", Msg()
>>> acked = []
>>> class Stream:
...     async def ack(self, event): acked.append(event)
>>> held = HeldAcks()
>>> s = Stream()
>>> held.hold(("host", "h1"), s, Ev()); held.hold(("host", "h2"), s, Ev())
>>> import asyncio
>>> taken = held.take([("host", "h1")])
>>> asyncio.run(held.ack(taken)), len(acked), len(held)
(1, 1, 1)
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

log = logging.getLogger("ragwatch.worker")

Key = tuple[str, str]  # ("host" | "service", name)
Held = list[tuple[Any, Any]]  # (stream, event) pairs


class HeldAcks:
    """Ack handles of processed messages, per host or service, until its snapshot."""

    def __init__(self, limit: int = 200_000) -> None:
        self.limit = limit
        self._held: dict[Key, Held] = {}
        self._n = 0
        self.overflows = 0  # times the limit made everything be acked early

    def __len__(self) -> int:
        return self._n

    def hold(self, key: Key, stream: Any, event: Any) -> None:
        """Keep the ack of a processed message until ``key``'s snapshot is written."""
        event.value = None  # the bytes are not needed any more; the offset is
        event.message.value = None
        self._held.setdefault(key, []).append((stream, event))
        self._n += 1

    def over(self) -> bool:
        return self._n > self.limit

    def take(self, keys: Iterable[Key]) -> dict[Key, Held]:
        """The held acks of ``keys``, taken before their snapshots are."""
        out = {k: self._held.pop(k) for k in keys if k in self._held}
        self._n -= sum(len(v) for v in out.values())
        return out

    def give_back(self, taken: dict[Key, Held]) -> None:
        """Hold again what :meth:`take` returned (the snapshots were not written)."""
        for k, items in taken.items():
            self._held[k] = items + self._held.get(k, [])
            self._n += len(items)

    def take_all(self) -> dict[Key, Held]:
        self.overflows += 1
        out, self._held, self._n = self._held, {}, 0
        return out

    def drop(self, keys: Iterable[Key]) -> int:
        """Forget the acks of ``keys`` (their partition went to another worker, which reads
        those messages again)."""
        n = 0
        for k in keys:
            n += len(self._held.pop(k, ()))
        self._n -= n
        return n

    async def ack(self, taken: dict[Key, Held]) -> int:
        n = 0
        for items in taken.values():
            for stream, event in items:
                await stream.ack(event)
            n += len(items)
        return n
