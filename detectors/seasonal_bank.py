"""Many seasonal baselines in arrays: :class:`SeasonalBank` runs
:class:`~.seasonal.SeasonalBaseline`'s algorithm for N series at once, a row per series.

The object stays the executable specification: ``tests/unit/test_seasonal_bank.py`` holds
the bank to it bit for bit (the same calls on a row and on an object give identical
forecasts, hold results and state, down to every slot of an exported object). The hot
path (the Kalman update of :meth:`~SeasonalBank.learn`, :meth:`~SeasonalBank.forecast`,
:meth:`~SeasonalBank.hold`) is one set of array operations per call, its branches masks;
what happens once a day per row (a new day's cells, the profile refresh) runs per row in
Python with the object's arithmetic (``statistics.median`` / ``fmean`` / ``pvariance``).

Exactness: ``+ - * /``, comparisons and ``np.floor`` / ``np.mod`` are IEEE-exact and
match Python's float operators (``np.mod`` has Python's sign rule); numpy's ``**`` with
other exponents than 2 does not always (SIMD), so ``damping ** steps`` and ``k ** 3`` are
Python's, element by element. Python's ``min`` / ``max`` (the first argument unless the
other compares smaller / larger: NaN-sensitive) are :func:`_pymin` / :func:`_pymax`.
Where the object raises, so does the bank: a profile refresh over offsets beyond ~1e154
(``statistics.pvariance`` overflows) raises OverflowError, and both are then left part-way
through the call; ``t`` must keep ``|t / season_s|`` below 2**62 (a day number in int64).

State. Per row, 1-D arrays of the object's scalars (``level`` = ``_l``, ``trend`` = ``_b``,
``p00``, ``p01``, ``p11``, ``at`` = ``_t``, ``n``, ``model_var``, ``run``, ``drift``,
``day``, ``cur`` = ``_row``, ``refreshed``, ``held_since``, ``held_q``, ``rel_*`` =
``relearned``, ``late``, ``outliers``; NaN, or ``NO_DAY`` for the day, where the object has
None), the profile as ``(rows, slots)`` with the flag ``profiled``, and the day table
``row_day`` / ``row_pool`` ``(rows, days)``: a row's k-th day (in the order the object
allocated them) and the pool row holding its cells (-1: none). Cells live in a shared pool
``cell_w`` / ``cell_zw`` ``(pool, slots)`` with a free list: a row holds a pool row per day
seen (at most ``days``), as the object holds a row of cells per day, and :meth:`reset`
gives them back.

>>> proto = SeasonalBaseline(step_s=60.0)
>>> bank = SeasonalBank(proto, capacity=2)
>>> obj = proto.clone()
>>> T0 = 1_767_225_600.0
>>> for i in range(10):
...     bank.learn([0, 1], T0 + 60 * i, [1.0, 2.0], 0.01)
...     obj.learn(T0 + 60 * i, 2.0, 0.01)
>>> mean, var, noise = bank.forecast([0, 1], T0 + 600)
>>> mean.round(3).tolist(), float(mean[1]) == obj.forecast(T0 + 600).mean
([1.0, 2.0], True)
>>> bank.export(1).forecast(T0 + 600) == obj.forecast(T0 + 600)
True
"""

from __future__ import annotations

import math
import statistics
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ragwatch.detectors.seasonal import (
    DRIFT_ALPHA,
    HOLD_DRIFT,
    OUTLIER_RUN,
    PROFILED_TREND,
    UNPROFILED_HOLD_S,
    Relearned,
    SeasonalBaseline,
)

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
IDX = npt.NDArray[np.intp]
BOOL = npt.NDArray[np.bool_]
NO_DAY = int(np.iinfo(np.int64).min)  # a row that has seen no day (the object's None)
DAY_LIMIT = 2.0**62  # |t / season_s| must stay below: a day number fits an int64
VERSION = 1
UNIQUE_FROM = 64  # from this many values, a power is computed once per distinct value
NAN = math.nan
PARAMS = (
    "step_s", "season_s", "slot_s", "days", "level_noise", "trend_noise", "damping",
    "min_coverage", "warmup", "hold_max_s", "outlier_z", "unprofiled_hold_s",
)  # fmt: skip
# per-row arrays: name -> (dtype, a fresh baseline's value)
FIELDS: dict[str, tuple[type[np.generic], float]] = {
    "level": (np.float64, 0.0), "trend": (np.float64, 0.0), "p00": (np.float64, 1e6),
    "p01": (np.float64, 0.0), "p11": (np.float64, 0.0), "at": (np.float64, NAN),
    "n": (np.int64, 0), "model_var": (np.float64, 0.0), "run": (np.int8, 0),
    "drift": (np.float64, 0.0), "day": (np.int64, NO_DAY), "cur": (np.int32, 0),
    "refreshed": (np.float64, NAN), "held_since": (np.float64, NAN),
    "held_q": (np.float64, NAN), "rel_at": (np.float64, NAN),
    "rel_held_s": (np.float64, NAN), "rel_before": (np.float64, NAN),
    "rel_after": (np.float64, NAN), "late": (np.int64, 0), "outliers": (np.int64, 0),
    "profiled": (np.bool_, False),
}  # fmt: skip
# the object's scalar slots and the arrays holding them; OPTIONAL ones may be None
SLOTS = (
    ("_l", "level"), ("_b", "trend"), ("_p00", "p00"), ("_p01", "p01"), ("_p11", "p11"),
    ("_t", "at"), ("_n", "n"), ("model_var", "model_var"), ("_run", "run"),
    ("_drift", "drift"), ("_day", "day"), ("_row", "cur"), ("_refreshed", "refreshed"),
    ("_held_since", "held_since"), ("_held_q", "held_q"), ("late", "late"),
    ("outliers", "outliers"),
)  # fmt: skip
OPTIONAL = {"_t", "_day", "_refreshed", "_held_since", "_held_q"}


