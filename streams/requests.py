"""From ``ragwatch.requests`` envelopes to per-service signals and alert transitions.

Plain Python (no Faust): a Faust agent feeds decoded envelopes into
:meth:`RequestPipeline.process`, and so can a test or a replay.

Series ``service``: one per (service, instance), labels ``service`` and ``instance``,
kept in event time. Each record goes to the fixed ``bucket_s`` bucket of its own ``ts``.
A bucket closes once the series' watermark (the largest record ``ts`` seen) reaches the
bucket's end + ``grace_s``; until then out-of-order records still land in their bucket,
after that they are counted in ``stats.late_dropped`` and dropped. Buckets without
records are never closed (no data, no evaluation). On close the bucket's signals are
computed and the service rules are evaluated once, at ``ts`` = the bucket's end:

- traffic: ``rps``, ``errors_ratio``, ``output_tokens_per_s``, ``tokens_per_request``
  (output tokens / requests, errors included), ``context_tokens_per_request``;
- latency (ms; exact quantiles, linear between ranks, over at most ``reservoir``
  values per bucket kept by reservoir sampling): ``e2e_p50_ms``, ``e2e_p95_ms``,
  ``e2e_p99_ms``, ``<stage>_p50_ms``, ``<stage>_p95_ms``, ``<stage>_p99_ms`` and
  ``<stage>_share`` (stage time / end-to-end time) for the stages retriever, reranker
  and llm, ``ttft_p95_ms``, ``queue_p95_ms``. P50 is the bucket's own; the tails (P95,
  P99) are taken over the last ``tail_buckets`` buckets (2 minutes by default): a minute
  of a sampled stream holds a hundred requests, whose P99 is one or two of them and
  jumps from bucket to bucket;
- Holt-Winters baselines (``direction="down"``) on tokens/request and output tokens/s:
  ``tpr_forecast``, ``tpr_deviation`` (relative: -0.36 is 36 % below), ``tpr_score``,
  ``tps_forecast``, ``tps_deviation``, ``tps_score``;
- robust baselines, the median of the last ``baseline_buckets`` closed buckets (not
  the current one; None before ``min_baseline`` of them): ``retriever_p99_baseline_ms``,
  ``retriever_p99_ratio``, ``e2e_p95_baseline_ms``, ``e2e_p95_ratio``. A bucket more than
  ``baseline_hold`` times its baseline is not added to it (the slowdown would become the
  baseline within ``baseline_buckets / 2`` buckets and its alert would resolve while it
  goes on), unless that has lasted ``hold_max_s``: then it is the new normal. The
  Holt-Winters baselines hold the same way (``HoltWinters.hold``);
- request outliers, one :class:`RequestOutliers` per service over the
  ``(context_tokens, output_tokens)`` of its ``ok`` records (errors are counted by
  ``errors_ratio`` and would otherwise form a cluster of their own), each record scored
  before it is learned: ``outliers`` (records scoring >= 0.5), ``outlier_ratio`` and
  ``new_outlier_cluster`` (1.0 when a cluster of at least ``new_cluster_size`` core
  points appears more than 4 eps from the previous dominant cluster and from every
  cluster of the previous check, else 0.0; checked once per service and bucket, it is
  raised at the first bucket close after the cluster forms, which can be a bucket up to
  ``grace_s`` before the burst's own since the detector learns records on arrival).
  The most common outlier label (at most 20 outliers a bucket are labelled) is a string,
  :attr:`ServiceSeries.outlier_label`, not a signal.

Signals are floats or None (no data, warming up). A series without records for
``stale_s`` of event time (measured against the pipeline's watermark) is forgotten and
its alerts resolve; new series beyond ``max_series`` are dropped and counted. Memory is
bounded: open buckets per series by ``grace_s / bucket_s + 2``, values per bucket by
``reservoir``, baselines by ``baseline_buckets``, outlier windows by their ``window``.

>>> from ragwatch.schema import RequestRecord, RequestsEnvelope
>>> pipe = RequestPipeline([])
>>> recs = tuple(RequestRecord(ts=t, status="ok", e2e_ms=100.0 + t, context_tokens=3000,
...                            output_tokens=250) for t in (1.0, 2.0, 3.0, 200.0))
>>> pipe.process(RequestsEnvelope("rag", "a", 200.0, recs))
[]
>>> snap = pipe.service_snapshot("rag")["instances"][0]
>>> snap["signals"]["rps"], snap["signals"]["e2e_p50_ms"], snap["bucket_end"]
(0.05, 102.0, 60.0)
"""

