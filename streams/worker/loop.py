"""The worker's loop: every input message, every rebalance, every tick, as one object.

:class:`WorkerLoop` holds the state the worker keeps beside its pipelines (which hosts and
services changed, which are known, which are mid-send, the partitions each came on, the
sweep marks, the snapshot schedule, the held acks, the chart recorder) and the four things
that change it: :meth:`~WorkerLoop.handle` (one message), :meth:`~WorkerLoop.assigned` (a
rebalance), :meth:`~WorkerLoop.tick` (every second) and :meth:`~WorkerLoop.stop` (a clean
shutdown). Faust only feeds it (:func:`ragwatch.streams.worker.app.register_processors`);
a test can feed it an in-memory stream. A topic whose pipeline has a batch seam (GPU
telemetry: :meth:`~ragwatch.streams.pipelines.fleet.Pipelines.gpu_batch`) is handled a
batch at a time (:meth:`~WorkerLoop.handle_batch`): the messages Faust has at hand, up to
``MAX_BATCH``, in the same order and with the same checkpoints as one at a time.

Checkpoint order (what is written before which offset is acked; the acks are
:mod:`ragwatch.streams.worker.acks`'s):

1. a message is decoded, checked and processed; its transitions are sent to the alerts
   topic (and Redis) *before* its ack is held behind its host's or service's snapshot;
   a message that fails anywhere is dead-lettered and its ack released at once, in order;
2. while a key has messages mid-send (``busy``), no snapshot of it is taken;
3. every tick, the snapshots that are due are written first, and only then are the acks
   they cover released (so a committed offset never runs ahead of the state that holds
   it); a snapshot that fails gives its acks back;
4. a rebalance forgets the lost partitions' hosts and services and every held ack, and
   the messages read into a batch and not handled yet (Faust reads what it keeps again
   from the committed offsets);
5. a clean stop snapshots everything changed and idle, so its offsets are committed.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol

from ragwatch.chart_ids import owner_prefixes
from ragwatch.config import Settings
from ragwatch.errors import SchemaError
from ragwatch.outage import RedisTrouble
from ragwatch.schema import (
    DLQ_HEADER_OFFSET,
    DLQ_HEADER_PARTITION,
    DLQ_HEADER_REASON,
    DLQ_HEADER_TOPIC,
    Transition,
)
from ragwatch.streams.pipelines.base import BatchFailed, ChartReader, Domain
from ragwatch.streams.pipelines.charts import SeriesRecorder
from ragwatch.streams.pipelines.fleet import Pipelines
from ragwatch.streams.worker.acks import HeldAcks
from ragwatch.streams.worker.batches import MAX_BATCH, Read, describe, largest, more_at_hand
from ragwatch.streams.worker.facts_feed import FactsFeed
from ragwatch.streams.worker.marks import SweepMarks
from ragwatch.streams.worker.stall import CommitStall
from ragwatch.streams.worker.topics import InputTopic, Key, input_topics

log = logging.getLogger(__name__)

# A partition nothing was read from for this long (wall seconds) does not hold back the
# silence sweeps: its hosts stopped sending, or it has none.
IDLE_PARTITION_S = 30.0


class Delivery(Protocol):
    """What the loop needs of the worker's Redis side (``app.Delivery``)."""

    closed: bool
    redis_down_since: float | None
    redis_trouble: RedisTrouble  # why the last Redis command failed, for a stall's log line

    async def restore(self, pipes: Pipelines, domain: str, key: str) -> None: ...
    async def write_snapshots(
        self, pipes: Pipelines, hosts: set[str], services: set[str]
    ) -> bool: ...
    async def write_status(self, pipes: Pipelines, hosts: set[str], services: set[str]) -> None: ...
    async def write_series(self, points: Any) -> None: ...
    async def prune(self, hosts: set[str], services: set[str], prefixes: Any) -> None: ...


SendAlert = Callable[[Transition], Awaitable[None]]
SendDeadLetter = Callable[[Any, bytes, dict[str, bytes]], Awaitable[None]]  # key, value, headers


