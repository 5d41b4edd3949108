"""Memory leaks of many series in arrays: :class:`LeakBank` holds a series per row and is the
only implementation of the leak detector (:class:`~.view.LeakDetector` is a one-row view of
it; ``tests/reference/leak.py`` is the specification, in plain loops).

What it detects: memory that grows and does not come back, judged on three horizons.

- **Fast** (the last ``recent_s``, 30 min): the Theil-Sen slope of 2-minute bucket means and
  their steadiness (the share of bucket-to-bucket steps that went up). A steady rise pages a
  leak like the seed's (1.2 GB/h) within half an hour, but only where memory is now above
  the highest it held and left over the last ``floor_window_s`` (12 h): a batch job that
  took +20 GB for half an hour two hours ago and gave it back makes its next rise a known
  one. A young series has no such range: any steady rise above where it began counts,
  judged over a whole horizon of data (15 steps: over the first minutes of a process its
  loading and first allocations are most of its few steps); the seed's leak 20 min after
  its process started still pages in half an hour.
- **Floor** (the last ``floor_horizon_s``, 2 h): memory's low-water mark, the minimum of each
  10-minute block, fitted by Theil-Sen; it is *established* when the low-water marks of
  consecutive half hours rose (a sawtooth that frees most of what it took still rises; a
  batch cycle that returns, a plateau and a one-off step do not) at more than
  ``floor_gb_per_hour``, and the growth is spread over many buckets (a leak of small
  tensors), not a few large steps (a caching allocator's segments).
- **Noise**: a bucket step or a half hour's rise counts as a rise for the spread and the
  floor only when it is larger than the series' own noise, ``noise_k`` times the robust
  spread (1.4826 MAD) of its bucket-to-bucket steps over the window, and at least
  ``noise_floor_bytes``: a GPU read by dcgm moves a few MB either way every sample, and
  half its steps go up on a flat series.
- The **leak rate** (:meth:`LeakBank.leak_rates`) is the floor's slope once established
  (the persistent rate: a sawtooth's net growth, not its teeth), else the fast slope where
  the fast test holds, else 0. Rules turn it into time to OOM and a severity.

Samples are averaged into ``bucket_s`` buckets of event time (``window_s / 60``); a sample
older than its row's open bucket is late: counted, and ignored. A bucket's close updates
its block's floor and high; a block's close refits the floor. Cost: a batch of samples is
one set of array operations per *wave* (the k-th sample of each row in the batch), the
bucket closes of a wave refit together (every window's Theil-Sen slopes one matrix).

Parameters (:class:`LeakParams`, each with its reason): ``window_s``, ``bucket_s``,
``min_span_s``, ``min_points``, ``scale_bytes``, ``recent_s`` as before; ``floor_block_s``,
``floor_window_s``, ``floor_horizon_s``, ``floor_group``, ``margin_bytes``,
``fast_gb_per_hour``, ``fast_steadiness``, ``floor_gb_per_hour``, ``floor_steadiness``,
``spread``, ``noise_k``, ``noise_floor_bytes``.

>>> bank = LeakBank(capacity=2)
>>> t = np.arange(0.0, 6 * 3600, 10.0)  # six hours of 10 s samples, 1.2 GB/h on row 1 at 3 h
>>> rows = np.tile([0, 1], len(t))
>>> ts = np.repeat(1_700_000_000.0 + t, 2)
>>> leak = np.maximum(0.0, ts - ts[0] - 3 * 3600) * 1.2e9 / 3600
>>> bank.learn(rows, ts, np.where(rows == 1, 40e9 + leak, 40e9))
>>> [round(g, 2) for g in (bank.leak_rates([0, 1]) * 3600 / GB).tolist()]
[0.0, 1.2]
>>> round(bank.estimate(1).floor_gb_per_hour, 2)
1.2
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from ragwatch.detectors.medians import nanmedian_rows

GB = 1e9
# A bucket step under this share of the memory is rounding, not a rise; and a level above
# the known range by the margin plus this much is above it (bucket means differ in their
# last bits with the order of the sums: a level exactly 0.25 GB over, as a stream of
# quarter-GB steps has, was over it by one rounding and not over it by another)
ROUNDING = 1e-9
F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
Rows = npt.NDArray[np.intp]
NO_BUCKET = np.iinfo(np.int64).min  # a row with no open bucket (new, or reset)
# below this many rows, a window's pairs are one gather (cheaper than ~60 slice operations)
GATHER_ROWS = 16
FIT_CHUNK = 512  # rows refitted per matrix: 512 x 1,830 slopes x 8 bytes = 7.5 MB


@dataclass(frozen=True, slots=True)
class LeakParams:
    """The leak detector's parameters, checked (ValueError names a bad one); ``bucket_s``
    None is ``window_s / 60``."""

    window_s: float = 7200.0  # the bucket means kept: the 2 h of the runbook's "> 1 GB / 2 h"
    bucket_s: float | None = None
    min_span_s: float = 600.0  # an estimate needs 10 min of data ...
    min_points: int = 5  # ... and 5 bucket means
    scale_bytes: float = GB  # score 0.5 at 1 GB of growth over the window
    recent_s: float = 1800.0  # the fast horizon: the seed's 1.2 GB/h pages within 30 min
    # A block's minimum is the floor: shorter than a GC or batch cycle's trough is wide, long
    # enough that its 5 bucket means hold a trough of a 20-min sawtooth.
    floor_block_s: float = 600.0
    # The known range (the highest held and left) looks back half a day: a batch job runs
    # every few hours; a daily job or restart is a new day's business.
    floor_window_s: float = 43200.0
    # The floor's horizon: 2 h, four half hours, each of whose low-water marks must rise.
    floor_horizon_s: float = 7200.0
    floor_group: int = 3  # blocks per low-water mark compared: half an hour
    # Above the known range by more than a quarter GB: far beyond a bucket mean's noise (tens
    # of MB), half of the least growth the fast test takes over its horizon (0.5 GB/h x 30 min)
    margin_bytes: float = 0.25 * GB
    fast_gb_per_hour: float = 0.5  # the runbook's 1 GB per 2 h, on the recent rate
    # a one-off step moves a slope too, but only about half its bucket steps go up
    fast_steadiness: float = 0.75
    # Below 50 MB/h a 2 h rise is within a GPU reading's noise, and OOM is weeks away.
    floor_gb_per_hour: float = 0.05
    # Established: the half hours' low-water marks rose (the load at no new high) in two of
    # three steps: one step may hold a reload's dip or a new high of the load.
    floor_steadiness: float = 0.6
    # Growth spread over the 2 h, not in a few segments: a caching allocator climbs in 256 MB
    # to 1 GB steps, a few an hour (under a fifth of its 2-min buckets rise); a leak of small
    # tensors rises in most buckets at 1 GB/h and in ~40 % at 0.25 GB/h (20 MB segments).
    spread: float = 0.33
    # A step is a rise beyond noise when above noise_k x the steps' robust spread: noise
    # alone then rises in 16 % of steps (half of ``spread``), a leak whose growth per bucket
    # is as large as the noise in more than half.
    noise_k: float = 1.0
    # ... and above 2 MiB whatever the spread: NVML counts whole MiB and PyTorch's smallest
    # segment is 2 MiB, so a smaller change of a bucket mean is reading churn (driver,
    # contexts), not an allocation; it also keeps a noiseless series' ties from rising.
    noise_floor_bytes: float = 2 * 2**20

    def __post_init__(self) -> None:
        for name in ("window_s", "scale_bytes", "recent_s", "floor_block_s", "floor_window_s",
                     "floor_horizon_s"):  # fmt: skip
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be finite and > 0, got {v!r}")
        if not (math.isfinite(self.min_span_s) and self.min_span_s >= 0) or self.min_points < 2:
            raise ValueError("min_span_s must be finite and >= 0, min_points >= 2")
        bucket = self.window_s / 60 if self.bucket_s is None else float(self.bucket_s)
        if not (math.isfinite(bucket) and 0 < bucket <= self.window_s):
            raise ValueError(f"bucket_s must be in (0, window_s], got {self.bucket_s!r}")
        object.__setattr__(self, "bucket_s", bucket)
        if self.floor_group < 1 or self.floor_window_s < self.floor_horizon_s:
            raise ValueError("floor_group must be >= 1, floor_window_s >= floor_horizon_s")
        for name in ("margin_bytes", "fast_gb_per_hour", "fast_steadiness", "floor_gb_per_hour",
                     "floor_steadiness", "spread", "noise_k", "noise_floor_bytes"):  # fmt: skip
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be finite")

    @property
    def bucket(self) -> float:
        assert self.bucket_s is not None  # resolved in __post_init__
        return self.bucket_s

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class LeakEstimate:
    """One series as the bank holds it. ``steadiness`` is the share of the window's bucket
    steps that went up (about 0.5 for noise or a one-off step, near 1 for steady growth);
    ``rising`` is the share that rose beyond the series' noise (the spread of growth);
    the ``floor_*`` fields are None until the floor has a fit, ``above_known_bytes`` while
    the series has no range held and left (younger than ``recent_s`` and a block);
    ``leak_slope_bytes_per_s`` is the leak rate."""

    slope_bytes_per_s: float
    increase_bytes: float
    span_s: float
    level_bytes: float
    points: int
    steadiness: float = 1.0
    recent_slope_bytes_per_s: float | None = None  # the same fit over the last recent_s
    recent_steadiness: float | None = None
    floor_slope_bytes_per_s: float | None = None
    floor_steadiness: float | None = None
    above_known_bytes: float | None = None
    leak_slope_bytes_per_s: float = 0.0
    rising: float | None = None  # the share of the window's steps that rose beyond noise

    def __reduce__(self) -> tuple[type[LeakEstimate], tuple[Any, ...]]:
        # positional: the dataclass default walks fields() on every pickle
        return (LeakEstimate, tuple(getattr(self, f.name) for f in fields(self)))

    @property
    def gb_per_hour(self) -> float:
        return self.slope_bytes_per_s * 3600 / GB

    @property
    def recent_gb_per_hour(self) -> float | None:
        r = self.recent_slope_bytes_per_s
        return None if r is None else r * 3600 / GB

    @property
    def floor_gb_per_hour(self) -> float | None:
        r = self.floor_slope_bytes_per_s
        return None if r is None else r * 3600 / GB

    @property
    def leak_gb_per_hour(self) -> float:
        return self.leak_slope_bytes_per_s * 3600 / GB

    def time_to_exhaustion(self, free_bytes: float) -> float | None:
        """Seconds until ``free_bytes`` are used up at the leak rate; None if no leak."""
        if not self.leak_slope_bytes_per_s > 0:
            return None
        return max(0.0, free_bytes) / self.leak_slope_bytes_per_s


@functools.cache
def pair_indices(n: int) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Indices (i, j), i < j, of every pair of ``n`` points (cached: n <= window points)."""
    i, j = np.triu_indices(n, 1)
    return i, j


