"""The request simulator: deterministic, valid on the wire, and faulting only as told."""

from __future__ import annotations

import math
import statistics
from itertools import islice
from typing import Any

import pytest

from ragwatch import codec
from ragwatch.agents.sim_requests import (
    SCENARIOS,
    FaultTarget,
    RequestSimConfig,
    RequestSimulator,
)
from ragwatch.schema import RequestRecord, RequestsEnvelope

T0 = 1_767_225_600.0
FAULT = 3600.0
HOUR_TICKS = 360  # batch_s = 10

Stream = dict[str, list[RequestRecord]]


def run(n: int, **kw: Any) -> list[tuple[float, list[RequestsEnvelope]]]:
    return list(islice(RequestSimulator(RequestSimConfig(**kw)).ticks(), n))


def by_instance(n: int, **kw: Any) -> Stream:
    out: Stream = {}
    for _, envs in run(n, **kw):
        for env in envs:
            out.setdefault(env.instance, []).extend(env.records)
    return out


def split(records: list[RequestRecord], at: float = T0 + FAULT) -> tuple[list[RequestRecord], ...]:
    return [r for r in records if r.ts < at], [r for r in records if r.ts >= at]


def quantile(xs: list[float], p: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(p * len(xs)))]


def tokens_per_request(records: list[RequestRecord]) -> float:
    return statistics.fmean(r.output_tokens for r in records)


def retriever_p99(records: list[RequestRecord]) -> float:
    return quantile([r.stages["retriever"] for r in records], 0.99)


def is_outlier(r: RequestRecord) -> bool:
    return abs(r.context_tokens - 12000) < 500 and abs(r.output_tokens - 20) < 15


FAULTY = dict(services=1, instances=2, fault_start_s=FAULT, start_ts=T0)
TARGET = "rag-api-1"


@pytest.fixture(scope="module")
def healthy() -> Stream:
    return by_instance(3 * HOUR_TICKS, **FAULTY)


# ------------------------------------------------------------ wire and determinism


def test_same_seed_same_stream_other_seed_differs() -> None:
    a, b = run(30, seed=3), run(30, seed=3)
    assert a == b
    assert run(30, seed=4) != a


def test_envelopes_round_trip_and_records_lie_in_their_batch() -> None:
    ticks = run(60, scenario="all", fault_start_s=300.0, oom_after_h=0.1, start_ts=T0)
    assert [ts for ts, _ in ticks[:2]] == [T0 + 10, T0 + 20]
    for ts, envs in ticks:
        assert [(e.service, e.instance) for e in envs] == [
            ("rag-api", "rag-api-0"),
            ("rag-api", "rag-api-1"),
            ("rag-search", "rag-search-0"),
            ("rag-search", "rag-search-1"),
        ]
        for env in envs:
            assert codec.decode(codec.encode(env)) == env
            assert all(ts - 10 <= r.ts < ts for r in env.records)
            assert [r.ts for r in env.records] == sorted(r.ts for r in env.records)


def test_records_add_up() -> None:
    for r in by_instance(60)["rag-api-0"]:
        assert r.queue_ms is not None
        assert r.e2e_ms == pytest.approx(sum(r.stages.values()) + r.queue_ms, abs=0.3)
        assert set(r.stages) == {"retriever", "reranker", "llm"}
        assert r.ttft_ms is None or r.queue_ms <= r.ttft_ms <= r.e2e_ms + 0.3


def test_fault_target() -> None:
    assert RequestSimulator(RequestSimConfig()).fault_target is None
    sim = RequestSimulator(RequestSimConfig(scenario="leak", fault_service=1, fault_instance=0))
    assert sim.fault_target == FaultTarget("rag-search", "rag-search-0", "leak")


# ------------------------------------------------------------ healthy


def test_healthy_day() -> None:
    ticks = run(8640, services=1, instances=1, sample_rate=0.05, start_ts=T0)
    records = [r for _, envs in ticks for r in envs[0].records]
    assert statistics.median(r.e2e_ms for r in records) == pytest.approx(800, rel=0.05)
    assert tokens_per_request(records) == pytest.approx(250, rel=0.03)
    assert sum(r.status == "error" for r in records) / len(records) < 0.01
    assert retriever_p99(records) == pytest.approx(112, rel=0.1)
    assert len(records) / 86400 == pytest.approx(20 * 0.05, rel=0.05)  # mean qps, sampled
    per_hour = [
        sum(len(e[1][0].records) for e in ticks[h * 360 : (h + 1) * 360]) for h in range(24)
    ]
    assert per_hour.index(max(per_hour)) in range(13, 18)  # afternoon peak
    assert per_hour.index(min(per_hour)) in range(1, 6)  # night trough
    assert not any(is_outlier(r) for r in records)


def test_healthy_deploy_step_and_model_reload() -> None:
    kw = dict(services=1, instances=1, start_ts=T0, sample_rate=1.0)
    base = by_instance(30, deploy_at_s=None, reload_at_s=None, **kw)["rag-api-0"]
    events = by_instance(30, deploy_at_s=0.0, reload_at_s=100.0, **kw)["rag-api-0"]
    for a, b in zip(base, events, strict=True):
        factor = b.stages["reranker"] / a.stages["reranker"]
        assert factor == pytest.approx(1.05, abs=0.01)
        llm = b.stages["llm"] / a.stages["llm"]
        in_reload = 100 <= math.floor((a.ts - T0) / 10) * 10 < 220
        assert llm == pytest.approx(1.05 * (1.5 if in_reload else 1.0), abs=0.01)


