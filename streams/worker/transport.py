"""Faust's aiokafka transport with a configurable fetch wait.

faust-streaming creates its aiokafka consumer with ``fetch_max_wait_ms=1500`` and no
setting to change it. Apache Kafka answers a fetch as soon as ``fetch_min_bytes`` (1) is
there, so the wait only matters on an idle topic; but a broker that holds every fetch for
the full wait (the embedded Tansu does: a produce -> consume round trip of ~300 ms median,
up to 1.5 s) puts that wait into every alert's latency. :class:`RagwatchApp` builds its
transport from these subclasses, which set the wait to ``RAGWATCH_KAFKA_FETCH_MAX_WAIT_MS``
before the consumer starts.
"""

from __future__ import annotations

import logging
from typing import Any

import faust
from faust.transport.drivers import aiokafka as faust_aiokafka

log = logging.getLogger(__name__)


class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        wait_ms = getattr(self.app, "fetch_max_wait_ms", None)
        if wait_ms is not None:
            # read by AIOKafkaConsumer.start() when it builds its Fetcher (aiokafka 0.14)
            if not hasattr(consumer, "_fetch_max_wait_ms"):
                log.warning(
                    "this aiokafka has no _fetch_max_wait_ms: RAGWATCH_KAFKA_FETCH_MAX_WAIT_MS "
                    "is not applied (fetches wait up to Faust's 1500 ms)"
                )
            consumer._fetch_max_wait_ms = int(wait_ms)
        return consumer


class _Consumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class _Transport(faust_aiokafka.Transport):
    Consumer = _Consumer


class RagwatchApp(faust.App):
    """A faust.App whose Kafka consumer waits at most ``fetch_max_wait_ms`` per fetch."""

    def __init__(self, *args: Any, fetch_max_wait_ms: int | None = None, **kwargs: Any) -> None:
        self.fetch_max_wait_ms = fetch_max_wait_ms
        super().__init__(*args, **kwargs)

    def _new_transport(self) -> Any:
        return _Transport(self.conf.broker_consumer, self)