def theil_sen(ts: list[float] | F64, vs: list[float] | F64) -> float:
    """Median of pairwise slopes ``(v_j - v_i) / (t_j - t_i)``; 0.0 for fewer than 2 points
    (one row of the bank's fit)."""
    t, v = np.asarray(ts, dtype=np.float64), np.asarray(vs, dtype=np.float64)
    return float(_dense_theil_sen(t[None, :], v[None, :])[0]) if len(t) >= 2 else 0.0


def _dense_theil_sen(t: F64, v: F64) -> F64:
    """Per row, the median of the pairwise slopes of its ``n`` points (every row has ``n``);
    a pair with equal times is left out."""
    n = t.shape[1]
    if n < 2:
        return np.zeros(len(t))
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
    if (np.diff(t, axis=1) == 0).any():  # tied times: their pairs left out, per row
        i, j = pair_indices(n)
        keep = t[:, j] != t[:, i]
        s = np.where(keep, (v[:, j] - v[:, i]) / np.where(keep, t[:, j] - t[:, i], 1.0), np.nan)
        out = nanmedian_rows(np.where(keep, s, np.nan))
        return np.where(keep.any(axis=1), out, 0.0)
    mid = m // 2
    slopes.partition(mid, axis=1)  # in place: no copy of the matrix
    if m % 2:
        return slopes[:, mid].copy()
    median: F64 = (slopes[:, :mid].max(axis=1) + slopes[:, mid]) / 2
    return median


