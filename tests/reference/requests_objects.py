"""The request pipeline as it was before issue 17's columnar engine: one object per series
(``ServiceSeries``), one envelope at a time. Kept, unchanged but for this paragraph, as the
executable specification the columnar :class:`~ragwatch.streams.pipelines.requests.
RequestPipeline` is held to (``tests/unit/test_requests_columnar.py``: the same signals
after every bucket close, the same transitions), as the object detectors are for the banks.
It is test code: nothing in the product imports it.

From ``ragwatch.requests`` envelopes to per-service signals and alert transitions.

Plain Python (no Faust): a Faust agent feeds decoded envelopes into
:meth:`RequestPipeline.process`, and so can a test or a replay.

Series ``service``: one per (service, instance), labels ``service`` and ``instance``,
kept in event time. Each record goes to the fixed ``bucket_s`` bucket of its own ``ts``.
A bucket closes once the series' watermark (the newest envelope or record ``ts``) reaches
the bucket's end + ``grace_s``; until then out-of-order records still land in their
bucket, after that they are counted in ``stats.late_dropped`` and dropped. Every bucket
closes, with or without records: a minute without requests is evidence too (an envelope
without records is a heartbeat; the SDK sends one when idle). Only a silence of more than
``gap_s`` between a sender's envelopes is a gap (no data), not zero traffic. At each
close the signals are computed and the service rules evaluated once, at ``ts`` = the
bucket's end.

**Evidence.** Signals are not computed per bucket (a minute of a quiet service is one or
two requests) but over windows that hold enough of them
(:mod:`ragwatch.detectors.tails`):

- traffic over the newest buckets in which ``rate_target`` requests were *expected*
  (at least one bucket, more for bursty traffic: enough that the baselines' measured
  excess noise averages down to 8 %; at most ``rate_max_s``): ``rps``, ``errors_ratio``,
  ``output_tokens_per_s``, ``tokens_per_request`` (errors included),
  ``context_tokens_per_request``, ``errors_baseline`` (the usual share of failures) and
  ``errors_z`` (a binomial test of the window's failures against it), and the window
  itself: ``window_s``,
  ``window_requests``, ``clustered_requests`` (an outlier cluster's, see below);
  ``requests_total`` counts every request of the series (for ``keep_firing_requests``);
- seasonal baselines (:class:`~ragwatch.detectors.seasonal.SeasonalBaseline`: a daily
  profile learnt from previous days, a local level and trend) of requests per second and
  of tokens per request; their product is the forecast of output tokens per second. Each
  has ``<x>_forecast``, ``<x>_deviation`` (relative: -0.36 is 36 % below) and ``<x>_z``,
  the deviation in standard deviations of the window's sampling noise (Poisson for
  counts, the tokens' own spread for the mean) plus the baseline's uncertainty, for
  ``x`` in ``rps``, ``tpr`` (tokens per request), ``tps`` (output tokens per second),
  and ``tpr_score`` / ``tps_score`` in [0, 1]. They are unknown (None) while the window
  expects fewer than ``rate_min`` requests;
- latency (ms) over the last ``tail_requests`` requests or the last ``tail_s``
  seconds, whichever holds more, at most ``tail_max_s`` back: ``e2e_p50_ms``,
  ``e2e_p95_ms``, ``e2e_p99_ms``, ``<stage>_p50_ms`` / ``_p95_ms`` / ``_p99_ms`` and
  ``<stage>_share`` (stage time / end-to-end time) for the stages retriever, reranker and
  llm, ``ttft_p95_ms``, ``queue_p95_ms``. A quantile of too few values is unknown: a P50
  needs 10, a P95 40, a P99 100;
- seasonal baselines of the retriever's P99 and the end-to-end P95 (latency follows
  load), fed the window's quantile every 100 new requests (:class:`LatencyBaseline`):
  ``retriever_p99_baseline_ms``, ``retriever_p99_ratio``, ``e2e_p95_baseline_ms``,
  ``e2e_p95_ratio``;
- request outliers, one :class:`RequestOutliers` per service over the
  ``(context_tokens, output_tokens)`` of its ``ok`` records (errors are counted by
  ``errors_ratio`` and would otherwise form a cluster of their own), each record scored
  before it is learned: ``outliers`` (records of the bucket scoring >= 0.5),
  ``recent_outliers`` (over the last 5 buckets), ``outlier_ratio`` and
  ``new_outlier_cluster`` (1.0 when a cluster of at least ``new_cluster_size`` core
  points and 1 % of the window appears more than 4 eps from every cluster of the
  previous check, once the window holds 200 points, else 0.0; ``outlier_cluster_size``
  is the size of the instance's latest cluster when it appeared, so its alert's
  resolution still says which cluster ended; it goes to the instance whose records
  landed away from the known clusters most, and ``outlier_cluster_active`` stays 1.0
  there while the cluster lasts). :attr:`ServiceSeries.outlier_label` (a string, not a
  signal) describes that cluster's requests while it lasts ("long context, short
  output"), else the most common label of the bucket's outliers (at most 20 a bucket are
  labelled). While a cluster is active, the records landing in its cells are counted
  apart (``clustered_requests`` over the rate window): they are the fault its alert is
  about, not the service's usual traffic, so the traffic baselines and their tests
  (requests, errors, tokens: everything but ``rps``, which says what was served, and the
  latencies) leave them out. Learnt, hours of a cluster that doubles a quiet service's
  traffic would read as a drop at the same time on the next day.

**Holding.** A baseline learns nothing while its window deviates by more than
``hold_band`` and ``hold_z`` standard deviations (a latency baseline: while the quantile
is more than 1.2x the baseline), so a fault that lasts does not become the baseline and
its alert resolves when the signal comes back; after ``hold_max_s`` (a day) the deviation
is accepted as the new normal, and ``<x>_relearned_at`` / ``<x>_relearned_from`` say when
and from what (an alert that resolves because of it says so: ``Alert.resolution``).
``<x>_held_s`` is how long a baseline has been held.

Signals are floats or None (no data, warming up, too little evidence). A series without
envelopes for ``stale_s`` of event time (measured against its service's newest record) is
forgotten and its alerts resolve; a whole service silent for ``6 * stale_s`` of the
pipeline's watermark (or the worker's ``sweep_mark``) too. New series beyond
``max_series`` are dropped and counted. Memory is bounded: open buckets per series by
``grace_s / bucket_s + 2``, values per bucket by ``reservoir``, the count ring by
``rate_max_s``, the tail window by its size, baselines by their history.

>>> from ragwatch.schema import RequestRecord, RequestsEnvelope
>>> pipe = RequestPipeline([])
>>> recs = tuple(RequestRecord(ts=t, status="ok", e2e_ms=100.0 + t, context_tokens=3000,
...                            output_tokens=250) for t in range(1, 13))
>>> pipe.process(RequestsEnvelope("rag", "a", 200.0, recs))
[]
>>> snap = pipe.service_snapshot("rag")["instances"][0]
>>> snap["signals"]["rps"], snap["signals"]["e2e_p50_ms"], snap["bucket_end"]  # 2 minutes
(0.1, 106.5, 120.0)
"""

