"""The broker check and topic creation, with confluent-kafka's AdminClient.

:func:`check_kafka` is what every command that needs Kafka (worker, notify, record, the
agent's Kafka sink, a demo on an external broker) runs first: one metadata request with a
bounded wait. An unreachable broker is one :class:`~ragwatch.errors.ConfigError` line
naming the command, the servers, the setting and librdkafka's reason, instead of the
seconds of connection-refused lines librdkafka would log by itself (its logger is quiet
here; its errors are collected through ``error_cb`` for the reason).
:func:`ensure_topics` creates the ragwatch topics that do not exist (dev up, demo,
workers, the notifier).

Topics can also vanish while processes run: deleted by hand, or with a broker that
restarted empty (memory storage). :func:`missing_topics` is the cheap check for that (one
metadata request, bounded), :func:`topic_ids` the same with each topic's id (a re-created
topic has a new one), :class:`MissingTopics` what a long-running process says about it: one
warning per topic when it goes missing, one line when it is back, however often it looks
(``TOPIC_CHECK_S``: how often the worker and the notifier look).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any

from ragwatch.config import TOPICS, Settings
from ragwatch.errors import ConfigError

log = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 5.0
TOPIC_CHECK_S = 10.0  # how often a worker or a notifier asks whether its topics exist
# the facts topic (streams/worker/facts_feed.py): one partition, so a worker's progress is
# read after the facts it published before; compacted, the newest record of each key kept
FACTS_PARTITIONS = 1
FACTS_CONFIG = {"cleanup.policy": "compact"}
_ALL_BROKERS_DOWN = -187  # librdkafka's summary error, no reason of its own
_UNKNOWN_TOPIC = 3  # UNKNOWN_TOPIC_OR_PART
_AFTER = re.compile(r"\s*\(after \d+ms in state \w+\)$")


class _QuietAdmin:
    """An AdminClient whose librdkafka log stays silent; its errors are kept for a reason."""

    def __init__(self, settings: Settings) -> None:
        from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

        self.errors: list[Any] = []
        conf: dict[str, Any] = {
            **settings.kafka_config(),
            "log_level": 0,  # librdkafka's own log (a line per refused connect) stays silent
            "error_cb": self.errors.append,
        }
        self.client = AdminClient(conf)

    def reason(self, error: Any) -> str:
        """librdkafka's last specific error (e.g. ``Connect to ipv4#127.0.0.1:1 failed:
        Connection refused``), else the text of ``error`` (a KafkaError)."""
        self.client.poll(0)  # serves error_cb
        specific = [e for e in self.errors if e.code() != _ALL_BROKERS_DOWN]
        text = str(specific[-1].str() if specific else error.str())
        where, sep, rest = text.partition(": ")
        return _AFTER.sub("", rest if sep and "/" in where else text)

    def topics(self, settings: Settings, command: str, timeout_s: float) -> set[str]:
        """The broker's topic names; ConfigError if it does not answer within timeout_s."""
        from confluent_kafka import KafkaException

        try:
            return set(self.client.list_topics(timeout=timeout_s).topics)
        except KafkaException as exc:
            raise ConfigError(
                f"{command}: cannot reach Kafka at {settings.kafka_bootstrap} "
                f"(RAGWATCH_KAFKA_BOOTSTRAP): {self.reason(exc.args[0])}"
            ) from None


def check_kafka(settings: Settings, command: str, timeout_s: float = CHECK_TIMEOUT_S) -> None:
    """Raise ConfigError (``COMMAND: cannot reach Kafka at ... : REASON``) unless the
    broker answers a metadata request within ``timeout_s``."""
    _QuietAdmin(settings).topics(settings, command, timeout_s)


def topic_names(settings: Settings, names: tuple[str, ...] = TOPICS) -> list[str]:
    """The full names (prefix included) of ``names`` (roles of :data:`TOPICS`); all of
    them with the OTLP topic too, if one is set, so a worker can subscribe to it."""
    full = [settings.topic(n) for n in names]
    otlp = settings.otlp_topic_name()
    if names == TOPICS and otlp:
        full.append(otlp)
    return full


def missing_topics(
    settings: Settings,
    names: Iterable[str],
    timeout_s: float = CHECK_TIMEOUT_S,
    *,
    command: str = "topic check",
) -> list[str]:
    """Those of ``names`` (full topic names) the broker does not have, in their order: one
    metadata request. A broker that does not answer within ``timeout_s`` is a ConfigError
    (``COMMAND: cannot reach Kafka at ...``), not a missing topic. Blocking: an asyncio
    caller runs it in a thread (``asyncio.to_thread``)."""
    existing = _QuietAdmin(settings).topics(settings, command, timeout_s)
    return [n for n in names if n not in existing]


