"""The broker restarted empty under a running agent and worker (its own embedded stack:
Tansu keeps its log in memory, so every topic is gone). Each process names the topics it
finds missing, once; the worker re-creates the topics it owns, as it does at start; the
agent keeps what it samples meanwhile (memory queue, then its spool) until the topic exists
again; and the agent's records after the restart reach the worker, which reads the
re-created topics from their start."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from confluent_kafka import Consumer, Producer, TopicPartition

from ragwatch.config import TOPICS, Settings
from ragwatch.embedded import EmbeddedStack, free_port
from ragwatch.errors import ConfigError
from ragwatch.kafka_admin import missing_topics, topic_ids
from ragwatch.store import Keys
from tests.fakes import FakeServer
from tests.integration.conftest import (
    SENTINEL,
    hook_notify_env,
    hosts_reached,
    stack_env,
    wait_until,
    worker_envelopes,
)
from tests.integration.test_notify import alert, publish

START = 1_767_225_600.0  # 2026-01-01: event time, paced by --speed
HOSTS, STEP, SPEED = 2, 10.0, 120  # 12 samples a host a wall second


def newest_gpu_ts(client: redis.Redis, keys: Keys) -> float:
    """The oldest of the hosts' newest GPU samples in the worker's status (0: none yet)."""
    rows = [orjson.loads(v) for v in client.hvals(keys.hosts)]
    newest = [max((g["ts"] for g in r["gpus"]), default=0.0) for r in rows]
    return min(newest) if len(newest) == HOSTS else 0.0


def named(output: str, topic: str, state: str) -> int:
    """How many log lines say ``topic TOPIC is STATE``."""
    return len(re.findall(rf"topic {re.escape(topic)} is {state}\b", output))


def records_in(settings: Settings, topic: str) -> int:
    """How many records ``topic`` holds, at least: the high watermarks after one sentinel
    record per partition (Tansu's watermark may lag one batch: the sentinel's), less them."""
    producer = Producer(settings.kafka_config())
    for p in range(settings.topic_partitions):
        producer.produce(topic, SENTINEL, partition=p)
    assert producer.flush(10) == 0
    consumer = Consumer({**settings.kafka_config(), "group.id": f"count-{uuid.uuid4().hex}"})
    try:
        marks = [
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5)
            for p in range(settings.topic_partitions)
        ]
    finally:
        consumer.close()
    return sum(max(0, high - 1) for _, high in marks)


def test_a_broker_restarted_empty_is_named_recreated_and_the_agent_reaches_the_worker(
    own_stack: EmbeddedStack,
    tmp_path: Path,
    start_ragwatch: Callable[..., Any],
    make_settings: Callable[[dict[str, str]], Settings],
) -> None:
    env = stack_env(own_stack, tmp_path)
    settings = make_settings(env)
    owned = [*map(settings.topic, TOPICS), *filter(None, [settings.otlp_topic_name()])]
    gpu = settings.topic("gpu")
    keys = Keys(env["RAGWATCH_REDIS_PREFIX"])
    client = redis.Redis.from_url(env["RAGWATCH_REDIS_URL"], socket_timeout=5)
    hook = FakeServer().__enter__()
    env = hook_notify_env(env, tmp_path, hook.url)
    alerts = settings.topic("alerts")
    worker = start_ragwatch(["worker"], env)
    notifier = start_ragwatch(["notify"], env)
    # alerts read before the restart: the notifier's committed offsets of the old topic
    publish(settings, *(alert("GpuMemoryLeak", "firing", START, host=f"h{i}") for i in range(6)))
    agent = start_ragwatch(
        [
            "agent", "--source=sim", "--scenario=healthy", f"--hosts={HOSTS}", "--gpus=1",
            "--services=0", "--queue-max=50", f"--speed={SPEED}", "--duration=6h",
            f"--start={START:.0f}", f"--interval={STEP:g}", f"--spool-dir={tmp_path / 'spool'}",
        ],
        env,
    )  # fmt: skip
    try:
        wait_until(
            lambda: newest_gpu_ts(client, keys) > START + 600,
            60,
            lambda: "data before the restart:\n" + worker.output()[-3000:],
        )
        wait_until(lambda: len(hook.received) == 6, 60, notifier.output)
        own_stack.kill("kafka")
        own_stack.up(("kafka",))  # on the same port, empty: no topics, groups or offsets
        time.sleep(1.5)  # the worker's status of what it read before (written every second)
        at_restart = newest_gpu_ts(client, keys)
        processed = worker_envelopes(client, keys)

        # the worker names each of its topics once and re-creates them; the agent names
        # its topic and keeps what it samples meanwhile
        wait_until(
            lambda: all(named(worker.output(), t, "back") for t in owned),
            30,
            lambda: "the worker to re-create its topics:\n" + worker.output()[-4000:],
        )
        # what the agent sampled during and after the restart reaches the worker (3
        # minutes of event time: 1.5 s of sampling)
        wait_until(
            lambda: hosts_reached(client, keys, HOSTS, at_restart + 180),
            30,
            lambda: (
                "the agent's records to reach the worker:\n--- agent\n"
                + agent.output()[-3000:]
                + "\n--- worker\n"
                + worker.output()[-3000:]
            ),
        )
        assert agent.stop() == 0, agent.output()[-3000:]  # everything sent, nothing dropped
        # every record of the re-created topic is read, from its first (a consumer resumed
        # at the old topic's offset would skip as many as it had read before the restart)
        sent = records_in(settings, gpu)
        wait_until(
            lambda: worker_envelopes(client, keys) - processed >= sent,
            20,
            lambda: (
                f"the worker to read all {sent} records of the re-created topic (read "
                f"{worker_envelopes(client, keys) - processed}):\n" + worker.output()[-3000:]
            ),
        )
        assert worker.popen.poll() is None, worker.output()[-3000:]
        # an alert on the re-created topic is paged (from its offset 0, not the old
        # topic's committed offset)
        wait_until(
            lambda: (
                named(notifier.output(), alerts, "back")
                or "re-created since the last check" in notifier.output()
            ),
            30,
            lambda: "the notifier to see its topic again:\n" + notifier.output()[-3000:],
        )
        publish(settings, alert("GpuMemoryLeak", "firing", START + 3600, host="after"))
        wait_until(
            lambda: len(hook.received) == 7,
            30,
            lambda: "the alert after the restart:\n" + notifier.output()[-3000:],
        )
    finally:
        client.close()
        agent.stop()
        worker.stop()
        notifier.stop()
        hook.__exit__()

    out = worker.output()
    for topic in owned:
        assert named(out, topic, "missing") == 1, (topic, out[-4000:])
        assert named(out, topic, "back") == 1, (topic, out[-4000:])
    assert "Traceback" not in out, out[-4000:]
    out = notifier.output()
    said = (named(out, alerts, "missing"), named(out, alerts, "back"))
    assert said == (1, 1) or (said == (0, 0) and "re-created since the last check" in out), out
    out = agent.output()
    assert (named(out, gpu, "missing"), named(out, gpu, "back")) == (1, 1), out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    done = re.findall(r"agent done: .*", out)
    assert done and re.search(r"\bdropped=0\b", done[-1]), out[-3000:]


def test_missing_topics_and_topic_ids_name_what_the_broker_lacks(
    rw_env: dict[str, str], make_settings: Callable[[dict[str, str]], Settings]
) -> None:
    """The checks the worker and the notifier run: one request each; a broker that does not
    answer is a ConfigError naming it, not a missing topic."""
    settings = make_settings(rw_env)
    gpu, nope = settings.topic("gpu"), settings.topic_prefix + "nope"
    assert missing_topics(settings, [gpu, nope]) == [nope]
    ids = topic_ids(settings, [gpu, nope])
    assert ids[nope] is None and ids[gpu]
    gone = Settings.from_env({**rw_env, "RAGWATCH_KAFKA_BOOTSTRAP": f"127.0.0.1:{free_port()}"})
    with pytest.raises(ConfigError, match=r"^notify: cannot reach Kafka at 127\.0\.0\.1:"):
        missing_topics(gone, [gpu], 1.0, command="notify")
    with pytest.raises(ConfigError, match=r"^worker: cannot reach Kafka at 127\.0\.0\.1:"):
        topic_ids(gone, [gpu], 1.0, command="worker")
