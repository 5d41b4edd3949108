"""The worker end to end: simulated telemetry through Tansu into Faust, alerts out to
Redis, the alerts topic and a real HTTP receiver; poison messages to the dead-letter topic;
SIGTERM commits what was processed."""

from __future__ import annotations

import json
import re
import signal
import time
from collections.abc import Callable
from typing import Any

import orjson
import redis
from confluent_kafka import Consumer, TopicPartition

from ragwatch.agents.publisher import KafkaPublisher
from ragwatch.agents.runner import run_simulation
from ragwatch.agents.sim import FleetSimulator, SimConfig
from ragwatch.config import Settings
from ragwatch.receiver import WebhookReceiver
from ragwatch.schema import DLQ_HEADER_OFFSET, DLQ_HEADER_REASON, DLQ_HEADER_TOPIC
from ragwatch.store import Keys
from tests.integration.conftest import read_records, run_ragwatch, wait_until

START = 1_767_225_600.0
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


def publish_sim(settings: Settings, config: SimConfig, duration_s: float) -> int:
    """Publish simulated telemetry as fast as possible; return the delivered count."""
    publisher = KafkaPublisher(settings.kafka_config())
    topics = {"gpu": settings.topic("gpu"), "events": settings.topic("events")}
    stats = run_simulation(FleetSimulator(config), publisher, topics=topics, duration_s=duration_s)
    assert publisher.stats.failed == 0
    assert publisher.stats.delivered == publisher.stats.produced == stats.envelopes + stats.events
    return stats.envelopes


def consume_all(settings: Settings, topic: str, expect: int) -> list[Any]:
    return read_records(settings, topic, expect)


def leak_alert(body: dict[str, Any], target: tuple[str, int, int, str]) -> bool:
    host, gpu, pid, _ = target
    return any(
        a["status"] == "firing"
        and a["labels"].get("alertname") == "GpuMemoryLeak"
        and (a["labels"]["host"], a["labels"]["gpu"], a["labels"]["pid"])
        == (host, str(gpu), str(pid))
        for a in body["alerts"]
    )