from __future__ import annotations

import logging
import math
import random
import statistics
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from ragwatch.detectors.holt_winters import HoltWinters
from ragwatch.detectors.request_outliers import RequestOutliers
from ragwatch.schema import RequestRecord, RequestsEnvelope
from ragwatch.streams.engine import AlertEngine, Transition
from ragwatch.streams.rules import Rule

log = logging.getLogger(__name__)

SERIES = "service"
LABELS = ("service", "instance")
STAGES = ("retriever", "reranker", "llm")
QUANTILES = (("p50", 0.50), ("p95", 0.95), ("p99", 0.99))
MAX_LABELS_PER_BUCKET = 20  # label_one sorts the window: label the first few outliers only
SeriesKey = tuple[str, str]  # service, instance
MAX_SENDERS = 64  # per instance: processes whose last envelope ts is remembered


def quantile(sorted_values: list[float], q: float) -> float | None:
    """The ``q`` quantile, linear between closest ranks (numpy's default); None if empty."""
    if not sorted_values:
        return None
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


@dataclass
class Reservoir:
    """At most ``cap`` values, a uniform sample of all added (Algorithm R)."""

    cap: int
    rng: random.Random
    values: list[float] = field(default_factory=list)
    seen: int = 0

    def add(self, v: float) -> None:
        self.seen += 1
        if len(self.values) < self.cap:
            self.values.append(v)
        else:
            j = self.rng.randrange(self.seen)
            if j < self.cap:
                self.values[j] = v

    def quantiles(self, prefix: str, out: dict[str, float | None]) -> None:
        xs = sorted(self.values)
        for name, q in QUANTILES:
            out[f"{prefix}_{name}_ms"] = quantile(xs, q)


def tail_quantiles(window: list[dict[str, list[float]]], out: dict[str, float | None]) -> None:
    """P95 and P99 of each latency over the buckets in ``window`` (P50 stays per bucket)."""
    names = {n for values in window for n in values}
    for name in names:
        xs = sorted(v for values in window for v in values.get(name, ()))
        out[f"{name}_p95_ms"] = quantile(xs, 0.95)
        if name in ("e2e", *STAGES):
            out[f"{name}_p99_ms"] = quantile(xs, 0.99)


@dataclass
class Bucket:
    """What one bucket of one series accumulates until it closes."""

    reservoir: int
    rng: random.Random
    n: int = 0
    errors: int = 0
    output_tokens: int = 0
    context_tokens: int = 0
    e2e_sum: float = 0.0
    stage_sums: dict[str, float] = field(default_factory=dict)
    latencies: dict[str, Reservoir] = field(default_factory=dict)
    outliers: int = 0
    labels: Counter[str] = field(default_factory=Counter)

    def add(self, rec: RequestRecord) -> None:
        self.n += 1
        self.errors += rec.status != "ok"
        self.output_tokens += rec.output_tokens
        self.context_tokens += rec.context_tokens
        self.e2e_sum += rec.e2e_ms
        self._sample("e2e", rec.e2e_ms)
        for stage, ms in rec.stages.items():
            if stage in STAGES:
                self.stage_sums[stage] = self.stage_sums.get(stage, 0.0) + ms
                self._sample(stage, ms)
        if rec.ttft_ms is not None:
            self._sample("ttft", rec.ttft_ms)
        if rec.queue_ms is not None:
            self._sample("queue", rec.queue_ms)

    def _sample(self, name: str, v: float) -> None:
        r = self.latencies.get(name)
        if r is None:
            r = self.latencies[name] = Reservoir(self.reservoir, self.rng)
        r.add(v)

    def signals(self, bucket_s: float) -> dict[str, float | None]:
        n = self.n
        out: dict[str, float | None] = {
            "rps": n / bucket_s,
            "errors_ratio": self.errors / n,
            "output_tokens_per_s": self.output_tokens / bucket_s,
            "tokens_per_request": self.output_tokens / n,
            "context_tokens_per_request": self.context_tokens / n,
        }
        empty = Reservoir(0, self.rng)
        for name in ("e2e", *STAGES):
            self.latencies.get(name, empty).quantiles(name, out)
        for stage in STAGES:
            total = self.stage_sums.get(stage)
            out[f"{stage}_share"] = (
                None if total is None or not self.e2e_sum else total / self.e2e_sum
            )
        for name in ("ttft", "queue"):
            out[f"{name}_p95_ms"] = quantile(sorted(self.latencies.get(name, empty).values), 0.95)
        return out


