"""The publisher through a broker outage, against a real Tansu broker that is killed and
restarted (memory storage: the restarted broker is empty and does not know the producer)."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import orjson

from ragwatch.agents.publisher import KafkaPublisher
from ragwatch.agents.sim import FleetSimulator, SimConfig
from ragwatch.agents.spool import Spool
from ragwatch.codec import encode
from ragwatch.config import Settings
from ragwatch.embedded import EmbeddedStack
from ragwatch.kafka_admin import ensure_topics
from tests.integration.conftest import read_records

TOPIC = "ragwatch.gpu"


class Sampler:
    """Writes simulated host envelopes into the publisher from its own thread, like an agent."""

    def __init__(self, publisher: KafkaPublisher) -> None:
        self.publisher = publisher
        self.ticks = FleetSimulator(SimConfig(hosts=3, gpus=1, start_ts=1_767_225_600.0)).ticks()
        self.written: list[tuple[str, float]] = []
        self.max_write_s = 0.0

    def run(self, n_ticks: int, pause_s: float = 0.01) -> None:
        for _, (_, envelopes, _) in zip(range(n_ticks), self.ticks, strict=False):
            for env in envelopes:
                t0 = time.perf_counter()
                self.publisher.write(TOPIC, env.host, encode(env))
                self.max_write_s = max(self.max_write_s, time.perf_counter() - t0)
                self.written.append((env.host, env.ts))
            time.sleep(pause_s)


def read_all(settings: Settings, expect: int) -> list[tuple[str, float]]:
    envs = [orjson.loads(m.value()) for m in read_records(settings, TOPIC, expect)]
    return [(e["host"], e["ts"]) for e in envs]


def test_broker_outage_loses_nothing_and_keeps_per_host_order(tmp_path: Path) -> None:
    stack = EmbeddedStack(tmp_path / "stack")
    stack.up(("kafka",))
    settings = Settings.from_env({**stack.env(), "RAGWATCH_TOPIC_PARTITIONS": "2"})
    ensure_topics(settings)
    spool = Spool(tmp_path / "spool", max_bytes=64 << 20)
    publisher = KafkaPublisher(
        settings.kafka_config(), queue_max=200, max_in_flight=100, spool=spool, stall_s=3.0
    )
    sampler = Sampler(publisher)
    try:
        sampler.run(50)
        assert publisher.flush(30) == 0
        before = len(sampler.written)  # delivered to the broker that is about to die

        stack.kill("kafka")
        sampler.run(300)  # ~3 s of sampling with the broker gone
        assert publisher.stats.spooled > 0  # the memory queue overflowed into the spool
        assert publisher.queued >= len(sampler.written) - before

        stack.up(("kafka",))  # back on the same port, empty, not knowing the producer id
        ensure_topics(settings)
        sampler.run(100)
        assert publisher.flush(60) == 0, f"still queued: {publisher.queued}"
        expected = sampler.written[before:]
        assert publisher.stats.delivered == len(sampler.written), publisher.stats
        got = read_all(settings, expect=len(expected))
    finally:
        publisher.close(10)
        stack.down()

    # Every envelope written during and after the outage arrived, once, in order per host.
    assert sorted(got) == sorted(expected)
    assert len(got) == len(set(got))
    per_host: dict[str, list[float]] = defaultdict(list)
    for host, ts in got:
        per_host[host].append(ts)
    for host, tss in per_host.items():
        assert tss == sorted(tss), f"{host} out of order"
    # Sampling never waited for the network.
    assert sampler.max_write_s < 0.05
    assert publisher.stats.dropped == 0 and spool.dropped == 0


def test_close_with_the_broker_down_keeps_the_backlog_for_the_next_start(
    tmp_path: Path,
) -> None:
    stack = EmbeddedStack(tmp_path / "stack")
    stack.up(("kafka",))
    settings = Settings.from_env({**stack.env(), "RAGWATCH_TOPIC_PARTITIONS": "2"})
    ensure_topics(settings)
    try:
        stack.kill("kafka")
        first = KafkaPublisher(
            settings.kafka_config(),
            queue_max=50,
            spool=Spool(tmp_path / "spool", max_bytes=64 << 20),
        )
        sampler = Sampler(first)
        sampler.run(60, pause_s=0)
        first.close(timeout=1)  # broker down: nothing can be delivered
        assert first.stats.delivered == 0 and first.stats.dropped == 0
        assert len(Spool(tmp_path / "spool", max_bytes=64 << 20)) == len(sampler.written)

        stack.up(("kafka",))
        ensure_topics(settings)
        second = KafkaPublisher(
            settings.kafka_config(), spool=Spool(tmp_path / "spool", max_bytes=64 << 20)
        )
        second.write(TOPIC, "gpu-node-01", encode(next(sampler.ticks)[1][0]))
        assert second.flush(30) == 0
        second.close()
        got = read_all(settings, expect=len(sampler.written) + 1)
    finally:
        stack.down()
    assert len(got) == len(set(got)) == len(sampler.written) + 1
    assert set(sampler.written) < set(got)
    for host in {h for h, _ in sampler.written}:  # per-host order survives the restart
        assert [ts for h, ts in got if h == host][: len(sampler.written) // 3] == [
            ts for h, ts in sampler.written if h == host
        ]
