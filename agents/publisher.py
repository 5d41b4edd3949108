"""Publishing envelopes to Kafka without losing what was promised, and without blocking.

One publisher serves every source. ``write()`` only appends to a bounded in-memory queue
and returns: sampling never waits for the network, and nothing raises into it. A sender
thread hands records to a confluent-kafka producer (``acks=all``, idempotence on, key =
host, so per-host order is kept), at most ``max_in_flight`` at a time, and keeps every
record until its delivery report says it is stored. While the broker is unreachable the
queue fills; what does not fit goes to the optional on-disk
:class:`~ragwatch.agents.spool.Spool` (oldest first) or, without one, the oldest records
are dropped and counted. A spool that cannot write (full disk, permission) drops and
counts instead of raising. Order: records awaiting a retry, then the spool, then the memory
queue, so each host's envelopes leave in the order they were written.

Stalls. The stall clock runs only while records wait for the broker: it starts when a
record goes in flight with nothing else pending and restarts at every delivery, so an
idle gap (a 15 s scrape interval) is never a stall. After ``stall_s`` without progress the
publisher asks the broker for metadata. A broker that does not answer either is down or
frozen, not stalled: the producer is kept, since librdkafka re-sends its in-flight records
itself with the same producer id and sequence numbers, which the broker deduplicates. Only
a producer that makes no progress although the broker answers (a restarted broker that
lost its producer state keeps refusing the producer id), or that hit a fatal error, is
purged and rebuilt, and its undelivered records are re-sent in order. Each rebuild that did
not help doubles the wait before the next (up to 32 x ``stall_s``). A rebuild is the one
place a duplicate can come from: a record purged while in flight may have been written by
the broker before its acknowledgement was lost, and the new producer (a new producer id)
sends it again; such records are counted as ``resent``.

Missing topics. A topic that does not exist (deleted, or a broker that restarted empty;
the producer never creates topics) is named once, ``topic T is missing: ...``, and its
records wait: while it is missing nothing is handed to the producer (records stay in
order, the memory queue fills and spills to the spool) and the producer is offered them
again every ``HOLD_S``; records the producer held for it come back and wait with the rest.
A broker that answers while records for a missing topic wait is not a stalled producer:
no rebuild. The first record delivered to it again says ``topic T is back``. (``ragwatch
worker`` re-creates the topics it owns, as at start.) A fatal producer error, which
confluent-kafka raises from ``poll()``, rebuilds the producer as a stall does.

``close()`` (SIGTERM, or ``with``) sends what it can within the timeout and writes the rest
to the spool for the next start. When the interpreter exits normally, publishers not closed
yet are closed with ``exit_timeout_s`` (5 s; None: not at exit), after every
:class:`~ragwatch.agents.sdk.RequestRecorder` has drained into its sink (one ``atexit``
hook, weak references, skipped in a forked child).

Counters (:class:`PublishStats`): produced, delivered, failed, dropped (the spool's losses
included), spooled, recoveries, resent, spool_errors; ``queued`` is what is waiting right
now. A log line says when the broker goes away and when it comes back.

>>> sink = ListSink()
>>> sink.write("ragwatch.gpu", "h1", b"{}")
>>> sink.records
[('ragwatch.gpu', 'h1', b'{}')]
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ragwatch.agents.shutdown import register_at_exit
from ragwatch.agents.sinks import ListSink, Sink, StreamSink
from ragwatch.agents.spool import Spool
from ragwatch.kafka_admin import MissingTopics
from ragwatch.logs import log_sometimes

__all__ = ["KafkaPublisher", "ListSink", "PublishStats", "Sink", "StreamSink"]  # sinks: re-exported

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
PURGE_QUEUE, PURGE_INFLIGHT = -152, -151  # librdkafka's _PURGE_QUEUE, _PURGE_INFLIGHT
PURGED = (PURGE_QUEUE, PURGE_INFLIGHT)
# Refusals no retry can fix (MSG_SIZE_TOO_LARGE, TOPIC_AUTHORIZATION_FAILED, INVALID_RECORD):
# dropped and counted. Everything else comes back and is re-sent.
PERMANENT = (10, 29, 87)
# The topic does not exist (_UNKNOWN_TOPIC, _UNKNOWN_PARTITION, UNKNOWN_TOPIC_OR_PART): its
# records wait until it does, offered to the producer again every HOLD_S.
UNKNOWN_TOPIC = (-188, -190, 3)
HOLD_S = 1.0
LOOK_S = 2.0  # after an outage, how often records waiting ask whether their topics exist

Record = tuple[str, str, bytes]


@dataclass
class PublishStats:
    """Counters of one publisher; read them any time."""

    produced: int = 0  # handed to the producer (re-sends count again)
    delivered: int = 0  # acknowledged by the broker
    failed: int = 0  # delivery reports with an error (the record is retried)
    dropped: int = 0  # lost: memory full without a spool, the spool's losses, shutdown
    spooled: int = 0  # written to the on-disk spool
    recoveries: int = 0  # producers rebuilt after a stall or a fatal error
    resent: int = 0  # purged in flight, then re-sent or spooled: each may be stored twice
    spool_errors: int = 0  # disk errors of the spool (what they lost is in dropped)


class KafkaPublisher:
    """A :class:`Sink` with a memory queue, an optional spool and a sender thread.

    ``stall_s``: how long records may wait without progress before the broker is asked
    whether it answers. ``exit_timeout_s``: how long the interpreter's exit waits for
    delivery if the publisher was not closed (None: no exit hook). ``clock`` (monotonic
    seconds) times stalls and outages. Use it as a context manager to close it.
    """

    def __init__(
        self,
        kafka_config: dict[str, Any],
        *,
        queue_max: int = 100_000,
        spool: Spool | None = None,
        max_in_flight: int = 10_000,
        stall_s: float = 10.0,
        exit_timeout_s: float | None = 5.0,
        clock: Callable[[], float] = time.monotonic,
        producer_factory: Callable[[dict[str, Any]], Any] | None = None,
    ) -> None:
        if exit_timeout_s is not None and not exit_timeout_s >= 0:
            raise ValueError(f"exit_timeout_s must be >= 0 or None, got {exit_timeout_s!r}")
        self._config = {**PRODUCER_DEFAULTS, **kafka_config}
        self._factory = producer_factory
        self.queue_max = queue_max
        self.spool = spool
        self.max_in_flight = max_in_flight
        self.stall_s = stall_s
        self.exit_timeout_s = exit_timeout_s
        self._clock = clock
        self.stats = PublishStats()
        self._memory: deque[Record] = deque()
        self._retry: deque[Record] = deque()
        self._in_flight = 0  # handed to the producer, no delivery report yet
        self._reclaimed: list[Record] = []  # reported back undelivered during a poll
        self._purged_in_flight = 0  # of those, purged after they were sent
        self._spool_dropped = 0  # the spool's drops already counted in stats.dropped
        self._progress = False
        self._fatal = False
        self._topics_in_flight: Counter[str] = Counter()  # handed to the producer, per topic
        self._missing = MissingTopics(
            log,
            "%d record(s) wait for it (the memory queue, then the spool if there is one) "
            "until it exists ('ragwatch worker' re-creates it)",
            "sending its records",
        )
        self._hold_until = -math.inf  # nothing is produced before (a topic is missing)
        self._awaited = False  # the last look found in-flight records' topics missing
        self._next_look = -math.inf  # the next early look at the broker's topics
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._closing = False
        self._closed = False
        self._producer: Any = None
        self._thread: threading.Thread | None = None
        self._inline = False  # no thread could be started (interpreter exit): flush() sends
        self._last_progress = clock()  # the stall clock: last delivery, or first wait since
        self._futile = 0  # rebuilds since the last delivery
        self._rebuilt_at = -math.inf
        self._down_since: float | None = None
        self._silent = False  # the broker did not answer metadata at the last stall check
        self._pid = os.getpid()
        if exit_timeout_s is not None:
            register_at_exit(self)

    # ------------------------------------------------------------------ caller side

    @property
    def queued(self) -> int:
        """Records not yet acknowledged: retry + spool + memory + in flight."""
        with self._lock:
            spooled = len(self.spool) if self.spool else 0
            taken_back = len(self._reclaimed)
            return len(self._retry) + spooled + len(self._memory) + taken_back + self._in_flight

    def write(self, topic: str, key: str, value: bytes) -> None:
        """Queue one record; never blocks on the network, never raises for Kafka or disk
        trouble (what is lost is counted in ``stats.dropped``)."""
        with self._lock:
            if self._closed:
                self.stats.dropped += 1
                log_sometimes(log, self.stats.dropped, "publisher closed: record dropped")
                return
            self._memory.append((topic, key, value))
            while len(self._memory) > self.queue_max:
                oldest = self._memory.popleft()
                if self.spool is not None:
                    self._spool_put(self.spool, oldest)
                else:
                    self.stats.dropped += 1
                    log_sometimes(
                        log,
                        self.stats.dropped,
                        "publisher queue full (%d): dropped oldest; use --spool-dir to keep them",
                        self.queue_max,
                    )
        if self._thread is None and not self._inline:
            self._start()

    def flush(self, timeout: float = 30.0) -> int:
        """Wait until everything written is acknowledged; return what is still pending."""
        if self._closed:
            return self.queued
        deadline = time.monotonic() + timeout
        while self.queued and time.monotonic() < deadline:
            if self._thread is None and not self._inline:
                self._start()
            if self._inline:
                self._step()
            else:
                time.sleep(0.01)
        return self.queued

    def close(self, timeout: float = 30.0) -> None:
        """Send what can be sent within ``timeout``; spool (or count as lost) the rest.
        Later calls do nothing; records written after it are dropped and counted."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
        self.flush(timeout)
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        purged = self._reclaim_in_flight() if self._producer is not None else 0
        with self._lock:
            self._closed = True
            if self.spool is not None:
                self.stats.resent += purged  # the next start sends them again
                self._spool_backlog(self.spool)
                self.spool.close()
                self._fold_spool(self.spool)
            elif self._retry or self._memory:  # (purged in flight: back in retry)
                lost = len(self._retry) + len(self._memory)
                self.stats.dropped += lost
                log.error(
                    "publisher closed with %d undelivered record(s) after %.3gs (lost; "
                    "a spool, --spool-dir for the agent, keeps them for the next start)",
                    lost,
                    timeout,
                )
            self._retry.clear()
            self._memory.clear()
        log.info("publisher closed: %s", _counters(self.stats))

    def __enter__(self) -> KafkaPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ sender thread

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None or self._inline or self._stop.is_set():
                return
            thread = threading.Thread(target=self._run, name="ragwatch-publisher", daemon=True)
            try:
                thread.start()
            except RuntimeError:  # the interpreter is exiting (3.12+): flush() sends instead
                self._inline = True
                return
            self._thread = thread

    def _run(self) -> None:
        while not self._stop.is_set():
            self._step()

    def _step(self) -> None:
        producer = self._ensure_producer()
        try:
            producer.poll(0.02)  # serves delivery reports
        except Exception as exc:  # confluent-kafka raises a fatal error here, not in error_cb
            if not _fatal(exc):
                raise
            log.error("kafka producer fatal error: %s; rebuilding the producer", exc.args[0])
            self._fatal = True
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
            self._last_progress = self._clock()
            self._fatal = False
        return self._producer

    def _take(self, n: int) -> list[Record]:
        """Up to ``n`` records in send order (retry, spool, memory), under one lock."""
        out: list[Record] = []
        with self._lock:
            while self._retry and len(out) < n:
                out.append(self._retry.popleft())
            spool = self.spool
            if spool is not None and len(spool) and len(out) < n:
                while len(out) < n and (rec := spool.get()) is not None:
                    out.append(rec)
                self._fold_spool(spool)
            memory = self._memory
            while memory and len(out) < n:
                out.append(memory.popleft())
            # in flight from now on (until produced, given back or dropped), so that queued
            # never misses a record between here and produce()
            self._in_flight += len(out)
        return out

    def _feed(self, producer: Any) -> None:
        if self._fatal or self._clock() < self._hold_until:
            return
        waiting = self._in_flight > 0
        batch = self._take(self.max_in_flight - self._in_flight)
        if batch and not waiting:
            self._last_progress = self._clock()  # the stall clock starts when records wait
        produce, on_delivery = producer.produce, self._on_delivery
        for i, (topic, key, value) in enumerate(batch):
            try:
                produce(topic, value, key, on_delivery=on_delivery)
            except BufferError:
                self._give_back(batch[i:])  # in order, what did not fit
                break
            except Exception as exc:  # KafkaException: refused before it left (too large)
                if _code(exc) in UNKNOWN_TOPIC:  # the producer knows the topic is missing
                    self._give_back(batch[i:])
                    self._topic_missing(topic)
                    break
                if not self._refused(exc, topic, key):
                    self._give_back(batch[i:])
                    break
                self._in_flight -= 1
                continue
            self.stats.produced += 1
            self._topics_in_flight[topic] += 1

    def _topic_missing(self, topic: str) -> None:
        """Name ``topic`` once and offer nothing to the producer for ``HOLD_S``."""
        self._hold_until = self._clock() + HOLD_S
        if topic not in self._missing.missing:
            self._missing.gone(topic, self.queued)

    def _give_back(self, records: list[Record]) -> None:
        with self._lock:
            self._retry.extendleft(reversed(records))
            self._in_flight -= len(records)

    def _refused(self, exc: Exception, topic: str, key: str) -> bool:
        """A record ``produce`` refused: dropped and counted if no retry can fix it
        (True), else False (the caller gives it back to be sent again)."""
        if _code(exc) not in PERMANENT:
            log.warning("produce failed, will be re-sent: %s", exc)
            return False
        self._lose(1)
        log.error(
            "record refused by the producer, dropped: %s (topic=%s key=%r)",
            exc.args[0],
            topic,
            key,
        )
        return True

    def _lose(self, n: int) -> None:
        """Count records lost on the sender thread (under the lock: writers count too)."""
        with self._lock:
            self.stats.dropped += n

    def _on_delivery(self, err: Any, msg: Any) -> None:
        """Delivery report (on the sender thread, inside poll): count, or take it back.
        It leaves the in-flight count last, so :meth:`flush` (which watches it from
        another thread) never returns before the record is counted or taken back."""
        try:
            self._topics_in_flight[msg.topic()] -= 1
            self._count_delivery(err, msg)
        finally:
            self._in_flight -= 1

    def _count_delivery(self, err: Any, msg: Any) -> None:
        if err is None:
            self.stats.delivered += 1
            self._progress = True
            if self._missing.missing:
                self._missing.back(msg.topic())
            return
        code = err.code()
        if code in PERMANENT:
            self._lose(1)
            log.error(
                "record refused by kafka, dropped: %s (topic=%s key=%r)",
                err,
                msg.topic(),
                msg.key(),
            )
            return
        key = msg.key()
        self._reclaimed.append((msg.topic(), key.decode() if key else "", msg.value()))
        if code == PURGE_INFLIGHT:
            self._purged_in_flight += 1
        elif code in UNKNOWN_TOPIC:  # named once instead of a line per record
            self.stats.failed += 1
            self._topic_missing(msg.topic())
        elif code != PURGE_QUEUE:
            self.stats.failed += 1
            log_sometimes(log, self.stats.failed, "delivery failed, will be re-sent: %s", err)

    def _after_poll(self) -> None:
        if self._reclaimed:
            with self._lock:  # taken back records go first, in the order they left
                self._retry.extendleft(reversed(self._reclaimed))
            self._reclaimed = []
        if self._progress:
            self._progress = False
            self._futile = 0
            self._last_progress = self._clock()
            if self._down_since is not None:
                log.warning(
                    "kafka reachable again after %.0fs; sending the backlog (%d queued)",
                    self._last_progress - self._down_since,
                    self.queued,
                )
                self._down_since = None

    def _on_error(self, err: Any) -> None:
        if err.code() == ALL_BROKERS_DOWN and self._down_since is None:
            self._down_since = self._clock()
            log.warning("kafka unreachable (%s); buffering: %d queued", err.str(), self.queued)
        elif err.fatal():
            log.error("kafka producer fatal error: %s; rebuilding the producer", err.str())
            self._fatal = True
        else:
            log.debug("kafka client error: %s", err.str())

    def _patience(self) -> float:
        """How long without progress before acting: ``stall_s``, doubled by each rebuild
        that did not help (up to 32x)."""
        return float(self.stall_s * 2 ** min(self._futile, 5))

    def _check_stall(self) -> None:
        now = self._clock()
        if self._fatal:
            if self._futile == 0 or now - self._rebuilt_at >= self._patience():
                self._rebuild(now)
            return
        if not self._in_flight:
            return
        waited = now - self._last_progress
        # after an outage (or while a topic is missing) the broker is asked every LOOK_S
        # whether the records' topics exist: a broker that restarted empty lost them
        early = (self._down_since is not None or self._awaited) and waited >= LOOK_S
        if waited < self._patience() and not (early and now >= self._next_look):
            return
        self._next_look = now + LOOK_S
        topics = self._broker_topics()
        if topics is not None and self._awaiting_topics(topics, now):
            return
        if waited < self._patience():
            return
        answers = topics is not None
        silent, self._silent = self._silent, not answers
        if silent or not answers:
            # Down or frozen: librdkafka re-sends in-flight records itself (same producer id
            # and sequence, no duplicates), so wait; and once it answers again, give the
            # producer a full period to resume before judging it.
            self._last_progress = now
            if not answers and self._down_since is None:
                self._down_since = now - waited
                log.warning(
                    "kafka does not answer: %d record(s) waited %.0fs; waiting for it (the "
                    "producer re-sends them itself, without duplicates); %d queued",
                    self._in_flight,
                    waited,
                    self.queued,
                )
            return
        log.warning(
            "producer made no progress for %.0fs with %d in flight while the broker answers: "
            "rebuilding it and re-sending in order",
            waited,
            self._in_flight,
        )
        self._rebuild(now)

    def _awaiting_topics(self, topics: set[str], now: float) -> bool:
        """Whether records in flight wait for topics the broker lacks (each named once), or
        did at the last look: not a stall. The producer holds them until the topics exist;
        once they do, it gets LOOK_S to send them itself before it is judged."""
        missing = sorted(t for t, n in self._topics_in_flight.items() if n > 0 and t not in topics)
        awaited, self._awaited = self._awaited, bool(missing)
        for t in missing:
            self._missing.gone(t, self.queued)
        if missing:
            self._last_progress = now
        elif awaited:
            self._last_progress = now - self._patience() + LOOK_S
        return bool(missing or awaited)

    def _rebuild(self, now: float) -> None:
        """Purge the producer, count the rebuild; the next step builds a new one."""
        purged = self._reclaim_in_flight()
        self._producer = None
        self._futile += 1
        self._rebuilt_at = now
        self.stats.recoveries += 1
        self.stats.resent += purged
        if purged:
            log.warning(
                "%d record(s) purged in flight are re-sent by a new producer: the broker "
                "may already have stored them (possible duplicates, counted as resent); "
                "next rebuild not before %.0fs without progress",
                purged,
                self._patience(),
            )

    def _broker_topics(self) -> set[str] | None:
        """The broker's topic names (one metadata request), None if it does not answer."""
        try:
            return set(self._producer.list_topics(timeout=1.0).topics)
        except Exception:
            return None

    def _reclaim_in_flight(self, timeout_s: float = 5.0) -> int:
        """Purge the producer: every unacknowledged record comes back through its delivery
        report (in order per partition) and goes to the front of the retry queue. Returns
        how many of them had been sent (the broker may have stored those)."""
        self._producer.purge(in_queue=True, in_flight=True, blocking=False)
        deadline = time.monotonic() + timeout_s
        while self._in_flight > 0 and time.monotonic() < deadline:
            self._producer.poll(0.01)
        self._after_poll()
        if self._in_flight:
            log.error("%d record(s) never reported back after a purge", self._in_flight)
            self._lose(self._in_flight)
            self._in_flight = 0
        self._topics_in_flight.clear()
        purged, self._purged_in_flight = self._purged_in_flight, 0
        return purged

    # ------------------------------------------------------------------ spool (under _lock)

    def _spool_put(self, spool: Spool, rec: Record) -> bool:
        kept = spool.put(*rec)
        self.stats.spooled += kept
        self._fold_spool(spool)
        return kept

    def _fold_spool(self, spool: Spool) -> None:
        """Count the spool's own losses (cap, disk errors) as the publisher's."""
        self.stats.dropped += spool.dropped - self._spool_dropped
        self._spool_dropped = spool.dropped
        self.stats.spool_errors = spool.errors

    def _spool_backlog(self, spool: Spool) -> None:
        """Put retry + spool + memory in the spool in that order, for the next start (the
        spool is rewritten only if records taken back from the producer must go first)."""
        older: list[Record] = []
        if self._retry:
            while (rec := spool.get()) is not None:
                older.append(rec)
        new = len(self._retry) + len(self._memory)
        for rec in self._retry:
            self._spool_put(spool, rec)
        for rec in older:
            spool.put(*rec)
        for rec in self._memory:
            self._spool_put(spool, rec)
        if new or older:
            log.warning(
                "publisher closed: %d undelivered record(s) kept in the spool %s (%d in all)",
                new,
                spool.dir,
                len(spool),
            )


def _code(exc: BaseException) -> int | None:
    """The librdkafka error code of a KafkaException (None for anything else)."""
    err: Any = exc.args[0] if exc.args else None
    return err.code() if hasattr(err, "code") else None


def _fatal(exc: BaseException) -> bool:
    """Whether ``exc`` is a KafkaException carrying a fatal error."""
    err: Any = exc.args[0] if exc.args else None
    return bool(hasattr(err, "fatal") and err.fatal())


def _counters(s: PublishStats) -> str:
    return (
        f"produced={s.produced} delivered={s.delivered} failed={s.failed} dropped={s.dropped} "
        f"spooled={s.spooled} recoveries={s.recoveries} resent={s.resent} "
        f"spool_errors={s.spool_errors}"
    )
