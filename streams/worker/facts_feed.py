"""The worker's side of the facts topic: what it publishes, what it reads, and the wait.

With several workers a host's GPU telemetry and the requests of the services on it are
usually consumed by different workers, and a hint joins both (:mod:`..pipelines.hints`).
So every worker

- publishes the facts of what it owns on ``ragwatch.facts`` (:class:`FactsFeed`): a
  host's (:class:`~ragwatch.schema.HostFacts`) once per ``period_s`` of its event time and
  whenever one of its alerts starts firing, an instance's
  (:class:`~ragwatch.schema.InstanceFacts`) at each of its bucket closes, and its own
  progress (:class:`~ragwatch.schema.WorkerProgress`) after them, every ``progress_s`` of
  event time and at least every ``heartbeat_s`` of wall time;
- reads the whole topic into a :class:`~.facts_table.FactsTable` (:class:`FactsReader`, a
  thread), which its pipelines ask for what they do not hold;
- before it sends an alert that starts firing and whose hint reads the other side, waits
  until the live workers that own telemetry of that side have read it up to the alert's
  event time (less ``slack_s``), at most ``wait_s`` of wall time, then explains the alert
  again (:meth:`FactsFeed.settle`). Its own facts are published before it waits, so two
  workers waiting on each other never both wait: the one behind finds the other ahead.
  Each alert waits in the settle of the agent that raised it, which sends it: the
  worker's agents settle in turn on one event loop, and none takes another's.

The topic has one partition: a worker's progress is read after the facts it published
before it, which is what makes "this worker has read up to T" mean "its facts of T are
in the table". It is compacted: a worker that starts reads the newest facts of each key.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ragwatch.facts_wire import FactsRecord, encode_facts, facts_key, host_key, instance_key
from ragwatch.schema import InstanceFacts, Transition, WorkerProgress
from ragwatch.streams.pipelines.base import ChartReader, Domain, owns
from ragwatch.streams.pipelines.fleet import Join, Pipelines
from ragwatch.streams.pipelines.hints import HINT_SIGNALS
from ragwatch.streams.worker.facts_table import FactsTable

log = logging.getLogger(__name__)

Send = Callable[[bytes, bytes | None], Awaitable[None]]  # key, value (None: a tombstone)
# how far a worker has read its GPU and its request telemetry: the event time of the
# slowest partition of each that it is reading (read from lately, or with messages not
# read yet: 0 if none of them is read yet); None: it reads none (owns none, or they are
# idle: nothing of theirs is to come, so none is waited for)
ReadUpTo = tuple[float | None, float | None]

PERIOD_S = 60.0  # a host's facts, once per minute of its event time
PROGRESS_S = 15.0  # a worker's progress, every 15 s of its event time
HEARTBEAT_S = 5.0  # and every 5 s of wall time (so the others know it is alive)
SLACK_S = 60.0  # a hint takes the other side's facts up to a minute older than its alert
POLL_S = 0.05  # how often a waiting hint looks at the table
# after an assignment, the others' first progress comes within this (their heartbeat at
# the same rebalance): hints wait for it before they trust "no one is behind"
ASSIGNED_S = 3.0
# a join noted and not settled for this long (wall) is dropped: its alert was never sent
# (its processing failed after it fired); a settle comes right after its processing
ORPHAN_S = 60.0


class FactsFeed:
    """What a worker publishes on the facts topic, and the wait of hints that read it."""

    def __init__(
        self,
        me: str,
        pipes: Pipelines,
        table: FactsTable,
        send: Send,
        *,
        wait_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.me, self.pipes, self.table, self._send = me, pipes, table, send
        self.wait_s, self._clock = wait_s, clock
        self._due: list[FactsRecord] = []  # taken as their keys moved, to publish
        self._host_period: dict[str, float] = {}  # host -> the period last published
        self._bucket: dict[tuple[str, str], float | None] = {}  # instance -> its bucket end
        self._progress: tuple[tuple[float, ...], float] = ((), -math.inf)  # (periods, wall)
        self.published = 0
        self._seq = 0  # progress records sent
        self._assigned_at = -math.inf
        self._noted: list[tuple[Join, float]] = []  # joins taken, not settled yet (and when)
        self.waited = 0  # hints that waited for another worker
        self.incomplete = 0  # hints sent after wait_s without the other side

    def observe(self, reader: ChartReader, moved: Sequence[tuple[str, float]]) -> None:
        """A pipeline's keys moved on (a pipeline's tap, after each wave of a batch): the
        facts of those that moved into a new period (hosts) or closed a bucket
        (instances) are taken now, as of this wave, to be published after the batch."""
        if reader.name == "gpu":
            due = []
            for host, ts in moved:
                period = ts // PERIOD_S
                if self._host_period.get(host) != period:
                    self._host_period[host] = period
                    due.append(host)
            if due:
                self._due += self.pipes.gpus.facts_of(due)
        elif reader.name == "requests":
            for service in dict.fromkeys(service for service, _ in moved):
                self._due += self._instances(service)

    # -- publishing -------------------------------------------------------------------

    def due(self, read: ReadUpTo, transitions: Iterable[Transition] = ()) -> list[FactsRecord]:
        """The records to publish now: the facts taken as their keys moved on
        (:meth:`observe`), those of the hosts whose alerts start firing, then the
        worker's progress if it moved on or a heartbeat is due."""
        firing = sorted(
            {
                t.alert.labels["host"]
                for t in transitions
                if t.fires
                and "host" in t.alert.labels
                and owns("host", t.alert.labels["host"], t.alert.labels)
            }
        )
        out, self._due = self._due, []
        # (a host whose GPU telemetry another worker reads has none here: its facts are
        # that worker's to publish, and an empty record would read as the host's newest)
        out += [f for f in self.pipes.gpus.facts_of(firing) if f.ts is not None] if firing else []
        progress = self._progress_due(read, bool(out))
        return out + ([progress] if progress is not None else [])

    def _instances(self, service: str) -> list[InstanceFacts]:
        out = []
        for f in self.pipes.requests.facts_of(service, taken=self._bucket):  # closed since
            self._bucket[(f.service, f.instance)] = f.bucket_end
            sig = f.signals  # what hints read of it, no more (the table keeps hours)
            out.append(replace(f, signals={k: sig[k] for k in HINT_SIGNALS if k in sig}))
        return out

    def _progress_due(self, read: ReadUpTo, published: bool) -> WorkerProgress | None:
        periods = tuple(-math.inf if ts is None else ts // PROGRESS_S for ts in read)
        now = self._clock()
        if not published and periods == self._progress[0] and now - self._progress[1] < HEARTBEAT_S:
            return None
        self._progress = (periods, now)
        self._seq += 1
        return WorkerProgress(self.me, *read, seq=self._seq)

    async def publish(self, read: ReadUpTo, transitions: Iterable[Transition] = ()) -> int:
        """Publish what is due (:meth:`due`); how many records."""
        records = self.due(read, transitions)
        for rec in records:
            await self._send(facts_key(rec), encode_facts(rec, by=self.me))
        self.published += len(records)
        return len(records)

    async def gone(self, hosts: Iterable[str], services: Iterable[str]) -> None:
        """Hosts and services that went silent and were swept: their keys are deleted
        from the topic (tombstones)."""
        for host in hosts:
            self._host_period.pop(host, None)
            await self._send(host_key(host), None)
        lost = set(services)
        for key in [k for k in self._bucket if k[0] in lost]:
            del self._bucket[key]
            await self._send(instance_key(*key), None)

    def forget(self, domain: Domain, key: str) -> None:
        """``key`` went to another worker: it publishes its facts from now on."""
        if domain == "host":
            self._host_period.pop(key, None)
        else:
            for k in [k for k in self._bucket if k[0] == key]:
                del self._bucket[k]

    # -- the wait ---------------------------------------------------------------------

    async def settle(
        self, transitions: list[Transition], read: ReadUpTo, *, wait: bool = True
    ) -> list[Transition]:
        """``transitions`` ready to send: own facts published first (and ``read``, how
        far this worker has read), then each alert of ``transitions`` that starts firing
        and reads the other side (its join, noted as it fired: :meth:`_joins_of`)
        explained once the workers that own that side have read up to its time (at most
        ``wait_s`` for all of them; a hint sent without them says so in the log and in
        ``incomplete``). ``wait`` False: explained with what the table
        has now (a device event's alert: the GPU agent resolves it as the host's GPU
        time moves on, and a firing held here would be sent after its resolution)."""
        joins = self._joins_of(transitions)
        await self.publish(read, transitions)
        if not joins or not wait:
            return self.pipes.rehint(transitions, joins)
        deadline = self._clock() + self.wait_s
        await self._caught_up(deadline)
        for j in joins:
            behind = self.table.behind(j.domain, j.at - SLACK_S)
            if behind:
                self.waited += 1
            while behind and self._clock() < deadline:
                await asyncio.sleep(POLL_S)
                behind = self.table.behind(j.domain, j.at - SLACK_S)
            if behind:
                self.incomplete += 1
                log.warning(
                    "hint of alert %s sent without the %s telemetry of worker(s) %s: not read "
                    "up to its time after %.0f s (RAGWATCH_HINT_WAIT)",
                    j.fingerprint, "GPU" if j.domain == "host" else "request",
                    ", ".join(behind), self.wait_s,
                )  # fmt: skip
        return self.pipes.rehint(transitions, joins)

    def _joins_of(self, transitions: list[Transition]) -> list[Join]:
        """The joins noted for the alerts of ``transitions`` that start firing, no others.
        The worker's agents (GPU, requests, events, metrics) share its pipelines and
        settle in turn on one event loop: while one settle awaits (publishing, waiting),
        another agent processes its messages and notes joins of its own; they are kept
        for that agent's settle, which sends their alerts. (Taken by whichever settle came
        first, they were waited for there, or not at all with ``wait`` False, and their
        alerts sent by their own settle at once, with the hint of the moment they fired:
        "no GPU telemetry of h is at hand" while h's owner had not published it yet.)"""
        now = self._clock()
        self._noted += [(j, now) for j in self.pipes.take_joins()]
        at = self.pipes.correlator.at
        mine = {(t.alert.fingerprint, at(t.alert)) for t in transitions if t.fires}
        out: list[Join] = []
        kept: list[tuple[Join, float]] = []
        for j, noted in self._noted:
            if now - noted >= ORPHAN_S:
                continue
            if (j.fingerprint, j.at) in mine:
                out.append(j)
            else:
                kept.append((j, noted))
        self._noted = kept
        return out

    def assigned(self) -> None:
        """The worker was given partitions: the others were too, and say so in the next
        moments; until then (``ASSIGNED_S``) the table does not know whom to wait for."""
        self._assigned_at = self._clock()

    async def _caught_up(self, deadline: float) -> None:
        """Until the table has read this worker's newest progress (so every record sent
        before it, the others' too) and ``ASSIGNED_S`` passed since an assignment."""
        while self._clock() < deadline:
            mine = self.table.progress.get(self.me)
            read = mine is not None and mine[0].seq >= self._seq
            if read and self._clock() >= self._assigned_at + ASSIGNED_S:
                return
            await asyncio.sleep(POLL_S)

    async def heartbeat(self, read: ReadUpTo) -> None:
        """Every tick: the worker's progress, if a heartbeat is due."""
        await self.publish(read)


class FactsReader:
    """Reads the facts topic from its start into a table, in a thread (confluent-kafka,
    the partition assigned by hand: no group is joined, nothing committed); the records
    are handed to the table on the worker's event loop."""

    def __init__(
        self,
        kafka: Mapping[str, Any],
        topic: str,
        table: FactsTable,
        loop: asyncio.AbstractEventLoop,
        *,
        poll_s: float = 0.1,
    ) -> None:
        self.kafka, self.topic, self.table, self.loop = dict(kafka), topic, table, loop
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="facts-reader", daemon=True)
        self._missing = False

    def start(self) -> FactsReader:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

        consumer = Consumer(
            {
                **self.kafka,
                "group.id": "ragwatch-facts-reader",  # never joined: assigned by hand
                "enable.auto.commit": False,
                "enable.partition.eof": False,
                "auto.offset.reset": "earliest",
            }
        )
        consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
        try:
            while not self._stop.is_set():
                msgs = consumer.consume(500, self.poll_s)
                records = []
                for m in msgs:
                    err = m.error()
                    if err is None:
                        records.append((m.key(), m.value()))
                    elif err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                        self._say_missing()
                    else:
                        log.warning("facts topic %s: %s", self.topic, err)
                if records:
                    if self._missing:
                        log.info("facts topic %s: reading again", self.topic)
                        self._missing = False
                    self.loop.call_soon_threadsafe(self.table.apply, records)
        except RuntimeError:  # the event loop closed under it: the worker is stopping
            pass
        finally:
            consumer.close()

    def _say_missing(self) -> None:
        if not self._missing:
            log.warning("facts topic %s is missing: hints see this worker's facts only", self.topic)
        self._missing = True
