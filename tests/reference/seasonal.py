"""The seasonal baseline's specification: the algorithm of
:mod:`ragwatch.detectors.seasonal` (without its weekly profile) written the simplest way,
one object per series, plain Python floats and loops. It was the product's object form
until issue 30 made :class:`~ragwatch.detectors.seasonal.SeasonalBank` the only
implementation; ``tests/unit/test_seasonal_bank.py`` holds the bank (``weekly_sd=0``) to
it within a tolerance.

What it models (the product's module docstring has the whole of it): the expected ``z``
at ``t`` is ``level + trend * elapsed + profile(time of day)``; the profile is the median
of the last ``days`` days' curves, smoothed and shrunk by its noise; level and trend are a
two-state Kalman filter with robust filtering of spikes; a hold keeps a deviation out and
accepts it as the new level after ``hold_max_s``.
"""

from __future__ import annotations

import math
import statistics
from array import array
from dataclasses import dataclass
from typing import Any, NamedTuple

DAY = 86400.0
# Without a daily profile (the first day), a held level cannot follow the rhythm: one with
# a steep trend is accepted as the new normal after this long (see _longest_hold).
UNPROFILED_HOLD_S = 3 * 3600.0
HOLD_DRIFT = 0.1  # without a profile: how far the trend may carry the level while held
OUTLIER_RUN = 5  # outliers in a row on one side are a step, not spikes
DRIFT_ALPHA = 0.01  # per observation: the average |trend| spans hours, not a fault's onset
PROFILED_TREND = 0.1  # trend_noise is scaled by this once there is a profile


class Forecast(NamedTuple):
    """Expected ``z`` at a time: ``var`` is the uncertainty of the expectation itself (the
    state's), ``noise`` the variance one observation of one step has beyond its sampling
    noise (``model_var``): a window of ``m`` steps averages it to ``noise / m``."""

    mean: float
    var: float
    noise: float = 0.0

    @property
    def total(self) -> float:
        """The variance of one step's observation around the forecast, sampling aside."""
        return self.var + self.noise


@dataclass(frozen=True, slots=True)
class Relearned:
    """The baseline accepted a new level at ``at`` after holding for ``held_s``."""

    at: float
    held_s: float
    before: float  # forecast z just before the acceptance (the pre-fault baseline)
    after: float  # the level it restarted from (the observed one)