from __future__ import annotations

import logging
import math
import random
from array import array
from collections import Counter, deque
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ragwatch.detectors.counts import BucketCounts, CountWindow, count_z
from ragwatch.detectors.request_outliers import REQUEST_FEATURES, RequestOutliers
from ragwatch.detectors.request_shapes import ShapeMemory
from ragwatch.detectors.seasonal import Forecast, SeasonalBaseline
from ragwatch.detectors.tails import TailWindow, quantile, tail_signals
from ragwatch.schema import RequestRecord, RequestsEnvelope, Transition
from ragwatch.streams.alerting.engine import AlertEngine
from ragwatch.streams.alerting.rules import Rule
from ragwatch.streams.pipelines.base import ChartSeries, Domain
from ragwatch.streams.pipelines.budget import SeriesBudget
from tests.reference.evidence import CountRing, LatencyBaseline

log = logging.getLogger(__name__)

SERIES = "service"
LABELS = ("service", "instance")
STAGES = ("retriever", "reranker", "llm")
MAX_LABELS_PER_BUCKET = 20  # label_one sorts the window: label the first few outliers only
SeriesKey = tuple[str, str]  # service, instance
MAX_SENDERS = 64  # per instance: processes whose last envelope ts is remembered
RECENT_BUCKETS = 5  # recent_outliers: over this many buckets
# What one envelope may cost (a sender batches seconds of records, a few hundred): records
# more than an hour older than their envelope are dropped, and the outlier detector scores
# at most its window's worth of an envelope's records (the rest are counted, not scored).
MAX_RECORD_AGE_S = 3600.0
MAX_INSTANCES = 1024  # per service: beyond, a new instance's records are dropped (counted)
MAX_SCORED_PER_ENVELOPE = 2000
CLUSTER_RESCAN = 60  # buckets between scans of a service's clusters without novelty
CLUSTER_ACTIVE_RESCAN = 5  # ... while a flagged cluster lasts (is it still there?)
NOVEL_DECAY = 0.9  # per bucket: which instance's records a new cluster is made of
CLUSTER_SHARE = 0.01  # of the window's points: the smallest cluster that is news
CLUSTER_WARMUP = 200  # points the outlier window holds before a cluster is news
FAMILIAR_SHARE = 0.5  # a cluster with this share of shapes the service knows is not news
TOKEN_CV2 = 0.05  # tokens per request: variance / mean^2 until the series has measured it
RATE_PRECISION = 0.08  # the relative excess noise a rate window averages bursts down to
ERROR_PRIOR = 0.005  # the share of failed requests assumed before a series has measured it

__all__ = ["Bucket", "RequestPipeline", "Reservoir", "ServiceSeries", "quantile"]


@dataclass
class Reservoir:
    """At most ``cap`` values, a uniform sample of all added (Algorithm R), as doubles
    (8 bytes a value; a snapshot written before kept a list, which reads the same)."""

    cap: int
    rng: random.Random
    values: array[float] = field(default_factory=lambda: array("d"))
    seen: int = 0

    def extend(self, vs: Sequence[float]) -> None:
        """Values that fit as they are (no sampling: nothing is drawn from the rng)."""
        if len(self.values) + len(vs) > self.cap:
            raise ValueError(f"{len(vs)} values do not fit ({len(self.values)} of {self.cap})")
        self.values.extend(vs)
        self.seen += len(vs)

    def add(self, v: float) -> None:
        self.seen += 1
        if len(self.values) < self.cap:
            self.values.append(v)
        else:
            j = self.rng.randrange(self.seen)
            if j < self.cap:
                self.values[j] = v


