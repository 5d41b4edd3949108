"""Inhibition as Alertmanager defines it, through the real ``ragwatch notify`` process,
the Tansu broker, Redis and a local webhook receiver (issue 32).

The rule ``alertname=~Gpu.*`` mutes ``GpuMemoryLeak`` on the same host: a leak matches
both of its sides. Two leaks on one host then muted each other and nothing was sent;
by Alertmanager's rule an alert matching both sides is muted only by a source that does
not match the target side (a GpuXid), never by another leak nor by itself.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import redis
from confluent_kafka import Producer

from ragwatch.codec import encode
from ragwatch.config import Settings
from ragwatch.receiver import WebhookReceiver
from ragwatch.schema import Alert
from ragwatch.store import read_notifier
from tests.integration.conftest import hook_notify_env, wait_until

T0 = 1_767_225_600.0

INHIBIT = """\
inhibit_rules:
  - source_matchers: {alertname: "=~Gpu.*"}
    target_matchers: {alertname: GpuMemoryLeak}
    equal: [host]
"""


def firing(name: str, **labels: str) -> Alert:
    labels = {"alertname": name, "severity": "critical", **labels}
    return Alert(
        rule=name,
        severity="critical",
        status="firing",
        labels=labels,
        annotations={"summary": f"{name} on {labels['host']}"},
        value=1.0,
        expected=None,
        starts_at=T0,
        ends_at=None,
        fingerprint=hashlib.sha256(orjson.dumps(sorted(labels.items()))).hexdigest()[:16],
        at=T0 + 60,
    )


def publish(settings: Settings, *alerts: Alert) -> None:
    p = Producer({**settings.kafka_config(), "acks": "all"})
    for a in alerts:
        p.produce(settings.topic("alerts"), key=a.fingerprint.encode(), value=encode(a))
    assert p.flush(10) == 0


def delivered(receiver: WebhookReceiver) -> list[tuple[str, str, str]]:
    """(alertname, host, gpu) of every firing alert the receiver got."""
    return sorted(
        (a["labels"]["alertname"], a["labels"]["host"], a["labels"].get("gpu", ""))
        for body in list(receiver.bodies)
        for a in body["alerts"]
        if a["status"] == "firing"
    )


def test_two_leaks_on_one_host_matching_both_sides_are_both_delivered(
    rw_env: dict[str, str],
    tmp_path: Path,
    receiver: WebhookReceiver,
    start_ragwatch: Callable[..., Any],
    make_settings: Callable[[dict[str, str]], Settings],
    redis_client: redis.Redis,
) -> None:
    env = hook_notify_env(rw_env, tmp_path, receiver.url, INHIBIT)
    settings = make_settings(env)
    notifier = start_ragwatch(["notify"], env)

    # A GpuXid on h2 matches the source side only: it still mutes h2's leak. It is
    # delivered first, so it is firing when the leak is looked at (the alerts topic has
    # two partitions: no order between them).
    publish(settings, firing("GpuXid", host="h2"))
    wait_until(lambda: delivered(receiver), 20, notifier.output)
    publish(
        settings,
        firing("GpuMemoryLeak", host="h2", gpu="0"),
        firing("GpuMemoryLeak", host="h1", gpu="0"),
        firing("GpuMemoryLeak", host="h1", gpu="1"),
    )

    def settled() -> bool:
        counters = read_notifier(redis_client, env["RAGWATCH_REDIS_PREFIX"])["counters"]
        return bool(counters.get("alerts_read", 0) >= 4 and counters.get("groups_inhibited", 0))

    wait_until(settled, 10, notifier.output)  # h2's leak read and muted
    wait_until(lambda: len(delivered(receiver)) >= 3, 5, lambda: f"{delivered(receiver)}")
    assert delivered(receiver) == [
        ("GpuMemoryLeak", "h1", "0"),
        ("GpuMemoryLeak", "h1", "1"),
        ("GpuXid", "h2", ""),
    ]
    assert "inhibit_rules[0]" in notifier.output()
    assert "can match both its source and its target" in notifier.output()
    assert notifier.stop() == 0
