"""Memory-leak detector: a robust slope of memory over an event-time window.

Samples are averaged into fixed event-time buckets (``bucket_s``, default
``window_s / 60``); when a bucket closes, the Theil-Sen slope (median of the pairwise
slopes) of the bucket means inside the last ``window_s`` seconds is recomputed. Theil-Sen
ignores up to ~29 % of outlying buckets, so noise and short spikes do not look like
growth. Memory is bounded: at most ``window_s / bucket_s + 1`` points are kept.

It reports, through :attr:`LeakDetector.estimate`, the slope (bytes/s and GB/h), the
increase over the covered window (slope x span), its steadiness (the fraction of
bucket-to-bucket steps that went up: ~0.5 for noise or a one-off step such as a model
load, ~1 for a leak) and, given a capacity, the time to exhaustion. ``score_one`` is
``increase / (increase + scale_bytes)`` (0.5 at ``scale_bytes``) times
``2 * steadiness - 1`` clipped to [0, 1]; 0 while warming up (less than ``min_span_s`` of
data) and for flat or shrinking memory.

Parameters: ``window_s`` (7200), ``bucket_s`` (``window_s / 60``), ``min_span_s`` (600),
``min_points`` (5), ``scale_bytes`` (1e9), ``recent_s`` (1800: the recent slope and
steadiness, :attr:`LeakEstimate.recent_gb_per_hour`, are fitted over the last half hour).

>>> det = LeakDetector(window_s=7200)
>>> for i in range(0, 3 * 3600, 10):          # 1.2 GB/h for three hours, 10 s samples
...     det.learn_one({"value": 40e9 + 1.2e9 * i / 3600, "t": 1_700_000_000.0 + i})
>>> round(det.estimate.gb_per_hour, 2)
1.2
>>> round(det.estimate.increase_bytes / 1e9, 1)  # over the 2 h window
2.4
>>> round(det.score_one({"value": 0.0, "t": 0.0}), 2)
0.71
"""

from __future__ import annotations

import functools
import math
from array import array
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ragwatch.detectors.base import register

GB = 1e9


@dataclass(frozen=True, slots=True)
class LeakEstimate:
    """The robust trend of one memory series over its window.

    ``steadiness`` is the fraction of bucket-to-bucket steps that went up: about 0.5 for
    noise around a level (and for a one-off step, such as a model load), near 1.0 for
    memory that keeps growing. Rules combine it with ``increase_bytes``.
    """

    slope_bytes_per_s: float
    increase_bytes: float
    span_s: float
    level_bytes: float
    points: int
    steadiness: float = 1.0
    recent_slope_bytes_per_s: float | None = None  # the same fit over the last recent_s
    recent_steadiness: float | None = None

    def __reduce__(self) -> tuple[type[LeakEstimate], tuple[Any, ...]]:
        # positional: the dataclass default walks fields() on every pickle (snapshots)
        return (
            LeakEstimate,
            (
                self.slope_bytes_per_s,
                self.increase_bytes,
                self.span_s,
                self.level_bytes,
                self.points,
                self.steadiness,
                self.recent_slope_bytes_per_s,
                self.recent_steadiness,
            ),
        )

    @property
    def gb_per_hour(self) -> float:
        return self.slope_bytes_per_s * 3600 / GB

    @property
    def recent_gb_per_hour(self) -> float | None:
        r = self.recent_slope_bytes_per_s
        return None if r is None else r * 3600 / GB

    def time_to_exhaustion(self, free_bytes: float) -> float | None:
        """Seconds until ``free_bytes`` are used up at the recent slope (the window's if
        there is no recent one); None if not growing."""
        slope = self.slope_bytes_per_s
        if self.recent_slope_bytes_per_s is not None:
            slope = self.recent_slope_bytes_per_s
        if slope <= 0:
            return None
        return max(0.0, free_bytes) / slope