@dataclass
class Bucket:
    """What one bucket of one series accumulates until it closes."""

    reservoir: int
    rng: random.Random
    n: int = 0
    errors: int = 0
    output_tokens: int = 0
    output_sq: float = 0.0
    context_tokens: int = 0
    latencies: dict[str, Reservoir] = field(default_factory=dict)
    outliers: int = 0
    novel: int = 0  # ok records away from the service's known clusters
    labels: Counter[str] = field(default_factory=Counter)
    clustered: int = 0  # records of the service's active outlier cluster (in none of the above)

    def add(self, rec: RequestRecord, clustered: bool = False) -> None:
        """One record; one of an active outlier cluster is counted apart (``clustered``):
        it is the fault RequestOutlierCluster pages for, not the service's usual traffic,
        so the traffic baselines neither learn it nor test it. Its latencies count."""
        if clustered:
            self.clustered += 1
        else:
            self.n += 1
            self.errors += rec.status != "ok"
            self.output_tokens += rec.output_tokens
            self.output_sq += rec.output_tokens * rec.output_tokens
            self.context_tokens += rec.context_tokens
        self._sample("e2e", rec.e2e_ms)
        for stage, ms in rec.stages.items():
            if stage in STAGES:
                self._sample(stage, ms)
        if rec.ttft_ms is not None:
            self._sample("ttft", rec.ttft_ms)
        if rec.queue_ms is not None:
            self._sample("queue", rec.queue_ms)

    def add_run(self, recs: Sequence[RequestRecord], clustered: Sequence[bool] = ()) -> None:
        """:meth:`add` of each record of ``recs`` in turn (``clustered[i]`` for record i;
        none if empty), a column at a time: the latencies of a name appended together,
        the counts summed. Where a reservoir would fill within the run, record by record
        (sampling then draws from the shared rng in the records' order)."""
        if clustered and len(clustered) != len(recs):
            raise ValueError(f"{len(clustered)} clustered flags for {len(recs)} records")
        cols = _latency_columns(recs)
        lat, cap = self.latencies, self.reservoir
        if any((len(lat[k].values) if k in lat else 0) + len(v) > cap for k, v in cols.items()):
            for i, rec in enumerate(recs):
                self.add(rec, bool(clustered) and clustered[i])
            return
        for name, values in cols.items():
            if not values:
                continue
            res = lat.get(name)
            if res is None:
                res = lat[name] = Reservoir(cap, self.rng)
            res.extend(values)
        counted = (
            [r for r, c in zip(recs, clustered, strict=True) if not c] if any(clustered) else recs
        )
        self.clustered += len(recs) - len(counted)
        self.n += len(counted)
        self.errors += sum(1 for r in counted if r.status != "ok")
        for rec in counted:
            out = rec.output_tokens
            self.output_tokens += out
            self.output_sq += out * out
            self.context_tokens += rec.context_tokens

    def _sample(self, name: str, v: float) -> None:
        r = self.latencies.get(name)
        if r is None:
            r = self.latencies[name] = Reservoir(self.reservoir, self.rng)
        if len(r.values) < r.cap:  # Reservoir.add, inline: a call less per value
            r.seen += 1
            r.values.append(v)
        else:
            r.add(v)

    def counts(self) -> BucketCounts:
        return BucketCounts(
            self.n,
            self.errors,
            self.output_tokens,
            self.output_sq,
            self.context_tokens,
            clustered=self.clustered,
        )


@dataclass
class _Pending:
    """Buckets gathered into one observation for a baseline (until it holds enough)."""

    start: float | None = None
    end: float = 0.0
    n: int = 0
    tokens: float = 0.0
    tokens_sq: float = 0.0
    expected: float = 0.0

    def add(self, end: float, bucket_s: float, c: BucketCounts, expected: float) -> None:
        if self.start is None:
            self.start = end - bucket_s
        self.end = end
        self.n += c.n
        self.tokens += c.tokens
        self.tokens_sq += c.tokens_sq
        self.expected += expected

    @property
    def span_s(self) -> float:
        return 0.0 if self.start is None else self.end - self.start


@dataclass
class ServiceSeries:
    """One (service, instance): open buckets, evidence windows, baselines, signals."""

    labels: dict[str, str]
    rps: SeasonalBaseline  # log requests per second
    tpr: SeasonalBaseline  # log output tokens per request
    retriever_p99: LatencyBaseline
    e2e_p95: LatencyBaseline
    counts: CountRing
    tail: TailWindow
    buckets: dict[int, Bucket] = field(default_factory=dict)
    next_bucket: int | None = None  # the oldest bucket not closed yet
    watermark: float = -math.inf
    gaps: deque[tuple[int, int]] = field(default_factory=deque)  # unobserved buckets [a, b]
    bucket_end: float | None = None  # end of the last closed bucket
    signals: dict[str, float | None] = field(default_factory=dict)
    outlier_label: str | None = None  # its outlier cluster's, or its outliers' (_close)
    cluster_size: float | None = None  # its latest outlier cluster's size when it appeared
    recent_outliers: deque[int] = field(default_factory=lambda: deque(maxlen=RECENT_BUCKETS))
    host: str | None = None  # where the instance runs (its envelopes' ``host``), if known
    # the newest envelope ts per sending process (pid; None if not sent): each process
    # sends in order, several processes of one instance interleave
    last_envelope_ts: dict[int | None, float] = field(default_factory=dict)
    requests_total: int = 0
    errors_total: int = 0  # failed requests (counters: /metrics exports them as _total)
    output_tokens_total: float = 0.0
    error_base: float = ERROR_PRIOR  # the usual share of failed requests (slow average)
    novel_score: float = 0.0  # novel records, decaying by NOVEL_DECAY per bucket
    token_cv2: float = TOKEN_CV2
    pending_rps: _Pending = field(default_factory=_Pending)
    pending_tpr: _Pending = field(default_factory=_Pending)
    relearned: dict[str, tuple[float, float]] = field(default_factory=dict)  # family: at, from


SILENT_SERVICE_FACTOR = 6  # a service silent for 6 x stale_s of the pipeline's event time


@dataclass
class _Service:
    """Per-service state shared by its instances: the outlier detector and its clusters."""

    detector: RequestOutliers
    name: str = ""
    instances: set[str] = field(default_factory=set)
    known: list[tuple[float, ...]] = field(default_factory=list)  # previous check's centroids
    checked: int | None = None  # bucket of the previous cluster check
    flag: float = 0.0
    size: float = 0.0  # the new cluster's size, when flagged
    scanned: int | None = None  # bucket of the previous scan of the clusters
    dense: frozenset[tuple[int, ...]] = frozenset()  # the detector's dense cells at that scan
    novel: int = 0  # records outside them since
    active: tuple[float, ...] | None = None  # centroid of the flagged cluster, while it lasts
    active_instance: str | None = None  # the instance it was raised on
    active_label: str | None = None  # what its requests look like ("long context, ...")
    active_cells: frozenset[tuple[int, ...]] = frozenset()  # its cells and their neighbours
    memory: ShapeMemory = field(default_factory=ShapeMemory)  # the shapes served over days
    fresh: list[tuple[float, float]] = field(default_factory=list)  # learnt since a close


