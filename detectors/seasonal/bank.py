"""Seasonal baselines in arrays, a row per series: the only implementation of the
algorithm :mod:`~.view` describes (a daily profile, a weekly profile trusted as far as
the weeks seen support it, a local level and trend, a hold). :class:`~.view.
SeasonalBaseline` is a one-row view of a bank for river's protocol and single series.

The hot path (the Kalman update of :meth:`~SeasonalBank.learn`, :meth:`~SeasonalBank.
forecast`, :meth:`~SeasonalBank.hold`) is one set of array operations per call, its
branches masks; what happens once a day per row (a new day's cells, the daily profile
refresh, the weekly table) runs per row. The specification is the plain-Python reference
in ``tests/reference/seasonal.py``; ``tests/unit/test_seasonal_bank.py`` compares the two
within a tolerance (the weekly part off, as the reference has none) and tests the weekly
profile by its behaviour. ``t`` must keep ``|t / season_s|`` below 2**62.

The weekly profile's table (per weekday and ``BLOCKS`` blocks of a day: what past weeks
said of that block's offset from a typical day) is folded and read by the functions of
:mod:`~.curves`; its posterior variance is added to the level's uncertainty where the
forecast enters a block (see :mod:`~.view` for what that does).

>>> from ragwatch.detectors.seasonal import SeasonalBaseline
>>> bank = SeasonalBank(SeasonalBaseline(step_s=60.0), capacity=2)
>>> T0 = 1_767_225_600.0
>>> for i in range(10):
...     bank.learn([0, 1], T0 + 60 * i, [1.0, 2.0], 0.01)
>>> mean, var, noise = bank.forecast([0, 1], T0 + 600)
>>> mean.round(3).tolist()
[1.0, 2.0]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ragwatch.detectors.medians import nanmedian_rows
from ragwatch.detectors.seasonal.curves import daily_profile, fold_into, posterior
from ragwatch.detectors.seasonal.params import (
    BLOCK_COVERAGE,
    BLOCKS,
    BOOL,
    DAY_LIMIT,
    DRIFT_ALPHA,
    F64,
    FIELDS,
    HOLD_DRIFT,
    I64,
    IDX,
    NAN,
    NO_DAY,
    OUTLIER_RUN,
    PROFILED_TREND,
    SHAPE_SD,
    TREND_STEP_S,
    UNPROFILED_HOLD_S,
    VERSION,
    WEEK,
    WEEK_MEMORY,
    WEEK_SD,
    WEEK_SD_WEIGHT,
    WEEKLY,
    HasParams,
    SeasonalParams,
)
from ragwatch.detectors.seasonal.state import le, parse

if TYPE_CHECKING:
    from ragwatch.detectors.seasonal.view import SeasonalBaseline


class SeasonalBank:
    """Seasonal baselines for rows ``0 .. capacity - 1`` (it grows), all with ``proto``'s
    parameters (a :class:`SeasonalParams`, or anything with ``.params``: a
    :class:`~.view.SeasonalBaseline`). Rows are plain indices: the caller keeps the
    key -> row map and calls :meth:`reset` on a row it reuses. Within one write call rows
    must be distinct."""

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
    wk_n: F64
    wk_mean: F64
    wk_m2: F64
    wk_s2: F64
    wk_w: F64
    wk_v: F64

    __hash__ = None  # type: ignore[assignment]  # equal by state

    def __init__(self, proto: SeasonalParams | HasParams, capacity: int = 16) -> None:
        p = proto if isinstance(proto, SeasonalParams) else proto.params
        self.params = p
        self.step_s, self.season_s, self.slot_s = p.step_s, p.season_s, p.slot_s
        self.slots, self.days, self.warmup = p.slots, p.days, p.warmup
        self.damping, self.hold_max_s = p.damping, p.hold_max_s
        self.unprofiled_hold_s = p.unprofiled_hold_s
        self.blocks = min(BLOCKS, self.slots)
        self._block_s = self.season_s / self.blocks
        self._block_of = np.arange(self.slots) * self.blocks // self.slots
        self._block_start = np.searchsorted(self._block_of, np.arange(self.blocks))
        self._tau2 = p.weekly_sd**2
        self._ln2, self._oz2 = p.level_noise**2, p.outlier_z**2
        self._tq = (p.trend_noise * PROFILED_TREND, p.trend_noise)  # profile / none
        if p.weekly_sd > 0:  # the first day's trend follows the rhythm at the pace of time
            self._tq = (self._tq[0], p.trend_noise * (p.step_s / TREND_STEP_S) ** 1.5)
        self._p11_restart = p.trend_noise**2 * 100
        self._p11_profiled = (p.trend_noise * PROFILED_TREND) ** 2 * 100
        self.capacity = 0
        self.cell_w = self.cell_zw = np.zeros((0, self.slots))
        self._free: IDX = np.zeros(0, dtype=np.intp)
        self._nfree = 0
        self._grow(max(1, capacity))
        self._grow_pool(max(1, capacity))

    def __eq__(self, other: object) -> bool:
        """Same parameters and the same state in every row (snapshots compare so)."""
        if not isinstance(other, SeasonalBank) or other.capacity != self.capacity:
            return NotImplemented if not isinstance(other, SeasonalBank) else False
        rows = np.arange(self.capacity)
        return self.dump(rows) == other.dump(rows)

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
        for name in WEEKLY:
            fill = self._tau2 if name == "wk_v" else 0.0
            extend(name, (capacity, WEEK * self.blocks), np.float64, fill)
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
        """Rows back to a fresh baseline; their pool rows go back."""
        r = np.unique(self._rows(rows))
        if not len(r):
            return
        self.reserve(int(r.max()) + 1)
        pools = self.row_pool[r]
        self._release(pools[pools >= 0])
        self.row_pool[r], self.row_day[r], self.profile[r] = -1, 0, 0.0
        for name, (_, fresh) in FIELDS.items():
            getattr(self, name)[r] = fresh
        for name in WEEKLY:
            getattr(self, name)[r] = self._tau2 if name == "wk_v" else 0.0

    def nbytes(self) -> int:
        """Bytes held by the arrays (rows, pool and free list)."""
        names = (*FIELDS, *WEEKLY, "profile", "row_day", "row_pool", "cell_w", "cell_zw")
        return sum(int(getattr(self, name).nbytes) for name in (*names, "_free"))

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

    def weeks_seen(self, rows: npt.ArrayLike, t: npt.ArrayLike) -> F64:
        """How many past weeks each row's weekly table holds for the block of ``t``."""
        r = self._read(rows)
        out: F64 = self.wk_n[r, self._wcell(self._column(t, r))]
        return out

    def held_s(self, rows: npt.ArrayLike, t: npt.ArrayLike) -> F64:
        """How long each row has been held at ``t`` (0 when it is learning)."""
        r = self._read(rows)
        hs = self.held_since[r]
        with np.errstate(all="ignore"):
            return np.where(np.isnan(hs), 0.0, np.fmax(0.0, self._column(t, r) - hs))

    def relearned(self, rows: npt.ArrayLike) -> tuple[F64, F64, F64, F64]:
        """Each row's last accepted level: ``at``, ``held_s``, ``before``, ``after`` (NaN
        where none was: ``at`` is NaN exactly then)."""
        r = self._read(rows)
        return self.rel_at[r], self.rel_held_s[r], self.rel_before[r], self.rel_after[r]

    def profile_at(self, rows: npt.ArrayLike, t: npt.ArrayLike) -> F64:
        """Each row's seasonal offset at ``t``: the daily profile's plus the weekly's."""
        r = self._read(rows)
        with np.errstate(all="ignore"):
            return self._offset(r, self._column(t, r))

    def forecast(self, rows: npt.ArrayLike, t: npt.ArrayLike) -> tuple[F64, F64, F64]:
        """Each row's forecast at ``t``: mean, var, noise (NaN in all three while it warms
        up)."""
        r = self._read(rows)
        with np.errstate(all="ignore"):
            return self._forecast(r, self._column(t, r))

    def held_var(self, rows: npt.ArrayLike, t: npt.ArrayLike) -> F64:
        """The part of each row's forecast variance at ``t`` that its hold added (0 where
        it holds nothing): a test that learnt its own dispersion may leave it out."""
        r = self._read(rows)
        return self._held_var(r, self._column(t, r))

    def _offset(self, r: IDX, t: F64) -> F64:
        out = self._profile_at(r, t)
        if self._tau2 > 0 and len(r):
            out = out + self._weekly_at(r, t)
        return out

    def _weekly_at(self, r: IDX, t: F64) -> F64:
        """The weekly offset at ``t``: linear between the centres of its day's blocks,
        flat before the first and after the last. Not across midnight: a day's table
        changes when the next starts, and a ramp into a day it had not seen would move
        the forecast the level was just fitted to; the day's step is what :meth:`_jump`
        lets the level take."""
        b = self.blocks
        day = np.mod(np.floor(t / self.season_s), WEEK).astype(np.intp) * b
        w = self.wk_w
        if b == 1:
            out1: F64 = w[r, day]
            return out1
        pos = np.clip(np.mod(t, self.season_s) / self._block_s - 0.5, 0.0, b - 1.0)
        lo = np.minimum(np.floor(pos).astype(np.intp), b - 2)
        frac = pos - lo
        out: F64 = w[r, day + lo] * (1 - frac) + w[r, day + lo + 1] * frac
        return out

    def _profile_at(self, r: IDX, t: F64) -> F64:
        has = self.profiled[r]
        out = np.zeros(len(r))
        if has.any():
            rp, tp = r[has], t[has]
            if not np.isfinite(tp).all():
                raise ValueError("seasonal bank: a profile needs a finite t")
            pos = np.mod(tp, self.season_s) / self.slot_s - 0.5
            lo = np.floor(pos)
            frac = pos - lo
            i = lo.astype(np.int64) % self.slots
            p = self.profile
            out[has] = p[rp, i] * (1 - frac) + p[rp, (i + 1) % self.slots] * frac
        return out

    def _wcell(self, t: F64) -> IDX:
        """The weekly cell of ``t``: weekday * blocks + block."""
        day = np.floor(t / self.season_s)
        slot = np.floor(np.mod(t, self.season_s) / self.slot_s).astype(np.intp) % self.slots
        out: IDX = np.mod(day, WEEK).astype(np.intp) * self.blocks + self._block_of[slot]
        return out

    def _jump(self, r: IDX, a: F64, t: F64) -> F64:
        """What the level may have to move from ``a`` to ``t`` for the weekly offsets it
        does not know: into another day, the two blocks' variances (a weekday's level);
        within a day, the shape's ``SHAPE_SD`` a block, as far as the block is uncertain
        (its variance over the prior's), spread over the block (the level follows a
        weekend's other rhythm as it drifts away from the daily profile)."""
        if self._tau2 == 0 or not len(r):
            return np.zeros(len(r))
        known = np.isfinite(a)
        aa = np.where(known, a, t)
        ca, ct = self._wcell(aa), self._wcell(t)
        va = self.wk_v[r, ca]
        day = np.floor(aa / self.season_s) != np.floor(t / self.season_s)
        jump = np.where(day, va + self.wk_v[r, ct], 0.0)
        # a shape to drift from needs a daily profile: before it, level and trend follow
        # the rhythm (a random walk of the level there would take any slow change, a leak
        # as well as a morning, within minutes, and the trend does that job)
        shape = np.where(self.profiled[r], SHAPE_SD**2 * va / self._tau2, 0.0)
        drift = shape * np.fmax(0.0, t - aa) / self._block_s
        out: F64 = np.where(known, jump + drift, 0.0)
        return out

    def _reach(self, steps: F64) -> tuple[F64, F64]:
        """``damping ** steps`` and the trend's reach over ``steps``."""
        if self.damping == 1.0:
            return np.ones(len(steps)), steps
        decay = np.power(self.damping, steps)
        return decay, (1 - decay) / (1 - self.damping)

    def _trend_q(self, r: IDX) -> F64:
        return np.where(self.profiled[r], self._tq[0], self._tq[1])

    def _forecast(self, r: IDX, t: F64) -> tuple[F64, F64, F64]:
        ok = (self.n[r] >= self.warmup) & ~np.isnan(self.at[r])
        if ok.all():
            return self._warm_forecast(r, t)
        mean, var, noise = np.full(len(r), NAN), np.full(len(r), NAN), np.full(len(r), NAN)
        mean[ok], var[ok], noise[ok] = self._warm_forecast(r[ok], t[ok])
        return mean, var, noise

    def _warm_forecast(self, r: IDX, t: F64) -> tuple[F64, F64, F64]:
        """:meth:`_forecast` of rows past their warm-up."""
        hs, at = self.held_since[r], self.at[r]
        horizon = np.where(np.isnan(hs), t, np.minimum(t, hs))
        steps = np.fmax(0.0, (horizon - at) / self.step_s)
        reach = self._reach(steps)[1]
        level = self.level[r] + self.trend[r] * reach
        v = self.p00[r] + 2 * reach * self.p01[r] + reach * reach * self.p11[r]
        v = v + steps * self._ln2 + self._jump(r, at, t)
        return level + self._offset(r, t), v + self._held_var(r, t), self.model_var[r]

    def _held_var(self, r: IDX, t: F64) -> F64:
        """How uncertain a held forecast has become by ``t``: the level it froze may since
        have moved by the level and trend noise of the steps held (a trend that wanders by
        ``q`` a step moves the level by ``q**2 * k**3 / 3`` in ``k`` steps), at the pace
        the trend had when the hold began (``held_q``)."""
        out = np.zeros(len(r))
        hs, at = self.held_since[r], self.at[r]
        on = ~np.isnan(hs) & ~np.isnan(at)
        if on.any():
            ro = r[on]
            k = np.fmax(0.0, (t[on] - np.maximum(hs[on], at[on])) / self.step_s)
            hq = self.held_q[ro]
            q = np.where(np.isnan(hq), self._trend_q(ro), hq)
            out[on] = k * self._ln2 + k * k * self.p11[ro] + q * q * k**3 / 3
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
        """One observation ``z`` at ``t`` with sampling variance ``var`` (>= 0), covering
        ``steps`` steps, on each of the distinct ``rows``. Ignored on a held row; counted
        in ``late`` if older than the row's state. ValueError, with nothing changed, on a
        non-finite t / z / var or var < 0."""
        r = self._write(rows)
        tt, zz, vv, ss = (self._column(a, r) for a in (t, z, var, steps))
        if not (np.isfinite(zz).all() and np.isfinite(vv).all() and (vv >= 0).all()):
            raise ValueError("seasonal: need finite t, z and var >= 0")
        self._check_times(tt)
        if not len(r):
            return
        self.reserve(int(r.max()) + 1)
        with np.errstate(all="ignore"):
            ss = np.where(np.isfinite(ss), np.fmax(1.0, ss), 1.0)
            self._learn(r, tt, zz, vv, ss)

    def _learn(self, r: IDX, t: F64, z: F64, var: F64, ss: F64) -> None:
        late = t < self.at[r]  # NaN (no state yet) compares False
        if late.any():
            self.late[r[late]] += 1
            r, t, z, var, ss = r[~late], t[~late], z[~late], var[~late], ss[~late]
        self._roll_day(r, t)
        free = np.isnan(self.held_since[r])  # held: nothing is learnt
        r, t, z, var, ss = r[free], t[free], z[free], var[free], ss[free]
        y = z - self._offset(r, t)
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
        """The Kalman predict to ``t``: level, trend, P (the weekly jump in P)."""
        at = self.at[r]
        steps = np.fmax(0.0, (t - at) / self.step_s)
        decay, reach = self._reach(steps)
        b, p01, p11 = self.trend[r], self.p01[r], self.p11[r]
        level, trend = self.level[r] + reach * b, decay * b
        p00 = self.p00[r] + 2 * reach * p01 + reach * reach * p11
        p01, p11 = decay * (p01 + reach * p11), decay * decay * p11
        p00 = p00 + steps * self._ln2 + self._jump(r, at, t)
        p11 = p11 + steps * self._trend_q(r) ** 2
        return level, trend, p00, p01, p11

    def _update(self, r: IDX, t: F64, y: F64, var: F64, ss: F64) -> None:
        """Kalman predict to ``t``, then update with the deseasonalised ``y`` (an average
        over ``ss`` steps); an innovation beyond ``outlier_z`` is a spike (not learnt)
        unless it is the ``OUTLIER_RUN``-th on one side (a step: learnt, P widened)."""
        level, trend, p00, p01, p11 = self._predict(r, t)
        nu = y - level
        nn, mv = nu * nu, self.model_var[r]
        s = p00 + var + mv / ss
        # what the sampling noise and the state do not explain (clipped: one outlier must
        # not blow it up), per step; a slow average, so a burst of noise raises it gradually
        excess = np.where(s > 0, (np.fmin(nn, 9 * s) - p00 - var) * ss, nn)
        mv = np.fmax(0.0, mv + 0.02 * (excess - mv))
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
        """A new day's cells (and the weekly table) where the day changes; the daily
        profile refresh once a season since the row's first call."""
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
        """Rows ``r`` start ``day``: its own cells if held, else a new pool row while
        fewer than ``days`` are held, else the oldest day's (emptied); the weekly table
        first (it reads the cells, and folds in the day leaving them)."""
        if self._tau2 > 0:
            for row, d in zip(r.tolist(), day.tolist(), strict=True):
                if self.day[row] != NO_DAY:
                    self._weekly(row, d)
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
            j = np.argmin(days[old], axis=1)
            p = self.row_pool[ro, j]
            self.cell_w[p] = self.cell_zw[p] = 0.0
            self.row_day[ro, j] = day[old]
            cur[old] = j
        self.cur[r] = cur

    def _held_days(self, row: int) -> tuple[list[int], IDX]:
        """A row's days (in its allocation order) and the pool rows of their cells."""
        p = self.row_pool[row]
        p = p[p >= 0]
        days: list[int] = self.row_day[row, : len(p)].tolist()
        return days, p.astype(np.intp)

    def _refresh(self, row: int, t: float) -> None:
        """The daily profile from the held days, the level keeping the forecast at ``t``."""
        days, pools = self._held_days(row)
        profile = daily_profile(self.params, t, int(self.day[row]), days, pools, self)
        if profile is None:
            return
        r, tt = np.array([row]), np.array([t])
        old_here = self._profile_at(r, tt)[0]
        self.profile[row], self.profiled[row] = profile, True
        self.level[row] += old_here - self._profile_at(r, tt)[0]
        self.trend[row] = self.p01[row] = 0.0
        self.p11[row] = min(float(self.p11[row]), self._p11_profiled)

    # ------------------------------------------------------------------ the week

    def _weekly(self, row: int, new_day: int) -> None:
        """Before ``row`` starts ``new_day``: each held day's weekly offsets against the
        typical held day; the day leaving the cells folded into the table for good; the
        posterior from the table and the other held days; the level absorbing the change
        at its own time (the forecast there is unchanged)."""
        days, pools = self._held_days(row)
        if not days:
            return
        e, s2 = self._offsets(row, pools)
        leaving = -1
        if new_day not in days and len(days) >= self.days:
            leaving = int(np.argmin(days))
            self._fold(row, days[leaving], e[leaving], s2[leaving])
        stats = [getattr(self, name)[row].copy() for name in WEEKLY[:4]]
        for k in sorted(range(len(days)), key=days.__getitem__):
            if k != leaving:
                fold_into(stats, self._cells_of(days[k]), e[k], s2[k], self._delta2(stats))
        w, v = posterior(stats, self._delta2(stats), self._tau2, self.blocks)
        at = np.array([self.at[row]])
        r = np.array([row])
        if np.isfinite(at).all():
            before = self._weekly_at(r, at)[0]
            self.wk_w[row], self.wk_v[row] = w, v
            self.level[row] += before - self._weekly_at(r, at)[0]
        self.wk_w[row], self.wk_v[row] = w, v

    def _cells_of(self, day: int) -> IDX:
        return (day % WEEK) * self.blocks + np.arange(self.blocks)

    def _offsets(self, row: int, pools: IDX) -> tuple[F64, F64]:
        """Per held day and block: the mean of its cells minus the daily profile, less
        the median held day's (NaN where under ``BLOCK_COVERAGE`` of the block was seen),
        and its sampling variance."""
        w, zw = self.cell_w[pools], self.cell_zw[pools]
        seen = w > 0
        prof = self.profile[row] if self.profiled[row] else np.zeros(self.slots)
        with np.errstate(all="ignore"):
            z = np.where(seen, zw / w - prof, 0.0)
            inv = np.where(seen, 1.0 / w, 0.0)
            start = self._block_start
            count = np.add.reduceat(seen, start, axis=1).astype(np.float64)
            size = np.diff(np.append(start, self.slots))
            enough = count >= np.maximum(1.0, BLOCK_COVERAGE * size)
            mean = np.where(enough, np.add.reduceat(z, start, axis=1) / count, NAN)
            s2 = np.where(enough, np.add.reduceat(inv, start, axis=1) / count**2, NAN)
        typical = nanmedian_rows(mean.T)  # each block's over the days; 0 where none has it
        typical[np.isnan(typical)] = 0.0
        e: F64 = mean - typical
        return e, s2

    def _fold(self, row: int, day: int, e: F64, s2: F64) -> None:
        stats = [getattr(self, name)[row] for name in WEEKLY[:4]]
        fold_into(stats, self._cells_of(day), e, s2, self._delta2(stats))

    @staticmethod
    def _delta2(stats: Sequence[F64]) -> float:
        """The week-to-week variance of a row's blocks: the prior ``WEEK_SD`` weighed with
        the spread of the weeks seen (beyond their sampling noise)."""
        n, _, m2, s2 = stats
        dof = np.clip(np.minimum(n, WEEK_MEMORY) - 1, 0, None)
        spread = float((dof * np.fmax(0.0, m2 - s2)).sum())
        return (WEEK_SD_WEIGHT * WEEK_SD**2 + spread) / (WEEK_SD_WEIGHT + float(dof.sum()))

    # ------------------------------------------------------------------ holding

    def hold(
        self,
        rows: npt.ArrayLike,
        t: npt.ArrayLike,
        deviating: npt.ArrayLike,
        observed: npt.ArrayLike = NAN,
    ) -> BOOL:
        """Tell each of the distinct ``rows`` whether the caller's evidence at ``t``
        deviates significantly from :meth:`forecast`. While it does, nothing is learnt;
        once it has for ``hold_max_s``, the level restarts from ``observed`` (the caller's
        current ``z``; NaN: none) and :meth:`relearned` records it. Returns whether each
        accepted a new level now."""
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
        """The hold is over: carry on from the forecast it held (the time it lasted is
        not a gap: the level was watched, not lost)."""
        hs, at = self.held_since[r], self.at[r]
        going = ~np.isnan(hs) & ~np.isnan(at)
        g = r[going]
        self.at[g] = at[going] + np.fmax(0.0, t[going] - np.maximum(hs[going], at[going]))
        self.held_since[r] = self.held_q[r] = NAN

    def _longest_hold(self, r: IDX) -> F64:
        """How long a deviation is held before it is the new normal: ``hold_max_s``;
        without a profile, as long as the trend seen so far cannot have moved the level by
        more than ``HOLD_DRIFT`` at its average pace, at least ``UNPROFILED_HOLD_S`` (or
        ``unprofiled_hold_s`` when given)."""
        if self.unprofiled_hold_s is not None:
            unprofiled = np.full(len(r), min(self.hold_max_s, self.unprofiled_hold_s))
        else:
            drift = self.drift[r] / self.step_s
            with np.errstate(divide="ignore"):
                reach = np.where(drift > 0, HOLD_DRIFT / drift, math.inf)
            unprofiled = np.minimum(self.hold_max_s, np.maximum(UNPROFILED_HOLD_S, reach))
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
        self._restart(r, t, observed - self._offset(r, t))
        self.n[r] = self.warmup
        self.rel_at[r], self.rel_held_s[r], self.rel_after[r] = t, held, observed
        return ok

    # ------------------------------------------------------------------ rows as views

    def adopt(self, row: int, base: SeasonalBaseline) -> None:
        """Row ``row`` takes ``base``'s state (ValueError, with nothing changed, if its
        parameters differ)."""
        if base.params != self.params:
            raise ValueError("seasonal bank: a baseline of other parameters")
        self.load([row], base.bank.dump([0]))

    def export(self, row: int) -> SeasonalBaseline:
        """A :class:`~.view.SeasonalBaseline` holding a copy of row ``row``."""
        from ragwatch.detectors.seasonal.view import SeasonalBaseline  # the view is above

        base = SeasonalBaseline.of(self.params)
        base.bank.load([0], self.dump(self._read([row])))
        return base

    # ------------------------------------------------------------------ snapshots

    def dump(self, rows: npt.ArrayLike) -> dict[str, Any]:
        """The state of ``rows`` as plain data (little-endian raw arrays by name, the
        parameters, a version); :meth:`load` puts it back, onto any rows."""
        r = self._read(rows)
        out: dict[str, Any] = {"version": VERSION, "params": self.params.as_list(), "rows": len(r)}
        for name in (*FIELDS, *WEEKLY):
            out[name] = le(getattr(self, name)[r])
        out["row_day"] = le(self.row_day[r])
        pools = self.row_pool[r]
        out["nrows"] = le((pools >= 0).sum(axis=1).astype(np.int64))
        p = pools[pools >= 0]  # row by row, each in its days' order
        out["cell_w"], out["cell_zw"] = le(self.cell_w[p]), le(self.cell_zw[p])
        out["profile"] = le(self.profile[r[self.profiled[r]]])
        return out

    def load(self, rows: npt.ArrayLike, data: dict[str, Any]) -> None:
        """Rows ``rows`` from a :meth:`dump` of as many rows by a bank with the same
        parameters (a version 1 dump: the weekly table fresh); ValueError, with nothing
        changed, if anything does not fit."""
        r = self._write(rows)
        parts = parse(self, len(r), data)
        self.reserve(int(r.max()) + 1 if len(r) else 0)
        self.reset(r)
        for name in (*FIELDS, *WEEKLY):
            if name in parts:
                getattr(self, name)[r] = parts[name]
        self.row_day[r] = parts["row_day"]
        counts = parts["nrows"]
        p = self._alloc(int(counts.sum()))
        local = np.arange(len(p)) - np.repeat(np.cumsum(counts) - counts, counts)
        self.row_pool[np.repeat(r, counts), local] = p
        self.cell_w[p], self.cell_zw[p] = parts["cell_w"], parts["cell_zw"]
        self.profile[r[parts["profiled"]]] = parts["profile"]
