"""``ragwatch serve`` as a user runs it: a real subprocess over a real Redis, real HTTP, and
the live page in a real headless browser.

The Redis state is what a worker writes (the leak scenario run through the real pipelines
and written by :class:`RedisState`, see ``fleet_data.py``), plus silences, the notifier's
backlog and an alert whose label values are hostile.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ragwatch.embedded import EmbeddedStack, free_port
from ragwatch.exporter import METRIC_NAMES
from tests.integration.conftest import Proc, clean_environ, run_ragwatch, wait_until
from tests.integration.fleet_data import HOSTILE, Fleet, write_fleet

TOKEN = "tok-" + uuid.uuid4().hex
ENDPOINTS = (
    "/api/v1/status",
    "/api/v1/alerts",
    "/api/v1/series",
    "/api/v1/series/gpu%3Agpu-node-01%3A0%3Afb_used",
    "/api/v1/silences",
    "/metrics",
    "/openapi.json",
)


@dataclass
class Served:
    url: str
    env: dict[str, str]
    fleet: Fleet
    proc: Proc


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def get(url: str, token: str | None = TOKEN, auth: str | None = None) -> Reply:
    req = urllib.request.Request(url)
    if auth is not None or token is not None:
        req.add_header("Authorization", auth if auth is not None else f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return Reply(resp.status, dict(resp.headers), resp.read())
    except urllib.error.HTTPError as exc:
        return Reply(exc.code, dict(exc.headers), exc.read())


def start_serve(env: dict[str, str], log: Path, *args: str) -> tuple[Proc, str]:
    port = free_port()
    proc = Proc(["serve", "--port", str(port), *args], {**clean_environ(), **env}, log)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.popen.poll() is None, proc.output()
        try:
            return get(url + "/healthz", token=None).status in (200, 503)
        except OSError:
            return False

    wait_until(up, 15, lambda: f"ragwatch serve on {url}: {proc.output()[-2000:]}")
    return proc, url


@pytest.fixture(scope="module")
def served(stack: EmbeddedStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    env = {
        **stack.env(),
        "RAGWATCH_REDIS_PREFIX": f"serve-{uuid.uuid4().hex[:8]}",
        "RAGWATCH_SERVE_TOKEN": TOKEN,
        "RAGWATCH_LOG_LEVEL": "DEBUG",  # the access log too: it must not show the token
    }
    fleet = write_fleet(env["RAGWATCH_REDIS_URL"], env["RAGWATCH_REDIS_PREFIX"])
    proc, url = start_serve(env, tmp_path_factory.mktemp("serve") / "serve.log")
    yield Served(url, env, fleet, proc)
    proc.stop(signal.SIGKILL, timeout=10)


# ---------------------------------------------------------------------------- auth


def test_every_endpoint_but_healthz_needs_the_bearer_token(served: Served) -> None:
    for path in ENDPOINTS:
        for reply in (
            get(served.url + path, token=None),
            get(served.url + path, token="wrong"),
            get(served.url + path, auth=f"Basic {TOKEN}"),
            get(served.url + path, token=TOKEN + "x"),
        ):
            assert reply.status == 401, path
            assert reply.headers["WWW-Authenticate"].startswith("Bearer")
            assert reply.json() == {"error": "missing or wrong bearer token"}
        assert get(served.url + path).status == 200, path
    health = get(served.url + "/healthz", token=None)
    assert (health.status, health.json()) == (200, {"status": "ok"})
    # The page and its static files hold no data: they load without the token, which
    # the page takes from ?token= once.
    assert get(served.url + "/", token=None).status == 200
    assert get(served.url + "/static/vendor/uPlot.iife.min.js", token=None).status == 200
    assert get(served.url + f"/?token={TOKEN}", token=None).status == 200
    log = served.proc.output()
    assert "GET /api/v1/status 401" in log  # the access log is on ...
    assert TOKEN not in log  # ... and never shows the token


# ---------------------------------------------------------------------------- API


def test_status_api_is_what_status_json_prints(served: Served) -> None:
    api = get(served.url + "/api/v1/status").json()
    cli = run_ragwatch("status", "--json", env=served.env)
    assert cli.returncode == 0, cli.stderr
    assert api == json.loads(cli.stdout)
    assert [h["host"] for h in api["hosts"]] == ["gpu-node-01", "gpu-node-02"]
    assert api["hosts"][0]["engines"][0]["target"] == "http://vllm-0:8000/metrics"
    active, pending, _ = served.fleet.silences
    assert [(s["id"], s["state"]) for s in api["silences"]] == [
        (pending, "pending"),  # oldest first; not the expired one
        (active, "active"),
    ]
    assert api["notifier"]["outbox_pending"] == 2 and api["notifier"]["dead_letters"] == 1
    assert api["notifier"]["counters"]["receivers"]["slack"] == {"sent": 3, "failed": 1}


def test_alerts_filter_limit_and_validation(served: Served) -> None:
    base = served.url + "/api/v1/alerts"
    every = get(base).json()
    assert every["total"] == 3 and not every["truncated"]
    firing = get(base + "?state=firing").json()["alerts"]
    assert [a["fingerprint"] for a in firing] == [
        served.fleet.leak.fingerprint,
        served.fleet.hostile.fingerprint,
    ]
    assert [a["rule"] for a in get(base + "?state=pending").json()["alerts"]] == ["ThroughputDrop"]
    one = get(base + "?limit=1").json()
    assert len(one["alerts"]) == 1 and one["truncated"] and one["total"] == 3
    for bad in ("?state=resolved", "?limit=0", "?limit=-1", "?limit=99999", "?limit=x",
                "?bogus=1", "?state=firing&state=pending"):  # fmt: skip
        reply = get(base + bad)
        assert reply.status == 400, bad
        assert "error" in reply.json()


def test_series_index_and_points(served: Served) -> None:
    fleet = served.fleet
    index = get(served.url + "/api/v1/series").json()
    ids = [s["id"] for s in index["series"]]
    assert ids == sorted(ids) and index["total"] == len(ids) == len(fleet.series_points)
    assert {fleet.leak_series, fleet.engine_series} <= set(ids)
    engines = get(served.url + "/api/v1/series?kind=engine").json()["series"]
    assert [s["id"] for s in engines] == [fleet.engine_series]
    assert get(served.url + "/api/v1/series?kind=nope").status == 400

    leak = get(served.url + "/api/v1/series/" + quote(fleet.leak_series, safe="")).json()
    assert (leak["kind"], leak["unit"], leak["labels"]["pid"]) == ("process", "bytes", "4011")
    assert leak["columns"] == ["ts", "value", "forecast", "score"]
    ts = [p[0] for p in leak["points"]]
    assert ts == sorted(ts) and len(ts) == fleet.series_points[fleet.leak_series]
    assert leak["points"][-1][1] > leak["points"][0][1] + 1e9  # it leaked > 1 GB
    assert leak["points"][-1][3] > 0.3  # with a leak score

    # An id with '/' (a scraped target URL), URL-encoded as the page does, or as typed.
    for path in (quote(fleet.engine_series, safe=""), fleet.engine_series):
        engine = get(served.url + "/api/v1/series/" + path).json()
        assert engine["id"] == fleet.engine_series
        assert all(p[2] is not None for p in engine["points"][-10:])  # a forecast
    last5 = get(served.url + "/api/v1/series/" + quote(fleet.leak_series) + "?limit=5").json()
    assert last5["points"] == leak["points"][-5:]

    missing = get(served.url + "/api/v1/series/" + quote("gpu:nope:0:fb_used", safe=""))
    assert (missing.status, missing.json()) == (404, {"error": "no series 'gpu:nope:0:fb_used'"})
    assert get(served.url + "/api/v1/series/" + "x" * 600).status == 400
    assert get(served.url + "/api/v1/series/" + quote(fleet.leak_series) + "?limit=0").status == 400


def test_silences_are_listed_read_only(served: Served) -> None:
    active, pending, expired = served.fleet.silences
    listed = get(served.url + "/api/v1/silences").json()["silences"]
    assert [s["id"] for s in listed] == [pending, active]
    every = get(served.url + "/api/v1/silences?all=true").json()["silences"]
    assert {s["id"]: s["state"] for s in every} == {
        active: "active",
        pending: "pending",
        expired: "expired",
    }
    window = next(s for s in every if s["id"] == pending)
    assert window["matchers"] == [{"name": "host", "op": "=~", "value": "gpu-node-0[12]"}]
    assert (window["cron"], window["duration_s"], window["ends_at"]) == ("0 0 29 2 *", 60.0, None)
    assert get(served.url + "/api/v1/silences?all=maybe").status == 400


def _metrics(served: Served) -> dict[str, list[Any]]:
    reply = get(served.url + "/metrics")
    assert reply.headers["Content-Type"].startswith("text/plain")
    families = text_string_to_metric_families(reply.body.decode())
    return {f.name: f.samples for f in families}


def test_metrics_parse_and_agree_with_status(served: Served) -> None:
    metrics = _metrics(served)
    assert set(metrics) <= METRIC_NAMES
    assert metrics["ragwatch_redis_up"][0].value == 1

    def key(labels: dict[str, str]) -> tuple[str, ...]:
        return (labels["alertname"], labels["host"], labels["gpu"], labels["pid"])

    firing_metrics = {
        key(s.labels) for s in metrics["ALERTS"] if s.labels["alertstate"] == "firing"
    }
    api = get(served.url + "/api/v1/status").json()
    cli = json.loads(run_ragwatch("status", "--json", env=served.env).stdout)
    for status in (api, cli):
        firing = {key(a["labels"]) for a in status["alerts"] if a["status"] == "firing"}
        assert firing == firing_metrics
    assert ("GpuMemoryLeak", "gpu-node-01", "1", "4011") in firing_metrics
    pending = [s.labels for s in metrics["ALERTS"] if s.labels["alertstate"] == "pending"]
    assert [(p["alertname"], p["instance"]) for p in pending] == [("ThroughputDrop", "rag-api-1")]
    # Label values round-trip exactly through the exposition's escaping.
    processes = {s.labels["process"] for s in metrics["ALERTS"] if "process" in s.labels}
    assert HOSTILE in processes

    gpus = {(s.labels["host"], s.labels["gpu"]): s.value
            for s in metrics["ragwatch_gpu_memory_growth_gb_per_hour"]}  # fmt: skip
    assert len(gpus) == 4 and gpus[("gpu-node-01", "1")] > 0.8
    assert len(metrics["ragwatch_gpu_memory_used_bytes"]) == 4
    assert 0 < metrics["ragwatch_gpu_utilization_ratio"][0].value <= 1
    tte = {(s.labels["host"], s.labels["gpu"]): s.value
           for s in metrics["ragwatch_gpu_time_to_exhaustion_hours"]}  # fmt: skip
    assert 5 < tte[("gpu-node-01", "1")] < 20

    # Per-pid series only for the alerted process that the host snapshot knows.
    pids = {s.labels.get("pid") for samples in metrics.values() for s in samples} - {None}
    assert pids == {"4011", "6666"}  # 6666: only in ALERTS (no such process reported)
    (score,) = metrics["ragwatch_process_leak_score"]
    assert score.labels["pid"] == "4011" and score.value > 0.3

    stages = {(s.labels["instance"], s.labels["stage"], s.labels["quantile"])
              for s in metrics["ragwatch_service_stage_latency_seconds"]}  # fmt: skip
    assert ("rag-api-0", "retriever", "0.95") in stages and ("rag-api-1", "llm", "0.99") in stages
    assert {s.labels["signal"] for s in metrics["ragwatch_service_anomaly_score"]} == {
        "tokens_per_request",
        "tokens_per_second",
    }
    for name in (
        "ragwatch_service_tokens_per_request",
        "ragwatch_service_tokens_per_request_forecast",
        "ragwatch_service_tokens_per_second",
        "ragwatch_engine_tokens_per_second",
    ):
        assert metrics[name] and all(s.value > 0 for s in metrics[name]), name
    assert metrics["ragwatch_notifier_outbox_pending"][0].value == 2
    assert metrics["ragwatch_notifier_dead_letters"][0].value == 1
    # worker counters are Prometheus counters: family without _total, samples with it
    (msgs,) = metrics["ragwatch_worker_messages"]
    assert (msgs.name, msgs.labels, msgs.value) == (
        "ragwatch_worker_messages_total",
        {"worker": "worker-1"},
        1234,
    )
    assert metrics["ragwatch_worker_deadletter_messages"][0].value == 0


def test_openapi_document_is_served(served: Served) -> None:
    doc = get(served.url + "/openapi.json").json()
    assert doc["openapi"].startswith("3.0.")
    assert "/api/v1/series/{id}" in doc["paths"]
    assert doc["paths"]["/healthz"]["get"]["security"] == []


def test_hostile_label_values_are_data_everywhere(served: Served) -> None:
    alerts = get(served.url + "/api/v1/alerts").json()["alerts"]
    hostile = next(a for a in alerts if a["fingerprint"] == served.fleet.hostile.fingerprint)
    assert hostile["labels"]["process"] == HOSTILE  # JSON-escaped on the wire, intact
    reply = get(served.url + "/api/v1/alerts")
    assert reply.headers["Content-Type"].startswith("application/json")
    assert reply.headers["X-Content-Type-Options"] == "nosniff"
    page = get(served.url + "/", token=None)
    assert "script-src 'self'" in page.headers["Content-Security-Policy"]
    assert "innerHTML" not in (Path(__file__).parents[2] / "ragwatch/web/app.js").read_text()
    text = run_ragwatch("status", env=served.env).stdout
    assert "\x1b" not in text and "\\x1b[2J" in text  # no terminal escapes get through


# ---------------------------------------------------------------------------- the page


def _attribute(tag: str, name: str) -> str:
    found = re.search(rf'{name}="([^"]*)"', tag)
    assert found, f"no {name} in {tag}"
    return html.unescape(found.group(1))


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium missing: make chromium")
def test_live_page_renders_alerts_and_the_chart(served: Served, tmp_path: Path) -> None:
    out = subprocess.run(
        [
            "chromium",
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--virtual-time-budget=5000",
            "--dump-dom",
            f"{served.url}/?token={TOKEN}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    dom = out.stdout
    assert out.returncode == 0 and "<body" in dom, out.stderr[-2000:]
    assert re.search(r'id="error"[^>]*></span>', dom), dom  # no error shown
    leak = served.fleet.leak
    alert = re.search(rf'<li class="alert firing" data-alertname="GpuMemoryLeak" '
                      rf'data-fingerprint="{leak.fingerprint}">(.*?)</li>', dom)  # fmt: skip
    assert alert, dom
    assert leak.annotations["hint"] in html.unescape(alert.group(1))
    # uPlot drew the leaking process's memory and its leak score on canvases.
    chart = dom[dom.index('<div id="chart"') : dom.index('<div id="score-chart"')]
    tag = chart[: chart.index(">")]
    series = _attribute(tag, "data-series")
    assert series == served.fleet.leak_series
    assert int(_attribute(tag, "data-points")) == served.fleet.series_points[series] > 100
    canvas = re.search(r'<canvas width="(\d+)" height="(\d+)"', chart)
    assert canvas and int(canvas.group(1)) > 300 and int(canvas.group(2)) > 200, chart
    assert re.search(r'<div id="score-chart" class="chart" data-points="[1-9]\d*"', dom)
    # Hostile label values are text: escaped in the DOM, no element made of them.
    assert "&lt;img src=x onerror=alert(1)&gt;" in dom
    assert "<img" not in dom and "<script>alert" not in dom


# ---------------------------------------------------------------------------- lifecycle


def test_open_server_redis_down_port_taken_and_sigterm(
    stack: EmbeddedStack, tmp_path: Path
) -> None:
    env = {**stack.env(), "RAGWATCH_REDIS_PREFIX": f"serve-{uuid.uuid4().hex[:8]}"}
    proc, url = start_serve(env, tmp_path / "open.log")
    assert f"serving on {url}/" in proc.output()  # 127.0.0.1 by default
    empty = get(url + "/api/v1/status", token=None)  # no token configured: open
    assert empty.status == 200 and empty.json()["hosts"] == []
    taken = run_ragwatch("serve", "--port", url.rsplit(":", 1)[1], env=env, timeout=20)
    assert taken.returncode == 2
    assert taken.stderr.startswith("ragwatch: error: cannot listen on 127.0.0.1:")
    started = time.monotonic()
    assert proc.stop(signal.SIGTERM, timeout=10) == 0
    assert time.monotonic() - started < 5

    down = {"RAGWATCH_REDIS_URL": f"redis://:pw-s3cret@127.0.0.1:{free_port()}/0"}
    proc, url = start_serve(down, tmp_path / "down.log")
    health = get(url + "/healthz", token=None)
    assert health.status == 503 and health.json()["status"] == "unavailable"
    status = get(url + "/api/v1/status", token=None)
    assert status.status == 503 and "cannot read from Redis" in status.json()["error"]
    metrics = get(url + "/metrics", token=None).body.decode()
    assert "ragwatch_redis_up 0.0" in metrics
    for text in (health.body, status.body, metrics.encode(), proc.output().encode()):
        assert b"pw-s3cret" not in text
    assert proc.stop(signal.SIGINT, timeout=10) == 0
