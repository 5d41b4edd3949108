"""Topic creation with confluent-kafka's AdminClient (used by dev up, demo and workers)."""

from __future__ import annotations

import logging

from ragwatch.config import TOPICS, Settings
from ragwatch.errors import ConfigError

log = logging.getLogger(__name__)


def ensure_topics(
    settings: Settings, names: tuple[str, ...] = TOPICS, timeout_s: float = 15.0
) -> list[str]:
    """Create the ragwatch topics that do not exist yet; return the names created."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient(settings.kafka_config())
    try:
        existing = set(admin.list_topics(timeout=timeout_s).topics)
    except KafkaException as exc:
        raise ConfigError(
            f"cannot reach Kafka at {settings.kafka_bootstrap}: {exc.args[0]}"
        ) from None
    wanted = [settings.topic(n) for n in names if settings.topic(n) not in existing]
    if not wanted:
        return []
    futures = admin.create_topics(
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
