"""bench/quality.py's scenario part: detection delays, hints and unexpected alerts."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.bench_modules import load


@pytest.fixture(scope="module")
def quality() -> ModuleType:
    return load("quality")


def test_leak_on_a_tiny_fleet_is_detected_with_a_hint(quality: ModuleType) -> None:
    r = quality.evaluate_scenario("leak", hours=2.0, hosts=1, gpus=1, services=1, interval_s=60.0)
    (leak,) = r["expected"]
    assert leak["rule"] == "GpuMemoryLeak"
    assert leak["labels"] == {"host": "gpu-node-01", "gpu": "0", "pid": "4001"}
    assert leak["fired_min"] is not None
    assert 0 < leak["pending_min"] <= leak["eval_min"] <= leak["fired_min"] < 100
    assert leak["met"] is (leak["fired_min"] <= 30)
    assert "4001" in leak["hint"]


def _firing(rule: str, labels: dict[str, str], minute: float) -> dict[str, object]:
    ts = 1000.0 + 60 * minute
    return {
        "rule": rule,
        "labels": labels,
        "starts_at": ts - 120,
        "eval_ts": ts - 60,
        "env_ts": ts,
        "hint": "h",
    }


def test_score_splits_expected_missed_and_unexpected(quality: ModuleType) -> None:
    svc = {"service": "rag-api", "instance": "rag-api-1"}
    other = {"service": "rag-api", "instance": "rag-api-0"}
    run = {
        "job": {"hours": 2.0},
        "fault_start_ts": 1000.0,
        "expected": [("DecodeSpeedDrop", svc), ("RetrievalSlowdown", svc)],
        "fault_targets": [svc],
        "firing": [
            _firing("E2eLatencyDeviation", svc, 4.0),
            _firing("DecodeSpeedDrop", svc, 7.0),
            _firing("DecodeSpeedDrop", other, 9.0),
        ],
        "envelopes": 3,
        "wall_s": 0.1,
        "cpu_s": 0.1,
    }
    r = quality.score(run)
    drop, retrieval = r["expected"]
    assert (drop["pending_min"], drop["eval_min"], drop["fired_min"]) == (5.0, 6.0, 7.0)
    assert (drop["met"], drop["met_by_eval"], drop["hint"]) == (False, True, "h")
    assert retrieval["fired_min"] is None and retrieval["met"] is False
    assert [(u["rule"], u["on_fault_target"]) for u in r["unexpected"]] == [
        ("E2eLatencyDeviation", True),
        ("DecodeSpeedDrop", False),
    ]
