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
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote, urljoin

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from ragwatch.advisor import explain
from ragwatch.codec import encode
from ragwatch.console.exporter import METRIC_NAMES
from ragwatch.embedded import EmbeddedStack, free_port
from ragwatch.schema import Alert
from ragwatch.store import Keys
from ragwatch.streams.notifier.pagerduty import PagerDutyConfig, pagerduty_event
from ragwatch.streams.notifier.slack import alert_url
from ragwatch.streams.notifier.webhook import alertmanager_payload
from tests.integration.conftest import Proc, clean_environ, run_ragwatch, wait_until
from tests.integration.fleet_data import HOSTILE, Fleet, write_fleet
from tests.prometheus_tools import prometheus_binary, promtool

TOKEN = "tok-" + uuid.uuid4().hex
ENDPOINTS = (
    "/api/v1/status",
    "/api/v1/explain?host=gpu-node-01",
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
    resolved: Alert  # in the alert history only


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
    resolved = write_resolved(env["RAGWATCH_REDIS_URL"], env["RAGWATCH_REDIS_PREFIX"], fleet)
    proc, url = start_serve(env, tmp_path_factory.mktemp("serve") / "serve.log")
    yield Served(url, env, fleet, proc, resolved)
    proc.stop(signal.SIGKILL, timeout=10)


def write_resolved(url: str, prefix: str, fleet: Fleet) -> Alert:
    """A leak alert that resolved: its changes in the history, not active."""
    start = fleet.leak.starts_at - 7200
    firing = replace(fleet.leak, fingerprint="resolved00000001", starts_at=start, at=start)
    resolved = replace(firing, status="resolved", ends_at=start + 3600, at=start + 3600)
    client = redis.Redis.from_url(url)
    try:
        for a in (firing, resolved):  # newest first, as the worker writes it
            client.lpush(Keys(prefix).history, encode(a))
    finally:
        client.close()
    return resolved


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


def raw_get(url: str, header: bytes) -> bytes:
    """A GET with one raw header line, for what urllib refuses to send."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"GET /api/v1/status HTTP/1.1\r\nHost: x\r\n" + header + b"\r\n\r\n")
        return sock.recv(65536)


def test_malformed_authorization_headers_get_4xx_and_never_reach_the_log(
    served: Served,
) -> None:
    """A NUL after the token made aiohttp log the header line (the token) at ERROR, and
    bytes that are not UTF-8 made the token check raise: a 500 and a traceback."""
    nul = raw_get(served.url, b"Authorization: Bearer " + TOKEN.encode() + b"\x00")
    assert nul.split(b"\r\n")[0].endswith(b" 400 Bad Request"), nul[:200]
    latin = raw_get(served.url, b"Authorization: Bearer \xff\xfe" + TOKEN.encode())
    assert latin.split(b"\r\n")[0].endswith(b" 401 Unauthorized"), latin[:200]
    wait_until(lambda: "unusable request" in served.proc.output(), 10, "the warning")
    log = served.proc.output()
    assert TOKEN not in log and "Traceback" not in log


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


def test_status_api_pages_hosts_and_services(served: Served) -> None:
    """One response held the whole fleet (20,000 hosts: 9.5 MB)."""
    full = get(served.url + "/api/v1/status").json()
    assert (full["total_hosts"], len(full["hosts"])) == (2, 2)
    second = get(served.url + "/api/v1/status?limit=1&offset=1").json()
    assert [h["host"] for h in second["hosts"]] == ["gpu-node-02"]
    assert second["total_hosts"] == 2 and second["alerts"] == full["alerts"]
    assert second["services"] == full["services"][1:2]
    assert get(served.url + "/api/v1/status?offset=5").json()["hosts"] == []
    for bad in ("limit=0", "limit=1001", "offset=-1", "offset=x", "page=2"):
        assert get(served.url + f"/api/v1/status?{bad}").status == 400, bad


def test_alerts_filter_limit_and_validation(served: Served) -> None:
    base = served.url + "/api/v1/alerts"
    every = get(base).json()
    assert every["total"] == 3 and not every["truncated"]
    firing = get(base + "?state=firing").json()["alerts"]
    assert [a["fingerprint"] for a in firing] == [
        served.fleet.leak.fingerprint,
        served.fleet.hostile.fingerprint,
    ]
    assert [a["rule"] for a in get(base + "?state=pending").json()["alerts"]] == ["DecodeSpeedDrop"]
    one = get(base + "?limit=1").json()
    assert len(one["alerts"]) == 1 and one["truncated"] and one["total"] == 3
    for bad in ("?state=resolved", "?limit=0", "?limit=-1", "?limit=99999", "?limit=x",
                "?bogus=1", "?state=firing&state=pending"):  # fmt: skip
        reply = get(base + bad)
        assert reply.status == 400, bad
        assert "error" in reply.json()


def test_explain_api_is_what_explain_json_prints_and_what_the_whole_status_says(
    served: Served,
) -> None:
    """The advisor reads only the alert's neighbourhood from Redis (its host, the services
    on it): the same answer as from the whole fleet's status."""
    leak = served.fleet.leak
    base = served.url + "/api/v1/explain"
    api = get(f"{base}?fingerprint={leak.fingerprint}&min_score=0").json()
    cli = run_ragwatch("explain", leak.fingerprint, "--json", "--min-score", "0", env=served.env)
    assert cli.returncode == 0, cli.stderr
    assert api == json.loads(cli.stdout)
    assert api["alert"]["rule"] == "GpuMemoryLeak" and api["host"] == leak.labels["host"]
    whole = explain(get(served.url + "/api/v1/status").json(), fingerprint=leak.fingerprint,
                    min_score=0.0)  # fmt: skip
    assert {k: v for k, v in api.items() if k not in ("charts", "requests")} == whole
    # what the alert's page draws beside it: its host's charts first, its services' requests
    host = leak.labels["host"]
    assert api["charts"][0] == f"gpu:{host}:0:fb_used"
    assert {c.split(":")[1] for c in api["charts"] if not c.startswith("service:")} == {host}
    assert api["requests"]["rag-api"]["points"]
    assert api["moves"] and {m["kind"] for m in api["moves"]} <= {
        "gpu",
        "process",
        "service",
        "engine",
    }
    scores = [m["score"] for m in api["moves"]]
    assert scores == sorted(scores, reverse=True)
    text = run_ragwatch("explain", "--host", leak.labels["host"], env=served.env)
    assert text.returncode == 0 and f"host {leak.labels['host']}" in text.stdout, text.stderr
    assert get(f"{base}?host=nope").status == 404
    assert run_ragwatch("explain", "--host", "nope", env=served.env).returncode == 1
    for bad in ("", "?min_score=2", "?min_score=x", "?bogus=1", "?host=a&host=b"):
        reply = get(base + bad)
        assert reply.status == 400 and "error" in reply.json(), bad


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
        key(s.labels) for s in metrics["ragwatch_alerts"] if s.labels["alertstate"] == "firing"
    }
    api = get(served.url + "/api/v1/status").json()
    cli = json.loads(run_ragwatch("status", "--json", env=served.env).stdout)
    for status in (api, cli):
        firing = {key(a["labels"]) for a in status["alerts"] if a["status"] == "firing"}
        assert firing == firing_metrics
    assert ("GpuMemoryLeak", "gpu-node-01", "1", "4011") in firing_metrics
    pending = [s.labels for s in metrics["ragwatch_alerts"] if s.labels["alertstate"] == "pending"]
    assert [(p["alertname"], p["service_instance"]) for p in pending] == [
        ("DecodeSpeedDrop", "rag-api-1")
    ]
    # Label values round-trip exactly through the exposition's escaping.
    processes = {s.labels["process"] for s in metrics["ragwatch_alerts"] if "process" in s.labels}
    assert HOSTILE in processes

    gpus = {(s.labels["host"], s.labels["gpu"]): s.value
            for s in metrics["ragwatch_gpu_memory_growth_bytes_per_second"]}  # fmt: skip
    assert len(gpus) == 4 and gpus[("gpu-node-01", "1")] > 0.8e9 / 3600  # > 0.8 GB/h
    assert len(metrics["ragwatch_gpu_memory_used_bytes"]) == 4
    assert 0 < metrics["ragwatch_gpu_utilization_ratio"][0].value <= 1
    tte = {(s.labels["host"], s.labels["gpu"]): s.value
           for s in metrics["ragwatch_gpu_time_to_exhaustion_seconds"]}  # fmt: skip
    assert 5 * 3600 < tte[("gpu-node-01", "1")] < 20 * 3600

    # Per-pid series only for the alerted process that the host snapshot knows.
    pids = {s.labels.get("pid") for samples in metrics.values() for s in samples} - {None}
    assert pids == {"4011", "6666"}  # 6666: only in ragwatch_alerts (no such process reported)
    (score,) = metrics["ragwatch_process_leak_score"]
    assert score.labels["pid"] == "4011" and score.value > 0.3

    stages = {(s.labels["service_instance"], s.labels["stage"], s.labels["quantile"])
              for s in metrics["ragwatch_service_stage_latency_seconds"]}  # fmt: skip
    assert ("rag-api-0", "retriever", "0.95") in stages and ("rag-api-1", "llm", "0.99") in stages
    assert {s.labels["signal"] for s in metrics["ragwatch_service_anomaly_score"]} == {
        "tokens_per_request",
        "tokens_per_second",
    }
    for name in (
        "ragwatch_service_tokens_per_request",
        "ragwatch_service_tokens_per_request_forecast",
        "ragwatch_service_tokens_per_second_forecast",
        "ragwatch_service_requests",  # counters: the family is named without _total
        "ragwatch_service_output_tokens",
        "ragwatch_engine_generation_tokens",
    ):
        assert metrics[name] and all(s.value > 0 for s in metrics[name]), name
    outcomes = {s.labels["outcome"]: s.value for s in metrics["ragwatch_notifier_notifications"]}
    assert outcomes == {"delivered": 3, "retried": 2, "failed": 1}
    latency = metrics["ragwatch_notifier_delivery_latency_seconds"]
    assert [s.value for s in latency if s.labels.get("le") in ("1.0", "60.0", "300.0")] == [2, 2, 3]
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
    scripts = list((Path(__file__).parents[2] / "ragwatch/console/web").glob("*.js"))
    assert {p.name for p in scripts} == {"app.js", "chart.js", "multiples.js"}
    assert not any("innerHTML" in p.read_text() for p in scripts)
    text = run_ragwatch("status", env=served.env).stdout
    assert "\x1b" not in text and "\\x1b[2J" in text  # no terminal escapes get through


