"""The request series of version-6 snapshots: one object per series.

Before issue 17's columnar engine a worker kept a :class:`ServiceSeries` per (service,
instance) and its snapshots pickled them. A worker of this version still reads such a
snapshot once (it moves each object's state into a row:
:func:`~ragwatch.streams.pipelines.service_snapshot.adopt`) and writes rows from then on;
these classes are here only so that the snapshot reader can rebuild those objects (their
fields, no behaviour). The next snapshot version drops them.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from ragwatch.detectors.seasonal import SeasonalBaseline
from ragwatch.streams.pipelines.buckets import Bucket
from ragwatch.streams.pipelines.evidence import CountRing, LatencyBaseline, TailWindow

RECENT_BUCKETS = 5
TOKEN_CV2 = 0.05
ERROR_PRIOR = 0.005


@dataclass
class _Pending:
    """Buckets gathered into one observation for a baseline (until it held enough)."""

    start: float | None = None
    end: float = 0.0
    n: int = 0
    tokens: float = 0.0
    tokens_sq: float = 0.0
    expected: float = 0.0


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