@dataclass
class ServiceSeries:
    """One (service, instance): open buckets, baselines, latest signals."""

    labels: dict[str, str]
    tpr: HoltWinters
    tps: HoltWinters
    retriever_p99: deque[float]
    e2e_p95: deque[float]
    buckets: dict[int, Bucket] = field(default_factory=dict)
    watermark: float = -math.inf
    bucket_end: float | None = None  # end of the last closed bucket
    signals: dict[str, float | None] = field(default_factory=dict)
    outlier_label: str | None = None  # most common outlier label of the last closed bucket
    recent_outliers: deque[int] = field(default_factory=lambda: deque(maxlen=5))
    held_since: dict[str, float] = field(default_factory=dict)  # baseline -> bucket end
    tails: deque[tuple[int, dict[str, list[float]]]] = field(default_factory=deque)
    host: str | None = None  # where the instance runs (its envelopes' ``host``), if known
    # the newest envelope ts per sending process (pid; None if not sent): each process
    # sends in order, several processes of one instance interleave
    last_envelope_ts: dict[int | None, float] = field(default_factory=dict)


SILENT_SERVICE_FACTOR = 6  # a service silent for 6 x stale_s of the pipeline's event time


@dataclass
class _Service:
    """Per-service state shared by its instances: the outlier detector and its clusters."""

    detector: RequestOutliers
    instances: set[str] = field(default_factory=set)
    known: list[tuple[float, ...]] = field(default_factory=list)  # previous check's centroids
    checked: int | None = None  # bucket of the previous cluster check
    flag: float = 0.0


@dataclass
class PipelineStats:
    envelopes: int = 0
    records: int = 0
    late_dropped: int = 0  # records whose bucket had already closed
    dropped_records: int = 0  # records of series that did not fit under max_series
    buckets_closed: int = 0
    evicted_series: int = 0
    duplicates: int = 0  # records of envelopes not newer than the instance's last one


