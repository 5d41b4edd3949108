"""Hints across workers: the facts topic joins a host's GPUs and the services on it.

Three workers' pipelines, their facts published to and read from a real facts topic on
the session's Tansu (confluent-kafka producer, :class:`FactsReader` threads), each fed
its own partitions' share of one scenario at its own pace: worker 0 every host's GPU
telemetry and events, worker 1 every service's requests, worker 2 nothing (forced apart,
as partitions land in production). Their alerts carry the same hints as one worker's
that reads everything.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from confluent_kafka import Producer

from ragwatch.agents.scenario import build
from ragwatch.codec import gpu_wire
from ragwatch.embedded import EmbeddedStack
from ragwatch.kafka import KafkaClient
from ragwatch.kafka_admin import ensure_topics
from ragwatch.schema import Alert, Envelope, GpuEnvelope, RequestsEnvelope, Transition
from ragwatch.streams.alerting.rules import load_rules
from ragwatch.streams.pipelines.fleet import Pipelines, Run
from ragwatch.streams.worker.facts_feed import FactsFeed, FactsReader
from ragwatch.streams.worker.facts_table import FactsTable
from tests.integration.conftest import stack_env

HOURS = 3.0
NUMBER = re.compile(r"[-+]?\d+(\.\d+)?")
BATCH = 64


def scenario() -> list[Envelope]:
    """The demo's ``all`` story on 4 hosts: a leak on gpu-node-01 and a degraded
    rag-api-1 on the same host."""
    world = build("all", hosts=4, gpus=2, services=2, interval_s=60.0, seed=0)
    return [e for e in world.envelopes(hours=HOURS) if not isinstance(e, Alert)]


def firing(transitions: Sequence[Transition]) -> dict[tuple[str, str], str]:
    """(rule, fingerprint) -> hint of every alert that started firing."""
    return {
        (t.alert.rule, t.alert.fingerprint): t.alert.annotations["hint"]
        for t in transitions
        if t.fires
    }


class Worker:
    """One worker's pipelines and facts, fed its share of the envelopes."""

    def __init__(self, me: str, kafka: dict[str, Any], topic: str, side: str = "") -> None:
        self.side = side  # gpu, requests or none
        self.table = FactsTable(me)
        self.pipes = Pipelines(load_rules(), remote=self.table)
        self.producer = Producer({**kafka, "linger.ms": 0})
        self.topic, self.kafka = topic, kafka
        self.feed = FactsFeed(me, self.pipes, self.table, self.send, wait_s=30.0)
        self.pipes.tap(self.feed.observe)
        self.out: list[Transition] = []
        self.debug: list[Any] = []

    def _at(self, worker: str) -> float:
        """How far ``worker`` has processed GPU telemetry, as this one's table has it
        (done, or not known yet as a GPU reader: no lead to keep)."""
        known = self.table.progress.get(worker)
        ts = known[0].host_ts if known is not None else None
        return math.inf if ts is None else ts

    async def send(self, key: bytes, value: bytes | None) -> None:
        self.producer.produce(self.topic, value=value, key=key)
        self.producer.poll(0)

    def read_up_to(self, ts: float | None) -> tuple[float | None, float | None]:
        """How far it has processed the side it reads (0: it began reading it)."""
        gpus, requests = len(self.pipes.gpus) > 0, len(self.pipes.requests) > 0
        if not gpus and not requests:
            return (0.0, None) if self.side == "gpu" else (None, 0.0) if self.side else (None, None)
        return (ts if gpus else None, ts if requests else None)

    async def run(
        self,
        envelopes: Sequence[Envelope],
        pause_s: float,
        batch: int = BATCH,
        lead: tuple[str, float] | None = None,
    ) -> None:
        """Feed it the envelopes a batch at a time, pausing pause_s after each; lead:
        (another worker's name, seconds): it does not run further ahead of where its facts
        table has that one than that (live telemetry reaches every worker at once: a
        loaded machine must not turn a pause's difference, or the facts topic's delay,
        into hours), waiting at most 20 s in all."""
        reader = FactsReader(self.kafka, self.topic, self.table, asyncio.get_running_loop())
        reader.start()
        try:
            await self.feed.heartbeat(self.read_up_to(None))  # reading begins
            for _ in range(400):  # all start together, as a group's assignment
                if len(self.table.progress) == 3:  # (each reader has caught up)
                    break
                await asyncio.sleep(0.05)
            run, waited = Run(self.pipes, batch), 0.0
            for i, env in enumerate(envelopes):
                if isinstance(env, GpuEnvelope | RequestsEnvelope):
                    got = run.add(gpu_wire(env) if isinstance(env, GpuEnvelope) else env)
                else:
                    got = run.flush() + self.pipes.process(env)
                if got or (i + 1) % batch == 0:  # (a batch is processed: its progress)
                    self.out += await self.feed.settle(got, self.read_up_to(env.ts))
                    await asyncio.sleep(pause_s)  # the others go on meanwhile
                    while lead is not None and env.ts - self._at(lead[0]) > lead[1]:
                        if (waited := waited + 0.01) > 20.0:
                            break
                        await asyncio.sleep(0.01)
            self.out += await self.feed.settle(run.flush(), self.read_up_to(None))
            for _ in range(20):  # idle now: the others need not wait for this one
                await self.feed.heartbeat((None, None))
                await asyncio.sleep(0.05)
        finally:
            await asyncio.to_thread(reader.stop)
            self.producer.flush(5)


