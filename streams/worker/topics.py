"""The worker's topics.

:func:`input_topics`: one row per input topic: what a topic's key names, how its bytes
decode, the key and newest event time of an envelope, and the pipeline that processes it
(one envelope at a time, and a batch at a time where the pipeline has that seam).

:class:`TopicKeeper`: the topics a worker creates at start (all of ``RAGWATCH_TOPIC_*``,
the OTLP topic too) may vanish while it runs: deleted by hand, or with a broker that
restarted empty. Every ``TOPIC_CHECK_S`` and at every partition assignment it asks the
broker (one request), names each missing topic once and re-creates it as at start; a
topic whose id changed was re-created by someone else.

A re-created topic starts again at offset 0, but a consumer may resume it at the old
topic's offset: a commit of the old topic that aiokafka retries while the topic is missing
lands on the new one, and the next assignment seeks there, skipping the new topic's first
records (seen with a broker restarted empty, when the topic came back while the group was
being joined again). :func:`read_renewed_from_start` commits offset 0 for them and seeks
there before Faust resumes reading.
"""

from __future__ import annotations

import asyncio
import logging
import operator
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from ragwatch.codec import decode_as, decode_gpu_wire, decode_requests_wire
from ragwatch.config import Settings
from ragwatch.errors import ConfigError
from ragwatch.gpu_wire import GpuMessage
from ragwatch.kafka_admin import (
    CHECK_TIMEOUT_S,
    MissingTopics,
    ensure_topics,
    partitions_of,
    topic_ids,
    topic_names,
)
from ragwatch.schema import EventEnvelope, MetricsEnvelope, Transition
from ragwatch.streams.pipelines.base import Domain  # what an input topic's key names
from ragwatch.streams.pipelines.fleet import Pipelines
from ragwatch.streams.pipelines.requests import RequestsMessage

Key = tuple[Domain, str]
LAND_S = 0.5  # how long a commit retried while a topic was missing takes to land once it is back

log = logging.getLogger(__name__)


class Sweeper(Protocol):
    """A pipeline that sweeps silent series against a mark of event time."""

    sweep_mark: float


@dataclass(frozen=True)
class InputTopic:
    """One input topic: what its key names, how its bytes decode, the key and newest event
    time of a decoded envelope, and the pipeline that processes it (``sweeper``: the
    pipeline whose silence sweeps follow this topic's partitions, if any)."""

    kind: str  # the topic's name without the prefix: gpu, events, requests, metrics
    domain: Domain
    decode: Callable[[bytes], Any]
    key: Callable[[Any], str]
    newest: Callable[[Any], float]
    process: Callable[[Any], list[Transition]]
    sweeper: Sweeper | None = None
    # envelopes in order, the transitions of ``process`` one at a time (None: no batches)
    process_batch: Callable[[list[Any]], list[Transition]] | None = None


def _key(env: Any) -> str:
    return str(env.key)


def _ts(env: Any) -> float:
    return float(env.ts)


def _gpu_ts(env: GpuMessage) -> float:
    return float(env.ts)


def _requests_ts(env: RequestsMessage) -> float:
    return max((r.ts for r in env.records), default=env.ts)


def input_topics(pipes: Pipelines) -> tuple[InputTopic, ...]:
    """The worker's input topics. GPU and request envelopes are decoded into msgspec
    structs (``decode_gpu_wire`` and ``decode_requests_wire`` validate them as strictly):
    building ~90 frozen records per host envelope, or one per request, cost more than the
    analysis."""
    return (
        InputTopic(
            "gpu", "host", decode_gpu_wire, operator.attrgetter("host"), _gpu_ts,
            pipes.gpu_wire, pipes.gpus, pipes.gpu_batch,
        ),
        InputTopic("events", "host", partial(decode_as, EventEnvelope), _key, _ts, pipes.event),
        InputTopic(
            "requests", "service", decode_requests_wire, operator.attrgetter("service"),
            _requests_ts, pipes.request, pipes.requests, pipes.request_batch,
        ),
        InputTopic(
            "metrics", "host", partial(decode_as, MetricsEnvelope), _key, _ts, pipes.metric,
            pipes.metrics,
        ),
    )  # fmt: skip


