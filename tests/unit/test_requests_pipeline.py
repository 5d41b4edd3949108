"""The request pipeline: envelopes of request records in, per-service signals and alerts out.

Envelopes are built here by a small seeded generator (one record per request, batched
every few seconds per instance), and fed through :meth:`RequestPipeline.process` only.
Rules are built as :class:`Rule` objects because the ``service`` series is registered in
``streams/alerting/rules.py`` separately.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragwatch.detectors.request_outliers import RequestOutliers
from ragwatch.schema import RequestRecord, RequestsEnvelope, Transition
from ragwatch.streams.alerting.rules import Condition, Rule
from ragwatch.streams.pipelines.requests import MAX_SCORED_PER_ENVELOPE, Bucket, RequestPipeline
from tests.reference.evidence import baseline_of, ring_of

T0 = 1_699_999_980.0  # a multiple of 60: bucket boundaries at T0 + k * 60
MIN = 60.0


def rule(name: str, signal: str, op: str, threshold: float, for_s: float = 0.0) -> Rule:
    return Rule(name, "service", (Condition(signal, op, threshold),), for_s=for_s)


def rec(
    ts: float, e2e: float = 100.0, ctx: int = 3000, out: int = 250, **kw: object
) -> RequestRecord:
    return RequestRecord(
        ts=ts,
        status=kw.get("status", "ok"),  # type: ignore[arg-type]
        e2e_ms=e2e,
        context_tokens=ctx,
        output_tokens=out,
        stages=kw.get("stages", {}),  # type: ignore[arg-type]
        queue_ms=kw.get("queue_ms"),  # type: ignore[arg-type]
        ttft_ms=kw.get("ttft_ms"),  # type: ignore[arg-type]
    )


def env(
    records: list[RequestRecord],
    service: str = "rag",
    instance: str = "a",
    ts: float | None = None,
    pid: int | None = None,
) -> RequestsEnvelope:
    """An envelope sent at ``ts`` (default: its newest record's time)."""
    sent = max(r.ts for r in records) if ts is None else ts
    return RequestsEnvelope(service, instance, sent, tuple(records), pid=pid)


@dataclass
class Traffic:
    """Healthy RAG traffic; the fields are the knobs an incident turns."""

    rng: random.Random
    output_scale: float = 1.0
    retriever_ms: float = 100.0

    def record(self, ts: float) -> RequestRecord:
        g = self.rng.gauss
        retriever = max(1.0, g(self.retriever_ms, 4.0))
        reranker, llm = max(1.0, g(30.0, 3.0)), max(1.0, g(600.0, 60.0))
        return RequestRecord(
            ts=ts,
            status="error" if self.rng.random() < 0.002 else "ok",
            e2e_ms=retriever + reranker + llm + 20.0,
            context_tokens=max(1, round(g(3000, 200))),
            output_tokens=max(1, round(g(250, 40) * self.output_scale)),
            stages={"retriever": retriever, "reranker": reranker, "llm": llm},
            queue_ms=max(0.0, g(10.0, 2.0)),
            ttft_ms=max(1.0, g(200.0, 20.0)),
        )


def play(
    pipe: RequestPipeline,
    start: float,
    seconds: float,
    traffic: Traffic | Callable[[float], Traffic],
    *,
    rps: int = 3,
    instances: tuple[tuple[str, str], ...] = (("rag", "a"),),
    batch_s: float = 5.0,
) -> list[Transition]:
    """``seconds`` of traffic from ``start``, ``rps`` requests a second per instance."""
    out: list[Transition] = []
    t = start
    while t < start + seconds:
        tr = traffic(t) if callable(traffic) else traffic
        for service, instance in instances:
            ts = [t + tr.rng.random() * batch_s for _ in range(int(rps * batch_s))]
            out += pipe.process(env([tr.record(x) for x in sorted(ts)], service, instance))
        t += batch_s
    return out


def signals(pipe: RequestPipeline, service: str = "rag", instance: str = "a") -> dict[str, object]:
    snap = pipe.service_snapshot(service)
    (inst,) = [i for i in snap["instances"] if i["instance"] == instance]
    return dict(inst)


# ---------------------------------------------------------------- one bucket, exactly


def test_quantiles_and_rates_are_exact_on_a_hand_made_bucket() -> None:
    pipe = RequestPipeline([])
    records = [
        rec(
            T0 + i * 0.5,
            e2e=float(i),
            ctx=1000 + i,
            out=200,
            status="error" if i % 10 == 0 else "ok",
            stages={"retriever": 0.2 * i, "llm": 0.5 * i},
            queue_ms=float(i) if i <= 50 else None,
            ttft_ms=float(i),
        )
        for i in range(1, 101)
    ]
    assert pipe.process(env(records)) == []
    assert signals(pipe)["bucket_end"] is None  # not closed: within grace
    pipe.process(env([rec(T0 + MIN + 30.0)]))  # watermark reaches end + grace
    got = signals(pipe)
    assert got["bucket_end"] == T0 + MIN
    sig = got["signals"]
    assert isinstance(sig, dict)
    assert sig["rps"] == pytest.approx(100 / 60)
    assert sig["errors_ratio"] == pytest.approx(0.1)
    assert sig["output_tokens_per_s"] == pytest.approx(20_000 / 60)
    assert sig["tokens_per_request"] == pytest.approx(200.0)
    assert sig["context_tokens_per_request"] == pytest.approx(1050.5)
    # linear between closest ranks over 1..100
    assert sig["e2e_p50_ms"] == pytest.approx(50.5)
    assert sig["e2e_p95_ms"] == pytest.approx(95.05)
    assert sig["e2e_p99_ms"] == pytest.approx(99.01)
    assert sig["retriever_p99_ms"] == pytest.approx(0.2 * 99.01)
    assert sig["llm_p50_ms"] == pytest.approx(0.5 * 50.5)
    assert sig["retriever_share"] == pytest.approx(0.2)
    assert sig["llm_share"] == pytest.approx(0.5)
    assert sig["reranker_share"] is None and sig["reranker_p95_ms"] is None
    assert sig["ttft_p95_ms"] == pytest.approx(95.05)
    assert sig["queue_p95_ms"] == pytest.approx(1 + 0.95 * 49)
    # detectors are warming up: no baselines yet, but every signal is a float or None
    assert sig["tpr_deviation"] is None and sig["retriever_p99_ratio"] is None
    assert all(v is None or isinstance(v, float) for v in sig.values())
    assert got["outlier_label"] is None


def tail_run(per_bucket: int, slow_bucket: int, buckets: int) -> list[float | None]:
    """P99 after each bucket close: 10 requests of one bucket take a second."""
    pipe = RequestPipeline([], grace_s=0.0)  # bucket b closes in b + 1
    seen = []
    for b in range(buckets):

        def e2e(i: int, b: int = b) -> float:
            return 1000.0 if b == slow_bucket and i < 10 else 100.0

        step = MIN / per_bucket
        pipe.process(env([rec(T0 + b * MIN + i * step, e2e=e2e(i)) for i in range(per_bucket)]))
        if b:
            sig = signals(pipe)["signals"]
            assert isinstance(sig, dict)
            seen.append(sig["e2e_p99_ms"])  # type: ignore[arg-type]
    return seen


def test_tail_quantiles_span_the_last_200_requests_or_2_minutes_whichever_holds_more() -> None:
    # 100 requests a minute: the window is the last 2 minutes (200 requests)
    assert tail_run(100, 1, 6) == [100.0, 1000.0, 1000.0, 100.0, 100.0]
    # 20 a minute: the last 200 requests are 10 minutes; the slow ones stay for 10 buckets
    quiet = tail_run(20, 1, 16)
    assert quiet[:4] == [None] * 4  # a P99 of fewer than 100 requests is unknown
    assert quiet[4:11] == [1000.0] * 7 and quiet[11:] == [100.0] * 4


def test_a_quantile_of_too_few_requests_is_unknown() -> None:
    pipe = RequestPipeline([])
    pipe.process(env([rec(T0 + i, e2e=100.0 + i) for i in range(30)]))
    pipe.process(env([rec(T0 + MIN + 30.0)]))  # closes bucket 0
    sig = signals(pipe)["signals"]
    assert isinstance(sig, dict)
    assert sig["e2e_p50_ms"] == pytest.approx(114.5)  # 30 values: enough for a P50
    assert sig["e2e_p95_ms"] is None and sig["e2e_p99_ms"] is None  # not for the tails


# ---------------------------------------------------------------- event time


def test_out_of_order_within_grace_counts_in_its_bucket_and_beyond_grace_is_dropped() -> None:
    pipe = RequestPipeline([], grace_s=120.0)
    pipe.process(env([rec(T0 + 1.0), rec(T0 + 2.0)]))  # bucket 0
    pipe.process(env([rec(T0 + 100.0)]))  # bucket 1, watermark 100
    pipe.process(env([rec(T0 + 30.0), rec(T0 + 70.0)], ts=T0 + 101.0))  # late, within grace
    assert pipe.stats.late_dropped == 0
    pipe.process(env([rec(T0 + 200.0)]))  # closes bucket 0 (60 + 120 <= 200)
    assert signals(pipe)["bucket_end"] == T0 + MIN
    assert signals(pipe)["signals"]["requests_total"] == 3.0  # type: ignore[index]
    pipe.process(env([rec(T0 + 10.0), rec(T0 + 59.9)], ts=T0 + 201.0))  # its bucket closed
    assert pipe.stats.late_dropped == 2
    pipe.process(env([rec(T0 + 300.0)]))  # closes buckets 1 and 2 (3 is within grace)
    pipe.process(env([rec(T0 + 250.0)], ts=T0 + 300.0))  # sent again: a duplicate
    assert pipe.stats.duplicates == 1
    assert signals(pipe)["bucket_end"] == T0 + 3 * MIN  # a minute without requests closes
    assert signals(pipe)["signals"]["requests_total"] == 5.0  # type: ignore[index]
    assert pipe.stats.buckets_closed == 3
    assert pipe.stats.records == 10


def test_a_silent_instance_is_forgotten_and_its_alerts_resolve() -> None:
    pipe = RequestPipeline([rule("Busy", "rps", ">", 0.0)], stale_s=600.0)
    rng = random.Random(1)
    both = (("rag", "a"), ("rag", "b"))
    fired = play(pipe, T0, 5 * MIN, Traffic(rng), rps=1, instances=both)
    assert {t.alert.labels["instance"] for t in fired if t.alert.status == "firing"} == {"a", "b"}
    later = play(pipe, T0 + 5 * MIN, 12 * MIN, Traffic(rng), rps=1, instances=(("rag", "b"),))
    resolved = [t for t in later if t.alert.status == "resolved"]
    assert [t.alert.labels["instance"] for t in resolved] == ["a"]
    assert resolved[0].notify and pipe.stats.evicted_series == 1
    assert resolved[0].alert.resolution == "gone"
    assert [i["instance"] for i in pipe.service_snapshot("rag")["instances"]] == ["b"]


# ---------------------------------------------------------------- detectors


def test_a_36_percent_tokens_per_request_drop_fires_after_five_minutes() -> None:
    pipe = RequestPipeline([rule("TokensPerRequestDrop", "tpr_deviation", "<", -0.25, 300.0)])
    traffic = Traffic(random.Random(2))
    warm = 30 * MIN
    assert play(pipe, T0, warm, traffic, rps=5) == []
    assert signals(pipe)["signals"]["tpr_deviation"] == pytest.approx(0.0, abs=0.05)  # type: ignore[index]
    traffic.output_scale = 0.64
    out = play(pipe, T0 + warm, 10 * MIN, traffic, rps=5)
    firing = [t for t in out if t.alert.status == "firing"]
    assert len(firing) == 1 and firing[0].previous == "pending"
    alert = firing[0].alert
    assert alert.starts_at == T0 + warm + MIN  # the first bucket of the drop
    assert alert.ends_at is None and alert.labels["service"] == "rag"
    assert -0.40 < alert.value < -0.25
    sig = signals(pipe)["signals"]
    assert isinstance(sig, dict)
    assert sig["tps_deviation"] is not None and sig["tps_deviation"] < -0.25
    assert sig["tpr_score"] is not None and sig["tpr_score"] > 0.5


def test_first_drop_bucket_deviates_by_36_percent() -> None:
    pipe = RequestPipeline([], grace_s=120.0)
    traffic = Traffic(random.Random(3))
    play(pipe, T0, 30 * MIN, traffic, rps=5)
    traffic.output_scale = 0.64
    play(pipe, T0 + 30 * MIN, 3 * MIN + 5.0, traffic, rps=5)  # closes the first drop bucket
    got = signals(pipe)
    assert got["bucket_end"] == T0 + 31 * MIN
    assert got["signals"]["tpr_deviation"] == pytest.approx(-0.36, abs=0.03)  # type: ignore[index]
    assert got["signals"]["tpr_forecast"] == pytest.approx(250.0, rel=0.03)  # type: ignore[index]


def test_retriever_p99_from_112_to_489_ms_is_seen_within_two_buckets() -> None:
    change = T0 + 20 * MIN
    pipe = RequestPipeline([rule("RetrieverSlow", "retriever_p99_ratio", ">", 3.0)])
    traffic = Traffic(random.Random(4))
    assert play(pipe, T0, 20 * MIN, traffic) == []
    assert signals(pipe)["signals"]["retriever_p99_ms"] == pytest.approx(110.0, abs=6.0)  # type: ignore[index]
    traffic.retriever_ms = 478.0
    out = play(pipe, change, 5 * MIN, traffic)
    firing = [t for t in out if t.alert.status == "firing"]
    assert len(firing) == 1
    assert firing[0].alert.starts_at <= change + 2 * MIN
    assert firing[0].alert.value > 3.0


def test_sustained_faults_stay_firing_until_they_end() -> None:
    """Two hours of slow retrieval and fewer tokens per request: the baselines hold, so the
    alerts fire once, stay firing for the whole fault and resolve soon after it ends."""
    pipe = RequestPipeline(
        [
            rule("RetrieverSlow", "retriever_p99_ratio", ">", 3.0),
            rule("TokensPerRequestDrop", "tpr_deviation", "<", -0.25),
        ]
    )
    traffic = Traffic(random.Random(9))
    assert play(pipe, T0, 30 * MIN, traffic, batch_s=10.0) == []
    traffic.retriever_ms, traffic.output_scale = 478.0, 0.64
    during = play(pipe, T0 + 30 * MIN, 120 * MIN, traffic, batch_s=10.0)
    fired = sorted(t.alert.rule for t in during if t.alert.status == "firing")
    assert fired == ["RetrieverSlow", "TokensPerRequestDrop"]
    assert [t for t in during if t.alert.status == "resolved"] == []
    traffic.retriever_ms, traffic.output_scale = 100.0, 1.0
    after = play(pipe, T0 + 150 * MIN, 10 * MIN, traffic, batch_s=10.0)
    resolved = sorted(t.alert.rule for t in after if t.alert.status == "resolved")
    assert resolved == ["RetrieverSlow", "TokensPerRequestDrop"]
    assert max(t.alert.ends_at or 0.0 for t in after) <= T0 + 155 * MIN


def test_long_context_short_output_requests_are_outliers_and_a_new_cluster() -> None:
    pipe = RequestPipeline([rule("NewCluster", "new_outlier_cluster", ">=", 1.0)], grace_s=120.0)
    traffic = Traffic(random.Random(5))
    assert play(pipe, T0, 10 * MIN, traffic) == []
    odd = [rec(T0 + 10 * MIN + 1 + 0.1 * i, ctx=12000 + i, out=20) for i in range(3)]
    out = pipe.process(env(odd))
    out += play(pipe, T0 + 10 * MIN + 5, 3 * MIN, traffic)
    got = signals(pipe)
    sig = got["signals"]
    assert isinstance(sig, dict)
    assert got["bucket_end"] == T0 + 11 * MIN
    assert sig["outliers"] == 3.0
    assert sig["outlier_ratio"] == pytest.approx(3 / 168)  # 11 batches of 15, and 3
    assert got["outlier_label"] == "long context, short output"
    assert out == []  # three points are not a cluster yet
    rng = random.Random(6)
    burst = [
        rec(T0 + 14 * MIN + 1 + i, ctx=12000 + rng.randrange(40), out=20 + rng.randrange(5))
        for i in range(30)
    ]
    out = pipe.process(env(burst))
    out += play(pipe, T0 + 14 * MIN + 30, 5 * MIN, traffic)
    # Raised at the first bucket close after the cluster formed (up to grace_s earlier
    # than the burst's own bucket: the detector learns records on arrival), then cleared.
    assert [t.alert.status for t in out] == ["firing", "resolved"]
    assert T0 + 12 * MIN <= out[0].alert.starts_at <= T0 + 15 * MIN
    assert out[1].alert.ends_at == out[0].alert.starts_at + MIN


def test_an_outlier_clusters_requests_are_kept_out_of_the_traffic_baselines() -> None:
    """Hours of an outlier cluster that doubles the traffic (a client looping on odd
    requests) page once, for the cluster: the usual traffic's baselines neither hold nor
    learn its requests, so tokens per request do not drop and, once it ends, throughput
    does not either (learnt, its hours would read as a drop on the next day). Nor do its
    latencies count: its 4x contexts take 10x the prefill, no slower service."""
    rules = [
        rule("TokensPerRequestDrop", "tpr_deviation", "<", -0.25, 300.0),
        rule("ThroughputDrop", "tps_deviation", "<", -0.25, 300.0),
        rule("NewCluster", "new_outlier_cluster", ">=", 1.0),
    ]
    pipe = RequestPipeline(rules)
    usual = Traffic(random.Random(8))
    assert play(pipe, T0, 60 * MIN, usual, rps=1) == []
    rng = random.Random(9)
    start, out = T0 + 60 * MIN, []
    for k in range(24 * 60):  # two hours, a batch every 5 s: 5 usual requests, 5 odd ones
        t = start + 5 * k
        batch = [usual.record(t + rng.random() * 5) for _ in range(5)]
        batch += [
            rec(t + rng.random() * 5, 2300.0, 12000 + rng.randrange(40), 20 + rng.randrange(5),
                stages={"llm": 2200.0}, ttft_ms=2000.0, queue_ms=10.0)
            for _ in range(5)
        ]  # fmt: skip
        out += pipe.process(env(sorted(batch, key=lambda r: r.ts)))
        if k == 12 * 60:  # an hour in
            sig = signals(pipe)["signals"]
            assert isinstance(sig, dict)
            assert sig["rps_held_s"] == 0.0 and sig["tpr_held_s"] == 0.0
            assert abs(sig["rps_deviation"]) < 0.2  # type: ignore[arg-type]
            assert sig["clustered_requests"] and sig["clustered_requests"] > 0
            assert sig["rps"] > 1.6  # type: ignore[operator]  # what it served: both
            assert sig["ttft_net_p95_ms"] < 300 and sig["e2e_p95_ms"] < 1000  # type: ignore[operator]
    out += play(pipe, start + 120 * MIN, 60 * MIN, usual, rps=1)
    assert [(t.alert.rule, t.alert.status) for t in out if t.notify][:1] == [
        ("NewCluster", "firing")
    ]
    assert {t.alert.rule for t in out} == {"NewCluster"}


def test_the_outlier_detector_given_is_the_one_each_service_clones() -> None:
    """A fresh detector holds no points, so it is falsy (``__len__``): ``outliers or
    RequestOutliers()`` used to drop the one given for the default."""
    pipe = RequestPipeline([], outliers=RequestOutliers(eps=64.0, window=500))
    pipe.process(env([rec(T0 + i) for i in range(5)]))
    _, shared = pipe.service_state("rag")
    assert (shared.detector.eps, shared.detector.window) == (64.0, 500)


def test_one_envelope_costs_what_its_last_hour_and_its_outlier_budget_cost() -> None:
    """45,000 records a minute apart for a new instance opened (and closed) a bucket each,
    each close scanning the outlier clusters: 38.8 s for one envelope. Records more than
    an hour older than their envelope are dropped and counted, and the outlier detector
    scores at most MAX_SCORED_PER_ENVELOPE of one envelope's records."""
    pipe = RequestPipeline([rule("NewCluster", "new_outlier_cluster", ">=", 1.0)])
    rng = random.Random(3)
    n, sent = 45_000, T0 + 30 * 86400
    month = [rec(sent - 60.0 * (n - i), ctx=rng.randrange(1, 20_000)) for i in range(n)]
    pipe.process(env(month, ts=sent))
    assert pipe.stats.too_old == n - 60 and pipe.stats.buckets_closed <= 61
    burst = [rec(sent + 60 + 0.001 * i, ctx=rng.randrange(1, 20_000)) for i in range(5000)]
    pipe.process(env(burst, ts=sent + 66))
    assert pipe.stats.unscored_records == 5000 - MAX_SCORED_PER_ENVELOPE
    got = signals(pipe)
    assert got["open_buckets"] == 1 and pipe.stats.records == n + 5000


def test_an_envelope_dated_long_before_its_records_costs_only_their_last_hour() -> None:
    """The last hour is counted back from the envelope's newest time, its ``ts`` or a later
    record's: an envelope dated 1970 with a record of 1970 and one of now (the worker's
    clock check reads the newest) would otherwise open a new series 29 million buckets
    back, each to close."""
    pipe = RequestPipeline([])
    pipe.process(env([rec(0.0), rec(T0)], ts=0.0))
    assert pipe.stats.too_old == 1  # the record of 1970
    assert pipe.stats.buckets_closed <= 61
    pipe.process(env([rec(T0 + 120.0)]))
    assert pipe.stats.buckets_closed <= 63


def test_records_sent_after_a_silence_for_its_time_do_not_stay_open() -> None:
    """A sender silent longer than gap_s whose next envelope carries records from within
    the silence: the silence is a gap (unobserved), its buckets are skipped, and the
    buckets those records opened are dropped and counted as late, not kept open for the
    life of the series (300 of them after 300 such envelopes, before)."""
    pipe = RequestPipeline([])
    t = T0
    for _ in range(300):
        t += 900.0
        pipe.process(env([rec(t - 840.0), rec(t - 300.0), rec(t)], pid=1))
    assert signals(pipe)["open_buckets"] <= 2
    assert pipe.stats.late_dropped > 0


# ---------------------------------------------------------------- quiet and bounded


HEALTHY_RULES = [
    rule("TokensPerRequestDrop", "tpr_deviation", "<", -0.25, 300.0),
    rule("ThroughputDrop", "tps_deviation", "<", -0.25, 300.0),
    rule("RetrieverSlow", "retriever_p99_ratio", ">", 3.0, 120.0),
    rule("LatencyHigh", "e2e_p95_ratio", ">", 2.0, 300.0),
    rule("Errors", "errors_ratio", ">", 0.05, 300.0),
    rule("Outliers", "outlier_ratio", ">", 0.05, 300.0),
    rule("NewCluster", "new_outlier_cluster", ">=", 1.0),
]


def test_a_healthy_stream_produces_no_transitions() -> None:
    pipe = RequestPipeline(HEALTHY_RULES)
    instances = (("rag", "a"), ("rag", "b"), ("search", "a"))
    out = play(pipe, T0, 60 * MIN, Traffic(random.Random(7)), rps=2, instances=instances)
    assert out == []
    assert pipe.engine.active == {}
    for service, inst in instances:
        sig = signals(pipe, service, inst)["signals"]
        assert isinstance(sig, dict)
        assert sig["tpr_deviation"] is not None and sig["retriever_p99_ratio"] is not None
    assert pipe.stats.late_dropped == 0 and pipe.stats.dropped_records == 0


def test_memory_is_bounded() -> None:
    pipe = RequestPipeline(
        [], max_series=3, reservoir=50, tail_requests=100, min_baseline=2, stale_s=1e9
    )
    instances = tuple(("rag", f"i{k}") for k in range(5))
    play(pipe, T0, 100 * MIN, Traffic(random.Random(8)), rps=4, instances=instances, batch_s=10)
    assert len(pipe.series) == 3
    assert pipe.stats.dropped_records == 2 * 100 * 60 * 4
    rows = pipe.rows
    for s in pipe.series.values():
        assert len(s.buckets) <= 30 / 60 + 2
        ring = ring_of(rows.counts, s.row)
        assert len(ring) == ring.capacity == 90  # rate_max_s of buckets
        # the tail window: 2 minutes of 50 sampled values a bucket (>= 100 requests)
        tail = rows.tails[s.row]
        assert len(tail.values("e2e", s.bucket_end or 0.0)) == 100
        assert all(len(v) <= 2 * 100 + 256 for v in tail._vals.values())
        latency = baseline_of(rows.latency, 2 * s.row).model
        assert latency is not None and latency.late == 0
        assert all(len(r.values) <= 50 for b in s.buckets.values() for r in b.latencies.values())
        assert rows.traffic.export(2 * s.row).late == rows.traffic.export(2 * s.row + 1).late == 0
    sig = signals(pipe, "rag", "i0")["signals"]
    assert isinstance(sig, dict)
    assert sig["e2e_p50_ms"] == pytest.approx(750.0, rel=0.05)  # from 100 of 480 values
    assert sig["retriever_p99_ratio"] == pytest.approx(1.0, rel=0.1)


def test_errors_are_judged_against_their_usual_share_binomially() -> None:
    pipe = RequestPipeline([])
    quiet = [rec(T0 + 30.0, status="error")]  # one request in the minute, and it failed
    pipe.process(env(quiet))
    pipe.process(env([rec(T0 + MIN + 30.0)]))
    sig = signals(pipe)["signals"]
    assert isinstance(sig, dict)
    assert sig["errors_ratio"] == 1.0 and sig["errors_z"] is None  # too few requests
    busy = RequestPipeline([])
    traffic = Traffic(random.Random(12))
    play(busy, T0, 30 * MIN, traffic, rps=3)
    calm = signals(busy)["signals"]
    assert isinstance(calm, dict) and calm["errors_z"] is not None and abs(calm["errors_z"]) < 3
    failing = [
        rec(T0 + 30 * MIN + i / 3, status="error" if i % 5 == 0 else "ok") for i in range(360)
    ]
    busy.process(env(failing))
    busy.process(env([rec(T0 + 33 * MIN)]))
    hot = signals(busy)["signals"]
    assert isinstance(hot, dict)
    assert hot["errors_ratio"] is not None and hot["errors_ratio"] > 0.1
    assert hot["errors_z"] is not None and hot["errors_z"] > 5


@st.composite
def _runs(draw: st.DrawFn) -> tuple[list[RequestRecord], list[bool]]:
    n = draw(st.integers(0, 40))
    latency = st.floats(0.0, 1e4, allow_nan=False)
    stage_names = st.sampled_from(["retriever", "reranker", "llm", "other"])
    recs = [
        RequestRecord(
            ts=T0 + i,
            status=draw(st.sampled_from(["ok", "ok", "error"])),
            e2e_ms=draw(latency),
            context_tokens=draw(st.integers(0, 10**6)),
            output_tokens=draw(st.integers(0, 10**5)),
            stages=draw(st.dictionaries(stage_names, latency, max_size=3)),
            queue_ms=draw(st.none() | latency),
            ttft_ms=draw(st.none() | latency),
        )
        for i in range(n)
    ]
    clustered = draw(st.just([]) | st.lists(st.booleans(), min_size=n, max_size=n))
    return recs, clustered


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(st.lists(_runs(), max_size=4), st.integers(1, 30))
def test_a_run_of_records_adds_what_adding_them_one_by_one_adds(
    runs: list[tuple[list[RequestRecord], list[bool]]], cap: int
) -> None:
    """Bucket.add_run (the pipeline's path) against Bucket.add record by record: the same
    counts, the same reservoir values (sampling draws from the rng in the same order once a
    reservoir fills), the same rng state after."""
    a, b = Bucket(cap, random.Random(1)), Bucket(cap, random.Random(1))
    for recs, clustered in runs:
        a.add_run(recs, clustered)
        for i, r in enumerate(recs):
            b.add(r, bool(clustered) and clustered[i])
    assert a.counts() == b.counts()
    assert {k: (list(r.values), r.seen) for k, r in a.latencies.items()} == {
        k: (list(r.values), r.seen) for k, r in b.latencies.items()
    }
    assert a.rng.getstate() == b.rng.getstate()


def test_a_clustered_record_adds_the_shared_stages_and_queue_only() -> None:
    """A record of an active outlier cluster: counted apart; its retriever, reranker and
    queue times sampled (they serve every request alike), not the latencies its own size
    sets (end to end, LLM, TTFT and what is derived from them)."""
    record = rec(T0, 2300.0, 29_000, 12, stages={"retriever": 40.0, "reranker": 20.0,
                 "llm": 2200.0}, ttft_ms=1500.0, queue_ms=5.0)  # fmt: skip
    for add in ("add", "add_run"):
        b = Bucket(10, random.Random(1))
        b.add(record, True) if add == "add" else b.add_run([record], [True])
        assert (b.counts().n, b.counts().clustered) == (0, 1)
        assert {k: list(r.values) for k, r in b.latencies.items()} == {
            "retriever": [40.0], "reranker": [20.0], "queue": [5.0]
        }  # fmt: skip
