"""``ragwatch notify`` end to end: alerts from the alerts topic to Slack-, PagerDuty- and
Alertmanager-style receivers (real local HTTP servers), with silences set by the CLI,
retries through the Redis outbox, and no second page after a SIGKILL and a replay."""

from __future__ import annotations

import hashlib
import hmac
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from confluent_kafka import Producer

from ragwatch.codec import encode
from ragwatch.config import Settings
from ragwatch.schema import Alert
from ragwatch.store import Keys
from tests.fakes import SLACK_TOKEN, FakePagerDuty, FakeServer, FakeSlack, SlowServer
from tests.integration.conftest import run_ragwatch, wait_until

T0 = 1_767_225_600.0
PD_KEY = "r" * 32
HMAC_SECRET = "hmac-s3cret-for-tests"


def alert(name: str, status: str, at: float, severity: str = "critical", **labels: str) -> Alert:
    labels = {"alertname": name, "severity": severity, **labels}
    fp = hashlib.sha256(orjson.dumps(sorted(labels.items()))).hexdigest()[:16]
    return Alert(
        rule=name,
        severity=severity,
        status=status,  # type: ignore[arg-type]
        labels=labels,
        annotations={"summary": f"{name} on {labels.get('host')}", "hint": "suspect a leak"},
        value=1.3e9,
        expected=0.0,
        starts_at=T0,
        ends_at=at if status == "resolved" else None,
        fingerprint=fp,
        at=at,
    )


def publish(settings: Settings, *alerts: Alert) -> None:
    p = Producer({**settings.kafka_config(), "acks": "all"})
    for a in alerts:
        p.produce(settings.topic("alerts"), key=a.fingerprint.encode(), value=encode(a))
    assert p.flush(10) == 0


@pytest.fixture
def receivers() -> Iterator[tuple[FakeSlack, FakePagerDuty, FakeServer]]:
    with FakeSlack() as slack, FakePagerDuty() as pd, FakeServer() as hook:
        yield slack, pd, hook


@pytest.fixture
def notify_env(
    rw_env: dict[str, str],
    tmp_path: Path,
    receivers: tuple[FakeSlack, FakePagerDuty, FakeServer],
) -> dict[str, str]:
    slack, pd, hook = receivers
    cfg = tmp_path / "notify.yaml"
    cfg.write_text(
        f"""
receivers:
  - {{name: chat, type: slack, url: "${{SLACK_URL}}"}}
  - {{name: pager, type: pagerduty, routing_key: "${{PD_KEY}}", url: "{pd.url}"}}
  - {{name: hook, type: webhook, url: "{hook.url}", hmac_secret: "${{HOOK_SECRET}}"}}
route:
  receiver: chat
  group_by: [alertname]
  group_wait: 0s
  group_interval: 1m
  repeat_interval: 24h
  routes:
    - {{matchers: {{severity: critical}}, receiver: pager, group_by: ['...'], continue: true}}
    - {{matchers: {{severity: critical}}, receiver: hook, continue: true}}
    - {{matchers: {{severity: "=~.*"}}, receiver: chat}}
inhibit_rules:
  - source_matchers: {{alertname: GpuOomKill}}
    target_matchers: {{alertname: GpuMemoryLeak}}
    equal: [host]
"""
    )
    return {
        **rw_env,
        "RAGWATCH_NOTIFY_FILE": str(cfg),
        "SLACK_URL": slack.url,
        "PD_KEY": PD_KEY,
        "HOOK_SECRET": HMAC_SECRET,
    }


def test_routes_to_every_receiver_once_and_survives_a_kill(
    notify_env: dict[str, str],
    receivers: tuple[FakeSlack, FakePagerDuty, FakeServer],
    start_ragwatch: Callable[..., Any],
    make_settings: Callable[[dict[str, str]], Settings],
    redis_client: redis.Redis,
) -> None:
    slack, pd, hook = receivers
    settings = make_settings(notify_env)
    notifier = start_ragwatch(["notify"], notify_env)
    leak = alert("GpuMemoryLeak", "firing", T0 + 600, host="h1", gpu="1", pid="4711")
    publish(settings, leak)
    wait_until(lambda: pd.events() and hook.received and slack.received, 60, notifier.output)

    (trigger,) = pd.events()
    assert trigger["event_action"] == "trigger" and trigger["routing_key"] == PD_KEY
    assert trigger["payload"]["severity"] == "critical"
    (sent,) = hook.received
    assert (
        sent.headers["X-Ragwatch-Signature"]
        == "sha256=" + hmac.new(HMAC_SECRET.encode(), sent.body, hashlib.sha256).hexdigest()
    )
    body = sent.json
    assert body["version"] == "4" and body["status"] == "firing" and body["receiver"] == "hook"
    assert [a["labels"]["pid"] for a in body["alerts"]] == ["4711"]
    assert "GpuMemoryLeak" in orjson.dumps(slack.bodies()).decode()

    # SIGKILL, restart, and the same transition again (a worker replay): nothing new.
    notifier.stop(signal.SIGKILL)
    notifier = start_ragwatch(["notify"], notify_env)
    publish(settings, leak)
    resolved = alert("GpuMemoryLeak", "resolved", T0 + 7200, host="h1", gpu="1", pid="4711")
    publish(settings, resolved)
    wait_until(lambda: len(pd.events()) >= 2, 60, notifier.output)
    time.sleep(1.0)
    actions = [e["event_action"] for e in pd.events()]
    assert actions == ["trigger", "resolve"]
    assert pd.events()[0]["dedup_key"] == pd.events()[1]["dedup_key"]
    assert [b["status"] for b in hook.bodies()] == ["firing", "resolved"]
    keys = Keys(notify_env["RAGWATCH_REDIS_PREFIX"])
    assert redis_client.zcard(keys.outbox_due) == 0 and redis_client.llen(keys.outbox_dead) == 0
    assert SLACK_TOKEN not in notifier.output() and PD_KEY not in notifier.output()
    assert notifier.stop() == 0


