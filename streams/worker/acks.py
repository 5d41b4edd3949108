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

Snapshots are per host or service, so messages are *released* out of offset order; Faust
must still see its acks in offset order per partition (its commit skips a single unacked
offset just above the committed one, and before a partition's first commit any gap). So
every message read gets a place in its partition's queue, and acks go to Faust only from
the head of that queue while the head is released. A rebalance drops every queue: Faust
seeks every partition it keeps back to its committed offset and delivers those messages
again.

The messages' bytes are released once read; only the ack handles are held, at most
``limit`` of them (beyond, everything is acked with a warning: offsets then run ahead of
snapshots, as they would without this module, instead of memory growing while Redis is
away).

>>> import asyncio
>>> class Msg:
...     value = b"x"
>>> class Ev:
...     def __init__(self, offset): self.value, self.message, self.offset = b"x", Msg(), offset
>>> acked = []
>>> class Stream:
...     async def ack(self, event): acked.append(event.offset)
>>> held, s = HeldAcks(), Stream()
>>> a, b = held.add("tp0", s, Ev(0)), held.add("tp0", s, Ev(1))
>>> held.hold(("host", "h1"), a); held.hold(("host", "h2"), b)
>>> asyncio.run(held.ack(held.take([("host", "h2")]))), acked   # offset 0 still held
(0, [])
>>> asyncio.run(held.ack(held.take([("host", "h1")]))), acked   # now both, in order
(2, [0, 1])
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

Key = tuple[str, str]  # ("host" | "service", name)


class Held:
    """One message read: its ack handle, and whether its snapshot was written."""

    __slots__ = ("event", "queue", "released", "stream", "tp")

    def __init__(self, tp: Any, queue: deque[Held], stream: Any, event: Any) -> None:
        self.tp, self.queue, self.stream, self.event = tp, queue, stream, event
        self.released = False


class HeldAcks:
    """Ack handles of the messages read, per partition in offset order and per host or
    service, until the snapshot that holds them is written."""

    def __init__(self, limit: int = 200_000) -> None:
        self.limit = limit
        self._queues: dict[Any, deque[Held]] = {}
        self._by_key: dict[Key, list[Held]] = {}
        self._n = 0  # in the queues, released or not
        self.overflows = 0  # times the limit made everything be acked early

    def __len__(self) -> int:
        return self._n

    def over(self) -> bool:
        return self._n > self.limit

    def add(self, tp: Any, stream: Any, event: Any) -> Held:
        """A message read from ``tp`` (in offset order): its place in the queue."""
        event.value = None  # the bytes are not needed any more; the offset is
        event.message.value = None
        q = self._queues.get(tp)
        if q is None:
            q = self._queues[tp] = deque()
        h = Held(tp, q, stream, event)
        q.append(h)
        self._n += 1
        return h

    def hold(self, key: Key, h: Held) -> None:
        """``h`` is processed: it may be acked once ``key``'s snapshot is written."""
        self._by_key.setdefault(key, []).append(h)

    def take(self, keys: Iterable[Key]) -> dict[Key, list[Held]]:
        """The messages of ``keys``, taken before their snapshots are."""
        return {k: self._by_key.pop(k) for k in keys if k in self._by_key}

    def give_back(self, taken: dict[Key, list[Held]]) -> None:
        """Hold again what :meth:`take` returned (the snapshots were not written)."""
        for k, items in taken.items():
            self._by_key[k] = items + self._by_key.get(k, [])

    async def ack(self, taken: dict[Key, list[Held]]) -> int:
        """The snapshots of ``taken`` are written: release its messages; returns how many
        acks went to Faust (every released message at the head of its partition)."""
        return await self.release(h for items in taken.values() for h in items)

    async def release(self, items: Iterable[Held]) -> int:
        """Release ``items`` (snapshotted, or dead-lettered) and ack what heads a queue."""
        queues = []
        for h in items:
            h.released = True
            if self._queues.get(h.tp) is h.queue:  # not from before a rebalance
                queues.append(h.queue)
        n = 0
        for q in {id(q): q for q in queues}.values():
            while q and q[0].released:
                head = q.popleft()
                self._n -= 1
                await head.stream.ack(head.event)
                n += 1
        return n

    async def release_all(self) -> int:
        """Ack everything read (the limit is reached: snapshots cannot keep up)."""
        self.overflows += 1
        self._by_key.clear()
        return await self.release(h for q in list(self._queues.values()) for h in q)

    def reset(self) -> int:
        """A rebalance: forget every queue (Faust reads the messages again from the
        committed offsets); returns how many were dropped."""
        n = self._n
        self._queues.clear()
        self._by_key.clear()
        self._n = 0
        return n
