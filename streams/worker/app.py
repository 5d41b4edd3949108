"""The Faust app: ``ragwatch.gpu`` -> GpuPipeline, ``ragwatch.requests`` -> RequestPipeline,
``ragwatch.events`` -> EventPipeline and ``ragwatch.metrics`` -> MetricsPipeline, all ->
root-cause hints (streams/pipelines/hints.py) -> the alerts topic and Redis. ``ragwatch notify``
(streams/notifier/service.py) delivers from the alerts topic.

No app exists at import time: :func:`build_app` creates one from :class:`Settings` and
registers the processors. Topics carry raw bytes; :mod:`ragwatch.codec` decodes them. A
message that fails validation goes to ``ragwatch.deadletter`` (value = the original bytes,
headers = source topic, partition, offset and the reason) and is counted; it never stops
the partition. Every ``TOPIC_CHECK_S`` the worker checks that its topics exist; one that
vanished (a broker restarted empty) is named once and re-created, and its partitions are
read from offset 0 (:mod:`ragwatch.streams.worker.topics`).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

import faust
import mode
from faust.types import TP
from redis.exceptions import RedisError

from ragwatch.codec import encode
from ragwatch.config import Settings, redact_url
from ragwatch.kafka import KafkaClient
from ragwatch.kafka_admin import FACTS_PARTITIONS, TOPIC_CHECK_S
from ragwatch.outage import RedisTrouble
from ragwatch.schema import (
    Alert,
    RequestsEnvelope,
    Transition,
)
from ragwatch.store import RedisState, async_client
from ragwatch.streams.alerting.rules import load_rules
from ragwatch.streams.pipelines.fleet import Pipelines
from ragwatch.streams.worker.facts_feed import FactsFeed, FactsReader
from ragwatch.streams.worker.facts_table import FactsTable
from ragwatch.streams.worker.loop import WorkerLoop
from ragwatch.streams.worker.relay import TraceRelay
from ragwatch.streams.worker.snapshot import (
    SnapshotError,
    dump_host,
    dump_service,
    load_host,
    load_service,
)
from ragwatch.streams.worker.topics import TopicKeeper, read_renewed_from_start
from ragwatch.streams.worker.transport import RagwatchApp

log = logging.getLogger(__name__)

REBALANCE_CHECK_S = 2.0  # the topic check at an assignment waits at most this long


def faust_credentials(settings: Settings) -> Any:
    """Kafka security settings as Faust credentials (None for PLAINTEXT), from the one
    :class:`~ragwatch.kafka.KafkaClient`."""
    kafka = KafkaClient.of(settings)
    if kafka.protocol == "PLAINTEXT":
        return None
    if not kafka.sasl:
        return faust.SSLCredentials(kafka.ssl_context())
    return faust.SASLCredentials(
        username=kafka.sasl_username,
        password=kafka.sasl_password,
        mechanism=kafka.sasl_mechanism,
        ssl_context=kafka.ssl_context(),
    )


@dataclass
class WorkerCounters:
    messages: int = 0
    deadletter: int = 0
    pruned: int = 0  # silent hosts and services whose Redis state was deleted
    slow_messages: int = 0  # messages processed for longer than RAGWATCH_SLOW_MESSAGE
    transitions: int = 0
    redis_errors: int = 0
    duplicate_notifications: int = 0  # transitions already sent before a restart: not re-sent
    snapshots_restored: int = 0
    snapshot_errors: int = 0
    # OTLP traces (streams/worker/relay.py): spans read, requests relayed, and what the
    # assembler dropped (duplicate spans, spans of traces already emitted)
    otlp_spans: int = 0
    otlp_requests: int = 0
    otlp_duplicate_spans: int = 0
    otlp_late_spans: int = 0
    otlp_evicted_traces: int = 0
    otlp_bad_latencies: int = 0  # engine queue / TTFT attributes not used (docs/otel.md)
    otlp_bad_process_times: int = 0  # process.creation.time not an ISO 8601 time (otel.md)
    worker_id_clashes: int = 0  # status writes that found another process under our id
    held_acks: int = 0  # messages read whose offsets wait for their snapshots
    commit_stalls: int = 0  # times snapshots could not be written and commits stopped
    # the fleet view (docs/status.md): facts topic records read and refused, hints that
    # waited for another worker and those sent without it, minutes of like GPUs compared
    # and those compared while a worker was still behind
    facts_records: int = 0
    facts_bad: int = 0
    hints_waited: int = 0
    hints_incomplete: int = 0
    gpu_peer_minutes: int = 0
    gpu_peer_incomplete: int = 0


class Delivery(mode.Service):
    """Owns the Redis client; publishes every transition to the alerts topic (which
    ``ragwatch notify`` delivers) and records it in Redis."""

    def __init__(self, settings: Settings, worker_id: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings = settings
        self.worker_id = worker_id
        self.process = uuid.uuid4().hex  # this process, apart from others under its id
        self._status_written = False
        self.counters = WorkerCounters()
        self.redis = async_client(settings.redis_url)
        self.redis_down_since: float | None = None
        self.redis_trouble = RedisTrouble(log, redact_url(settings.redis_url))
        self._resolved_while_down: set[str] = set()
        # transitions and the rewrite after an outage write the active-alert hash in turn:
        # a rewrite must not put back an alert whose resolution was written meanwhile
        self._active_lock = asyncio.Lock()
        self.store = RedisState(self.redis, settings.redis_prefix)
        self.closed = False

    async def on_stop(self) -> None:
        self.closed = True  # the 1-second status timer may still fire while Faust stops
        await self.redis.aclose()

    async def send(self, t: Transition, alerts_topic: Any) -> None:
        a = t.alert
        self.counters.transitions += 1
        level = logging.WARNING if a.status == "firing" else logging.INFO
        log.log(
            level,
            "alert %s %s -> %s fingerprint=%s labels=%s",
            a.rule,
            t.previous,
            a.status,
            a.fingerprint,
            a.labels,
        )
        if not t.notify or await self._first_notification(a):
            # published, then claimed: a worker killed in between publishes it again from
            # its snapshot (the notifier takes an unchanged alert once); claimed first, a
            # kill before the broker had it lost the page (seen in the three-worker demo)
            sent = await alerts_topic.send(key=a.fingerprint.encode(), value=encode(a))
            await sent  # the broker has it
            if t.notify:
                await self._claim(a)
        try:
            async with self._active_lock:
                await self.store.write_transition(t)
        except RedisError as exc:
            if a.status == "resolved":
                self._resolved_while_down.add(a.fingerprint)
            self._redis_failed("write alert", exc)

    async def _first_notification(self, a: Alert) -> bool:
        """Whether this firing or resolution was not published before (a worker restarted
        from a snapshot may produce it again). Without Redis: at least once, publish it."""
        try:
            first = not await self.store.notified(a)
        except RedisError as exc:
            self._redis_failed("read notification", exc)
            return True
        if not first:
            self.counters.duplicate_notifications += 1
            log.info("alert %s %s was published before a restart: not again", a.rule, a.status)
        return first

    async def _claim(self, a: Alert) -> None:
        """This firing or resolution is published: a worker that produces it again after
        a restart does not publish it twice."""
        try:
            await self.store.claim_notification(a)
        except RedisError as exc:
            self._redis_failed("claim notification", exc)

    async def restore(self, pipes: Pipelines, kind: str, key: str) -> None:
        """Load the snapshot of a host or service this worker meets for the first time."""
        try:
            data = await self.store.read_snapshot(kind, key)
        except RedisError as exc:
            self._redis_failed(f"read {kind} snapshot", exc)
            return
        if data is None:
            return
        load = load_host if kind == "host" else load_service
        try:
            n = load(pipes, key, data)
        except SnapshotError as exc:
            self.counters.snapshot_errors += 1
            log.warning("%s %s: snapshot not used, starting from scratch: %s", kind, key, exc)
            return
        self.counters.snapshots_restored += 1
        log.info("%s %s: restored %d series and their alerts from the snapshot", kind, key, n)

    async def write_series(self, points: dict[str, tuple[dict[str, Any], list[Any]]]) -> None:
        try:
            await self.store.write_series(points)
        except RedisError as exc:
            self._redis_failed("write series", exc)

    async def prune(self, hosts: set[str], services: set[str], prefixes: tuple[str, ...]) -> None:
        try:
            charts = await self.store.prune(hosts, services, prefixes)
        except RedisError as exc:  # left for the next worker that sweeps them (or by hand)
            self._redis_failed("prune silent hosts and services", exc)
            return
        self.counters.pruned += len(hosts) + len(services)
        log.info(
            "pruned %d silent host(s), %d service(s) and %d chart(s) from Redis",
            len(hosts),
            len(services),
            charts,
        )

    async def write_snapshots(self, pipes: Pipelines, hosts: set[str], services: set[str]) -> bool:
        """Whether they were written."""
        try:
            await self.store.write_snapshots("host", {h: dump_host(pipes, h) for h in hosts})
            await self.store.write_snapshots(
                "service", {s: dump_service(pipes, s) for s in services}
            )
        except RedisError as exc:
            self._redis_failed("write snapshots", exc)
            return False
        return True

    async def write_status(self, pipes: Pipelines, hosts: set[str], services: set[str]) -> None:
        gpus, requests = pipes.gpus, pipes.requests
        try:
            await self.store.write_hosts(pipes.status("host", hosts))
            await self.store.write_services(pipes.status("service", services))
            replaced = await self.store.write_worker(
                self.worker_id,
                {
                    "process": self.process,
                    **asdict(self.counters),
                    **asdict(gpus.stats),
                    **{f"requests_{k}": v for k, v in asdict(requests.stats).items()},
                    **{f"events_{k}": v for k, v in asdict(pipes.events.stats).items()},
                    **{f"metrics_{k}": v for k, v in asdict(pipes.metrics.stats).items()},
                    "series": len(gpus) + len(requests.series) + len(pipes.metrics.series),
                    "alert_flaps": sum(pipes.engine.flaps.values()),
                    "watermark": pipes.watermark,
                },
            )
            self._check_identity(replaced)
            if self.redis_down_since is not None:
                await self._recovered(pipes)
        except RedisError as exc:
            self._redis_failed("write status", exc)

    def _check_identity(self, replaced: dict[str, Any]) -> None:
        """Another live process wrote under this worker's id since its last write (two
        workers on one host without RAGWATCH_WORKER_ID): their status would mix."""
        other = replaced.get("process")
        if self._status_written and other is not None and other != self.process:
            self.counters.worker_id_clashes += 1
            if self.counters.worker_id_clashes == 1:
                log.warning(
                    "another worker writes its status as %r too: give each worker on this "
                    "host its own RAGWATCH_WORKER_ID",
                    self.worker_id,
                )
        self._status_written = True

    def _redis_failed(self, what: str, exc: Exception) -> None:
        self.counters.redis_errors += 1
        if self.redis_down_since is None:
            self.redis_down_since = time.monotonic()
        self.redis_trouble.failed(what, exc)  # the first at once, then one line per 30 s

    async def _recovered(self, pipes: Pipelines) -> None:
        """Redis answers again: rewrite this worker's active alerts (a restarted Redis is
        empty; one that was only unreachable missed the transitions in between)."""
        assert self.redis_down_since is not None
        async with self._active_lock:  # the engine's state as of the write, not before
            active = pipes.engine.active
            await self.store.rewrite_active(active, self._resolved_while_down - set(active))
        self.store.forget_index()
        self.redis_trouble.wrote(
            f": rewrote {len(active)} active alert(s), removed "
            f"{len(self._resolved_while_down)} resolved"
        )
        self.redis_down_since = None
        self._resolved_while_down.clear()


def build_app(settings: Settings, *, worker_id: str | None = None) -> faust.App:
    """A configured Faust app with the GPU processor registered."""
    # stable across restarts: a restarted worker carries on its own status and series
    worker_id = worker_id or settings.worker_id or socket.gethostname()
    app = RagwatchApp(
        settings.app_id,
        fetch_max_wait_ms=settings.kafka_fetch_max_wait_ms,
        broker="kafka://" + settings.kafka_bootstrap.replace(",", ";kafka://"),
        broker_credentials=faust_credentials(settings),
        broker_session_timeout=settings.kafka_session_timeout,
        broker_heartbeat_interval=min(3.0, settings.kafka_session_timeout / 3),
        topic_partitions=settings.topic_partitions,
        value_serializer="raw",
        key_serializer="raw",
        web_enabled=False,
        store="memory://",
        # Faust keeps a small data dir per app; str.format runs on it, so escape braces.
        datadir=str(settings.state_dir / "faust" / settings.app_id)
        .replace("{", "{{")
        .replace("}", "}}"),
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        # acks wait for snapshots (streams.acks): a rebalance must not wait for them
        stream_wait_empty=False,
    )
    delivery = Delivery(settings, worker_id)
    app.service(delivery)  # type: ignore[arg-type]  # faust starts instances too
    rules = load_rules(settings.rules_file)
    table = FactsTable(worker_id)  # the other workers' facts, for the hints
    pipes = Pipelines(
        rules, max_series=settings.max_series, remote=table, scoring=settings.score_signals
    )
    register_processors(app, settings, pipes, delivery, table)
    return app


def _topic(app: faust.App, settings: Settings, name: str) -> Any:
    return app.topic(
        settings.topic(name),
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        partitions=settings.topic_partitions,
    )


def register_processors(
    app: faust.App,
    settings: Settings,
    pipes: Pipelines,
    delivery: Delivery,
    table: FactsTable,
) -> WorkerLoop:
    """One Faust agent per input topic, all feeding one :class:`WorkerLoop`; its tick on
    a 1-second timer, its rebalance and stop on Faust's signals; the facts topic read
    into ``table`` (a thread) and published to (:mod:`.facts_feed`)."""
    alerts_topic = _topic(app, settings, "alerts")
    dlq_topic = _topic(app, settings, "deadletter")
    facts_name = settings.topic("facts")
    facts_topic = app.topic(
        facts_name, key_type=bytes, value_type=bytes, key_serializer="raw",
        value_serializer="raw", partitions=FACTS_PARTITIONS, compacting=True,
    )  # fmt: skip

    async def send_facts(key: bytes, value: bytes | None) -> None:
        sent = facts_topic.as_future_message(key=key, value=value)
        sent.add_done_callback(_facts_sent)  # (Faust logs a failure: a topic missing)
        await facts_topic.publish_message(sent)

    feed = FactsFeed(delivery.worker_id, pipes, table, send_facts, wait_s=settings.hint_wait)

    async def send_alert(t: Transition) -> None:
        await delivery.send(t, alerts_topic)

    async def send_dead_letter(key: Any, value: bytes, headers: dict[str, bytes]) -> None:
        await dlq_topic.send(key=key, value=value, headers=headers)

    loop = WorkerLoop(
        settings,
        pipes,
        delivery,
        delivery.counters,
        send_alert=send_alert,
        send_dead_letter=send_dead_letter,
        facts=feed,
    )
    # a partition that waits its turn behind the others' backlog is not idle
    loop.marks.highwater = lambda topic, partition: _highwater(app.consumer, TP(topic, partition))
    for kind in loop.topics:
        app.agent(_topic(app, settings, kind), name=f"ragwatch.{kind}-processor")(
            _agent(loop, kind)
        )
    relay = _relay(app, settings, loop)

    @app.on_partitions_assigned.connect  # type: ignore[untyped-decorator, arg-type]
    async def forget_revoked(app: Any, assigned_now: set[Any], **kwargs: Any) -> None:
        await loop.assigned(assigned_now)

    keeper = TopicKeeper(settings)
    # a broker restarted empty means a new assignment: before Faust seeks to the committed
    # offsets, the partitions of topics re-created lately get offset 0
    renewed_s = max(60.0, 3 * settings.kafka_session_timeout)

    @app.on_rebalance_complete.connect  # type: ignore[untyped-decorator, arg-type]
    async def read_renewed(app: Any, **kwargs: Any) -> None:
        await read_renewed_from_start(
            app.consumer, keeper, within_s=renewed_s, timeout_s=REBALANCE_CHECK_S
        )

    readers: list[FactsReader] = []

    @app.task  # type: ignore[untyped-decorator]
    async def read_facts() -> None:
        kafka = KafkaClient.of(settings).librdkafka()
        readers.append(FactsReader(kafka, facts_name, table, asyncio.get_running_loop()).start())

    @app.on_before_shutdown.connect  # type: ignore[untyped-decorator, arg-type]
    async def snapshot_everything(app: Any, **kwargs: Any) -> None:
        await loop.stop()
        for reader in readers:
            await asyncio.to_thread(reader.stop)

    @app.timer(1.0)  # type: ignore[untyped-decorator]
    async def write_status() -> None:
        if relay is not None:
            await relay.tick()
        await loop.tick()

    @app.timer(1.0)  # type: ignore[untyped-decorator]
    async def empty_partitions() -> None:
        for tp in list(loop.unread):  # assigned, not read yet: anything to read there?
            if (high := await _read_out(app.consumer, tp)) is not None:
                loop.found_empty(tp, high)
        for tp in list(loop.empty):  # found empty, not read since: has anything come?
            loop.came(tp, _highwater(app.consumer, tp))

    @app.timer(TOPIC_CHECK_S)  # type: ignore[untyped-decorator]
    async def keep_topics() -> None:
        await keeper.check()

    return loop


async def _read_out(consumer: Any, tp: Any) -> int | None:
    """``tp``'s high watermark if it has nothing to read (its position there): an empty
    partition does not hold hints (``WorkerLoop.unread``) until messages come to it
    (``WorkerLoop.came``). None: it has, or unknown yet."""
    try:
        high = consumer.highwater(tp)
        position = await consumer.position(tp)
    except Exception:  # not assigned any more, or not fetched yet
        return None
    return high if high is not None and position is not None and position >= high else None


def _highwater(consumer: Any, tp: Any) -> int | None:
    """``tp``'s high watermark as its consumer last fetched it (None: unknown)."""
    try:
        high = consumer.highwater(tp)
    except Exception:  # not assigned any more
        return None
    return high if isinstance(high, int) else None


