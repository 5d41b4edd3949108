"""The generic detector's specification: the algorithm of
:class:`~ragwatch.detectors.generic.GenericBank` written the simplest way, one object per
series, plain Python floats, lists and loops (no numpy). ``tests/unit/test_generic.py``
holds the bank to it within a tolerance. What the bank stores in float32 (the profile,
the weekday offsets, the histograms, the shape's window and its prototypes' hits) is
rounded to float32 here too (:func:`f32`), the profile's visits to float16 (:func:`f16`)
and the prototypes to int8 steps (:func:`steps`), so the two differ only by the order of
float64 operations.

One observation ``(t, x)``, scored against the state before it, then learnt:

1. forecasts: ``seasonal = level + profile[slot of t] + weekday offset (shrunk by its
   evidence)`` and ``fast`` (a short EWMA); ``yhat`` mixes them by inverse squared error;
2. ``z = |x - yhat| / scale``; its surprise ``u = -ln P(Z >= z)`` from the histogram of past
   z (plus a heavy-tailed prior); the burst ``b`` = short EW mean of u; its own tail
   probability from the histogram of past b; ``nl = (u + -ln P(B >= b)) / ln 10``;
3. shape: the last ``shape_n`` values standardised by the mean and mean |deviation|
   (clipped at +-127 / PROTO_STEP), rotated so that the largest |value| is the last; ``d``
   its RMS distance to the nearest used prototype; ``v = -log10 P(D >= d)`` from the
   histogram of past d; ``nl = max(nl, shape_weight * v)``;
4. ``raw = clip((nl - score_from) / score_span, 0, 1)`` once ``warmup`` were learnt; the
   onset is ``raw`` if above the last peak onset decayed over ``quiet_s``, else 0;
5. held: ``anchored = anchor + profile + weekday offset`` (the seasonal forecast on the
   anchor, a level that learns as ``level`` does but not while a deviation lasts, from
   ``hold_from_s`` up to ``hold_s``, once warm), ``zs = |x - anchored| / slow`` (slow: the
   mean |x - anchored| over ``memory_s``, each clipped at ``huber`` slow scales), ``q`` the
   ``1 - held_p`` quantile of past zs (held at its value while a deviation, ``zs > q``,
   goes on), ``held = clip((zs / q - 1) / held_span, 0, 1)``; ``score = max(raw, held)``;
   the expected value is ``anchored``, the band ``anchored -+ slow * q``;
6. learn: histograms (decayed by event time), the peak onset, the window, its mean and
   deviation, the prototypes (the nearest within ``shape_r`` moves to the window, else
   the window replaces the least used), the scale, the slow scale, the forecasters'
   errors, the level, the anchor (not while held), the profile slot, the weekday offset
   and the fast level (residuals clipped at ``huber`` scales).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field

from ragwatch.detectors.generic import GenericParams
from ragwatch.detectors.generic.params import (
    BINS,
    CAP,
    DAY,
    LO,
    PROTO_STEP,
    SHAPE_BINS,
    STEP,
    WEEK,
)

LN10 = math.log(10.0)


def f32(v: float) -> float:
    """``v`` rounded to float32 (out of range: +-inf), as a float32 array stores it."""
    try:
        return float(struct.unpack("f", struct.pack("f", v))[0])
    except OverflowError:
        return math.copysign(math.inf, v)


def f16(v: float) -> float:
    """``v`` rounded to float16, as a float16 array stores it (counts up to 2049 here)."""
    return float(struct.unpack("e", struct.pack("e", v))[0])


def steps(e: list[float]) -> list[int]:
    """A window in deviations as a prototype stores it: int8 steps of 1 / PROTO_STEP
    (rounded half to even, as numpy's rint)."""
    return [max(-127, min(127, round(v * PROTO_STEP))) for v in e]


def ew(dt: float, memory: float) -> float:
    """The weight of a new value in an exponential average of ``memory`` seconds."""
    return 1.0 - math.exp(-dt / memory)


def tail(h: list[float], w: float, f: float, prior: float) -> float:
    """P(F >= f): the histogram's share at or above ``f`` (linear within a bin) plus a
    prior of ``prior`` pseudo-observations with tail ``min(1, 1/f)``."""
    if not f > 0:
        return 1.0
    if math.isinf(f):
        return 0.0
    pos = (math.log2(f) - LO) / STEP
    if pos < 0:
        above = sum(h)
    elif pos >= len(h):  # BINS, or SHAPE_BINS for the shape's distances
        above = 0.0
    else:
        k = int(pos)
        above = sum(h[k + 1 :]) + h[k] * (k + 1 - pos)
    return min(1.0, (above + prior * min(1.0, 1.0 / f)) / (w + prior))


def quantile(h: list[float], w: float, p: float, prior: float) -> float:
    """The ``f`` with ``P(F >= f) = p``: between bin edges, linear in the edge index;
    beyond the last edge, the prior's tail alone."""
    prev = 1.0
    for k in range(BINS + 1):
        edge = 2.0 ** (LO + k * STEP)
        q = (sum(h[k:]) + prior * min(1.0, 1.0 / edge)) / (w + prior)
        if q <= p:
            pos = k - 1 + (prev - p) / (prev - q) if k else 0.0
            return 2.0 ** (LO + pos * STEP)
        prev = q
    return max(2.0 ** (LO + BINS * STEP), prior / ((w + prior) * p))


def add(h: list[float], f: float) -> None:
    """Count ``f`` in its bin (below the first: in none, only in the total)."""
    if f > 0:
        pos = (math.log2(f) - LO) / STEP
        if pos >= 0:
            k = len(h) - 1 if pos >= len(h) else int(pos)
            h[k] = f32(h[k] + 1.0)


def slot_of(t: float, slots: int) -> int:
    return min(int(t % DAY / DAY * slots), slots - 1)


def weekday_of(t: float) -> int:
    return int(math.floor(t / DAY) + 3) % WEEK  # 1970-01-01 was a Thursday


@dataclass
class Step:
    """What scoring one observation found (learning reuses it)."""

    score: float
    yhat: float
    lower: float
    upper: float
    onset: float = 0.0
    held: float = 0.0
    seasonal: float = math.nan
    fast: float = math.nan
    scale: float = 0.0
    z: float = 0.0
    burst: float = 0.0
    zs: float = 0.0
    q: float = math.nan
    mixed: float = math.nan
    anchored: float = math.nan
    raw: float = 0.0  # the onset before the quiet period
    peak: float = 0.0  # the peak onset decayed to t
    window: list[float] = field(default_factory=list)  # the last shape_n values
    e: list[float] | None = None  # ... standardised and aligned (None: not judged)
    near: int = 0  # the nearest prototype
    dist: float = 0.0  # ... its RMS distance (0: not judged, or none yet)


@dataclass
class GenericReference:
    """One series."""

    p: GenericParams = field(default_factory=GenericParams)
    late: int = 0
    n: int = 0
    t: float = math.nan
    level: float = 0.0
    fast: float = 0.0
    err_seasonal: float = 0.0
    err_fast: float = 0.0
    scale: float = 0.0
    scale_w: float = 0.0
    burst: float = 0.0
    hist_w: float = 0.0
    slow: float = 0.0
    slow_w: float = 0.0
    q_hold: float = 0.0
    anchor: float = 0.0
    held_for: float = 0.0
    profile: list[float] = field(default_factory=list)
    visits: list[float] = field(default_factory=list)
    weekly: list[float] = field(default_factory=lambda: [0.0] * WEEK)
    weekly_days: list[float] = field(default_factory=lambda: [0.0] * WEEK)
    hz: list[float] = field(default_factory=lambda: [0.0] * BINS)
    hb: list[float] = field(default_factory=lambda: [0.0] * BINS)
    hs: list[float] = field(default_factory=lambda: [0.0] * BINS)
    mean: float = 0.0
    dev: float = 0.0
    peak: float = 0.0
    win: list[float] = field(default_factory=list)
    proto: list[list[int]] = field(default_factory=list)
    use: list[float] = field(default_factory=list)
    hn: list[float] = field(default_factory=lambda: [0.0] * SHAPE_BINS)

    def __post_init__(self) -> None:
        self.profile = [0.0] * self.p.slots
        self.visits = [0.0] * self.p.slots
        self.win = [0.0] * self.p.shape_n
        self.proto = [[0] * self.p.shape_n for _ in range(self.p.shape_k)]
        self.use = [0.0] * self.p.shape_k

    def forecasts(self, t: float) -> tuple[float, float, float]:
        """``(yhat, seasonal, fast)`` at ``t`` (NaN before the first observation)."""
        if self.n == 0 or not math.isfinite(t):
            return math.nan, math.nan, math.nan
        d = weekday_of(t)
        days = self.weekly_days[d]
        trust = days / (days + self.p.weekly_days) if days > 0 else 0.0
        seasonal = self.level + self.profile[slot_of(t, self.p.slots)] + self.weekly[d] * trust
        es, ef = self.err_seasonal, self.err_fast
        w = ef / (es + ef) if es + ef > 0 else 0.5
        return self.fast + w * (seasonal - self.fast), seasonal, self.fast

    def held_q(self) -> float:
        """The seasonal residual's 1 - held_p quantile (held while a deviation goes on)."""
        if self.q_hold > 0:
            return self.q_hold
        return quantile(self.hs, self.hist_w, self.p.held_p, self.p.prior)

    def forecast(self, t: float) -> tuple[float, float, float]:
        anchored = self.forecasts(t)[1] - self.level + self.anchor
        half = self.slow_now() * self.held_q()
        return anchored, anchored - half, anchored + half

    def scale_now(self) -> float:
        return self.scale / self.scale_w if self.scale_w > 0 else 0.0

    def slow_now(self) -> float:
        return self.slow / self.slow_w if self.slow_w > 0 else 0.0

    def score(self, t: float, x: float) -> Step:
        """Score ``x`` at ``t`` against the state, changing nothing."""
        yhat, seasonal, fast = self.forecasts(t)
        anchored = seasonal + (self.anchor - self.level)
        s, slow, q = self.scale_now(), self.slow_now(), self.held_q()
        half = slow * q
        out = Step(0.0, anchored, anchored - half, anchored + half)
        out.seasonal, out.fast, out.scale = seasonal, fast, s
        out.q, out.mixed, out.anchored = q, yhat, anchored
        if not (math.isfinite(x) and self.n > 0 and t > self.t):
            return out
        r = x - yhat
        out.z = 0.0 if r == 0 else math.inf if s <= 0 else abs(r) / s
        rs = x - anchored
        out.zs = 0.0 if rs == 0 else math.inf if slow <= 0 else abs(rs) / slow
        u = min(CAP * LN10, -math.log(max(tail(self.hz, self.hist_w, out.z, self.p.prior), 1e-300)))
        a = max(ew(t - self.t, self.p.burst_s), 1.0 / self.p.burst_n)
        out.burst = self.burst + a * (u - self.burst)
        out.window = [*self.win[1:], x]
        out.e, out.near, out.dist = self.shape(out.window)
        if self.n >= self.p.warmup:
            out.raw = self.raw_onset(u, out.burst, out.dist)
            out.held = min(1.0, max(0.0, (out.zs / q - 1.0) / self.p.held_span)) if q > 0 else 1.0
            out.score = max(out.raw, out.held)
        quiet = self.p.quiet_s
        out.peak = self.peak * math.exp(-(t - self.t) / quiet) if quiet > 0 else 0.0
        out.onset = out.raw if out.raw > out.peak else 0.0  # news once
        return out

    def raw_onset(self, u: float, burst: float, dist: float) -> float:
        """The onset before the quiet period: the residual's two surprises (``u`` and the
        burst's) or the shape's, weighted, the larger, in decades, mapped to [0, 1]."""
        p = self.p
        pb = tail(self.hb, self.hist_w, burst, p.prior)
        nl = (u - math.log(max(pb, 1e-300))) / LN10
        v = min(CAP, -math.log10(max(tail(self.hn, self.hist_w, dist, p.prior), 1e-300)))
        nl = max(nl, p.shape_weight * v)
        return min(1.0, max(0.0, (nl - p.score_from) / p.score_span))

    def shape(self, window: list[float]) -> tuple[list[float] | None, int, float]:
        """The window standardised and rotated so that its largest |value| is the last
        (None: fewer than shape_n learnt, or no deviation yet), the nearest prototype among
        those used and its RMS distance (0 when none is used yet)."""
        p = self.p
        dev = self.dev / self.slow_w if self.slow_w > 0 else 0.0
        if self.n < p.shape_n or not dev > 0:
            return None, 0, 0.0
        lim = 127.0 / PROTO_STEP
        e = [max(-lim, min(lim, (v - self.mean) / dev)) for v in window]
        top = max(range(len(e)), key=lambda i: abs(e[i]))  # the first of the largest
        e = e[top + 1 :] + e[: top + 1]
        near, best = 0, math.inf
        for j, proto in enumerate(self.proto):
            if self.use[j] > 0:
                d2 = sum((s / PROTO_STEP - v) ** 2 for s, v in zip(proto, e, strict=True)) / len(e)
                if d2 < best:
                    near, best = j, d2
        return e, near, math.sqrt(best) if best < math.inf else 0.0

    def update(self, t: float, x: float) -> Step:
        """Score, then learn (if ``x`` is finite and ``t`` after the last learnt)."""
        step = self.score(t, x)
        if not (math.isfinite(x) and math.isfinite(t)):
            return step
        if self.n == 0:
            self.n, self.t, self.level, self.fast, self.anchor = 1, t, x, x, x
            self.mean, self.win = x, [f32(x)] * self.p.shape_n
        elif not t > self.t:
            self.late += 1
        else:
            self.learn(t, x, step)
        return step

    def learn(self, t: float, x: float, step: Step) -> None:
        dt = t - self.t
        self.learn_histograms(dt, step)
        self.learn_shape(dt, x, step)
        self.burst = step.burst
        self.q_hold = step.q if step.zs > step.q else 0.0  # deviating: q is held
        self.held_for = f32(self.held_for + dt) if step.zs > step.q else 0.0
        p = self.p
        held = step.zs > step.q and p.hold_from_s <= self.held_for <= p.hold_s
        learns = not held or self.n < p.warmup  # the anchor's hold
        self.learn_scales(dt, x, step)
        self.learn_forecasts(t, dt, x, step, learns)
        self.t, self.n = t, min(self.n + 1, 2**30)
        if not all(
            map(math.isfinite, (self.level, self.anchor, self.fast, self.scale, *self.profile))
        ):
            self.__init__(self.p, self.late)  # type: ignore[misc]  # overflowed: start over

    def learn_histograms(self, dt: float, step: Step) -> None:
        """Decay the counts, count z, the burst, zs and the shape's distance; a change of
        a series that never moved (z infinite) is not counted."""
        if not math.isfinite(step.z):
            return
        keep = math.exp(-dt / self.p.memory_s)
        self.hz = [f32(h * keep) for h in self.hz]
        self.hb = [f32(h * keep) for h in self.hb]
        self.hs = [f32(h * keep) for h in self.hs]
        self.hn = [f32(h * keep) for h in self.hn]
        self.hist_w = self.hist_w * keep + 1.0
        add(self.hz, step.z)
        add(self.hb, step.burst)
        add(self.hs, min(step.zs, step.q))  # clipped at the band: a fault does not widen it
        add(self.hn, step.dist)

    def learn_scales(self, dt: float, x: float, step: Step) -> None:
        """The scale, the slow scale and the two forecasts' squared errors."""
        p, r, s = self.p, x - step.mixed, step.scale
        a = ew(dt, p.scale_s)
        self.scale_w += a * (1.0 - self.scale_w)
        self.scale += a * ((min(abs(r), 10.0 * s) if s > 0 else abs(r)) - self.scale)
        a, slow = ew(dt, p.memory_s), self.slow_now()
        self.slow_w += a * (1.0 - self.slow_w)
        rs = abs(x - step.anchored)
        self.slow += a * ((min(rs, p.huber * slow) if slow > 0 else rs) - self.slow)
        a = ew(dt, p.error_s)
        self.err_seasonal += a * ((x - step.seasonal) ** 2 - self.err_seasonal)
        self.err_fast += a * ((x - step.fast) ** 2 - self.err_fast)

    def learn_forecasts(self, t: float, dt: float, x: float, step: Step, learns: bool) -> None:
        """The level, the anchor (not while held: ``learns`` False), the profile slot, the
        weekday offset and the fast level (residuals clipped at huber scales)."""
        p, s = self.p, step.scale
        e = x - step.seasonal
        c = p.huber * s if s > 0 else math.inf
        dev = max(-c, min(c, e))
        self.level += ew(dt, p.level_s) * dev
        if learns:
            self.anchor += ew(dt, p.level_s) * max(-c, min(c, x - step.anchored))
        k, d = slot_of(t, p.slots), weekday_of(t)
        visits = self.visits[k] + 1.0
        self.visits[k] = f16(visits)  # it stays at 2048; the slot forgets by profile_s then
        first = visits == 1.0
        a = 1.0 if first else max(1.0 / visits, ew(dt * p.slots, p.profile_s))
        self.profile[k] = f32(self.profile[k] + a * (e if first else dev))
        self.weekly[d] = f32(self.weekly[d] + ew(dt * WEEK, p.weekly_s) * dev)
        self.weekly_days[d] = f32(self.weekly_days[d] + min(dt, 3600.0) / DAY)
        self.fast += ew(dt, p.fast_s) * (x - self.fast)

    def learn_shape(self, dt: float, x: float, step: Step) -> None:
        """The peak onset, the window, its mean and deviation, the prototypes' hits
        (decayed) and the prototype the window moves or replaces."""
        p = self.p
        self.peak = max(step.peak, step.raw)
        self.win = [f32(v) for v in step.window]
        a = ew(dt, p.memory_s)
        self.mean += a * (x - self.mean)
        self.dev += a * (abs(x - self.mean) - self.dev)
        keep = math.exp(-dt / p.memory_s)
        self.use = [f32(u * keep) for u in self.use]
        if step.e is None:
            return
        if step.dist <= p.shape_r:  # the nearest learns it: a running mean of its hits
            j, use = step.near, self.use[step.near] + 1.0
            lr = max(1.0 / use, p.shape_lr)
            old = [s / PROTO_STEP for s in self.proto[j]]
            new = [o + lr * (v - o) for o, v in zip(old, step.e, strict=True)]
        else:  # far from all: it replaces the least used
            j, use, new = self.use.index(min(self.use)), 1.0, step.e
        self.proto[j], self.use[j] = steps(new), f32(use)
