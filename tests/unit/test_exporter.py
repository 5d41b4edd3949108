"""``/metrics`` families from status dicts: names, labels, pid cardinality, escaping."""

from __future__ import annotations

import math
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector, CollectorRegistry

from ragwatch.console.exporter import METRIC_NAMES, families


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
                         "signals": {"generation_tokens_per_s": 900.0, "tps_score": 0.2}}],
        }
    ],
    "services": [
        {"service": "rag", "instances": [{"instance": "i0", "signals": {
            "retriever_p95_ms": 100.0, "e2e_p99_ms": 900.0, "queue_p95_ms": 5.0,
            "ttft_p95_ms": 300.0, "retriever_p99_baseline_ms": 110.0, "tpr_score": 0.7,
            "tokens_per_request": None}}]},
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
    (alert,) = m["ALERTS"]  # the resolved one is not active
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
    (tte,) = m["ragwatch_gpu_time_to_exhaustion_hours"]
    assert tte.labels["gpu"] == "0" and math.isinf(tte.value)
    assert m["ragwatch_gpu_utilization_ratio"][0].value == 0.4
    assert m["ragwatch_engine_tokens_per_second"][0].labels["target"] == "http://e:8000/metrics"
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