@dataclass
class PipelineStats:
    envelopes: int = 0
    records: int = 0
    late_dropped: int = 0  # records whose bucket had already closed
    dropped_records: int = 0  # records of series that did not fit under max_series
    buckets_closed: int = 0
    evicted_series: int = 0
    duplicates: int = 0  # records of envelopes not newer than the instance's last one
    too_old: int = 0  # records more than MAX_RECORD_AGE_S older than their envelope's newest time
    unscored_records: int = 0  # records beyond MAX_SCORED_PER_ENVELOPE: not seen by outliers


class RequestPipeline:
    """Tracks every (service, instance) series and evaluates the service rules on them."""

    def __init__(
        self,
        rules: list[Rule],
        engine: AlertEngine | None = None,
        *,
        bucket_s: float = 60.0,
        grace_s: float = 30.0,
        gap_s: float = 600.0,
        max_series: int = 10_000,
        max_instances: int = MAX_INSTANCES,
        budget: SeriesBudget | None = None,
        stale_s: float = 3600.0,
        reservoir: int = 5000,
        tail_requests: int = 200,
        tail_s: float = 120.0,
        tail_max_s: float = 3 * 3600.0,
        rate_target: float = 150.0,
        rate_min: float = 20.0,
        rate_max_s: float = 5400.0,
        observation_requests: float = 30.0,
        observation_max_s: float = 3600.0,
        hold_band: float = 0.1,
        hold_z: float = 3.0,
        hold_max_s: float = 86400.0,
        weekly_sd: float | None = None,
        min_baseline: int = 3,
        new_cluster_size: int = 10,
        outliers: RequestOutliers | None = None,
        seed: int = 0,
    ) -> None:
        if not (bucket_s > 0 and grace_s >= 0 and stale_s > 0 and gap_s >= bucket_s):
            raise ValueError(
                f"need bucket_s > 0, grace_s >= 0, stale_s > 0, gap_s >= bucket_s: "
                f"{bucket_s, grace_s, stale_s, gap_s}"
            )
        if reservoir < 1 or tail_requests < 1 or min_baseline < 1:
            raise ValueError("need reservoir, tail_requests and min_baseline >= 1")
        if not (0 < rate_min <= rate_target and rate_max_s >= bucket_s):
            raise ValueError("need 0 < rate_min <= rate_target and rate_max_s >= bucket_s")
        self.rules = [r for r in rules if r.series == SERIES]
        self.engine = engine or AlertEngine()
        self.bucket_s, self.grace_s, self.stale_s = float(bucket_s), float(grace_s), stale_s
        self.gap_s = float(gap_s)
        self.max_series, self.max_instances = max_series, max_instances
        self.budget = budget or SeriesBudget(max_series)
        self.budget.watch(lambda: len(self.series))
        self.swept: set[str] = set()  # services whose last instance went silent
        self.reservoir = reservoir
        self.tail = (tail_requests, float(tail_s), float(tail_max_s))
        self.rate_target, self.rate_min, self.rate_max_s = rate_target, rate_min, rate_max_s
        self.observation = (observation_requests, observation_max_s)
        self.hold_band, self.hold_z, self.hold_max_s = hold_band, hold_z, hold_max_s
        self.min_baseline = min_baseline
        self.new_cluster_size = new_cluster_size
        self._outliers = outliers if outliers is not None else RequestOutliers()
        self._rng = random.Random(seed)
        weekly = {} if weekly_sd is None else {"weekly_sd": weekly_sd}
        self._baseline = SeasonalBaseline(step_s=self.bucket_s, hold_max_s=hold_max_s, **weekly)
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
        s = self._series(env.service, env.instance)
        if s is not None and env.ts <= s.last_envelope_ts.get(env.pid, -math.inf):
            # Seen already (Kafka redelivers after a crash, producers retry): a process
            # sends its envelopes in order, so an older one cannot be new.
            self.stats.duplicates += len(env.records)
            return self._sweep()
        if s is None:
            self.stats.dropped_records += len(env.records)
            return self._sweep()
        s.last_envelope_ts[env.pid] = env.ts
        if len(s.last_envelope_ts) > MAX_SENDERS:  # forget the longest-silent process
            del s.last_envelope_ts[min(s.last_envelope_ts, key=s.last_envelope_ts.__getitem__)]
        if env.host:
            s.host = env.host
        svc = self._services[env.service]
        newest = max(env.ts, max((r.ts for r in env.records), default=env.ts))
        records = self._recent(env, newest)  # (the newest record is always kept)
        if s.next_bucket is None:  # a new series starts at its first record's bucket
            first = min((r.ts for r in records), default=env.ts)
            s.next_bucket = math.floor(first / self.bucket_s)
        self._advance(s, newest)
        self._add(s, svc, records)
        self.stats.unscored_records += max(0, len(records) - MAX_SCORED_PER_ENVELOPE)
        out += self._close_ready(s, svc)
        return out + self._sweep()

    def _recent(self, env: RequestsEnvelope, newest: float) -> tuple[RequestRecord, ...]:
        """The envelope's records from ``MAX_RECORD_AGE_S`` before its newest time (its
        ``ts`` or a later record's) on; older ones are dropped and counted (``too_old``): a
        sender batches seconds or minutes, and each minute a record reaches back is a
        bucket to open and close, so one envelope of records a minute apart could otherwise
        cost a month of buckets (an envelope dated 1970 with a record of now: 29 million)."""
        horizon = newest - MAX_RECORD_AGE_S
        if all(r.ts >= horizon for r in env.records):
            return env.records
        kept = tuple(r for r in env.records if r.ts >= horizon)
        self.stats.too_old += len(env.records) - len(kept)
        return kept

    def tracks(self, service: str) -> bool:
        return service in self._services

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

    # -- the SignalPipeline seam (streams/pipelines/base.py) -----------------------------

    name: ClassVar[str] = "requests"
    domain: ClassVar[Domain] = "service"

    def dump(self, key: str) -> tuple[dict[SeriesKey, ServiceSeries], Any]:
        return self.service_state(key)

    def status(self, keys: Collection[str]) -> dict[str, dict[str, Any]]:
        return {k: self.service_snapshot(k) for k in keys}

    def charts(self, keys: Collection[str]) -> Iterable[ChartSeries]:
        for key in keys:
            series, _ = self.service_state(key)
            for s in series.values():
                if s.bucket_end is not None:
                    yield ChartSeries("service", s.labels, s.bucket_end, s)

    def adopt(self, service: str, state: tuple[dict[SeriesKey, ServiceSeries], Any]) -> int:
        """Take over a service from a snapshot (:meth:`dump`: its series and shared outlier
        state), unless this pipeline already tracks it (its own state is newer). Returns
        how many series it adopted."""
        series, shared = state
        if service in self._services or not isinstance(shared, _Service):
            return 0
        if any(k[0] != service for k in series):
            return 0
        keys = sorted(series)[: max(0, self._room())]
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

    def _room(self) -> int:
        """How many more series fit: under ``max_series`` and the worker's budget."""
        return min(self.max_series - len(self.series), self.budget.room())

    def _series(self, service: str, instance: str) -> ServiceSeries | None:
        s = self.series.get((service, instance))
        if s is not None:
            return s
        svc = self._services.get(service)
        full = self._room() <= 0
        if full or (svc is not None and len(svc.instances) >= self.max_instances):
            if self.stats.dropped_records == 0 or self.stats.dropped_records % 10_000 == 0:
                log.warning(
                    "%s: dropped records of service=%s instance=%s",
                    f"series cap {self.max_series} (or the worker's budget) reached"
                    if full
                    else f"service has {self.max_instances} instances (max_instances)",
                    service,
                    instance,
                )
            return None
        tail_requests, tail_s, tail_max_s = self.tail
        s = ServiceSeries(
            labels={"service": service, "instance": instance},
            rps=self._baseline.clone(),
            tpr=self._baseline.clone(),
            retriever_p99=self._latency_baseline(),
            e2e_p95=self._latency_baseline(),
            counts=CountRing(math.ceil(self.rate_max_s / self.bucket_s), self.bucket_s),
            tail=TailWindow(tail_requests, tail_s, tail_max_s, bucket_s=self.bucket_s),
        )
        self.series[(service, instance)] = s
        svc = self._services.get(service)
        if svc is None:
            svc = self._services[service] = _Service(self._outliers.clone(), service)
        svc.instances.add(instance)
        return s

    def _latency_baseline(self) -> LatencyBaseline:
        return LatencyBaseline(min_entries=self.min_baseline, hold_max_s=self.hold_max_s)

    def _advance(self, s: ServiceSeries, ts: float) -> None:
        """The sender reported up to ``ts``: a silence longer than ``gap_s`` since its
        previous report is a gap (its buckets are not observed), not zero traffic."""
        if ts <= s.watermark:
            return
        if s.watermark > -math.inf and ts - s.watermark > self.gap_s:
            first = math.floor(s.watermark / self.bucket_s) + 1
            last = math.floor(ts / self.bucket_s) - 1
            if last >= first:
                s.gaps.append((first, last))
        s.watermark = ts
        self._watermark = max(self._watermark, ts)

    def _add(self, s: ServiceSeries, svc: _Service, records: Sequence[RequestRecord]) -> None:
        """The records into their buckets, a run of consecutive records of one bucket at a
        time; the first ``MAX_SCORED_PER_ENVELOPE`` are scored by the outlier detector."""
        bs, floor = self.bucket_s, math.floor
        ids = [floor(r.ts / bs) for r in records]
        i = 0
        while i < len(ids):
            b = ids[i]
            j = i + 1
            while j < len(ids) and ids[j] == b:
                j += 1
            if s.next_bucket is not None and b < s.next_bucket:
                self.stats.late_dropped += j - i
            else:
                bucket = s.buckets.get(b)
                if bucket is None:
                    bucket = s.buckets[b] = Bucket(self.reservoir, self._rng)
                run = records[i:j]
                flags = self._outliers_of(svc, bucket, run[: max(0, MAX_SCORED_PER_ENVELOPE - i)])
                bucket.add_run(run, flags + [False] * (len(run) - len(flags)))
            i = j

    def _outliers_of(
        self, svc: _Service, bucket: Bucket, records: Sequence[RequestRecord]
    ) -> list[bool]:
        """Score and learn the ``ok`` records in turn; which of them land in the service's
        active outlier cluster (``Bucket.add``'s ``clustered``)."""
        det, active, dense = svc.detector, svc.active_cells, svc.dense
        clustered = []
        for rec in records:
            if rec.status != "ok":
                clustered.append(False)
                continue
            p = (float(rec.context_tokens), float(rec.output_tokens))
            cell = det.cell(p)
            clustered.append(cell in active)
            self._score_outlier(det, p, cell, rec, bucket)
            svc.fresh.append(p)
            if cell not in dense:
                svc.novel += 1
                bucket.novel += 1
        return clustered

    @staticmethod
    def _score_outlier(
        det: RequestOutliers,
        p: tuple[float, float],
        cell: tuple[int, ...],
        rec: RequestRecord,
        bucket: Bucket,
    ) -> None:
        """Score a record's point (in ``cell``) before it is learnt: read from the record as
        the detector's features once its first point picked them (records are valid)."""
        x = None if det.features == REQUEST_FEATURES else _point_of(rec)
        if (det.score_point(p, cell) if x is None else det.score_one(x)) >= 0.5:
            bucket.outliers += 1
            if bucket.outliers <= MAX_LABELS_PER_BUCKET:
                label = det.label_one(x or _point_of(rec))
                if label is not None:
                    bucket.labels[label] += 1
        if x is None:
            det.learn_point(p, cell)
        else:
            det.learn_one(x)

    def _close_ready(self, s: ServiceSeries, svc: _Service) -> list[Transition]:
        out: list[Transition] = []
        limit = math.floor((s.watermark - self.grace_s) / self.bucket_s)  # buckets < limit
        b = s.next_bucket
        if b is None:
            return out
        while b < limit:
            bucket = s.buckets.pop(b, None)
            if bucket is None and self._unobserved(s, b):
                b = min(limit, s.gaps[0][1] + 1)  # skip the rest of the gap
                for k in [k for k in s.buckets if k < b]:  # sent later for the silence
                    gone = s.buckets.pop(k)
                    self.stats.late_dropped += gone.n + gone.clustered
                continue
            self._close(s, svc, b, bucket or Bucket(self.reservoir, self._rng))
            end = (b + 1) * self.bucket_s
            for rule in self.rules:
                t = self.engine.evaluate(rule, s.labels, s.signals, end)
                if t is not None:
                    out.append(t)
            b += 1
        s.next_bucket = b
        return out

    @staticmethod
    def _unobserved(s: ServiceSeries, b: int) -> bool:
        while s.gaps and s.gaps[0][1] < b:
            s.gaps.popleft()
        return bool(s.gaps) and s.gaps[0][0] <= b

    def _close(self, s: ServiceSeries, svc: _Service, b: int, bucket: Bucket) -> None:
        self.stats.buckets_closed += 1
        end = (b + 1) * self.bucket_s
        counts = bucket.counts()
        s.requests_total += counts.n + counts.clustered
        s.errors_total += counts.errors
        s.output_tokens_total += counts.tokens
        f = s.rps.forecast(end - self.bucket_s / 2)  # before the bucket is learnt
        expected = math.exp(f.mean) * self.bucket_s if f is not None else None
        s.counts.push(end, counts, expected)
        s.tail.push(end, {name: r.values for name, r in bucket.latencies.items()})
        sig: dict[str, float | None] = {
            "requests_total": float(s.requests_total),
            "errors_total": float(s.errors_total),
            "output_tokens_total": s.output_tokens_total,
        }
        self._traffic(s, end, counts, expected, sig)
        tail_signals(s.tail, end, sig)
        self._latency(s, end, sig)
        sig["outliers"] = float(bucket.outliers)
        served = bucket.n + bucket.clustered
        sig["outlier_ratio"] = bucket.outliers / served if served else None
        s.recent_outliers.append(bucket.outliers)
        sig["recent_outliers"] = float(sum(s.recent_outliers))
        s.novel_score = s.novel_score * NOVEL_DECAY + bucket.novel
        # The cluster detector is per service: the news goes to the instance whose records
        # landed away from the known clusters most (_new_cluster).
        new = self._new_cluster(svc, b)
        mine = svc.active is not None and svc.active_instance == s.labels["instance"]
        raised = new if mine else 0.0
        sig["new_outlier_cluster"] = raised
        if raised:
            s.cluster_size = svc.size
        sig["outlier_cluster_size"] = s.cluster_size
        sig["outlier_cluster_active"] = 1.0 if mine else 0.0
        if mine and svc.active_label:  # the cluster's own description
            s.outlier_label = svc.active_label
        elif bucket.labels:
            s.outlier_label = bucket.labels.most_common(1)[0][0]
        elif not sum(s.recent_outliers):
            s.outlier_label = None
        s.signals = sig
        s.bucket_end = end

    # ------------------------------------------------------------------ traffic

    def _traffic(
        self,
        s: ServiceSeries,
        end: float,
        counts: BucketCounts,
        expected: float | None,
        sig: dict[str, float | None],
    ) -> None:
        w = s.counts.window(
            target=self.rate_target, max_s=self.rate_max_s, min_s=self._window_min_s(s, end)
        )
        span, n = w.span_s, w.n
        sig["window_s"], sig["window_requests"] = span, float(n)
        sig["rps"] = (n + w.clustered) / span if span else None  # all it served
        sig["clustered_requests"] = float(w.clustered)
        sig["output_tokens_per_s"] = w.tokens / span if span else None
        sig["errors_ratio"] = w.errors / n if n else None
        self._errors(s, w, sig)
        sig["tokens_per_request"] = w.tokens / n if n else None
        sig["context_tokens_per_request"] = w.context / n if n else None
        mid = (w.start + end) / 2
        rate = self._rate_deviation(s, w, mid, w.unexpected == 0, sig)
        mean = self._mean_deviation(s, w, mid, sig)
        self._tps(s, w, rate, mean, sig)
        self._hold(s, end, w, sig)
        self._learn(s, end, counts, float(counts.n) if expected is None else expected)
        for family in ("rps", "tpr", "tps"):
            at, before = s.relearned.get(family, (None, None))
            sig[f"{family}_relearned_at"], sig[f"{family}_relearned_from"] = at, before
        held = max(s.rps.held_s(end), s.tpr.held_s(end))
        sig["rps_held_s"], sig["tpr_held_s"] = s.rps.held_s(end), s.tpr.held_s(end)
        sig["tps_held_s"] = held

    def _errors(self, s: ServiceSeries, w: CountWindow, sig: dict[str, float | None]) -> None:
        """Failed requests against their usual share: a binomial z (a quarter of slack for
        the baseline itself), learnt slowly while not significant."""
        p0, n = s.error_base, w.n
        sig["errors_baseline"] = p0
        sig["errors_z"] = None
        if n < self.rate_min:
            return
        expected = n * p0
        var = expected * (1 - p0) + (0.25 * expected) ** 2
        z = (w.errors - expected) / math.sqrt(var) if var > 0 else 0.0
        sig["errors_z"] = z
        if abs(z) < self.hold_z:
            s.error_base += 0.02 * (w.errors / n - p0)

    def _window_min_s(self, s: ServiceSeries, end: float) -> float:
        """Bursty traffic needs a longer window: long enough that the baselines' excess
        noise per bucket, averaged over it, is within ``RATE_PRECISION``."""
        noise = 0.0
        for base in (s.rps, s.tpr):
            f = base.forecast(end)
            noise += f.noise if f is not None else 0.0
        buckets = math.ceil(noise / RATE_PRECISION**2)
        return min(self.rate_max_s, max(1, buckets) * self.bucket_s)

    def _rate_deviation(
        self,
        s: ServiceSeries,
        w: CountWindow,
        mid: float,
        ready: bool,
        sig: dict[str, float | None],
    ) -> float | None:
        """Requests against the baseline's expectation; returns the forecast's variance."""
        sig["rps_forecast"] = sig["rps_deviation"] = sig["rps_z"] = None
        if not ready or w.expected < self.rate_min or not w.span_s:
            return None
        f = s.rps.forecast(mid)
        var = _window_var(f, w.span_s / self.bucket_s)
        sig["rps_forecast"] = w.expected / w.span_s
        sig["rps_deviation"] = w.n / w.expected - 1
        sig["rps_z"] = count_z(w.n, w.expected, 1.0, var)
        return var

    def _mean_deviation(
        self, s: ServiceSeries, w: CountWindow, mid: float, sig: dict[str, float | None]
    ) -> float | None:
        """Tokens per request against its baseline; returns the forecast's variance."""
        sig["tpr_forecast"] = sig["tpr_deviation"] = sig["tpr_z"] = sig["tpr_score"] = None
        f = s.tpr.forecast(mid)
        if f is None:
            return None
        forecast = math.exp(f.mean)
        sig["tpr_forecast"] = forecast
        if w.n < self.rate_min:
            return _window_var(f, w.span_s / self.bucket_s)
        mean = w.tokens / w.n
        spread = max(0.0, w.tokens_sq / w.n - mean * mean)
        var = _window_var(f, w.span_s / self.bucket_s)
        se2 = spread / w.n + forecast * forecast * var
        d = mean / forecast - 1
        z = (mean - forecast) / math.sqrt(se2) if se2 > 0 else 0.0
        sig["tpr_deviation"], sig["tpr_z"] = d, z
        sig["tpr_score"] = _drop_score(d, z, self.hold_z)
        return var

    def _tps(
        self,
        s: ServiceSeries,
        w: CountWindow,
        rate_var: float | None,
        mean_var: float | None,
        sig: dict[str, float | None],
    ) -> None:
        """Output tokens per second against requests x tokens per request expected."""
        sig["tps_forecast"] = sig["tps_deviation"] = sig["tps_z"] = sig["tps_score"] = None
        tpr = sig["tpr_forecast"]
        if rate_var is None or mean_var is None or tpr is None:
            return
        expected = w.expected * tpr
        size = tpr * (1 + s.token_cv2)  # E[tokens^2] / E[tokens] of one request
        d = w.tokens / expected - 1 if expected > 0 else 0.0
        z = count_z(w.tokens, expected, size, rate_var + mean_var)
        sig["tps_forecast"] = expected / w.span_s
        sig["tps_deviation"], sig["tps_z"] = d, z
        sig["tps_score"] = _drop_score(d, z, self.hold_z)

    def _hold(
        self, s: ServiceSeries, end: float, w: CountWindow, sig: dict[str, float | None]
    ) -> None:
        """Hold each baseline whose window deviates significantly; maybe accept a new
        level (and remember when, and from what, for the alerts' resolutions)."""
        tps_before = sig["tps_forecast"]
        for family, base, observed in (
            ("rps", s.rps, math.log((w.n + 0.5) / w.span_s) if w.span_s else None),
            ("tpr", s.tpr, math.log(max(w.tokens / w.n, 0.5)) if w.n else None),
        ):
            d, z = sig[f"{family}_deviation"], sig[f"{family}_z"]
            # enter the hold on a significant deviation; stay in it while the deviation is
            # larger than the band (noisy traffic makes z waver during a real fault)
            deviating = (
                d is not None
                and z is not None
                and abs(d) > self.hold_band
                and (base.holding or abs(z) > self.hold_z)
            )
            before = sig[f"{family}_forecast"]
            if base.hold(end, deviating, observed) and before is not None:
                s.relearned[family] = (end, before)
                if tps_before is not None:
                    s.relearned["tps"] = (end, tps_before)

    def _learn(self, s: ServiceSeries, end: float, c: BucketCounts, expected: float) -> None:
        """Gather buckets into observations that hold enough requests, then learn them."""
        want, max_s = self.observation
        bs = self.bucket_s
        if s.rps.holding:  # a held bucket is never learnt
            s.pending_rps = _Pending()
        else:
            s.pending_rps.add(end, bs, c, expected)
        if s.tpr.holding:
            s.pending_tpr = _Pending()
        else:
            s.pending_tpr.add(end, bs, c, expected)
        p = s.pending_rps
        if p.start is not None and (p.expected >= want or p.span_s >= max_s):
            z = math.log((p.n + 0.5) / p.span_s)
            s.rps.learn((p.start + p.end) / 2, z, 1 / (p.n + 0.5), p.span_s / bs)
            s.pending_rps = _Pending()
        p = s.pending_tpr
        if p.start is not None and (p.n >= want or p.span_s >= max_s):
            if p.n:
                mean = p.tokens / p.n
                cv2 = max(0.0, p.tokens_sq / p.n / (mean * mean) - 1) if mean > 0 else 0.0
                if p.n >= 10:
                    s.token_cv2 += 0.1 * (cv2 - s.token_cv2)
                z = math.log(max(mean, 0.5))
                s.tpr.learn((p.start + p.end) / 2, z, max(cv2, 1e-4) / p.n, p.span_s / bs)
            s.pending_tpr = _Pending()

    # ------------------------------------------------------------------ latency

    def _latency(self, s: ServiceSeries, end: float, sig: dict[str, float | None]) -> None:
        for name, stage, base in (
            ("retriever_p99", "retriever", s.retriever_p99),
            ("e2e_p95", "e2e", s.e2e_p95),
        ):
            value = sig[f"{name}_ms"]
            baseline = base.update(end, value, s.tail.seen.get(stage, 0))
            sig[f"{name}_baseline_ms"] = baseline
            sig[f"{name}_ratio"] = value / baseline if value is not None and baseline else None
            sig[f"{name}_held_s"] = base.held_s(end)
            sig[f"{name}_relearned_at"] = base.relearned_at
            sig[f"{name}_relearned_from"] = base.relearned_before

    # ------------------------------------------------------------------ outliers, sweeps

    def _new_cluster(self, svc: _Service, b: int) -> float:
        """Whether a sizeable cluster appeared far from the known ones (once per bucket).

        Scanning the clusters is the costliest step of the pipeline, so it runs only once
        ``min_samples`` records landed outside the dense cells of the last scan (a new
        cluster far from the known ones is made of such records), every
        ``CLUSTER_ACTIVE_RESCAN`` buckets while a flagged cluster lasts, and every
        ``CLUSTER_RESCAN`` buckets to keep the known clusters current. A cluster most of
        whose core points are shapes the service's memory knows (served more than an hour
        ago, over days) is not news."""
        at = (b + 1) * self.bucket_s
        if svc.fresh:
            svc.memory.add(svc.fresh, at)
            svc.fresh = []
        svc.memory.age(at)
        if svc.checked == b:
            return svc.flag
        svc.checked, svc.flag = b, 0.0
        since = math.inf if svc.scanned is None else b - svc.scanned
        due = since >= (CLUSTER_ACTIVE_RESCAN if svc.active is not None else CLUSTER_RESCAN)
        if not (svc.novel >= svc.detector.min_samples or due):
            return 0.0
        svc.scanned, svc.novel = b, 0
        det = svc.detector
        far = 4 * det.eps
        # A cluster must hold 1 % of the window: a fragment of the usual traffic's tail is
        # a few points; before CLUSTER_WARMUP points nothing is news.
        size = max(self.new_cluster_size, math.ceil(len(det) * CLUSTER_SHARE))
        clusters = [c for c in det.clusters() if c.size >= size]
        if len(det) < CLUSTER_WARMUP:
            svc.known = [c.centroid for c in clusters]
            return 0.0
        svc.dense = det.around(cell for c in clusters for cell in c.cells)
        known = svc.known
        new = [
            c
            for c in clusters
            if known and all(math.dist(c.centroid, k) > far for k in known)
            and not (
                svc.memory.trusted
                and svc.memory.familiar(c.points).mean() >= FAMILIAR_SHARE
            )
        ]  # fmt: skip
        svc.flag = 1.0 if new else 0.0
        svc.size = float(max(c.size for c in new)) if new else 0.0
        svc.known = [c.centroid for c in clusters]
        if new:
            biggest = max(new, key=lambda c: c.size)
            svc.active, svc.active_cells = biggest.centroid, det.around(biggest.cells)
            svc.active_instance = self._novel_instance(svc)
            svc.active_label = det.describe(svc.active)
        elif svc.active is not None:  # the flagged cluster lasts while one stays near it
            near = [c for c in clusters if math.dist(c.centroid, svc.active) <= far]
            svc.active = near[0].centroid if near else None
            svc.active_cells = det.around(near[0].cells) if near else frozenset()
        return svc.flag

    def _novel_instance(self, svc: _Service) -> str | None:
        """The instance whose recent records landed away from the known clusters most."""
        best, name = 0.0, None
        for inst in sorted(svc.instances):
            s = self.series.get((svc.name, inst))
            if s is not None and s.novel_score > best:
                best, name = s.novel_score, inst
        return name

    def _sweep(self) -> list[Transition]:
        """Forget series without envelopes for ``stale_s``; resolve their alerts."""
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
                self.swept.add(key[0])
            out += self.engine.clear(s.labels, now)
        return out


