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
- **shape**: the window of the last 6 values, standardised by the row's mean and mean
  |deviation| over ``memory_s`` and rotated so that its largest |value| is the last,
  against 8 prototypes learnt online (int8; the nearest within 2 deviations RMS learns it,
  a window farther from all replaces the least used one): its distance to the nearest,
  judged against the row's histogram of such distances, ``v = -log10 P(D >= d)``. A
  shape not seen in days (a burst, a new level, a flat stretch, a changed rhythm) is
  news; one that recurs (a daily spike, a rhythm's edges) is not (KNN-CAD / ARTime idea).
- **onset**: the residual's two surprises in decades, ``nl = (u - ln P(B >= b)) / ln 10``,
  or twice the shape's ``v`` (one term: a window is already a run), the larger, mapped to
  [0, 1]: 0 below 3 decades (p = 1e-3), 1 at 9: is this observation news? Reported once:
  an onset not above the row's peak onset (decaying over a day) is 0. A shift is news
  until the fast forecast has absorbed it (~30 min). The one-row view's ``score_one``
  (what NAB scores: only the first detection in an anomaly window counts).
- **held**: the residual against the *seasonal* forecast alone, on a level of its own (the
  *anchor*: it learns as the slow level does, but not while a deviation lasts, from
  ``hold_from_s``, 10 min, up to ``hold_s``, 4 h), ``zs = |x - anchored| / slow`` (slow:
  the mean |x - anchored| over ``memory_s``, each clipped at ``huber``, so a fault barely
  moves it), against ``q``, the 99 % quantile of the row's past zs, *held* at its value
  while the deviation goes on (``zs > q``; the histogram counts zs clipped at q, so a fault
  does not widen the band): ``held = clip((zs / q - 1) / held_span, 0, 1)``, 0 within the
  band, 1 at 1.5 times its width. A fault of hours is not half-learnt, so its end is no
  deviation of its own; a shift lasting longer keeps the score until the anchor has learnt
  it (hours more; a deviation of 20 scales takes ~10 h): the new normal.
- **score** = ``max(onset, held)``, the onset before its quiet period: what the product's
  rules, status and advisor read (a spike is news for a moment, a hung GPU stays
  anomalous). Warm-up: 0 for the first ``warmup`` observations.
- **expected value and band**: ``yhat`` is the anchored seasonal forecast, ``lower`` /
  ``upper`` = ``yhat -+ slow * q``: beyond them the held score rises.

Non-finite values are not learnt and score 0; an observation not after its row's last
learnt time is late: not learnt, counted in :attr:`GenericBank.late`, scored 0. Rows
within one call must be distinct. Memory: 968 bytes a row (``nbytes() / capacity``): 136
in scalars, the profile and its visits 288, the weekday offsets 56, the four histograms
384, the shape's window, prototypes and their hits 104.
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
([1.0, 0.0], [0.44, 0.0], [10.0, 5.0])
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
    DTYPES,
    F32,
    F64,
    IDX,
    N_MAX,
    PROTO_STEP,
    SCALARS,
    SHAPE_BINS,
    VECTORS,
    VERSION,
    WEEK,
    GenericParams,
)

LN10 = math.log(10.0)
DEFAULTS = GenericParams()


class Scored(NamedTuple):
    """Per observation: its anomaly score in [0, 1] (the larger of the onset, before its
    quiet period, and ``held``), the expected value and the band (the seasonal forecast,
    and where the held score starts), the onset score (is this observation news? what NAB
    asks: the one-row view's ``score_one``; 0 within the quiet period of a higher one) and
    the held score (how far out of its band, in band widths)."""

    score: F64
    yhat: F64
    lower: F64
    upper: F64
    onset: F64
    held: F64


class _Shape(NamedTuple):
    """The shape of the window ending at an observation."""

    window: F64  # the last shape_n values, x the last
    e: F64  # ... standardised and aligned (NaN: the shape not judged)
    near: IDX  # the nearest prototype
    dist: F64  # ... its RMS distance (0: not judged, or no prototype yet)


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
    anchored: F64  # the seasonal forecast on the anchor: what the held score judged
    shape: _Shape
    raw: F64  # the onset before the quiet period
    peak: F64  # the row's decayed peak onset before x