def test_silence_mutes_until_expired_and_failures_retry_then_deliver(
    notify_env: dict[str, str],
    receivers: tuple[FakeSlack, FakePagerDuty, FakeServer],
    start_ragwatch: Callable[..., Any],
    make_settings: Callable[[dict[str, str]], Settings],
) -> None:
    _, pd, _ = receivers
    settings = make_settings(notify_env)
    out = run_ragwatch(
        "silence", "add", "--match", "host=h2", "--duration", "1h", "--comment", "reboot",
        env=notify_env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    silence_id = out.stdout.split()[0]
    listed = run_ragwatch("silence", "list", "--json", env=notify_env)
    assert [s["id"] for s in orjson.loads(listed.stdout)] == [silence_id]
    pd.then(500).then(500)  # two failures before PagerDuty accepts
    notifier = start_ragwatch(["notify"], notify_env)
    publish(
        settings,
        alert("GpuMemoryHigh", "firing", T0 + 60, host="h1", gpu="0"),
        alert("GpuMemoryHigh", "firing", T0 + 60, host="h2", gpu="0"),
    )
    wait_until(lambda: len(pd.events()) >= 3, 60, notifier.output)  # 2 failed + 1 accepted
    time.sleep(2.0)
    hosts = {e["payload"]["custom_details"]["labels"]["host"] for e in pd.events()}
    assert hosts == {"h1"}  # h2 is silenced
    assert run_ragwatch("silence", "expire", silence_id, env=notify_env).returncode == 0
    publish(settings, alert("Nudge", "firing", T0 + 600, severity="info", host="h9"))
    wait_until(
        lambda: any(e["payload"]["custom_details"]["labels"]["host"] == "h2" for e in pd.events()),
        60,
        notifier.output,
    )
    accepted = [e for e in pd.events() if e["event_action"] == "trigger"]
    assert sorted(e["payload"]["custom_details"]["labels"]["host"] for e in accepted[2:]) == [
        "h1",
        "h2",
    ]
    assert notifier.stop() == 0


def test_a_hanging_receiver_does_not_delay_the_others(
    rw_env: dict[str, str],
    tmp_path: Path,
    start_ragwatch: Callable[..., Any],
    make_settings: Callable[[dict[str, str]], Settings],
) -> None:
    """A webhook that accepts and never answers held every other receiver for its timeout
    (20 s here): receivers were served one after another. Now each has its own sender."""
    with (
        FakeSlack() as slack,
        FakePagerDuty() as pd,
        FakeServer() as hook,
        SlowServer(delay_s=60.0) as stuck,
    ):
        cfg = tmp_path / "notify.yaml"
        cfg.write_text(
            f"""
receivers:
  - {{name: stuck, type: webhook, url: "{stuck.url}", timeout_s: 20s}}
  - {{name: chat, type: slack, url: "{slack.url}"}}
  - {{name: pager, type: pagerduty, routing_key: "{PD_KEY}", url: "{pd.url}"}}
  - {{name: hook, type: webhook, url: "{hook.url}"}}
route:
  receiver: chat
  group_by: ['...']
  group_wait: 0s
  routes:
    - {{matchers: {{severity: critical}}, receiver: stuck, continue: true}}
    - {{matchers: {{severity: critical}}, receiver: pager, continue: true}}
    - {{matchers: {{severity: critical}}, receiver: hook, continue: true}}
    - {{matchers: {{severity: critical}}, receiver: chat}}
"""
        )
        env = {**rw_env, "RAGWATCH_NOTIFY_FILE": str(cfg)}
        settings = make_settings(env)
        notifier = start_ragwatch(["notify"], env)
        publish(settings, alert("GpuOomKill", "firing", T0 + 60, host="h1", pid="1"))
        wait_until(lambda: stuck.received and len(slack.received) == 1, 60, notifier.output)
        # the stuck receiver holds its first send for 20 s; a second page meanwhile (after
        # Slack's own pace of one message a second):
        time.sleep(1.1)
        sent = time.monotonic()
        publish(settings, alert("GpuOomKill", "firing", T0 + 120, host="h2", pid="2"))
        wait_until(
            lambda: len(hook.received) >= 2 and len(pd.events()) >= 2 and len(slack.received) >= 2,
            30,
            notifier.output,
        )
        late = max(r.at for r in (hook.received[1], pd.received[1], slack.received[1])) - sent
        assert late < 1.0, f"{late:.2f} s"
        time.sleep(1.0)
        assert (len(hook.received), len(pd.events()), len(slack.received)) == (2, 2, 2)
        assert notifier.stop() == 0