@pytest.fixture
def facts_topic(stack: EmbeddedStack, tmp_path: Any) -> Iterator[tuple[dict[str, Any], str]]:
    from ragwatch.config import Settings

    settings = Settings.from_env(stack_env(stack, tmp_path))
    ensure_topics(settings, ("facts",), command="test")
    yield KafkaClient.of(settings).librdkafka(), settings.topic("facts")


def test_three_workers_forced_apart_give_the_same_hints_as_one(
    facts_topic: tuple[dict[str, Any], str],
) -> None:
    envelopes = scenario()
    one = firing(list(Pipelines(load_rules()).run(envelopes)))
    # the story's alerts, each with the other side in its hint
    rules = {rule for rule, _ in one}
    assert {"GpuMemoryLeak", "RetrievalSlowdown", "TokensPerRequestDrop"} <= rules, rules
    kafka, topic = facts_topic
    workers = [Worker("w0", kafka, topic, "gpu"), Worker("w1", kafka, topic, "requests")]
    workers.append(Worker("w2", kafka, topic))
    gpu_side = [e for e in envelopes if not isinstance(e, RequestsEnvelope)]
    request_side = [e for e in envelopes if isinstance(e, RequestsEnvelope)]

    async def main() -> None:
        await asyncio.gather(
            workers[0].run(gpu_side, 0.0),
            workers[1].run(request_side, 0.002),  # the slower one: hints wait for it
            workers[2].run([], 0.0),
        )

    asyncio.run(main())
    three = firing(workers[0].out + workers[1].out + workers[2].out)
    # the same alerts and hints: the same causes, effects and suspicion; a number may
    # differ in its last digit (one worker reads the other side as it is after a batch,
    # up to a bucket later than the alert; several, as of the alert's time)
    assert three.keys() == one.keys()
    assert {k: NUMBER.sub("#", h) for k, h in three.items()} == {
        k: NUMBER.sub("#", h) for k, h in one.items()
    }
    leak = next(h for (rule, _), h in three.items() if rule == "GpuMemoryLeak")
    assert "rag-api-1 on the same host shows" in leak, leak
    slow = next(h for (rule, _), h in three.items() if rule == "RetrievalSlowdown")
    assert "gpu-node-01" in slow, slow
    assert workers[0].feed.waited > 0  # the GPU side was ahead and waited
    assert workers[0].feed.incomplete == workers[1].feed.incomplete == 0


def test_like_gpus_on_two_workers_page_as_on_one(
    facts_topic: tuple[dict[str, Any], str],
) -> None:
    """Twelve GPUs of one Deployment on six hosts, hosts 0-2 read by w0 and 3-5 by w1
    (the slower), w2 idle: a hung GPU on w0's side and a hot one on w1's page as they do
    with one worker, each from the worker that owns its host; every GPU is compared with
    the eleven others, half of them known only from the facts topic."""
    from tests.unit.test_gpu_peers import fleet, hot, hung, replica_pages

    envelopes: list[Envelope] = list(fleet(6, 2, 6.0, {(1, 0): hung(2.0), (4, 1): hot(2.0)}))
    one = replica_pages(list(Pipelines(load_rules()).run(envelopes)))
    assert {(r, h) for r, h, _, _ in one} == {
        ("ReplicaGpuUtilOutlier", "node-01"),
        ("ReplicaGpuTempOutlier", "node-04"),
    }, one
    kafka, topic = facts_topic
    workers = [Worker(f"w{i}", kafka, topic, "gpu" if i < 2 else "") for i in range(3)]
    first = {"node-00", "node-01", "node-02"}

    async def main() -> None:
        await asyncio.gather(
            # a batch a minute of event time (three hosts), a pause after each: w1 is
            # 10 % slower, so w0's comparisons wait for its facts; w0 at most 30 minutes
            # ahead (as with live telemetry), within the hour the facts table keeps
            workers[0].run(
                [e for e in envelopes if e.key in first], 0.005, batch=3, lead=("w1", 1800.0)
            ),
            workers[1].run(
                [e for e in envelopes if e.key not in first], 0.0055, batch=3, lead=("w0", 1800.0)
            ),
            workers[2].run([], 0.0),
        )

    asyncio.run(main())
    peers = [w.pipes.gpus.peers for w in workers]
    assert peers[0].compared >= 300 and peers[1].compared >= 300
    assert peers[0].incomplete == peers[1].incomplete == 0  # every minute with all 12 GPUs
    by_worker = [replica_pages(w.out) for w in workers]
    assert {(r, h, g) for r, h, g, _ in by_worker[0] + by_worker[1]} == {
        (r, h, g) for r, h, g, _ in one
    }
    assert {h for _, h, _, _ in by_worker[0]} == {"node-01"}
    assert {h for _, h, _, _ in by_worker[1]} == {"node-04"}
    assert by_worker[2] == []
    # at the same event time: the rules run at the minute compared, however late the
    # other worker's facts of it came
    starts = {(r, h): t for r, h, _, t in one}
    for r, h, _, t in by_worker[0] + by_worker[1]:
        assert abs(t - starts[r, h]) <= 2 / 60, (r, h, t, starts[r, h])
