"""``ragwatch notify``: from ``ragwatch.alerts`` to Slack, PagerDuty and webhooks, once.

One process (like Alertmanager): the workers publish every alert transition to
``ragwatch.alerts``; the notifier consumes it (consumer group ``<app_id>-notify``),
routes and groups the transitions (:mod:`ragwatch.streams.notifier.grouping`), mutes what silences
and inhibition rules say, writes each notification to the Redis outbox
(:mod:`ragwatch.streams.notifier.outbox`) and only then commits the consumer offsets; a sender
loop delivers due notifications through each receiver's sender, retrying with backoff
and dead-lettering what cannot be delivered.

Its clock is event time: the newest ``at`` of the alerts it has read, or the workers'
watermark in Redis if that is newer, advanced by the wall clock since it was seen. So
``group_wait: 30s`` means 30 s of telemetry, whether it is replayed at 720x or live.

The group state (which alerts each receiver has been told about) is saved in Redis
(``P:notify:groups``) with every batch, before the offsets are committed, so a restarted
notifier neither forgets to resolve what it paged for nor pages it again. If Redis loses
it, a running notifier saves it again (checked every second), and a notifier that starts
without it re-derives it from the alerts topic up to its committed offsets
(:mod:`~ragwatch.streams.notifier.rebuild`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp
import orjson
from confluent_kafka import KafkaException
from redis.exceptions import RedisError

from ragwatch.codec import decode_as
from ragwatch.config import Settings, redact_url
from ragwatch.errors import ConfigError, SchemaError
from ragwatch.kafka import KafkaClient
from ragwatch.kafka_admin import TOPIC_CHECK_S, MissingTopics, topic_ids
from ragwatch.outage import RedisTrouble
from ragwatch.schema import Alert
from ragwatch.silences import Silence, decode_all
from ragwatch.store import Keys, async_client
from ragwatch.streams.notifier.alertmanager import AlertmanagerForwarder, decode_active
from ragwatch.streams.notifier.delivery_stats import ReceiverStats
from ragwatch.streams.notifier.grouping import Grouper, GrouperStats
from ragwatch.streams.notifier.notification import Delivered, Failed, Outcome, Retry, Sender
from ragwatch.streams.notifier.outbox import Entry, Outbox
from ragwatch.streams.notifier.rebuild import committed_records
from ragwatch.streams.notifier.routing import NotifyConfig

log = logging.getLogger(__name__)

TICK_S = 0.2
BUSY_DEFER_S = 1.0  # a busy receiver's due notifications are looked at again after this
WATERMARK_EVERY_S = 1.0


class EventClock:
    """Event time that keeps moving: the newest mark, plus wall time since it was seen."""

    def __init__(self, wall: Callable[[], float] = time.monotonic) -> None:
        self._wall = wall
        self._mark: float | None = None
        self._seen = 0.0

    def observe(self, ts: float | None) -> None:
        if ts is not None and (self._mark is None or ts > self._mark):
            self._mark, self._seen = ts, self._wall()

    def now(self) -> float | None:
        return None if self._mark is None else self._mark + (self._wall() - self._seen)


@dataclass
class NotifierCounters:
    alerts_read: int = 0
    bad_records: int = 0
    queued: int = 0  # notifications written to the outbox
    duplicates: int = 0  # notifications already queued or delivered
    delivered: int = 0
    retried: int = 0
    dead: int = 0
    redis_errors: int = 0
    send_errors: int = 0  # unexpected errors in the delivery loop (logged with a traceback)
    rebuilt_from: int = 0  # alert transitions replayed to rebuild the groups Redis lost
    groups_rewritten: int = 0  # times the group state was found missing in Redis and saved


def sender_config(name: str, spec: Mapping[str, Any]) -> Any:
    """The checked config of one receiver of the notify config (a ConfigError names the
    bad field); nothing connects, so ``ragwatch notify`` checks every receiver first."""
    kind = spec.get("type")
    body = {k: v for k, v in spec.items() if k not in ("name", "type")}
    if kind == "webhook":
        from ragwatch.streams.notifier.webhook import WebhookConfig

        return WebhookConfig.from_mapping(name, body)
    if kind == "slack":
        from ragwatch.streams.notifier.slack import SlackConfig

        return SlackConfig.from_mapping(name, body)
    if kind == "pagerduty":
        from ragwatch.streams.notifier.pagerduty import PagerDutyConfig

        return PagerDutyConfig.from_mapping(name, body)
    raise ConfigError(f"receiver {name}: unknown type {kind!r}")


def make_sender(name: str, spec: Mapping[str, Any], session: aiohttp.ClientSession) -> Sender:
    """The sender for one receiver of the notify config."""
    from ragwatch.streams.notifier.pagerduty import PagerDutyConfig, PagerDutySender
    from ragwatch.streams.notifier.slack import SlackConfig, SlackSender
    from ragwatch.streams.notifier.webhook import WebhookConfig, WebhookSender

    config = sender_config(name, spec)
    if isinstance(config, WebhookConfig):
        return WebhookSender(config, session)
    if isinstance(config, SlackConfig):
        return SlackSender(config, session)
    assert isinstance(config, PagerDutyConfig)
    return PagerDutySender(config, session)


def consumer_kwargs(settings: Settings) -> dict[str, Any]:
    """aiokafka options for the settings' bootstrap servers and security."""
    return KafkaClient.of(settings).aiokafka()


