"""The generic streaming detector in arrays, a row per series: the only implementation of
the algorithm (:class:`~.view.GenericDetector` is a one-row view of it for river's
protocol; ``tests/reference/generic.py`` is the specification in plain loops).

What it detects, on any univariate signal (GPU memory, utilisation, temperature, power,
latency percentiles, rates, queue lengths, engine gauges), at any cadence from 10 s to
5 min, irregular: observations the series' own history says are unusual, and runs of
them. Each observation, scored against the state before it, then learnt:

- **forecast** ``yhat``: a *seasonal* forecast (a slow level, ~3 h, plus a daily profile of
  48 half-hour slots by UTC time of day, plus a weekday offset trusted as far as the days
  seen on that weekday support it) and a *fast* one (a 15-min EWMA: a series without a
  rhythm, a burst under way), mixed by the inverse of their squared errors over a day:
  the profile counts as far as it predicts. Learning clips residuals at 4 scales, so a
  spike moves neither level nor profile, and a shift is absorbed in hours.
- **surprise** of the residual: ``z = |x - yhat| / scale`` (scale: mean |residual| over
  ~6 h), and ``u = -ln P(Z >= z)`` read from the row's own histogram of past z (3 days'
  memory, a heavy-tailed prior; see :mod:`~.surprise`). Heavy-tailed or bursty series
  learn that large z are common; a flat series has z = 0 (score 0) until it moves.
- **burst**: the short mean of u (the shorter of 30 min and 12 observations), judged the
  same way against its own histogram: a denser run of surprises than usual.
- **onset**: the two surprises in decades, ``nl = (u - ln P(B >= b)) / ln 10``, mapped to
  [0, 1]: 0 below 3 decades (p = 1e-3), 1 at 9: is this observation news? A shift is
  news until the fast forecast has absorbed it (~30 min). The one-row view's
  ``score_one`` (what NAB scores: only the first detection in an anomaly window counts).
- **held**: the residual against the *seasonal* forecast alone, ``zs = |x - seasonal| /
  slow`` (slow: the mean |x - seasonal| over ``memory_s``, each clipped at ``huber``, so a
  fault barely moves it), against ``q``, the 99 % quantile of the row's past zs, *held*
  at its value while the deviation goes on (``zs > q``; the histogram counts zs clipped
  at q, so a fault does not widen the band): ``held = clip((zs / q - 1) / held_span, 0,
  1)``, 0 within the band, 1 at 1.5 times its width. A lasting shift keeps it until the
  slow level has learnt it (hours; a deviation of 20 scales takes ~10 h): the new normal.
- **score** = ``max(onset, held)``: what the product's rules, status and advisor read
  (a spike is news for a moment; a hung GPU stays anomalous). Warm-up: 0 for the first
  ``warmup`` observations.
- **expected value and band**: ``yhat`` is the seasonal forecast, ``lower``/``upper`` =
  ``yhat -+ slow * q``: beyond them the held score rises.

Non-finite values are not learnt and score 0; an observation not after its row's last
learnt time is late: not learnt, counted in :attr:`GenericBank.late`, scored 0. Rows
within one call must be distinct. Memory: 852 bytes a row (``nbytes() / capacity``).
Parameters: :class:`~.params.GenericParams`.

>>> bank = GenericBank(capacity=2)
>>> t = 1_767_225_600.0 + 60.0 * np.arange(600)
>>> noise = np.sin(np.arange(600) * 7.3)              # stands in for noise in [-1, 1]
>>> for i in range(600):
...     out = bank.update([0, 1], t[i], [10.0 + noise[i], 5.0])
>>> out.score.tolist()                                # healthy noise, a flat series
[0.0, 0.0]
>>> out = bank.update([0, 1], t[-1] + 60, [30.0, 5.0])  # a jump of 30 sd; still flat
>>> out.score.round(2).tolist(), out.onset.round(2).tolist(), out.yhat.round(1).tolist()
([1.0, 0.0], [0.4, 0.0], [10.0, 5.0])
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from ragwatch.detectors.generic import surprise
from ragwatch.detectors.generic.params import (
    BINS,
    BOOL,
    CAP,
    DAY,
    F32,
    F64,
    IDX,
    N_MAX,
    SCALARS,
    VECTORS,
    VERSION,
    WEEK,
    GenericParams,
)

LN10 = math.log(10.0)
DEFAULTS = GenericParams()


class Scored(NamedTuple):
    """Per observation: its anomaly score in [0, 1] (the larger of ``onset`` and
    ``held``), the expected value and the band (the seasonal forecast, and where the held
    score starts), the onset score (is this observation news? what NAB asks: the one-row
    view's ``score_one``) and the held score (how far out of its band, in band widths)."""

    score: F64
    yhat: F64
    lower: F64
    upper: F64
    onset: F64
    held: F64


class _Step(NamedTuple):
    """What scoring found, for learning to reuse."""

    out: Scored
    seasonal: F64
    fast: F64
    scale: F64
    z: F64
    burst: F64
    zs: F64
    q: F64
    mixed: F64  # the forecast the onset score judged (seasonal and fast mixed)


def _ew(dt: F64, memory: float) -> F64:
    """The weight of a new value in an exponential average of ``memory`` seconds."""
    out: F64 = 1.0 - np.exp(-dt / memory)
    return out


class GenericBank:
    """Generic detectors for rows ``0 .. capacity - 1`` (it grows), all with ``params``.
    Rows are plain indices: the caller keeps the key -> row map and calls :meth:`reset` on
    a row it reuses."""

    late: int
    t: F64
    n: npt.NDArray[np.int32]
    level: F64
    fast: F64
    err_seasonal: F64
    err_fast: F64
    scale: F64
    scale_w: F64
    burst: F64
    hist_w: F64
    slow: F64
    slow_w: F64
    q_hold: F64
    profile: F32
    visits: F32
    weekly: F32
    weekly_days: F32
    hz: F32
    hb: F32
    hs: F32

    def __init__(self, params: GenericParams = DEFAULTS, capacity: int = 16) -> None:
        self.params = params
        self.late = 0
        self._widths = {"profile": params.slots, "visits": params.slots, "weekly": WEEK}
        self._widths |= {"weekly_days": WEEK, "hz": BINS, "hb": BINS, "hs": BINS}
        self._capacity = 0
        self._grow(max(1, capacity))

    # ------------------------------------------------------------------ storage

    @property
    def capacity(self) -> int:
        return self._capacity

    def _grow(self, capacity: int) -> None:
        old = self._capacity
        for name, (dt, fresh) in SCALARS.items():
            new: Any = np.full(capacity, fresh, dtype=dt)
            if old:
                new[:old] = getattr(self, name)
            setattr(self, name, new)
        for name in VECTORS:
            new = np.zeros((capacity, self._widths[name]), dtype=np.float32)
            if old:
                new[:old] = getattr(self, name)
            setattr(self, name, new)
        self._capacity = capacity

    def reserve(self, n: int) -> None:
        """Room for rows ``0 .. n - 1`` (doubling, so growing one row at a time is cheap)."""
        if n > self._capacity:
            self._grow(max(n, 2 * self._capacity))

    def reset(self, rows: npt.ArrayLike) -> None:
        """Rows back to fresh (a series left, or the row is reused)."""
        r = np.asarray(rows, dtype=np.intp).ravel()
        if len(r):
            self.reserve(int(r.max()) + 1)
        for name, (_, fresh) in SCALARS.items():
            getattr(self, name)[r] = fresh
        for name in VECTORS:
            getattr(self, name)[r] = 0.0

    def nbytes(self) -> int:
        """Bytes held by the rows' arrays."""
        return sum(int(getattr(self, name).nbytes) for name in (*SCALARS, *VECTORS))

    # ------------------------------------------------------------------ reading

    def _forecasts(self, r: IDX, t: F64) -> tuple[F64, F64, F64]:
        """``(yhat, seasonal, fast)`` at ``t`` (NaN for a fresh row or a non-finite t)."""
        p = self.params
        tt = np.where(np.isfinite(t), t, 0.0)
        k = np.minimum((tt % DAY / DAY * p.slots).astype(np.intp), p.slots - 1)
        d = np.mod(np.floor(tt / DAY) + 3, WEEK).astype(np.intp)  # 1970-01-01: a Thursday
        days = self.weekly_days[r, d].astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            trust = np.where(days > 0, days / (days + p.weekly_days), 0.0)
            seasonal = self.level[r] + self.profile[r, k] + self.weekly[r, d] * trust
            es, ef, fast = self.err_seasonal[r], self.err_fast[r], self.fast[r]
            w = np.where(es + ef > 0, ef / (es + ef), 0.5)
            yhat = fast + w * (seasonal - fast)
        unknown = (self.n[r] == 0) | ~np.isfinite(t)
        nan = np.full(len(r), math.nan)
        return (np.where(unknown, nan, yhat), seasonal, fast)

    def _scale(self, r: IDX) -> F64:
        w = self.scale_w[r]
        with np.errstate(invalid="ignore", divide="ignore"):
            out: F64 = np.where(w > 0, self.scale[r] / w, 0.0)
        return out

    def _slow(self, r: IDX) -> F64:
        """The slow scale: the mean |residual| against the seasonal forecast over
        ``memory_s``, each clipped at ``huber`` scales (a fault barely moves it)."""
        w = self.slow_w[r]
        with np.errstate(invalid="ignore", divide="ignore"):
            out: F64 = np.where(w > 0, self.slow[r] / w, 0.0)
        return out

    def _held_q(self, r: IDX) -> F64:
        """The seasonal residual's (1 - held_p) quantile, in slow scales: held at its value
        when the deviation under way began."""
        p = self.params
        q = surprise.quantile(self.hs[r], self.hist_w[r], p.held_p, p.prior)
        return np.where(self.q_hold[r] > 0, self.q_hold[r], q)

    def forecast(self, rows: npt.ArrayLike, t: npt.ArrayLike) -> tuple[F64, F64, F64]:
        """``(yhat, lower, upper)`` of ``rows`` at ``t``, read-only (NaN: a fresh row):
        the seasonal forecast, and the band beyond which the held score rises."""
        r = np.asarray(rows, dtype=np.intp).ravel()
        tt = np.broadcast_to(np.asarray(t, dtype=np.float64), r.shape)
        _, seasonal, _ = self._forecasts(r, tt)
        seasonal = np.where(self.n[r] > 0, seasonal, math.nan)
        half = self._slow(r) * self._held_q(r)
        return seasonal, seasonal - half, seasonal + half

    def score(self, rows: npt.ArrayLike, t: npt.ArrayLike, x: npt.ArrayLike) -> Scored:
        """What :meth:`update` would return, changing nothing."""
        return self._score(*self._args(rows, t, x)).out

    def _args(
        self, rows: npt.ArrayLike, t: npt.ArrayLike, x: npt.ArrayLike
    ) -> tuple[IDX, F64, F64]:
        r = np.asarray(rows, dtype=np.intp).ravel()
        tt = np.broadcast_to(np.asarray(t, dtype=np.float64), r.shape)
        xx = np.broadcast_to(np.asarray(x, dtype=np.float64), r.shape)
        if len(r) and (r.min() < 0 or r.max() >= self._capacity):
            self.reserve(int(r.max()) + 1)  # a row never written is fresh
            if r.min() < 0:
                raise ValueError(f"generic bank: negative row {int(r.min())}")
        return r, tt, xx

    def _score(self, r: IDX, t: F64, x: F64) -> _Step:
        """Score without changing anything."""
        p = self.params
        yhat, seasonal, fast = self._forecasts(r, t)
        s = self._scale(r)
        with np.errstate(all="ignore"):
            ok = np.isfinite(x) & (self.n[r] > 0) & (t > self.t[r])
            res = x - yhat
            z = np.where(ok, np.where(res == 0, 0.0, np.where(s > 0, np.abs(res) / s, np.inf)), 0.0)
            pz = surprise.tail(self.hz[r], self.hist_w[r], z, p.prior)
            u = np.minimum(CAP * LN10, -np.log(np.maximum(pz, 1e-300)))
            a = np.maximum(_ew(t - self.t[r], p.burst_s), 1.0 / p.burst_n)
            burst = np.where(ok, self.burst[r] + a * (u - self.burst[r]), 0.0)
            pb = surprise.tail(self.hb[r], self.hist_w[r], burst, p.prior)
            nl = (u - np.log(np.maximum(pb, 1e-300))) / LN10
            onset = np.minimum(1.0, np.fmax(0.0, (nl - p.score_from) / p.score_span))
            rs, ss, q = x - seasonal, self._slow(r), self._held_q(r)
            zs = np.where(rs == 0, 0.0, np.where(ss > 0, np.abs(rs) / ss, np.inf))
            zs = np.where(ok, zs, 0.0)
            held = np.minimum(1.0, np.fmax(0.0, (zs / q - 1.0) / p.held_span))
            known = self.n[r] > 0
            expected = np.where(known, seasonal, math.nan)
            lower, upper = expected - ss * q, expected + ss * q
        ready = ok & (self.n[r] >= p.warmup)
        onset, held = np.where(ready, onset, 0.0), np.where(ready, held, 0.0)
        out = Scored(np.fmax(onset, held), expected, lower, upper, onset, held)
        return _Step(out, seasonal, fast, s, z, burst, zs, q, yhat)

    # ------------------------------------------------------------------ learning

    def update(self, rows: npt.ArrayLike, t: npt.ArrayLike, x: npt.ArrayLike) -> Scored:
        """Each row's observation ``x`` at ``t`` (rows distinct), scored against the row's
        state, then learnt: non-finite ``x`` (or ``t``) is not learnt; ``t`` not after
        the row's last learnt time is late (not learnt, counted in :attr:`late`)."""
        r, t, x = self._args(rows, t, x)
        return self._apply(r, t, x, self._score(r, t, x))

    def _apply(self, r: IDX, t: F64, x: F64, step: _Step) -> Scored:
        """Learn what :meth:`_score` found of ``x`` at ``t``."""
        finite = np.isfinite(x) & np.isfinite(t)
        fresh = finite & (self.n[r] == 0)
        later = finite & ~fresh & (t > self.t[r])
        self.late += int((finite & ~fresh & ~later).sum())
        f = r[fresh]
        self.t[f], self.level[f], self.fast[f], self.n[f] = t[fresh], x[fresh], x[fresh], 1
        if later.any():
            self._learn(r[later], t[later], x[later], step, later)
        return step.out

    def _learn(self, g: IDX, t: F64, x: F64, step: _Step, m: BOOL) -> None:
        p = self.params
        dt = t - self.t[g]
        seasonal, fast, s, z = step.seasonal[m], step.fast[m], step.scale[m], step.z[m]
        zs, q = step.zs[m], step.q[m]
        self._histograms(g, dt, z, step.burst[m], np.minimum(zs, q))
        self.q_hold[g] = np.where(zs > q, q, 0.0)  # deviating: its quantile is held
        a = _ew(dt, p.scale_s)
        self.scale_w[g] += a * (1.0 - self.scale_w[g])
        res = np.abs(x - step.mixed[m])
        self.scale[g] += a * (np.where(s > 0, np.minimum(res, 10.0 * s), res) - self.scale[g])
        a, ss = _ew(dt, p.memory_s), self._slow(g)
        self.slow_w[g] += a * (1.0 - self.slow_w[g])
        rs = np.abs(x - seasonal)
        self.slow[g] += a * (np.where(ss > 0, np.minimum(rs, p.huber * ss), rs) - self.slow[g])
        a = _ew(dt, p.error_s)
        self.err_seasonal[g] += a * ((x - seasonal) ** 2 - self.err_seasonal[g])
        self.err_fast[g] += a * ((x - fast) ** 2 - self.err_fast[g])
        e = x - seasonal
        c = np.where(s > 0, p.huber * s, np.inf)
        dev = np.maximum(-c, np.minimum(c, e))
        self.level[g] += _ew(dt, p.level_s) * dev
        self._seasons(g, t, dt, e, dev)
        self.fast[g] += _ew(dt, p.fast_s) * (x - fast)
        self.t[g], self.n[g] = t, np.minimum(self.n[g] + 1, N_MAX)
        bad = ~(np.isfinite(self.level[g]) & np.isfinite(self.fast[g]))
        bad |= ~(np.isfinite(self.scale[g]) & np.isfinite(self.profile[g]).all(axis=1))
        if bad.any():
            self.reset(g[bad])  # overflowed (values near float's limits): start over

    def _histograms(self, g: IDX, dt: F64, z: F64, burst: F64, zs: F64) -> None:
        """Decay the counts by event time, count z, the burst and zs (clipped at the band:
        a fault does not widen it; an infinite z, the first change of a series that never
        moved, is not counted)."""
        fin = np.isfinite(z)
        h = g[fin]
        keep = np.exp(-dt[fin] / self.params.memory_s)
        self.hz[h] = self.hz[h] * keep[:, None]
        self.hb[h] = self.hb[h] * keep[:, None]
        self.hs[h] = self.hs[h] * keep[:, None]
        self.hist_w[h] = self.hist_w[h] * keep + 1.0
        surprise.add(self.hz, h, z[fin])
        surprise.add(self.hb, h, burst[fin])
        surprise.add(self.hs, h, zs[fin])
        self.burst[g] = burst

    def _seasons(self, g: IDX, t: F64, dt: F64, e: F64, dev: F64) -> None:
        """The profile slot of ``t`` (its first visit takes the residual whole, later ones
        a running mean that forgets over ``profile_s``) and the weekday offset."""
        p = self.params
        k = np.minimum((t % DAY / DAY * p.slots).astype(np.intp), p.slots - 1)
        d = np.mod(np.floor(t / DAY) + 3, WEEK).astype(np.intp)
        visits = self.visits[g, k] + np.float32(1.0)
        self.visits[g, k] = visits
        first = visits == 1.0
        a = np.where(first, 1.0, np.maximum(1.0 / visits, _ew(dt * p.slots, p.profile_s)))
        self.profile[g, k] = self.profile[g, k] + a * np.where(first, e, dev)
        self.weekly[g, d] = self.weekly[g, d] + _ew(dt * WEEK, p.weekly_s) * dev
        self.weekly_days[g, d] = self.weekly_days[g, d] + np.minimum(dt, 3600.0) / DAY

    # ------------------------------------------------------------------ snapshots

    def dump(self, rows: npt.ArrayLike) -> dict[str, Any]:
        """The state of ``rows`` as plain data (lists of floats, a version, the
        parameters); :meth:`load` puts it back, onto any rows of a bank like this one."""
        r = np.asarray(rows, dtype=np.intp).ravel()
        out: dict[str, Any] = {"version": VERSION, "params": self.params.as_dict()}
        for name in (*SCALARS, *VECTORS):
            out[name] = getattr(self, name)[r].tolist()
        return out

    def load(self, rows: npt.ArrayLike, data: dict[str, Any]) -> None:
        """Rows ``rows`` from a :meth:`dump` of as many rows; ValueError, with nothing
        changed, if it does not fit."""
        r = np.asarray(rows, dtype=np.intp).ravel()
        if data.get("version") != VERSION or data.get("params") != self.params.as_dict():
            raise ValueError("generic bank: a dump of another version or other parameters")
        parts: dict[str, npt.NDArray[Any]] = {}
        for name, (dt, _) in SCALARS.items():
            parts[name] = np.asarray(data[name], dtype=dt).reshape(len(r))
        for name in VECTORS:
            parts[name] = np.asarray(data[name], dtype=np.float32).reshape(len(r), -1)
            if parts[name].shape[1] != self._widths[name]:
                raise ValueError(f"generic bank: {name} of the wrong width")
        if len(r):
            self.reserve(int(r.max()) + 1)
        for name, a in parts.items():
            getattr(self, name)[r] = a

    def row_state(self, row: int) -> dict[str, Any]:
        """One row's state as plain floats and lists (for snapshots)."""
        data = self.dump([row])
        return {k: v[0] if k in SCALARS or k in VECTORS else v for k, v in data.items()}

    def set_row_state(self, row: int, state: dict[str, Any]) -> None:
        """Row ``row`` takes a :meth:`row_state` (of this or another bank)."""
        data = {k: [v] if k in SCALARS or k in VECTORS else v for k, v in state.items()}
        self.load([row], data)