class RequestPipeline:
    """Tracks every (service, instance) series and evaluates the service rules on them."""

    def __init__(
        self,
        rules: list[Rule],
        engine: AlertEngine | None = None,
        *,
        bucket_s: float = 60.0,
        grace_s: float = 60.0,
        max_series: int = 10_000,
        stale_s: float = 600.0,
        reservoir: int = 5000,
        baseline_buckets: int = 60,
        min_baseline: int = 5,
        new_cluster_size: int = 10,
        baseline_hold: float = 1.5,
        hold_max_s: float = 21600.0,
        tail_buckets: int = 2,
        outliers: RequestOutliers | None = None,
        seed: int = 0,
    ) -> None:
        if not (bucket_s > 0 and grace_s >= 0 and stale_s > 0):
            raise ValueError(f"need bucket_s > 0, grace_s >= 0, stale_s > 0: {bucket_s, grace_s}")
        if reservoir < 1 or baseline_buckets < 1 or not 1 <= min_baseline <= baseline_buckets:
            raise ValueError("need reservoir >= 1 and 1 <= min_baseline <= baseline_buckets")
        if tail_buckets < 1:
            raise ValueError(f"tail_buckets must be >= 1, got {tail_buckets}")
        self.rules = [r for r in rules if r.series == SERIES]
        self.engine = engine or AlertEngine()
        self.bucket_s, self.grace_s, self.stale_s = float(bucket_s), float(grace_s), stale_s
        self.max_series = max_series
        self.reservoir = reservoir
        self.baseline_buckets, self.min_baseline = baseline_buckets, min_baseline
        self.new_cluster_size = new_cluster_size
        self.baseline_hold, self.hold_max_s = baseline_hold, hold_max_s
        self.tail_buckets = tail_buckets
        self._outliers = outliers or RequestOutliers()
        self._rng = random.Random(seed)
        self.series: dict[SeriesKey, ServiceSeries] = {}
        self._services: dict[str, _Service] = {}
        self.sweep_mark = math.inf  # see GpuPipeline.sweep_mark
        self._watermark = -math.inf
        self._last_sweep = -math.inf
        self.stats = PipelineStats()

    @property
    def watermark(self) -> float:
        """The newest event time seen (0 before any)."""
        return max(0.0, self._watermark)

    def process(self, env: RequestsEnvelope) -> list[Transition]:
        """Add one envelope's records; return the transitions of the buckets it closed."""
        self.stats.envelopes += 1
        self.stats.records += len(env.records)
        out: list[Transition] = []
        s = self._series(env.service, env.instance) if env.records else None
        if s is not None and env.ts <= s.last_envelope_ts.get(env.pid, -math.inf):
            # Seen already (Kafka redelivers after a crash, producers retry): a process
            # sends its envelopes in order, so an older one cannot be new.
            self.stats.duplicates += len(env.records)
            return self._sweep()
        if s is not None:
            s.last_envelope_ts[env.pid] = env.ts
            if len(s.last_envelope_ts) > MAX_SENDERS:  # forget the longest-silent process
                del s.last_envelope_ts[min(s.last_envelope_ts, key=s.last_envelope_ts.__getitem__)]
            if env.host:
                s.host = env.host
            svc = self._services[env.service]
            for rec in env.records:
                self._add(s, svc, rec)
            out += self._close_ready(s, svc)
        elif env.records:
            self.stats.dropped_records += len(env.records)
        return out + self._sweep()

    def service_snapshot(self, service: str) -> dict[str, Any]:
        """What ``ragwatch status`` shows about one service: each instance's last bucket."""
        svc = self._services.get(service)
        instances = []
        for inst in sorted(svc.instances if svc else ()):
            s = self.series[(service, inst)]
            instances.append(
                {
                    "instance": inst,
                    "host": s.host,
                    "bucket_end": s.bucket_end,
                    "signals": dict(s.signals),
                    "outlier_label": s.outlier_label,
                    "open_buckets": len(s.buckets),
                }
            )
        return {"service": service, "instances": instances}

    def service_state(self, service: str) -> tuple[dict[SeriesKey, ServiceSeries], Any]:
        """The service's series and shared outlier state (for a snapshot)."""
        svc = self._services.get(service)
        keys = sorted(svc.instances) if svc else []
        return {(service, i): self.series[(service, i)] for i in keys}, svc

    def forget(self, service: str) -> None:
        """Drop a service's series and outlier state without resolving anything (another
        worker owns it now)."""
        self._services.pop(service, None)
        for k in [k for k in self.series if k[0] == service]:
            del self.series[k]

    def adopt(self, service: str, series: dict[SeriesKey, ServiceSeries], shared: Any) -> int:
        """Take over a service from a snapshot, unless this pipeline already tracks it (its
        own state is newer). Returns how many series it adopted."""
        if service in self._services or not isinstance(shared, _Service):
            return 0
        if any(k[0] != service for k in series):
            return 0
        keys = sorted(series)[: max(0, self.max_series - len(self.series))]
        if not keys:
            return 0
        for k in keys:
            s = self.series[k] = series[k]
            for bucket in s.buckets.values():
                bucket.rng = self._rng
        shared.instances = {k[1] for k in keys}
        self._services[service] = shared
        return len(keys)

    # ------------------------------------------------------------------ internals

    def _series(self, service: str, instance: str) -> ServiceSeries | None:
        s = self.series.get((service, instance))
        if s is not None:
            return s
        if len(self.series) >= self.max_series:
            if self.stats.dropped_records == 0 or self.stats.dropped_records % 10_000 == 0:
                log.warning(
                    "series cap %d reached: dropped records of service=%s instance=%s",
                    self.max_series,
                    service,
                    instance,
                )
            return None
        hw = HoltWinters(bucket_s=self.bucket_s, direction="down", hold_max_s=self.hold_max_s)
        s = ServiceSeries(
            labels={"service": service, "instance": instance},
            tpr=hw,
            tps=hw.clone(),
            retriever_p99=deque(maxlen=self.baseline_buckets),
            e2e_p95=deque(maxlen=self.baseline_buckets),
            tails=deque(maxlen=self.tail_buckets),
        )
        self.series[(service, instance)] = s
        svc = self._services.get(service)
        if svc is None:
            svc = self._services[service] = _Service(self._outliers.clone())
        svc.instances.add(instance)
        return s

    def _add(self, s: ServiceSeries, svc: _Service, rec: RequestRecord) -> None:
        b = math.floor(rec.ts / self.bucket_s)
        if (b + 1) * self.bucket_s + self.grace_s <= s.watermark:
            self.stats.late_dropped += 1
            return
        s.watermark = max(s.watermark, rec.ts)
        self._watermark = max(self._watermark, rec.ts)
        bucket = s.buckets.get(b)
        if bucket is None:
            bucket = s.buckets[b] = Bucket(self.reservoir, self._rng)
        bucket.add(rec)
        if rec.status == "ok":
            x: dict[str, Any] = {
                "context_tokens": rec.context_tokens,
                "output_tokens": rec.output_tokens,
                "t": rec.ts,
            }
            self._score_outlier(svc.detector, x, bucket)

    @staticmethod
    def _score_outlier(det: RequestOutliers, x: dict[str, Any], bucket: Bucket) -> None:
        if det.score_one(x) >= 0.5:
            bucket.outliers += 1
            if bucket.outliers <= MAX_LABELS_PER_BUCKET:
                label = det.label_one(x)
                if label is not None:
                    bucket.labels[label] += 1
        det.learn_one(x)

    def _close_ready(self, s: ServiceSeries, svc: _Service) -> list[Transition]:
        out: list[Transition] = []
        limit = s.watermark - self.grace_s
        for b in sorted(k for k in s.buckets if (k + 1) * self.bucket_s <= limit):
            bucket = s.buckets.pop(b)
            self._close(s, svc, b, bucket)
            end = (b + 1) * self.bucket_s
            for rule in self.rules:
                t = self.engine.evaluate(rule, s.labels, s.signals, end)
                if t is not None:
                    out.append(t)
        return out

    def _close(self, s: ServiceSeries, svc: _Service, b: int, bucket: Bucket) -> None:
        self.stats.buckets_closed += 1
        sig = bucket.signals(self.bucket_s)
        s.tails.append((b, {name: r.values for name, r in bucket.latencies.items()}))
        while s.tails[0][0] <= b - self.tail_buckets:  # older than the window (a gap)
            s.tails.popleft()
        tail_quantiles([values for _, values in s.tails], sig)
        t = (b + 0.5) * self.bucket_s
        _holt_winters(s.tpr, "tpr", sig["tokens_per_request"], t, sig)
        _holt_winters(s.tps, "tps", sig["output_tokens_per_s"], t, sig)
        end = (b + 1) * self.bucket_s
        self._baseline(s, s.retriever_p99, "retriever_p99", sig["retriever_p99_ms"], end, sig)
        self._baseline(s, s.e2e_p95, "e2e_p95", sig["e2e_p95_ms"], end, sig)
        sig["outliers"] = float(bucket.outliers)
        sig["outlier_ratio"] = bucket.outliers / bucket.n
        s.recent_outliers.append(bucket.outliers)
        new = self._new_cluster(svc, b)
        # The cluster detector is per service: the news goes to the instance that served the
        # most outliers over the last few buckets.
        mine = sum(s.recent_outliers)
        service = s.labels["service"]
        peers = (self.series.get((service, i)) for i in svc.instances)
        most = max((sum(o.recent_outliers) for o in peers if o is not None), default=0)
        sig["new_outlier_cluster"] = new if mine and mine == most else 0.0
        s.outlier_label = bucket.labels.most_common(1)[0][0] if bucket.labels else None
        s.signals = sig
        s.bucket_end = (b + 1) * self.bucket_s

    def _baseline(
        self,
        s: ServiceSeries,
        hist: deque[float],
        name: str,
        v: float | None,
        end: float,
        sig: dict[str, float | None],
    ) -> None:
        base = statistics.median(hist) if len(hist) >= self.min_baseline else None
        ratio = None if v is None or not base else v / base
        sig[f"{name}_baseline_ms"] = base
        sig[f"{name}_ratio"] = ratio
        if v is None:
            return
        if ratio is not None and ratio > self.baseline_hold:
            since = s.held_since.setdefault(name, end - self.bucket_s)
            if end - since <= self.hold_max_s:
                return  # an anomaly: keep it out of the baseline
            hist.clear()  # lasted hold_max_s: the new normal
        s.held_since.pop(name, None)
        hist.append(v)

    def _new_cluster(self, svc: _Service, b: int) -> float:
        """Whether a sizeable cluster appeared far from the known ones (once per bucket)."""
        if svc.checked == b:
            return svc.flag
        far = 4 * svc.detector.eps
        clusters = [c for c in svc.detector.clusters() if c.size >= self.new_cluster_size]
        new = bool(svc.known) and any(
            all(math.dist(c.centroid, k) > far for k in svc.known) for c in clusters
        )
        svc.checked, svc.flag = b, 1.0 if new else 0.0
        svc.known = [c.centroid for c in clusters]
        return svc.flag

    def _sweep(self) -> list[Transition]:
        """Forget series without records for ``stale_s``; resolve their alerts."""
        if self._watermark - self._last_sweep < self.bucket_s:
            return []
        self._last_sweep = self._watermark
        now = min(self._watermark, self.sweep_mark)
        out: list[Transition] = []
        # A service's instances share its partition (key = service), so an instance is stale
        # against its service's newest record; a whole service only against the pipeline's
        # watermark with a wide margin, since partitions are consumed at different paces.
        newest: dict[str, float] = {}
        for (service, _), s in self.series.items():
            newest[service] = max(newest.get(service, -math.inf), s.watermark)
        stale = [
            k
            for k, s in self.series.items()
            if newest[k[0]] - s.watermark > self.stale_s
            or now - newest[k[0]] > SILENT_SERVICE_FACTOR * self.stale_s
        ]
        for key in stale:
            s = self.series.pop(key)
            self.stats.evicted_series += 1
            svc = self._services[key[0]]
            svc.instances.discard(key[1])
            if not svc.instances:
                del self._services[key[0]]
            out += self.engine.clear(s.labels, now)
        return out


def _holt_winters(
    det: HoltWinters, prefix: str, v: float | None, t: float, sig: dict[str, float | None]
) -> None:
    """Score the bucket's value against the forecast, then learn it."""
    score = rep = None
    if v is not None:
        x = {"value": v, "t": t}
        score = det.score_one(x)
        det.learn_one(x)
        rep = det.report()
    sig[f"{prefix}_forecast"] = None if rep is None else rep.forecast
    sig[f"{prefix}_deviation"] = None if rep is None else rep.relative
    sig[f"{prefix}_score"] = None if rep is None else score
