"""``/metrics`` families from status dicts: names, labels, pid cardinality, escaping."""

from __future__ import annotations

import logging
import math
import subprocess
from dataclasses import asdict
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector, CollectorRegistry

from ragwatch.console.exporter import METRIC_NAMES, PROBE_TTL_S, RedisWrites, families
from ragwatch.streams.notifier.delivery_stats import ReceiverStats
from tests.prometheus_tools import promtool


class Static(Collector):
    def __init__(self, status: dict[str, Any], points: dict[str, list[Any]]) -> None:
        self.status, self.points = status, points

    def collect(self) -> Any:
        return families(self.status, self.points)


def scrape(status: dict[str, Any], points: dict[str, list[Any]] | None = None) -> dict[str, Any]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Static(status, points or {}))
    text = generate_latest(registry).decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def proc(pid: int, name: str) -> dict[str, Any]:
    return {"pid": pid, "name": name, "container": "c", "gpu_mem_bytes": 1e9, "gb_per_hour": 0.1}


STATUS: dict[str, Any] = {
    "hosts": [
        {
            "host": "h1",
            "gpus": [
                {"index": 0, "mig": "1g.10gb", "fb_used_bytes": 5e9, "fb_total_bytes": 1e10,
                 "gb_per_hour": 0.0, "tte_h": None, "gpu_util": 40.0,
                 "procs": [proc(10, "a"), proc(11, "b")]},
                {"index": 1, "mig": None, "fb_used_bytes": 5e9, "procs": [proc(12, "c")]},
            ],
            "engines": [{"target": "http://e:8000/metrics",
                         "signals": {"generation_tokens_per_s": 900.0, "tps_score": 0.2,
                                     "generation_tokens_total": 7.2e6}}],
        }
    ],
    "services": [
        {"service": "rag", "instances": [{"instance": "i0", "signals": {
            "retriever_p95_ms": 100.0, "e2e_p99_ms": 900.0, "queue_p95_ms": 5.0,
            "ttft_p95_ms": 300.0, "retriever_p99_baseline_ms": 110.0, "tpr_score": 0.7,
            "tokens_per_request": None, "requests_total": 1200.0, "errors_total": 3.0,
            "output_tokens_total": 2.4e5, "rps_forecast": 2.0}}]},
    ],
    "alerts": [
        {"rule": "GpuMemoryLeak", "severity": "critical", "status": "firing",
         "labels": {"alertname": "GpuMemoryLeak", "host": "h1", "gpu": "0", "mig": "1g.10gb",
                    "pid": "11", "process": 'x"\\\n', "team.name": "ml", "__x": "y"}},
        {"rule": "Other", "severity": "info", "status": "resolved", "labels": {}},
    ],
    "silences": [{"state": "active"}, {"state": "expired"}, {"state": "pending"}],
    "notifier": {"outbox_pending": 4, "dead_letters": 0, "seen": 1.0},
    "workers": {"w1": {"seen": 2.0}},
}  # fmt: skip


def test_every_family_is_declared_and_alerts_follow_prometheus() -> None:
    m = scrape(STATUS, {"process:h1:0:1g.10gb:11:gpu_mem": [0.0, 1e9, None, 0.8]})
    assert set(m) <= METRIC_NAMES
    (alert,) = m["ragwatch_alerts"]  # the resolved one is not active
    assert alert.value == 1
    assert alert.labels["alertstate"] == "firing" and alert.labels["severity"] == "critical"
    assert alert.labels["process"] == 'x"\\\n'  # escaped on the wire, intact after parsing
    assert alert.labels["team_name"] == "ml" and "__x" not in alert.labels


def test_pids_only_for_alerted_processes_with_their_leak_score() -> None:
    m = scrape(STATUS, {"process:h1:0:1g.10gb:11:gpu_mem": [0.0, 1e9, None, 0.8]})
    pids = {s.labels.get("pid") for samples in m.values() for s in samples} - {None}
    assert pids == {"11"}
    (score,) = m["ragwatch_process_leak_score"]
    assert (score.labels["process"], score.value) == ("b", 0.8)


