"""Many leak detectors in arrays: :class:`LeakBank` runs :class:`~.leak.LeakDetector`'s
algorithm for N series at once, a series per row.

The object detector stays the reference (``tests/unit/test_leak_bank.py`` holds the bank to
it: the same estimates on the same input, the same late samples). What changes is the
cost: a batch of samples is one set of array operations per *wave* (the k-th sample of
each row in the batch), and the bucket closes of a wave refit together, every window's
Theil-Sen slopes as one matrix (rows x pairs), sorted once.

State per row: the open bucket (its index, the running mean of values and the sum of
times), the window's bucket means left-aligned in ``(rows, P)`` arrays (``P`` = the most a
window can hold), their count, and the estimate's fields (``has`` False while warming up;
the recent fit NaN where the object has None).

>>> bank = LeakBank(capacity=2)
>>> t = np.arange(0.0, 3 * 3600, 10.0)  # three hours of 10 s samples, 1.2 GB/h on row 1
>>> rows = np.tile([0, 1], len(t))
>>> ts = np.repeat(1_700_000_000.0 + t, 2)
>>> values = np.where(rows == 1, 40e9 + 1.2e9 * (ts - ts[0]) / 3600, 40e9)
>>> bank.learn(rows, ts, values)
>>> round(bank.estimate(1).gb_per_hour, 2), round(bank.estimate(0).gb_per_hour, 2)
(1.2, 0.0)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from ragwatch.detectors.leak import GB, LeakDetector, LeakEstimate, checked_params, pair_indices

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
NO_BUCKET = np.iinfo(np.int64).min  # a row with no open bucket (new, or reset)
# below this many rows, a window's pairs are one gather (cheaper than ~60 slice operations)
GATHER_ROWS = 16
FIT_CHUNK = 512  # rows refitted per matrix: 512 x 1,830 slopes x 8 bytes = 7.5 MB


def _row_median(x: F64, m: I64) -> F64:
    """Per row, the median of its first ``m`` values once sorted (numpy sorts NaN last, as
    ``np.partition`` does in the object detector); 0.0 where ``m`` is 0."""
    s = np.sort(x, axis=1)
    r = np.arange(len(s))
    mid = m // 2
    hi = s[r, np.minimum(mid, s.shape[1] - 1)]
    lo = s[r, np.maximum(mid - 1, 0)]
    with np.errstate(all="ignore"):
        out = np.where(m % 2 == 1, hi, (lo + hi) / 2)
    return np.where(m == 0, 0.0, out)


def _dense_theil_sen(t: F64, v: F64) -> F64:
    """Per row, the median of the pairwise slopes of its ``n`` points (every row has ``n``:
    the object's ``_theil_sen``, vectorised). A pair with equal times is left out, as the
    object leaves it out (bucket means of distinct buckets rarely share a time; their
    times never decrease, so a row has such a pair only if two neighbours tie)."""
    n = t.shape[1]
    if n < 2:
        return np.zeros(len(t))
    # the order of the slopes does not matter to their median
    m = n * (n - 1) // 2
    with np.errstate(all="ignore"):
        if len(t) < GATHER_ROWS:  # few rows: every pair in one gather
            i, j = pair_indices(n)
            slopes = (v[:, j] - v[:, i]) / (t[:, j] - t[:, i])
        else:  # diagonal by diagonal (points d apart): contiguous slices, not a gather
            slopes = np.empty((len(t), m))
            dt = np.empty((len(t), n - 1))
            at = 0
            for d in range(1, n):
                w = n - d
                out, gap = slopes[:, at : at + w], dt[:, :w]
                np.subtract(v[:, d:], v[:, :w], out=out)
                np.subtract(t[:, d:], t[:, :w], out=gap)
                np.divide(out, gap, out=out)
                at += w
    tied = (np.diff(t, axis=1) == 0).any(axis=1)
    if tied.any():
        keep = np.empty((len(t), m), dtype=np.bool_)
        at = 0
        for d in range(1, n):
            w = n - d
            np.not_equal(t[:, d:], t[:, :w], out=keep[:, at : at + w])
            at += w
        return _row_median(np.where(keep, slopes, np.nan), np.count_nonzero(keep, axis=1))
    mid = m // 2
    slopes.partition(mid, axis=1)  # in place: no copy of the matrix
    if m % 2:
        return slopes[:, mid].copy()
    if np.isnan(slopes).any():  # overflowing values: NaN sorts last, as in the object's
        slopes.partition(mid - 1, axis=1)
        return (slopes[:, mid - 1] + slopes[:, mid]) / 2
    # the other middle value is the largest left of it: one selection, not two (numpy's
    # partition with two kth costs ~6x one)
    median: F64 = (slopes[:, :mid].max(axis=1) + slopes[:, mid]) / 2
    return median


class LeakBank:
    """Leak detectors for up to ``capacity`` rows (it grows); parameters as
    :class:`~.leak.LeakDetector`'s. Rows are plain indices: the caller keeps the key ->
    row map and calls :meth:`reset` on a row it reuses."""

    # per row: the open bucket, the window (left-aligned, NaN beyond ``count``), the fit
    bucket: I64
    n: I64
    tsum: F64
    mean: F64
    late: I64
    count: I64
    pts_t: F64
    pts_v: F64
    has: npt.NDArray[np.bool_]
    slope: F64
    span: F64
    level: F64
    steadiness: F64
    recent_slope: F64
    recent_steadiness: F64

    # the per-row arrays, by name: what a snapshot of rows holds (``dump`` / ``load``)
    ROW_STATE = (
        "bucket", "n", "tsum", "mean", "late", "count", "pts_t", "pts_v", "has", "slope",
        "span", "level", "steadiness", "recent_slope", "recent_steadiness",
    )  # fmt: skip

    def __init__(
        self,
        capacity: int = 1024,
        *,
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
        # bucket means are one per bucket, in time order, and bucket k - m's is more than
        # (m - 1) buckets older than bucket k's: a window holds at most ceil(window /
        # bucket) + 1 of them, and one more joins before the oldest leave
        self.points_max = math.ceil(self.window_s / self.bucket_s) + 2
        self.capacity = 0
        self._grow(max(1, capacity))

    # ------------------------------------------------------------------ state

    def _grow(self, capacity: int) -> None:
        old, p = self.capacity, self.points_max

        def extend(a: Any, fill: float, shape: tuple[int, ...], dt: type) -> Any:
            new: Any = np.full(shape, fill, dtype=dt)
            if a is not None:
                new[:old] = a
            return new

        get = self.__dict__.get
        self.bucket = extend(get("bucket"), NO_BUCKET, (capacity,), np.int64)
        self.n = extend(get("n"), 0, (capacity,), np.int64)
        self.tsum = extend(get("tsum"), 0.0, (capacity,), np.float64)
        self.mean = extend(get("mean"), 0.0, (capacity,), np.float64)
        self.late = extend(get("late"), 0, (capacity,), np.int64)
        self.count = extend(get("count"), 0, (capacity,), np.int64)
        self.pts_t = extend(get("pts_t"), np.nan, (capacity, p), np.float64)
        self.pts_v = extend(get("pts_v"), np.nan, (capacity, p), np.float64)
        self.has = extend(get("has"), False, (capacity,), np.bool_)
        self.slope = extend(get("slope"), np.nan, (capacity,), np.float64)
        self.span = extend(get("span"), np.nan, (capacity,), np.float64)
        self.level = extend(get("level"), np.nan, (capacity,), np.float64)
        self.steadiness = extend(get("steadiness"), np.nan, (capacity,), np.float64)
        self.recent_slope = extend(get("recent_slope"), np.nan, (capacity,), np.float64)
        self.recent_steadiness = extend(get("recent_steadiness"), np.nan, (capacity,), np.float64)
        self.capacity = capacity

    def reserve(self, rows: int) -> None:
        """Room for row indices below ``rows`` (doubling, so appends stay amortised)."""
        if rows > self.capacity:
            self._grow(max(rows, 2 * self.capacity))

    def reset(self, rows: npt.ArrayLike) -> None:
        """Forget the rows (a freed row reused for a new series starts afresh)."""
        r = np.asarray(rows, dtype=np.intp)
        self.bucket[r] = NO_BUCKET
        self.n[r] = self.late[r] = self.count[r] = 0
        self.tsum[r] = self.mean[r] = 0.0
        self.pts_t[r] = self.pts_v[r] = np.nan
        self.has[r] = False

    def dump(self, rows: npt.ArrayLike) -> dict[str, bytes]:
        """The state of ``rows``, as raw little-endian arrays by name (a snapshot: typed
        data, nothing to unpickle); :meth:`load` puts it back, onto any rows."""
        r = np.asarray(rows, dtype=np.intp)
        out = {
            name: getattr(self, name)[r]
            .astype(getattr(self, name).dtype.newbyteorder("<"))
            .tobytes()
            for name in self.ROW_STATE
        }
        out["points_max"] = np.int64(self.points_max).tobytes()
        return out

    def load(self, rows: npt.ArrayLike, state: dict[str, bytes]) -> None:
        """Rows ``rows`` from a :meth:`dump` of as many rows by a bank with the same
        parameters (ValueError, with nothing changed, if it does not fit)."""
        r = np.asarray(rows, dtype=np.intp)
        if np.frombuffer(state.get("points_max", b""), dtype="<i8").tolist() != [self.points_max]:
            raise ValueError("leak bank state of another window or bucket size")
        parts = {}
        for name in self.ROW_STATE:
            a = getattr(self, name)
            try:
                v = np.frombuffer(state[name], dtype=a.dtype.newbyteorder("<"))
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"leak bank state: {name}: {exc!r}") from exc
            if v.size != len(r) * (a.shape[1] if a.ndim == 2 else 1):
                raise ValueError(f"leak bank state: {name} holds {v.size} values")
            parts[name] = v.reshape((len(r), *a.shape[1:]))
        if not ((parts["count"] >= 0) & (parts["count"] < self.points_max)).all():
            raise ValueError("leak bank state: a window of more points than it holds")
        if not (parts["n"] >= 0).all():
            raise ValueError("leak bank state: an open bucket of fewer than no samples")
        self.reserve(int(r.max()) + 1 if len(r) else 0)
        for name, v in parts.items():
            getattr(self, name)[r] = v

    def adopt(self, row: int, det: LeakDetector) -> None:
        """Row ``row`` from an object detector with the same parameters (a snapshot of
        the pipeline's previous format, which held one :class:`LeakDetector` a series)."""
        params = (det.window_s, det.bucket_s, det.min_span_s, det.min_points, det.recent_s)
        mine = (self.window_s, self.bucket_s, self.min_span_s, self.min_points, self.recent_s)
        points = list(det._points)
        if params != mine or len(points) > self.points_max:
            raise ValueError("leak detector of other parameters")
        self.reserve(row + 1)
        self.reset([row])
        self.bucket[row] = NO_BUCKET if det._bucket is None else det._bucket
        self.n[row], self.tsum[row], self.mean[row] = det._n, det._tsum, det._mean
        self.late[row], self.count[row] = det.late, len(points)
        for c, (t, v) in enumerate(points):
            self.pts_t[row, c], self.pts_v[row, c] = t, v
        est = det.estimate
        self.has[row] = est is not None
        if est is not None:
            self.slope[row], self.span[row] = est.slope_bytes_per_s, est.span_s
            self.level[row], self.steadiness[row] = est.level_bytes, est.steadiness
            recent = est.recent_slope_bytes_per_s
            self.recent_slope[row] = math.nan if recent is None else recent
            steady = est.recent_steadiness
            self.recent_steadiness[row] = math.nan if steady is None else steady

    # ------------------------------------------------------------------ learning

    def learn(self, rows: npt.ArrayLike, t: npt.ArrayLike, v: npt.ArrayLike) -> None:
        """Samples ``(t[i], v[i])`` of rows ``rows[i]``, in this order within each row
        (finite times and values, as :meth:`LeakDetector.learn` takes them)."""
        r = np.asarray(rows, dtype=np.intp)
        if not len(r):
            return
        tt, vv = np.asarray(t, dtype=np.float64), np.asarray(v, dtype=np.float64)
        self.reserve(int(r.max()) + 1)
        order = np.argsort(r, kind="stable")
        sr = r[order]
        starts = np.r_[0, np.flatnonzero(sr[1:] != sr[:-1]) + 1]
        lengths = np.diff(np.r_[starts, len(sr)])
        occurrence = np.arange(len(sr)) - np.repeat(starts, lengths)
        if lengths.max() == 1:  # one sample per row: one wave
            self._wave(r, tt, vv)
            return
        for k in range(int(lengths.max())):
            pick = order[occurrence == k]
            pick.sort()  # the wave in batch order (rows are distinct within it)
            self._wave(r[pick], tt[pick], vv[pick])

    def learn_distinct(self, rows: npt.NDArray[np.intp], t: F64, v: F64) -> None:
        """:meth:`learn` for samples of distinct rows (one each; the caller knows), within
        capacity: one wave, without sorting the rows first."""
        if len(rows):
            self._wave(rows, t, v)

    def _wave(self, r: npt.NDArray[np.intp], t: F64, v: F64) -> None:
        """One sample for each of the distinct rows ``r``."""
        b = np.floor(t / self.bucket_s).astype(np.int64)
        cur = self.bucket[r]
        opened = cur != NO_BUCKET
        late = opened & (b < cur)
        if late.any():
            np.add.at(self.late, r[late], 1)
            keep = ~late
            r, t, v, b, cur, opened = r[keep], t[keep], v[keep], b[keep], cur[keep], opened[keep]
        closing = opened & (b > cur)
        if closing.any():
            self._close(r[closing])
        self.bucket[r] = b
        self.tsum[r] += t
        n = self.n[r] + 1
        self.n[r] = n
        m = self.mean[r]
        self.mean[r] = m + (v / n - m / n)  # the object's running mean, term for term

    def _close(self, r: npt.NDArray[np.intp]) -> None:
        """Close the open bucket of rows ``r``: its mean joins the window, old points leave
        it, the estimate is refitted."""
        newest = self.tsum[r] / self.n[r]
        c = self.count[r]
        self.pts_t[r, c] = newest
        self.pts_v[r, c] = self.mean[r]
        c = c + 1
        self.mean[r] = self.tsum[r] = 0.0
        self.n[r] = 0
        with np.errstate(invalid="ignore"):  # NaN padding compares False
            drop = np.count_nonzero(self.pts_t[r] < (newest - self.window_s)[:, None], axis=1)
        moved = drop > 0
        if moved.any():  # shift the window left by what left it (beyond: NaN padding)
            rm, dm = r[moved], drop[moved]
            cols = np.arange(self.points_max)[None, :] + dm[:, None]
            inside = cols < self.points_max
            cols = np.minimum(cols, self.points_max - 1)
            for a in (self.pts_t, self.pts_v):
                a[rm] = np.where(inside, np.take_along_axis(a[rm], cols, axis=1), np.nan)
            c[moved] -= dm
        self.count[r] = c
        for lo in range(0, len(r), FIT_CHUNK):
            self._fit(r[lo : lo + FIT_CHUNK])

    def _fit(self, r: npt.NDArray[np.intp]) -> None:
        c = self.count[r]
        ts, vs = self.pts_t[r], self.pts_v[r]
        rows = np.arange(len(r))
        span = ts[rows, np.maximum(c - 1, 0)] - ts[:, 0]
        ok = (c >= self.min_points) & (span >= self.min_span_s)
        self.has[r] = ok
        if not ok.any():
            return
        r, c, ts, vs, span = r[ok], c[ok], ts[ok], vs[ok], span[ok]
        rows = np.arange(len(r))
        # a recent point: at or after the newest minus recent_s (the object's searchsorted)
        newest = ts[rows, c - 1]
        with np.errstate(invalid="ignore"):
            k = np.count_nonzero(ts < (newest - self.recent_s)[:, None], axis=1)
            up = vs[:, 1:] > vs[:, :-1]  # NaN padding: False
        nr = c - k
        has_recent = nr >= self.min_points
        steps = np.arange(1, self.points_max)[None, :]
        up_all = np.count_nonzero(up & (steps < c[:, None]), axis=1)
        up_recent = np.count_nonzero(up & (steps < c[:, None]) & (steps - 1 >= k[:, None]), axis=1)
        self.slope[r] = self._theil_sen(r, np.zeros_like(c), c)
        self.span[r] = span
        self.level[r] = vs[rows, c - 1]
        self.steadiness[r] = up_all / (c - 1)
        recent = np.full(len(r), np.nan)
        if has_recent.any():
            recent[has_recent] = self._theil_sen(r[has_recent], k[has_recent], c[has_recent])
        self.recent_slope[r] = recent
        with np.errstate(all="ignore"):
            self.recent_steadiness[r] = np.where(has_recent, up_recent / (nr - 1), np.nan)

    def _theil_sen(self, r: npt.NDArray[np.intp], lo: I64, hi: I64) -> F64:
        """Theil-Sen slope of each row's points ``lo:hi``. Rows are fitted in groups of the
        same ``lo:hi`` (in a steady state nearly all rows are in one or two): a group's
        pairs are the same columns, so its slopes are one dense matrix and its median one
        partition, no masks."""
        out = np.zeros(len(r))
        keys, inverse = np.unique(lo * (self.points_max + 1) + hi, return_inverse=True)
        for g, key in enumerate(keys.tolist()):
            a, b = divmod(key, self.points_max + 1)
            sel = np.flatnonzero(inverse == g)
            out[sel] = _dense_theil_sen(self.pts_t[r[sel], a:b], self.pts_v[r[sel], a:b])
        return out

    # ------------------------------------------------------------------ reading

    def estimate(self, row: int) -> LeakEstimate | None:
        """Row ``row``'s estimate as the object detector gives it (None while warming up)."""
        if row >= self.capacity or not self.has[row]:
            return None
        recent = float(self.recent_slope[row])
        slope, span = float(self.slope[row]), float(self.span[row])
        return LeakEstimate(
            slope,
            slope * span,
            span,
            float(self.level[row]),
            int(self.count[row]),
            float(self.steadiness[row]),
            None if math.isnan(recent) else recent,
            None if math.isnan(recent) else float(self.recent_steadiness[row]),
        )

    def scores(self, rows: npt.ArrayLike) -> F64:
        """:meth:`LeakDetector.score_one` of each row."""
        r = np.asarray(rows, dtype=np.intp)
        inc = self.slope[r] * self.span[r]
        with np.errstate(all="ignore"):
            growth = np.where(np.isinf(inc), 1.0, inc / (inc + self.scale_bytes))
            out = growth * np.clip(2 * self.steadiness[r] - 1, 0.0, 1.0)
        return np.where(self.has[r] & (inc > 0), out, 0.0)
