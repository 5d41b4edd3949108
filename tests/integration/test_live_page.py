"""The live page shows the page (issue 29, point 11): the most urgent alert first and its
chart on screen, a point a minute of event time at any replay speed, one time zone (UTC)
everywhere, and on memory charts the GPU's total memory, the projection to the OOM and
the alert's state changes.

The charts' points come from a real worker fed at full speed; the pages are opened in
headless Chromium in a time zone that is not UTC, at 1400x1000, over a Redis state made
by the real pipelines and the worker's writer.
"""

from __future__ import annotations

import asyncio
import html
import itertools
import json
import os
import re
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis
import redis.asyncio as aioredis

from ragwatch.agents.publisher import KafkaPublisher
from ragwatch.agents.runner import run_simulation
from ragwatch.agents.sim import FleetSimulator, SimConfig
from ragwatch.chart_ids import series_prefix
from ragwatch.config import Settings
from ragwatch.embedded import EmbeddedStack
from ragwatch.schema import Alert
from ragwatch.store import SERIES_POINTS, Keys, RedisState, read_series
from ragwatch.streams.alerting.rules import load_rules
from ragwatch.streams.pipelines.charts import SeriesRecorder
from ragwatch.streams.pipelines.fleet import Pipelines
from tests.integration.conftest import Proc, hosts_reached, wait_until
from tests.integration.fleet_data import simulate, write_run
from tests.integration.test_serve import TOKEN, get, start_serve

START = 1_767_225_600.0  # 2026-01-01 00:00 UTC
HOURS = 3.0
NOT_UTC = "Asia/Kathmandu"  # UTC+05:45: a local time shows in the minutes too
WINDOW = (1400, 1000)


# ---------------------------------------------------------------------------- points


def offline_points(config: SimConfig, hours: float) -> dict[str, list[list[Any]]]:
    """Every chart point of the simulated fleet, its envelopes processed one at a time."""
    pipes = Pipelines(load_rules())
    rec = SeriesRecorder(pipes.rules)
    pipes.tap(rec.observe)
    for ts, envelopes, events in FleetSimulator(config).ticks():
        if ts - config.start_ts >= hours * 3600:
            break
        for env in [*envelopes, *events]:
            pipes.process(env)
    return {sid: points for sid, (_, points) in rec.take().items()}


def test_a_worker_fed_at_full_speed_charts_a_point_a_minute_of_event_time(
    rw_env: dict[str, str],
    redis_client: redis.Redis,
    start_ragwatch: Callable[..., Proc],
    make_settings: Callable[[dict[str, str]], Settings],
) -> None:
    """After the demo a chart had 6-7 points over 2.5 h: the worker took one at each
    tick (a second of wall time, 12 minutes of event time at 720x). Now the points are
    those of the same telemetry processed one envelope at a time."""
    settings = make_settings(rw_env)
    worker = start_ragwatch(["worker"], rw_env)
    config = SimConfig(hosts=2, gpus=1, scenario="leak", start_ts=START)
    publisher = KafkaPublisher(settings.kafka_config())
    topics = {"gpu": settings.topic("gpu"), "events": settings.topic("events")}
    run_simulation(FleetSimulator(config), publisher, topics=topics, duration_s=HOURS * 3600)
    publisher.close()
    keys = Keys(settings.redis_prefix)
    end = START + HOURS * 3600 - config.interval_s
    wait_until(lambda: hosts_reached(redis_client, keys, 2, end), 90, worker.output)

    host, gpu, pid, _ = FleetSimulator(config).leak_target or ("", 0, 0, "")
    leak = series_prefix("process", {"host": host, "gpu": str(gpu), "pid": str(pid)}) + "gpu_mem"

    def charted() -> list[list[Any]] | None:  # up to the end of the telemetry
        got = read_series(redis_client, settings.redis_prefix, leak)
        return got[1] if got is not None and got[1] and got[1][-1][0] >= end - 60 else None

    points = wait_until(charted, 30, f"the chart of {leak} up to the end")
    assert len(points) >= 175, points  # 3 h, a point a minute
    assert {b[0] - a[0] for a, b in itertools.pairwise(points)} == {60.0}
    for sid, want in offline_points(config, HOURS).items():
        got = read_series(redis_client, settings.redis_prefix, sid)
        assert got is not None, sid
        assert got[1] == want, sid  # the same points, whatever the worker's batches


