"""Seasonal baseline that knows how much evidence it has: a daily profile learnt from
previous days, a weekly profile trusted as far as the weeks seen support it, a local level
and trend, and a hold that keeps a fault out of it.

The algorithm lives in one place, the arrays of :class:`~.bank.SeasonalBank` (a
worker holds thousands of these); :class:`SeasonalBaseline` is a one-row view of a bank,
for a single series and river's protocol. The reference it is tested against (plain
Python, the weekly part aside) is ``tests/reference/seasonal.py``.

What it models. Observations ``z`` (for rates and means: the log of the value, so the
model is multiplicative and a 20x daily rhythm is an additive curve) arrive at irregular
event times, each with the variance of its own sampling noise (a count of 4 requests
says less than a count of 400). The expected value at time ``t`` is

    level(t) + trend(t) * elapsed + profile(time of day of t) + weekly(weekday, block of t)

- **profile**: one offset per ``slot_s`` of the day (48 half-hours by default), linear
  between slot centres. It is learnt from *previous days*: every observation adds, with
  its precision as weight, to its (day, slot) cell; a day after the first observation
  and every day after, each of the last ``days`` 24-hour spans (each slot's latest cell
  in it; at least ``min_coverage`` of the slots seen, the others interpolated) minus its
  mean gives one curve, and the profile is their median (a day with a fault, a deploy or
  an outage is outvoted; with one or two days, their mean), smoothed over neighbouring
  slots. Until a day has passed there is no profile and the model is level + trend.
- **weekly**: per weekday and 4-hour block, how far that block sits from a typical day,
  learnt from the first week on: when a day starts, every held day's blocks are compared
  with the median held day, and the day leaving the cells is folded into a table of
  past weeks (an exponentially weighted mean over 6 weeks; a week more than 3 sd from
  the earlier ones is clipped, so a quiet holiday barely moves it). The forecast adds
  the table's mean shrunk towards 0 by its evidence: a prior of sd ``weekly_sd`` (0.5:
  weekends at a quarter of weekday traffic are under 3 sd) against week-to-week
  differences of sd 0.1, re-estimated from the row's own weeks as they come, so one
  week seen is trusted at ~96 % and its uncertainty is ~0.1; an inconsistent row trusts
  it less. Where the forecast enters a block, the block's uncertainty is added to the
  level's (an unseen weekday: ``weekly_sd``; the next block of a day under way at most
  0.15, from the second day: a daily profile to drift from): tests against the
  forecast on a first weekend are honest, and the level
  follows a weekday it has never seen within minutes instead of holding it as a fault.
  ``weekly_sd=0`` turns the weekly profile off.
- **level and trend**: a local linear trend model (a two-state Kalman filter, time in
  ``step_s`` units, the trend damped by ``damping`` per step) over the observations minus
  the profile. A noisy observation moves it little, a precise one more, and one more than
  ``outlier_z`` standard deviations off is not learnt at all (a spike: robust filtering;
  counted in ``outliers``), unless it is the fifth in a row on the same side (a step:
  learnt, with the level's uncertainty widened to it); ``level_noise``
  and ``trend_noise`` say how fast the level and trend may wander per step (the weekly
  rhythm, slow growth and day-to-day differences live here; on the first day the trend
  also follows the daily rhythm, per minute rather than per step with the weekly profile
  on, afterwards the profile does and the trend may wander a tenth as fast). Each
  step's innovation also
  updates ``model_var``, the variance per step that the sampling noise does not explain
  (bursty traffic, a profile that is off): forecasts carry it (``Forecast.noise``), so
  tests against them account for it, averaged over the steps they cover.
- **hold**: the caller judges whether its current evidence deviates significantly
  (:meth:`hold`); while it does, nothing is learnt (neither level nor profile) and the
  forecast stays the pre-fault one: the level, trend and uncertainty of the hold's start,
  moved along the profile only. A
  deviation that lasts ``hold_max_s`` (default a day; before there is a profile to carry
  the held level along the daily rhythm, only as long as the trend seen so far cannot
  have moved it by 10 %, and at least 3 hours) is accepted
  as the new normal: the level restarts from the observed one, the profile is kept, and
  :attr:`relearned` says so, with the level before and after, so an alert that resolves
  because of it can say "new level accepted after 24 h: 159 vs 248 before" instead of
  "recovered". When a hold ends, the model carries on from the forecast it held.

Memory is bounded: ``days`` x ``slots`` cells of two floats, the profile and a few
floats, and the weekly table: 6 arrays of 7 x 6 (about 8 KB with the defaults).
Event time only; late observations (before the last one learnt) are counted and ignored.

It also speaks river's protocol (registered as ``seasonal``), for a univariate series
``x = {"value", "t"}``: values (divided by the first one's magnitude, so the noise
parameters are relative) are averaged into ``step_s`` buckets, each closed bucket is one
observation of unknown noise (all of it then goes to ``model_var``), and
``score_one`` maps the open bucket's standardised deviation ``|d| / sd`` to [0, 1]
(``(|d| / sd - 3) / 3``, clipped: 0 within three standard deviations, 1 at six).

>>> base = SeasonalBaseline(step_s=60.0)
>>> T0 = 1_767_225_600.0                       # midnight UTC
>>> for i in range(3 * 1440):                  # three days, one observation a minute
...     t = T0 + 60 * i
...     rhythm = 1.5 * math.sin(2 * math.pi * ((t - 9 * 3600) % 86400) / 86400)  # 20x
...     base.learn(t, math.log(100.0) + rhythm, 0.01)
>>> f = base.forecast(T0 + 3 * 86400 + 15 * 3600)   # day 4, 15:00: the peak
>>> round(math.exp(f.mean) / 100.0, 1), f.noise < 0.01   # exp(1.5) = 4.48
(4.4, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from ragwatch.detectors.base import register
from ragwatch.detectors.seasonal.bank import SeasonalBank
from ragwatch.detectors.seasonal.params import SeasonalParams


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


@register("seasonal")
class SeasonalBaseline:
    """One seasonal baseline: row 0 of its own :class:`~.bank.SeasonalBank` (see
    the module docstring), and river's protocol over it. Parameters are keyword
    arguments of :class:`~.params.SeasonalParams`, readable as attributes."""

    __slots__ = ("_bank", "_count", "_mean", "_open", "_scale")

    def __init__(self, **params: Any) -> None:
        self._bank = SeasonalBank(SeasonalParams(**params), capacity=1)
        # river protocol: the open bucket, values divided by the first one's magnitude
        self._open: int | None = None
        self._mean = 0.0
        self._count = 0
        self._scale: float | None = None

    @classmethod
    def of(cls, params: SeasonalParams) -> SeasonalBaseline:
        """A fresh baseline with ``params``."""
        base = cls.__new__(cls)
        base._bank = SeasonalBank(params, capacity=1)
        base._open, base._mean, base._count, base._scale = None, 0.0, 0, None
        return base

    def clone(self) -> SeasonalBaseline:
        return SeasonalBaseline.of(self.params)

    def __getattr__(self, name: str) -> Any:
        """The parameters (``step_s``, ``season_s``, ``slots``, ...) as attributes."""
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._bank.params, name)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SeasonalBaseline):
            return NotImplemented
        mine = (self._open, self._mean, self._count, self._scale)
        return mine == (other._open, other._mean, other._count, other._scale) and (
            self._bank == other._bank
        )

    __hash__ = None  # type: ignore[assignment]

    @property
    def params(self) -> SeasonalParams:
        return self._bank.params

    @property
    def bank(self) -> SeasonalBank:
        """The one-row bank holding the state."""
        return self._bank

    # -- what callers read --------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """Whether forecasts are available (``warmup`` observations learnt)."""
        return bool(self._bank.ready([0])[0])

    @property
    def has_profile(self) -> bool:
        """Whether a daily profile has been learnt (one day has completed)."""
        return bool(self._bank.has_profile([0])[0])

    @property
    def holding(self) -> bool:
        return bool(self._bank.holding([0])[0])

    @property
    def late(self) -> int:
        """Observations older than the state, ignored."""
        return int(self._bank.late[0])

    @property
    def outliers(self) -> int:
        """Observations too far from the forecast to be learnt."""
        return int(self._bank.outliers[0])

    @property
    def model_var(self) -> float:
        return float(self._bank.model_var[0])

    @property
    def relearned(self) -> Relearned | None:
        """The last level accepted after a hold, or None."""
        at, held, before, after = (float(a[0]) for a in self._bank.relearned([0]))
        return None if math.isnan(at) else Relearned(at, held, before, after)

    def held_s(self, t: float) -> float:
        """How long the baseline has been held at ``t`` (0 when it is learning)."""
        return float(self._bank.held_s([0], [t])[0])

    def forecast(self, t: float) -> Forecast | None:
        """Expected ``z`` at ``t`` (>= the last observation) and its variance; None while
        warming up. While held, the level, trend and variance stay those of the hold's
        start (the pre-fault baseline); only the profiles move with ``t``."""
        mean, var, noise = (float(a[0]) for a in self._bank.forecast([0], [t]))
        return None if math.isnan(mean) else Forecast(mean, var, noise)

    def profile_at(self, t: float) -> float:
        """The seasonal offset at ``t``: the daily profile's and the weekly's (0 without)."""
        return float(self._bank.profile_at([0], [t])[0])

    # -- what callers do ----------------------------------------------------------------

    def learn(self, t: float, z: float, var: float, steps: float = 1.0) -> None:
        """One observation ``z`` at ``t`` with sampling variance ``var`` (>= 0), covering
        ``steps`` steps (an average over more steps has less excess noise). Ignored
        while the baseline is held; counted in ``late`` if older than the state."""
        if not (math.isfinite(t) and math.isfinite(z) and math.isfinite(var) and var >= 0):
            raise ValueError(f"seasonal: need finite t, z and var >= 0, got {t!r} {z!r} {var!r}")
        self._bank.learn([0], [t], [z], [var], [steps])

    def hold(self, t: float, deviating: bool, observed: float | None = None) -> bool:
        """Tell the baseline whether the caller's evidence at ``t`` deviates significantly
        from :meth:`forecast`. While it does, nothing is learnt; once it has for
        ``hold_max_s``, the level restarts from ``observed`` (the caller's current ``z``)
        and :attr:`relearned` records it. Returns whether it accepted a new level now."""
        obs = math.nan if observed is None else observed
        return bool(self._bank.hold([0], [t], [deviating], [obs])[0])

    # -- river's protocol (univariate series) -------------------------------------------

    def learn_one(self, x: dict[str, Any]) -> None:
        t, v = _read(x)
        if self._scale is None:
            self._scale = abs(v) if abs(v) > 1e-9 else 1.0
        v /= self._scale
        step_s = self._bank.step_s
        bucket = math.floor(t / step_s)
        if self._open is not None and bucket < self._open:
            self._bank.late[0] += 1
            return
        if self._open is not None and bucket > self._open and math.isfinite(self._mean):
            self.learn((self._open + 0.5) * step_s, self._mean, 0.0)
        if self._open != bucket:
            self._open, self._mean, self._count = bucket, 0.0, 0
        self._count += 1
        self._mean += v / self._count - self._mean / self._count  # no overflow near the max

    def score_one(self, x: dict[str, Any]) -> float:
        t, v = _read(x)
        if self._scale is None:
            return 0.0
        v /= self._scale
        step_s = self._bank.step_s
        bucket = math.floor(t / step_s)
        if self._open is not None and bucket < self._open:
            return 0.0
        n = self._count + 1
        mean = self._mean + v / n - self._mean / n if bucket == self._open else v
        f = self.forecast((bucket + 0.5) * step_s)
        if f is None:
            return 0.0
        d = abs(mean - f.mean)
        if d == 0.0 or not math.isfinite(d):
            return 0.0 if d == 0.0 else 1.0
        sd = math.sqrt(f.total)
        if not sd > 0:
            return 1.0 if d > 1e-9 * max(1.0, abs(f.mean)) else 0.0
        return min(1.0, max(0.0, (d / sd - 3.0) / 3.0))

    # -- pickling (a copy of the one row) ------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        river = (self._open, self._mean, self._count, self._scale)
        return {"params": self.params.as_list(), "bank": self._bank.dump([0]), "river": river}

    def __setstate__(self, state: Any) -> None:
        """From :meth:`__getstate__`."""
        values: list[Any] = [None if math.isnan(v) else v for v in state["params"]]
        params = SeasonalParams(*values)
        params = replace(params, days=int(params.days), warmup=int(params.warmup))
        self._bank = SeasonalBank(params, capacity=1)
        self._bank.load([0], state["bank"])
        self._open, self._mean, self._count, self._scale = state["river"]


def _read(x: dict[str, Any]) -> tuple[float, float]:
    t, v = float(x["t"]), float(x["value"])
    if not (math.isfinite(t) and math.isfinite(v)):
        raise ValueError(f"seasonal needs finite t and value, got t={t!r} value={v!r}")
    return t, v