def _pymax(a: Any, b: Any) -> F64:
    """Python's ``max(a, b)`` element-wise: ``a`` unless ``b > a`` (so NaN ``b`` gives
    ``a``, and ``max(0.0, -0.0)`` is ``0.0``).

    >>> _pymax(0.0, np.array([-1.0, 2.0, np.nan])).tolist()
    [0.0, 2.0, 0.0]
    """
    out: F64 = np.where(b > a, b, a)
    return out


def _pymin(a: Any, b: Any) -> F64:
    """Python's ``min(a, b)`` element-wise: ``a`` unless ``b < a``.

    >>> _pymin(np.array([1.0, np.nan]), 0.5).tolist()
    [0.5, nan]
    """
    out: F64 = np.where(b < a, b, a)
    return out


def _pypow(base: float, x: F64) -> F64:
    """``base ** x`` element-wise by Python's float power (numpy's SIMD power can differ
    in the last bit), each distinct ``x`` once where there are many (rows on one time grid
    share their steps).

    >>> _pypow(0.5, np.array([0.0, 1.0, 3.0])).tolist()
    [1.0, 0.5, 0.125]
    """
    if len(x) < UNIQUE_FROM:
        return np.array([base**v for v in x.tolist()], dtype=np.float64)
    u, inverse = np.unique(x, return_inverse=True)
    out: F64 = np.array([base**v for v in u.tolist()], dtype=np.float64)[inverse]
    return out


def _opt(v: float) -> float | None:
    return None if math.isnan(v) else v


@dataclass(frozen=True, slots=True)
class _Grid:
    """What the per-day Python code needs of the parameters."""

    season_s: float
    slot_s: float
    slots: int
    days: int
    min_coverage: float


def _offset(g: _Grid, p: Sequence[float], t: float) -> float:
    """``SeasonalBaseline.profile_at`` with profile ``p`` (a list: Python floats)."""
    pos = (t % g.season_s) / g.slot_s - 0.5
    lo = math.floor(pos)
    frac = pos - lo
    return p[lo % g.slots] * (1 - frac) + p[(lo + 1) % g.slots] * frac


def _curve(
    g: _Grid, end: float, newest: int, row_day: list[int], w: list[float], zw: list[float]
) -> tuple[list[float], list[float]] | None:
    """``SeasonalBaseline._curve`` over cells ``w`` / ``zw`` (rows in ``row_day`` order)."""
    raw, var, known = [math.nan] * g.slots, [math.nan] * g.slots, []
    for s in range(g.slots):
        day = math.floor((end - (s + 1) * g.slot_s) / g.season_s)
        if day <= newest - g.days or day not in row_day:
            continue
        i = row_day.index(day) * g.slots + s
        if w[i] > 0:
            raw[s], var[s] = zw[i] / w[i], 1.0 / w[i]
            known.append(s)
    if len(known) < g.min_coverage * g.slots:
        return None
    for a, b in zip(known, [*known[1:], known[0] + g.slots], strict=True):
        for j in range(a + 1, b):
            frac = (j - a) / (b - a)
            raw[j % g.slots] = raw[a] + (raw[b % g.slots] - raw[a]) * frac
            var[j % g.slots] = 2 * max(var[a], var[b % g.slots])
    mean = statistics.fmean(raw)
    return [v - mean for v in raw], var


def _combine(curves: list[tuple[list[float], list[float]]], n: int) -> tuple[Any, Any]:
    """The days' curves into one (median from 3 days, else mean) and its variances."""
    m = len(curves)
    if m >= 3:
        new = [statistics.median(c[0][s] for c in curves) for s in range(n)]
        var = [math.pi / 2 * sum(c[1][s] for c in curves) / m**2 for s in range(n)]
    else:
        new = [statistics.fmean(c[0][s] for c in curves) for s in range(n)]
        var = [sum(c[1][s] for c in curves) / m**2 for s in range(n)]
    return new, var


def _daily_profile(
    g: _Grid, t: float, newest: int, row_day: list[int], w: list[float], zw: list[float]
) -> list[float] | None:
    """The new profile ``SeasonalBaseline._refresh_profile`` computes at ``t`` (None: no
    day has enough slots), with its arithmetic, in its order."""
    curves = [
        c for k in range(g.days) if (c := _curve(g, t - k * g.season_s, newest, row_day, w, zw))
    ]
    if not curves:
        return None
    n = g.slots
    new, var = _combine(curves, n)
    smooth = [0.25 * new[i - 1] + 0.5 * new[i] + 0.25 * new[(i + 1) % n] for i in range(n)]
    svar = [0.0625 * var[i - 1] + 0.25 * var[i] + 0.0625 * var[(i + 1) % n] for i in range(n)]
    mean = statistics.fmean(smooth)
    rhythm = max(0.0, statistics.pvariance(smooth) - statistics.fmean(svar))
    return [
        (v - mean) * (rhythm / (rhythm + sv) if rhythm + sv > 0 else 0.0)
        for v, sv in zip(smooth, svar, strict=True)
    ]