async def test_the_writer_appends_many_points_per_series_and_keeps_the_newest(
    rw_env: dict[str, str],
) -> None:
    prefix = rw_env["RAGWATCH_REDIS_PREFIX"]
    client = aioredis.from_url(rw_env["RAGWATCH_REDIS_URL"])
    meta = {"kind": "gpu", "labels": {"host": "h1", "gpu": "0"}, "unit": "bytes"}
    many = [[float(i), float(i), None, None] for i in range(SERIES_POINTS + 10)]
    try:
        store = RedisState(client, prefix)
        await store.write_series({"gpu:h1:0:fb_used": (meta, many[:3])})
        await store.write_series(
            {"gpu:h1:0:fb_used": (meta, many[3:4]), "gpu:h2:0:fb_used": (meta, [])}
        )
        await store.write_series({"gpu:h1:0:fb_used": (meta, many[4:])})
    finally:
        await client.aclose()
    sync = redis.Redis.from_url(rw_env["RAGWATCH_REDIS_URL"])
    try:
        got = read_series(sync, prefix, "gpu:h1:0:fb_used")
        empty = read_series(sync, prefix, "gpu:h2:0:fb_used")
        stored = sync.llen(f"{Keys(prefix).series}:gpu:h2:0:fb_used")
    finally:
        sync.close()
    assert got is not None and got[1] == many[-SERIES_POINTS:]  # oldest first
    assert empty is not None and empty[1] == [] and stored == 0  # indexed, no point


# ---------------------------------------------------------------------------- the pages


@dataclass
class Page:
    url: str
    leak: Alert  # the firing GpuMemoryLeak: critical, the newest critical firing alert
    ended: Alert  # an earlier leak of the same process: pending, firing, resolved
    order: list[str]  # fingerprints, most urgent first
    leak_series: str
    gpu_status: dict[str, Any]  # the leaking GPU in its host's status
    proc: Proc


def _alert(leak: Alert, fp: str, rule: str, severity: str, status: str, at: float,
           **labels: str) -> Alert:  # fmt: skip
    return replace(
        leak,
        rule=rule,
        severity=severity,
        status=status,  # type: ignore[arg-type]
        labels={"alertname": rule, "severity": severity, **labels},
        annotations={"summary": f"{rule} {severity} {status}"},
        fingerprint=fp,
        starts_at=at,
        at=at,
    )


def others(leak: Alert) -> list[Alert]:
    """Alerts of every severity and state around the leak."""
    t = leak.starts_at
    gpu2 = {"host": "gpu-node-02", "gpu": "0"}
    return [
        _alert(leak, "critold0000000001", "GpuXidCritical", "critical", "firing", t - 3000, **gpu2),
        _alert(leak, "critpend000000001", "GpuMemoryHigh", "critical", "pending", t + 1200, **gpu2),
        _alert(leak, "errfiring00000001", "EngineThroughputDrop", "error", "firing", t + 2400,
               host="gpu-node-01", target="http://vllm-0:8000/metrics"),
        _alert(leak, "warnfiring0000001", "E2eLatencyDeviation", "warning", "firing", t - 100,
               service="rag-api", instance="rag-api-0"),
        _alert(leak, "warnpend000000001", "ThroughputDrop", "warning", "pending", t + 900,
               service="rag-api", instance="rag-api-1"),
        _alert(leak, "infofiring0000001", "InfoNote", "info", "firing", t + 3000, **gpu2),
    ]  # fmt: skip


