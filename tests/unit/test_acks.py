"""HeldAcks: a message's ack waits for the snapshot of its host or service."""

from __future__ import annotations

from typing import Any

from ragwatch.streams.acks import HeldAcks


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


async def test_acks_follow_snapshots_and_go_back_when_a_snapshot_fails() -> None:
    s, held = Stream(), HeldAcks(limit=3)
    for offset, key in enumerate([("host", "a"), ("host", "b"), ("host", "a")]):
        ev = Event(offset)
        held.hold(key, s, ev)
        assert ev.value is None and ev.message.value is None  # the bytes are released
    taken = held.take([("host", "a")])
    held.give_back(taken)  # the snapshot was not written
    assert len(held) == 3 and s.acked == []
    assert await held.ack(held.take([("host", "a")])) == 2
    assert s.acked == [0, 2] and len(held) == 1
    held.hold(("service", "x"), s, Event(3))
    assert held.drop([("service", "x")]) == 1  # its partition went elsewhere: never acked
    for offset in range(4, 7):
        held.hold(("host", "b"), s, Event(offset))
    assert held.over()
    assert await held.ack(held.take_all()) == 4 and held.overflows == 1
    assert sorted(s.acked) == [0, 1, 2, 4, 5, 6] and len(held) == 0
