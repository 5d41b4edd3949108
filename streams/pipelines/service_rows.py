"""Request series as rows: the state of every (service, instance) in arrays.

A row per series (:class:`~ragwatch.streams.pipelines.rows.RowIndex` keeps the key ->
row map and a free list). What a bucket close reads and writes is in columns, so the
closes of many series are one set of array operations
(:mod:`~ragwatch.streams.pipelines.request_close`):

- scalars (event-time watermark, the last bucket's end, the
  totals, the usual share of errors, the tokens' spread, the observations pending for
  the two traffic baselines, when a baseline last accepted a new level) in 1-D arrays;
- the newest signals in a ``(rows, len(SIGNALS))`` matrix, NaN where a signal has no value;
- the count rings in a :class:`~ragwatch.detectors.counts.CountBank`, the
  traffic baselines (requests per second, tokens per request) in a
  :class:`~ragwatch.detectors.seasonal.SeasonalBank` and the latency baselines
  (retriever P99, end-to-end P95) in a
  :class:`~ragwatch.detectors.latency.LatencyBank`, two rows a series each
  (:meth:`ServiceRows.both`: a close calls each bank once for both); the baselines of
  what the service controls (decode time per token, TTFT less queue wait, queue wait:
  :data:`SERVING`) in a second latency bank, three rows a series (:meth:`ServiceRows.three`).

What is not a number stays per row in lists: the open buckets (a minute's accumulators,
one or two a series), the tail window of recent latencies (its length follows the
traffic), the next bucket to close, gaps, the senders' last envelope times, the host and
the outlier label.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from ragwatch.catalog import SCORED
from ragwatch.detectors.counts import CountBank
from ragwatch.detectors.latency import LatencyBank
from ragwatch.detectors.recurrence import HOLD_COLUMNS
from ragwatch.detectors.seasonal import SeasonalBank, SeasonalBaseline
from ragwatch.detectors.tails import TailWindow
from ragwatch.schema import AnomalyFact
from ragwatch.streams.pipelines.buckets import Bucket
from ragwatch.streams.pipelines.replica_signals import REPLICA_SIGNALS
from ragwatch.streams.pipelines.rows import RowIndex
from ragwatch.streams.pipelines.scoring import ScoreBlock, score_names

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
Rows = npt.NDArray[np.intp]
SeriesKey = tuple[str, str]  # service, instance
RECENT_BUCKETS = 5  # recent_outliers: over this many buckets
TOKEN_CV2 = 0.05  # tokens per request: variance / mean^2 until the series has measured it
ERROR_PRIOR = 0.005  # the share of failed requests assumed before a series has measured it

# The signals of a request series, in the order a close computes them (status and the
# alerts' annotations list them so).
SIGNALS: tuple[str, ...] = (
    "requests_total", "errors_total", "output_tokens_total",
    "window_s", "window_requests", "rps", "clustered_requests", "output_tokens_per_s",
    "errors_ratio", "errors_baseline", "errors_z", "tokens_per_request",
    "context_tokens_per_request",
    "rps_forecast", "rps_deviation", "rps_z",
    "tpr_forecast", "tpr_deviation", "tpr_z", "tpr_score",
    "tps_forecast", "tps_deviation", "tps_z", "tps_score",
    "rps_relearned_at", "rps_relearned_from", "tpr_relearned_at", "tpr_relearned_from",
    "tps_relearned_at", "tps_relearned_from", "rps_held_s", "tpr_held_s", "tps_held_s",
    "e2e_p50_ms", "e2e_p95_ms", "e2e_p99_ms",
    "retriever_p50_ms", "retriever_p95_ms", "retriever_p99_ms", "retriever_share",
    "reranker_p50_ms", "reranker_p95_ms", "reranker_p99_ms", "reranker_share",
    "llm_p50_ms", "llm_p95_ms", "llm_p99_ms", "llm_share",
    "ttft_p95_ms", "queue_p95_ms",
    "retriever_p99_baseline_ms", "retriever_p99_ratio", "retriever_p99_held_s",
    "retriever_p99_relearned_at", "retriever_p99_relearned_from", "retriever_p99_recurring",
    "retriever_tail_ratio", "retriever_tail_z", "e2e_tail_ratio", "e2e_tail_z",
    "retriever_tail_recovered", "e2e_tail_recovered", "retriever_tail_cusum", "e2e_tail_cusum",
    "retriever_p99_z", "e2e_p95_z",
    "e2e_p95_baseline_ms", "e2e_p95_ratio", "e2e_p95_held_s",
    "e2e_p95_relearned_at", "e2e_p95_relearned_from",
    "outliers", "outlier_ratio", "recent_outliers",
    "new_outlier_cluster", "outlier_cluster_size", "outlier_cluster_active",
    # what the service controls against its baselines (streams/pipelines/serving.py)
    "decode_tps", "decode_baseline_tps", "decode_deviation", "decode_z", "decode_requests",
    "decode_held_s", "decode_relearned_at", "decode_relearned_from", "decode_recurring",
    "ttft_net_p95_ms", "ttft_net_p95_baseline_ms", "ttft_net_p95_ratio",
    "ttft_net_p95_excess_ms", "ttft_net_p95_held_s", "ttft_net_p95_relearned_at",
    "ttft_net_p95_relearned_from", "ttft_net_p95_recurring",
    "queue_recent_p95_ms", "queue_p95_baseline_ms", "queue_p95_ratio", "queue_p95_excess_ms",
    "queue_p95_held_s", "queue_p95_relearned_at", "queue_p95_relearned_from",
    "queue_p95_recurring", "queue_tail_ratio", "queue_tail_z", "queue_tail_recovered",
    "queue_tail_cusum",
    "window_errors", "tpr_recent", "tpr_recent_deviation", "tpr_recent_z",
    # against the other instances of the service (streams/pipelines/replica_signals.py)
    *REPLICA_SIGNALS,
    # the generic detector's scores of the signals it scores (streams/pipelines/scoring.py)
    *score_names(SCORED["service"]),
)  # fmt: skip
SIGNAL_AT = {name: i for i, name in enumerate(SIGNALS)}
# the columns of the scored signals, and of their scores
SCORED_AT = np.array([SIGNAL_AT[n] for n in SCORED["service"]], dtype=np.intp)
SCORE_AT = np.array([SIGNAL_AT[n] for n in score_names(SCORED["service"])], dtype=np.intp)
FAMILIES = ("rps", "tpr", "tps")  # the traffic baselines' families (relearned_at/from)
# what the service controls, a row each of the serving bank (ServiceRows.three): the
# decode time per output token (signals ``decode_*``), the time to first token less the
# queue wait (``ttft_net_p95_*``) and the queue wait (``queue_p95_*``)
SERVING = ("decode", "ttft_net_p95", "queue_p95")

# per-row scalar columns: name -> (dtype, fresh value)
SCALARS: dict[str, tuple[Any, float | int]] = {
    "watermark": (np.float64, -math.inf),
    "bucket_end": (np.float64, math.nan),  # end of the last closed bucket (NaN: none yet)
    "requests_total": (np.int64, 0),
    "errors_total": (np.int64, 0),
    "output_tokens_total": (np.float64, 0.0),
    "error_base": (np.float64, ERROR_PRIOR),
    "novel_score": (np.float64, 0.0),  # novel records, decaying by NOVEL_DECAY a bucket
    "token_cv2": (np.float64, TOKEN_CV2),
    "cluster_size": (np.float64, math.nan),  # its latest outlier cluster's, when it appeared
    # when the sending process started, and the end of its warm-up after a restart (.warmup)
    "started": (np.float64, math.nan),
    "warm_until": (np.float64, -math.inf),
    # the recent answers' log tokens (their middle half's mean) against the tokens
    # baseline's log: their usual offset, dispersion and how many closes taught them
    # (serving._log_test)
    "tpr_log_offset": (np.float64, math.nan),
    "tpr_log_disp": (np.float64, 1.0),
    "tpr_log_learnt": (np.int64, 0),
    **{
        f"{family}_{name}": (dtype, fresh)
        for family in ("rps", "tpr")  # buckets gathered into one observation of a baseline
        for name, dtype, fresh in (
            ("pending_start", np.float64, math.nan),
            ("pending_end", np.float64, 0.0),
            ("pending_n", np.int64, 0),
            ("pending_tokens", np.float64, 0.0),
            ("pending_tokens_sq", np.float64, 0.0),
            ("pending_expected", np.float64, 0.0),
        )
    },
    **{f"{f}_relearned_{x}": (np.float64, math.nan) for f in FAMILIES for x in ("at", "from")},
    # the tail tests' usual share above the baseline quantile, the count's usual variance
    # over its mean, how many windows taught them, the CUSUM of the requests above it and
    # the values the window had seen when it last moved (serving._tail)
    **{
        f"{name}_tail_{x}": (dtype, fresh)
        for name in ("retriever", "e2e", "queue")
        for x, dtype, fresh in (
            ("share", np.float64, math.nan),
            ("disp", np.float64, math.nan),
            ("learnt", np.int64, 0),
            ("cusum", np.float64, 0.0),
            ("seen", np.int64, -1),
        )
    },
    # each serving baseline's hold under way (its start, highest value over the baseline,
    # last close) and the last two that lasted an hour or more (detectors/recurrence.py),
    # and the retriever P99's
    **{
        f"{family}_hold{x}": (np.float64, math.nan)
        for family in (*SERVING, "retriever_p99")
        for x in HOLD_COLUMNS
    },
}


def _free(n: int) -> list[Any]:
    """``n`` free rows' slots of a per-row list (None until a series takes the row)."""
    return [None] * n


