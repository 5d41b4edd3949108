"""The worker's topic keeper: a topic that vanished is named once, re-created and said to be
back; one re-created by someone else is told by its new id; and the partitions of topics
re-created lately are read from offset 0 at the next assignment. The broker's answers are
stubbed here (what ``topic_ids`` and ``ensure_topics`` return); the same against a real
broker restarted empty is tests/integration/test_missing_topics.py."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, NamedTuple

import pytest

from ragwatch.config import Settings
from ragwatch.errors import ConfigError
from ragwatch.kafka_admin import topic_names
from ragwatch.streams.worker.topics import TopicKeeper, read_renewed_from_start


class TP(NamedTuple):
    topic: str
    partition: int


class Broker:
    """What the keeper's describe and create calls see: topic -> id (None: missing)."""

    def __init__(self, names: list[str]) -> None:
        self.ids: dict[str, str | None] = {t: f"{t}-1" for t in names}
        self.answers = True
        self.may_create = True
        self.created: list[list[str]] = []

    def describe(self, settings: Settings, names: list[str], timeout_s: float, **kw: Any) -> Any:
        if not self.answers:
            raise ConfigError("worker: cannot reach Kafka at k:9092: refused")
        return {t: self.ids[t] for t in names}

    def create(self, settings: Settings, **kw: Any) -> list[str]:
        if not self.may_create:
            raise ConfigError("cannot create topic x: TOPIC_AUTHORIZATION_FAILED")
        made = [t for t, i in self.ids.items() if i is None]
        for t in made:
            self.ids[t] = f"{t}-2"
        self.created.append(made)
        return made


class Consumer:
    """The surface of Faust's consumer used at an assignment."""

    def __init__(self, assigned: set[TP]) -> None:
        self.assigned = assigned
        self.commits: list[dict[TP, int]] = []
        self.seeks: list[tuple[TP, int]] = []

    def assignment(self) -> set[TP]:
        return self.assigned

    async def _commit(self, offsets: dict[TP, int]) -> bool:
        self.commits.append(dict(offsets))
        return True

    async def seek(self, tp: TP, offset: int) -> None:
        self.seeks.append((tp, offset))


@pytest.fixture
def settings() -> Settings:
    return Settings.from_env({"RAGWATCH_TOPIC_PREFIX": "t.", "RAGWATCH_TOPIC_PARTITIONS": "2"})


def lines(caplog: pytest.LogCaptureFixture, state: str) -> list[str]:
    """The topics named as ``state`` (missing, back) in the log, in order."""
    prefix = "topic "
    return [
        m[len(prefix) :].split(" ")[0]
        for m in (r.getMessage() for r in caplog.records)
        if m.startswith(prefix) and f" is {state}:" in m
    ]


def test_missing_topics_are_named_once_recreated_and_back(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    names = topic_names(settings)
    broker = Broker(names)
    keeper = TopicKeeper(settings, describe=broker.describe, create=broker.create)

    assert asyncio.run(keeper.check()) == []  # all there: ids noted, nothing said
    for t in names:
        broker.ids[t] = None  # the broker restarted empty
    assert asyncio.run(keeper.check()) == names
    assert lines(caplog, "missing") == names and lines(caplog, "back") == names
    assert broker.created == [names]
    assert asyncio.run(keeper.check()) == []  # their new ids are theirs: nothing again
    assert len(caplog.records) == 2 * len(names)


def test_an_unreachable_broker_is_not_judged_and_a_refused_creation_is_retried(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    gpu = settings.topic("gpu")
    broker = Broker(topic_names(settings))
    keeper = TopicKeeper(settings, describe=broker.describe, create=broker.create)
    asyncio.run(keeper.check())
    broker.answers = False
    assert asyncio.run(keeper.check()) == [] and caplog.records == []
    broker.answers, broker.may_create, broker.ids[gpu] = True, False, None
    assert asyncio.run(keeper.check()) == []
    assert asyncio.run(keeper.check()) == []  # still missing: tried again, said once
    refused = [r for r in caplog.records if "cannot re-create" in r.getMessage()]
    assert len(refused) == 1 and lines(caplog, "missing") == [gpu]
    broker.may_create = True
    assert asyncio.run(keeper.check()) == [gpu]
    assert lines(caplog, "missing") == lines(caplog, "back") == [gpu]


def test_a_topic_recreated_elsewhere_is_told_by_its_new_id(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """Deleted and created again between two checks (by hand, by another worker): never
    seen missing, but its id changed."""
    gpu = settings.topic("gpu")
    broker = Broker(topic_names(settings))
    keeper = TopicKeeper(settings, describe=broker.describe, create=broker.create)
    asyncio.run(keeper.check())
    broker.ids[gpu] = "new"
    assert asyncio.run(keeper.check()) == [gpu]
    assert lines(caplog, "missing") == [] and broker.created == []
    assert [r.getMessage() for r in caplog.records] == [
        f"topic {gpu} was re-created since the last check: a new topic id"
    ]


def test_partitions_of_recreated_topics_are_read_from_offset_0_at_the_assignment(
    settings: Settings,
) -> None:
    """At an assignment after a broker restarted empty: the keeper re-creates the topics,
    and the assigned partitions of the re-created ones get offset 0 committed and are
    sought there (their committed offsets may be the old topics'); others are left alone,
    and once the window is over nothing is done."""
    names = topic_names(settings)
    gpu, events = settings.topic("gpu"), settings.topic("events")
    now = [0.0]
    broker = Broker(names)
    keeper = TopicKeeper(
        settings, describe=broker.describe, create=broker.create, clock=lambda: now[0]
    )
    assigned = {TP(gpu, 0), TP(gpu, 1), TP("app-__assignor-__leader", 0)}
    consumer = Consumer(assigned)
    assert asyncio.run(read_renewed_from_start(consumer, keeper, within_s=60)) == []
    assert consumer.commits == consumer.seeks == []

    broker.ids[gpu] = broker.ids[events] = None
    got = asyncio.run(read_renewed_from_start(consumer, keeper, within_s=60))
    assert got == [TP(gpu, 0), TP(gpu, 1)]
    assert consumer.commits == [{TP(gpu, 0): 0, TP(gpu, 1): 0}]
    assert consumer.seeks == [(TP(gpu, 0), 0), (TP(gpu, 1), 0)]

    now[0] = 61.0  # the window is over: the committed offsets are the new topic's
    assert asyncio.run(read_renewed_from_start(consumer, keeper, within_s=60)) == []
    assert len(consumer.commits) == 1
