"""A worker killed with SIGKILL resumes from Redis snapshots: the pending timer it had keeps
running, the alert fires once, and a second kill after it fired sends nothing again."""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import orjson
import redis
import redis.asyncio as aioredis
from confluent_kafka import Consumer, TopicPartition

from ragwatch.agents.publisher import KafkaPublisher
from ragwatch.agents.sim import FleetSimulator, SimConfig
from ragwatch.codec import encode
from ragwatch.config import Settings
from ragwatch.receiver import WebhookReceiver
from ragwatch.schema import Alert, Envelope
from ragwatch.store import Keys, RedisState
from ragwatch.streams.alerting.rules import load_rules
from ragwatch.streams.pipelines.fleet import Pipelines
from ragwatch.streams.worker.snapshot import load_host
from tests.integration.conftest import wait_until

START = 1_767_225_600.0
MIN = 60.0


def telemetry(config: SimConfig, minutes: float) -> list[tuple[float, list[Envelope]]]:
    ticks = []
    for ts, envs, events in FleetSimulator(config).ticks():
        if ts - START >= minutes * MIN:
            return ticks
        ticks.append((ts, [*envs, *events]))
    raise AssertionError("unreachable")


def publish(
    settings: Settings, ticks: list[tuple[float, list[Envelope]]], a: float, b: float
) -> int:
    """Publish the ticks in [a, b) minutes; return how many envelopes were delivered."""
    publisher = KafkaPublisher(settings.kafka_config())
    for ts, envs in ticks:
        if a * MIN <= ts - START < b * MIN:
            for env in envs:
                kind = "gpu" if env.kind == "gpu" else "events"
                publisher.write(settings.topic(kind), env.key, encode(env))
    publisher.close()
    assert publisher.stats.failed == 0
    return publisher.stats.delivered


def leak_bodies(receiver: WebhookReceiver, status: str) -> list[dict[str, Any]]:
    return [
        a
        for body in receiver.bodies
        for a in body["alerts"]
        if a["labels"]["alertname"] == "GpuMemoryLeak" and a["status"] == status
    ]


def test_kill_9_keeps_the_pending_timer_and_pages_exactly_once(
    rw_env: dict[str, str],
    receiver: WebhookReceiver,
    redis_client: redis.Redis,
    start_ragwatch: Callable[..., Any],
    make_settings: Callable[[dict[str, str]], Settings],
) -> None:
    env = {**rw_env, "RAGWATCH_WEBHOOK_URLS": receiver.url}
    settings = make_settings(env)
    keys = Keys(env["RAGWATCH_REDIS_PREFIX"])
    config = SimConfig(hosts=2, gpus=2, scenario="leak", start_ts=START)
    host = "gpu-node-01"
    ticks = telemetry(config, 100)

    def snapshot_has(status: str) -> bool:
        data = redis_client.hget(keys.snapshots["host"], host)
        if data is None:
            return False
        probe = Pipelines(load_rules())
        load_host(probe, host, bytes(data))
        return any(a.status == status for a in probe.engine.active.values())

    def committed() -> int:
        consumer = Consumer({**settings.kafka_config(), "group.id": settings.app_id})
        try:
            parts = [TopicPartition(settings.topic("gpu"), p) for p in range(2)]
            return sum(max(tp.offset, 0) for tp in consumer.committed(parts, timeout=10))
        finally:
            consumer.close()

    # 1. The leak goes pending at minute 36 (fires at 41): once the worker has committed its
    # offsets (so a restart does not replay from the start), SIGKILL it at minute 38.
    notifier = start_ragwatch(["notify"], env)  # keeps running through the worker kills
    first = start_ragwatch(["worker"], env)
    sent = publish(settings, ticks, 0, 38)
    wait_until(lambda: committed() == sent, 90, "the first worker to commit its offsets")
    wait_until(
        lambda: snapshot_has("pending"),
        90,
        lambda: "a pending leak in the snapshot:\n" + first.output()[-3000:],
    )
    (pending,) = [orjson.loads(v) for v in redis_client.hvals(keys.active)]
    assert pending["status"] == "pending"
    first.stop(signal.SIGKILL)

    # 2. A new worker restores the host and keeps the timer: the alert fires at minute 41
    # with the start of the pending alert, once (a fresh detector would need 10 minutes of
    # data before it even has a slope).
    second = start_ragwatch(["worker"], env)
    publish(settings, ticks, 38, 70)
    wait_until(lambda: leak_bodies(receiver, "firing"), 90, lambda: second.output()[-3000:])
    wait_until(lambda: snapshot_has("firing"), 30, "the firing leak in the snapshot")
    (firing,) = leak_bodies(receiver, "firing")
    assert firing["fingerprint"] == pending["fingerprint"]
    assert firing["startsAt"] == "2026-01-01T00:36:00Z"  # minute 36: the timer was kept
    assert "restored" in second.output()
    second.stop(signal.SIGKILL)

    # 3. Killed again after paging: the third worker neither re-pages nor forgets.
    third = start_ragwatch(["worker"], env)
    sent = publish(settings, ticks, 70, 100)

    def caught_up() -> bool:
        raw = redis_client.hget(keys.hosts, host)
        gpus = orjson.loads(raw)["gpus"] if raw else []
        return bool(gpus) and max(g["ts"] for g in gpus) >= START + 99 * MIN

    wait_until(caught_up, 90, lambda: f"the third worker to process {sent} envelopes")
    assert len(leak_bodies(receiver, "firing")) == 1
    active = [orjson.loads(v) for v in redis_client.hvals(keys.active)]
    assert [(a["fingerprint"], a["status"]) for a in active] == [(pending["fingerprint"], "firing")]
    assert third.stop() == 0
    assert notifier.stop() == 0


async def test_a_transition_is_claimed_for_receivers_once(rw_env: dict[str, str]) -> None:
    client = aioredis.from_url(rw_env["RAGWATCH_REDIS_URL"])
    store = RedisState(client, rw_env["RAGWATCH_REDIS_PREFIX"])
    alert = Alert(
        rule="R",
        severity="critical",
        status="firing",
        labels={"host": "h"},
        annotations={},
        value=1.0,
        expected=None,
        starts_at=START,
        ends_at=None,
        fingerprint="abc",
    )
    try:
        assert await store.notified(alert) is False  # read before publishing, claimed after
        assert await store.claim_notification(alert) is True
        assert await store.notified(alert) is True
        assert await store.claim_notification(alert) is False  # the same transition again
        resolved = replace(alert, status="resolved", ends_at=START + 60)
        assert await store.claim_notification(resolved) is True
        again = replace(alert, starts_at=START + 3600)
        assert await store.claim_notification(again) is True  # a new firing of the same alert
        ttl = await client.ttl(f"{store.keys.notified}:abc:firing:{START!r}")
        assert 6 * 86400 < ttl <= 7 * 86400
    finally:
        await client.aclose()