class SignalColumns(Mapping[str, F64]):
    """Some rows' signals (``block``: a row each, :data:`SIGNALS` across) by name, each a
    view of its column.

    >>> cols = SignalColumns(np.zeros((2, len(SIGNALS))))
    >>> cols["rps"].tolist(), len(cols) == len(SIGNALS)
    ([0.0, 0.0], True)
    """

    def __init__(self, block: F64) -> None:
        self._block = block

    def __getitem__(self, name: str) -> F64:
        out: F64 = self._block[:, SIGNAL_AT[name]]
        return out

    def __iter__(self) -> Iterator[str]:
        return iter(SIGNALS)

    def __len__(self) -> int:
        return len(SIGNALS)


class ServiceRows:
    """The state of every request series (see the module docstring)."""

    def __init__(
        self,
        *,
        bucket_s: float,
        rate_max_s: float,
        tail: tuple[int, float, float],
        min_baseline: int,
        hold_max_s: float,
        weekly_sd: float | None = None,
        reservoir: int = 5000,
        capacity: int = 8,
        scoring: bool = True,
    ) -> None:
        self.bucket_s, self.tail_params, self.reservoir = bucket_s, tail, reservoir
        self.index: RowIndex[SeriesKey] = RowIndex(capacity)
        weekly = {} if weekly_sd is None else {"weekly_sd": weekly_sd}  # None: the default
        proto = SeasonalBaseline(step_s=bucket_s, hold_max_s=hold_max_s, **weekly)
        # two rows a series each: row 2r the requests baseline (retriever P99) of series
        # r, row 2r + 1 its tokens-per-request baseline (end-to-end P95), so a close
        # calls each bank once for both
        self.traffic = SeasonalBank(proto, 2 * capacity)
        self.latency = LatencyBank(2 * capacity, min_entries=min_baseline, hold_max_s=hold_max_s)
        self.serving = LatencyBank(
            len(SERVING) * capacity, min_entries=min_baseline, hold_max_s=hold_max_s
        )
        self.counts = CountBank(math.ceil(rate_max_s / bucket_s), bucket_s, capacity)
        self.col: dict[str, npt.NDArray[Any]] = {
            name: np.full(capacity, fresh, dtype=dtype) for name, (dtype, fresh) in SCALARS.items()
        }
        self.recent: I64 = np.zeros((capacity, RECENT_BUCKETS), dtype=np.int64)
        self.signals: F64 = np.full((capacity, len(SIGNALS)), np.nan)
        self.watch = np.zeros(capacity, dtype=np.bool_)  # an alert of the row may be active
        self.scores = ScoreBlock(SCORED["service"], on=scoring)  # the generic detector's
        self.scores.grow(capacity)
        # per-row objects, made when a series takes the row (a free row holds None)
        self.buckets: list[dict[int, Bucket]] = _free(capacity)
        self.tails: list[TailWindow] = _free(capacity)
        self.gaps: list[deque[tuple[int, int]]] = _free(capacity)
        self.senders: list[dict[int | None, float]] = _free(capacity)
        self.keys: list[dict[str, tuple[dict[str, str], str]]] = _free(capacity)
        self.host: list[str | None] = [None] * capacity
        self.label: list[str | None] = [None] * capacity
        # the oldest bucket not closed yet (None before the first record): a Python int, as
        # event times have no upper bound a bucket number in int64 would have
        self.next_bucket: list[int | None] = [None] * capacity
        self.capacity = capacity

    def _tail(self) -> TailWindow:
        n, min_s, max_s = self.tail_params
        return TailWindow(n, min_s, max_s, bucket_s=self.bucket_s)

    def __len__(self) -> int:
        return len(self.index)

    # -- rows -----------------------------------------------------------------------------

    def add(self, key: SeriesKey, at: float) -> int:
        """A fresh row for a new series."""
        row = self.index.add(key, at=at)
        if row >= self.capacity:
            self._grow(max(row + 1, 2 * self.capacity))
        self.buckets[row], self.tails[row], self.gaps[row] = {}, self._tail(), deque()
        self.senders[row], self.keys[row] = {}, {}
        return row

    def remove(self, key: SeriesKey) -> int:
        """Free a series' row (reset: the next series to take it starts fresh)."""
        row = self.index.remove(key)
        self.reset(row)
        return row

    def reset(self, row: int) -> None:
        r = np.array([row], dtype=np.intp)
        for name, (_, fresh) in SCALARS.items():
            self.col[name][row] = fresh
        self.recent[row] = 0
        self.signals[row] = np.nan
        self.watch[row] = False
        self.counts.reset(r)
        for bank in (self.traffic, self.latency):
            bank.reset(self.both(r))
        self.serving.reset(self.three(r))
        self.scores.release(r)
        for objects in (self.buckets, self.tails, self.gaps, self.senders, self.keys):
            objects[row] = None  # type: ignore[call-overload]  # a free row
        self.host[row] = self.label[row] = self.next_bucket[row] = None

    def _grow(self, capacity: int) -> None:
        old = self.capacity
        for name, (dtype, fresh) in SCALARS.items():
            a = np.full(capacity, fresh, dtype=dtype)
            a[:old] = self.col[name]
            self.col[name] = a
        self.recent = np.concatenate(
            [self.recent, np.zeros((capacity - old, RECENT_BUCKETS), np.int64)]
        )
        self.signals = np.concatenate(
            [self.signals, np.full((capacity - old, len(SIGNALS)), np.nan)]
        )
        self.watch = np.concatenate([self.watch, np.zeros(capacity - old, dtype=np.bool_)])
        self.counts.reserve(capacity)
        self.traffic.reserve(2 * capacity)
        self.latency.reserve(2 * capacity)
        self.serving.reserve(len(SERVING) * capacity)
        self.scores.grow(capacity)
        more = capacity - old
        for objects in (self.buckets, self.tails, self.gaps, self.senders, self.keys):
            objects += _free(more)
        self.host += [None] * more
        self.label += [None] * more
        self.next_bucket += [None] * more
        self.capacity = capacity

    @staticmethod
    def both(rows: Rows) -> Rows:
        """The rows of the two-row banks that ``rows`` own: their first baselines (the
        requests', the retriever P99's), then their second (tokens per request, the
        end-to-end P95)."""
        return np.concatenate([2 * rows, 2 * rows + 1])

    @staticmethod
    def three(rows: Rows) -> Rows:
        """The rows of the serving bank that ``rows`` own, by :data:`SERVING`: every
        row's decode baseline, then every row's TTFT, then every row's queue wait."""
        k = len(SERVING)
        return np.concatenate([k * rows + i for i in range(k)])

    # -- reads ----------------------------------------------------------------------------

    def columns(self, rows: Rows) -> Mapping[str, F64]:
        """The newest signals of ``rows``, a column each, gathered when read (a rule's
        mask reads two or three of ~200)."""
        return SignalColumns(self.signals[rows])

    def signal_dict(self, row: int) -> dict[str, float | None]:
        """The row's newest signals (None where unknown; empty before its first close)."""
        if math.isnan(self.col["bucket_end"][row]):
            return {}
        values = self.signals[row].tolist()
        return {name: None if v != v else v for name, v in zip(SIGNALS, values, strict=True)}

    def bucket_end(self, row: int) -> float | None:
        v = float(self.col["bucket_end"][row])
        return None if v != v else v

    def nbytes(self) -> int:
        """Bytes held by the arrays (the banks' included), not by the per-row lists."""
        banks = (self.traffic, self.latency, self.serving, self.counts)
        own = sum(a.nbytes for a in self.col.values()) + self.recent.nbytes + self.signals.nbytes
        return own + sum(b.nbytes() for b in banks) + self.scores.nbytes()


