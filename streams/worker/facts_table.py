"""The fleet's facts as the facts topic has them: what the other workers publish.

A worker owns some hosts and some services (their partitions); an alert's hint needs
the facts of the other side too, wherever they are consumed. :class:`FactsTable` holds
the newest record of each key of ``ragwatch.facts`` (:mod:`ragwatch.facts_wire`), read
whole by every worker, and answers as a :class:`~ragwatch.streams.pipelines.facts.Summary`
(the worker's pipelines ask it for what they do not hold themselves). It also knows how
far each worker has read (their :class:`~ragwatch.schema.WorkerProgress`): :meth:`behind`
names the live workers whose telemetry of a domain is older than an alert, whose facts
at the alert's time are not published yet, so its hint waits for them
(:mod:`.facts_feed`). A worker is live while its progress arrives (``alive_s`` of this
worker's clock since the last).

It is changed only on the worker's event loop (:meth:`apply`).

>>> from ragwatch.facts_wire import encode_facts, facts_key
>>> from ragwatch.schema import HostFacts, InstanceFacts, WorkerProgress
>>> table = FactsTable("w1", clock=lambda: 0.0)
>>> for rec in (HostFacts("h1", 600.0), WorkerProgress("w2", host_ts=600.0),
...             InstanceFacts("rag", "rag-0", "h1", 540.0, {"rps": 2.0})):
...     table.apply([(facts_key(rec), encode_facts(rec, by="w2"))])
>>> now = table.as_of(600.0)
>>> now.host("h1").ts, [f.instance for f in now.instances_on("h1")]
(600.0, ['rag-0'])
>>> table.behind("host", 900.0), table.behind("host", 600.0), table.behind("service", 900.0)
(['w2'], [], [])
"""

from __future__ import annotations

import bisect
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from ragwatch.errors import SchemaError
from ragwatch.facts_wire import decode_facts, key_parts
from ragwatch.schema import GpuFact, HostFacts, InstanceFacts, WorkerProgress
from ragwatch.streams.pipelines.gpu_peers import COMPARED, fact_values

log = logging.getLogger(__name__)
F64 = npt.NDArray[np.float64]

Domain = Literal["host", "service"]

ALIVE_S = 30.0  # a worker whose progress has not come for this long is not waited for
HOST_HISTORY = 240  # a host's facts as they changed: 4 h of a leak named every minute
# a host's GPUs as their like GPUs compare them (GpuFact), kept apart and in arrays: an
# hour of minutes (a worker more than an hour ahead of another is compared without it)
GPU_HISTORY = 60
INSTANCE_HISTORY = 240  # an instance's, one a bucket: 4 h of 1-minute buckets (~0.5 KiB
# each: what hints read of it)