class Notifier:
    """The notify loop; ``run`` until ``stop`` is set.

    ``clock`` (wall time, epoch seconds) schedules the outbox's retries and its retry
    floor; a test can run it faster than the wall clock to hold a receiver down for minutes.
    """

    def __init__(
        self,
        settings: Settings,
        config: NotifyConfig,
        *,
        senders: Mapping[str, Sender] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings, self.config = settings, config
        self._wall = clock
        self.keys = Keys(settings.redis_prefix)
        self.counters = NotifierCounters()
        self.deliveries: dict[str, ReceiverStats] = {}  # receiver -> outcomes, latency
        self.grouper = Grouper(config, external_url=settings.external_url)
        self.clock = EventClock()
        self.silences: list[Silence] = []
        self._senders = dict(senders or {})
        self._redis: Any = None
        self._redis_trouble = RedisTrouble(log, redact_url(settings.redis_url), prefix="notify: ")
        self.outbox: Outbox | None = None
        self._wake = asyncio.Event()  # set when a notification is queued: send it now
        self._sending: dict[str, asyncio.Task[None]] = {}  # receiver -> its send in flight
        self._done: set[str] = set()  # notifications sent since the last outbox read
        self._groups_unsaved = False  # the last save of the groups failed
        self._consumer: Any = None  # the alerts topic's aiokafka consumer, once started
        self.forward: AlertmanagerForwarder | None = None  # RAGWATCH_ALERTMANAGER_URLS

    # ---------------------------------------------------------------- the loops

    async def run(self, stop: asyncio.Event) -> None:
        from aiokafka import AIOKafkaConsumer

        async with contextlib.AsyncExitStack() as cleanup:  # whatever was opened, closed
            session = aiohttp.ClientSession()
            cleanup.push_async_callback(session.close)
            for name, spec in self.config.receivers.items():
                if name not in self._senders:
                    self._senders[name] = make_sender(name, spec, session)
            self._redis = async_client(self.settings.redis_url)
            cleanup.push_async_callback(self._redis.aclose)
            if self.settings.alertmanager_urls:
                self.forward = AlertmanagerForwarder(
                    self.settings.alertmanager_urls,
                    session,
                    external_url=self.settings.external_url,
                    resend_s=self.settings.alertmanager_resend,
                )
                await self._adopt_firing()
            self.outbox = Outbox(
                self._redis,
                self.keys,
                max_attempts=self.config.max_attempts,
                clock=self._wall,
                where=redact_url(self.settings.redis_url),
            )
            await self._restore()
            log.info(
                "notify: %d receiver(s): %s",
                len(self._senders),
                ", ".join(f"{n}={s.describe()}" for n, s in self._senders.items()) or "none",
            )
            # what the outbox holds goes out at once: a restarted notifier does not wait
            # for its consumer group (seconds) or a broker that is down
            sender = asyncio.create_task(self._send_loop(stop))
            watcher = asyncio.create_task(self._watch_topic(stop))
            cleanup.callback(watcher.cancel)
            try:
                consumer = AIOKafkaConsumer(
                    self.settings.topic("alerts"),
                    group_id=f"{self.settings.app_id}-notify",
                    enable_auto_commit=False,
                    auto_offset_reset="earliest",
                    session_timeout_ms=int(self.settings.kafka_session_timeout * 1000),
                    heartbeat_interval_ms=int(
                        min(3.0, self.settings.kafka_session_timeout / 3) * 1000
                    ),
                    fetch_max_wait_ms=self.settings.kafka_fetch_max_wait_ms,
                    **consumer_kwargs(self.settings),
                )
                await consumer.start()
                cleanup.push_async_callback(consumer.stop)
                self._consumer = consumer
                await self._consume_loop(consumer, stop)
            finally:
                stop.set()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(sender, 10.0)

    async def _watch_topic(self, stop: asyncio.Event) -> None:
        """Say once when the alerts topic goes missing (a broker restarted empty, a topic
        deleted) and once when it is back: nothing is paged meanwhile, and without this
        line nothing would say why. A worker re-creates the topics it owns; the notifier
        then reads the new topic from its start (:meth:`_rewind`)."""
        topic = self.settings.topic("alerts")
        said = MissingTopics(
            log, "nothing is paged until a worker creates it again", "reading it from its start"
        )
        known: str | None = None  # the topic's id when last seen
        while not stop.is_set():
            try:
                ids = await asyncio.to_thread(topic_ids, self.settings, [topic], command="notify")
            except ConfigError:  # the broker does not answer: the consumer says so
                ids = {}
            if topic in ids:
                now = ids[topic]
                _, back = said.update([topic], [] if now is not None else [topic])
                if back or (now and known and now != known):
                    if not back:
                        log.warning("topic %s was re-created since the last check", topic)
                    await self._rewind(topic)
                known = now or known
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), TOPIC_CHECK_S)

    async def _rewind(self, topic: str) -> None:
        """Read a re-created topic from offset 0: the consumer would resume it at the old
        topic's committed offset and skip as many alerts as it had read before (what it
        reads again is deduplicated by the outbox)."""
        consumer = self._consumer
        if consumer is None:
            return
        tps = [tp for tp in consumer.assignment() if tp.topic == topic]
        if not tps:  # not assigned yet: the group starts it from the earliest offset
            return
        from aiokafka.errors import KafkaError

        try:
            await consumer.seek_to_beginning(*tps)
            await consumer.commit({tp: 0 for tp in tps})
        except KafkaError as exc:  # a rebalance meanwhile: the next owner reads from 0
            log.warning("notify: could not rewind the re-created %s: %s", topic, exc)

    async def _consume_loop(self, consumer: Any, stop: asyncio.Event) -> None:
        last_watermark = last_status = 0.0
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=int(TICK_S * 1000), max_records=500)
            changed = False
            for records in batch.values():
                for rec in records:
                    changed |= self._take(rec.value)
            wall = time.monotonic()
            await self._refresh_silences()  # every tick: an expired silence takes effect at once
            if wall - last_watermark >= WATERMARK_EVERY_S:
                last_watermark = wall
                await self._observe_workers()
            now = self.clock.now()
            queued = False
            if now is not None:
                for n in self.grouper.flush(now, silenced=self._silenced):
                    queued |= await self._queue(n)
            if changed or queued:
                await self._save_groups()
            if batch:
                await consumer.commit()
            if self.forward is not None:
                await self.forward.flush()
            if wall - last_status >= 1.0:
                last_status = wall
                await self._keep_groups()
                await self._write_status()

    def _take(self, value: bytes | None) -> bool:
        self.counters.alerts_read += 1
        try:
            alert = decode_as(Alert, value or b"")
        except SchemaError as exc:
            self.counters.bad_records += 1
            log.warning("notify: unreadable record on the alerts topic: %s", exc.reason)
            return False
        self.clock.observe(alert.at if alert.at is not None else alert.ends_at or alert.starts_at)
        if self.forward is not None:
            self.forward.observe(alert)
        now = self.clock.now()
        self.grouper.add(alert, now if now is not None else alert.starts_at)
        return True

    async def _queue(self, n: Any) -> bool:
        assert self.outbox is not None
        try:
            if await self.outbox.put(n):
                self.counters.queued += 1
                self._wake.set()
                log.info(
                    "notify: queued %s for %s (%s, %d alert(s))",
                    n.status,
                    n.receiver,
                    n.reason,
                    len(n.alerts),
                )
                return True
            self.counters.duplicates += 1
        except RedisError as exc:
            self._redis_failed("queue a notification", exc)
        return False

    async def _send_loop(self, stop: asyncio.Event) -> None:
        assert self.outbox is not None
        while not stop.is_set():
            self._done.clear()
            try:
                due = await self.outbox.due()
            except RedisError as exc:
                self._redis_failed("read the outbox", exc)
                due = []
            started = await self._dispatch([e for e in due if e.notification.key not in self._done])
            if not started:  # until the next tick, a queued notification or a send's end
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), TICK_S)
                self._wake.clear()
        await self._drain()

    async def _dispatch(self, due: list[Entry]) -> bool:
        """Each receiver is sent its due notifications by a task of its own, one send at a
        time: a receiver that hangs until its timeout delays only itself. What comes due
        for a busy receiver waits (deferred, not retried). Returns whether a send began."""
        assert self.outbox is not None
        by_receiver: dict[str, list[Entry]] = {}
        for e in due:
            by_receiver.setdefault(e.notification.receiver, []).append(e)
        waiting: list[Entry] = []
        for name, entries in by_receiver.items():
            if name in self._sending:
                waiting += entries
                continue
            task = asyncio.create_task(self._deliver_logged(name, entries))
            self._sending[name] = task
            task.add_done_callback(functools.partial(self._sent, name))
        if waiting:
            try:
                await self.outbox.defer(waiting, BUSY_DEFER_S)
            except RedisError as exc:
                self._redis_failed("defer notifications", exc)
        return len(waiting) < len(due)

    def _sent(self, name: str, _task: asyncio.Task[None]) -> None:
        self._sending.pop(name, None)
        self._wake.set()  # its next notifications may go now

    async def _deliver_logged(self, name: str, entries: list[Entry]) -> None:
        try:
            await self._deliver(name, entries)
        except Exception:  # a bug must not stop delivery to this receiver for good
            self.counters.send_errors += 1
            log.exception("notify: delivering to %s failed", name)
        finally:  # a due() read while it ran may still hold them: not to be sent again
            self._done.update(e.notification.key for e in entries)

    async def _drain(self, timeout_s: float = 5.0) -> None:
        """On stop: let the sends in flight finish (briefly), then cancel them (what they
        held stays in the outbox and goes after the restart)."""
        tasks = list(self._sending.values())
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout_s)
            for t in pending:
                t.cancel()

    async def _deliver(self, name: str, entries: list[Entry]) -> None:
        assert self.outbox is not None
        sender = self._senders.get(name)
        if sender is None:
            for e in entries:
                await self.outbox.dead(e, f"receiver {name!r} is not configured any more")
                self.counters.dead += 1
            return
        stats = self.deliveries.setdefault(name, ReceiverStats())
        settled: set[int] = set()

        async def settle(i: int, outcome: Outcome) -> None:
            settled.add(i)
            await self._settle(name, entries[i], outcome, stats)

        # each answer is recorded as soon as it is known: a crash between two sends of a
        # batch re-sends at most the one in flight, not the whole batch
        outcomes = await sender.send([e.notification for e in entries], settle)
        for i, (e, outcome) in enumerate(zip(entries, outcomes, strict=True)):
            if i not in settled:  # the rest of a batch a Retry stopped, a Slack digest
                await self._settle(name, e, outcome, stats)

    async def _settle(self, name: str, e: Entry, outcome: Outcome, stats: ReceiverStats) -> None:
        """Record one answer in the outbox: delivered (marked at once), retried or dead."""
        assert self.outbox is not None
        try:
            if isinstance(outcome, Delivered):
                await self.outbox.delivered(e)
                self.counters.delivered += 1
                stats.delivered_after(self._wall() - e.first_at)
                log.info("notify: delivered %s to %s", e.notification.status, name)
            elif isinstance(outcome, Retry):
                if await self.outbox.retry(e, outcome.reason, outcome.after_s):
                    self.counters.retried += 1
                    stats.retried += 1
                    log.info("notify: %s will retry (%s)", name, outcome.reason)
                else:
                    self.counters.dead += 1
                    stats.failed += 1
                    log.error(
                        "notify: %s gave up on %s: %s", name, e.notification.key, outcome.reason
                    )
            elif isinstance(outcome, Failed):
                await self.outbox.dead(e, outcome.reason)
                self.counters.dead += 1
                stats.failed += 1
                log.error("notify: %s refused %s: %s", name, e.notification.key, outcome.reason)
        except RedisError as exc:
            self._redis_failed("record a delivery", exc)

    # ---------------------------------------------------------------- state

    async def _adopt_firing(self) -> None:
        """The alerts firing now (Redis), for Alertmanager: resent after a restart."""
        assert self.forward is not None
        try:
            active = await self._redis.hvals(self.keys.active)
        except RedisError as exc:
            self._redis_failed("read the active alerts", exc)
            return
        self.forward.adopt(decode_active(active))

    def _silenced(self, alert: Alert) -> bool:
        wall = time.time()
        return any(s.active(wall) and s.matches(alert.labels) for s in self.silences)

    async def _refresh_silences(self) -> None:
        try:
            self.silences = decode_all(await self._redis.hgetall(self.keys.silences))
        except RedisError as exc:
            self._redis_failed("read silences", exc)
            return
        self._redis_trouble.answered()  # read every tick: says at once when Redis is back

    async def _observe_workers(self) -> None:
        """The workers' event-time watermark moves the clock when no alert does."""
        try:
            raw = await self._redis.hvals(self.keys.workers)
        except RedisError as exc:
            self._redis_failed("read worker watermarks", exc)
            return
        marks = [orjson.loads(v).get("watermark") for v in raw]
        self.clock.observe(max((m for m in marks if isinstance(m, int | float)), default=None))

    @property
    def _groups_key(self) -> str:
        return f"{self.keys.notifier}:groups"

    async def _save_groups(self) -> None:
        try:
            await self._redis.set(self._groups_key, self.grouper.dumps())
        except RedisError as exc:
            self._groups_unsaved = True  # tried again every second
            self._redis_failed("save groups", exc)
            return
        self._groups_unsaved = False
        self._redis_trouble.wrote()

    async def _restore(self) -> None:
        """The groups saved in Redis; if there are none (a first start, or Redis lost
        them), the groups re-derived from the alerts topic (:mod:`.rebuild`)."""
        try:
            data = await self._redis.get(self._groups_key)
        except RedisError as exc:
            self._redis_failed("restore groups", exc)
            return
        if data:
            n = self.grouper.loads(data)
            log.info("notify: restored %d alert group(s) from Redis", n)
            return
        await self._refresh_silences()
        await self._rebuild()

    async def _rebuild(self) -> None:
        """Feed the grouper what the notifier's group has consumed from the alerts topic,
        in event time, dropping the notifications it makes: they were queued before."""
        clock = EventClock()
        topic = self.settings.topic("alerts")

        def take(value: bytes | None) -> None:
            try:
                alert = decode_as(Alert, value or b"")
            except SchemaError:
                return  # counted when it was first read
            clock.observe(alert.at if alert.at is not None else alert.starts_at)
            now = clock.now() or alert.starts_at
            self.grouper.add(alert, now)
            self.grouper.flush(now, silenced=self._silenced)

        try:
            n = await asyncio.to_thread(
                committed_records,
                self.settings.kafka_config(),
                topic,
                f"{self.settings.app_id}-notify",
                take,
            )
        except (KafkaException, TimeoutError) as exc:
            log.error(
                "notify: no group state in Redis and the alerts topic could not be read to "
                "rebuild it (%s): resolutions of alerts paged before are dropped",
                exc,
            )
            return
        self.grouper.stats = GrouperStats()  # the replay is not news
        self.counters.rebuilt_from = n
        if n:
            log.warning(
                "notify: no group state in Redis (Redis lost it?): rebuilt %d group(s) from "
                "%d alert transition(s) on %s up to the committed offsets",
                len(self.grouper.groups),
                n,
                topic,
            )
            await self._save_groups()

    async def _keep_groups(self) -> None:
        """Save the groups again if Redis has lost them while the notifier runs (restarted
        empty, flushed): a notifier restarted later would not know what it paged for."""
        if self._groups_unsaved:  # the last save failed: not lost, only not written yet
            await self._save_groups()
            return
        try:
            if not self.grouper.groups or await self._redis.exists(self._groups_key):
                return
        except RedisError as exc:
            self._redis_failed("check the saved groups", exc)
            return
        self.counters.groups_rewritten += 1
        log.warning("notify: the group state was missing in Redis (Redis lost it?): saved again")
        await self._save_groups()

    async def _write_status(self) -> None:
        stats = {
            **asdict(self.counters),
            **{f"groups_{k}": v for k, v in asdict(self.grouper.stats).items()},
            "groups": len(self.grouper.groups),
            "receivers": {n: asdict(s.stats) for n, s in self._senders.items()},
            "deliveries": {n: asdict(s) for n, s in self.deliveries.items()},
        }
        if self.forward is not None:
            stats["alertmanager"] = asdict(self.forward.stats)
        try:
            await self._redis.hset(
                self.keys.notifier,
                mapping={"counters": orjson.dumps(stats), "seen": orjson.dumps(time.time())},
            )
        except RedisError as exc:
            self._redis_failed("write status", exc)
            return
        self._redis_trouble.wrote()

    def _redis_failed(self, what: str, exc: Exception) -> None:
        self.counters.redis_errors += 1
        self._redis_trouble.failed(what, exc)  # the first at once, then one line per 30 s
