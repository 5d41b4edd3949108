"""Hostile and broken input on every topic a worker reads: each message is dead-lettered
with its reason (and counted), and the partition keeps going: the good telemetry behind it
is processed."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson
import redis
from confluent_kafka import Consumer, TopicPartition

from ragwatch.agents.publisher import KafkaPublisher
from ragwatch.agents.sim import SimConfig
from ragwatch.config import Settings
from ragwatch.schema import DLQ_HEADER_REASON, DLQ_HEADER_TOPIC
from ragwatch.streams.state import Keys
from tests.integration.conftest import read_records, wait_until
from tests.integration.test_worker import START, publish_sim

GPU = {"index": 0, "uuid": "GPU-0", "name": "H200", "fb_used": 1, "fb_total": 2}


def gpu_env(**over: Any) -> bytes:
    return orjson.dumps(
        {"v": 1, "kind": "gpu", "host": "gpu-node-01", "ts": START, "gpus": [GPU], **over}
    )


def requests_env(record: dict[str, Any], **over: Any) -> bytes:
    rec = {"ts": START, "status": "ok", "e2e_ms": 800.0, "context_tokens": 10, "output_tokens": 5}
    env = {"v": 1, "kind": "requests", "service": "rag-api", "instance": "i1", "ts": START}
    return orjson.dumps({**env, "records": [{**rec, **record}], **over})


def event_env(**over: Any) -> bytes:
    env = {"v": 1, "kind": "event", "host": "gpu-node-01", "ts": START, "type": "oom_kill"}
    return orjson.dumps({**env, **over})


def deep_event(depth: int) -> bytes:
    """An event whose attribute nests lists ``depth`` levels deep, envelope included (orjson
    reads up to 1,023; a recursive check would run out of stack on it)."""
    head = event_env()[:-1]
    return head + b',"detail":' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


def test_hostile_messages_are_dead_lettered_with_a_reason_and_nothing_stalls(
    rw_env: dict[str, str],
    redis_client: redis.Redis,
    start_ragwatch: Callable[..., Any],
    make_settings: Callable[[dict[str, str]], Settings],
) -> None:
    env = {**rw_env, "RAGWATCH_MAX_CLOCK_SKEW": "600"}
    settings = make_settings(env)
    worker = start_ragwatch(["worker"], env)
    future = time.time() + 86400
    bad: dict[str, dict[bytes, str]] = {
        "gpu": {
            b'{"v":1,"kind":"gpu","host":"h","ts":1.0,"gpus":[{"fb_used":NaN}]}': "malformed JSON",
            b"[1, 2, 3]": "expected a JSON object",
            gpu_env(v="1"): "unsupported schema version",
            gpu_env(host="gpu-node-01\nFIRING"): "control character U+000A",
            gpu_env(host="h" * 300): "longer than 256 characters",
            gpu_env(gpus=[{**GPU, "fb_used": 3}]): "exceeds fb_total",
            gpu_env(gpus=[{**GPU, "gpu_util": -5.0}]): "must be >= 0",
            gpu_env(gpus=[{**GPU, "fb_used": "1"}]): "expected integer, got str",
            gpu_env(gpus=[{**GPU, "procs": [{"pid": 1, "name": "<script>\x07", "gpu_mem": 1}]}]): (
                "control character U+0007"
            ),
            gpu_env(ts=future): "ahead of this worker's clock",
        },
        "requests": {
            requests_env({"e2e_ms": -1.0}): "must be >= 0",
            requests_env({"ts": future}): "ahead of this worker's clock",
            requests_env({}, service="rag\u2028api"): "control character U+2028",
            requests_env({"status": "maybe"}): "must be one of ok, error",
        },
        "events": {
            event_env(type="rm -rf"): "type: must be one of",
            event_env(process="worker\r\n*bold*"): "control character U+000D",
            event_env(ts=future): "ahead of this worker's clock",
            deep_event(1023): "detail: nested deeper than 32 levels",
        },
    }
    publisher = KafkaPublisher(settings.kafka_config())
    for topic, messages in bad.items():
        for value in messages:  # the good data below goes to the same partitions
            key = "rag-api" if topic == "requests" else "gpu-node-01"
            publisher.write(settings.topic(topic), key, value)
    publisher.close()
    n_bad = sum(len(m) for m in bad.values())
    assert publisher.stats.delivered == n_bad
    good = publish_sim(settings, SimConfig(hosts=1, gpus=1, start_ts=START), duration_s=600)

    records = read_records(settings, settings.topic("deadletter"), n_bad)
    by_value = {v: (t, reason) for t, m in bad.items() for v, reason in m.items()}
    seen = set()
    for rec in records:
        headers = dict(rec.headers())
        topic, reason = by_value[rec.value()]
        assert headers[DLQ_HEADER_TOPIC].decode() == settings.topic(topic)
        assert reason in headers[DLQ_HEADER_REASON].decode(), headers[DLQ_HEADER_REASON]
        seen.add(rec.value())
    assert seen == set(by_value)

    keys = Keys(env["RAGWATCH_REDIS_PREFIX"])

    def counters() -> dict[str, Any] | None:
        raw = redis_client.hvals(keys.workers)
        c = orjson.loads(raw[0]) if raw else None
        return c if c and c["envelopes"] >= good else None

    c = wait_until(counters, 60, "the worker to process the good telemetry behind the bad")
    assert c["deadletter"] == n_bad
    assert not redis_client.hexists(keys.hosts, "h" * 300)
    assert worker.stop() == 0
    # every bad event was acked in order: the events partition's commit passed them all
    consumer = Consumer({**settings.kafka_config(), "group.id": settings.app_id})
    try:
        topic = settings.topic("events")
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        parts = [TopicPartition(topic, p) for p in meta.partitions]
        committed = consumer.committed(parts, timeout=10)
    finally:
        consumer.close()
    assert sum(max(tp.offset, 0) for tp in committed) >= len(bad["events"])