class WorkerLoop:
    """The per-message loop, rebalances, the snapshot schedule and the tick (see the module
    docstring for the checkpoint order)."""

    def __init__(
        self,
        settings: Settings,
        pipes: Pipelines,
        delivery: Delivery,
        counters: Any,
        *,
        send_alert: SendAlert,
        send_dead_letter: SendDeadLetter,
        facts: FactsFeed | None = None,
    ) -> None:
        """``facts``: the worker's side of the facts topic (None: hints see this worker's
        state only, as in a test of one worker)."""
        self.settings = settings
        self.pipes = pipes
        self.delivery = delivery
        self.counters = counters
        self._send_alert, self._send_dead_letter = send_alert, send_dead_letter
        self.topics = {t.kind: t for t in input_topics(pipes)}
        self.dirty: dict[str, set[str]] = {kind: set() for kind in self.topics}
        self.known: dict[Domain, set[str]] = {"host": set(), "service": set()}
        self.recorder = SeriesRecorder(pipes.rules)
        self.facts = facts
        self.done_up_to: dict[str, float] = {}  # gpu, requests -> event time processed
        # partitions assigned last, not read since and not known to be empty (the app
        # finds those at their high watermark: found_empty), by when they became so (the
        # assignment, or messages coming to one found empty): hints wait for them
        # (read_up_to)
        self.unread: dict[Any, float] = {}
        # partitions assigned last that were found empty, nothing read from them since:
        # their high watermark then (once it moves on, what came is unread: came)
        self.empty: dict[Any, int] = {}
        pipes.tap(self._observe)
        self.held = HeldAcks()
        self.stall = CommitStall(log)
        self.busy: Counter[Key] = Counter()  # messages of a key being processed and sent
        self.partitions: dict[Key, set[Any]] = {}  # (domain, key) -> the TPs it came on
        self.assigned_tps: set[Any] = set()
        self.rebalances = 0  # a batch read across one is dropped: Faust reads it again
        # per input partition: the newest event time read, for the pipelines' sweep marks
        self.marks = SweepMarks(idle_s=IDLE_PARTITION_S)
        # snapshots of a changed key are rewritten once it is snapshot_interval seconds
        # since its last one, spread over the interval (at most 2x the average rate per
        # tick): writing every host in the same tick held the event loop long enough to
        # show in the alerts' latency
        self.snap_due: set[Key] = set()
        self.snap_at: dict[Key, float] = {}
        # the status of a changed key is rewritten once it is status_interval seconds since
        # its last one (a key read many times a second, as in a catch-up, costs one write)
        self.status_due: set[Key] = set()
        self.status_at: dict[Key, float] = {}
        for t in self.topics.values():
            if t.sweeper is not None:
                t.sweeper.sweep_mark = -math.inf  # no silence sweeps before the first marks

    def _observe(self, reader: ChartReader, moved: Sequence[tuple[str, float]]) -> None:
        """A pipeline's keys moved on: their charts, and their facts for the other workers."""
        self.recorder.observe(reader, moved)
        if self.facts is not None:
            self.facts.observe(reader, moved)

    async def _send(self, transitions: list[Transition], *, wait: bool = True) -> None:
        """Send ``transitions`` in order, their hints completed with the other workers'
        facts first (:meth:`.facts_feed.FactsFeed.settle`; ``wait`` False: with what is at
        hand, for a topic whose alerts another agent may resolve meanwhile)."""
        if self.facts is not None:
            transitions = await self.facts.settle(transitions, self.read_up_to(), wait=wait)
        for t in transitions:
            await self._send_alert(t)

    def read_up_to(self) -> tuple[float | None, float | None]:
        """How far this worker has processed its GPU and its request telemetry: the event
        time of the slowest partition of each, as of its last batch (0 before its first),
        or the oldest message of a batch read and not processed yet; 0 while a partition
        assigned lately, or one found empty that got messages since, is not read yet.
        None: it reads none lately, and none of its partitions is known to have messages
        still to read (nothing of it is to come: the others do not wait for it)."""
        return self._up_to("gpu"), self._up_to("requests")

    def _up_to(self, kind: str) -> float | None:
        topic = self.settings.topic(kind)
        # a partition assigned lately and not read yet: what it holds is read next (its
        # new owner may be far behind the others; its hosts' facts are the old owner's;
        # this worker's other agent may have raced ahead of it through a backlog); one
        # the app finds empty is dropped from ``unread``, and is unread again when
        # messages come to it (lately) before any is read: a worker assigned before its
        # partitions' first messages (a fleet's agents starting after it) is behind them
        # until it reads them, not idle
        now = time.monotonic()
        if any(tp.topic == topic and now - since < IDLE_PARTITION_S
               for tp, since in self.unread.items()):  # fmt: skip
            return 0.0
        if self.marks.mark(topic) is None:
            return None  # nothing read lately: idle, none of it to wait for
        return self.done_up_to.get(kind, 0.0)

    def found_empty(self, tp: Any, high: int) -> None:
        """An unread partition is at its high watermark ``high``: none of it is to come."""
        self.unread.pop(tp, None)
        self.empty[tp] = high

    def came(self, tp: Any, high: int | None) -> None:
        """A partition found empty has the high watermark ``high`` now: past the one it
        was found empty at, messages came and are not read yet (unread again)."""
        if tp in self.empty and high is not None and high > self.empty[tp]:
            del self.empty[tp]
            self.unread[tp] = time.monotonic()

    def _reading(self, topic: InputTopic, reads: list[Read]) -> None:
        """A batch was read and is processed next: until then this worker has processed
        its topic up to (about) the batch's oldest message at most. A partition it begins
        to read (assigned lately, or found empty before) may be hours behind the others,
        and the heartbeat that says reading began must say so, not how far the others
        were (the batch is processed, and its facts published, after it)."""
        done = self.done_up_to.get(topic.kind)
        if done is not None:
            self.done_up_to[topic.kind] = min(done, *(topic.newest(r.env) for r in reads))

    def _processed_up_to(self, kind: str) -> None:
        """A batch of ``kind`` was processed (its facts are published next)."""
        if kind in ("gpu", "requests"):
            self.done_up_to[kind] = self.marks.mark(self.settings.topic(kind)) or 0.0

    # -- one message -------------------------------------------------------------------

    async def consume(self, kind: str, stream: Any) -> None:
        """Every message of ``stream`` (a Faust stream of the ``kind`` topic), acked once the
        snapshot holds it. A topic with a batch seam is handled a batch at a time: the
        messages read while the next was at hand, up to ``MAX_BATCH``."""
        topic, stream = self.topics[kind], stream.noack()
        if topic.process_batch is None:
            async for event in stream.events():
                await self.handle(topic, stream, event)
            return
        batch: list[Any] = []
        rebalances = self.rebalances
        async for event in stream.events():
            if self.rebalances != rebalances:  # Faust reads them again (and drops its buffers)
                batch, rebalances = [], self.rebalances
            batch.append(event)
            if len(batch) < MAX_BATCH and await more_at_hand(stream):
                continue
            if self.rebalances == rebalances:  # (else one came while waiting: dropped)
                await self.handle_batch(topic, stream, batch)
            batch = []
        if batch and self.rebalances == rebalances:
            await self.handle_batch(topic, stream, batch)

    async def handle(self, topic: InputTopic, stream: Any, event: Any) -> None:
        """One message: decode, check, process, send its transitions, hold its ack."""
        msg = event.message
        self.counters.messages += 1
        raw = msg.value or b""
        h = self.held.add(msg.tp, stream, event)  # its place in the partition's acks
        env = await self._decoded(topic, msg, raw)
        if env is None:
            await self.held.release([h])
            return
        k = topic.key(env)
        key: Key = (topic.domain, k)
        self.busy[key] += 1  # no snapshot of k until its transitions are sent
        try:
            await self._meet(key, msg.tp)
            transitions = await self._processed(topic, msg, raw, env, k)
            if transitions is None:
                await self.held.release([h])
                return
            self.dirty[topic.kind].add(k)
            # device events' alerts are resolved by the GPU agent (their host's GPU time):
            # not held for hints, so a firing is never sent after its resolution
            await self._send(transitions, wait=topic.kind != "events")
            self.held.hold(key, h)
        finally:
            self.busy[key] -= 1

    async def handle_batch(self, topic: InputTopic, stream: Any, events: list[Any]) -> None:
        """Consecutive messages of a topic with a batch seam, each as :meth:`handle` does it
        and in order: decode and check each (the bad dead-lettered), then process the good
        together, send their transitions, hold their acks."""
        batch = topic.process_batch
        if batch is None:
            raise ValueError(f"topic {topic.kind} has no batch seam")
        rebalances = self.rebalances
        reads = await self._reads(topic, stream, events)
        if not reads:
            return
        if self.facts is not None:  # reading a partition began: the others wait for it
            self._reading(topic, reads)
            await self.facts.heartbeat(self.read_up_to())
        keys = [r.key for r in reads]
        self.busy.update(keys)  # no snapshot of them until their transitions are sent
        try:
            for r in reads:
                await self._meet(r.key, r.msg.tp)
            if self.rebalances != rebalances:
                self._rebalanced(reads)
                return
            took = await self._handle_reads(topic, batch, reads)
            if self.rebalances != rebalances:  # one came while it was sent, or retried:
                self._rebalanced(reads)  # what it did to keys gone elsewhere is not ours
        finally:
            self.busy.subtract(keys)
        if took > self.settings.slow_message:  # every partition waited this long
            self.counters.slow_messages += 1
            big = largest(reads)
            log.warning(
                "slow message %s[%d] offset=%d key=%s (the largest of a batch of %s): %.1f s",
                big.msg.topic, big.msg.partition, big.msg.offset, big.key[1],
                describe(topic, reads), took,
            )  # fmt: skip

    async def _reads(self, topic: InputTopic, stream: Any, events: list[Any]) -> list[Read]:
        """The messages counted, given their places in their partitions' acks (all before
        any await: a rebalance drops the places it finds), decoded and checked; the bad
        ones dead-lettered and their acks released."""
        msgs = [e.message for e in events]
        raws = [m.value or b"" for m in msgs]
        places = [self.held.add(m.tp, stream, e) for m, e in zip(msgs, events, strict=True)]
        self.counters.messages += len(events)
        reads: list[Read] = []
        rebalances = self.rebalances
        for msg, raw, h in zip(msgs, raws, places, strict=True):
            if self.rebalances != rebalances:  # came while one was dead-lettered: the rest
                return []  # are read again (a bad one is dead-lettered then, once)
            env = await self._decoded(topic, msg, raw)
            if env is None:
                await self.held.release([h])
            else:
                reads.append(Read(msg, raw, env, (topic.domain, topic.key(env)), h))
        return reads

    async def _handle_reads(
        self, topic: InputTopic, batch: Callable[[list[Any]], list[Transition]], reads: list[Read]
    ) -> float:
        """Process the messages together, send their transitions, then hold their acks; the
        seconds processing took."""
        started = time.perf_counter()
        try:
            transitions, done = batch([r.env for r in reads]), reads
        except Exception as exc:  # a bug must not stall the partition: each alone, to find it
            log.exception("processing failed %s: one message at a time", describe(topic, reads))
            # what the batch got to before it failed is not processed again (it reads as
            # seen), so its transitions are sent now or never
            sent = exc.transitions if isinstance(exc, BatchFailed) else []
            rest, done = await self._one_by_one(topic, batch, reads)
            transitions = sent + rest
        took = time.perf_counter() - started
        for r in done:
            self.dirty[topic.kind].add(r.key[1])
        self._processed_up_to(topic.kind)
        await self._send(transitions)
        for r in done:
            if r.key[1] in self.known[r.key[0]]:
                self.held.hold(r.key, r.held)
            else:  # its key was swept and pruned while the batch was sent: no snapshot
                self.dirty[topic.kind].discard(r.key[1])  # will hold it, so none waits
                await self.held.release([r.held])
        return took

    async def _one_by_one(
        self, topic: InputTopic, batch: Callable[[list[Any]], list[Transition]], reads: list[Read]
    ) -> tuple[list[Transition], list[Read]]:
        """The messages processed one at a time, as :meth:`handle` does; those that
        fail are dead-lettered. The transitions and the messages processed. (The pipelines
        drop samples they have seen: what the failed batch got to is not learned twice; its
        transitions come with the exception, :class:`~.base.BatchFailed`.)"""
        out: list[Transition] = []
        done: list[Read] = []
        for r in reads:
            got = await self._processed(topic, r.msg, r.raw, r.env, r.key[1], lambda e: batch([e]))
            if got is None:
                await self.held.release([r.held])
                continue
            out += got
            done.append(r)
        return out, done

    def _rebalanced(self, reads: list[Read]) -> None:
        """A rebalance came while a batch was read: its messages are read again from the
        committed offsets (here, or by the partition's new owner). Forget the keys restored
        here whose partitions are gone (the rebalance could not: they were not met yet)."""
        gone = {r.key for r in reads if r.msg.tp not in self.assigned_tps}
        self._forget(gone)
        for domain, k in gone:
            self.pipes.forget(domain, k)

    async def _meet(self, key: Key, tp: Any) -> None:
        """A message of ``key`` read from ``tp``: restore its state if it is new here."""
        domain, k = key
        if k not in self.known[domain]:
            self.known[domain].add(k)
            await self.delivery.restore(self.pipes, domain, k)
        self.partitions.setdefault(key, set()).add(tp)

    async def _decoded(self, topic: InputTopic, msg: Any, raw: bytes) -> Any | None:
        """The envelope, or None once a bad one is dead-lettered."""
        if self.unread or self.empty:  # its partition is read now
            self.unread.pop(msg.tp, None)
            self.empty.pop(msg.tp, None)
        try:
            env = topic.decode(raw)
        except SchemaError as exc:
            await self.dead_letter(msg, exc.reason, raw)
            return None
        except Exception as exc:  # a decoder bug must not stall the partition either
            log.exception("decoding failed %s[%d]", msg.topic, msg.partition)
            await self.dead_letter(msg, f"internal error: {type(exc).__name__}: {exc}", raw)
            return None
        ts = topic.newest(env)
        ahead = ts - time.time()
        skew = self.settings.max_clock_skew
        if ahead > skew:
            # event time drives windows, sweeps and `for:`: one envelope from a host with a
            # wrong clock would close every open bucket and age every alert
            reason = f"ts: {ahead:,.0f} s ahead of this worker's clock "
            await self.dead_letter(msg, reason + f"(RAGWATCH_MAX_CLOCK_SKEW={skew:g})", raw)
            return None
        self.marks.read(msg.topic, msg.partition, ts, msg.offset)
        return env

    async def _processed(
        self,
        topic: InputTopic,
        msg: Any,
        raw: bytes,
        env: Any,
        k: str,
        process: Callable[[Any], list[Transition]] | None = None,
    ) -> list[Transition] | None:
        """The envelope's transitions (``process``: the topic's), or None once a failure is
        dead-lettered."""
        try:
            started = time.perf_counter()
            transitions = (process or topic.process)(env)
        except Exception as exc:  # a bug must not stall the partition
            log.exception("processing failed %s key=%s", topic.kind, k)
            cause = exc.__cause__ if isinstance(exc, BatchFailed) and exc.__cause__ else exc
            await self.dead_letter(msg, f"internal error: {type(cause).__name__}: {cause}", raw)
            return None
        took = time.perf_counter() - started
        if took > self.settings.slow_message:  # every partition waited this long
            self.counters.slow_messages += 1
            log.warning(
                "slow message %s[%d] offset=%d key=%s: %.1f s",
                msg.topic, msg.partition, msg.offset, k, took,
            )  # fmt: skip
        return transitions

    async def dead_letter(self, msg: Any, reason: str, value: bytes) -> None:
        self.counters.deadletter += 1
        log.warning(
            "dead-letter %s[%d] offset=%d: %s", msg.topic, msg.partition, msg.offset, reason
        )
        headers = {
            DLQ_HEADER_TOPIC: msg.topic.encode(),
            DLQ_HEADER_PARTITION: str(msg.partition).encode(),
            DLQ_HEADER_OFFSET: str(msg.offset).encode(),
            DLQ_HEADER_REASON: reason.encode(),
        }
        await self._send_dead_letter(msg.key, value, headers)

    # -- rebalances and stops ------------------------------------------------------------

    async def assigned(self, assigned_now: set[Any]) -> None:
        """Hosts and services of partitions this worker lost: drop their state and held
        acks. The new owner restores their snapshots and reads what came after; if they
        come back here, they are restored from the snapshot again, not from stale memory."""
        lost = self.assigned_tps - set(assigned_now)
        self.unread = dict.fromkeys(set(assigned_now) - self.assigned_tps, time.monotonic())
        self.empty = {tp: high for tp, high in self.empty.items() if tp in assigned_now}
        self.assigned_tps = set(assigned_now)
        self.rebalances += 1
        if self.facts is not None:  # what it reads now, before any of it is read
            self.facts.assigned()
            await self.facts.heartbeat(self.read_up_to())
        # Faust reads every partition it keeps again from its committed offset: those
        # messages get their places in the queues again, and their hosts' envelopes come
        # again behind their newest (redeliveries, not clocks that jumped back)
        n = self.held.reset()
        for (domain, k), tps in self.partitions.items():
            if not tps & lost:
                self.pipes.redelivered(domain, k)
        if not lost:
            return
        gone = [k for k, tps in self.partitions.items() if tps & lost]
        self._forget(gone)
        for domain, k in gone:
            self.pipes.forget(domain, k)
        self.marks.forget((tp.topic, tp.partition) for tp in lost)
        log.info(
            "rebalance: %d partition(s) gone to other workers: forgot %d host(s)/service(s) "
            "and %d unsnapshotted message(s) (the new owner reads them again)",
            len(lost),
            len(gone),
            n,
        )

    def _forget(self, keys: Iterable[Key]) -> None:
        """Everything the loop keeps about ``keys`` (not their pipelines' state)."""
        for key in keys:
            domain, k = key
            if self.facts is not None:
                self.facts.forget(domain, k)
            self.known[domain].discard(k)
            self.partitions.pop(key, None)
            self.snap_due.discard(key)
            self.snap_at.pop(key, None)
            self.status_due.discard(key)
            self.status_at.pop(key, None)
            for kind, d in self.dirty.items():
                if self.topics[kind].domain == domain:
                    d.discard(k)

    async def stop(self) -> None:
        """A clean stop snapshots every changed host and service, so its last offsets are
        committed and the next start carries on from there."""
        for kind, d in self.dirty.items():
            self.snap_due.update((self.topics[kind].domain, k) for k in d)
        idle = sorted(k for k in self.snap_due if not self.busy[k])  # mid-send: read again
        if idle and not self.delivery.closed:
            await self.snapshot(idle, time.monotonic())

    # -- the tick --------------------------------------------------------------------------

    def _count_fleet(self) -> None:
        """The fleet view's counters into the worker's status (docs/status.md)."""
        c, peers = self.counters, self.pipes.gpus.peers
        c.gpu_peer_minutes, c.gpu_peer_incomplete = peers.compared, peers.incomplete
        if self.facts is not None:
            c.facts_records, c.facts_bad = self.facts.table.records, self.facts.table.bad
            c.hints_waited, c.hints_incomplete = self.facts.waited, self.facts.incomplete

    async def tick(self) -> None:
        """Every second: prune what went silent, write status and charts of what changed,
        write the snapshots that are due and release the acks they hold."""
        if self.delivery.closed:
            return
        await self.prune_gone()
        if self.facts is not None:
            await self.facts.heartbeat(self.read_up_to())
        self._changed()
        self.sweep_marks()
        self.counters.held_acks = len(self.held)
        self.counters.commit_stalls = self.stall.stalls
        self._count_fleet()
        await self.delivery.write_status(self.pipes, *self.statuses_due(time.monotonic()))
        await self.delivery.write_series(self.recorder.take())
        now = time.monotonic()
        batch = self.snapshots_due(now)
        if batch:
            await self.snapshot(batch, now)
        if self.held.over():
            log.warning(
                "%d messages read wait for snapshots (Redis away, or snapshots not keeping "
                "up): committing their offsets anyway (a crash now loses their effect)",
                len(self.held),
            )
            await self.held.release_all()

    def _changed(self) -> tuple[set[str], set[str]]:
        """The hosts and services that changed since the last tick, to chart (all known
        ones while Redis is away: a restarted Redis is empty); their snapshots and status
        are marked due."""
        hosts = self.dirty["gpu"] | self.dirty["metrics"]
        event_hosts, services = set(self.dirty["events"]), set(self.dirty["requests"])
        for d in self.dirty.values():
            d.clear()
        if self.delivery.redis_down_since is not None:
            hosts |= self.known["host"]
            services |= self.known["service"]
        self.snap_due.update(("host", h) for h in hosts | event_hosts)
        self.snap_due.update(("service", s) for s in services)
        self.status_due.update(("host", h) for h in hosts)
        self.status_due.update(("service", s) for s in services)
        return hosts, services

    def statuses_due(self, now: float) -> tuple[set[str], set[str]]:
        """The hosts and services whose status to write now: changed, and
        ``status_interval`` seconds since their last write (a new one at once; all while
        Redis is away, so that a restarted, empty Redis is filled at once)."""
        away = self.delivery.redis_down_since is not None
        interval = 0.0 if away else self.settings.status_interval
        at = self.status_at
        due = [k for k in self.status_due if now - at.get(k, -math.inf) >= interval]
        self.status_due.difference_update(due)
        for k in due:
            at[k] = now
        return {k for d, k in due if d == "host"}, {k for d, k in due if d == "service"}

    def sweep_marks(self) -> None:
        """Each pipeline sweeps silent hosts/services against the slowest of its topic's
        partitions (one read from in the last IDLE_PARTITION_S): after a restart or a
        rebalance, partitions are caught up at different paces, and one read far ahead
        must not make the hosts of another look silent and resolve their alerts."""
        for kind, t in self.topics.items():
            if t.sweeper is None:
                continue
            mark = self.marks.mark(self.settings.topic(kind))
            if mark is not None:  # else nothing was read lately: keep the last mark
                t.sweeper.sweep_mark = mark

    def snapshots_due(self, now: float) -> list[Key]:
        interval = self.settings.snapshot_interval
        at = self.snap_at
        due = sorted(
            (
                k
                for k in self.snap_due
                if now - at.get(k, -math.inf) >= interval and not self.busy[k]
            ),
            key=lambda k: at.get(k, -math.inf),
        )
        budget = max(8, math.ceil(2 * max(len(at), len(self.snap_due)) / interval))
        return due[:budget]

    async def snapshot(self, batch: list[Key], now: float) -> bool:
        """Write the snapshots of ``batch``, then ack the messages they hold."""
        taken = self.held.take(batch)  # before the snapshots: everything taken is in them
        written = False
        try:
            written = await self.delivery.write_snapshots(
                self.pipes,
                {k for d, k in batch if d == "host"},
                {k for d, k in batch if d == "service"},
            )
        finally:
            if not written:
                self.held.give_back(taken)
        if not written:
            self.stall.blocked(len(self.held), self.delivery.redis_trouble.last_error)
            return False
        for k in batch:
            self.snap_at[k] = now
            self.snap_due.discard(k)
        self.stall.cleared(await self.held.ack(taken))
        return True

    async def prune_gone(self) -> None:
        """Hosts and services that went silent and were swept: forget them here (their
        held acks go: nothing is left to snapshot) and delete their state in Redis."""
        hosts, services = self.pipes.gone()
        if not hosts and not services:
            return
        keys: list[Key] = [("host", h) for h in hosts] + [("service", s) for s in services]
        if self.facts is not None:  # (before they are forgotten there)
            await self.facts.gone(hosts, services)
        self._forget(keys)
        await self.held.ack(self.held.take(keys))
        prefixes = owner_prefixes(hosts, services)
        self.recorder.forget(prefixes)
        await self.delivery.prune(hosts, services, prefixes)
