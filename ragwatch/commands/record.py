"""``ragwatch record``: the ragwatch topics copied to a JSONL file, for ``ragwatch replay``.

It consumes the topics from the beginning of every partition (assigned, not subscribed:
no group join) and writes the valid envelopes as JSONL (gzip if the file ends in ``.gz``),
one encoded envelope a line, in consumption order: Kafka's order per key (host, service) is
kept. An invalid message is counted and logged, never written.
"""

from __future__ import annotations

import gzip
import io
import logging
import math
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragwatch.codec import decode_as, encode
from ragwatch.config import Settings
from ragwatch.errors import ConfigError, SchemaError
from ragwatch.progress import Progress
from ragwatch.schema import EventEnvelope, GpuEnvelope, MetricsEnvelope, RequestsEnvelope

log = logging.getLogger(__name__)

TOPIC_KINDS: dict[str, type[Any]] = {
    "gpu": GpuEnvelope,
    "requests": RequestsEnvelope,
    "events": EventEnvelope,
    "metrics": MetricsEnvelope,
}


@dataclass
class RecordStats:
    written: int = 0
    invalid: int = 0
    consumed: int = 0


def record(
    settings: Settings,
    out_path: Path,
    *,
    topics: Sequence[str] = tuple(TOPIC_KINDS),
    duration_s: float | None = None,
    max_messages: int | None = None,
    stop: threading.Event | None = None,
    progress: Progress | None = None,
) -> RecordStats:
    """Copy the valid envelopes of ``topics`` (from the beginning) to a JSONL file until
    ``max_messages`` envelopes are written, ``duration_s`` (wall clock) has passed, or
    ``stop`` is set. Kafka's order is kept per partition. How many were written goes to
    ``progress`` (by default on stderr: a bar on a terminal, else a line every 10 s)."""
    from confluent_kafka import KafkaException

    from ragwatch.kafka_admin import check_kafka

    unknown = sorted(set(topics) - set(TOPIC_KINDS))
    if unknown or not topics:
        raise ConfigError(f"record: --topics takes {','.join(TOPIC_KINDS)}; got {unknown}")
    limit = math.inf if max_messages is None else max_messages
    stop = stop or threading.Event()
    check_kafka(settings, "record")  # one line, before any file exists
    try:  # Kafka first: a missing topic leaves no empty file either
        consumer = _assigned_consumer(settings, topics)
    except KafkaException as exc:
        raise ConfigError(f"record: Kafka at {settings.kafka_bootstrap}: {exc}") from None
    deadline = math.inf if duration_s is None else time.monotonic() + duration_s
    try:
        try:
            f = _create(out_path)
        except OSError as exc:
            raise ConfigError(f"record: cannot write {out_path}: {exc.strerror}") from None
        with f:
            kinds = {settings.topic(name): TOPIC_KINDS[name] for name in topics}
            stats = RecordStats()
            progress = progress or Progress("record", "envelopes", total=max_messages)
            progress.note(lambda: _record_note(stats, deadline))
            while stats.written < limit and time.monotonic() < deadline and not stop.is_set():
                for msg in consumer.consume(500, timeout=0.5):
                    _record_one(msg, kinds, f, stats)
                    if stats.written >= limit:
                        break
                progress.update(stats.written)
    finally:
        if progress is not None:
            progress.close(final_line=False)  # the command's last line says it all
        consumer.close()
    return stats


def _record_note(stats: RecordStats, deadline: float) -> str:
    left = deadline - time.monotonic()
    ends = f"; {left:,.0f} s of --duration left" if math.isfinite(deadline) else ""
    return f"{stats.consumed:,} messages read, {stats.invalid:,} invalid{ends}"


def _assigned_consumer(settings: Settings, topics: Sequence[str]) -> Any:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    conf = {
        **settings.kafka_config(),
        "group.id": f"ragwatch-record-{uuid.uuid4().hex[:12]}",
        "enable.auto.commit": False,
    }
    consumer = Consumer(conf)
    assignment = []
    for name in topics:
        topic = settings.topic(name)
        meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            consumer.close()
            raise ConfigError(f"record: topic {topic} does not exist")
        assignment += [TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions]
    consumer.assign(assignment)
    return consumer


def _record_one(
    msg: Any, kinds: dict[str, type[Any]], f: io.BufferedIOBase, stats: RecordStats
) -> None:
    if msg.error() is not None:
        log.warning("record: %s", msg.error())
        return
    stats.consumed += 1
    try:
        env = decode_as(kinds[msg.topic()], msg.value() or b"")
    except SchemaError as exc:
        stats.invalid += 1
        log.warning(
            "record: skipped %s[%d] offset=%d: %s",
            msg.topic(),
            msg.partition(),
            msg.offset(),
            exc.reason,
        )
        return
    f.write(encode(env) + b"\n")
    stats.written += 1


def _create(path: Path) -> io.BufferedIOBase:
    if path.name.endswith(".gz"):
        return gzip.open(path, "wb")
    return open(path, "wb")
