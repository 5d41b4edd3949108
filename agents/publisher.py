"""Publishing envelopes to Kafka without losing what was promised, and without blocking.

One publisher serves every source. ``write()`` only appends to a bounded in-memory queue
and returns: sampling never waits for the network. A sender thread hands records to a
confluent-kafka producer (``acks=all``, idempotence on, key = host, so per-host order is
kept), at most ``max_in_flight`` at a time, and keeps every record until its delivery
report says it is stored. While the broker is unreachable the queue fills; what does not
fit goes to the optional on-disk :class:`~ragwatch.agents.spool.Spool` (oldest first) or,
without one, the oldest records are dropped and counted. Order: records awaiting a retry,
then the spool, then the memory queue, so each host's envelopes leave in the order they
were written.

If the producer stops making progress although the broker answers (a broker that lost
its producer state keeps refusing the producer id) or hits a fatal error, the publisher
purges it, builds a new one and re-sends the undelivered records in order. On
``close()`` (SIGTERM) it sends what it can within the timeout and writes the rest to the
spool for the next start.

Counters (:class:`PublishStats`): produced, delivered, failed, dropped, spooled,
recoveries; ``queued`` is what is waiting right now. A log line says when the broker
goes away and when it comes back.

>>> sink = ListSink()
>>> sink.write("ragwatch.gpu", "h1", b"{}")
>>> sink.records
[('ragwatch.gpu', 'h1', b'{}')]
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TextIO

from ragwatch.agents.spool import Spool

log = logging.getLogger(__name__)

PRODUCER_DEFAULTS: dict[str, Any] = {
    "acks": "all",
    "enable.idempotence": True,
    "linger.ms": 20,
    "compression.type": "lz4",
    "message.timeout.ms": 0,  # never expire: the publisher decides what is lost, and counts it
    "reconnect.backoff.max.ms": 2000,
    "log_level": 2,  # librdkafka logs only critical; errors reach us through error_cb
    # Topics are created on purpose (dev up, the worker, ops) with their partition count,
    # never implicitly by a producer that happens to come first.
    "allow.auto.create.topics": False,
}
ALL_BROKERS_DOWN = -187  # librdkafka's _ALL_BROKERS_DOWN
PURGED = (-152, -151)  # librdkafka's _PURGE_QUEUE, _PURGE_INFLIGHT
# Refusals no retry can fix (MSG_SIZE_TOO_LARGE, TOPIC_AUTHORIZATION_FAILED, INVALID_RECORD):
# dropped and counted. Everything else comes back and is re-sent.
PERMANENT = (10, 29, 87)

Record = tuple[str, str, bytes]


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


@dataclass
class PublishStats:
    """Counters of one publisher; read them any time."""

    produced: int = 0  # handed to the producer (re-sends count again)
    delivered: int = 0  # acknowledged by the broker
    failed: int = 0  # delivery reports with an error (the record is retried)
    dropped: int = 0  # lost on purpose: memory full without a spool, spool full, shutdown
    spooled: int = 0  # written to the on-disk spool
    recoveries: int = 0  # producers rebuilt after a stall or a fatal error


class KafkaPublisher:
    """A :class:`Sink` with a memory queue, an optional spool and a sender thread."""

    def __init__(
        self,
        kafka_config: dict[str, Any],
        *,
        queue_max: int = 100_000,
        spool: Spool | None = None,
        max_in_flight: int = 10_000,
        stall_s: float = 10.0,
        producer_factory: Callable[[dict[str, Any]], Any] | None = None,
    ) -> None:
        self._config = {**PRODUCER_DEFAULTS, **kafka_config}
        self._factory = producer_factory
        self.queue_max = queue_max
        self.spool = spool
        self.max_in_flight = max_in_flight
        self.stall_s = stall_s
        self.stats = PublishStats()
        self._memory: deque[Record] = deque()
        self._retry: deque[Record] = deque()
        self._in_flight = 0  # handed to the producer, no delivery report yet
        self._reclaimed: list[Record] = []  # reported back undelivered during a poll
        self._progress = False
        self._fatal = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._producer: Any = None
        self._thread: threading.Thread | None = None
        self._last_progress = time.monotonic()
        self._down_since: float | None = None

    # ------------------------------------------------------------------ caller side

    @property
    def queued(self) -> int:
        """Records not yet acknowledged: retry + spool + memory + in flight."""
        with self._lock:
            spooled = len(self.spool) if self.spool else 0
            taken_back = len(self._reclaimed)
            return len(self._retry) + spooled + len(self._memory) + taken_back + self._in_flight

    def write(self, topic: str, key: str, value: bytes) -> None:
        """Queue one record; never blocks on the network, never raises for Kafka trouble."""
        with self._lock:
            self._memory.append((topic, key, value))
            while len(self._memory) > self.queue_max:
                oldest = self._memory.popleft()
                if self.spool is not None:
                    self.spool.put(*oldest)
                    self.stats.spooled += 1
                else:
                    self.stats.dropped += 1
                    if self.stats.dropped in (1, 100) or self.stats.dropped % 10_000 == 0:
                        log.warning(
                            "publisher queue full (%d): dropped oldest, %d so far; "
                            "use --spool-dir to keep them",
                            self.queue_max,
                            self.stats.dropped,
                        )
        if self._thread is None:
            self._start()

    def flush(self, timeout: float = 30.0) -> int:
        """Wait until everything written is acknowledged; return what is still pending."""
        deadline = time.monotonic() + timeout
        while self.queued and time.monotonic() < deadline:
            if self._thread is None:
                self._start()
            time.sleep(0.01)
        return self.queued

    def close(self, timeout: float = 30.0) -> None:
        """Send what can be sent within ``timeout``; spool (or count as lost) the rest."""
        remaining = self.flush(timeout)
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._producer is not None:
            self._reclaim_in_flight()
        if self.spool is not None:
            self._spool_backlog(self.spool)
            self.spool.close()
        elif remaining or self._retry or self._memory:  # (purged in flight: back in retry)
            lost = len(self._retry) + len(self._memory)
            self.stats.dropped += lost
            log.error(
                "publisher closed with %d undelivered record(s) after %.0fs (lost; "
                "--spool-dir keeps them for the next start)",
                lost,
                timeout,
            )
        self._retry.clear()
        self._memory.clear()
        s = self.stats
        log.info(
            "publisher closed: produced=%d delivered=%d failed=%d dropped=%d spooled=%d "
            "recoveries=%d",
            s.produced,
            s.delivered,
            s.failed,
            s.dropped,
            s.spooled,
            s.recoveries,
        )

    # ------------------------------------------------------------------ sender thread

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="ragwatch-publisher", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            producer = self._ensure_producer()
            producer.poll(0.02)  # serves delivery reports
            self._after_poll()
            self._feed(producer)
            self._check_stall()

    def _ensure_producer(self) -> Any:
        if self._producer is None:
            conf = dict(self._config)
            conf["error_cb"] = self._on_error
            if self._factory is not None:
                self._producer = self._factory(conf)
            else:
                from confluent_kafka import Producer

                self._producer = Producer(conf)
            self._last_progress = time.monotonic()
            self._fatal = False
        return self._producer

    def _take(self, n: int) -> list[Record]:
        """Up to ``n`` records in send order (retry, spool, memory), under one lock."""
        out: list[Record] = []
        with self._lock:
            while self._retry and len(out) < n:
                out.append(self._retry.popleft())
            while self.spool is not None and len(self.spool) and len(out) < n:
                rec = self.spool.get()
                if rec is None:
                    break
                out.append(rec)
            memory = self._memory
            while memory and len(out) < n:
                out.append(memory.popleft())
            # in flight from now on (until produced, given back or dropped), so that queued
            # never misses a record between here and produce()
            self._in_flight += len(out)
        return out

    def _feed(self, producer: Any) -> None:
        batch = self._take(self.max_in_flight - self._in_flight)
        produce, on_delivery = producer.produce, self._on_delivery
        for i, (topic, key, value) in enumerate(batch):
            try:
                produce(topic, value, key, on_delivery=on_delivery)
            except BufferError:
                self._give_back(batch[i:])  # in order, what did not fit
                break
            except Exception as exc:  # KafkaException: refused before it left (too large)
                if not self._refused(exc, topic, key):
                    self._give_back(batch[i:])
                    break
                self._in_flight -= 1
                continue
            self.stats.produced += 1

    def _give_back(self, records: list[Record]) -> None:
        with self._lock:
            self._retry.extendleft(reversed(records))
            self._in_flight -= len(records)

    def _refused(self, exc: Exception, topic: str, key: str) -> bool:
        """A record ``produce`` refused: dropped and counted if no retry can fix it
        (True), else False (the caller gives it back to be sent again)."""
        err: Any = exc.args[0] if exc.args else None
        code = err.code() if hasattr(err, "code") else None
        if code not in PERMANENT:
            log.warning("produce failed, will be re-sent: %s", exc)
            return False
        self.stats.dropped += 1
        log.error("record refused by the producer, dropped: %s (topic=%s key=%r)", err, topic, key)
        return True

    def _on_delivery(self, err: Any, msg: Any) -> None:
        """Delivery report (on the sender thread, inside poll): count, or take it back.
        It leaves the in-flight count last, so :meth:`flush` (which watches it from
        another thread) never returns before the record is counted or taken back."""
        try:
            self._count_delivery(err, msg)
        finally:
            self._in_flight -= 1

    def _count_delivery(self, err: Any, msg: Any) -> None:
        if err is None:
            self.stats.delivered += 1
            self._progress = True
            return
        code = err.code()
        if code in PERMANENT:
            self.stats.dropped += 1
            log.error(
                "record refused by kafka, dropped: %s (topic=%s key=%r)",
                err,
                msg.topic(),
                msg.key(),
            )
            return
        key = msg.key()
        self._reclaimed.append((msg.topic(), key.decode() if key else "", msg.value()))
        if code not in PURGED:
            self.stats.failed += 1
            if self.stats.failed <= 10 or self.stats.failed % 1000 == 0:
                log.warning(
                    "delivery failed, will be re-sent: %s (failed so far: %d)",
                    err,
                    self.stats.failed,
                )

    def _after_poll(self) -> None:
        if self._reclaimed:
            with self._lock:  # taken back records go first, in the order they left
                self._retry.extendleft(reversed(self._reclaimed))
            self._reclaimed = []
        if self._progress:
            self._progress = False
            self._last_progress = time.monotonic()
            if self._down_since is not None:
                log.warning(
                    "kafka reachable again after %.0fs; sending the backlog (%d queued)",
                    time.monotonic() - self._down_since,
                    self.queued,
                )
                self._down_since = None

    def _on_error(self, err: Any) -> None:
        if err.code() == ALL_BROKERS_DOWN and self._down_since is None:
            self._down_since = time.monotonic()
            log.warning("kafka unreachable (%s); buffering: %d queued", err.str(), self.queued)
        elif err.fatal():
            log.error("kafka producer fatal error: %s; rebuilding the producer", err.str())
            self._fatal = True
        else:
            log.debug("kafka client error: %s", err.str())

    def _check_stall(self) -> None:
        if not self._fatal:
            if not self._in_flight or time.monotonic() - self._last_progress < self.stall_s:
                return
            if self._down_since is not None and not self._broker_answers():
                self._last_progress = time.monotonic()  # plainly down: keep waiting
                return
            log.warning(
                "producer made no progress for %.0fs with %d in flight while the "
                "broker answers: rebuilding it and re-sending in order",
                self.stall_s,
                self._in_flight,
            )
        self._reclaim_in_flight()
        self._producer = None
        self.stats.recoveries += 1

    def _broker_answers(self) -> bool:
        try:
            self._producer.list_topics(timeout=1.0)
        except Exception:
            return False
        return True

    def _reclaim_in_flight(self, timeout_s: float = 5.0) -> None:
        """Purge the producer: every unacknowledged record comes back through its delivery
        report (in order per partition) and goes to the front of the retry queue."""
        self._producer.purge(in_queue=True, in_flight=True, blocking=False)
        deadline = time.monotonic() + timeout_s
        while self._in_flight > 0 and time.monotonic() < deadline:
            self._producer.poll(0.01)
        self._after_poll()
        if self._in_flight:
            log.error("%d record(s) never reported back after a purge", self._in_flight)
            self.stats.dropped += self._in_flight
            self._in_flight = 0

    def _spool_backlog(self, spool: Spool) -> None:
        """Rewrite the spool as retry + spool + memory, so the next start keeps the order."""
        backlog = list(self._retry)
        while (rec := spool.get()) is not None:
            backlog.append(rec)
        backlog.extend(self._memory)
        for rec in backlog:
            spool.put(*rec)
        new = len(self._retry) + len(self._memory)
        self.stats.spooled += new
        if backlog:
            log.warning(
                "publisher closed: %d undelivered record(s) kept in the spool %s",
                len(backlog),
                spool.dir,
            )