@functools.cache
def pair_indices(n: int) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Indices (i, j), i < j, of every pair of ``n`` points (cached: n <= window points)."""
    i, j = np.triu_indices(n, 1)
    return i, j


def theil_sen(ts: list[float], vs: list[float]) -> float:
    """Median of pairwise slopes ``(v_j - v_i) / (t_j - t_i)``; 0.0 for fewer than 2 points."""
    return _theil_sen(np.asarray(ts, dtype=np.float64), np.asarray(vs, dtype=np.float64))


def _theil_sen(t: npt.NDArray[np.float64], v: npt.NDArray[np.float64]) -> float:
    # Vectorised: a full window (61 points) has 1,830 slopes, which cost ~250 us as a
    # Python loop and sort on every bucket close of every series.
    n = len(t)
    if n < 2:
        return 0.0
    i, j = pair_indices(n)
    dt = t[j] - t[i]
    with np.errstate(all="ignore"):  # overflowing values give inf / NaN slopes
        keep = dt != 0
        slopes = (v[j] - v[i]) / dt if keep.all() else (v[j] - v[i])[keep] / dt[keep]
        m = len(slopes)
        if not m:
            return 0.0
        mid = m // 2
        if m % 2:
            return float(np.partition(slopes, mid)[mid])
        part = np.partition(slopes, (mid - 1, mid))
        return (float(part[mid - 1]) + float(part[mid])) / 2


def checked_params(
    window_s: float,
    bucket_s: float | None,
    min_span_s: float,
    min_points: int,
    scale_bytes: float,
    recent_s: float,
) -> tuple[float, float, float, int, float, float]:
    """The leak detector's parameters checked (ValueError names a bad one) and resolved
    (``bucket_s`` None: ``window_s / 60``), in this order; :class:`LeakDetector` and the
    bank (``leak_bank.py``) take the same ones."""
    for name, v in (
        ("window_s", window_s),
        ("scale_bytes", scale_bytes),
        ("recent_s", recent_s),
    ):
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be finite and > 0, got {v!r}")
    if not (math.isfinite(min_span_s) and min_span_s >= 0) or min_points < 2:
        raise ValueError("min_span_s must be finite and >= 0, min_points >= 2")
    window = float(window_s)
    bucket = window / 60 if bucket_s is None else float(bucket_s)
    if not (math.isfinite(bucket) and 0 < bucket <= window):
        raise ValueError(f"bucket_s must be in (0, window_s], got {bucket_s!r}")
    return window, bucket, float(min_span_s), int(min_points), float(scale_bytes), float(recent_s)


@register("leak")
class LeakDetector:
    """Robust memory-growth detector over an event-time window (see module docstring)."""

    def __init__(
        self,
        window_s: float = 7200.0,
        bucket_s: float | None = None,
        min_span_s: float = 600.0,
        min_points: int = 5,
        scale_bytes: float = GB,
        recent_s: float = 1800.0,
    ) -> None:
        (
            self.window_s,
            self.bucket_s,
            self.min_span_s,
            self.min_points,
            self.scale_bytes,
            self.recent_s,
        ) = checked_params(window_s, bucket_s, min_span_s, min_points, scale_bytes, recent_s)
        self._points: deque[tuple[float, float]] = deque()
        self._bucket: int | None = None
        self._mean = 0.0
        self._tsum = 0.0
        self._n = 0
        self._estimate: LeakEstimate | None = None
        self.late = 0

    def __getstate__(self) -> dict[str, Any]:
        # The window's points as one bytes value: a snapshot of a host pickles ~90 of these
        # detectors every few seconds, and 61 (t, v) tuples each cost 15x more to pickle.
        state = dict(self.__dict__)
        state["_points"] = array("d", [x for p in self._points for x in p]).tobytes()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        flat = array("d")
        flat.frombytes(state["_points"])
        self.__dict__.update(state)
        self._points = deque(zip(flat[0::2], flat[1::2], strict=True))

    def clone(self) -> LeakDetector:
        return LeakDetector(
            self.window_s,
            self.bucket_s,
            self.min_span_s,
            self.min_points,
            self.scale_bytes,
            self.recent_s,
        )

    @property
    def estimate(self) -> LeakEstimate | None:
        """The trend as of the last closed bucket; None while warming up."""
        return self._estimate

    def learn_one(self, x: dict[str, Any]) -> None:
        t, v = float(x["t"]), float(x["value"])
        if not (math.isfinite(t) and math.isfinite(v)):
            raise ValueError(f"leak detector needs finite t and value, got t={t!r} value={v!r}")
        self.learn(t, v)

    def learn(self, t: float, v: float) -> None:
        """:meth:`learn_one` for a finite time and value the caller has already checked
        (a pipeline's per-sample path: no dict, no checks)."""
        bucket = math.floor(t / self.bucket_s)
        if self._bucket is not None and bucket < self._bucket:
            self.late += 1  # older than the open bucket: its bucket is already closed
            return
        if self._bucket is not None and bucket > self._bucket:
            self._close_bucket()
        self._bucket = bucket
        self._tsum += t
        self._n += 1
        # running mean, v / n - mean / n: exact for constant input, no overflow
        self._mean += v / self._n - self._mean / self._n

    def score_one(self, x: dict[str, Any]) -> float:
        est = self._estimate
        if est is None or not est.increase_bytes > 0:  # also NaN from overflowing slopes
            return 0.0
        growth = (
            1.0
            if math.isinf(est.increase_bytes)
            else (est.increase_bytes / (est.increase_bytes + self.scale_bytes))
        )
        return growth * min(1.0, max(0.0, 2 * est.steadiness - 1))

    def _close_bucket(self) -> None:
        self._points.append((self._tsum / self._n, self._mean))
        self._mean = self._tsum = 0.0
        self._n = 0
        newest = self._points[-1][0]
        while self._points and self._points[0][0] < newest - self.window_s:
            self._points.popleft()
        self._estimate = self._fit()

    def _fit(self) -> LeakEstimate | None:
        n = len(self._points)
        if n < self.min_points:
            return None
        span = self._points[-1][0] - self._points[0][0]
        if span < self.min_span_s:
            return None
        tv = np.array(self._points, dtype=np.float64)
        ts, vs = tv[:, 0], tv[:, 1]
        slope = _theil_sen(ts, vs)
        up = vs[1:] > vs[:-1]
        # The same over the recent part of the window: a leak that started an hour into
        # a flat window shows at its own rate there long before the whole window's slope
        # (dragged down by the flat part) reaches it.
        k = int(np.searchsorted(ts, ts[-1] - self.recent_s, side="left"))
        recent = recent_steady = None
        if n - k >= self.min_points:
            recent = _theil_sen(ts[k:], vs[k:])
            recent_steady = int(np.count_nonzero(up[k:])) / (n - k - 1)
        return LeakEstimate(
            slope,
            slope * span,
            span,
            self._points[-1][1],
            n,
            int(np.count_nonzero(up)) / (n - 1),
            recent,
            recent_steady,
        )