def _latency_columns(recs: Sequence[RequestRecord]) -> dict[str, list[float]]:
    """The latencies of ``recs`` by name, in the order :meth:`Bucket.add` samples them."""
    cols: dict[str, list[float]] = {"e2e": [r.e2e_ms for r in recs]}
    for r in recs:
        for stage, ms in r.stages.items():
            if stage in STAGES:
                col = cols.get(stage)
                if col is None:
                    col = cols[stage] = []
                col.append(ms)
    ttft = [r.ttft_ms for r in recs if r.ttft_ms is not None]
    queue = [r.queue_ms for r in recs if r.queue_ms is not None]
    if ttft:
        cols["ttft"] = ttft
    if queue:
        cols["queue"] = queue
    return cols


def _point_of(rec: RequestRecord) -> dict[str, Any]:
    return {"context_tokens": rec.context_tokens, "output_tokens": rec.output_tokens, "t": rec.ts}


def _window_var(f: Forecast | None, steps: float) -> float:
    """A baseline's relative variance over a window of ``steps`` buckets: its own
    uncertainty, and its excess noise per bucket averaged over the window."""
    return 0.0 if f is None else f.var + f.noise / max(1.0, steps)


def _drop_score(d: float, z: float, z_min: float) -> float:
    """[0, 1]: how far below its forecast (0.5 at -25 %), if significantly so."""
    if z > -z_min or d >= 0:
        return 0.0
    return min(1.0, -d / 0.5)