def _facts_sent(sent: Any) -> None:
    """A facts record was sent, or could not be (the topic is missing until the next
    check re-creates it): its exception is taken here, so it is not logged again as
    never retrieved; the next record of its key says the same, newer."""
    if not sent.cancelled():
        sent.exception()


def _agent(loop: WorkerLoop, kind: str) -> Callable[[Any], Awaitable[None]]:
    """The Faust agent of one input topic: a coroutine function of its stream."""

    async def consume(stream: Any) -> None:
        await loop.consume(kind, stream)

    consume.__name__ = f"{kind}_processor"
    return consume


def _relay(app: faust.App, settings: Settings, loop: WorkerLoop) -> TraceRelay | None:
    """The OTLP topic's agent, relaying finished requests to the requests topic."""
    name = settings.otlp_topic_name()
    if name is None:
        return None
    requests_topic = _topic(app, settings, "requests")

    async def send_requests(env: RequestsEnvelope) -> None:
        await requests_topic.send(key=env.service.encode(), value=encode(env))

    relay = TraceRelay(settings, loop, send_requests)
    otlp = app.topic(name, key_type=bytes, value_type=bytes, key_serializer="raw",
                     value_serializer="raw")  # fmt: skip

    async def consume(stream: Any) -> None:
        await relay.consume(stream)

    consume.__name__ = "otlp_processor"
    app.agent(otlp, name="ragwatch.otlp-processor")(consume)
    return relay