# ---------------------------------------------------------------------------- alert pages


def links(external_url: str, alert: Alert) -> dict[str, str]:
    """The links to ``alert`` that the webhook, Slack and PagerDuty senders put in."""
    webhook = alertmanager_payload([alert], external_url=external_url)["alerts"][0]
    pager = PagerDutyConfig.from_mapping("pager", {"routing_key": "k" * 32})
    event = pagerduty_event(replace(alert, status="firing"), pager, external_url=external_url)
    assert event is not None
    return {
        "webhook": webhook["generatorURL"],
        "slack": alert_url(external_url, alert),
        "pagerduty": event["links"][0]["href"],
    }


def test_the_links_in_notifications_open_the_alerts_page(served: Served) -> None:
    fleet = served.fleet
    for alert in (fleet.leak, fleet.hostile, served.resolved):
        page = f"{served.url}/alerts/{alert.fingerprint}"
        for external_url in (served.url, served.url + "/"):
            assert set(links(external_url, alert).values()) == {page}, external_url
        reply = get(page)  # with the token: the server names the alert
        assert reply.status == 200 and reply.headers["Content-Type"].startswith("text/html")
        title = f"<title>ragwatch: {alert.rule} ({alert.status})</title>"
        assert title in reply.body.decode(), reply.body[:400]
        assert "script-src 'self'" in reply.headers["Content-Security-Policy"]
        assert reply.headers["Cache-Control"] == "no-store"
        # Followed from Slack (no token): the bare page, nothing read; its script reads
        # the alert with the token the tab keeps. A wrong token is refused.
        bare = get(page, token=None)
        assert bare.status == 200 and alert.rule not in bare.body.decode()
        assert alert.labels["host"] not in bare.body.decode()
        assert get(page + f"?token={TOKEN}", token=None).status == 200
        assert get(page, token="wrong").status == 401
        for asset in (
            "../static/app.js",
            "../static/style.css",
            "../static/vendor/uPlot.iife.min.js",
        ):
            assert get(urljoin(page, asset), token=None).status == 200, asset
    assert TOKEN not in served.proc.output()