class ServiceView:
    """One request series as readers outside the pipeline see it (hints, charts, status):
    its labels, host, newest signals (read from its row when asked) and outlier label."""

    __slots__ = ("_row", "_rows", "_signals", "labels")

    def __init__(self, rows: ServiceRows, row: int, key: SeriesKey) -> None:
        self._rows, self._row = rows, row
        self.labels = {"service": key[0], "instance": key[1]}
        self._signals: dict[str, float | None] | None = None

    @property
    def signals(self) -> dict[str, float | None]:
        """Its newest signals (read from the row once: a view is read, then dropped)."""
        if self._signals is None:
            self._signals = self._rows.signal_dict(self._row)
        return self._signals

    @property
    def bucket_end(self) -> float | None:
        return self._rows.bucket_end(self._row)

    def bands(self) -> dict[str, list[float | None]]:
        """Its scored signals' newest score, expected value and band (.scoring)."""
        return self._rows.scores.scored(self._row)

    @property
    def host(self) -> str | None:
        return self._rows.host[self._row]

    @property
    def outlier_label(self) -> str | None:
        return self._rows.label[self._row]

    @property
    def buckets(self) -> dict[int, Bucket]:
        """Its open buckets, by bucket number."""
        return self._rows.buckets[self._row]

    @property
    def row(self) -> int:
        return self._row

    @property
    def anomalous(self) -> tuple[AnomalyFact, ...]:
        """Its scored signals whose peak of the last hour reached the advisor's bar."""
        return tuple(self._rows.scores.anomalous([self._row], [self.labels["instance"]]))


class ServiceViews(Mapping[SeriesKey, ServiceView]):
    """The pipeline's series by key, as views (``RequestPipeline.series``)."""

    def __init__(self, rows: ServiceRows) -> None:
        self._rows = rows

    def __getitem__(self, key: SeriesKey) -> ServiceView:
        row = self._rows.index.get(key)
        if row is None:
            raise KeyError(key)
        return ServiceView(self._rows, row, key)

    def __iter__(self) -> Iterator[SeriesKey]:
        return iter(self._rows.index)

    def __len__(self) -> int:
        return len(self._rows.index)
