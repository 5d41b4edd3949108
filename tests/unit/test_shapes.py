"""The independent scenarios (bench/shape_kit.py, bench/shape_traffic.py), in ``make test``.

First the harness's scoring on hand-made transitions and the traffic model's own shape
(cheap: no pipelines); then the acceptance of issue 30 on the shapes cheap enough here,
shortened where acceptance keeps its meaning (26 h of history before a fault, the real
trace for 26 h). ``python bench/shapes.py`` plays them all at full length.
"""

from __future__ import annotations

import doctest
import os
import sys
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
# bench modules import each other by name (shape_kit); at the end of the path, so that
# bench/requests.py and its kin never stand in for an installed package of the same name
sys.path.append(str(BENCH))

import shape_kit as kit  # noqa: E402
import shape_traffic as traffic  # noqa: E402
import shapes as runner  # noqa: E402

from ragwatch.schema import Alert, RequestsEnvelope, Transition  # noqa: E402

HOUR, MINUTE, T0 = kit.HOUR, kit.MINUTE, kit.MONDAY
API0 = {"service": "rag-api", "instance": "rag-api-0"}


def _t(rule: str, status: str, at: float, severity: str = "warning", **labels: str) -> Transition:
    alert = Alert(
        rule=rule, severity=severity, status=status,  # type: ignore[arg-type]
        labels={**API0, **labels}, annotations={}, value=0.0, expected=None,
        starts_at=at, ends_at=None, fingerprint=f"{rule}{sorted(labels.items())}", at=at,
    )  # fmt: skip
    return Transition(alert, "pending" if status == "firing" else "firing")


FAULT = kit.Expect("errors", ("ErrorRateHigh",), API0, T0, T0 + HOUR, 10 * MINUTE,
                   resolve_within_s=HOUR)  # fmt: skip


def test_the_kits_example_runs() -> None:
    assert doctest.testmod(kit).failed == 0


def test_a_fault_owns_the_firings_of_its_rules_on_its_target() -> None:
    faults, false, info = kit.score(
        (FAULT,),
        [
            _t("ErrorRateHigh", "firing", T0 + 4 * MINUTE),
            _t("ErrorRateHigh", "resolved", T0 + 70 * MINUTE),
            _t("E2eLatencyDeviation", "firing", T0 + 5 * MINUTE),  # another rule: a second page
            _t("ErrorRateHigh", "firing", T0 + 9 * MINUTE, instance="rag-api-1"),  # another target
            _t("RequestOutlierCluster", "firing", T0 + 3 * HOUR, severity="info"),
        ],
    )
    (f,) = faults
    assert (f.pages, f.delay_s, f.resolved_after_s, f.resolved_during) == (1, 240.0, 600.0, 0)
    assert f.ok
    assert [(p.rule, p.near) for p in false] == [
        ("E2eLatencyDeviation", "errors"),
        ("ErrorRateHigh", None),
    ]
    assert [i.rule for i in info] == ["RequestOutlierCluster"]


def test_a_fault_fails_when_late_paged_twice_or_never_resolved() -> None:
    (f,), _, _ = kit.score(
        (FAULT,),
        [
            _t("ErrorRateHigh", "firing", T0 + 12 * MINUTE),
            _t("ErrorRateHigh", "resolved", T0 + 20 * MINUTE),
            _t("ErrorRateHigh", "firing", T0 + 30 * MINUTE),
        ],
    )
    assert (f.pages, f.resolved_during) == (2, 1)
    assert f.failures == ("ErrorRateHigh: 2 pages > 1", "late: 12.0 min > 10 min", "not resolved")
    (missed,), _, _ = kit.score((FAULT,), [])
    assert missed.failures == ("missed",)


def _records(envs: list[Any], instance: str, t0: float, t1: float) -> list[Any]:
    return [
        r
        for e in envs
        if isinstance(e, RequestsEnvelope) and e.instance == instance and t0 <= e.ts < t1
        for r in e.records
    ]


def test_envelopes_come_in_event_time_order_with_heartbeats() -> None:
    envs = list(traffic.night_fault(short=True).make())
    ts = [getattr(e, "ts", 0.0) for e in envs]
    assert ts == sorted(ts)
    mine = [e for e in envs if isinstance(e, RequestsEnvelope) and e.instance == "rag-api-1"]
    assert all(b.ts - a.ts == MINUTE for a, b in pairwise(mine))
    assert any(not e.records for e in mine)  # quiet night minutes: heartbeats


