"""From ``ragwatch.requests`` envelopes to per-service signals and alert transitions.

Plain Python (no Faust): the worker feeds batches of decoded messages into
:meth:`RequestPipeline.process_batch` (``ragwatch replay`` too), a test or the SDK one
envelope at a time into :meth:`RequestPipeline.process`.

**Columns.** Every series is a row of :class:`~.service_rows.ServiceRows`: its baselines,
count ring, scalars and signals in arrays. A batch's records go to their buckets envelope
by envelope (an envelope's points certified and learnt by the outlier detector in blocks);
a bucket the watermark closes has its outlier part closed at once, in the envelopes' order
(the service's cluster detector is shared by its instances and moves on with the next
envelope's records: :func:`~.request_close.close_outliers`), and the rest of its close
waits: the closes of the batch are then done in *rounds*, the k-th close of every row in
one set of array operations (:mod:`~.request_close`: nothing else a close reads is shared
between rows), and the rules are masks over the round's signals: only rows where a rule
holds or an alert is active reach the alert engine. A silence sweep (once a minute of
event time) waits for the closes before it. The transitions are those of one envelope at
a time, in the same order (``tests/unit/test_requests_columnar.py`` holds every signal of
every close, in batches of any size, to one envelope at a time).

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
- what the service controls, against baselines of its own
  (:mod:`~ragwatch.streams.pipelines.serving`): ``decode_*`` (the median of the requests'
  own decode speeds), ``ttft_net_p95_*`` (time to first token less the queue wait),
  ``queue_p95_*``, the retriever's tail by evidence (``retriever_tail_ratio``,
  ``retriever_tail_z``: how many retrievals exceed the baseline P99) and ``tpr_recent*``
  (tokens per request over the newest requests); ``window_errors``;
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
  (requests, errors, tokens: everything but ``rps``, which says what was served) leave
  them out, and so do the latencies their own size sets (end to end, the LLM stage, time
  to first token, decode speed: :data:`~.buckets.OWN`; a new kind 20x as long as the
  usual takes its long prefill, no slower service). The retriever's, the reranker's and
  the queue's count. Learnt, hours of a cluster that doubles a quiet service's traffic
  would read as a drop at the same time on the next day.

**Holding.** A baseline learns nothing while its window deviates by more than
``hold_band`` and ``hold_z`` standard deviations (a latency baseline: while the quantile
is more than 1.2x the baseline), so a fault that lasts does not become the baseline and
its alert resolves when the signal comes back; after ``hold_max_s`` (a day) the deviation
is accepted as the new normal, and ``<x>_relearned_at`` / ``<x>_relearned_from`` say when
and from what (an alert that resolves because of it says so: ``Alert.resolution``).
``<x>_held_s`` is how long a baseline has been held. ``weekly_sd`` sets the traffic baselines'
weekly profile (None: :mod:`~ragwatch.detectors.seasonal`'s default; 0 turns it off).

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
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from ragwatch.detectors.request_outliers import RequestOutliers
from ragwatch.detectors.service_clusters import ScoredRun, ServiceClusters
from ragwatch.detectors.tails import quantile
from ragwatch.schema import InstanceFacts, Transition
from ragwatch.streams.alerting import gating
from ragwatch.streams.alerting.engine import AlertEngine
from ragwatch.streams.alerting.rules import Rule
from ragwatch.streams.pipelines import service_snapshot as snapshots
from ragwatch.streams.pipelines.base import (
    BatchFailed,
    ChartSeries,
    Domain,
    Step,
    Steps,
    Tap,
    drive,
    transitions_of,
)
from ragwatch.streams.pipelines.buckets import (
    STAGES,
    Bucket,
    Record,
    RequestsMessage,
    Reservoir,
    drop_before,
)
from ragwatch.streams.pipelines.budget import SeriesBudget
from ragwatch.streams.pipelines.facts import instance_facts
from ragwatch.streams.pipelines.replica_signals import compare, reads_peers
from ragwatch.streams.pipelines.request_close import CloseParams, close_outliers, close_round
from ragwatch.streams.pipelines.service_rows import (
    SIGNAL_AT,
    SeriesKey,
    ServiceRows,
    ServiceView,
    ServiceViews,
)
from ragwatch.streams.pipelines.warmup import in_warmup, note_start

log = logging.getLogger(__name__)

SERIES = "service"
LABELS = ("service", "instance")
MAX_SENDERS = 64  # per instance: processes whose last envelope ts is remembered
# What one envelope may cost (a sender batches seconds of records, a few hundred): records
# more than an hour older than their envelope are dropped, and the outlier detector scores
# at most its window's worth of an envelope's records (the rest are counted, not scored).
MAX_RECORD_AGE_S = 3600.0
MAX_INSTANCES = 1024  # per service: beyond, a new instance's records are dropped (counted)
MAX_SCORED_PER_ENVELOPE = 2000
SILENT_SERVICE_FACTOR = 6  # a service silent for 6 x stale_s of the pipeline's event time
Rows = npt.NDArray[np.intp]

__all__ = [
    "STAGES",
    "Bucket",
    "RequestPipeline",
    "RequestsMessage",
    "Reservoir",
    "ServiceView",
    "quantile",
]


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
    restarts: int = 0  # senders that restarted (a newer start, a new pid) and got a warm-up
    warmup_records: int = 0  # records of a warm-up: counted, their latencies held back
    bad_starts: int = 0  # envelopes whose process started after they were sent: not used


@dataclass
class _Close:
    """A bucket to close: the envelope that closed it (its place in the batch), the row,
    the bucket number, what it gathered, its outlier signals (done at once), and whether
    it began in a warm-up (as the envelopes up to that one said: :mod:`~.warmup`)."""

    at: int
    row: int
    b: int
    bucket: Bucket
    outliers: tuple[float, ...]
    warm: bool


@dataclass
class _Wave:
    """Envelopes whose records are in: the closes they made wait, per row in order."""

    closes: dict[int, list[_Close]] = field(default_factory=dict)

    def add(self, closes: list[_Close]) -> None:
        if closes:
            self.closes.setdefault(closes[0].row, []).extend(closes)


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
        scoring: bool = True,
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
        mine = [r for r in rules if r.series == SERIES]
        # the rules on an instance against its peers go with the sweep (_replicas)
        self.replica_rules = [r for r in mine if reads_peers(r)]
        self.rules = [r for r in mine if not reads_peers(r)]
        self.engine = engine or AlertEngine()
        self.bucket_s, self.grace_s, self.stale_s = float(bucket_s), float(grace_s), stale_s
        self.gap_s = float(gap_s)
        self.max_series, self.max_instances = max_series, max_instances
        self.budget = budget or SeriesBudget(max_series)
        self.budget.watch(self.__len__)
        self.swept: set[str] = set()  # services whose last instance went silent
        self.tap: Tap | None = None
        self.reservoir = reservoir
        self.params = CloseParams(
            self.bucket_s, rate_target, rate_min, rate_max_s, observation_requests,
            observation_max_s, hold_band, hold_z, new_cluster_size,
        )  # fmt: skip
        self.rows = ServiceRows(
            bucket_s=self.bucket_s,
            rate_max_s=rate_max_s,
            tail=(tail_requests, float(tail_s), float(tail_max_s)),
            min_baseline=min_baseline,
            hold_max_s=hold_max_s,
            weekly_sd=weekly_sd,
            reservoir=reservoir,
            scoring=scoring,
        )
        self._outliers = outliers if outliers is not None else RequestOutliers()
        self._rng = random.Random(seed)
        self._services: dict[str, ServiceClusters] = {}
        self.sweep_mark = math.inf  # see GpuPipeline.sweep_mark
        self._watermark = -math.inf
        self._last_sweep = -math.inf
        self._wave = _Wave()
        self._out: list[tuple[int, int, Transition]] = []  # (envelope, round, transition)
        self.stats = PipelineStats()

    def __len__(self) -> int:
        """The series tracked."""
        return len(self.rows)

    @property
    def watermark(self) -> float:
        """The newest event time seen (0 before any)."""
        return max(0.0, self._watermark)

    @property
    def series(self) -> Mapping[SeriesKey, ServiceView]:
        """Every series, by (service, instance), as views of their rows."""
        return ServiceViews(self.rows)

    def facts(self, service: str, instance: str) -> InstanceFacts | None:
        """What the instance's requests say now, for hints (None: not tracked)."""
        view = self.series.get((service, instance))
        return instance_facts(view) if view is not None else None

    def facts_of(
        self, service: str, taken: Mapping[tuple[str, str], float | None] | None = None
    ) -> list[InstanceFacts]:
        """The facts of every instance of ``service``, in instance order. With ``taken``
        ((service, instance) -> the bucket end its facts were last taken at), only of the
        instances that closed a bucket since: a worker asks after every wave, and a
        bucket closes once a minute, so signals and scores are read only then."""
        rows, series = self.rows, self.series
        out = []
        for i, row in self._instances(service):
            if taken is not None:
                end = rows.bucket_end(row)  # None: no bucket closed yet
                if end is None or taken.get((service, i)) == end:
                    continue
            out.append(instance_facts(series[(service, i)]))
        return out

    def facts_on(self, host: str) -> list[InstanceFacts]:
        """The facts of every instance whose requests name ``host``, in key order."""
        views = sorted(self.series.items())
        return [instance_facts(v) for _, v in views if v.host == host]

    # ------------------------------------------------------------------ processing

    def process(self, env: RequestsMessage) -> list[Transition]:
        """Add one envelope's records; return the transitions of the buckets it closed."""
        return self.process_batch([env])

    def process_batch(self, envs: Sequence[RequestsMessage]) -> list[Transition]:
        """:meth:`process` of each envelope in turn, the transitions in that order; the
        closes of the batch are done together (rounds), before each sweep and at the end."""
        return transitions_of(drive(self.process_steps(envs)))

    def process_steps(self, envs: Sequence[RequestsMessage]) -> Steps:
        """:meth:`process_batch`, part by part (the closes before each sweep, the sweep,
        the closes at the end), each part's step handed on as it is done (whoever drives
        it acts on it before the next part: :func:`.base.drive`): its transitions, with
        the facts of the instances whose alerts start firing in it (:meth:`facts`), for
        their hints."""
        moved = [(env.service, env.ts) for env in envs]
        try:
            for i, env in enumerate(envs):
                self._envelope(i, env)
                if self._watermark - self._last_sweep >= self.bucket_s:
                    yield self._step(moved, self._flush())
                    swept = self._sweep()
                    swept += self._replicas()
                    if swept:
                        yield self._step(moved, swept)
            yield self._step(moved, self._flush())
        except GeneratorExit:  # whoever drove it failed: the rest of the batch is not done
            self._wave.closes.clear()
            self._out.clear()
            raise
        except Exception as exc:
            self._wave.closes.clear()  # not the next batch's
            self._out.clear()
            raise BatchFailed([]) from exc

    def _step(self, moved: list[tuple[str, float]], transitions: list[Transition]) -> Step:
        """A part of a batch is done: its step, with the facts its firing alerts' hints
        will read, and its points for the charts (every service of the batch: its buckets
        may have closed)."""
        keys = {
            (lab["service"], lab["instance"])
            for t in transitions
            if t.fires and "service" in (lab := t.alert.labels) and "instance" in lab
        }
        facts = {k: f for k in sorted(keys) if (f := self.facts(*k)) is not None}
        if self.tap is not None:
            self.tap(self, moved)
        return Step(moved, transitions, instances=facts)

    def _envelope(self, at: int, env: RequestsMessage) -> None:
        """One envelope's records into their buckets; its closes join the wave."""
        self.stats.envelopes += 1
        self.stats.records += len(env.records)
        row = self._row(env.service, env.instance)
        rows = self.rows
        if row is not None and env.ts <= rows.senders[row].get(env.pid, -math.inf):
            # Seen already (Kafka redelivers after a crash, producers retry): a process
            # sends its envelopes in order, so an older one cannot be new.
            self.stats.duplicates += len(env.records)
            return
        if row is None:
            self.stats.dropped_records += len(env.records)
            return
        senders, col = rows.senders[row], rows.col
        start = note_start(col["started"], col["warm_until"], row, env, senders)
        self.stats.restarts += start == "restart"
        self.stats.bad_starts += start == "bad"
        senders[env.pid] = env.ts
        if len(senders) > MAX_SENDERS:  # forget the longest-silent process
            del senders[min(senders, key=senders.__getitem__)]
        if env.host:
            rows.host[row] = env.host
        svc = self._services[env.service]
        newest = max(env.ts, max((r.ts for r in env.records), default=env.ts))
        records = self._recent(env, newest)  # (the newest record is always kept)
        if rows.next_bucket[row] is None:  # a new series starts at its first record's bucket
            first = min((r.ts for r in records), default=env.ts)
            rows.next_bucket[row] = math.floor(first / self.bucket_s)
        self._advance(row, newest)
        self._add(row, svc, records)
        self.stats.unscored_records += max(0, len(records) - MAX_SCORED_PER_ENVELOPE)
        self._wave.add(self._ready(at, row, svc))

    def _recent(self, env: RequestsMessage, newest: float) -> Sequence[Record]:
        """The envelope's records from ``MAX_RECORD_AGE_S`` before its newest time (its
        ``ts`` or a later record's) on; older ones are dropped and counted (``too_old``): a
        sender batches seconds or minutes, and each minute a record reaches back is a
        bucket to open and close, so one envelope of records a minute apart could otherwise
        cost a month of buckets (an envelope dated 1970 with a record of now: 29 million)."""
        horizon = newest - MAX_RECORD_AGE_S
        if all(r.ts >= horizon for r in env.records):
            return env.records
        kept = [r for r in env.records if r.ts >= horizon]
        self.stats.too_old += len(env.records) - len(kept)
        return kept

    def _advance(self, row: int, ts: float) -> None:
        """The sender reported up to ``ts``: a silence longer than ``gap_s`` since its
        previous report is a gap (its buckets are not observed), not zero traffic."""
        marks = self.rows.col["watermark"]
        mark = float(marks[row])
        if ts <= mark:
            return
        if mark > -math.inf and ts - mark > self.gap_s:
            first = math.floor(mark / self.bucket_s) + 1
            last = math.floor(ts / self.bucket_s) - 1
            if last >= first:
                self.rows.gaps[row].append((first, last))
        marks[row] = ts
        self._watermark = max(self._watermark, ts)

    def _add(self, row: int, svc: ServiceClusters, records: Sequence[Record]) -> None:
        """The records into their buckets, a run of consecutive records of one bucket at a
        time; the first ``MAX_SCORED_PER_ENVELOPE`` are scored by the outlier detector."""
        bs, floor = self.bucket_s, math.floor
        ids = [floor(r.ts / bs) for r in records]
        buckets, oldest = self.rows.buckets[row], self.rows.next_bucket[row]
        i = 0
        while i < len(ids):
            b = ids[i]
            j = i + 1
            while j < len(ids) and ids[j] == b:
                j += 1
            if oldest is not None and b < oldest:
                self.stats.late_dropped += j - i
            else:
                bucket = buckets.get(b)
                if bucket is None:
                    bucket = buckets[b] = Bucket(self.reservoir, self._rng)
                run = records[i:j]
                flags = self._score(svc, bucket, run[: max(0, MAX_SCORED_PER_ENVELOPE - i)])
                bucket.add_run(run, flags + [False] * (len(run) - len(flags)))
            i = j

    @staticmethod
    def _score(svc: ServiceClusters, bucket: Bucket, records: Sequence[Record]) -> list[bool]:
        """Score and learn the ``ok`` records in turn; which of them land in the service's
        active outlier cluster (``Bucket.add``'s ``clustered``)."""
        ok = [k for k, r in enumerate(records) if r.status == "ok"]
        points = [(float(records[k].context_tokens), float(records[k].output_tokens)) for k in ok]
        run = svc.score(points, ScoredRun(), labelled=bucket.outliers)
        bucket.outliers += run.outliers
        bucket.novel += run.novel
        bucket.labels.update(run.labels)
        if len(ok) == len(records):
            return run.clustered
        flags = [False] * len(records)
        for k, c in zip(ok, run.clustered, strict=True):
            flags[k] = c
        return flags

    # ------------------------------------------------------------------ closes

    def _ready(self, at: int, row: int, svc: ServiceClusters) -> list[_Close]:
        """The buckets of ``row`` the watermark closed (a gap's are skipped: unobserved),
        their outlier part closed at once (``close_outliers``: the service's detector
        moves on with the next envelope), the rest waiting for its round."""
        rows = self.rows
        limit = math.floor((float(rows.col["watermark"][row]) - self.grace_s) / self.bucket_s)
        b = rows.next_bucket[row]
        out: list[_Close] = []
        if b is None:
            return out
        buckets, gaps = rows.buckets[row], rows.gaps[row]
        while b < limit:
            bucket = buckets.pop(b, None)
            if bucket is None:
                while gaps and gaps[0][1] < b:
                    gaps.popleft()
                if gaps and gaps[0][0] <= b:
                    b = min(limit, gaps[0][1] + 1)  # skip the rest of the gap
                    self.stats.late_dropped += drop_before(buckets, b)
                    continue
            bucket = bucket or Bucket(self.reservoir, self._rng)
            signals = close_outliers(rows, self.params, row, b, bucket, svc)
            begins, col = b * self.bucket_s, rows.col
            warm = in_warmup(col["started"], col["warm_until"], row, begins, begins + self.bucket_s)
            out.append(_Close(at, row, b, bucket, signals, warm))
            b += 1
        rows.next_bucket[row] = b
        return out

    def _flush(self) -> list[Transition]:
        """Close the wave's buckets, a round at a time (the k-th close of each row), and
        evaluate the rules; the transitions in the order of one envelope at a time."""
        pending = list(self._wave.closes.values())
        self._wave.closes.clear()
        k = 0
        while pending:
            self._round(k, [c[k] for c in pending])
            k += 1
            pending = [c for c in pending if len(c) > k]
        self._out.sort(key=lambda x: (x[0], x[1]))  # stable: rule order kept
        out = [t for _, _, t in self._out]
        self._out.clear()
        return out

    def _round(self, k: int, closes: list[_Close]) -> None:
        rows = np.array([c.row for c in closes], dtype=np.intp)
        outliers = np.array([c.outliers for c in closes], dtype=np.float64)
        self.stats.buckets_closed += len(closes)
        warm = np.array([c.warm for c in closes], dtype=np.bool_)
        self.stats.warmup_records += sum(c.bucket.n + c.bucket.clustered for c in closes if c.warm)
        ends = close_round(
            self.rows, self.params, rows, [c.b for c in closes], [c.bucket for c in closes],
            outliers, warm,
        )  # fmt: skip
        if self.rules:
            self._evaluate(k, closes, rows, ends)

    def _evaluate(
        self, k: int, closes: list[_Close], rows: Rows, ends: npt.NDArray[np.float64]
    ) -> None:
        """The rules on the round's rows: only where one holds or an alert is active
        (:mod:`~ragwatch.streams.alerting.gating`), each row's signals read as it comes."""
        st = self.rows
        picked = gating.pick(self.rules, rows, st.columns(rows), st.watch)
        dicts = (st.signal_dict(p.row) for p in picked)
        fired = gating.evaluate(self.engine, picked, dicts, self._alert_keys, ends, st.watch)
        self._out += [(closes[i].at, k, tr) for i, tr in fired]

    def _alert_keys(self, row: int, rules: Sequence[Rule]) -> dict[str, tuple[dict[str, str], str]]:
        """The alert labels and fingerprint of each of ``rules`` (the pipeline's) on
        ``row`` (cached)."""
        keys = self.rows.keys[row]
        if len(keys) < len(rules):
            service, instance = self.rows.index.key(row)
            labels = {"service": service, "instance": instance}
            for rule in rules:
                if rule.name not in keys:
                    keys[rule.name] = self.engine.alert_key(rule, labels)
        return keys

    # ------------------------------------------------------------------ series

    def _room(self) -> int:
        """How many more series fit: under ``max_series`` and the worker's budget."""
        return min(self.max_series - len(self.rows), self.budget.room())

    def _row(self, service: str, instance: str) -> int | None:
        row = self.rows.index.get((service, instance))
        if row is not None:
            return row
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
        row = self.rows.add((service, instance), at=-math.inf)
        if svc is None:
            svc = self._services[service] = ServiceClusters(self._outliers.clone(), service)
        svc.instances.add(instance)
        return row

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
        index, marks = self.rows.index, self.rows.col["watermark"]
        keys = list(index)
        at = np.array([index.get(k) for k in keys], dtype=np.intp)
        seen = marks[at].tolist() if keys else []
        newest: dict[str, float] = {}
        for (service, _), mark in zip(keys, seen, strict=True):
            newest[service] = max(newest.get(service, -math.inf), mark)
        for key, mark in zip(keys, seen, strict=True):
            top = newest[key[0]]
            if top - mark > self.stale_s or now - top > SILENT_SERVICE_FACTOR * self.stale_s:
                self.rows.remove(key)
                self.stats.evicted_series += 1
                svc = self._services[key[0]]
                svc.instances.discard(key[1])
                if not svc.instances:
                    del self._services[key[0]]
                    self.swept.add(key[0])
                out += self.engine.clear({"service": key[0], "instance": key[1]}, now)
        return out

    # ------------------------------------------------------------------ reads

    def tracks(self, service: str) -> bool:
        return service in self._services

    def _replicas(self) -> list[Transition]:
        """With each sweep (a bucket of event time; every close of the envelopes before
        it is done then, however they were batched): each service's instances against one
        another (:func:`.replica_signals.compare`), and the rules that read it on each
        instance compared, at its newest bucket's end."""
        st, out = self.rows, []
        ends = st.col["bucket_end"]
        for service in sorted(self._services):
            named = self._instances(service)
            judged = compare(st.signals, SIGNAL_AT.__getitem__, ends, [r for _, r in named],
                             self.bucket_s)  # fmt: skip
            for instance, row in named if self.replica_rules else ():
                if row not in judged:
                    continue
                signals = st.signal_dict(row)
                labels = {"service": service, "instance": instance}
                for rule in self.replica_rules:
                    t = self.engine.evaluate(rule, labels, signals, float(ends[row]))
                    if t is not None:
                        out.append(t)
        return out

    def _instances(self, service: str) -> list[tuple[str, int]]:
        svc = self._services.get(service)
        index = self.rows.index
        return [
            (i, r)
            for i in sorted(svc.instances if svc else ())
            if (r := index.get((service, i))) is not None
        ]

    def service_snapshot(self, service: str) -> dict[str, Any]:
        """What ``ragwatch status`` shows about one service: each instance's last bucket."""
        rows = self.rows
        instances = [
            {
                "instance": inst,
                "host": rows.host[row],
                "bucket_end": rows.bucket_end(row),
                "signals": rows.signal_dict(row),
                "scores": rows.scores.scored(row),  # signal: [score, yhat, lower, upper]
                "outlier_label": rows.label[row],
                "open_buckets": len(rows.buckets[row]),
            }
            for inst, row in self._instances(service)
        ]
        svc = self._services.get(service)  # its requests, for the live page's scatter
        scatter = svc.scatter() if svc is not None else None
        return {"service": service, "instances": instances, "requests": scatter}

    def service_state(self, service: str) -> tuple[dict[SeriesKey, ServiceView], Any]:
        """The service's series (views) and shared outlier state."""
        views = {
            (service, i): ServiceView(self.rows, r, (service, i))
            for i, r in self._instances(service)
        }
        return views, self._services.get(service)

    # -- the SignalPipeline seam (streams/pipelines/base.py) -----------------------------

    name: ClassVar[str] = "requests"
    domain: ClassVar[Domain] = "service"

    def dump(self, key: str) -> dict[str, Any]:
        """A service's rows and shared outlier state, as plain data (a snapshot)."""
        svc = self._services.get(key)
        return snapshots.dump(self.rows, key, self._instances(key), svc)

    def adopt(self, service: str, state: Any) -> int:
        """Take over a service from a snapshot (:meth:`dump`, or the previous format's
        objects), unless this pipeline already tracks it (its own state is newer).
        Returns how many series it adopted."""
        if service in self._services:
            return 0
        got = snapshots.adopt(
            self.rows, service, state, self._room(), self._rng, self.max_instances
        )
        if got is None:
            return 0
        shared, rows = got
        if not rows:
            return 0
        shared.instances = {self.rows.index.key(r)[1] for r in rows}
        self._services[service] = shared
        self.rows.watch[rows] = True  # the engine may restore its alerts next
        return len(rows)

    def status(self, keys: Collection[str]) -> dict[str, dict[str, Any]]:
        return {k: self.service_snapshot(k) for k in keys}

    def charts(self, keys: Collection[str]) -> Iterable[ChartSeries]:
        for key in keys:
            for inst, row in self._instances(key):
                end = self.rows.bucket_end(row)
                if end is not None:
                    yield ChartSeries(
                        "service",
                        {"service": key, "instance": inst},
                        end,
                        ServiceView(self.rows, row, (key, inst)),
                    )

    def forget(self, service: str) -> None:
        """Drop a service's series and outlier state without resolving anything (another
        worker owns it now)."""
        self._services.pop(service, None)
        for k in [k for k in self.rows.index if k[0] == service]:
            self.rows.remove(k)