def _mean_square(d: F64) -> F64:
    """``(d ** 2).mean(axis=-1)``, squaring ``d`` in place: the last axis summed in order,
    column by column (numpy's own reduction adds fewer than 8 values in order too: the same
    floats), twice as fast on thousands of rows as a reduction over a short axis."""
    d *= d
    out: F64 = d[..., 0].copy()
    for j in range(1, d.shape[-1]):
        out += d[..., j]
    out /= d.shape[-1]
    return out


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
    anchor: F64
    held_for: F32
    mean: F64
    dev: F64
    peak: F64
    profile: F32
    visits: npt.NDArray[np.float16]
    weekly: F32
    weekly_days: F32
    hz: F32
    hb: F32
    hs: F32
    win: F32
    proto: npt.NDArray[np.int8]
    use: F32
    hn: F32

    def __init__(self, params: GenericParams = DEFAULTS, capacity: int = 16) -> None:
        self.params = params
        self.late = 0
        self._widths = {"profile": params.slots, "visits": params.slots, "weekly": WEEK}
        self._widths |= {"weekly_days": WEEK, "hz": BINS, "hb": BINS, "hs": BINS}
        self._widths |= {"win": params.shape_n, "proto": params.shape_k * params.shape_n}
        self._widths |= {"use": params.shape_k, "hn": SHAPE_BINS}
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
            new = np.zeros((capacity, self._widths[name]), dtype=DTYPES.get(name, np.float32))
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
        anchored = np.where(self.n[r] > 0, self._anchored(r, seasonal), math.nan)
        half = self._slow(r) * self._held_q(r)
        return anchored, anchored - half, anchored + half

    def _anchored(self, r: IDX, seasonal: F64) -> F64:
        """The seasonal forecast on the anchor instead of the slow level."""
        out: F64 = seasonal + (self.anchor[r] - self.level[r])
        return out

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
            z, burst, nl = self._residual_news(r, t, x, yhat, s, ok)
            shape = self._shape(r, x, ok)
            nl = np.fmax(nl, p.shape_weight * self._decades(self.hn[r], r, shape.dist))
            onset = np.minimum(1.0, np.fmax(0.0, (nl - p.score_from) / p.score_span))
            anchored = self._anchored(r, seasonal)
            zs, q, held, band = self._held(r, x, anchored, ok)
        ready = ok & (self.n[r] >= p.warmup)
        raw, held = np.where(ready, onset, 0.0), np.where(ready, held, 0.0)
        peak = self._peak(r, t, ok)
        onset = np.where(raw > peak, raw, 0.0)  # news once: not within a recent peak
        out = Scored(np.fmax(raw, held), *band, onset, held)
        return _Step(out, seasonal, fast, s, z, burst, zs, q, yhat, anchored, shape, raw, peak)

    def _decades(self, h: F32, r: IDX, f: F64) -> F64:
        """The surprise of ``f`` against the histogram ``h`` of rows ``r``, in decades
        (``-log10 P(F >= f)``, at most CAP)."""
        pf = surprise.tail(h, self.hist_w[r], f, self.params.prior)
        out: F64 = np.minimum(CAP, -np.log10(np.maximum(pf, 1e-300)))
        return out

    def _residual_news(
        self, r: IDX, t: F64, x: F64, yhat: F64, s: F64, ok: BOOL
    ) -> tuple[F64, F64, F64]:
        """``(z, burst, nl)``: the residual in scales, the short mean of its surprise ``u``
        and the two surprises together in decades (``u`` capped at CAP decades)."""
        p = self.params
        res = x - yhat
        z = np.where(ok, np.where(res == 0, 0.0, np.where(s > 0, np.abs(res) / s, np.inf)), 0.0)
        pz = surprise.tail(self.hz[r], self.hist_w[r], z, p.prior)
        u = np.minimum(CAP * LN10, -np.log(np.maximum(pz, 1e-300)))
        a = np.maximum(_ew(t - self.t[r], p.burst_s), 1.0 / p.burst_n)
        burst = np.where(ok, self.burst[r] + a * (u - self.burst[r]), 0.0)
        pb = surprise.tail(self.hb[r], self.hist_w[r], burst, p.prior)
        nl = (u - np.log(np.maximum(pb, 1e-300))) / LN10
        return z, burst, nl

    def _held(
        self, r: IDX, x: F64, seasonal: F64, ok: BOOL
    ) -> tuple[F64, F64, F64, tuple[F64, F64, F64]]:
        """``(zs, q, held, (expected, lower, upper))``: the residual against the
        (anchored) seasonal forecast in slow scales, its held quantile, the held score and
        the band."""
        p = self.params
        rs, ss, q = x - seasonal, self._slow(r), self._held_q(r)
        zs = np.where(rs == 0, 0.0, np.where(ss > 0, np.abs(rs) / ss, np.inf))
        zs = np.where(ok, zs, 0.0)
        held = np.minimum(1.0, np.fmax(0.0, (zs / q - 1.0) / p.held_span))
        expected = np.where(self.n[r] > 0, seasonal, math.nan)
        return zs, q, held, (expected, expected - ss * q, expected + ss * q)

    def _peak(self, r: IDX, t: F64, ok: BOOL) -> F64:
        """The row's peak onset decayed to ``t`` over ``quiet_s`` (0: no quiet period)."""
        quiet = self.params.quiet_s
        if quiet == 0:
            return np.zeros(len(r))
        with np.errstate(invalid="ignore"):
            dt = np.where(ok, t - self.t[r], 0.0)
        out: F64 = self.peak[r] * np.exp(-dt / quiet)
        return out

    def _shape(self, r: IDX, x: F64, ok: BOOL) -> _Shape:
        """The window with ``x`` shifted in, standardised and aligned (NaN where not
        judged: a row younger than the window, flat so far, or ``x`` not learnt); its
        nearest prototype and the RMS distance to it (0 where not judged or none yet)."""
        p = self.params
        k, w = p.shape_k, p.shape_n
        window = np.concatenate([self.win[r, 1:], x[:, None]], axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            dev = np.where(self.slow_w[r] > 0, self.dev[r] / self.slow_w[r], 0.0)
            judged = ok & (self.n[r] >= w) & (dev > 0)
            lim = 127.0 / PROTO_STEP
            e = np.clip((window - self.mean[r][:, None]) / dev[:, None], -lim, lim)
        # aligned: rotated so that its largest |value| is the last (a spike, a burst's
        # peak: the same shape wherever it is in the window, one prototype, not shape_n)
        shift = (w - 1 - np.argmax(np.fmax(np.abs(e), 0.0), axis=1))[:, None]  # NaN: 0
        e = e[np.arange(len(r))[:, None], (np.arange(w)[None, :] - shift) % w]
        e = np.where(judged[:, None], e, math.nan)
        diff = self.proto[r].reshape(len(r), k, w) / PROTO_STEP  # the prototypes, less e
        diff -= e[:, None, :]
        d2 = _mean_square(diff)
        d2 = np.where((self.use[r] > 0) & judged[:, None], d2, np.inf)
        near = np.argmin(d2, axis=1)
        dist = np.sqrt(d2[np.arange(len(r)), near])
        return _Shape(window, e, near, np.where(np.isfinite(dist), dist, 0.0))  # none yet: 0

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
        if fresh.any():
            f = r[fresh]
            self.t[f], self.level[f], self.fast[f], self.n[f] = t[fresh], x[fresh], x[fresh], 1
            self.anchor[f] = x[fresh]
            self.mean[f], self.win[f] = x[fresh], x[fresh][:, None]
        if later.any():
            self._learn(r[later], t[later], x[later], step, later)
        return step.out

    def _learn(self, g: IDX, t: F64, x: F64, step: _Step, m: BOOL) -> None:
        dt = t - self.t[g]
        zs, q = step.zs[m], step.q[m]
        self._histograms(g, dt, step.z[m], step.burst[m], np.minimum(zs, q), step.shape.dist[m])
        self._learn_shape(g, x, dt, step, m)
        self.q_hold[g] = np.where(zs > q, q, 0.0)  # deviating: its quantile is held
        held_for = np.where(zs > q, self.held_for[g] + dt, 0.0).astype(np.float32)
        self.held_for[g] = held_for
        learns = self._anchor_learns(g, zs, q, held_for)
        self._scales(g, dt, x, step, m)
        self._forecasters(g, t, dt, x, step, m, learns)
        self.t[g], self.n[g] = t, np.minimum(self.n[g] + 1, N_MAX)
        bad = ~(np.isfinite(self.level[g]) & np.isfinite(self.fast[g]))
        bad |= ~np.isfinite(self.anchor[g])
        bad |= ~(np.isfinite(self.scale[g]) & np.isfinite(self.profile[g]).all(axis=1))
        if bad.any():
            self.reset(g[bad])  # overflowed (values near float's limits): start over

    def _anchor_learns(self, g: IDX, zs: F64, q: F64, held_for: F32) -> BOOL:
        """Whether the anchor learns: not while a deviation lasts (hold_from_s already,
        up to hold_s), once warm (before, a deviation is not yet known from normal)."""
        p = self.params
        held = (zs > q) & (held_for >= p.hold_from_s) & (held_for <= p.hold_s)
        out: BOOL = ~held | (self.n[g] < p.warmup)
        return out

    def _scales(self, g: IDX, dt: F64, x: F64, step: _Step, m: BOOL) -> None:
        """The scale (against the mixed forecast), the slow scale (against the anchored
        seasonal one) and the two forecasts' squared errors."""
        p, s = self.params, step.scale[m]
        a = _ew(dt, p.scale_s)
        self.scale_w[g] += a * (1.0 - self.scale_w[g])
        res = np.abs(x - step.mixed[m])
        self.scale[g] += a * (np.where(s > 0, np.minimum(res, 10.0 * s), res) - self.scale[g])
        a, ss = _ew(dt, p.memory_s), self._slow(g)
        self.slow_w[g] += a * (1.0 - self.slow_w[g])
        rs = np.abs(x - step.anchored[m])
        self.slow[g] += a * (np.where(ss > 0, np.minimum(rs, p.huber * ss), rs) - self.slow[g])
        a = _ew(dt, p.error_s)
        self.err_seasonal[g] += a * ((x - step.seasonal[m]) ** 2 - self.err_seasonal[g])
        self.err_fast[g] += a * ((x - step.fast[m]) ** 2 - self.err_fast[g])

    def _forecasters(
        self, g: IDX, t: F64, dt: F64, x: F64, step: _Step, m: BOOL, learns: BOOL
    ) -> None:
        """The level, the anchor (where it ``learns``: not held), the seasons and the
        fast level (residuals clipped at huber scales)."""
        p, s = self.params, step.scale[m]
        e = x - step.seasonal[m]
        c = np.where(s > 0, p.huber * s, np.inf)
        dev = np.maximum(-c, np.minimum(c, e))
        a = _ew(dt, p.level_s)
        self.level[g] += a * dev
        ea = np.maximum(-c, np.minimum(c, x - step.anchored[m]))
        self.anchor[g] += np.where(learns, a * ea, 0.0)
        self._seasons(g, t, dt, e, dev)
        self.fast[g] += _ew(dt, p.fast_s) * (x - step.fast[m])

    def _learn_shape(self, g: IDX, x: F64, dt: F64, step: _Step, m: BOOL) -> None:
        """The peak onset, the window and its standardisation (dev's weight is slow_w,
        learnt in :meth:`_learn`), the prototypes' hits (decayed over memory_s) and the
        prototypes themselves."""
        p = self.params
        self.peak[g] = np.fmax(step.peak[m], step.raw[m])
        self.win[g] = step.shape.window[m]
        a = _ew(dt, p.memory_s)
        self.mean[g] += a * (x - self.mean[g])
        self.dev[g] += a * (np.abs(x - self.mean[g]) - self.dev[g])
        self.use[g] *= np.exp(-dt / p.memory_s)[:, None]
        e, near, dist = step.shape.e[m], step.shape.near[m], step.shape.dist[m]
        judged = np.isfinite(e[:, 0])
        hit = judged & (dist <= p.shape_r)
        if hit.any():
            self._move_prototype(g[hit], near[hit], e[hit])
        miss = judged & ~hit
        if miss.any():  # a shape not seen: rare once the prototypes are learnt
            self._replace_prototype(g[miss], e[miss])

    def _move_prototype(self, h: IDX, j: IDX, e: F64) -> None:
        """Prototype ``j`` of rows ``h`` (the nearest, within shape_r) moves towards the
        window ``e``: a running mean of its hits, at least shape_lr."""
        use = self.use[h, j].astype(np.float64) + 1.0
        lr = np.maximum(1.0 / use, self.params.shape_lr)[:, None]
        old = self._prototype(h, j)
        self._set_prototype(h, j, old + lr * (e - old), use)

    def _replace_prototype(self, h: IDX, e: F64) -> None:
        """The window ``e``, far from all prototypes of rows ``h``, replaces the least used
        one (the first of the unused)."""
        j = np.argmin(self.use[h], axis=1)
        self._set_prototype(h, j, e, np.ones(len(h)))

    def _columns(self, j: IDX) -> IDX:
        """Where prototype ``j`` lies in a row of :attr:`proto` (shape_n columns each)."""
        w = self.params.shape_n
        out: IDX = j[:, None] * w + np.arange(w)[None, :]
        return out

    def _prototype(self, h: IDX, j: IDX) -> F64:
        """Prototype ``j`` of each row ``h``, in deviations."""
        out: F64 = self.proto[h[:, None], self._columns(j)] / PROTO_STEP
        return out

    def _set_prototype(self, h: IDX, j: IDX, e: F64, use: F64) -> None:
        """Prototype ``j`` of each row ``h`` takes ``e`` (rounded to PROTO_STEPs), its hits
        ``use``."""
        steps = np.clip(np.rint(e * PROTO_STEP), -127, 127).astype(np.int8)
        self.proto[h[:, None], self._columns(j)] = steps
        self.use[h, j] = use

    def _histograms(self, g: IDX, dt: F64, z: F64, burst: F64, zs: F64, dist: F64) -> None:
        """Decay the counts by event time, count z, the burst, zs (clipped at the band:
        a fault does not widen it; an infinite z, the first change of a series that never
        moved, is not counted) and the shape's distance."""
        fin = np.isfinite(z)
        h = g[fin]
        keep = np.exp(-dt[fin] / self.params.memory_s)
        self.hz[h] = self.hz[h] * keep[:, None]
        self.hb[h] = self.hb[h] * keep[:, None]
        self.hs[h] = self.hs[h] * keep[:, None]
        self.hn[h] = self.hn[h] * keep[:, None]
        self.hist_w[h] = self.hist_w[h] * keep + 1.0
        surprise.add(self.hz, h, z[fin])
        surprise.add(self.hb, h, burst[fin])
        surprise.add(self.hs, h, zs[fin])
        surprise.add(self.hn, h, dist[fin])
        self.burst[g] = burst

    def _seasons(self, g: IDX, t: F64, dt: F64, e: F64, dev: F64) -> None:
        """The profile slot of ``t`` (its first visit takes the residual whole, later ones
        a running mean that forgets over ``profile_s``) and the weekday offset."""
        p = self.params
        k = np.minimum((t % DAY / DAY * p.slots).astype(np.intp), p.slots - 1)
        d = np.mod(np.floor(t / DAY) + 3, WEEK).astype(np.intp)
        visits = self.visits[g, k].astype(np.float64) + 1.0  # float16 stops at 2048
        self.visits[g, k] = visits
        first = visits == 1.0
        a = np.where(first, 1.0, np.maximum(1.0 / visits, _ew(dt * p.slots, p.profile_s)))
        self.profile[g, k] = self.profile[g, k] + a * np.where(first, e, dev)
        self.weekly[g, d] = self.weekly[g, d] + _ew(dt * WEEK, p.weekly_s) * dev
        self.weekly_days[g, d] = self.weekly_days[g, d] + np.minimum(dt, 3600.0) / DAY

    # ------------------------------------------------------------------ snapshots

    def dump(self, rows: npt.ArrayLike) -> dict[str, Any]:
        """The state of ``rows`` as plain data (lists of floats, NaN as None, a version,
        the parameters); :meth:`load` puts it back, onto any rows of a bank like this one."""
        r = np.asarray(rows, dtype=np.intp).ravel()
        out: dict[str, Any] = {"version": VERSION, "params": self.params.as_dict()}
        for name in (*SCALARS, *VECTORS):
            out[name] = plain_list(getattr(self, name)[r])
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
            dtype = DTYPES.get(name, np.float32)
            parts[name] = np.asarray(data[name], dtype=dtype).reshape(len(r), -1)
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


def plain_list(a: npt.NDArray[Any]) -> list[Any]:
    """``a`` as (nested) lists of Python numbers, NaN as None: plain data that compares
    equal to itself (numpy reads None back as NaN).

    >>> plain_list(np.array([[1.5, np.nan]], dtype=np.float32))
    [[1.5, None]]
    """
    if a.dtype.kind != "f":
        return list(a.tolist())
    nan = np.isnan(a)
    if not nan.any():
        return list(a.tolist())
    out = a.astype(np.float64).astype(object)
    out[nan] = None
    return list(out.tolist())