# ------------------------------------------------------------ faults


def assert_untouched(healthy: Stream, faulty: Stream) -> None:
    """Other instances match healthy everywhere, the target does before the fault."""
    assert faulty["rag-api-0"] == healthy["rag-api-0"]
    assert split(faulty[TARGET])[0] == split(healthy[TARGET])[0]


def test_throughput_fault(healthy: Stream) -> None:
    faulty = by_instance(3 * HOUR_TICKS, scenario="throughput", **FAULTY)
    assert_untouched(healthy, faulty)
    pre, post = split(faulty[TARGET])
    assert tokens_per_request(post) / tokens_per_request(pre) == pytest.approx(0.64, abs=0.05)
    assert len(post) / 7200 / (len(split(healthy[TARGET])[1]) / 7200) == pytest.approx(
        0.63, abs=0.05
    )
    p95 = [quantile([r.e2e_ms for r in xs], 0.95) for xs in (pre, post)]
    assert p95[1] / p95[0] > 1.35


def test_retrieval_fault(healthy: Stream) -> None:
    faulty = by_instance(3 * HOUR_TICKS, scenario="retrieval", **FAULTY)
    assert_untouched(healthy, faulty)
    pre, post = split(faulty[TARGET])
    assert retriever_p99(pre) == pytest.approx(112, rel=0.15)
    assert retriever_p99(post) == pytest.approx(489, rel=0.15)
    # only the retriever changed: same requests, same tokens
    h_post = split(healthy[TARGET])[1]
    assert [(r.ts, r.output_tokens) for r in post] == [(r.ts, r.output_tokens) for r in h_post]


def test_outlier_fault(healthy: Stream) -> None:
    faulty = by_instance(3 * HOUR_TICKS, scenario="outliers", **FAULTY)
    assert_untouched(healthy, faulty)
    pre, post = split(faulty[TARGET])
    outliers = [r for r in post if is_outlier(r)]
    assert not any(is_outlier(r) for r in pre)
    assert 1 <= len(outliers) / 120 <= 5  # a few per minute
    assert [r for r in post if not is_outlier(r)] == split(healthy[TARGET])[1]
    ctx = [r.context_tokens for r in outliers]
    assert statistics.pstdev(ctx) < 128  # a dense cluster at DBSCAN's eps


def test_leak_slows_tokens_per_second(healthy: Stream) -> None:
    faulty = by_instance(3 * HOUR_TICKS, scenario="leak", **FAULTY)
    assert_untouched(healthy, faulty)

    def tokens(stream: Stream, lo: float) -> int:
        return sum(r.output_tokens for r in stream[TARGET] if lo <= r.ts - T0 < lo + 1800)

    ratio = tokens(faulty, FAULT + 5400) / tokens(healthy, FAULT + 5400)
    assert ratio == pytest.approx(0.99 ** (6300 / 600), abs=0.05)
    pre, post = split(faulty[TARGET])
    assert tokens_per_request(post) == pytest.approx(tokens_per_request(pre), rel=0.03)


def test_oom_error_burst(healthy: Stream) -> None:
    faulty = by_instance(3 * HOUR_TICKS, scenario="oom", oom_after_h=1.0, **FAULTY)
    assert_untouched(healthy, faulty)
    oom = T0 + FAULT + 3600

    def error_ratio(lo: float, hi: float) -> float:
        xs = [r for r in faulty[TARGET] if lo <= r.ts < hi]
        return sum(r.status == "error" for r in xs) / len(xs)

    assert error_ratio(T0, oom) < 0.02
    assert error_ratio(oom, oom + 90) > 0.6
    assert error_ratio(oom + 90, oom + 3600) < 0.02


def test_all_combines_the_faults(healthy: Stream) -> None:
    faulty = by_instance(3 * HOUR_TICKS, scenario="all", **FAULTY)
    assert_untouched(healthy, faulty)
    pre, post = split(faulty[TARGET])
    regular = [r for r in post if not is_outlier(r)]
    assert tokens_per_request(regular) / tokens_per_request(pre) == pytest.approx(0.64, abs=0.05)
    assert retriever_p99(regular) == pytest.approx(489, rel=0.15)
    assert any(is_outlier(r) for r in post)


# ------------------------------------------------------------ config


@pytest.mark.parametrize(
    "change",
    [
        dict(services=0),
        dict(instances=0),
        dict(scenario="nope"),
        dict(batch_s=0.0),
        dict(batch_s=math.inf),
        dict(base_qps=-1.0),
        dict(sample_rate=0.0),
        dict(sample_rate=1.5),
        dict(error_rate=1.0),
        dict(fault_start_s=math.nan),
        dict(start_ts=-1.0),
        dict(fault_service=2),
        dict(fault_instance=2),
        dict(fault_instance=-3),
        dict(oom_after_h=0.0),
        dict(outliers_per_min=-1.0),
        dict(deploy_at_s=-5.0),
    ],
)
def test_config_validation(change: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        RequestSimConfig(**change)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_scenario_runs(scenario: str) -> None:
    sim = RequestSimulator(RequestSimConfig(scenario=scenario, fault_start_s=0.0))
    assert (sim.fault_target is None) == (scenario == "healthy")
    assert sum(len(e.records) for _, envs in islice(sim.ticks(), 6) for e in envs) > 0
