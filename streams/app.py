"""The Faust app: ``ragwatch.gpu`` -> GpuPipeline, ``ragwatch.requests`` -> RequestPipeline,
``ragwatch.events`` -> EventPipeline and ``ragwatch.metrics`` -> MetricsPipeline, all ->
root-cause hints (streams/hints.py) -> the alerts topic and Redis. ``ragwatch notify``
(streams/notifier.py) delivers from the alerts topic.

No app exists at import time: :func:`build_app` creates one from :class:`Settings` and
registers the processors. Topics carry raw bytes; :mod:`ragwatch.codec` decodes them. A
message that fails validation goes to ``ragwatch.deadletter`` (value = the original bytes,
headers = source topic, partition, offset and the reason) and is counted; it never stops
the partition.
"""

from __future__ import annotations

import asyncio
import logging
import math
import operator
import os
import socket
import ssl
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import faust
import mode
from redis.exceptions import RedisError

from ragwatch.codec import decode_as, decode_gpu_wire, encode
from ragwatch.config import Settings, redact_url
from ragwatch.errors import SchemaError
from ragwatch.schema import (
    DLQ_HEADER_OFFSET,
    DLQ_HEADER_PARTITION,
    DLQ_HEADER_REASON,
    DLQ_HEADER_TOPIC,
    Alert,
    EventEnvelope,
    MetricsEnvelope,
    RequestsEnvelope,
)
from ragwatch.streams.acks import HeldAcks
from ragwatch.streams.engine import Transition
from ragwatch.streams.marks import SweepMarks
from ragwatch.streams.outage import OutageLog
from ragwatch.streams.pipelines import Pipelines
from ragwatch.streams.rules import load_rules
from ragwatch.streams.series import SeriesRecorder, owner_prefixes
from ragwatch.streams.snapshot import (
    SnapshotError,
    dump_host,
    dump_service,
    load_host,
    load_service,
)
from ragwatch.streams.state import RedisState, async_client
from ragwatch.streams.transport import RagwatchApp

log = logging.getLogger(__name__)