def topic_ids(
    settings: Settings,
    names: Iterable[str],
    timeout_s: float = CHECK_TIMEOUT_S,
    *,
    command: str = "topic check",
) -> dict[str, str | None]:
    """Each of ``names`` (full topic names) with its topic id: None if the broker does not
    have it, "" if it gives no id (a broker before topic ids). A topic deleted and created
    again has a new id: that is how a process tells a re-created topic from the one it
    read, even when it never saw it missing. A broker that does not answer within
    ``timeout_s`` is a ConfigError, as in :func:`missing_topics`. Blocking."""
    from confluent_kafka import KafkaException, TopicCollection

    names = list(names)
    admin = _QuietAdmin(settings)
    futures = admin.client.describe_topics(TopicCollection(names), request_timeout=timeout_s)
    ids: dict[str, str | None] = {}
    for name in names:
        try:
            uuid = futures[name].result().topic_id
        except KafkaException as exc:
            if exc.args[0].code() != _UNKNOWN_TOPIC:
                raise ConfigError(
                    f"{command}: cannot reach Kafka at {settings.kafka_bootstrap} "
                    f"(RAGWATCH_KAFKA_BOOTSTRAP): {admin.reason(exc.args[0])}"
                ) from None
            ids[name] = None
            continue
        zero = not uuid.get_most_significant_bits() and not uuid.get_least_significant_bits()
        ids[name] = "" if zero else str(uuid)
    return ids


class MissingTopics:
    """The topics a process found missing, said once: a warning per topic when it goes
    missing (``topic T is missing: MISSING``) and one when it is back (``topic T is back:
    BACK``), however often it is checked. ``missing`` and ``back`` finish the lines;
    ``missing`` may hold one ``%d``, filled by the caller's ``count`` (e.g. records waiting).

    >>> import logging, sys
    >>> log = logging.getLogger("doc"); log.addHandler(logging.StreamHandler(sys.stdout))
    >>> log.propagate = False
    >>> topics = MissingTopics(log, "%d record(s) wait for it", "sending them")
    >>> topics.gone("ragwatch.gpu", 12), topics.gone("ragwatch.gpu", 13)
    topic ragwatch.gpu is missing: 12 record(s) wait for it
    (True, False)
    >>> topics.update(["ragwatch.gpu", "ragwatch.events"], missing=[])
    topic ragwatch.gpu is back: sending them
    ([], ['ragwatch.gpu'])
    """

    def __init__(self, logger: logging.Logger, missing: str, back: str) -> None:
        self._log, self._missing_note, self._back_note = logger, missing, back
        self.missing: set[str] = set()

    def gone(self, topic: str, count: int | None = None) -> bool:
        """``topic`` is missing; True (and a warning) if it was not known to be."""
        if topic in self.missing:
            return False
        self.missing.add(topic)
        note = self._missing_note % count if count is not None else self._missing_note
        self._log.warning("topic %s is missing: %s", topic, note)
        return True

    def back(self, topic: str, note: str | None = None) -> bool:
        """``topic`` exists (again); True (and a line) if it was missing."""
        if topic not in self.missing:
            return False
        self.missing.discard(topic)
        self._log.warning("topic %s is back: %s", topic, note or self._back_note)
        return True

    def update(self, checked: Iterable[str], missing: Iterable[str]) -> tuple[list[str], list[str]]:
        """The result of a check of ``checked``, of which ``missing`` are missing: the
        topics newly missing and those back, each said once."""
        now = set(missing)
        gone = [t for t in checked if t in now and self.gone(t)]
        back = [t for t in checked if t not in now and self.back(t)]
        return gone, back


def partitions_of(settings: Settings, topic: str) -> int:
    """How many partitions ragwatch creates ``topic`` with (a full name)."""
    return FACTS_PARTITIONS if topic == settings.topic("facts") else settings.topic_partitions


def ensure_topics(
    settings: Settings,
    names: tuple[str, ...] = TOPICS,
    timeout_s: float = 15.0,
    *,
    command: str = "ensure topics",
) -> list[str]:
    """Create the ragwatch topics that do not exist yet; return the names created."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

    admin = _QuietAdmin(settings)
    existing = admin.topics(settings, command, timeout_s)
    wanted = [t for t in topic_names(settings, names) if t not in existing]
    if not wanted:
        return []
    facts = settings.topic("facts")
    futures = admin.client.create_topics(
        [
            NewTopic(t, partitions_of(settings, t), 1, config=FACTS_CONFIG if t == facts else {})
            for t in wanted
        ],
        operation_timeout=timeout_s,
        request_timeout=timeout_s,
    )
    created = []
    for topic, fut in futures.items():
        try:
            fut.result()
            created.append(topic)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise ConfigError(f"cannot create topic {topic}: {exc.args[0]}") from None
    log.info("created topics %s", created)
    return created
