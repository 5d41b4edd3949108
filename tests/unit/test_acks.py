"""HeldAcks: a message's ack waits for the snapshot of its host or service, and Faust sees
acks in offset order per partition (its commit can skip a lone unacked offset)."""

from __future__ import annotations

from typing import Any

from ragwatch.streams.worker.acks import HeldAcks


class Message:
    def __init__(self, offset: int) -> None:
        self.offset, self.value = offset, b"payload"


class Event:
    def __init__(self, offset: int) -> None:
        self.value, self.message = b"payload", Message(offset)


class Stream:
    def __init__(self) -> None:
        self.acked: list[int] = []

    async def ack(self, event: Any) -> None:
        self.acked.append(event.message.offset)


async def test_acks_reach_faust_in_offset_order_after_their_snapshots() -> None:
    s, held = Stream(), HeldAcks()
    hs = [held.add("p0", s, Event(offset)) for offset in range(5)]
    assert all(h.event.value is None and h.event.message.value is None for h in hs)
    for h, key in zip(hs, ["a", "b", "a", "b", "a"], strict=True):
        held.hold(("host", key), h)
    taken = held.take([("host", "b")])
    held.give_back(taken)  # the snapshot was not written
    assert await held.ack(held.take([("host", "b")])) == 0  # offset 0 (host a) is held
    assert s.acked == []
    assert await held.ack(held.take([("host", "a")])) == 5
    assert s.acked == [0, 1, 2, 3, 4] and len(held) == 0


async def test_dead_letters_partitions_rebalance_and_the_limit() -> None:
    s, held = Stream(), HeldAcks(limit=3)
    a0, b0, a1 = (held.add(tp, s, Event(o)) for tp, o in [("p0", 0), ("p1", 0), ("p0", 1)])
    assert await held.release([a1]) == 0  # a dead letter behind a held message waits
    held.hold(("host", "x"), a0)
    held.hold(("host", "y"), b0)
    assert await held.ack(held.take([("host", "x")])) == 2  # p0: 0 and 1, in order
    assert held.reset() == 1  # a rebalance: p1's message is read again
    assert await held.ack(held.take([("host", "y")])) == 0 and s.acked == [0, 1]
    for o in range(4):
        held.add("p2", s, Event(o))
    assert held.over()
    assert await held.release_all() == 4 and held.overflows == 1 and len(held) == 0
