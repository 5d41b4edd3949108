"""The notifier's group state, re-derived from the alerts topic when Redis has lost it.

The notifier keeps which alerts each receiver has been told about in Redis
(``P:notify:groups``). If Redis loses it (restarted empty, flushed, evicted), a notifier
that starts without it would drop every resolution of an alert it paged for ("never
notified as firing") and never resolve the PagerDuty incident. The alerts topic still
holds every transition the notifier has consumed, up to its group's committed offsets:
:func:`committed_records` reads them (without joining the group or committing), and the
notifier feeds them to its grouper in event time, discarding the notifications they
would produce (they were queued before; sending them again would page twice). What the
group had consumed but not yet notified (a group still in its ``group_wait``) stays due
and goes out as it would have.

The records read are bounded by the topic's retention: an alert that started firing
before the oldest record kept cannot be rebuilt, and its resolution is dropped, counted
(``groups_dropped_resolved``) as before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

log = logging.getLogger(__name__)

POLL_S = 0.5


def committed_records(
    kafka: dict[str, object],
    topic: str,
    group: str,
    take: Callable[[bytes | None], None],
    *,
    timeout_s: float = 60.0,
) -> int:
    """Hand ``take`` every record of ``topic`` below ``group``'s committed offsets, oldest
    first within each partition; return how many. Nothing is committed and the group is
    not joined (the partitions are assigned by hand). Raises ``TimeoutError`` if the
    records cannot all be read within ``timeout_s``, ``KafkaException`` on a broker error.
    """
    consumer = Consumer(
        {
            **kafka,
            "group.id": group,
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=10)
        parts = meta.topics.get(topic)
        if parts is None or parts.error is not None:
            return 0  # no topic: nothing was consumed
        committed = consumer.committed(
            [TopicPartition(topic, p) for p in sorted(parts.partitions)], timeout=10
        )
        todo = {tp.partition: tp.offset for tp in committed if tp.offset > _low(consumer, tp)}
        if not todo:
            return 0
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in todo])
        return _read_below(consumer, topic, todo, take, time.monotonic() + timeout_s)
    finally:
        consumer.close()


def _low(consumer: Consumer, tp: TopicPartition) -> int:
    """The oldest offset the partition still holds (retention deletes the older ones)."""
    low, _high = consumer.get_watermark_offsets(tp, timeout=10)
    return int(low)


def _read_below(
    consumer: Consumer,
    topic: str,
    todo: dict[int, int],
    take: Callable[[bytes | None], None],
    deadline: float,
) -> int:
    """Poll until every partition in ``todo`` (partition -> end offset) is read to its
    end; records at or past the end are left alone."""
    n = 0
    while todo:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"rebuilding from the alerts topic: partitions {sorted(todo)} unread"
            )
        for msg in consumer.consume(500, POLL_S):
            if msg.error() is not None:
                raise KafkaException(msg.error())
            p, offset = msg.partition(), msg.offset()
            end = None if p is None else todo.get(p)
            if end is None or offset is None or offset >= end:
                continue
            take(msg.value())
            n += 1
        for tp in consumer.position([TopicPartition(topic, p) for p in todo]):
            if tp.offset >= todo[tp.partition]:  # read to its end (skipping any gaps)
                del todo[tp.partition]
    return n