def ended_leak(leak: Alert) -> list[Alert]:
    """An earlier leak alert of the same process: its three changes, oldest first."""
    t = leak.starts_at - 3000
    pending = replace(leak, fingerprint="ended00000000001", status="pending", starts_at=t, at=t)
    firing = replace(pending, status="firing", at=t + 300)
    return [pending, firing, replace(firing, status="resolved", ends_at=t + 1500, at=t + 1500)]


@pytest.fixture(scope="module")
def page(stack: EmbeddedStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Page]:
    prefix = f"live-{uuid.uuid4().hex[:8]}"
    env = {**stack.env(), "RAGWATCH_REDIS_PREFIX": prefix, "RAGWATCH_SERVE_TOKEN": TOKEN}
    run = simulate()
    leak = next(t.alert for t in run.transitions if t.alert.status == "firing")
    assert leak.rule == "GpuMemoryLeak" and leak.severity == "critical"
    extra = others(leak) + ended_leak(leak)
    asyncio.run(write_run(env["RAGWATCH_REDIS_URL"], prefix, run, extra))
    lab = leak.labels
    host = run.pipes.gpus.host_snapshot(lab["host"])
    (gpu,) = (g for g in host["gpus"] if str(g["index"]) == lab["gpu"])
    proc, url = start_serve(env, tmp_path_factory.mktemp("live") / "serve.log")
    order = [
        leak.fingerprint, "critold0000000001", "critpend000000001", "errfiring00000001",
        "warnfiring0000001", "warnpend000000001", "infofiring0000001",
    ]  # fmt: skip
    leak_series = series_prefix("process", lab) + "gpu_mem"
    yield Page(url, leak, extra[-1], order, leak_series, gpu, proc)
    proc.stop(signal.SIGKILL, timeout=10)


