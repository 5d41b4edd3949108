"""Alertmanager as a sink, against a real one (Debian's prometheus-alertmanager) started
here: a leak alert that the worker published on the alerts topic reaches Alertmanager
through ``ragwatch notify`` (RAGWATCH_ALERTMANAGER_URLS), is routed by Alertmanager to its
webhook receiver, and resolves there; a firing alert is posted again every resend."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from ragwatch.agents.publisher import KafkaPublisher
from ragwatch.codec import encode
from ragwatch.config import Settings
from ragwatch.receiver import WebhookReceiver
from ragwatch.schema import Alert
from tests.integration.conftest import wait_until

ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
NOW = time.time()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def alertmanager(tmp_path: Path, receiver: WebhookReceiver) -> Iterator[str]:
    assert ALERTMANAGER, "prometheus-alertmanager is not installed (make alertmanager)"
    config = tmp_path / "alertmanager.yml"
    config.write_text(
        "route:\n"
        "  receiver: hook\n"
        "  group_by: [alertname, host]\n"
        "  group_wait: 1s\n"
        "  group_interval: 1s\n"
        "  repeat_interval: 1h\n"
        "receivers:\n"
        "  - name: hook\n"
        "    webhook_configs:\n"
        f"      - url: {receiver.url}\n"
        "        send_resolved: true\n"
    )
    port = _free_port()
    proc = subprocess.Popen(
        [
            ALERTMANAGER,
            f"--config.file={config}",
            f"--storage.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "alertmanager.log").open("wb"),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _ready(url), 20, "Alertmanager to answer /-/ready")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def _ready(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def _alerts(url: str) -> list[dict[str, Any]]:
    import urllib.request

    with urllib.request.urlopen(f"{url}/api/v2/alerts", timeout=5) as r:
        return list(orjson.loads(r.read()))


def leak(status: str) -> Alert:
    return Alert(
        rule="GpuMemoryLeak",
        severity="critical",
        status=status,  # type: ignore[arg-type]
        labels={"alertname": "GpuMemoryLeak", "host": "gpu-node-01", "gpu": "1", "pid": "4011"},
        annotations={"summary": "GPU memory leak: rag-worker (pid 4011) grows 1.12 GB/h"},
        value=1.12,
        expected=0.0,
        starts_at=NOW - 600,
        ends_at=NOW if status == "resolved" else None,
        fingerprint="5c1f0e2d9a7b3c41",
    )


def test_a_leak_alert_reaches_a_webhook_through_alertmanager_and_resolves(
    rw_env: dict[str, str],
    alertmanager: str,
    receiver: WebhookReceiver,
    start_ragwatch: Callable[..., Any],
    make_settings: Callable[[dict[str, str]], Settings],
) -> None:
    env = {
        **rw_env,
        "RAGWATCH_ALERTMANAGER_URLS": alertmanager,
        "RAGWATCH_ALERTMANAGER_RESEND": "1",
        "RAGWATCH_EXTERNAL_URL": "http://ragwatch.example:8080",
    }
    settings = make_settings(env)
    notify = start_ragwatch(["notify"], env)
    publisher = KafkaPublisher(settings.kafka_config())
    publisher.write(settings.topic("alerts"), "5c1f0e2d9a7b3c41", encode(leak("firing")))
    assert publisher.flush(30) == 0

    def status_of(want: str) -> Callable[[dict[str, Any]], bool]:
        return lambda body: body.get("status") == want

    fired = receiver.wait_for(status_of("firing"), timeout_s=60)
    assert fired is not None, notify.output()[-3000:]
    (alert,) = fired["alerts"]
    assert alert["labels"]["alertname"] == "GpuMemoryLeak"
    assert alert["labels"]["severity"] == "critical" and alert["labels"]["pid"] == "4011"
    assert alert["generatorURL"] == "http://ragwatch.example:8080/alerts/5c1f0e2d9a7b3c41"
    (held,) = _alerts(alertmanager)
    first_ends = held["endsAt"]
    time.sleep(2.5)  # resent every second, endsAt moving ahead with it
    (held,) = _alerts(alertmanager)
    assert held["status"]["state"] == "active" and held["endsAt"] > first_ends

    publisher.write(settings.topic("alerts"), "5c1f0e2d9a7b3c41", encode(leak("resolved")))
    assert publisher.flush(30) == 0
    publisher.close()
    resolved = receiver.wait_for(status_of("resolved"), timeout_s=60)
    assert resolved is not None, notify.output()[-3000:]
    assert resolved["alerts"][0]["labels"]["alertname"] == "GpuMemoryLeak"
    assert notify.stop() == 0