def test_gpu_engine_service_and_notifier_values() -> None:
    m = scrape(STATUS)
    used = {
        (s.labels["gpu"], s.labels["mig"]): s.value for s in m["ragwatch_gpu_memory_used_bytes"]
    }
    assert used == {("0", "1g.10gb"): 5e9, ("1", ""): 5e9}
    # not growing: never runs out (+Inf); GPU 1 has no estimate yet: no sample
    (tte,) = m["ragwatch_gpu_time_to_exhaustion_seconds"]
    assert tte.labels["gpu"] == "0" and math.isinf(tte.value)
    assert m["ragwatch_gpu_utilization_ratio"][0].value == 0.4
    (tokens,) = m["ragwatch_engine_generation_tokens"]  # a counter: the family has no _total
    assert (tokens.name, tokens.value) == ("ragwatch_engine_generation_tokens_total", 7.2e6)
    assert tokens.labels["target"] == "http://e:8000/metrics"
    assert m["ragwatch_engine_anomaly_score"][0].value == 0.2
    (stage,) = m["ragwatch_service_stage_latency_seconds"]
    assert (stage.labels["stage"], stage.labels["quantile"], stage.value) == (
        "retriever",
        "0.95",
        0.1,
    )
    assert m["ragwatch_service_e2e_latency_seconds"][0].labels["quantile"] == "0.99"
    assert m["ragwatch_service_queue_latency_seconds"][0].value == 0.005
    assert m["ragwatch_service_ttft_seconds"][0].value == 0.3
    assert m["ragwatch_service_latency_baseline_seconds"][0].labels["signal"] == "retriever_p99"
    assert "ragwatch_service_tokens_per_request" not in m  # None: no sample
    score = m["ragwatch_service_anomaly_score"][0]
    assert (score.labels["signal"], score.value) == ("tokens_per_request", 0.7)
    assert m["ragwatch_notifier_outbox_pending"][0].value == 4
    assert {s.labels["state"]: s.value for s in m["ragwatch_silences"]} == {
        "active": 1,
        "pending": 1,
    }


def test_an_empty_status_exports_only_the_basics() -> None:
    assert set(scrape({})) == {
        "ragwatch_redis_up",
        "ragwatch_notifier_outbox_pending",
        "ragwatch_notifier_dead_letters",
        "ragwatch_silences",
    }


def test_flapping_alerts_are_counters_per_alert() -> None:
    flaps = [{"rule": "RetrievalSlowdown", "fingerprint": "abc", "count": 3}]
    got = scrape({"flaps": flaps})
    (sample,) = got["ragwatch_alert_flaps"]
    assert sample.name == "ragwatch_alert_flaps_total" and sample.value == 3.0
    assert sample.labels == {"alertname": "RetrievalSlowdown", "fingerprint": "abc"}


def test_base_units_counters_and_no_target_label_collisions() -> None:
    status = {
        "hosts": [{"host": "h1", "gpus": [{"index": 0, "gb_per_hour": 1.8, "tte_h": 2.0}]}],
        "services": STATUS["services"],
        "alerts": [
            {"rule": "RetrievalSlowdown", "severity": "warning", "status": "firing",
             "labels": {"service": "rag", "instance": "i0", "job": "batch"}},
        ],
    }  # fmt: skip
    m = scrape(status)
    (growth,) = m["ragwatch_gpu_memory_growth_bytes_per_second"]
    assert growth.value == pytest.approx(5e5)  # 1.8 GB/h = 500 kB/s
    assert m["ragwatch_gpu_time_to_exhaustion_seconds"][0].value == 7200.0
    requests = {s.name: s.value for fam in ("requests", "request_errors", "output_tokens")
                for s in m[f"ragwatch_service_{fam}"]}  # fmt: skip
    assert requests == {
        "ragwatch_service_requests_total": 1200.0,
        "ragwatch_service_request_errors_total": 3.0,
        "ragwatch_service_output_tokens_total": 2.4e5,
    }
    assert m["ragwatch_service_requests_per_second_forecast"][0].value == 2.0
    names = {k for samples in m.values() for s in samples for k in s.labels}
    assert "instance" not in names and "job" not in names  # Prometheus' own target labels
    (alert,) = m["ragwatch_alerts"]
    assert (alert.labels["service_instance"], alert.labels["exported_job"]) == ("i0", "batch")
    assert {s.labels["service_instance"] for s in m["ragwatch_service_requests"]} == {"i0"}


