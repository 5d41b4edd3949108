"""The broker check and topic creation, with confluent-kafka's AdminClient.

:func:`check_kafka` is what every command that needs Kafka (worker, notify, record, the
agent's Kafka sink, a demo on an external broker) runs first: one metadata request with a
bounded wait. An unreachable broker is one :class:`~ragwatch.errors.ConfigError` line
naming the command, the servers, the setting and librdkafka's reason, instead of the
seconds of connection-refused lines librdkafka would log by itself (its logger is quiet
here; its errors are collected through ``error_cb`` for the reason).
:func:`ensure_topics` creates the ragwatch topics that do not exist (dev up, demo,
workers, the notifier).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from ragwatch.config import TOPICS, Settings
from ragwatch.errors import ConfigError

log = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 5.0
_ALL_BROKERS_DOWN = -187  # librdkafka's summary error, no reason of its own
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
    names_wanted = [settings.topic(n) for n in names]
    otlp = settings.otlp_topic_name()
    if names == TOPICS and otlp:  # the OTLP topic too, so a worker can subscribe to it
        names_wanted.append(otlp)
    wanted = [t for t in names_wanted if t not in existing]
    if not wanted:
        return []
    futures = admin.client.create_topics(
        [NewTopic(t, settings.topic_partitions, 1) for t in wanted],
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