def browse(url: str, profile: Path, budget_ms: int = 12000) -> str:
    """The DOM of ``url`` after its script ran (two refreshes or more: the charts get new
    data in place), in headless Chromium at 1400x1000 in a time zone 5:45 ahead of UTC."""
    out = subprocess.run(
        [
            "chromium", "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
            f"--user-data-dir={profile}", f"--window-size={WINDOW[0]},{WINDOW[1]}",
            f"--virtual-time-budget={budget_ms}", "--dump-dom", url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TZ": NOT_UTC},
    )  # fmt: skip
    assert out.returncode == 0 and "<body" in out.stdout, out.stderr[-2000:]
    return out.stdout


def attributes(dom: str, element_id: str) -> dict[str, str]:
    tag = re.search(rf'<div id="{element_id}"[^>]*>', dom)
    assert tag, f"no #{element_id}"
    return {k: html.unescape(v) for k, v in re.findall(r'([\w-]+)="([^"]*)"', tag.group(0))}


def utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def check_utc_ticks(chart: dict[str, str]) -> None:
    """Every tick label of the time axis is the UTC time of its tick."""
    assert chart["data-tz"] == "UTC"
    splits, ticks = json.loads(chart["data-xsplits"]), json.loads(chart["data-xticks"])
    assert len(splits) == len(ticks) >= 4
    for ts, label in zip(splits, ticks, strict=True):
        t = utc(ts)
        assert label.split("\n")[0] == t.strftime("%H:%M"), (label, t)
        if "\n" in label:
            assert label.split("\n")[1] == t.strftime("%Y-%m-%d")


def check_memory(chart: dict[str, str], dom: str, gpu: dict[str, Any]) -> None:
    """The GPU's total memory and the projection to its OOM, with its UTC time."""
    assert float(chart["data-total-bytes"]) == gpu["fb_total_bytes"]
    oom = gpu["ts"] + gpu["tte_h"] * 3600
    assert int(chart["data-oom-at"]) == round(oom)
    lines = json.loads(chart["data-lines"])
    assert f"GPU {gpu['index']} total {gpu['fb_total_bytes'] / 1e9:.1f} GB" in lines
    assert (
        f"projection: full {utc(oom):%Y-%m-%d %H:%M} UTC ({gpu['gb_per_hour']:.2f} GB/h)" in lines
    )
    label = re.search(r'<div class="mark oom[^"]*"[^>]*>([^<]*)</div>', dom)
    assert label and f"OOM {utc(oom):%Y-%m-%d %H:%M} UTC" in label.group(1), dom


def the_leak_chart(dom: str, page: Page) -> dict[str, str]:
    """The page drew without an error, and its chart is the leak's series, whole on
    screen, with UTC ticks, the GPU's total memory and the projection to its OOM."""
    assert re.search(r'id="error"[^>]*></span>', dom), dom
    chart = attributes(dom, "chart")
    assert chart["data-series"] == page.leak_series
    assert 0 < int(chart["data-bottom"]) <= WINDOW[1]
    check_utc_ticks(chart)
    check_memory(chart, dom, page.gpu_status)
    return chart


@pytest.mark.usefixtures("chromium")
def test_the_live_page_puts_the_most_urgent_alert_and_its_chart_on_screen(
    page: Page, tmp_path: Path
) -> None:
    dom = browse(f"{page.url}/?token={TOKEN}", tmp_path / "live")
    # the most urgent alert's own chart, whole on screen at 1400x1000
    chart = the_leak_chart(dom, page)
    # critical, error, warning, info; firing before pending; the newest first
    shown = re.findall(r'<li class="alert [^"]*" data-alertname="[^"]*" data-fingerprint="([^"]*)"',
                       dom)  # fmt: skip
    assert shown == page.order
    assert int(chart["data-points"]) >= 100
    # around the most urgent alert: its host's and services' small multiples
    drawn = multiples_of(dom)
    assert f"gpu:{page.leak.labels['host']}:{page.leak.labels['gpu']}:gpu_util" in drawn
    assert len(drawn) >= 12 and 'data-points="0"' not in dom.split('id="scatter"')[1][:200]
    # where the alert went pending and firing, from its history
    changes = get(f"{page.url}/api/v1/alerts/{page.leak.fingerprint}").json()["history"]
    marks = sorted([h["status"], h["at"]] for h in changes)
    assert sorted(json.loads(chart["data-markers"])) == marks
    assert {m[0] for m in marks} >= {"pending", "firing"}
    for status, at in marks:
        assert at == int(at)  # (as the script writes it)
        assert f'data-status="{status}" data-ts="{int(at)}"' in dom
        assert f"{status} {utc(at):%H:%M}</span>" in dom
    # one time zone: the legend, the alerts and the page's clock say UTC
    assert "time (UTC)" in dom
    assert re.search(r'<span id="updated">updated \d\d:\d\d:\d\d UTC</span>', dom), dom
    assert f"since {utc(page.leak.starts_at):%Y-%m-%d %H:%M} UTC" in dom


@pytest.mark.usefixtures("chromium")
def test_an_alerts_page_charts_its_changes_total_memory_and_the_oom(
    page: Page, tmp_path: Path
) -> None:
    dom = browse(f"{page.url}/alerts/{page.ended.fingerprint}?token={TOKEN}", tmp_path / "ended")
    chart = the_leak_chart(dom, page)
    t = page.ended.starts_at
    assert json.loads(chart["data-markers"]) == [
        ["pending", t],
        ["firing", t + 300],
        ["resolved", t + 1500],
    ]
    # a process's chart has the GPU's used memory beside it (on its own axis)
    lines = json.loads(chart["data-lines"])
    assert lines[:2] == ["rag-worker pid 4011 (GB)", "GPU 1 used, all processes (GB)"], lines
    # the GPU's own chart, picked by #series=: its memory against the total
    gpu_series = series_prefix("gpu", page.leak.labels) + "fb_used"
    dom = browse(
        f"{page.url}/alerts/{page.leak.fingerprint}?token={TOKEN}#series={quote(gpu_series)}",
        tmp_path / "gpu",
    )
    chart = attributes(dom, "chart")
    assert chart["data-series"] == gpu_series
    check_memory(chart, dom, page.gpu_status)
    assert json.loads(chart["data-lines"])[0] == "GPU 1 used (GB)"


def multiples_of(dom: str) -> dict[str, dict[str, str]]:
    """Each small multiple drawn: its series id -> its data attributes."""
    found = re.findall(r'<div class="multiple"[^>]*>', dom)
    out = {}
    for tag in found:
        attrs = {k: html.unescape(v) for k, v in re.findall(r'([\w-]+)="([^"]*)"', tag)}
        out[attrs["data-series"]] = attrs
    return out


@pytest.mark.usefixtures("chromium")
def test_an_alerts_page_shows_its_host_and_services_small_with_bands_scores_and_requests(
    page: Page, tmp_path: Path
) -> None:
    """Issue 34, point 5: the seed's Grafana hunt without the hunt. The leak's page draws
    the leaking host's GPUs (memory with its total and projection, utilisation and power
    with their expected band) and the instances on it (tokens/s, decode speed, per-stage
    P95), each with its anomaly score strip, and the requests of its service as a
    scatter; the screenshot is kept for a person to look at."""
    url = f"{page.url}/alerts/{page.leak.fingerprint}?token={TOKEN}"
    dom = browse(url, tmp_path / "around")
    assert re.search(r'id="error"[^>]*></span>', dom), dom[-3000:]
    drawn = multiples_of(dom)
    host, gpu = page.leak.labels["host"], page.leak.labels["gpu"]
    mine = [sid for sid in drawn if sid.startswith(f"gpu:{host}:{gpu}:")]
    assert sorted(s.rsplit(":", 1)[1] for s in mine) == ["fb_used", "gpu_util", "power_w"]
    assert not [sid for sid in drawn if sid.startswith("gpu:") and f":{host}:" not in sid]
    for sid in (f"gpu:{host}:{gpu}:gpu_util", f"gpu:{host}:{gpu}:power_w"):
        m = drawn[sid]
        assert m["data-band"] == "1" and int(m["data-points"]) >= 100
        assert json.loads(m["data-lines"])[1:] == ["expected", "band upper", "band lower"]
        assert 0.0 <= float(m["data-score-max"]) <= 1.0
    memory = drawn[f"gpu:{host}:{gpu}:fb_used"]
    assert any("total" in line for line in json.loads(memory["data-lines"]))
    services = {sid.split(":")[2] for sid in drawn if sid.startswith("service:")}
    assert services, drawn.keys()
    stages = {sid.rsplit(":", 1)[1] for sid in drawn if sid.startswith("service:")}
    assert {"tokens_per_s", "decode_tps", "e2e_p95", "retriever_p95", "llm_p95"} <= stages
    assert all(drawn[s]["data-band"] == "1" for s in drawn if s.endswith("_p95") and "e2e" not in s)
    # every multiple has the alert's state changes marked
    assert dom.count('class="mark marker firing"') >= len(drawn)
    # the requests: a scatter of the newest, kinds counted
    scatter = re.search(r'<canvas id="scatter"[^>]*>', dom)
    assert scatter, dom[-2000:]
    attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', scatter.group(0)))
    assert int(attrs["data-points"]) >= 100
    kinds = json.loads(html.unescape(attrs["data-kinds"]))
    assert sum(kinds) == int(attrs["data-points"]) and kinds[0] > 0
    assert "anomalous in the last hour" in dom
    shot = tmp_path / "around.png"
    out = subprocess.run(
        [
            "chromium", "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
            f"--user-data-dir={tmp_path / 'shot'}", "--window-size=1400,2600",
            "--virtual-time-budget=12000", f"--screenshot={shot}", "--hide-scrollbars", url,
        ],
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    assert out.returncode == 0 and shot.stat().st_size > 50_000, out.stderr[-2000:]