def faust_credentials(settings: Settings) -> Any:
    """Kafka security settings as Faust/aiokafka credentials (None for PLAINTEXT)."""
    proto = settings.kafka_security_protocol
    if proto == "PLAINTEXT":
        return None
    ctx = ssl.create_default_context(
        cafile=str(settings.kafka_ssl_cafile) if settings.kafka_ssl_cafile else None
    )
    if proto == "SSL":
        return faust.SSLCredentials(ctx)
    return faust.SASLCredentials(
        username=settings.kafka_sasl_username,
        password=settings.kafka_sasl_password.get(),
        mechanism=settings.kafka_sasl_mechanism,
        ssl_context=ctx if proto == "SASL_SSL" else None,
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


class Delivery(mode.Service):
    """Owns the Redis client; publishes every transition to the alerts topic (which
    ``ragwatch notify`` delivers) and records it in Redis."""

    def __init__(self, settings: Settings, worker_id: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings = settings
        self.worker_id = worker_id
        self.counters = WorkerCounters()
        self.redis = async_client(settings.redis_url)
        self.redis_down_since: float | None = None
        self._redis_outage = OutageLog(log, "Redis", redact_url(settings.redis_url))
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
            await alerts_topic.send(key=a.fingerprint.encode(), value=encode(a))
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
            first = await self.store.claim_notification(a)
        except RedisError as exc:
            self._redis_failed("claim notification", exc)
            return True
        if not first:
            self.counters.duplicate_notifications += 1
            log.info("alert %s %s was published before a restart: not again", a.rule, a.status)
        return first

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
            await self.store.write_hosts(
                {
                    h: {**gpus.host_snapshot(h), "engines": pipes.metrics.engine_snapshot(h)}
                    for h in hosts
                }
            )
            await self.store.write_services({s: requests.service_snapshot(s) for s in services})
            await self.store.write_worker(
                self.worker_id,
                {
                    **asdict(self.counters),
                    **asdict(gpus.stats),
                    **{f"requests_{k}": v for k, v in asdict(requests.stats).items()},
                    **{f"events_{k}": v for k, v in asdict(pipes.events.stats).items()},
                    **{f"metrics_{k}": v for k, v in asdict(pipes.metrics.stats).items()},
                    "series": len(gpus.series) + len(requests.series) + len(pipes.metrics.series),
                    "alert_flaps": sum(pipes.engine.flaps.values()),
                    "watermark": pipes.watermark,
                },
            )
            if self.redis_down_since is not None:
                await self._recovered(pipes)
        except RedisError as exc:
            self._redis_failed("write status", exc)

    def _redis_failed(self, what: str, exc: Exception) -> None:
        self.counters.redis_errors += 1
        if self.redis_down_since is None:
            self.redis_down_since = time.monotonic()
        self._redis_outage.failed(what, exc)  # the first at once, then one line per 30 s

    async def _recovered(self, pipes: Pipelines) -> None:
        """Redis answers again: rewrite this worker's active alerts (a restarted Redis is
        empty; one that was only unreachable missed the transitions in between)."""
        assert self.redis_down_since is not None
        async with self._active_lock:  # the engine's state as of the write, not before
            active = pipes.engine.active
            await self.store.rewrite_active(active, self._resolved_while_down - set(active))
        self.store.forget_index()
        self._redis_outage.recovered(
            f": rewrote {len(active)} active alert(s), removed "
            f"{len(self._resolved_while_down)} resolved"
        )
        self.redis_down_since = None
        self._resolved_while_down.clear()


# What the key of each input topic names: snapshots, acks and rebalances go by it.
DOMAIN = {"gpu": "host", "events": "host", "metrics": "host", "requests": "service"}

# A partition nothing was read from for this long (wall seconds) does not hold back the
# silence sweeps: its hosts stopped sending, or it has none.
IDLE_PARTITION_S = 30.0


def build_app(settings: Settings, *, worker_id: str | None = None) -> faust.App:
    """A configured Faust app with the GPU processor registered."""
    worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}"
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
    register_processors(app, settings, Pipelines(rules, max_series=settings.max_series), delivery)
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
) -> None:
    """One agent per input topic, sharing the decode / dead-letter / deliver loop."""
    alerts_topic = _topic(app, settings, "alerts")
    dlq_topic = _topic(app, settings, "deadletter")
    dirty: dict[str, set[str]] = {
        "gpu": set(),
        "requests": set(),
        "events": set(),
        "metrics": set(),
    }
    known: dict[str, set[str]] = {"host": set(), "service": set()}  # restored or fresh
    recorder = SeriesRecorder()
    held = HeldAcks()
    busy: Counter[tuple[str, str]] = Counter()  # messages of a key being processed and sent
    partitions: dict[tuple[str, str], set[Any]] = {}  # (domain, key) -> the TPs it came on
    assigned: set[Any] = set()
    # per input partition: the newest event time read, for the pipelines' sweep marks
    marks = SweepMarks(idle_s=IDLE_PARTITION_S)
    sweepers: dict[str, Any] = {
        "gpu": pipes.gpus,
        "requests": pipes.requests,
        "metrics": pipes.metrics,
    }
    for p in sweepers.values():
        p.sweep_mark = -math.inf  # no silence sweeps before the first marks are known

    async def dead_letter(msg: Any, reason: str, value: bytes) -> None:
        delivery.counters.deadletter += 1
        log.warning(
            "dead-letter %s[%d] offset=%d: %s", msg.topic, msg.partition, msg.offset, reason
        )
        await dlq_topic.send(
            key=msg.key,
            value=value,
            headers={
                DLQ_HEADER_TOPIC: msg.topic.encode(),
                DLQ_HEADER_PARTITION: str(msg.partition).encode(),
                DLQ_HEADER_OFFSET: str(msg.offset).encode(),
                DLQ_HEADER_REASON: reason.encode(),
            },
        )

    def processor(
        kind: str,
        decode: Callable[[bytes], Any],
        key: Callable[[Any], str],
        newest: Callable[[Any], float],
        process: Callable[[Any], list[Transition]],
    ) -> Any:
        domain = DOMAIN[kind]
        counters = delivery.counters
        seen, changed = known[domain], dirty[kind]

        async def consume(stream: Any) -> None:
            stream = stream.noack()  # acked once the snapshot holds it (streams.acks)
            async for event in stream.events():
                msg = event.message
                counters.messages += 1
                raw = msg.value or b""
                h = held.add(msg.tp, stream, event)  # its place in the partition's acks
                try:
                    env = decode(raw)
                except SchemaError as exc:
                    await dead_letter(msg, exc.reason, raw)
                    await held.release([h])
                    continue
                except Exception as exc:  # a decoder bug must not stall the partition either
                    log.exception("decoding failed %s[%d]", msg.topic, msg.partition)
                    await dead_letter(msg, f"internal error: {type(exc).__name__}: {exc}", raw)
                    await held.release([h])
                    continue
                ts = newest(env)
                ahead = ts - time.time()
                if ahead > settings.max_clock_skew:
                    # event time drives windows, sweeps and `for:`: one envelope from a host
                    # with a wrong clock would close every open bucket and age every alert
                    await dead_letter(
                        msg,
                        f"ts: {ahead:,.0f} s ahead of this worker's clock "
                        f"(RAGWATCH_MAX_CLOCK_SKEW={settings.max_clock_skew:g})",
                        raw,
                    )
                    await held.release([h])
                    continue
                marks.read(msg.topic, msg.partition, ts)
                k = key(env)
                busy[(domain, k)] += 1  # no snapshot of k until its transitions are sent
                try:
                    if k not in seen:
                        seen.add(k)
                        await delivery.restore(pipes, domain, k)
                    partitions.setdefault((domain, k), set()).add(msg.tp)
                    try:
                        started = time.perf_counter()
                        transitions = process(env)
                        took = time.perf_counter() - started
                        if took > settings.slow_message:  # every partition waited this long
                            counters.slow_messages += 1
                            log.warning(
                                "slow message %s[%d] offset=%d key=%s: %.1f s",
                                msg.topic,
                                msg.partition,
                                msg.offset,
                                k,
                                took,
                            )
                    except Exception as exc:  # a bug must not stall the partition
                        log.exception("processing failed %s key=%s", kind, k)
                        await dead_letter(msg, f"internal error: {type(exc).__name__}: {exc}", raw)
                        await held.release([h])
                        continue
                    changed.add(k)
                    for t in transitions:
                        await delivery.send(t, alerts_topic)
                    held.hold((domain, k), h)
                finally:
                    busy[(domain, k)] -= 1

        consume.__name__ = f"{kind}_processor"
        return consume

    def record_key(env: Any) -> str:
        return str(env.key)

    def record_ts(env: Any) -> float:
        return float(env.ts)

    def gpu_ts(env: dict[str, Any]) -> float:
        return float(env["ts"])

    def requests_ts(env: RequestsEnvelope) -> float:
        return max((r.ts for r in env.records), default=env.ts)

    # GPU envelopes stay plain dicts (decode_gpu_wire validates them as strictly):
    # building ~90 frozen records per host envelope cost more than the analysis.
    app.agent(_topic(app, settings, "gpu"), name="ragwatch.gpu-processor")(
        processor("gpu", decode_gpu_wire, operator.itemgetter("host"), gpu_ts, pipes.gpu_wire)
    )
    app.agent(_topic(app, settings, "events"), name="ragwatch.events-processor")(
        processor("events", partial(decode_as, EventEnvelope), record_key, record_ts, pipes.event)
    )
    app.agent(_topic(app, settings, "requests"), name="ragwatch.requests-processor")(
        processor(
            "requests", partial(decode_as, RequestsEnvelope), record_key, requests_ts, pipes.request
        )
    )
    app.agent(_topic(app, settings, "metrics"), name="ragwatch.metrics-processor")(
        processor(
            "metrics", partial(decode_as, MetricsEnvelope), record_key, record_ts, pipes.metric
        )
    )

    # Snapshots (~1.4 KB and ~20 us of pickling per GPU series) of a changed host or service
    # are rewritten once it is snapshot_interval seconds since its last one, spread over the
    # interval (at most 2x the average rate per tick): writing every host in the same tick
    # held the event loop long enough to show in the alerts' latency.
    snap_due: set[tuple[str, str]] = set()
    snap_at: dict[tuple[str, str], float] = {}

    def snapshots_due(now: float) -> list[tuple[str, str]]:
        interval = settings.snapshot_interval
        due = sorted(
            (k for k in snap_due if now - snap_at.get(k, -math.inf) >= interval and not busy[k]),
            key=lambda k: snap_at.get(k, -math.inf),
        )
        budget = max(8, math.ceil(2 * max(len(snap_at), len(snap_due)) / interval))
        return due[:budget]

    @app.on_partitions_assigned.connect  # type: ignore[untyped-decorator, arg-type]
    async def forget_revoked(app: Any, assigned_now: set[Any], **kwargs: Any) -> None:
        """Hosts and services of partitions this worker lost: drop their state and held
        acks. The new owner restores their snapshots and reads what came after; if they
        come back here, they are restored from the snapshot again, not from stale memory."""
        lost = assigned - set(assigned_now)
        assigned.clear()
        assigned.update(assigned_now)
        # Faust reads every partition it keeps again from its committed offset: those
        # messages get their places in the queues again
        n = held.reset()
        if not lost:
            return
        gone = [k for k, tps in partitions.items() if tps & lost]
        for domain, k in gone:
            del partitions[(domain, k)]
            pipes.forget(domain, k)
            known[domain].discard(k)
            snap_due.discard((domain, k))
            snap_at.pop((domain, k), None)
            for kind, d in dirty.items():
                if DOMAIN[kind] == domain:
                    d.discard(k)
        marks.forget((tp.topic, tp.partition) for tp in lost)
        log.info(
            "rebalance: %d partition(s) gone to other workers: forgot %d host(s)/service(s) "
            "and %d unsnapshotted message(s) (the new owner reads them again)",
            len(lost),
            len(gone),
            n,
        )

    def sweep_marks() -> None:
        """Each pipeline sweeps silent hosts/services against the slowest of its topic's
        partitions (one read from in the last IDLE_PARTITION_S): after a restart or a
        rebalance, partitions are caught up at different paces, and one read far ahead
        must not make the hosts of another look silent and resolve their alerts."""
        for kind, pipeline in sweepers.items():
            # nothing read from the topic lately: keep the last mark (no sweep runs meanwhile)
            pipeline.sweep_mark = marks.mark(settings.topic(kind), default=pipeline.sweep_mark)

    async def snapshot(batch: list[tuple[str, str]], now: float) -> bool:
        """Write the snapshots of ``batch``, then ack the messages they hold."""
        taken = held.take(batch)  # before the snapshots: everything taken is in them
        written = False
        try:
            written = await delivery.write_snapshots(
                pipes,
                {k for d, k in batch if d == "host"},
                {k for d, k in batch if d == "service"},
            )
        finally:
            if not written:
                held.give_back(taken)
        if not written:
            return False
        for k in batch:
            snap_at[k] = now
            snap_due.discard(k)
        await held.ack(taken)
        return True

    @app.on_before_shutdown.connect  # type: ignore[untyped-decorator, arg-type]
    async def snapshot_everything(app: Any, **kwargs: Any) -> None:
        """A clean stop snapshots every changed host and service, so its last offsets are
        committed and the next start carries on from there."""
        for kind, d in dirty.items():
            snap_due.update((DOMAIN[kind], k) for k in d)
        idle = sorted(k for k in snap_due if not busy[k])  # mid-send: read again at start
        if idle and not delivery.closed:
            await snapshot(idle, time.monotonic())

    async def prune_gone() -> None:
        """Hosts and services that went silent and were swept: forget them here (their
        held acks go: nothing is left to snapshot) and delete their state in Redis."""
        hosts, services = pipes.gone()
        if not hosts and not services:
            return
        keys = [("host", h) for h in hosts] + [("service", s) for s in services]
        for key in keys:
            known[key[0]].discard(key[1])
            partitions.pop(key, None)
            snap_due.discard(key)
            snap_at.pop(key, None)
        for kind, d in dirty.items():
            d -= hosts if DOMAIN[kind] == "host" else services
        await held.ack(held.take(keys))
        prefixes = owner_prefixes(hosts, services)
        recorder.forget(prefixes)
        await delivery.prune(hosts, services, prefixes)

    @app.timer(1.0)  # type: ignore[untyped-decorator]
    async def write_status() -> None:
        if delivery.closed:
            return
        await prune_gone()
        hosts = dirty["gpu"] | dirty["metrics"]
        event_hosts, services = set(dirty["events"]), set(dirty["requests"])
        for d in dirty.values():
            d.clear()
        if delivery.redis_down_since is not None:
            # until a write succeeds, write everything: a restarted Redis is empty
            hosts |= known["host"]
            services |= known["service"]
        snap_due.update(("host", h) for h in hosts | event_hosts)
        snap_due.update(("service", s) for s in services)
        sweep_marks()
        await delivery.write_status(pipes, hosts, services)
        await delivery.write_series(recorder.collect(pipes, hosts, services))
        now = time.monotonic()
        batch = snapshots_due(now)
        if batch:
            await snapshot(batch, now)
        if held.over():
            log.warning(
                "%d messages read wait for snapshots (Redis away, or snapshots not keeping "
                "up): committing their offsets anyway (a crash now loses their effect)",
                len(held),
            )
            await held.release_all()
