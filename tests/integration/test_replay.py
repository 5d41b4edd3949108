"""The same input gives the same alerts online and offline.

Two hours of the ``all`` scenario (leak, throughput, retrieval and outliers, the request
faults healing after 40 minutes) go through Kafka to a real ``ragwatch worker``, and the
same envelopes, written to a JSONL file, through ``ragwatch replay``. Every transition the
worker publishes on ``ragwatch.alerts`` (pending, firing, resolved) must come out of the
replay, alert by alert and in the same order per alert: rule, status, labels and
``starts_at``. Hints and ``at`` are not compared: a hint joins the GPU and request sides of
a host, and the worker consumes those topics at their own paces. ``ragwatch record`` then
copies the topics back to a file, and replaying that recording gives the same alerts too:
also when the worker (and the recorder) read some partitions hours of event time ahead of
the others.
"""

from __future__ import annotations

import time
import zlib
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import redis
from confluent_kafka import Producer

from ragwatch.agents.publisher import KafkaPublisher
from ragwatch.agents.scenario import build
from ragwatch.codec import decode_as, encode, to_dict
from ragwatch.config import Settings
from ragwatch.schema import Alert
from ragwatch.store import Keys
from tests.integration.conftest import SENTINEL, read_records, run_ragwatch, wait_until

TOPIC = {"gpu": "gpu", "requests": "requests", "event": "events", "metrics": "metrics"}
Key = tuple[str, str, tuple[tuple[str, str], ...], float]


def key(alert: dict[str, Any]) -> Key:
    return (
        alert["rule"],
        alert["status"],
        tuple(sorted(alert["labels"].items())),
        alert["starts_at"],
    )


def per_alert(alerts: list[dict[str, Any]]) -> dict[str, list[Key]]:
    """Each alert's transitions in order (the alerts topic keeps order per fingerprint)."""
    out: dict[str, list[Key]] = defaultdict(list)
    for a in alerts:
        out[a["fingerprint"]].append(key(a))
    return dict(out)