def test_leak_alert_reaches_webhook_redis_alerts_topic_and_status(
    rw_env: dict[str, str],
    receiver: WebhookReceiver,
    redis_client: redis.Redis,
    start_ragwatch: Callable[..., Any],
    make_settings: Callable[[dict[str, str]], Settings],
) -> None:
    env = {**rw_env, "RAGWATCH_WEBHOOK_URLS": receiver.url}
    settings = make_settings(env)
    worker = start_ragwatch(["worker"], env)
    start_ragwatch(["notify"], env)
    config = SimConfig(hosts=2, gpus=2, scenario="leak", start_ts=START)
    target = FleetSimulator(config).leak_target
    assert target is not None
    publish_sim(settings, config, duration_s=2 * 3600)

    body = receiver.wait_for(lambda b: leak_alert(b, target), timeout_s=90)
    assert body is not None, f"no leak alert at the webhook; worker log:\n{worker.output()[-3000:]}"

    # The webhook body: Alertmanager v4 field names, one firing alert, explained.
    assert body["version"] == "4"
    assert body["status"] == "firing"
    assert body["receiver"] == "webhook-1"  # `ragwatch notify` without a notify file
    assert body["commonLabels"]["host"] == target[0]
    (alert,) = body["alerts"]
    assert body["groupLabels"] == alert["labels"]  # group_by: ['...']: one group per alert
    labels = alert["labels"]
    assert labels["process"] == "rag-worker" and labels["severity"] == "critical"
    assert re.fullmatch(r"[0-9a-f]{12}", labels["container"])
    assert RFC3339.match(alert["startsAt"]) and alert["endsAt"] == "0001-01-01T00:00:00Z"
    assert 0.5 < alert["value"] < 1.5 and alert["expected"] == 0.0  # recent GB/h
    summary = alert["annotations"]["summary"]
    rate = float(re.search(r"grows ([0-9.]+) GB/h", summary).group(1))  # type: ignore[union-attr]
    assert 0.7 <= rate <= 1.5, summary
    assert "runs out of memory in ~" in alert["annotations"]["description"]
    # Event time: the alert starts when the window first shows > 1 GB (leak starts at +20 min,
    # 1.2 GB/h), which is well inside the published two hours.
    starts = alert["startsAt"]
    assert starts.startswith("2026-01-01T0")
    fp = alert["fingerprint"]

    # Redis: the active alert, its history and the host snapshots.
    keys = Keys(env["RAGWATCH_REDIS_PREFIX"])

    def redis_firing() -> bool:
        raw = redis_client.hget(keys.active, fp)
        return raw is not None and orjson.loads(raw)["status"] == "firing"

    wait_until(redis_firing, 10, "the firing alert in Redis")
    history = [orjson.loads(v) for v in redis_client.lrange(keys.history, 0, -1)]
    mine = [h["status"] for h in history if h["fingerprint"] == fp]
    assert mine == ["firing", "pending"]  # newest first
    wait_until(lambda: redis_client.hlen(keys.hosts) == 2, 10, "two host snapshots")

    # The alerts topic carries the transitions, keyed by fingerprint.
    records = consume_all(settings, settings.topic("alerts"), expect=2)
    assert [r.key().decode() for r in records] == [fp, fp]
    assert [orjson.loads(r.value())["status"] for r in records] == ["pending", "firing"]

    # `ragwatch status --json` reads it all back from Redis (written every second: the
    # status as the alert went out may be a moment older than the alert's own estimate)
    def leak_status() -> dict[str, Any] | None:
        out = run_ragwatch("status", "--json", env=env)
        assert out.returncode == 0, out.stderr
        status: dict[str, Any] = json.loads(out.stdout)
        gpu = next(g for g in status["hosts"][0]["gpus"] if g["index"] == target[1])
        return status if (gpu["gb_per_hour"] or 0) > 0.8 else None

    status = wait_until(leak_status, 20, "the leak's rate in the status")
    assert [h["host"] for h in status["hosts"]] == ["gpu-node-01", "gpu-node-02"]
    gpu = next(g for g in status["hosts"][0]["gpus"] if g["index"] == target[1])
    assert gpu["gb_per_hour"] > 0.8 and gpu["fb_total_bytes"] == 80 * 1024**3
    assert [a["fingerprint"] for a in status["alerts"]] == [fp]
    out = run_ragwatch("status", env=env)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "FIRING" in text and "GpuMemoryLeak" in text and f"pid={target[2]}" in text

    assert worker.stop() == 0


def test_poison_messages_go_to_deadletter_and_the_partition_keeps_going(
    rw_env: dict[str, str],
    redis_client: redis.Redis,
    start_ragwatch: Callable[..., Any],
    make_settings: Callable[[dict[str, str]], Settings],
) -> None:
    settings = make_settings(rw_env)
    worker = start_ragwatch(["worker"], rw_env)
    bad = {
        b"{not json": "malformed JSON",
        b'{"v":2,"kind":"gpu","host":"gpu-node-01","ts":1.0,"gpus":[]}': "unsupported schema",
        orjson.dumps(
            {
                "v": 1,
                "kind": "gpu",
                "host": "gpu-node-01",
                "ts": START,
                "gpus": [{"index": 0, "uuid": "u", "name": "n", "fb_used": 10, "fb_total": 5}],
            }
        ): "exceeds fb_total",
    }
    publisher = KafkaPublisher(settings.kafka_config())
    for value in bad:  # same key as the good data: same partition
        publisher.write(settings.topic("gpu"), "gpu-node-01", value)
    publisher.close()
    assert publisher.stats.delivered == len(bad)
    good = publish_sim(settings, SimConfig(hosts=1, gpus=1, start_ts=START), duration_s=600)

    records = consume_all(settings, settings.topic("deadletter"), expect=len(bad))
    for rec in records:
        headers = dict(rec.headers())
        assert headers[DLQ_HEADER_TOPIC].decode() == settings.topic("gpu")
        assert int(headers[DLQ_HEADER_OFFSET]) >= 0
        assert bad[rec.value()] in headers[DLQ_HEADER_REASON].decode()
        assert rec.key() == b"gpu-node-01"

    # The good messages behind the poison ones were processed.
    keys = Keys(rw_env["RAGWATCH_REDIS_PREFIX"])

    def counters() -> dict[str, Any] | None:
        raw = redis_client.hvals(keys.workers)
        c = orjson.loads(raw[0]) if raw else None
        return c if c and c["messages"] == good + len(bad) else None

    c = wait_until(counters, 60, "the worker to count every message")
    assert c["deadletter"] == len(bad) and c["envelopes"] == good
    assert redis_client.hexists(keys.hosts, "gpu-node-01")
    assert worker.stop() == 0