def test_an_unknown_alert_is_a_404_page(served: Served) -> None:
    for fp, shown in (
        ("0123456789abcdef", "0123456789abcdef"),
        ("<script>alert(1)</script>", "&lt;script&gt;alert(1)&lt;/script&gt;"),
        ("f" * 5000, "f" * 128),
    ):
        reply = get(f"{served.url}/alerts/{quote(fp, safe='')}")
        body = reply.body.decode()
        assert reply.status == 404 and reply.headers["Content-Type"].startswith("text/html")
        assert f"No alert {shown}" in body or f"no alert {shown}" in body, body
        assert "<script>alert" not in body
    assert get(f"{served.url}/alerts/0123456789abcdef", token=None).status == 200  # bare
    api = get(served.url + "/api/v1/alerts/0123456789abcdef")
    assert api.status == 404 and "no alert '0123456789abcdef'" in api.json()["error"]
    assert get(served.url + "/api/v1/alerts/" + "f" * 200).status == 400
    assert get(served.url + "/api/v1/alerts/0123456789abcdef?x=1").status == 400


def test_alert_api_gives_the_alert_its_changes_and_the_series_of_its_signal(
    served: Served,
) -> None:
    fleet = served.fleet
    leak = get(served.url + f"/api/v1/alerts/{fleet.leak.fingerprint}").json()
    assert leak["active"] and leak["alert"]["status"] == "firing"
    assert leak["alert"]["annotations"]["hint"] == fleet.leak.annotations["hint"]
    assert {h["fingerprint"] for h in leak["history"]} == {fleet.leak.fingerprint}
    changes = [h["status"] for h in leak["history"]]  # newest first
    assert changes[0] == "firing" and changes[-1] == "pending", changes
    assert leak["series"][0] == fleet.leak_series  # the process's memory, then its GPU's
    assert leak["series"][1] == "gpu:{host}:{gpu}:fb_used".format(**fleet.leak.labels)
    for path in (f"/api/v1/alerts/{fleet.leak.fingerprint}", "/api/v1/alerts/nope"):
        assert get(served.url + path, token=None).status == 401

    # A service alert: the chart of the signal of its rule (DecodeSpeedDrop: the decode
    # speed per request with its baseline), read from the series index the recorder wrote.
    (pending,) = get(served.url + "/api/v1/alerts?state=pending").json()["alerts"]
    drop = get(served.url + f"/api/v1/alerts/{pending['fingerprint']}").json()
    instance = pending["labels"]["instance"]
    assert drop["series"][0] == f"service:rag-api:{instance}:decode_tps"
    chart = get(served.url + "/api/v1/series/" + quote(drop["series"][0], safe="")).json()
    assert chart["signal"] == "decode_tps" and "DecodeSpeedDrop" in chart["rules"]
    assert drop["silenced_by"] == [fleet.silences[0]]  # alertname=DecodeSpeedDrop

    gone = get(served.url + f"/api/v1/alerts/{served.resolved.fingerprint}").json()
    assert not gone["active"] and gone["alert"]["status"] == "resolved"
    assert [h["status"] for h in gone["history"]] == ["resolved", "firing"]
    assert gone["series"][0] == fleet.leak_series
    # No series of the hostile alert's process: its GPU's memory.
    hostile = get(served.url + f"/api/v1/alerts/{fleet.hostile.fingerprint}").json()
    gpu = "gpu:gpu-node-02:0:"  # its memory first, then its other charts
    assert hostile["series"] == [gpu + "fb_used", gpu + "gpu_util", gpu + "power_w"]
    assert hostile["alert"]["labels"]["process"] == HOSTILE


