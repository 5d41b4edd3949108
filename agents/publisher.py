"""Publishing envelopes to Kafka: one small sink interface and its confluent-kafka version.

The Kafka sink follows Quix's producer habits: the ``Producer`` is built lazily from a
copy of the config, ``acks=all`` with idempotence on, errors are logged through
``error_cb``, a full local queue (``BufferError``) is retried after ``poll()``, delivery
failures are counted and logged, and ``close()`` flushes.

>>> sink = ListSink()
>>> sink.write("ragwatch.gpu", "h1", b"{}")
>>> sink.records
[('ragwatch.gpu', 'h1', b'{}')]
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ragwatch.errors import SinkError

log = logging.getLogger(__name__)

PRODUCER_DEFAULTS: dict[str, Any] = {
    "acks": "all",
    "enable.idempotence": True,
    "linger.ms": 20,
    "compression.type": "lz4",
    "message.timeout.ms": 300_000,
}


class Sink(Protocol):
    """Where agents put encoded envelopes."""

    def write(self, topic: str, key: str, value: bytes) -> None: ...

    def flush(self, timeout: float = 30.0) -> int: ...

    def close(self, timeout: float = 30.0) -> None: ...


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


@dataclass
class PublishStats:
    """Counters of one publisher; read them any time."""

    produced: int = 0
    delivered: int = 0
    failed: int = 0
    buffer_full_retries: int = 0


class KafkaPublisher:
    """A :class:`Sink` that produces to Kafka with confluent-kafka."""

    def __init__(
        self,
        kafka_config: dict[str, Any],
        *,
        producer_factory: Callable[[dict[str, Any]], Any] | None = None,
        buffer_retry_s: float = 30.0,
    ) -> None:
        self._config = {**PRODUCER_DEFAULTS, **kafka_config}
        self._factory = producer_factory
        self._producer: Any = None
        self._buffer_retry_s = buffer_retry_s
        self._lock = threading.Lock()
        self.stats = PublishStats()

    @property
    def producer(self) -> Any:
        if self._producer is None:
            conf = dict(self._config)
            conf["error_cb"] = self._on_error
            if self._factory is None:
                from confluent_kafka import Producer

                self._producer = Producer(conf)
            else:
                self._producer = self._factory(conf)
        return self._producer

    def write(self, topic: str, key: str, value: bytes) -> None:
        waited = 0.0
        while True:
            try:
                self.producer.produce(topic, value=value, key=key, on_delivery=self._on_delivery)
                break
            except BufferError:
                # librdkafka's local queue is full: serve callbacks, then try again.
                self.stats.buffer_full_retries += 1
                self.producer.poll(0.1)
                waited += 0.1
                if waited >= self._buffer_retry_s:
                    raise SinkError(
                        f"producer queue full for {waited:.0f}s (topic={topic}): broker down?"
                    ) from None
        self.stats.produced += 1
        self.producer.poll(0)

    def flush(self, timeout: float = 30.0) -> int:
        """Wait for outstanding deliveries; returns how many are still undelivered."""
        if self._producer is None:
            return 0
        remaining: int = self._producer.flush(timeout)
        return remaining

    def close(self, timeout: float = 30.0) -> None:
        remaining = self.flush(timeout)
        if remaining:
            log.error(
                "publisher closed with %d undelivered message(s) after %.0fs", remaining, timeout
            )
        s = self.stats
        log.info(
            "publisher closed: produced=%d delivered=%d failed=%d",
            s.produced,
            s.delivered,
            s.failed,
        )

    def _on_delivery(self, err: Any, msg: Any) -> None:
        with self._lock:
            if err is None:
                self.stats.delivered += 1
                return
            self.stats.failed += 1
            failed = self.stats.failed
        if failed <= 10 or failed % 1000 == 0:
            log.error(
                "delivery failed topic=%s key=%r: %s (failed so far: %d)",
                msg.topic(),
                msg.key(),
                err,
                failed,
            )

    def _on_error(self, err: Any) -> None:
        log.warning("kafka client error: %s", err)