def test_sigterm_stops_cleanly_and_commits_processed_offsets(
    rw_env: dict[str, str],
    redis_client: redis.Redis,
    start_ragwatch: Callable[..., Any],
    make_settings: Callable[[dict[str, str]], Settings],
) -> None:
    settings = make_settings(rw_env)
    worker = start_ragwatch(["worker"], rw_env)
    sent = publish_sim(settings, SimConfig(hosts=3, gpus=1, start_ts=START), duration_s=1800)
    keys = Keys(rw_env["RAGWATCH_REDIS_PREFIX"])

    def processed_all() -> bool:
        raw = redis_client.hvals(keys.workers)
        return bool(raw) and orjson.loads(raw[0])["messages"] == sent

    wait_until(processed_all, 60, f"the worker to process {sent} messages")
    assert worker.stop(signal.SIGTERM) == 0
    assert "Traceback" not in worker.output()

    consumer = Consumer({**settings.kafka_config(), "group.id": settings.app_id})
    try:
        parts = [TopicPartition(settings.topic("gpu"), p) for p in range(2)]
        committed = consumer.committed(parts, timeout=10)
    finally:
        consumer.close()
    assert sum(max(tp.offset, 0) for tp in committed) == sent


def test_hosts_that_go_silent_are_pruned_from_redis(
    rw_env: dict[str, str],
    redis_client: redis.Redis,
    start_ragwatch: Callable[..., Any],
    make_settings: Callable[[dict[str, str]], Settings],
) -> None:
    """Series swept from memory kept their status, snapshot, chart index entries and chart
    lists in Redis for good (20,000 silent hosts: /api/v1/status 9.5 MB, status 29.5 s)."""
    settings = make_settings(rw_env)
    worker = start_ragwatch(["worker"], rw_env)
    keys = Keys(rw_env["RAGWATCH_REDIS_PREFIX"])
    publish_sim(settings, SimConfig(hosts=4, gpus=1, start_ts=START), duration_s=600)

    def counts() -> tuple[int, int, int]:
        return (
            redis_client.hlen(keys.hosts),
            redis_client.hlen(keys.snapshots["host"]),
            redis_client.hlen(keys.series_index),
        )

    wait_until(lambda: counts()[:2] == (4, 4) and counts()[2] >= 8, 60, worker.output)
    charts_before = counts()[2]
    # only gpu-node-01 goes on, for 80 minutes of event time: the others are swept an
    # hour after their last sample
    later = SimConfig(hosts=1, gpus=1, start_ts=START + 600)
    publish_sim(settings, later, duration_s=80 * 60)
    # sweeps run against the slowest partition read in the last 30 s (the silent hosts'
    # may be another): the next envelopes of gpu-node-01, after that, sweep them
    time.sleep(31)
    publish_sim(settings, SimConfig(hosts=1, gpus=1, start_ts=START + 5400), duration_s=120)
    wait_until(lambda: counts()[:2] == (1, 1), 90, lambda: f"{counts()} {worker.output()[-3000:]}")
    assert [h.decode() for h in redis_client.hkeys(keys.hosts)] == ["gpu-node-01"]
    index = [sid.decode() for sid in redis_client.hkeys(keys.series_index)]
    assert index and all(":gpu-node-01:" in sid for sid in index)
    assert len(index) < charts_before
    lists = [
        k for k in redis_client.scan_iter(f"{keys.series}:*") if k != keys.series_index.encode()
    ]
    assert len(lists) == len(index)
    raw = redis_client.hvals(keys.workers)
    assert orjson.loads(raw[0])["pruned"] == 3
    assert worker.stop() == 0