# ---------------------------------------------------------------------------- the page


def _attribute(tag: str, name: str) -> str:
    found = re.search(rf'{name}="([^"]*)"', tag)
    assert found, f"no {name} in {tag}"
    return html.unescape(found.group(1))


def browse(url: str, profile: Path) -> str:
    """The DOM of ``url`` after its script ran, in headless chromium."""
    out = subprocess.run(
        [
            "chromium",
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=5000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "<body" in out.stdout, out.stderr[-2000:]
    return out.stdout


def drawn(dom: str) -> tuple[str, int, str]:
    """The series id and number of points on the page's chart, and the chart's HTML."""
    chart = dom[dom.index('<div id="chart"') : dom.index('<div id="score-chart"')]
    tag = chart[: chart.index(">")]
    return _attribute(tag, "data-series"), int(_attribute(tag, "data-points")), chart


def no_error(dom: str) -> bool:
    return re.search(r'id="error"[^>]*></span>', dom) is not None


@pytest.mark.usefixtures("chromium")
def test_live_page_renders_alerts_and_the_chart(served: Served, tmp_path: Path) -> None:
    # a series picked in the address (#series=), kept whatever the alerts
    leak_series = quote(served.fleet.leak_series, safe="")
    dom = browse(f"{served.url}/?token={TOKEN}#series={leak_series}", tmp_path / "profile")
    assert no_error(dom), dom
    leak = served.fleet.leak
    alert = re.search(rf'<li class="alert firing" data-alertname="GpuMemoryLeak" '
                      rf'data-fingerprint="{leak.fingerprint}"[^>]*>(.*?)</li>', dom)  # fmt: skip
    assert alert, dom
    assert leak.annotations["hint"] in html.unescape(alert.group(1))
    assert f'<a href="alerts/{leak.fingerprint}">details</a>' in alert.group(1)
    # uPlot drew the leaking process's memory and its leak score on canvases.
    series, points, chart = drawn(dom)
    assert series == served.fleet.leak_series
    assert points == served.fleet.series_points[series] > 100
    canvas = re.search(r'<canvas width="(\d+)" height="(\d+)"', chart)
    assert canvas and int(canvas.group(1)) > 300 and int(canvas.group(2)) > 200, chart
    assert re.search(r'<div id="score-chart" class="chart" data-points="[1-9]\d*"', dom)
    # Hostile label values are text: escaped in the DOM, no element made of them.
    assert "&lt;img src=x onerror=alert(1)&gt;" in dom
    assert "<img" not in dom and "<script>alert" not in dom


@pytest.mark.usefixtures("chromium")
def test_alert_pages_show_the_alert_and_the_chart_of_its_signal(
    served: Served, tmp_path: Path
) -> None:
    fleet = served.fleet
    page = f"{served.url}/alerts/{fleet.leak.fingerprint}"
    dom = browse(f"{page}?token={TOKEN}", tmp_path / "leak")
    assert no_error(dom), dom
    assert '<h2 id="alert-title" data-status="firing">GpuMemoryLeak (firing)</h2>' in dom
    text = html.unescape(dom)
    for shown in (fleet.leak.annotations["hint"], fleet.leak.annotations["runbook"]):
        assert shown in text
    assert f"<dt>pid</dt><dd>{fleet.leak.labels['pid']}</dd>" in dom
    series, points, _ = drawn(dom)
    assert series == fleet.leak_series and points == fleet.series_points[series]

    # A service alert's page charts the signal of its rule.
    (pending,) = get(served.url + "/api/v1/alerts?state=pending").json()["alerts"]
    dom = browse(f"{served.url}/alerts/{pending['fingerprint']}?token={TOKEN}", tmp_path / "svc")
    assert no_error(dom), dom
    series, points, _ = drawn(dom)
    assert series == f"service:rag-api:{pending['labels']['instance']}:decode_tps"
    assert points == fleet.series_points[series] > 10

    dom = browse(f"{served.url}/alerts/{fleet.hostile.fingerprint}?token={TOKEN}", tmp_path / "h")
    assert "&lt;img src=x onerror=alert(1)&gt;" in dom
    assert "<img" not in dom and "<script>alert" not in dom
    dom = browse(f"{served.url}/alerts/0123456789abcdef?token={TOKEN}", tmp_path / "unknown")
    assert '<h2 id="alert-title">No alert 0123456789abcdef</h2>' in dom, dom
    # Followed from a notification in a tab without the token: the page says how to open it.
    dom = browse(page, tmp_path / "bare")
    assert f"open this page once as /alerts/{fleet.leak.fingerprint}?token=" in dom, dom


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
    assert health.json()["reason"] == "redis: ConnectionError"  # public: no error text
    status = get(url + "/api/v1/status", token=None)
    assert status.status == 503 and "cannot read from Redis" in status.json()["error"]
    metrics = get(url + "/metrics", token=None).body.decode()
    assert "ragwatch_redis_up 0.0" in metrics
    for text in (health.body, status.body, metrics.encode(), proc.output().encode()):
        assert b"pw-s3cret" not in text
    assert proc.stop(signal.SIGINT, timeout=10) == 0


def test_promtool_check_metrics_is_clean_on_a_scrape(served: Served) -> None:
    """Prometheus' own linter on what ``/metrics`` serves: names, base units, counter
    suffixes, help texts (docs/console.md)."""
    body = get(served.url + "/metrics").body
    out = subprocess.run([promtool(), "check", "metrics"], input=body, capture_output=True)
    assert (out.returncode, out.stdout + out.stderr) == (0, b"")


def test_a_real_prometheus_scraping_serve_answers_every_dashboard_query(
    served: Served, tmp_path: Path
) -> None:
    """Prometheus (Debian's 2.42) scrapes ``/metrics`` with the bearer token as the scrape
    config in docs/operations.md says; every query of deploy/grafana/ragwatch.json, its
    variables at their defaults, is valid PromQL and returns series."""
    token = tmp_path / "token"
    token.write_text(TOKEN)
    port = free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: ragwatch\n"
        f"    authorization: {{credentials_file: {token}}}\n"
        f"    static_configs: [{{targets: ['{served.url.removeprefix('http://')}']}}]\n"
    )
    prom = subprocess.Popen(
        [
            prometheus_binary("prometheus"),
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    api = f"http://127.0.0.1:{port}/api/v1/query?query="

    def query(expr: str) -> list[Any]:
        with urllib.request.urlopen(api + quote(expr), timeout=10) as resp:
            body = json.loads(resp.read())
        assert body["status"] == "success", (expr, body)
        return list(body["data"]["result"])

    def scraped() -> bool:
        assert prom.poll() is None, prom.stderr.read() if prom.stderr else ""
        try:  # rate() needs two samples of each counter
            return len(query('ragwatch_redis_up{job="ragwatch"}[1m]')[0]["values"]) >= 3
        except (OSError, IndexError):
            return False

    try:
        wait_until(scraped, 30, "Prometheus never scraped ragwatch serve")
        dash = json.loads((Path(__file__).parents[2] / "deploy/grafana/ragwatch.json").read_text())
        defaults = {"$job": "ragwatch", "$host": ".*", "$service": ".*"}
        exprs = [t["expr"] for p in _panels(dash) for t in p.get("targets", [])]
        assert len(exprs) >= 25
        for expr in exprs:
            for var, value in defaults.items():
                expr = expr.replace(var, value)
            assert query(expr), f"no series for {expr}"
    finally:
        prom.terminate()
        prom.wait(timeout=10)


def _panels(node: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in node.get("panels", []):
        out += [p, *_panels(p)]
    return out