def test_notifier_outcomes_and_delivery_latency_per_receiver() -> None:
    stats = ReceiverStats(retried=4, failed=1)
    for seconds in (0.2, 0.7, 40.0):
        stats.delivered_after(seconds)
    notifier = {"outbox_pending": 0, "dead_letters": 1, "seen": 1.0,
                "counters": {"deliveries": {"oncall": asdict(stats)}}}  # fmt: skip
    m = scrape({"notifier": notifier})
    outcomes = {s.labels["outcome"]: s.value for s in m["ragwatch_notifier_notifications"]}
    assert outcomes == {"delivered": 3, "retried": 4, "failed": 1}
    latency = m["ragwatch_notifier_delivery_latency_seconds"]
    buckets = {s.labels["le"]: s.value for s in latency if s.name.endswith("_bucket")}
    assert (buckets["0.5"], buckets["1.0"], buckets["30.0"], buckets["60.0"]) == (1, 2, 2, 3)
    assert buckets["+Inf"] == 3
    forward = {"posts": 10, "failures": 2, "alerts_sent": 30}
    notifier["counters"]["alertmanager"] = forward  # type: ignore[index]
    m = scrape({"notifier": notifier})
    posts = {s.labels["outcome"]: s.value for s in m["ragwatch_notifier_alertmanager_posts"]}
    assert posts == {"ok": 8, "failed": 2}
    assert m["ragwatch_notifier_alertmanager_alerts_sent"][0].value == 30
    (total,) = (s.value for s in latency if s.name.endswith("_sum"))
    assert total == pytest.approx(40.9)
    assert {s.labels["receiver"] for s in latency} == {"oncall"}


def test_gpu_and_process_series_carry_their_pod() -> None:
    pod = {"namespace": "rag-prod", "pod": "retriever-7d9f", "container": "worker"}
    p = {**proc(11, "b"), "container": "worker", "namespace": "rag-prod", "pod": "retriever-7d9f"}
    status = {
        "hosts": [{"host": "h1", "gpus": [{"index": 0, "mig": None, "fb_used_bytes": 5e9,
                                           **pod, "procs": [p]}]}],
        "alerts": [{"rule": "GpuMemoryLeak", "severity": "critical", "status": "firing",
                    "labels": {"host": "h1", "gpu": "0", "pid": "11", **pod}}],
    }  # fmt: skip
    m = scrape(status)
    (used,) = m["ragwatch_gpu_memory_used_bytes"]
    assert {k: used.labels[k] for k in pod} == pod
    (mem,) = m["ragwatch_process_gpu_memory_bytes"]
    assert {k: mem.labels[k] for k in pod} == pod
    assert {k: m["ragwatch_alerts"][0].labels[k] for k in pod} == pod


def test_promtool_finds_nothing_to_say_about_the_exposition() -> None:
    """``promtool check metrics`` (Prometheus' own linter: names, units, counter suffixes,
    help) on a scrape holding every family."""
    stats = ReceiverStats()
    stats.delivered_after(1.0)
    forward = {"posts": 3, "failures": 1, "alerts_sent": 2}
    counters = {"deliveries": {"oncall": asdict(stats)}, "alertmanager": forward}
    notifier = {**STATUS["notifier"], "counters": counters}
    status = {
        **STATUS,
        "notifier": notifier,
        "flaps": [{"rule": "R", "fingerprint": "f", "count": 1}],
    }
    status["workers"] = {"w1": {"seen": 2.0, "messages": 5, "deadletter": 0}}
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Static(status, {"process:h1:0:1g.10gb:11:gpu_mem": [0.0, 1e9, None, 0.8]}))
    text = generate_latest(registry)
    exported = {f.name for f in text_string_to_metric_families(text.decode())}
    assert len(exported) >= 30, exported
    out = subprocess.run(
        [promtool(), "check", "metrics"], input=text, capture_output=True, timeout=30
    )
    assert (out.returncode, out.stdout + out.stderr) == (0, b"")