def test_weekends_and_holidays_lower_demand_by_their_factor() -> None:
    r = traffic.Rhythm(daily_ratio=4.0, peak_hour=14.0, weekend=0.45, holidays=(T0 + 2 * kit.DAY,))
    monday, wednesday, saturday = (T0 + d * kit.DAY + 14 * HOUR for d in (0, 2, 5))
    assert r.level(monday) == pytest.approx(1.0)
    assert r.level(saturday) == pytest.approx(0.45)
    assert r.level(wednesday) == pytest.approx(0.5)
    assert r.level(T0 + 2 * HOUR) == pytest.approx(0.25)  # the trough, 12 h from the peak


def test_the_real_trace_keeps_its_request_shapes() -> None:
    _, ctx, out = traffic.trace()
    recs = _records(list(traffic.real_trace(hours=4.0).make()), "code-assist-0", 0.0, float("inf"))
    got_ctx = np.median([r.context_tokens for r in recs])
    got_out = np.median([r.output_tokens for r in recs])
    assert len(recs) > 500
    assert got_ctx == pytest.approx(np.median(ctx), rel=0.15)
    assert got_out == pytest.approx(np.median(out), rel=0.15)


def test_the_seed_incident_has_the_seed_magnitudes() -> None:
    """The faulty instance against its healthy peer over the same two hours."""
    shape = traffic.seed_incident(short=True)
    start, envs = shape.faults[0].start_ts, list(shape.make())
    sick = _records(envs, "rag-api-0", start + 5 * MINUTE, start + 2 * HOUR)
    peer = _records(envs, "rag-api-1", start + 5 * MINUTE, start + 2 * HOUR)

    def decode_tps(rs: list[Any]) -> float:
        # tokens after the first over the time after it, as the product reads them
        return float(np.median([(r.output_tokens - 1) / (r.e2e_ms - r.ttft_ms) * 1e3 for r in rs
                                if r.ttft_ms is not None and r.output_tokens > 1]))  # fmt: skip

    def p95(rs: list[Any]) -> float:
        return float(np.percentile([r.e2e_ms for r in rs], 95))

    def tokens(rs: list[Any]) -> float:
        return float(np.mean([r.output_tokens for r in rs]))

    assert len(sick) / len(peer) == pytest.approx(0.63, abs=0.05)
    assert tokens(sick) / tokens(peer) == pytest.approx(0.64, abs=0.05)
    assert decode_tps(sick) / decode_tps(peer) == pytest.approx(0.64, abs=0.05)
    assert p95(sick) / p95(peer) == pytest.approx(1340 / 820, abs=0.2)


# ---------------------------------------------------------------------- acceptance

CHEAP = {
    s.name: s
    for s in (
        traffic.night_fault(short=True),
        traffic.retriever_stalls(days=1.0),
        traffic.real_trace(hours=26.0),
        traffic.real_trace_decode(hours=19.5),
        traffic.error_burst(short=True),
        traffic.queue_growth(short=True),
        traffic.retrieval_gradual(short=True),
        traffic.seed_incident(short=True),
    )
}


@pytest.fixture(scope="module")
def outcomes() -> dict[str, dict[str, Any]]:
    # ~75 s of CPU in all: in parallel, ~40 s on two free cores
    rows = runner.run(CHEAP, traffic.INFO_FREE_AFTER, jobs=min(4, max(2, os.cpu_count() or 2)))
    return {r["shape"]: r for r in rows}


# Acceptance missed and reported (issue 30's note, docs/performance.md): held here to what
# the code does, so it does not get worse unnoticed, until it is met. (night-fault was
# here, resolved 77 minutes after its end; it is met since retriever_tail_recovered.)
MISSED: dict[str, tuple[str, str, float]] = {}


@pytest.mark.parametrize("name", list(CHEAP))
def test_acceptance(outcomes: dict[str, dict[str, Any]], name: str) -> None:
    r = outcomes[name]
    if name in MISSED:
        kind, field, most = MISSED[name]
        (fault,) = (f for f in r["faults"] if f["kind"] == kind)
        assert fault["pages"] == 1 and fault[field] is not None and fault[field] <= most, fault
        assert r["false_pages"] == 0 and len(r["failures"]) == 1, r["failures"]
        return
    assert r["ok"], (r["failures"], r["faults"], r["false_page_list"])
