"""Hostile and broken input on every topic a worker reads: each message is dead-lettered
with its reason (and counted), and the partition keeps going: the good telemetry behind it
is processed."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson
import pytest
import redis
from confluent_kafka import Consumer, TopicPartition

from ragwatch.agents.publisher import KafkaPublisher
from ragwatch.agents.sim import SimConfig
from ragwatch.config import Settings
from ragwatch.schema import DLQ_HEADER_REASON, DLQ_HEADER_TOPIC
from ragwatch.store import Keys
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


@pytest.mark.serial  # throughput: not beside another test
def test_a_4_mb_envelope_reaching_back_a_month_pauses_the_worker_briefly(
    rw_env: dict[str, str],
    redis_client: redis.Redis,
    start_ragwatch: Callable[..., Any],
    make_settings: Callable[[dict[str, str]], Settings],
) -> None:
    """45,000 records a minute apart (3.8 MB) for a new instance opened and closed a bucket
    each: the worker processed nothing on any topic for ~45 s. Records more than an hour
    older than their envelope are dropped (counted), so it costs what an hour costs."""
    # so that this one shows as slow (dropping 44,940 of its records takes a few ms now)
    env = {**rw_env, "RAGWATCH_SLOW_MESSAGE": "0.001"}
    settings = make_settings(env)
    worker = start_ragwatch(["worker"], env)
    keys = Keys(rw_env["RAGWATCH_REDIS_PREFIX"])

    def counters(gpu: int, requests: int = 0) -> dict[str, Any] | None:
        raw = redis_client.hvals(keys.workers)
        c = orjson.loads(raw[0]) if raw else None
        done = c and c["envelopes"] >= gpu and c["requests_envelopes"] >= requests
        return c if done else None

    first = publish_sim(settings, SimConfig(hosts=1, gpus=1, start_ts=START), duration_s=300)
    wait_until(lambda: counters(first), 60, "the worker to start")
    n = 45_000
    rec = {"status": "ok", "e2e_ms": 800.0, "context_tokens": 10, "output_tokens": 5}
    big = orjson.dumps(
        {
            "v": 1,
            "kind": "requests",
            "service": "rag-api",
            "instance": "i-new",
            "ts": START + 300,
            "records": [{**rec, "ts": START + 300 - 60.0 * (n - i)} for i in range(n)],
        }
    )
    assert 3_500_000 < len(big) < 4 * 1024 * 1024
    # librdkafka refuses a message over 1 MB before compression unless told otherwise
    publisher = KafkaPublisher({**settings.kafka_config(), "message.max.bytes": 8_000_000})
    publisher.write(settings.topic("requests"), "rag-api", big)
    assert publisher.flush(30) == 0
    publisher.close()
    assert (publisher.stats.delivered, publisher.stats.dropped) == (1, 0)
    sent = time.monotonic()
    later = SimConfig(hosts=1, gpus=1, start_ts=START + 300)
    more = publish_sim(settings, later, duration_s=60)
    c = wait_until(lambda: counters(first + more, 1), 60, "the GPU telemetry behind it")
    took = time.monotonic() - sent
    assert c["requests_too_old"] == n - 60  # the last hour's records are kept
    slow = [line for line in worker.output().splitlines() if "slow message " in line]
    assert c["slow_messages"] >= 1 and any("key=rag-api" in line for line in slow), slow
    assert c["deadletter"] == 0
    assert took < 10, f"{took:.1f} s for the envelope and the minute of GPU telemetry behind it"


def test_a_record_the_producer_refuses_is_dropped_and_counted_and_the_rest_is_sent(
    rw_env: dict[str, str], make_settings: Callable[[dict[str, str]], Settings]
) -> None:
    """librdkafka refuses a record over ``message.max.bytes`` inside ``produce`` (it never
    gets a delivery report): that raised out of the sender thread, which died, and every
    record written after it stayed queued."""
    settings = make_settings(rw_env)
    publisher = KafkaPublisher(settings.kafka_config())
    topic = settings.topic("events")
    publisher.write(topic, "h", event_env(detail="x" * 1_500_000))
    publisher.write(topic, "h", event_env())
    assert publisher.flush(30) == 0
    publisher.close()
    assert (publisher.stats.dropped, publisher.stats.delivered) == (1, 1)
    (rec,) = read_records(settings, topic, 1)
    assert rec.value() == event_env()
