"""What the worker loop reads of a Faust event without Faust: a topic partition, a message
(its topic, partition, offset, key and value) and the event that carries it. Shared by the
tests that drive :class:`~ragwatch.streams.worker.loop.WorkerLoop` from memory."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple


class TP(NamedTuple):
    topic: str
    partition: int


@dataclass
class Message:
    topic: str
    partition: int
    offset: int
    key: bytes
    value: bytes | None

    @property
    def tp(self) -> TP:
        return TP(self.topic, self.partition)


@dataclass
class Event:
    message: Message
    value: Any = None