def replayed(path: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    started = time.monotonic()
    proc = run_ragwatch("replay", str(path), "--json", "--pending", env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    *transitions, summary = [orjson.loads(line) for line in proc.stdout.splitlines()]
    assert summary["kind"] == "summary" and summary["bad_lines"] == 0, summary
    print(
        f"replay {path.name}: {summary['envelopes']} envelopes in {summary['elapsed_s']} s "
        f"({summary['per_s']:.0f}/s; {time.monotonic() - started:.1f} s with start-up)"
    )
    return transitions


def worker_counters(client: redis.Redis, env: dict[str, str]) -> dict[str, Any]:
    raw = client.hvals(Keys(env["RAGWATCH_REDIS_PREFIX"]).workers)
    return orjson.loads(raw[0]) if len(raw) == 1 else {}


def test_the_same_input_gives_the_same_alerts_online_and_offline(
    rw_env: dict[str, str],
    redis_client: redis.Redis,
    start_ragwatch: Callable[..., Any],
    make_settings: Callable[[dict[str, str]], Settings],
    tmp_path: Path,
) -> None:
    settings = make_settings(rw_env)
    worker = start_ragwatch(["worker"], rw_env)
    world = build("all", hosts=2, gpus=1, services=1, interval_s=10, heal_after_s=40 * 60)
    envelopes = list(world.envelopes(hours=2.0))
    played = tmp_path / "played.jsonl"
    played.write_bytes(b"".join(encode(e) + b"\n" for e in envelopes))

    publisher = KafkaPublisher(settings.kafka_config())
    for e in envelopes:
        publisher.write(settings.topic(TOPIC[e.kind]), e.key, encode(e))
    assert publisher.flush(30) == 0
    publisher.close()
    # Tansu's high watermark can lag one batch: a sentinel per partition (dead-lettered by
    # the worker, skipped by the recorder) makes the last batch of data visible.
    producer = Producer(settings.kafka_config())
    for name in ("gpu", "requests"):
        for p in range(settings.topic_partitions):
            producer.produce(settings.topic(name), SENTINEL, partition=p)
    assert producer.flush(10) == 0

    def consumed() -> dict[str, Any]:
        c = worker_counters(redis_client, rw_env)
        return c if c and c["messages"] - c["deadletter"] >= len(envelopes) else {}

    wait_until(
        consumed, 60, lambda: f"the worker to consume {len(envelopes)}: {worker.output()[-2000:]}"
    )
    time.sleep(2.0)  # the last message's transitions are sent after it is counted
    counters = worker_counters(redis_client, rw_env)
    assert counters["messages"] - counters["deadletter"] == len(envelopes)
    records = read_records(settings, settings.topic("alerts"), counters["transitions"])
    online = [to_dict(decode_as(Alert, m.value())) for m in records]
    assert len(online) == counters["transitions"]

    offline = replayed(played, rw_env)
    assert per_alert(offline) == per_alert(online)
    assert sorted(map(key, offline)) == sorted(map(key, online))
    fired = {a["rule"] for a in online if a["status"] == "firing"}
    assert fired == {
        "GpuMemoryLeak",
        "DecodeSpeedDrop",
        "TokensPerRequestDrop",
        "RetrievalSlowdown",
        "RequestOutlierCluster",
    }
    assert sum(a["status"] == "resolved" for a in online) >= 4

    recording = tmp_path / "recorded.jsonl.gz"
    proc = run_ragwatch(
        "record", "--out", str(recording), "--max-messages", str(len(envelopes)), env=rw_env
    )
    assert proc.returncode == 0, proc.stderr
    assert f"recorded {len(envelopes)} envelopes" in proc.stderr
    assert per_alert(replayed(recording, rw_env)) == per_alert(online)
    assert worker.stop() == 0


def test_a_recording_of_unevenly_consumed_partitions_replays_to_the_live_alerts(
    rw_env: dict[str, str],
    redis_client: redis.Redis,
    start_ragwatch: Callable[..., Any],
    make_settings: Callable[[dict[str, str]], Settings],
    tmp_path: Path,
) -> None:
    """The worker reads one GPU partition and one request partition to the end (two hours
    of event time) before the others get anything: hosts and services on the others look
    hours behind. The worker's alerts must be those of event-time order, and so must a
    recording of the topics (in consumption order) replayed."""
    settings = make_settings(rw_env)
    parts = settings.topic_partitions
    assert parts >= 2
    world = build("all", hosts=4, gpus=1, services=2, interval_s=10, heal_after_s=40 * 60)
    envelopes = list(world.envelopes(hours=2.0))
    played = tmp_path / "played.jsonl"
    played.write_bytes(b"".join(encode(e) + b"\n" for e in envelopes))

    def partition(e: Any) -> int:
        return zlib.crc32(e.key.encode()) % parts

    first = [e for e in envelopes if partition(e) == (0 if e.kind != "requests" else 1)]
    rest = [e for e in envelopes if partition(e) != (0 if e.kind != "requests" else 1)]
    assert first and rest and {e.kind for e in rest} >= {"gpu", "requests"}
    producer = Producer(settings.kafka_config())

    def produce(batch: list[Any]) -> None:
        for e in batch:
            topic = settings.topic(TOPIC[e.kind])
            producer.produce(topic, encode(e), e.key.encode(), partition=partition(e))
        assert producer.flush(30) == 0

    produce(first)
    worker = start_ragwatch(["worker"], rw_env)

    def read(n: int) -> Callable[[], dict[str, Any]]:
        def done() -> dict[str, Any]:
            c = worker_counters(redis_client, rw_env)
            return c if c and c["messages"] - c["deadletter"] >= n else {}

        return done

    wait_until(read(len(first)), 90, lambda: f"the first partitions: {worker.output()[-2000:]}")
    produce(rest)
    for name in ("gpu", "requests"):  # make the last batch of each partition visible
        for p in range(parts):
            producer.produce(settings.topic(name), SENTINEL, partition=p)
    assert producer.flush(10) == 0
    wait_until(read(len(envelopes)), 90, lambda: f"everything: {worker.output()[-2000:]}")
    time.sleep(2.0)
    counters = worker_counters(redis_client, rw_env)
    records = read_records(settings, settings.topic("alerts"), counters["transitions"])
    online = [to_dict(decode_as(Alert, m.value())) for m in records]
    in_order = replayed(played, rw_env)
    assert {a["rule"] for a in online if a["status"] == "firing"} >= {
        "GpuMemoryLeak",
        "DecodeSpeedDrop",
        "RetrievalSlowdown",
    }
    assert per_alert(online) == per_alert(in_order)

    recording = tmp_path / "uneven.jsonl.gz"
    proc = run_ragwatch(
        "record", "--out", str(recording), "--max-messages", str(len(envelopes)), env=rw_env
    )
    assert proc.returncode == 0, proc.stderr
    assert per_alert(replayed(recording, rw_env)) == per_alert(online)
    assert worker.stop() == 0


def test_record_stops_after_its_duration_and_names_bad_topics(
    rw_env: dict[str, str],
    make_settings: Callable[[dict[str, str]], Settings],
    tmp_path: Path,
) -> None:
    settings = make_settings(rw_env)
    producer = Producer(settings.kafka_config())
    producer.produce(settings.topic("events"), b"{not an envelope", partition=0)
    for p in range(settings.topic_partitions):  # moves the lagging watermark past it
        producer.produce(settings.topic("events"), SENTINEL, partition=p)
    assert producer.flush(10) == 0
    out = tmp_path / "events.jsonl"
    started = time.monotonic()
    proc = run_ragwatch(
        "record", "--out", str(out), "--topics", "events", "--duration", "3s", env=rw_env
    )
    assert proc.returncode == 0, proc.stderr
    assert 3 <= time.monotonic() - started < 30
    assert "recorded 0 envelopes" in proc.stderr and "invalid skipped" in proc.stderr
    assert "skipped" in proc.stderr and "malformed JSON" in proc.stderr
    assert out.read_bytes() == b""
    proc = run_ragwatch("record", "--out", str(out), "--topics", "gpu,nope", env=rw_env)
    assert proc.returncode == 2 and "--topics" in proc.stderr and "nope" in proc.stderr
    other = {**rw_env, "RAGWATCH_TOPIC_PREFIX": "absent."}
    absent = tmp_path / "absent.jsonl"
    proc = run_ragwatch("record", "--out", str(absent), "--max-messages", "1", env=other)
    assert proc.returncode == 2
    assert "topic absent.ragwatch.gpu does not exist" in proc.stderr
    assert not absent.exists()  # Kafka is asked first: no empty file left behind