class ReferenceBaseline:
    """Profile from previous days + local level/trend + hold (see module docstring).

    Cells are kept per day seen, a row of ``slots`` cells each, allocated when the day
    starts (a new series holds one row, not ``days``), at most ``days`` rows, the oldest
    day's row reused."""

    __slots__ = (
        "_b",
        "_count",
        "_day",
        "_drift",
        "_held_q",
        "_held_since",
        "_l",
        "_mean",
        "_n",
        "_open",
        "_p00",
        "_p01",
        "_p11",
        "_profile",
        "_refreshed",
        "_row",
        "_row_day",
        "_run",
        "_scale",
        "_t",
        "_w",
        "_zw",
        "damping",
        "days",
        "hold_max_s",
        "late",
        "level_noise",
        "min_coverage",
        "model_var",
        "outlier_z",
        "outliers",
        "relearned",
        "season_s",
        "slot_s",
        "slots",
        "step_s",
        "trend_noise",
        "unprofiled_hold_s",
        "warmup",
    )

    def __init__(
        self,
        *,
        step_s: float = 60.0,
        season_s: float = DAY,
        slot_s: float = 1800.0,
        days: int = 7,
        level_noise: float = 0.001,
        trend_noise: float = 2e-4,
        damping: float = 0.995,
        min_coverage: float = 0.75,
        warmup: int = 5,
        hold_max_s: float = DAY,
        outlier_z: float = 3.5,
        unprofiled_hold_s: float | None = None,
    ) -> None:
        for name, v in (("step_s", step_s), ("season_s", season_s), ("slot_s", slot_s)):
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be finite and > 0, got {v!r}")
        slots = season_s / slot_s
        if not (slots >= 2 and abs(slots - round(slots)) < 1e-9):
            raise ValueError(f"season_s must be a multiple (>= 2) of slot_s, got {season_s!r}")
        if int(days) != days or days < 1:
            raise ValueError(f"days must be an integer >= 1, got {days!r}")
        for name, v in (("level_noise", level_noise), ("trend_noise", trend_noise)):
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {v!r}")
        if not 0 < damping <= 1:
            raise ValueError(f"damping must be in (0, 1], got {damping!r}")
        if not 0 < min_coverage <= 1:
            raise ValueError(f"min_coverage must be in (0, 1], got {min_coverage!r}")
        if int(warmup) != warmup or warmup < 1:
            raise ValueError(f"warmup must be an integer >= 1, got {warmup!r}")
        if not (math.isfinite(hold_max_s) and hold_max_s >= 0):
            raise ValueError(f"hold_max_s must be finite and >= 0, got {hold_max_s!r}")
        self.step_s, self.season_s, self.slot_s = float(step_s), float(season_s), float(slot_s)
        self.slots, self.days = round(slots), int(days)
        self.level_noise, self.trend_noise = float(level_noise), float(trend_noise)
        self.damping, self.min_coverage = float(damping), float(min_coverage)
        self.warmup, self.hold_max_s = int(warmup), float(hold_max_s)
        if not outlier_z > 0:
            raise ValueError(f"outlier_z must be > 0, got {outlier_z!r}")
        self.outlier_z = float(outlier_z)
        self.outliers = 0  # observations too far from the forecast to be learnt
        if unprofiled_hold_s is not None and not unprofiled_hold_s >= 0:
            raise ValueError(f"unprofiled_hold_s must be >= 0, got {unprofiled_hold_s!r}")
        self.unprofiled_hold_s = unprofiled_hold_s
        self._run = 0  # consecutive outliers on the same side (signed: + above, - below)
        self._drift = 0.0  # slow average of |trend|: how fast the level moves (the rhythm)
        # level/trend state: x = (level, trend per step), P = [[p00, p01], [p01, p11]]
        self._l = self._b = 0.0
        self._p00, self._p01, self._p11 = 1e6, 0.0, 0.0
        self._t: float | None = None  # time of the state (the last observation learnt)
        self._n = 0  # observations learnt since the start or the last restart
        self.model_var = 0.0
        # profile: offsets per slot (None until one day completed); cells per (day, slot)
        self._profile: array[float] | None = None
        self._w = array("d")  # cell weights, a row of slots per day seen
        self._zw = array("d")  # weighted sums of z, the same cells
        self._row_day = array("q")  # which day each row holds
        self._row = 0  # the row of the newest observation's day
        self._day: int | None = None  # the day of the newest observation
        self._refreshed: float | None = None  # when the profile was last refreshed
        # hold
        self._held_since: float | None = None
        self._held_q: float | None = None  # the trend's pace when the hold began
        self.relearned: Relearned | None = None
        self.late = 0
        # river protocol: the open bucket, values divided by the first one's magnitude
        self._open: int | None = None
        self._mean = 0.0
        self._count = 0
        self._scale: float | None = None

    def clone(self) -> ReferenceBaseline:
        return ReferenceBaseline(
            step_s=self.step_s,
            season_s=self.season_s,
            slot_s=self.slot_s,
            days=self.days,
            level_noise=self.level_noise,
            trend_noise=self.trend_noise,
            damping=self.damping,
            min_coverage=self.min_coverage,
            warmup=self.warmup,
            hold_max_s=self.hold_max_s,
            outlier_z=self.outlier_z,
            unprofiled_hold_s=self.unprofiled_hold_s,
        )

    # -- what callers read --------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """Whether forecasts are available (``warmup`` observations learnt)."""
        return self._n >= self.warmup

    @property
    def has_profile(self) -> bool:
        """Whether a daily profile has been learnt (one day has completed)."""
        return self._profile is not None

    @property
    def holding(self) -> bool:
        return self._held_since is not None

    def held_s(self, t: float) -> float:
        """How long the baseline has been held at ``t`` (0 when it is learning)."""
        return 0.0 if self._held_since is None else max(0.0, t - self._held_since)

    def forecast(self, t: float) -> Forecast | None:
        """Expected ``z`` at ``t`` (>= the last observation) and its variance; None while
        warming up. While held, the level, trend and variance stay those of the hold's
        start (the pre-fault baseline); only the profile moves with ``t``."""
        if not self.ready or self._t is None:
            return None
        horizon = t if self._held_since is None else min(t, self._held_since)
        steps = max(0.0, (horizon - self._t) / self.step_s)
        decay = self.damping**steps
        reach = steps if self.damping == 1.0 else (1 - decay) / (1 - self.damping)
        level = self._l + self._b * reach
        var = (
            self._p00
            + 2 * reach * self._p01
            + reach * reach * self._p11
            + steps * self.level_noise**2
        )
        return Forecast(level + self.profile_at(t), var + self._held_var(t), self.model_var)

    def _trend_q(self) -> float:
        """How far the trend may wander per step: once a profile carries the daily rhythm
        the trend only follows slow drift."""
        return self.trend_noise * (PROFILED_TREND if self._profile is not None else 1.0)

    def _held_var(self, t: float) -> float:
        """How uncertain a held forecast has become by ``t``: the level it froze may since
        have moved by the level and trend noise of the steps held (a trend that wanders by
        ``q`` a step moves the level by ``q**2 * k**3 / 3`` in ``k`` steps). Without a
        profile the trend carries the daily rhythm, so after hours a held level on the
        first day is a guess, and what departs from it slowly is not significant; a
        sudden step is (``k`` is small at its onset), and with a profile the trend
        wanders a tenth as fast, so a day's hold stays sharp. A hold that began without a
        profile keeps that pace (``_held_q``) when the profile arrives: the level it froze
        carried the rhythm, not the profile's offset from it."""
        if self._held_since is None or self._t is None:
            return 0.0
        k = max(0.0, (t - max(self._held_since, self._t)) / self.step_s)
        q = self._trend_q() if self._held_q is None else self._held_q
        return k * self.level_noise**2 + k * k * self._p11 + q * q * k**3 / 3

    def profile_at(self, t: float) -> float:
        """The profile's offset at ``t`` (0 without a profile), linear between slots."""
        p = self._profile
        if p is None:
            return 0.0
        pos = (t % self.season_s) / self.slot_s - 0.5
        lo = math.floor(pos)
        frac = pos - lo
        return p[lo % self.slots] * (1 - frac) + p[(lo + 1) % self.slots] * frac

    # -- what callers do ----------------------------------------------------------------

    def learn(self, t: float, z: float, var: float, steps: float = 1.0) -> None:
        """One observation ``z`` at ``t`` with sampling variance ``var`` (>= 0), covering
        ``steps`` steps (an average over more steps has less excess noise). Ignored
        while the baseline is held; counted in ``late`` if older than the state."""
        if not (math.isfinite(t) and math.isfinite(z) and math.isfinite(var) and var >= 0):
            raise ValueError(f"seasonal: need finite t, z and var >= 0, got {t!r} {z!r} {var!r}")
        steps = max(1.0, steps) if math.isfinite(steps) else 1.0
        if self._t is not None and t < self._t:
            self.late += 1
            return
        self._roll_day(t)
        if self._held_since is not None:
            return
        if self._n == 0 or self._t is None:
            self._restart(t, z - self.profile_at(t))
        else:
            self._update(t, z - self.profile_at(t), var, steps)
        w = 1.0 / (var + self.model_var / steps + 1e-6)
        cell = self._cell(t)
        self._w[cell] += w
        self._zw[cell] += w * z

    def hold(self, t: float, deviating: bool, observed: float | None = None) -> bool:
        """Tell the baseline whether the caller's evidence at ``t`` deviates significantly
        from :meth:`forecast`. While it does, nothing is learnt; once it has for
        ``hold_max_s``, the level restarts from ``observed`` (the caller's current ``z``)
        and :attr:`relearned` records it. Returns whether it accepted a new level now."""
        self._roll_day(t)  # time moves on while nothing is learnt: the profile still refreshes
        if not deviating:
            if self._held_since is not None and self._t is not None:
                # the hold is over: carry on from the forecast it held (the time it lasted
                # is not a gap: the level was watched, not lost)
                self._t += max(0.0, t - max(self._held_since, self._t))
            self._held_since = self._held_q = None
            return False
        if self._held_since is None:
            self._held_since, self._held_q = t, self._trend_q()
            return False
        held = t - self._held_since
        if held < self._longest_hold() or observed is None or not math.isfinite(observed):
            return False
        f = self.forecast(t)
        before = f.mean if f is not None else observed
        self._held_since = self._held_q = None
        self._restart(t, observed - self.profile_at(t))
        self._n = self.warmup  # the observed level is known: no warm-up again
        self.relearned = Relearned(t, held, before, observed)
        return True

    def _longest_hold(self) -> float:
        """How long a deviation is held before it is the new normal: ``hold_max_s``; without
        a profile, as long as the trend seen so far cannot have moved the level by more
        than ``HOLD_DRIFT`` at its average pace over the last hours (the rhythm the held
        level cannot follow), at least
        ``UNPROFILED_HOLD_S`` (or ``unprofiled_hold_s`` when given)."""
        if self.has_profile:
            return self.hold_max_s
        if self.unprofiled_hold_s is not None:
            return min(self.hold_max_s, self.unprofiled_hold_s)
        drift = self._drift / self.step_s  # per second, as seen over the last hours
        reach = HOLD_DRIFT / drift if drift > 0 else math.inf
        return min(self.hold_max_s, max(UNPROFILED_HOLD_S, reach))

    # -- river's protocol (univariate series) -------------------------------------------

    def learn_one(self, x: dict[str, Any]) -> None:
        t, v = _read(x)
        if self._scale is None:
            self._scale = abs(v) if abs(v) > 1e-9 else 1.0
        v /= self._scale
        bucket = math.floor(t / self.step_s)
        if self._open is not None and bucket < self._open:
            self.late += 1
            return
        if self._open is not None and bucket > self._open and math.isfinite(self._mean):
            self.learn((self._open + 0.5) * self.step_s, self._mean, 0.0)
        if self._open != bucket:
            self._open, self._mean, self._count = bucket, 0.0, 0
        self._count += 1
        self._mean += v / self._count - self._mean / self._count  # no overflow near the max

    def score_one(self, x: dict[str, Any]) -> float:
        t, v = _read(x)
        if self._scale is None:
            return 0.0
        v /= self._scale
        bucket = math.floor(t / self.step_s)
        if self._open is not None and bucket < self._open:
            return 0.0
        n = self._count + 1
        mean = self._mean + v / n - self._mean / n if bucket == self._open else v
        f = self.forecast((bucket + 0.5) * self.step_s)
        if f is None:
            return 0.0
        d = abs(mean - f.mean)
        if d == 0.0 or not math.isfinite(d):
            return 0.0 if d == 0.0 else 1.0
        sd = math.sqrt(f.total)
        if not sd > 0:
            return 1.0 if d > 1e-9 * max(1.0, abs(f.mean)) else 0.0
        return min(1.0, max(0.0, (d / sd - 3.0) / 3.0))

    # -- internals ----------------------------------------------------------------------

    def _restart(self, t: float, level: float) -> None:
        self._run = 0
        self._l, self._b = level, 0.0
        self._p00, self._p01, self._p11 = 1.0, 0.0, self.trend_noise**2 * 100
        self._t = t
        self._n = 1

    def _update(self, t: float, y: float, var: float, steps_seen: float) -> None:
        """Kalman predict to ``t`` then update with the deseasonalised ``y`` (an average
        over ``steps_seen`` steps)."""
        assert self._t is not None
        steps = max(0.0, (t - self._t) / self.step_s)
        decay = self.damping**steps
        reach = steps if self.damping == 1.0 else (1 - decay) / (1 - self.damping)
        # predict: x = F x, P = F P F' + Q * steps, F = [[1, reach], [0, decay]]
        level, trend = self._l + reach * self._b, decay * self._b
        p00 = self._p00 + 2 * reach * self._p01 + reach * reach * self._p11
        p01 = decay * (self._p01 + reach * self._p11)
        p11 = decay * decay * self._p11
        p00 += steps * self.level_noise**2
        p11 += steps * self._trend_q() ** 2
        # update with y (observes the level), noise var + model_var
        nu = y - level
        s = p00 + var + self.model_var / steps_seen
        # what the sampling noise and the state do not explain (clipped: one outlier must
        # not blow it up), per step; a slow average, so a burst of noise raises it gradually
        excess = (min(nu * nu, 9 * s) - p00 - var) * steps_seen if s > 0 else nu * nu
        self.model_var = max(0.0, self.model_var + 0.02 * (excess - self.model_var))
        if s > 0 and nu * nu > self.outlier_z**2 * s:
            side = 1 if nu > 0 else -1
            self._run = self._run + side if self._run * side > 0 else side
            if abs(self._run) < OUTLIER_RUN:
                self.outliers += 1  # a spike: not learnt (robust filtering)
                return
            p00 += nu * nu  # a step: OUTLIER_RUN in a row on one side: learn it after all
            s = p00 + var + self.model_var / steps_seen
        self._run = 0
        if s > 0:
            k0, k1 = p00 / s, p01 / s
            level += k0 * nu
            trend += k1 * nu
            p00, p01, p11 = (1 - k0) * p00, (1 - k0) * p01, p11 - k1 * p01
        if not all(map(math.isfinite, (level, trend, p00, p01, p11, self.model_var))):
            self.model_var = 0.0  # overflowed (values near the float range): start over
            self._restart(t, y)
            return
        self._l, self._b, self._p00, self._p01, self._p11 = level, trend, p00, p01, p11
        self._drift += DRIFT_ALPHA * (abs(trend) - self._drift)
        self._t = t
        self._n = min(self._n + 1, self.warmup)

    def _cell(self, t: float) -> int:
        """The cell of ``t``, in the current day's row (``t`` is in the current day)."""
        slot = math.floor((t % self.season_s) / self.slot_s) % self.slots
        return self._row * self.slots + slot

    def _roll_day(self, t: float) -> None:
        """Start the day of ``t`` if it is new (its row of cells starts empty); every
        ``season_s`` since the first observation, refresh the profile."""
        day = math.floor(t / self.season_s)
        if self._day != day:
            self._day = day
            self._row = self._start_row(day)
        if self._refreshed is None:
            self._refreshed = t
        elif t - self._refreshed >= self.season_s:
            self._refreshed = t
            self._refresh_profile(t)

    def _start_row(self, day: int) -> int:
        """The row holding ``day``: its own if it has one, else a new one while fewer than
        ``days`` are held, else the oldest day's, emptied (the rows hold the newest
        ``days`` days seen, all a profile can read)."""
        rows = self._row_day
        if day in rows:
            return rows.index(day)
        if len(rows) < self.days:
            rows.append(day)
            self._w.extend(array("d", [0.0]) * self.slots)
            self._zw.extend(array("d", [0.0]) * self.slots)
            return len(rows) - 1
        row = rows.index(min(rows))
        base = row * self.slots
        for i in range(base, base + self.slots):
            self._w[i] = self._zw[i] = 0.0
        rows[row] = day
        return row

    def _refresh_profile(self, t: float) -> None:
        curves = [c for k in range(self.days) if (c := self._curve(t - k * self.season_s))]
        if not curves:
            return
        n, m = self.slots, len(curves)
        if m >= 3:  # the median of m values is about pi/2 times as noisy as their mean
            new = [statistics.median(c[0][s] for c in curves) for s in range(n)]
            var = [math.pi / 2 * sum(c[1][s] for c in curves) / m**2 for s in range(n)]
        else:
            new = [statistics.fmean(c[0][s] for c in curves) for s in range(n)]
            var = [sum(c[1][s] for c in curves) / m**2 for s in range(n)]
        # smoothed over neighbouring slots: one odd slot is not a rhythm
        smooth = [0.25 * new[i - 1] + 0.5 * new[i] + 0.25 * new[(i + 1) % n] for i in range(n)]
        svar = [0.0625 * var[i - 1] + 0.25 * var[i] + 0.0625 * var[(i + 1) % n] for i in range(n)]
        mean = statistics.fmean(smooth)
        # what the slots' spread holds beyond their sampling noise is the rhythm: each slot
        # is shrunk towards 0 by how much of it is noise (a flat series learnt from a few
        # requests a minute gets no profile, a 20x rhythm all of it)
        rhythm = max(0.0, statistics.pvariance(smooth) - statistics.fmean(svar))
        profile = array(
            "d",
            (
                (v - mean) * (rhythm / (rhythm + w) if rhythm + w > 0 else 0.0)
                for v, w in zip(smooth, svar, strict=True)
            ),
        )
        # keep the forecast continuous: the level absorbs the change of profile at t; the
        # trend so far followed the rhythm the profile now carries, so it starts over
        old_here = self.profile_at(t)
        self._profile = profile
        self._l += old_here - self.profile_at(t)
        self._b, self._p01 = 0.0, 0.0
        self._p11 = min(self._p11, (self.trend_noise * PROFILED_TREND) ** 2 * 100)

    def _curve(self, end: float) -> tuple[list[float], list[float]] | None:
        """The offsets of the ``season_s`` ending at ``end`` (each slot's latest complete
        cell before it, minus their mean) and their sampling variances, or None if too few
        of its slots were seen."""
        raw = [math.nan] * self.slots
        var = [math.nan] * self.slots
        known = []
        newest = self._day if self._day is not None else -math.inf
        for s in range(self.slots):
            day = math.floor((end - (s + 1) * self.slot_s) / self.season_s)
            if day <= newest - self.days or day not in self._row_day:
                continue  # a day over ``days`` old is not read, if its row is still held
            i = self._row_day.index(day) * self.slots + s
            if self._w[i] > 0:
                raw[s], var[s] = self._zw[i] / self._w[i], 1.0 / self._w[i]
                known.append(s)
        if len(known) < self.min_coverage * self.slots:
            return None
        for a, b in zip(known, [*known[1:], known[0] + self.slots], strict=True):
            for j in range(a + 1, b):  # circular linear interpolation over unseen slots
                frac = (j - a) / (b - a)
                raw[j % self.slots] = raw[a] + (raw[b % self.slots] - raw[a]) * frac
                var[j % self.slots] = 2 * max(var[a], var[b % self.slots])
        mean = statistics.fmean(raw)
        return [v - mean for v in raw], var


def _read(x: dict[str, Any]) -> tuple[float, float]:
    t, v = float(x["t"]), float(x["value"])
    if not (math.isfinite(t) and math.isfinite(v)):
        raise ValueError(f"seasonal needs finite t and value, got t={t!r} value={v!r}")
    return t, v