def _shift_left(arrays: list[Any], rows: Rows, drop: I64, width: int) -> None:
    """Shift each row's points left by ``drop`` (NaN padding beyond)."""
    cols = np.arange(width)[None, :] + drop[:, None]
    inside = cols < width
    cols = np.minimum(cols, width - 1)
    for a in arrays:
        a[rows] = np.where(inside, np.take_along_axis(a[rows], cols, axis=1), np.nan)


def _grouped_theil_sen(t: F64, v: F64, r: Rows, lo: I64, hi: I64, width: int) -> F64:
    """Theil-Sen slope of each row's points ``lo:hi`` of ``t``/``v``. Rows are fitted in
    groups of the same ``lo:hi`` (in a steady state nearly all rows are in one or two): a
    group's slopes are one dense matrix and its median one partition."""
    out = np.zeros(len(r))
    keys, inverse = np.unique(lo * (width + 1) + hi, return_inverse=True)
    for g, key in enumerate(keys.tolist()):
        a, b = divmod(key, width + 1)
        sel = np.flatnonzero(inverse.ravel() == g)
        out[sel] = _dense_theil_sen(t[r[sel], a:b], v[r[sel], a:b])
    return out


class LeakBank:
    """Leak detectors for up to ``capacity`` rows (it grows). Rows are plain indices: the
    caller keeps the key -> row map and calls :meth:`reset` on a row it reuses."""

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
    rising: F64
    recent_slope: F64
    recent_steadiness: F64
    fblock: I64
    flo: F64
    fhi: F64
    fcount: I64
    fl_t: F64
    fl_lo: F64
    fl_hi: F64
    fhas: npt.NDArray[np.bool_]
    fslope: F64
    fsteady: F64
    known: F64
    noise: F64
    bu: F64
    fu: F64
    fl_u: F64

    # the window: the open bucket, its bucket means (left-aligned, NaN beyond ``count``), fits
    ROW_STATE = (
        "bucket", "n", "tsum", "mean", "late", "count", "pts_t", "pts_v", "has", "slope",
        "span", "level", "steadiness", "recent_slope", "recent_steadiness",
    )  # fmt: skip
    # the floor: the open block (its bucket means' min and max), the blocks' floors and highs,
    # the floor fit and the known range. Snapshots written before it lack these: they start
    # fresh (``load``).
    FLOOR_STATE = (
        "fblock", "flo", "fhi", "fcount", "fl_t", "fl_lo", "fl_hi", "fhas", "fslope",
        "fsteady", "known", "bu", "fu", "fl_u", "noise", "rising",
    )  # fmt: skip

    def __init__(self, capacity: int = 1024, **params: Any) -> None:
        self.params = p = LeakParams(**params)
        self.window_s, self.bucket_s, self.recent_s = p.window_s, p.bucket, p.recent_s
        self.min_span_s, self.min_points, self.scale_bytes = (
            p.min_span_s,
            p.min_points,
            p.scale_bytes,
        )
        # bucket means are one per bucket, in time order: a window holds at most
        # ceil(window / bucket) + 1 of them, and one more joins before the oldest leave
        self.points_max = math.ceil(p.window_s / p.bucket) + 2
        self.floor_max = math.ceil(p.floor_window_s / p.floor_block_s) + 2
        self.capacity = 0
        self._grow(max(1, capacity))

    # ------------------------------------------------------------------ state

    def _columns(self) -> dict[str, tuple[Any, Any, tuple[int, ...]]]:
        """Every per-row array: its fill, dtype and shape past the row."""
        p, f = (self.points_max,), (self.floor_max,)
        nan = np.nan
        return {
            "bucket": (NO_BUCKET, np.int64, ()), "n": (0, np.int64, ()),
            "tsum": (0.0, np.float64, ()), "mean": (0.0, np.float64, ()),
            "late": (0, np.int64, ()), "count": (0, np.int64, ()),
            "pts_t": (nan, np.float64, p), "pts_v": (nan, np.float64, p),
            "has": (False, np.bool_, ()), "slope": (nan, np.float64, ()),
            "span": (nan, np.float64, ()), "level": (nan, np.float64, ()),
            "steadiness": (nan, np.float64, ()), "recent_slope": (nan, np.float64, ()),
            "recent_steadiness": (nan, np.float64, ()),
            "fblock": (NO_BUCKET, np.int64, ()), "flo": (nan, np.float64, ()),
            "fhi": (nan, np.float64, ()), "fcount": (0, np.int64, ()),
            "bu": (nan, np.float64, ()), "fu": (nan, np.float64, ()),
            "fl_u": (nan, np.float64, f),
            "fl_t": (nan, np.float64, f), "fl_lo": (nan, np.float64, f),
            "fl_hi": (nan, np.float64, f), "fhas": (False, np.bool_, ()),
            "fslope": (nan, np.float64, ()), "fsteady": (nan, np.float64, ()),
            "known": (nan, np.float64, ()), "noise": (nan, np.float64, ()),
            "rising": (nan, np.float64, ()),
        }  # fmt: skip

    def _grow(self, capacity: int) -> None:
        old = self.capacity
        for name, (fill, dtype, shape) in self._columns().items():
            new: Any = np.full((capacity, *shape), fill, dtype=dtype)
            if old:
                new[:old] = getattr(self, name)
            setattr(self, name, new)
        self.capacity = capacity

    def reserve(self, rows: int) -> None:
        """Room for row indices below ``rows`` (doubling, so appends stay amortised)."""
        if rows > self.capacity:
            self._grow(max(rows, 2 * self.capacity))

    def reset(self, rows: npt.ArrayLike, names: tuple[str, ...] | None = None) -> None:
        """Forget the rows (a freed row reused for a new series starts afresh); ``names``:
        only those arrays."""
        r = np.asarray(rows, dtype=np.intp)
        for name, (fill, _, _) in self._columns().items():
            if names is None or name in names:
                getattr(self, name)[r] = fill

    def dump(self, rows: npt.ArrayLike) -> dict[str, bytes]:
        """The state of ``rows``, as raw little-endian arrays by name (a snapshot: typed
        data, nothing to unpickle); :meth:`load` puts it back, onto any rows."""
        r = np.asarray(rows, dtype=np.intp)
        out = {
            name: getattr(self, name)[r]
            .astype(getattr(self, name).dtype.newbyteorder("<"))
            .tobytes()
            for name in (*self.ROW_STATE, *self.FLOOR_STATE)
        }
        out["points_max"] = np.int64(self.points_max).tobytes()
        out["floor_max"] = np.int64(self.floor_max).tobytes()
        return out

    def load(self, rows: npt.ArrayLike, state: dict[str, bytes]) -> None:
        """Rows ``rows`` from a :meth:`dump` of as many rows by a bank with the same
        parameters (ValueError, with nothing changed, if it does not fit). A dump written
        before the floor existed loads its window; the floor starts fresh."""
        r = np.asarray(rows, dtype=np.intp)
        if np.frombuffer(state.get("points_max", b""), dtype="<i8").tolist() != [self.points_max]:
            raise ValueError("leak bank state of another window or bucket size")
        names: tuple[str, ...] = self.ROW_STATE
        if "floor_max" in state:
            if np.frombuffer(state["floor_max"], dtype="<i8").tolist() != [self.floor_max]:
                raise ValueError("leak bank state of another floor window or block")
            names += self.FLOOR_STATE
        parts = {name: self._part(state, name, len(r)) for name in names}
        if not ((parts["count"] >= 0) & (parts["count"] < self.points_max)).all():
            raise ValueError("leak bank state: a window of more points than it holds")
        if (
            "fcount" in parts
            and not ((parts["fcount"] >= 0) & (parts["fcount"] < self.floor_max)).all()
        ):
            raise ValueError("leak bank state: a floor of more blocks than it holds")
        if not (parts["n"] >= 0).all():
            raise ValueError("leak bank state: an open bucket of fewer than no samples")
        self.reserve(int(r.max()) + 1 if len(r) else 0)
        self.reset(r, self.FLOOR_STATE)
        for name, v in parts.items():
            getattr(self, name)[r] = v

    def _part(self, state: dict[str, bytes], name: str, n: int) -> Any:
        a = getattr(self, name)
        try:
            v = np.frombuffer(state[name], dtype=a.dtype.newbyteorder("<"))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"leak bank state: {name}: {exc!r}") from exc
        if v.size != n * (a.shape[1] if a.ndim == 2 else 1):
            raise ValueError(f"leak bank state: {name} holds {v.size} values")
        return v.reshape((n, *a.shape[1:]))

    # ------------------------------------------------------------------ learning

    def learn(
        self,
        rows: npt.ArrayLike,
        t: npt.ArrayLike,
        v: npt.ArrayLike,
        u: npt.ArrayLike | None = None,
    ) -> None:
        """Samples ``(t[i], v[i])`` of rows ``rows[i]``, in this order within each row
        (finite times and values: the caller checks), with the device's load ``u[i]`` (its
        utilisation; NaN or None: not known)."""
        r = np.asarray(rows, dtype=np.intp)
        if not len(r):
            return
        tt, vv = np.asarray(t, dtype=np.float64), np.asarray(v, dtype=np.float64)
        uu = np.full(len(r), np.nan) if u is None else np.asarray(u, dtype=np.float64)
        self.reserve(int(r.max()) + 1)
        order = np.argsort(r, kind="stable")
        sr = r[order]
        starts = np.r_[0, np.flatnonzero(sr[1:] != sr[:-1]) + 1]
        lengths = np.diff(np.r_[starts, len(sr)])
        occurrence = np.arange(len(sr)) - np.repeat(starts, lengths)
        if lengths.max() == 1:  # one sample per row: one wave
            self._wave(r, tt, vv, uu)
            return
        for k in range(int(lengths.max())):
            pick = order[occurrence == k]
            pick.sort()  # the wave in batch order (rows are distinct within it)
            self._wave(r[pick], tt[pick], vv[pick], uu[pick])

    def learn_distinct(self, rows: Rows, t: F64, v: F64, u: F64 | None = None) -> None:
        """:meth:`learn` for samples of distinct rows (one each; the caller knows), within
        capacity: one wave, without sorting the rows first."""
        if len(rows):
            self._wave(rows, t, v, np.full(len(rows), np.nan) if u is None else u)

    def _wave(self, r: Rows, t: F64, v: F64, u: F64) -> None:
        """One sample for each of the distinct rows ``r``."""
        b = np.floor(t / self.bucket_s).astype(np.int64)
        cur = self.bucket[r]
        opened = cur != NO_BUCKET
        late = opened & (b < cur)
        if late.any():
            np.add.at(self.late, r[late], 1)
            keep = ~late
            r, t, v, b, cur, opened = r[keep], t[keep], v[keep], b[keep], cur[keep], opened[keep]
            u = u[keep]
        closing = opened & (b > cur)
        if closing.any():
            self._close(r[closing])
        self.bu[r] = np.where(closing | ~opened, u, np.fmax(self.bu[r], u))
        self.bucket[r] = b
        self.tsum[r] += t
        n = self.n[r] + 1
        self.n[r] = n
        m = self.mean[r]
        self.mean[r] = m + (v / n - m / n)  # running mean: exact for constant input

    def _close(self, r: Rows) -> None:
        """Close the open bucket of rows ``r``: its mean joins the window (old points leave
        it) and its block's floor, the window is refitted."""
        newest, m, closed = self.tsum[r] / self.n[r], self.mean[r].copy(), self.bucket[r].copy()
        load = self.bu[r].copy()
        c = self.count[r]
        self.pts_t[r, c], self.pts_v[r, c] = newest, m
        c = c + 1
        self.mean[r] = self.tsum[r] = 0.0
        self.n[r] = 0
        with np.errstate(invalid="ignore"):  # NaN padding compares False
            drop = np.count_nonzero(self.pts_t[r] < (newest - self.window_s)[:, None], axis=1)
        moved = drop > 0
        if moved.any():
            _shift_left([self.pts_t, self.pts_v], r[moved], drop[moved], self.points_max)
            c[moved] -= drop[moved]
        self.count[r] = c
        for lo in range(0, len(r), FIT_CHUNK):
            self._fit(r[lo : lo + FIT_CHUNK])
        self._into_block(r, closed, m, load)

    def _fit(self, r: Rows) -> None:
        c = self.count[r]
        ts, vs = self.pts_t[r], self.pts_v[r]
        rows = np.arange(len(r))
        span = ts[rows, np.maximum(c - 1, 0)] - ts[:, 0]
        ok = (c >= self.min_points) & (span >= self.min_span_s)
        self.has[r] = ok
        for name in ("steadiness", "rising", "recent_slope", "recent_steadiness"):  # not stale
            getattr(self, name)[r[~ok]] = np.nan
        if not ok.any():
            return
        r, c, ts, vs, span = r[ok], c[ok], ts[ok], vs[ok], span[ok]
        rows = np.arange(len(r))
        newest = ts[rows, c - 1]  # a recent point: at or after the newest minus recent_s
        step = vs[:, 1:] - vs[:, :-1]  # NaN beyond count
        noise = self._noise(step)
        with np.errstate(invalid="ignore"):
            k = np.count_nonzero(ts < (newest - self.recent_s)[:, None], axis=1)
            # the fast test is a sign test (noise alone: half up, whatever its size; the
            # slope and the margin carry the size); the spread counts the steps that stand
            # out of the noise
            # a step of rounding is no rise: bucket means of a flat series differ in their
            # last bits with the order of the sums (NaN padding: False)
            up = step > ROUNDING * np.abs(vs[:, :-1])
            rise = step > noise[:, None]
        nr = c - k
        has_recent = nr >= self.min_points
        steps = np.arange(1, self.points_max)[None, :]
        up_all = np.count_nonzero(up & (steps < c[:, None]), axis=1)
        rise_all = np.count_nonzero(rise & (steps < c[:, None]), axis=1)
        up_recent = np.count_nonzero(up & (steps < c[:, None]) & (steps - 1 >= k[:, None]), axis=1)
        pm = self.points_max
        self.slope[r] = _grouped_theil_sen(self.pts_t, self.pts_v, r, np.zeros_like(c), c, pm)
        self.span[r] = span
        self.noise[r] = noise
        self.level[r] = vs[rows, c - 1]
        self.steadiness[r] = up_all / (c - 1)
        self.rising[r] = rise_all / (c - 1)
        recent = np.full(len(r), np.nan)
        if has_recent.any():
            h = has_recent
            recent[h] = _grouped_theil_sen(self.pts_t, self.pts_v, r[h], k[h], c[h], pm)
        self.recent_slope[r] = recent
        with np.errstate(all="ignore"):
            self.recent_steadiness[r] = np.where(has_recent, up_recent / (nr - 1), np.nan)

    def _noise(self, step: F64) -> F64:
        """Per row, the least bucket step that is a rise beyond noise: ``noise_k`` times the
        robust spread (1.4826 MAD, the standard deviation of Gaussian noise) of its steps
        (NaN: none), at least ``noise_floor_bytes``. Robust: a leak's steady steps move the
        median, not the spread; an allocator's few large steps are outliers to it."""
        p = self.params
        mid = nanmedian_rows(step)
        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: huge steps
            mad = nanmedian_rows(np.abs(step - mid[:, None]))
        spread: F64 = np.fmax(p.noise_k * 1.4826 * mad, p.noise_floor_bytes)
        return spread

    # ------------------------------------------------------------------ the floor

    def _into_block(self, r: Rows, bucket: I64, m: F64, load: F64) -> None:
        """A closed bucket's mean ``m`` into its block's floor and high (closing the block
        before, and refitting the floor, where the bucket opens a new one)."""
        block_s = self.params.floor_block_s
        blk = np.floor(bucket * self.bucket_s / block_s).astype(np.int64)
        cur = self.fblock[r]
        done = (cur != NO_BUCKET) & (blk > cur)
        if done.any():
            self._close_block(r[done])
        new = blk != cur
        self.flo[r] = np.where(new, m, np.fmin(self.flo[r], m))
        self.fhi[r] = np.where(new, m, np.fmax(self.fhi[r], m))
        self.fu[r] = np.where(new, load, np.fmax(self.fu[r], load))
        self.fblock[r] = blk

    def _close_block(self, r: Rows) -> None:
        p = self.params
        t = (self.fblock[r] + 0.5) * p.floor_block_s
        c = self.fcount[r]
        self.fl_t[r, c], self.fl_lo[r, c], self.fl_hi[r, c] = t, self.flo[r], self.fhi[r]
        self.fl_u[r, c] = self.fu[r]
        c = c + 1
        with np.errstate(invalid="ignore"):
            drop = np.count_nonzero(self.fl_t[r] < (t - p.floor_window_s)[:, None], axis=1)
        moved = drop > 0
        if moved.any():
            arrays = [self.fl_t, self.fl_lo, self.fl_hi, self.fl_u]
            _shift_left(arrays, r[moved], drop[moved], self.floor_max)
            c[moved] -= drop[moved]
        self.fcount[r] = c
        self._fit_floor(r)

    def _fit_floor(self, r: Rows) -> None:
        """The floor's slope and steadiness over the horizon, and the known range."""
        p, width = self.params, self.floor_max
        c, k = self._horizon(r)
        ok = c - k >= 3
        slope = np.full(len(r), np.nan)
        if ok.any():
            slope[ok] = _grouped_theil_sen(self.fl_t, self.fl_lo, r[ok], k[ok], c[ok], width)
        self.fhas[r], self.fslope[r] = ok, slope
        self.fsteady[r] = self._steadiness(r, k, c)
        cols = np.arange(width)[None, :]
        exclude = math.ceil(p.recent_s / p.floor_block_s)  # the current rise is not its own range
        older = cols < (c - exclude)[:, None]
        with np.errstate(invalid="ignore"):
            high = np.where(older, self.fl_hi[r], -np.inf).max(axis=1)
        self.known[r] = high  # -inf: no range held and left yet (a young series)

    def _steadiness(self, r: Rows, k: I64, c: I64) -> F64:
        """The share of steps between the low-water marks of consecutive groups of
        ``floor_group`` blocks (newest first, within the horizon) that rose while the load
        stayed within its known range: a caching allocator holds the peak of its working
        set, so its memory rises with each new high of the load (a morning's ramp) and then
        stops; a leak rises whatever the load does. NaN under three groups (a rise must hold
        over an hour and a half)."""
        g = self.params.floor_group
        cols = np.arange(self.floor_max)[None, :]
        groups = (c - k) // g
        lo_u = self.fl_u[r]
        noise = np.fmax(self.noise[r], self.params.noise_floor_bytes)  # NaN: the floor only
        marks, highs = [], []
        for j in range(int(groups.max(initial=0))):
            lo, hi = c - g * (j + 1), c - g * j
            inside = (cols >= lo[:, None]) & (cols < hi[:, None]) & (j < groups)[:, None]
            before = cols < lo[:, None]
            with np.errstate(invalid="ignore"):
                marks.append(np.where(inside, self.fl_lo[r], np.inf).min(axis=1))
                load = np.where(inside & ~np.isnan(lo_u), lo_u, -np.inf).max(axis=1)
                prior = np.where(before & ~np.isnan(lo_u), lo_u, -np.inf).max(axis=1)
                highs.append(load > prior)
        ups = np.zeros(len(r))
        for j in range(len(marks) - 1):
            with np.errstate(invalid="ignore"):  # inf - inf: a group with no blocks
                rose = marks[j] - marks[j + 1] > noise
            ups += (j + 1 < groups) & rose & ~highs[j]
        with np.errstate(all="ignore"):
            return np.where(groups >= 3, ups / (groups - 1), np.nan)

    # ------------------------------------------------------------------ reading

    def leak_rates(self, rows: npt.ArrayLike) -> F64:
        """Each row's leak rate (bytes/s): the floor's slope once established, else the
        fast slope where the fast test holds, else 0; NaN while the row warms up."""
        r = np.asarray(rows, dtype=np.intp)
        p, hour = self.params, 3600 / GB
        with np.errstate(invalid="ignore"):
            fast = (
                (self.recent_slope[r] * hour > p.fast_gb_per_hour)
                & (self.recent_steadiness[r] > p.fast_steadiness)
                & (
                    self.level[r] - self.known[r]
                    > p.margin_bytes + ROUNDING * np.abs(self.level[r])
                )
                & self.whole_recent(r)
            )
            slow = (
                (self.fsteady[r] >= p.floor_steadiness)
                & (self.fslope[r] * hour > p.floor_gb_per_hour)
                & (self.rising[r] >= p.spread)
                & (self.level[r] > self._horizon_low(r))  # not all given back (restart, OOM)
            )
        # both: the larger (the floor lags a leak's start; the fast slope is its rate now)
        floor = np.where(slow & self.fhas[r], self.fslope[r], 0.0)
        rate = np.fmax(floor, np.where(fast, self.recent_slope[r], 0.0))
        return np.where(self.has[r] | self.fhas[r], rate, np.nan)

    def _horizon(self, r: Rows) -> tuple[I64, I64]:
        """Each row's count of floor blocks, and how many of them are older than the floor's
        horizon (before its newest block's time less ``floor_horizon_s``)."""
        c = self.fcount[r]
        newest = self.fl_t[r, np.maximum(c - 1, 0)]
        with np.errstate(invalid="ignore"):
            k = np.count_nonzero(self.fl_t[r] < (newest - self.params.floor_horizon_s)[:, None], 1)
        return c, k

    def _horizon_low(self, r: Rows) -> F64:
        """Each row's low-water mark at the start of the floor's horizon (its oldest
        ``floor_group`` blocks; NaN: no block): memory now at or below it gave back all the
        horizon's growth (a restart, an OOM kill), and the floor's slope is history."""
        c, k = self._horizon(r)
        cols = np.arange(self.floor_max)[None, :]
        first = (cols >= k[:, None]) & (cols < np.minimum(k + self.params.floor_group, c)[:, None])
        low = np.where(first, self.fl_lo[r], np.inf).min(axis=1)
        return np.where((c > 0) & np.isfinite(low), low, np.nan)

    def whole_recent(self, rows: npt.ArrayLike) -> npt.NDArray[np.bool_]:
        """Whether each row's window holds a whole fast horizon of data (``recent_s`` less a
        bucket): the fast test asks it, and a GPU's attribution asks it of its processes."""
        r = np.asarray(rows, dtype=np.intp)
        with np.errstate(invalid="ignore"):
            return self.span[r] >= self.params.recent_s - self.params.bucket

    def scores(self, rows: npt.ArrayLike) -> F64:
        """Each row's score in [0, 1]: the growth over ``window_s`` at its leak rate, as
        ``g / (g + scale_bytes)`` (0.5 at 1 GB); 0 without a leak or while warming up."""
        g = np.nan_to_num(self.leak_rates(rows), nan=0.0) * self.window_s
        with np.errstate(all="ignore"):
            s = np.where(np.isinf(g), 1.0, g / (g + self.scale_bytes))
        return np.where(g > 0, s, 0.0)

    def estimate(self, row: int) -> LeakEstimate | None:
        """Row ``row``'s estimate (None while warming up)."""
        if row >= self.capacity or not self.has[row]:
            return None

        def opt(a: F64) -> float | None:
            x = float(a[row])
            return None if math.isnan(x) else x

        slope, span = float(self.slope[row]), float(self.span[row])
        level = float(self.level[row])
        return LeakEstimate(
            slope,
            slope * span,
            span,
            level,
            int(self.count[row]),
            float(self.steadiness[row]),
            opt(self.recent_slope),
            opt(self.recent_steadiness) if opt(self.recent_slope) is not None else None,
            opt(self.fslope),
            opt(self.fsteady),
            level - float(self.known[row]) if math.isfinite(self.known[row]) else None,
            float(self.leak_rates([row])[0]),
            float(self.rising[row]),
        )