# ---------------------------------------------------------------------------- writes


class Given(Collector):
    def __init__(self, fams: Any) -> None:
        self.fams = list(fams)

    def collect(self) -> Any:
        return iter(self.fams)


def test_writability_is_a_gauge_beside_redis_up_and_absent_when_not_known() -> None:
    for writable, value in ((True, 1.0), (False, 0.0)):
        registry = CollectorRegistry(auto_describe=False)
        registry.register(Given(families({}, None, writable)))
        text = generate_latest(registry).decode()
        (fam,) = [f for f in text_string_to_metric_families(text) if f.name.endswith("writable")]
        assert (fam.type, fam.samples[0].value) == ("gauge", value)
        assert text.index("ragwatch_redis_up") < text.index("ragwatch_redis_writable")
    assert "ragwatch_redis_writable" not in {m.name for m in families({}, None, None)}


class Refusing:
    """A Redis client whose SET raises what the test sets (None: takes the write)."""

    def __init__(self) -> None:
        self.error: Exception | None = None
        self.sets: list[tuple[str, int]] = []

    def set(self, key: str, value: bytes, ex: int) -> bool:
        self.sets.append((key, ex))
        if self.error is not None:
            raise self.error
        return True


def test_refused_writes_are_named_and_logged_once_per_change(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from redis.exceptions import (
        ConnectionError,
        NoPermissionError,
        OutOfMemoryError,
        ReadOnlyError,
        ResponseError,
    )

    client = Refusing()
    writes = RedisWrites(client, "rw", "redis://127.0.0.1:6379/0")
    assert writes.ok is None  # not probed yet
    script: list[tuple[Exception | None, bool | None, str]] = [
        (None, True, ""),
        (OutOfMemoryError("command not allowed when used memory > 'maxmemory'."), False, "OOM: "),
        (OutOfMemoryError("command not allowed when used memory > 'maxmemory'."), False, "OOM: "),
        (None, True, ""),
        (ReadOnlyError("You can't write against a read only replica."), False, "READONLY: "),
        (NoPermissionError("this user has no permissions"), False, "NOPERM: "),
        (ResponseError("MISCONF Redis is configured to save RDB snapshots"), False, "MISCONF"),
        (ConnectionError("Error 111 connecting"), None, "ConnectionError"),
        (ConnectionError("Error 111 connecting"), None, "ConnectionError"),
        (None, True, ""),
        (None, True, ""),
    ]
    with caplog.at_level(logging.INFO, logger="ragwatch.console.exporter"):
        for error, ok, reason in script:
            client.error = error
            writes.update(writes.probe())
            assert writes.ok is ok and writes.state is not None
            assert writes.state.reason.startswith(reason), writes.state
    assert client.sets == [("rw:serve:probe", PROBE_TTL_S)] * len(script)
    lines = [f"{r.levelname} {r.getMessage()}" for r in caplog.records]
    assert len(lines) == 7, lines  # one per change, none for the first probe that finds it well
    oom, back, readonly, noperm, misconf, down, again = lines
    assert oom.startswith("WARNING redis at redis://127.0.0.1:6379/0 refuses writes (OOM: ")
    assert "Redis says: command not allowed when used memory > 'maxmemory'." in oom
    assert back == again == "INFO redis at redis://127.0.0.1:6379/0 takes writes again"
    assert "(READONLY: a read-only replica)" in readonly and "(NOPERM: " in noperm
    assert "(MISCONF)" in misconf
    assert down == "WARNING redis at redis://127.0.0.1:6379/0 does not answer: Error 111 connecting"


def test_the_fleet_view_counts_each_worker_by_outcome() -> None:
    worker = {"seen": 2.0, "facts_records": 120, "facts_bad": 2, "hints_waited": 3,
              "hints_incomplete": 1, "gpu_peer_minutes": 60, "gpu_peer_incomplete": 4}  # fmt: skip
    m = scrape({**STATUS, "workers": {"w1": worker, "w2": {"seen": 2.0}}})
    assert set(m) <= METRIC_NAMES

    def of(family: str, label: str) -> dict[tuple[str, str], float]:
        return {(s.labels["worker"], s.labels[label]): s.value for s in m[family]}

    records = of("ragwatch_worker_facts_records", "outcome")
    assert records == {("w1", "ok"): 118, ("w1", "bad"): 2}  # w2 wrote none: none exported
    assert of("ragwatch_worker_hints", "how") == {("w1", "waited"): 3, ("w1", "incomplete"): 1}
    minutes = of("ragwatch_worker_gpu_peer_minutes", "outcome")
    assert minutes == {("w1", "complete"): 56, ("w1", "incomplete"): 4}


def scored(score: float, yhat: float, lo: float, hi: float, value: float) -> list[float]:
    """A status entry's scored signal (ragwatch.catalog.SCORE_FIELDS)."""
    return [score, yhat, lo, hi, value, score, value, yhat, 1e9]


def rss(score: float) -> list[float]:
    return scored(score, 2e9, 1e9, 3e9, 2e9)


def test_anomaly_scores_export_like_vmanomaly_labelled_like_their_series() -> None:
    status = {
        "hosts": [{"host": "h1", "gpus": [
            {"index": 2, "mig": None, "namespace": "ml", "pod": "p", "container": "c",
             "scores": {"power_w": scored(0.97, 300.0, 250.0, 350.0, 60.0)},
             "procs": [{**proc(11, "b"), "scores": {"rss_bytes": rss(0.1)}},
                       {**proc(12, "c"), "scores": {"rss_bytes": rss(0.2)}}]}],
            "engines": [{"target": "t", "scores": {"kv_cache_usage_ratio": scored(
                0.5, 0.4, 0.1, 0.7, 0.6)}}]}],
        "services": [{"service": "rag", "instances": [{"instance": "i0", "scores": {
            "reranker_p95_ms": scored(0.99, 40.0, 30.0, 55.0, 160.0),
            "broken": [1.0, 2.0]}}]}],
        "alerts": [{"status": "firing", "labels": {"host": "h1", "gpu": "2", "pid": "11"}}],
    }  # fmt: skip
    m = scrape(status)
    assert set(m) <= METRIC_NAMES
    by = {
        (f, s.labels.get("gpu") or s.labels.get("target") or s.labels.get("service_instance"),
         s.labels.get("pid"), s.labels["signal"]): s.value
        for f in ("ragwatch_anomaly_score", "ragwatch_anomaly_yhat",
                  "ragwatch_anomaly_yhat_lower", "ragwatch_anomaly_yhat_upper")
        for s in m[f]
    }  # fmt: skip
    assert by[("ragwatch_anomaly_score", "2", None, "power_w")] == pytest.approx(0.97)
    assert by[("ragwatch_anomaly_yhat", "2", None, "power_w")] == 300.0
    assert by[("ragwatch_anomaly_yhat_lower", "2", None, "power_w")] == 250.0
    assert by[("ragwatch_anomaly_yhat_upper", "2", None, "power_w")] == 350.0
    assert by[("ragwatch_anomaly_score", "i0", None, "reranker_p95_ms")] == pytest.approx(0.99)
    assert by[("ragwatch_anomaly_yhat_upper", "t", None, "kv_cache_usage_ratio")] == 0.7
    # a process only while it has an alert (pids are high-cardinality); no malformed entry
    assert by[("ragwatch_anomaly_score", "2", "11", "rss_bytes")] == pytest.approx(0.1)
    assert not any(k[2] == "12" or k[3] == "broken" for k in by)
    gpu = next(s for s in m["ragwatch_anomaly_score"] if s.labels.get("gpu") == "2")
    assert {k: gpu.labels[k] for k in ("host", "namespace", "pod", "container")} == {
        "host": "h1", "namespace": "ml", "pod": "p", "container": "c"}  # fmt: skip
