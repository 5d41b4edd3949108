"""Where agents put encoded envelopes: the :class:`Sink` protocol and the simple sinks.

:class:`~ragwatch.agents.publisher.KafkaPublisher` is the sink that publishes;
:class:`StreamSink` writes JSON lines (``agent --json``), :class:`ListSink` keeps a list
(tests, ``--once``).

>>> sink = ListSink()
>>> sink.write("ragwatch.gpu", "h1", b"{}")
>>> sink.records
[('ragwatch.gpu', 'h1', b'{}')]
"""

from __future__ import annotations

from typing import Protocol, TextIO


class Sink(Protocol):
    """Where agents put encoded envelopes."""

    def write(self, topic: str, key: str, value: bytes) -> None: ...

    def flush(self, timeout: float = 30.0) -> int: ...

    def close(self, timeout: float = 30.0) -> None: ...


class StreamSink:
    """A sink that writes each envelope as one JSON line to a text stream (``--json``)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.written = 0

    def write(self, topic: str, key: str, value: bytes) -> None:
        self.out.write(value.decode() + "\n")
        self.written += 1

    def flush(self, timeout: float = 30.0) -> int:
        self.out.flush()
        return 0

    def close(self, timeout: float = 30.0) -> None:
        self.out.flush()


class ListSink:
    """A sink that keeps everything in a list (tests, ``--once``)."""

    def __init__(self) -> None:
        self.records: list[tuple[str, str, bytes]] = []

    def write(self, topic: str, key: str, value: bytes) -> None:
        self.records.append((topic, key, value))

    def flush(self, timeout: float = 30.0) -> int:
        return 0

    def close(self, timeout: float = 30.0) -> None:
        return None