class FactsTable:
    """The newest facts of every key of the facts topic, and every worker's progress."""

    def __init__(
        self, me: str, *, alive_s: float = ALIVE_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.me, self.alive_s, self._clock = me, alive_s, clock
        self.hosts: dict[str, deque[HostFacts]] = {}  # each as it changed, oldest first
        self.gpus: dict[str, deque[GpuRecord]] = {}  # its GPUs' GpuFacts, oldest first
        self.instances: dict[tuple[str, str], deque[InstanceFacts]] = {}
        self._on: dict[str, set[tuple[str, str]]] = {}  # host -> its instances
        self.progress: dict[str, tuple[WorkerProgress, float]] = {}  # worker -> (it, when)
        self.records = 0
        self.bad = 0

    # -- the topic's records ----------------------------------------------------------

    def apply(self, records: Iterable[tuple[bytes | None, bytes | None]]) -> None:
        """Take records of the facts topic, in the topic's order (key, value; no value:
        the key is gone). A record that is not one is counted, logged and skipped."""
        for key, value in records:
            self.records += 1
            if value is None:
                self._drop(*key_parts(key or b""))
                continue
            try:
                by, rec = decode_facts(value)
            except SchemaError as exc:
                self.bad += 1
                log.warning("facts topic: a record skipped (key=%r): %s", key, exc.reason)
                continue
            self._put(rec, by)

    def _put(self, rec: HostFacts | InstanceFacts | WorkerProgress, by: str) -> None:
        if isinstance(rec, HostFacts):
            if rec.gpus or rec.host in self.gpus:
                history = self.gpus.setdefault(rec.host, deque(maxlen=GPU_HISTORY))
                _add(history, GpuRecord.of(rec, history[-1] if history else None))
            rec = replace(rec, gpus=())  # hints do not read them: 4 h of them is not kept
            _add(self.hosts.setdefault(rec.host, deque(maxlen=HOST_HISTORY)), rec)
        elif isinstance(rec, InstanceFacts):
            key = (rec.service, rec.instance)
            old = self.instances.get(key)
            if old and old[-1].host is not None and old[-1].host != rec.host:
                self._on.get(old[-1].host or "", set()).discard(key)
            _add(self.instances.setdefault(key, deque(maxlen=INSTANCE_HISTORY)), rec)
            if rec.host is not None:
                self._on.setdefault(rec.host, set()).add(key)
        else:
            self.progress[rec.worker] = (rec, self._clock())

    def _drop(self, kind: str, name: str, instance: str) -> None:
        if kind == "h":
            self.hosts.pop(name, None)
            self.gpus.pop(name, None)
        elif kind == "i":
            service = name
            old = self.instances.pop((service, instance), None)
            if old and old[-1].host is not None:
                self._on.get(old[-1].host or "", set()).discard((service, instance))
        elif kind == "w":
            self.progress.pop(name, None)

    # -- as a Summary ------------------------------------------------------------------

    def as_of(self, at: float) -> AsOf:
        """The facts as they were at event time ``at`` (a :class:`Summary`): of each key
        the newest record not after ``at`` (its oldest kept, if all are), so a worker
        that reads ahead of another does not answer an older alert's hint with facts from
        its own present. Read when asked: records that come meanwhile are seen."""
        return AsOf(self, at)

    def gpus_at(self, at: float) -> list[tuple[str, GpuFact]]:
        """Every published GPU that has like GPUs to compare with (a group), as of event
        time ``at``: (host, fact), by host (:mod:`..pipelines.gpu_peers`). Hosts whose
        newest record has none are passed over."""
        out: list[tuple[str, GpuFact]] = []
        for host, history in sorted(self.gpus.items()):
            found: GpuRecord | None = _at(history, at)
            if found is not None and found.ts is not None and found.ts <= at:
                out += [(host, f) for f in found.facts()]
        return out

    # -- progress ---------------------------------------------------------------------

    def behind(self, domain: Domain, at: float) -> list[str]:
        """The live workers (not this one) that read telemetry of ``domain`` and have not
        processed it up to event time ``at``: their facts of that time are still to come.
        A worker never waits for itself: Faust feeds its agents through one conductor,
        which stops feeding both while one's queue is full, so one agent waiting for the
        other can wait in vain; its own other side is read from its pipelines as they are
        (as with one worker before the facts topic)."""
        now = self._clock()
        out = []
        for worker, (p, seen) in sorted(self.progress.items()):
            ts = p.host_ts if domain == "host" else p.service_ts
            if worker != self.me and ts is not None and ts < at and now - seen <= self.alive_s:
                out.append(worker)
        return out


def _add(history: deque[Any], rec: Any) -> None:
    """Keep ``rec`` after the others (one older than the newest replaces nothing: a
    re-published key of a worker that restarted goes on from there)."""
    newest, ts = (_ts(history[-1]) if history else None), _ts(rec)
    if newest is not None and ts is not None and ts < newest:
        history.clear()  # another worker took the key over from an older snapshot
    history.append(rec)


def _ts(rec: HostFacts | InstanceFacts | GpuRecord) -> float | None:
    return rec.bucket_end if isinstance(rec, InstanceFacts) else rec.ts


class GpuRecord:
    """A host's :class:`~ragwatch.schema.GpuFact` s of one record in arrays: the names of
    its GPUs and their groups (the previous record's tuples when unchanged, so an hour of
    them holds the strings once) and a row of values per GPU."""

    __slots__ = ("groups", "members", "ts", "values")

    def __init__(
        self, ts: float | None, members: tuple[str, ...], groups: tuple[str, ...], values: F64
    ) -> None:
        self.ts, self.members, self.groups, self.values = ts, members, groups, values

    @classmethod
    def of(cls, rec: HostFacts, before: GpuRecord | None) -> GpuRecord:
        members = tuple(f.member for f in rec.gpus)
        groups = tuple(f.group for f in rec.gpus)
        if before is not None and before.members == members and before.groups == groups:
            members, groups = before.members, before.groups
        values = np.array([[f.ts, *fact_values(f)] for f in rec.gpus], dtype=np.float64).reshape(
            len(rec.gpus), 1 + len(COMPARED)
        )
        return cls(rec.ts, members, groups, values)

    def facts(self) -> list[GpuFact]:
        rows = self.values.tolist()
        return [
            GpuFact(m, g, row[0], *(None if math.isnan(v) else v for v in row[1:]))
            for m, g, row in zip(self.members, self.groups, rows, strict=True)
        ]


def _at(history: deque[Any] | None, at: float) -> Any:
    """The newest record of ``history`` not after ``at`` (the oldest if all are)."""
    if not history:
        return None
    times = [_ts(r) or -math.inf for r in history]
    i = bisect.bisect_right(times, at)
    return history[max(i - 1, 0)]


class AsOf:
    """The facts of a :class:`FactsTable` as they were at event time ``at``."""

    def __init__(self, table: FactsTable, at: float) -> None:
        self.table, self.at = table, at

    def host(self, host: str) -> HostFacts:
        found: HostFacts | None = _at(self.table.hosts.get(host), self.at)
        return found or HostFacts(host)

    def instance(self, service: str, instance: str) -> InstanceFacts | None:
        found: InstanceFacts | None = _at(self.table.instances.get((service, instance)), self.at)
        return found

    def instances_on(self, host: str) -> list[InstanceFacts]:
        keys = sorted(self.table._on.get(host, ()))
        return [f for k in keys if (f := self.instance(*k)) is not None and f.host == host]