class TopicKeeper:
    """The worker's topics, checked when :meth:`check` is called (every ``TOPIC_CHECK_S``,
    and at every partition assignment): one missing is named once (``topic T is missing:
    re-creating it``), re-created with ``RAGWATCH_TOPIC_PARTITIONS`` partitions, and said
    to be back; one whose id changed since the last check was re-created by someone else
    meanwhile. ``describe`` and ``create`` are :func:`~ragwatch.kafka_admin.topic_ids` and
    :func:`~ragwatch.kafka_admin.ensure_topics` (blocking: run in a thread)."""

    def __init__(
        self,
        settings: Settings,
        *,
        describe: Callable[..., dict[str, str | None]] = topic_ids,
        create: Callable[..., list[str]] = ensure_topics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.names = topic_names(settings)
        self.topics = MissingTopics(log, "re-creating it", "it exists again")
        self.ids: dict[str, str | None] = {}  # as of the last check (None: missing)
        self.renewed_at: dict[str, float] = {}  # topic -> when it was seen re-created
        self._clock = clock
        self._describe, self._create = describe, create
        self._create_failed = False
        self._lock = asyncio.Lock()  # one check at a time: each line is said once

    async def check(self, timeout_s: float = CHECK_TIMEOUT_S) -> list[str]:
        """Ask once; re-create what is missing. The topics that are new since the last
        check: back (re-created here or elsewhere) or with a new id. A broker that does not
        answer is not judged (its clients say it is unreachable)."""
        async with self._lock:
            try:
                ids = await asyncio.to_thread(
                    self._describe, self.settings, self.names, timeout_s, command="worker"
                )
            except ConfigError as exc:
                log.debug("topic check skipped: %s", exc)
                return []
            except Exception as exc:  # KafkaException: a check must not stop the worker
                log.warning("topic check failed: %s", exc)
                return []
            renewed = [t for t in self.names if ids[t] and self.ids.get(t) not in (None, ids[t])]
            for t in renewed:
                log.warning("topic %s was re-created since the last check: a new topic id", t)
            self.ids.update(ids)
            missing = [t for t in self.names if ids[t] is None]
            back = self.topics.update(self.names, missing)[1]
            if missing:
                back += await self._recreate(missing)
            now = self._clock()
            self.renewed_at.update((t, now) for t in renewed + back)
            return renewed + back

    def renewed(self, within_s: float) -> set[str]:
        """The topics seen re-created (or back) in the last ``within_s`` seconds."""
        now = self._clock()
        return {t for t, at in self.renewed_at.items() if now - at < within_s}

    async def _recreate(self, missing: list[str]) -> list[str]:
        try:
            created = await asyncio.to_thread(self._create, self.settings, command="worker")
        except ConfigError as exc:  # not allowed to, or the broker went away meanwhile
            if not self._create_failed:
                log.warning("cannot re-create the missing topics (trying again): %s", exc)
            self._create_failed = True
            return []
        self._create_failed = False
        return [
            t
            for t in missing
            if self.topics.back(
                t,
                f"re-created ({partitions_of(self.settings, t)} partitions)"
                if t in created
                else None,
            )
        ]


async def read_renewed_from_start(
    consumer: Any, keeper: TopicKeeper, *, within_s: float, timeout_s: float = CHECK_TIMEOUT_S
) -> list[Any]:
    """Before Faust seeks each assigned partition to its committed offset (its
    ``on_rebalance_complete`` signal): check the topics, then commit offset 0 for the
    assigned partitions of those re-created within ``within_s`` and seek them there, so
    they are read from 0. Their committed offsets may be the old topics': a commit aiokafka retried
    while the topic was missing lands on the new one, and read from there the new topic's
    first records would be skipped. (Within the window a partition already read is read
    again from 0: a young topic is cheap to read; the pipelines drop what they saw.)
    Returns the partitions."""
    if await keeper.check(timeout_s):
        await asyncio.sleep(LAND_S)  # a commit of the old topic retried until now lands first
    young = keeper.renewed(within_s)
    tps = sorted(tp for tp in consumer.assignment() if tp.topic in young)
    if not tps:
        return []
    # Faust's commit of given offsets (its public commit() commits acked offsets only);
    # then the seek, as aiokafka's seek to a committed 0 keeps the position it took at the
    # assignment (from the old commit). Faust's flow is stopped until its own seek is done.
    committed = await consumer._commit({tp: 0 for tp in tps})
    for tp in tps:
        await consumer.seek(tp, 0)
    log.warning(
        "%d partition(s) of re-created topics read from offset 0%s: %s",
        len(tps),
        "" if committed else " (offset 0 not committed: a restart now reads from the old offsets)",
        ", ".join(f"{tp.topic}[{tp.partition}]" for tp in tps),
    )
    return tps