class SeasonalBank:
    """Seasonal baselines for rows ``0 .. capacity - 1`` (it grows), all with ``proto``'s
    parameters. Rows are plain indices: the caller keeps the key -> row map and calls
    :meth:`reset` on a row it reuses. Within one write call rows must be distinct."""

    level: F64
    trend: F64
    p00: F64
    p01: F64
    p11: F64
    at: F64
    n: I64
    model_var: F64
    run: npt.NDArray[np.int8]
    drift: F64
    day: I64
    cur: npt.NDArray[np.int32]
    refreshed: F64
    held_since: F64
    held_q: F64
    rel_at: F64
    rel_held_s: F64
    rel_before: F64
    rel_after: F64
    late: I64
    outliers: I64
    profiled: BOOL
    profile: F64
    row_day: I64
    row_pool: npt.NDArray[np.int32]
    cell_w: F64
    cell_zw: F64

    def __init__(self, proto: SeasonalBaseline, capacity: int = 16) -> None:
        self._proto = proto.clone()
        self.params = tuple(getattr(self._proto, name) for name in PARAMS)
        p = self._proto
        self.step_s, self.season_s, self.slot_s = p.step_s, p.season_s, p.slot_s
        self.slots, self.days, self.warmup = p.slots, p.days, p.warmup
        self.damping, self.hold_max_s = p.damping, p.hold_max_s
        self.unprofiled_hold_s = p.unprofiled_hold_s
        self._grid = _Grid(p.season_s, p.slot_s, p.slots, p.days, p.min_coverage)
        # the object's scalar expressions, computed as it computes them (Python floats)
        self._ln2, self._oz2 = p.level_noise**2, p.outlier_z**2
        self._one_minus_d = 1 - p.damping
        self._tq = (p.trend_noise * PROFILED_TREND, p.trend_noise * 1.0)  # profile / none
        self._tq2 = (self._tq[0] ** 2, self._tq[1] ** 2)
        self._p11_restart = p.trend_noise**2 * 100
        self._p11_profiled = (p.trend_noise * PROFILED_TREND) ** 2 * 100
        self.capacity = 0
        self.cell_w = self.cell_zw = np.zeros((0, self.slots))
        self._free: IDX = np.zeros(0, dtype=np.intp)
        self._nfree = 0
        self._grow(max(1, capacity))
        self._grow_pool(max(1, capacity))

    @property
    def proto(self) -> SeasonalBaseline:
        """A fresh baseline with the bank's parameters (a new bank of the same kind is
        ``SeasonalBank(bank.proto)``)."""
        return self._proto.clone()

    # ------------------------------------------------------------------ storage

    def _grow(self, capacity: int) -> None:
        old = self.capacity

        def extend(name: str, shape: tuple[int, ...], dt: type[np.generic], fill: float) -> None:
            new: Any = np.full(shape, fill, dtype=dt)
            if old:
                new[:old] = getattr(self, name)
            setattr(self, name, new)

        for name, (dt, fresh) in FIELDS.items():
            extend(name, (capacity,), dt, fresh)
        extend("profile", (capacity, self.slots), np.float64, 0.0)
        extend("row_day", (capacity, self.days), np.int64, 0)
        extend("row_pool", (capacity, self.days), np.int32, -1)
        self.capacity = capacity

    def _grow_pool(self, extra: int) -> None:
        old = len(self.cell_w)
        cap = max(old + extra, old + old // 4 + 16)  # a quarter more: memory matters
        for name in ("cell_w", "cell_zw"):
            new = np.zeros((cap, self.slots))
            new[:old] = getattr(self, name)
            setattr(self, name, new)
        free = np.empty(cap, dtype=np.intp)
        free[: self._nfree] = self._free[: self._nfree]
        free[self._nfree : self._nfree + cap - old] = np.arange(cap - 1, old - 1, -1)
        self._free, self._nfree = free, self._nfree + cap - old

    def _alloc(self, k: int) -> IDX:
        """``k`` pool rows, zeroed (a new day's cells start empty)."""
        if k > self._nfree:
            self._grow_pool(k - self._nfree)
        p = self._free[self._nfree - k : self._nfree].copy()
        self._nfree -= k
        self.cell_w[p] = self.cell_zw[p] = 0.0
        return p

    def _release(self, p: npt.NDArray[Any]) -> None:
        self._free[self._nfree : self._nfree + len(p)] = p
        self._nfree += len(p)

    def reserve(self, n: int) -> None:
        """Room for rows ``0 .. n - 1`` (doubling, so appends stay amortised)."""
        if n > self.capacity:
            self._grow(max(n, 2 * self.capacity))

    def reset(self, rows: npt.ArrayLike) -> None:
        """Rows back to a fresh baseline (``proto.clone()``); their pool rows go back."""
        r = np.unique(self._rows(rows))
        if not len(r):
            return
        self.reserve(int(r.max()) + 1)
        pools = self.row_pool[r]
        self._release(pools[pools >= 0])
        self.row_pool[r], self.row_day[r], self.profile[r] = -1, 0, 0.0
        for name, (_, fresh) in FIELDS.items():
            getattr(self, name)[r] = fresh

    def nbytes(self) -> int:
        """Bytes held by the arrays (rows, pool and free list)."""
        names = (*FIELDS, "profile", "row_day", "row_pool", "cell_w", "cell_zw", "_free")
        return sum(int(getattr(self, name).nbytes) for name in names)

    def nrows(self, rows: npt.ArrayLike) -> I64:
        """How many days' cells each row holds (pool rows in use)."""
        counts: I64 = (self.row_pool[self._read(rows)] >= 0).sum(axis=1)
        return counts

    # ------------------------------------------------------------------ arguments

    @staticmethod
    def _rows(rows: npt.ArrayLike) -> IDX:
        r = np.asarray(rows, dtype=np.intp).reshape(-1)
        if len(r) and r.min() < 0:
            raise ValueError("seasonal bank: rows must be >= 0")
        return r

    def _read(self, rows: npt.ArrayLike) -> IDX:
        r = self._rows(rows)
        if len(r) and r.max() >= self.capacity:
            raise ValueError(f"seasonal bank: row {int(r.max())} beyond {self.capacity}")
        return r

    def _write(self, rows: npt.ArrayLike) -> IDX:
        r = self._rows(rows)
        if not (r[1:] > r[:-1]).all() and (np.diff(np.sort(r)) == 0).any():  # sorted: cheap
            raise ValueError("seasonal bank: rows of one write call must be distinct")
        return r

    @staticmethod
    def _column(a: npt.ArrayLike, r: IDX, dtype: type[np.generic] = np.float64) -> Any:
        col = np.asarray(a, dtype=dtype)
        return col if col.shape == r.shape else np.broadcast_to(col, r.shape)

    def _check_times(self, t: F64) -> None:
        if not (np.isfinite(t).all() and (np.abs(t / self.season_s) < DAY_LIMIT).all()):
            raise ValueError(f"seasonal bank: need finite t within day range, got {t!r}")

    # ------------------------------------------------------------------ reading

    def ready(self, rows: npt.ArrayLike) -> BOOL:
        """Whether each row has learnt ``warmup`` observations."""
        out: BOOL = self.n[self._read(rows)] >= self.warmup
        return out

    def holding(self, rows: npt.ArrayLike) -> BOOL:
        out: BOOL = ~np.isnan(self.held_since[self._read(rows)])
        return out

    def has_profile(self, rows: npt.ArrayLike) -> BOOL:
        return self.profiled[self._read(rows)].copy()

    def held_s(self, rows: npt.ArrayLike, t: npt.ArrayLike) -> F64:
        """How long each row has been held at ``t`` (0 when it is learning)."""
        r = self._read(rows)
        hs = self.held_since[r]
        with np.errstate(all="ignore"):
            return np.where(np.isnan(hs), 0.0, _pymax(0.0, self._column(t, r) - hs))

    def relearned(self, rows: npt.ArrayLike) -> tuple[F64, F64, F64, F64]:
        """Each row's last accepted level: ``at``, ``held_s``, ``before``, ``after`` (NaN
        where the object's ``relearned`` is None: ``at`` is NaN exactly then)."""
        r = self._read(rows)
        return self.rel_at[r], self.rel_held_s[r], self.rel_before[r], self.rel_after[r]

    def profile_at(self, rows: npt.ArrayLike, t: npt.ArrayLike) -> F64:
        """Each row's profile offset at ``t`` (0 without a profile)."""
        r = self._read(rows)
        with np.errstate(all="ignore"):
            return self._profile_at(r, self._column(t, r))

    def forecast(self, rows: npt.ArrayLike, t: npt.ArrayLike) -> tuple[F64, F64, F64]:
        """Each row's forecast at ``t``: mean, var, noise (NaN in all three where the
        object returns None)."""
        r = self._read(rows)
        with np.errstate(all="ignore"):
            return self._forecast(r, self._column(t, r))

    def _profile_at(self, r: IDX, t: F64) -> F64:
        has = self.profiled[r]
        out = np.zeros(len(r))
        if has.any():
            rp, tp = r[has], t[has]
            if not np.isfinite(tp).all():  # the object's math.floor(nan) raises
                raise ValueError("seasonal bank: a profile needs a finite t")
            pos = np.mod(tp, self.season_s) / self.slot_s - 0.5
            lo = np.floor(pos)
            frac = pos - lo
            i = lo.astype(np.int64) % self.slots
            p = self.profile
            out[has] = p[rp, i] * (1 - frac) + p[rp, (i + 1) % self.slots] * frac
        return out

    def _decay(self, steps: F64) -> F64:
        """``damping ** steps``, by Python's float power."""
        if self.damping == 1.0:
            return np.ones(len(steps))
        return _pypow(self.damping, steps)

    def _reach(self, steps: F64, decay: F64) -> F64:
        return steps if self.damping == 1.0 else (1 - decay) / self._one_minus_d

    def _trend_q(self, r: IDX) -> F64:
        return np.where(self.profiled[r], self._tq[0], self._tq[1])

    def _forecast(self, r: IDX, t: F64) -> tuple[F64, F64, F64]:
        mean, var, noise = np.full(len(r), NAN), np.full(len(r), NAN), np.full(len(r), NAN)
        ok = (self.n[r] >= self.warmup) & ~np.isnan(self.at[r])
        r, t = r[ok], t[ok]
        hs = self.held_since[r]
        horizon = np.where(np.isnan(hs), t, _pymin(t, hs))
        steps = _pymax(0.0, (horizon - self.at[r]) / self.step_s)
        reach = self._reach(steps, self._decay(steps))
        level = self.level[r] + self.trend[r] * reach
        v = self.p00[r] + 2 * reach * self.p01[r] + reach * reach * self.p11[r]
        v = v + steps * self._ln2
        mean[ok] = level + self._profile_at(r, t)
        var[ok] = v + self._held_var(r, t)
        noise[ok] = self.model_var[r]
        return mean, var, noise

    def _held_var(self, r: IDX, t: F64) -> F64:
        """``SeasonalBaseline._held_var`` (``k ** 3`` by Python's power)."""
        out = np.zeros(len(r))
        hs, at = self.held_since[r], self.at[r]
        on = ~np.isnan(hs) & ~np.isnan(at)
        if on.any():
            ro = r[on]
            k = _pymax(0.0, (t[on] - _pymax(hs[on], at[on])) / self.step_s)
            hq = self.held_q[ro]
            q = np.where(np.isnan(hq), self._trend_q(ro), hq)
            k3 = np.array([x**3 for x in k.tolist()], dtype=np.float64)
            out[on] = k * self._ln2 + k * k * self.p11[ro] + q * q * k3 / 3
        return out

    # ------------------------------------------------------------------ learning

    def learn(
        self,
        rows: npt.ArrayLike,
        t: npt.ArrayLike,
        z: npt.ArrayLike,
        var: npt.ArrayLike,
        steps: npt.ArrayLike = 1.0,
    ) -> None:
        """``SeasonalBaseline.learn(t, z, var, steps)`` on each of the distinct ``rows``
        (ValueError, with nothing changed, on a non-finite t / z / var or var < 0)."""
        r = self._write(rows)
        tt, zz, vv, ss = (self._column(a, r) for a in (t, z, var, steps))
        if not (np.isfinite(zz).all() and np.isfinite(vv).all() and (vv >= 0).all()):
            raise ValueError("seasonal: need finite t, z and var >= 0")
        self._check_times(tt)
        if not len(r):
            return
        self.reserve(int(r.max()) + 1)
        with np.errstate(all="ignore"):
            ss = np.where(np.isfinite(ss), _pymax(1.0, ss), 1.0)
            self._learn(r, tt, zz, vv, ss)

    def _learn(self, r: IDX, t: F64, z: F64, var: F64, ss: F64) -> None:
        late = t < self.at[r]  # NaN (no state yet) compares False
        if late.any():
            self.late[r[late]] += 1
            r, t, z, var, ss = r[~late], t[~late], z[~late], var[~late], ss[~late]
        self._roll_day(r, t)
        free = np.isnan(self.held_since[r])  # held: nothing is learnt
        r, t, z, var, ss = r[free], t[free], z[free], var[free], ss[free]
        y = z - self._profile_at(r, t)
        fresh = (self.n[r] == 0) | np.isnan(self.at[r])
        self._restart(r[fresh], t[fresh], y[fresh])
        u = ~fresh
        self._update(r[u], t[u], y[u], var[u], ss[u])
        w = 1.0 / (var + self.model_var[r] / ss + 1e-6)
        pool = self.row_pool[r, self.cur[r]]
        slot = np.floor(np.mod(t, self.season_s) / self.slot_s).astype(np.int64) % self.slots
        self.cell_w[pool, slot] += w
        self.cell_zw[pool, slot] += w * z

    def _restart(self, r: IDX, t: F64, y: F64) -> None:
        self.run[r], self.level[r], self.trend[r] = 0, y, 0.0
        self.p00[r], self.p01[r], self.p11[r] = 1.0, 0.0, self._p11_restart
        self.at[r], self.n[r] = t, 1

    def _predict(self, r: IDX, t: F64) -> tuple[F64, F64, F64, F64, F64]:
        """The Kalman predict of ``SeasonalBaseline._update``: level, trend, P at ``t``."""
        steps = _pymax(0.0, (t - self.at[r]) / self.step_s)
        decay = self._decay(steps)
        reach = self._reach(steps, decay)
        b, p01, p11 = self.trend[r], self.p01[r], self.p11[r]
        level, trend = self.level[r] + reach * b, decay * b
        p00 = self.p00[r] + 2 * reach * p01 + reach * reach * p11
        p01, p11 = decay * (p01 + reach * p11), decay * decay * p11
        p00 = p00 + steps * self._ln2
        p11 = p11 + steps * np.where(self.profiled[r], self._tq2[0], self._tq2[1])
        return level, trend, p00, p01, p11

    def _update(self, r: IDX, t: F64, y: F64, var: F64, ss: F64) -> None:
        """``SeasonalBaseline._update`` for rows ``r``, its branches as masks."""
        level, trend, p00, p01, p11 = self._predict(r, t)
        nu = y - level
        nn, mv = nu * nu, self.model_var[r]
        s = p00 + var + mv / ss
        excess = np.where(s > 0, (_pymin(nn, 9 * s) - p00 - var) * ss, nn)
        mv = _pymax(0.0, mv + 0.02 * (excess - mv))
        self.model_var[r] = mv
        spike, step = self._outliers(r, nu, nn, s)
        p00 = np.where(step, p00 + nn, p00)
        s = np.where(step, p00 + var + mv / ss, s)
        k = ~spike
        self.run[r[k]] = 0
        state = self._correct(nu[k], s[k], level[k], trend[k], p00[k], p01[k], p11[k])
        self._store(r[k], t[k], y[k], state, mv[k])

    def _outliers(self, r: IDX, nu: F64, nn: F64, s: F64) -> tuple[BOOL, BOOL]:
        """Which innovations are spikes (not learnt, counted) and which steps (the
        ``OUTLIER_RUN``-th in a row on one side: learnt); the run of each row."""
        out = (s > 0) & (nn > self._oz2 * s)
        side = np.where(nu > 0, 1, -1)
        run = self.run[r].astype(np.int64)
        run = np.where(run * side > 0, run + side, side)
        spike = out & (np.abs(run) < OUTLIER_RUN)
        self.run[r[out]] = run[out]
        self.outliers[r[spike]] += 1
        return spike, out & ~spike

    @staticmethod
    def _correct(
        nu: F64, s: F64, level: F64, trend: F64, p00: F64, p01: F64, p11: F64
    ) -> tuple[F64, F64, F64, F64, F64]:
        """The Kalman update with innovation ``nu`` of variance ``s`` (none if s <= 0)."""
        upd = s > 0
        k0, k1 = p00 / s, p01 / s
        return (
            np.where(upd, level + k0 * nu, level),
            np.where(upd, trend + k1 * nu, trend),
            np.where(upd, (1 - k0) * p00, p00),
            np.where(upd, (1 - k0) * p01, p01),
            np.where(upd, p11 - k1 * p01, p11),
        )

    def _store(
        self, r: IDX, t: F64, y: F64, state: tuple[F64, F64, F64, F64, F64], mv: F64
    ) -> None:
        """Keep the updated state, or start over where it overflowed."""
        fine = np.isfinite(mv)
        for a in state:
            fine &= np.isfinite(a)
        bad = ~fine
        self.model_var[r[bad]] = 0.0
        self._restart(r[bad], t[bad], y[bad])
        g = r[fine]
        level, trend, p00, p01, p11 = (a[fine] for a in state)
        self.level[g], self.trend[g] = level, trend
        self.p00[g], self.p01[g], self.p11[g] = p00, p01, p11
        self.drift[g] += DRIFT_ALPHA * (np.abs(trend) - self.drift[g])
        self.at[g] = t[fine]
        self.n[g] = np.minimum(self.n[g] + 1, self.warmup)

    # ------------------------------------------------------------------ days

    def _roll_day(self, r: IDX, t: F64) -> None:
        """``SeasonalBaseline._roll_day``: a new day's cells; the refresh once a season."""
        day = np.floor(t / self.season_s).astype(np.int64)
        new = day != self.day[r]
        if new.any():
            self._start_rows(r[new], day[new])
        ref = self.refreshed[r]
        due = t - ref >= self.season_s  # NaN (never stamped) compares False
        stamp = np.isnan(ref) | due
        self.refreshed[r[stamp]] = t[stamp]
        for row, tt in zip(r[due].tolist(), t[due].tolist(), strict=True):
            self._refresh(row, tt)

    def _start_rows(self, r: IDX, day: I64) -> None:
        """``SeasonalBaseline._start_row`` for rows ``r``: the day's own cells if held,
        else a new pool row while fewer than ``days`` are held, else the oldest day's."""
        self.day[r] = day
        pools, days = self.row_pool[r], self.row_day[r]
        used = pools >= 0
        count = used.sum(axis=1)
        match = used & (days == day[:, None])
        cur = np.argmax(match, axis=1)
        found = match.any(axis=1)
        grow = ~found & (count < self.days)
        if grow.any():
            rg, cg = r[grow], count[grow]
            self.row_pool[rg, cg] = self._alloc(len(rg))
            self.row_day[rg, cg] = day[grow]
            cur[grow] = cg
        old = ~found & ~grow
        if old.any():
            ro = r[old]
            j = np.argmin(days[old], axis=1)  # all used: the first oldest, as rows.index
            p = self.row_pool[ro, j]
            self.cell_w[p] = self.cell_zw[p] = 0.0
            self.row_day[ro, j] = day[old]
            cur[old] = j
        self.cur[r] = cur

    def _cells(self, row: int) -> tuple[list[int], list[float], list[float]]:
        """A row's days and cells as the object holds them (rows in allocation order)."""
        p = self.row_pool[row]
        p = p[p >= 0]
        days: list[int] = self.row_day[row, : len(p)].tolist()
        return days, self.cell_w[p].ravel().tolist(), self.cell_zw[p].ravel().tolist()

    def _offset(self, row: int, t: float) -> float:
        return _offset(self._grid, self.profile[row].tolist(), t) if self.profiled[row] else 0.0

    def _refresh(self, row: int, t: float) -> None:
        """``SeasonalBaseline._refresh_profile`` for one row, in Python floats."""
        days, w, zw = self._cells(row)
        profile = _daily_profile(self._grid, t, int(self.day[row]), days, w, zw)
        if profile is None:
            return
        old_here = self._offset(row, t)
        self.profile[row], self.profiled[row] = profile, True
        self.level[row] = float(self.level[row]) + (old_here - self._offset(row, t))
        self.trend[row] = self.p01[row] = 0.0
        self.p11[row] = min(float(self.p11[row]), self._p11_profiled)

    # ------------------------------------------------------------------ holding

    def hold(
        self,
        rows: npt.ArrayLike,
        t: npt.ArrayLike,
        deviating: npt.ArrayLike,
        observed: npt.ArrayLike = NAN,
    ) -> BOOL:
        """``SeasonalBaseline.hold(t, deviating, observed)`` on each of the distinct
        ``rows`` (``observed`` NaN: None); whether each accepted a new level now."""
        r = self._write(rows)
        tt, obs = self._column(t, r), self._column(observed, r)
        dev = self._column(deviating, r, np.bool_)
        self._check_times(tt)
        accepted = np.zeros(len(r), dtype=np.bool_)
        if not len(r):
            return accepted
        self.reserve(int(r.max()) + 1)
        with np.errstate(all="ignore"):
            self._roll_day(r, tt)
            held = ~np.isnan(self.held_since[r])
            self._end_hold(r[~dev], tt[~dev])
            start = dev & ~held
            self.held_since[r[start]] = tt[start]
            self.held_q[r[start]] = self._trend_q(r[start])
            on = dev & held
            accepted[on] = self._accept(r[on], tt[on], obs[on])
        return accepted

    def _end_hold(self, r: IDX, t: F64) -> None:
        """The hold is over: carry on from the forecast it held."""
        hs, at = self.held_since[r], self.at[r]
        going = ~np.isnan(hs) & ~np.isnan(at)
        g = r[going]
        self.at[g] = at[going] + _pymax(0.0, t[going] - _pymax(hs[going], at[going]))
        self.held_since[r] = self.held_q[r] = NAN

    def _longest_hold(self, r: IDX) -> F64:
        """``SeasonalBaseline._longest_hold`` of each row."""
        if self.unprofiled_hold_s is not None:
            unprofiled = np.full(len(r), min(self.hold_max_s, self.unprofiled_hold_s))
        else:
            drift = self.drift[r] / self.step_s
            reach = np.where(drift > 0, HOLD_DRIFT / drift, math.inf)
            unprofiled = _pymin(self.hold_max_s, _pymax(UNPROFILED_HOLD_S, reach))
        return np.where(self.profiled[r], self.hold_max_s, unprofiled)

    def _accept(self, r: IDX, t: F64, observed: F64) -> BOOL:
        """Rows held long enough accept ``observed`` as their new level."""
        held = t - self.held_since[r]
        ok = ~(held < self._longest_hold(r)) & np.isfinite(observed)
        r, t, held, observed = r[ok], t[ok], held[ok], observed[ok]
        mean = self._forecast(r, t)[0]
        ready = (self.n[r] >= self.warmup) & ~np.isnan(self.at[r])
        self.rel_before[r] = np.where(ready, mean, observed)
        self.held_since[r] = self.held_q[r] = NAN
        self._restart(r, t, observed - self._profile_at(r, t))
        self.n[r] = self.warmup
        self.rel_at[r], self.rel_held_s[r], self.rel_after[r] = t, held, observed
        return ok

    # ------------------------------------------------------------------ objects

    def _check_object(self, base: SeasonalBaseline) -> None:
        if tuple(getattr(base, name) for name in PARAMS) != self.params:
            raise ValueError("seasonal bank: a baseline of other parameters")
        if base._open is not None or base._count or base._mean or base._scale is not None:
            raise ValueError("seasonal bank: a baseline used through river's protocol")
        days = len(base._row_day)
        if days > self.days or len(base._w) != len(base._zw) or len(base._w) != days * self.slots:
            raise ValueError("seasonal bank: a baseline's cells do not fit")
        far = base._day is not None and not abs(base._day) < DAY_LIMIT
        if far or (base._day is None) != (days == 0) or not 0 <= base._row < max(days, 1):
            raise ValueError("seasonal bank: a baseline's day does not fit")
        if base._profile is not None and len(base._profile) != self.slots:
            raise ValueError("seasonal bank: a baseline's profile does not fit")
        if abs(base._run) >= OUTLIER_RUN:
            raise ValueError("seasonal bank: a baseline's outlier run does not fit")

    def adopt(self, row: int, base: SeasonalBaseline) -> None:
        """Row ``row`` takes ``base``'s state exactly (ValueError, with nothing changed, if
        its parameters differ or it was used through river's protocol)."""
        self._check_object(base)
        self.reserve(row + 1)
        self.reset([row])
        for slot, name in SLOTS:
            v = getattr(base, slot)
            getattr(self, name)[row] = (NO_DAY if slot == "_day" else NAN) if v is None else v
        rel = base.relearned
        if rel is not None:
            self.rel_at[row], self.rel_held_s[row] = rel.at, rel.held_s
            self.rel_before[row], self.rel_after[row] = rel.before, rel.after
        if base._profile is not None:
            self.profile[row], self.profiled[row] = base._profile.tolist(), True
        k = len(base._row_day)
        p = self._alloc(k)
        self.row_pool[row, :k], self.row_day[row, :k] = p, base._row_day.tolist()
        self.cell_w[p] = np.asarray(base._w.tolist()).reshape(k, self.slots)
        self.cell_zw[p] = np.asarray(base._zw.tolist()).reshape(k, self.slots)

    def export(self, row: int) -> SeasonalBaseline:
        """A :class:`SeasonalBaseline` with exactly row ``row``'s state (river's protocol
        fresh)."""
        row = int(self._read([row])[0])
        base = self._proto.clone()
        for slot, name in SLOTS:
            v = getattr(self, name)[row].item()
            if slot in OPTIONAL:
                v = (None if v == NO_DAY else v) if slot == "_day" else _opt(v)
            setattr(base, slot, v)
        at = float(self.rel_at[row])
        if not math.isnan(at):
            held, before = float(self.rel_held_s[row]), float(self.rel_before[row])
            base.relearned = Relearned(at, held, before, float(self.rel_after[row]))
        if self.profiled[row]:
            base._profile = array("d", self.profile[row].tolist())
        days, w, zw = self._cells(row)
        base._row_day, base._w, base._zw = array("q", days), array("d", w), array("d", zw)
        return base

    # ------------------------------------------------------------------ snapshots

    def _param_list(self) -> list[float]:
        return [math.nan if v is None else float(v) for v in self.params]

    def dump(self, rows: npt.ArrayLike) -> dict[str, Any]:
        """The state of ``rows`` as plain data (little-endian raw arrays by name, the
        parameters, a version); :meth:`load` puts it back, onto any rows."""
        r = self._read(rows)
        out: dict[str, Any] = {"version": VERSION, "params": self._param_list(), "rows": len(r)}
        for name in FIELDS:
            out[name] = _le(getattr(self, name)[r])
        out["row_day"] = _le(self.row_day[r])
        pools = self.row_pool[r]
        out["nrows"] = _le((pools >= 0).sum(axis=1).astype(np.int64))
        p = pools[pools >= 0]  # row by row, each in its days' order
        out["cell_w"], out["cell_zw"] = _le(self.cell_w[p]), _le(self.cell_zw[p])
        out["profile"] = _le(self.profile[r[self.profiled[r]]])
        return out

    def load(self, rows: npt.ArrayLike, data: dict[str, Any]) -> None:
        """Rows ``rows`` from a :meth:`dump` of as many rows by a bank with the same
        parameters (ValueError, with nothing changed, if anything does not fit)."""
        r = self._write(rows)
        parts = self._parse(len(r), data)
        self.reserve(int(r.max()) + 1 if len(r) else 0)
        self.reset(r)
        for name in FIELDS:
            getattr(self, name)[r] = parts[name]
        self.row_day[r] = parts["row_day"]
        counts = parts["nrows"]
        p = self._alloc(int(counts.sum()))
        local = np.arange(len(p)) - np.repeat(np.cumsum(counts) - counts, counts)
        self.row_pool[np.repeat(r, counts), local] = p
        self.cell_w[p], self.cell_zw[p] = parts["cell_w"], parts["cell_zw"]
        self.profile[r[parts["profiled"]]] = parts["profile"]

    def _parse(self, k: int, data: dict[str, Any]) -> dict[str, Any]:
        """``data``'s arrays, checked against the bank and each other."""
        mine, theirs = self._param_list(), data.get("params")
        if data.get("version") != VERSION or data.get("rows") != k or not _same(mine, theirs):
            raise ValueError("seasonal bank state of another version, size or parameters")
        parts = {name: _array(data, name, dt, k) for name, (dt, _) in FIELDS.items()}
        parts["row_day"] = _array(data, "row_day", np.int64, k * self.days)
        parts["row_day"] = parts["row_day"].reshape(k, self.days)
        counts = parts["nrows"] = _array(data, "nrows", np.int64, k)
        if np.frombuffer(data["profiled"], dtype=np.uint8).max(initial=0) > 1:
            raise ValueError("seasonal bank state: profiled is not boolean")
        cells, profiled = int(counts.sum()), int(parts["profiled"].sum())
        for name in ("cell_w", "cell_zw"):
            parts[name] = _array(data, name, np.float64, cells * self.slots)
            parts[name] = parts[name].reshape(cells, self.slots)
        parts["profile"] = _array(data, "profile", np.float64, profiled * self.slots)
        parts["profile"] = parts["profile"].reshape(profiled, self.slots)
        self._check_rows(parts)
        return parts

    def _check_rows(self, parts: dict[str, Any]) -> None:
        counts, cur, day = parts["nrows"], parts["cur"], parts["day"]
        if ((counts < 0) | (counts > self.days)).any():
            raise ValueError("seasonal bank state: a row holds too many days")
        if ((cur < 0) | (cur >= np.maximum(counts, 1))).any() or (
            (day == NO_DAY) != (counts == 0)
        ).any():
            raise ValueError("seasonal bank state: a row's day does not fit its cells")
        if (np.abs(parts["run"].astype(np.int64)) >= OUTLIER_RUN).any():
            raise ValueError("seasonal bank state: an outlier run does not fit")


def _le(a: npt.NDArray[Any]) -> bytes:
    """An array's values as little-endian raw bytes."""
    return np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")).tobytes()


def _array(data: dict[str, Any], name: str, dt: type[np.generic], size: int) -> Any:
    """``data[name]`` as ``size`` values of ``dt`` (ValueError if it is not that)."""
    raw = data.get(name)
    if not isinstance(raw, bytes):
        raise ValueError(f"seasonal bank state: {name} is not bytes")
    dtype = np.dtype(dt).newbyteorder("<")
    if len(raw) != size * dtype.itemsize:
        raise ValueError(f"seasonal bank state: {name} holds {len(raw)} bytes, not {size}")
    return np.frombuffer(raw, dtype=dtype).astype(np.dtype(dt))


def _same(mine: list[float], theirs: Any) -> bool:
    """Whether ``theirs`` is the parameter list ``mine`` (NaN: None, equal to NaN)."""
    if not isinstance(theirs, list) or len(theirs) != len(mine):
        return False
    return all(
        isinstance(b, float) and (a == b or (math.isnan(a) and math.isnan(b)))
        for a, b in zip(mine, theirs, strict=True)
    )
