"""Seasonal-baseline detector: additive Holt-Winters on fixed event-time buckets.

Samples are averaged into fixed event-time buckets (``bucket_s``, default 300 s); a bucket
closes when a sample of a later bucket arrives, and its mean is one observation of an
additive Holt-Winters model (level, trend and one seasonal offset per bucket of the
season, ``season_s`` / ``bucket_s`` of them: 288 for a day of 5-minute buckets).
``score_one(x)`` compares the mean of the bucket ``x`` falls in, *including* ``x`` (so
the first sample of a bucket is judged alone, later ones as a running mean), with the
forecast for that bucket:

    d = (actual - forecast) / max(|forecast|, floor)
    score = min(1, |d| / scale)        # scale 0.5: 25 % off the forecast -> 0.5

counting only drops (``direction="down"``, e.g. throughput) or only rises (``"up"``) if
asked. :meth:`HoltWinters.report` gives ``(actual, forecast, relative)`` for the open
bucket, so an alert can say "36 % below the expected 512 tokens/request".

Own implementation, not river's ``time_series.HoltWinters``: river's model is indexed by
sample count, not event time (a gap would shift the season), initialises additive
seasons with ratios ``y / level``, and cannot forecast for a hypothetical next sample
without being mutated, which ``score_one`` must not do.

Robust updates. The one-step error a bucket teaches the model is clipped to
``+-clip`` of its forecast (default 5 %, a fifth of the 25 % alert level; robust
Holt-Winters after Gelper, Fried & Croux, 2010), so a sustained anomaly such as a 36 %
throughput drop keeps scoring for its duration instead of being learned within two
buckets, and a permanent step change is absorbed over tens of minutes. Keep ``clip``
above the series' usual bucket-to-bucket noise; ``clip=math.inf`` is plain Holt-Winters.

Holding the baseline. Clipping alone still absorbs a fault that lasts: a 30 % drop is
learned within a quarter of an hour and its alert resolves while the fault goes on. So a
bucket that deviates by more than ``hold`` (default 0.2, relative to its forecast, either
way) teaches the model nothing: the forecast stays where it was before the fault, the
deviation keeps scoring, and the alert resolves when the series comes back, not when the
model has got used to it. A deviation that lasts ``hold_max_s`` (default 6 h) of event
time is a new normal (a new model, a new client): the level restarts from it, the daily
profile is kept. ``hold=math.inf`` disables holding.

Warm-up and the first season. No score (0.0) until ``warmup_buckets`` buckets with data
have closed. During the first season the seasonal offsets are not known yet: the raw
bucket means are collected in the seasonal array and the forecast is level + trend only
(Holt's linear method); once a full season has passed, each offset becomes that bucket's
mean minus the season's mean (slots that saw no data are interpolated between their
neighbours). By default the detector already scores against the level + trend forecast
during the first season, so a fresh detector is not blind for a day (and the contract
checks' six-hour stream gets a score); ``warmup_seasons=1.0`` keeps it silent until a
full season plus ``warmup_buckets`` buckets of data have been seen.

Gaps. Empty buckets are not learned from: level, trend and offsets stay as they were
and the first bucket after the gap gets the one-step forecast ``level + trend +
offset`` (the trend is not extrapolated across hours nobody saw). A gap longer than
``max_gap_s`` restarts level and trend (and, inside the first season, the collection);
the seasonal offsets, a time-of-day profile, are kept, and ``warmup_buckets`` applies
again. A constant series is forecast exactly (the updates are written so that constant
inputs give exact zeros), so it always scores 0. Samples older than the open bucket are
counted in ``late`` and dropped. Memory is bounded: the seasonal array plus a few floats.

Parameters: ``bucket_s`` (300), ``season_s`` (86400, a multiple of ``bucket_s``),
``alpha`` (0.3), ``beta`` (0.1), ``gamma`` (0.1), ``scale`` (0.5), ``floor`` (1.0, in the
series' units: protects near-zero forecasts; lower it for ratios in [0, 1]),
``direction`` ("both" | "down" | "up"), ``warmup_buckets`` (12), ``warmup_seasons``
(0.0), ``max_gap_s`` (21600), ``clip`` (0.05), ``hold`` (0.2), ``hold_max_s`` (21600).

>>> det = HoltWinters(season_s=3600, bucket_s=300, direction="down")   # hourly season
>>> T0 = 1_700_000_000.0 - 1_700_000_000.0 % 3600
>>> for i in range(3 * 60):                  # three hours, one sample a minute
...     det.learn_one({"value": 500.0 + (50.0 if i % 60 < 30 else 0.0), "t": T0 + 60 * i})
>>> det.forecast_for(T0 + 3 * 3600 + 60)     # the high half of the hour is next
550.0
>>> det.score_one({"value": 352.0, "t": T0 + 3 * 3600 + 60})   # -36 %
0.72
>>> det.score_one({"value": 700.0, "t": T0 + 3 * 3600 + 60})   # a rise, not a drop
0.0
>>> det.learn_one({"value": 352.0, "t": T0 + 3 * 3600 + 60})
>>> det.report()
Deviation(actual=352.0, forecast=550.0, relative=-0.36)
"""

from __future__ import annotations

import copy
import itertools
import math
from array import array
from typing import Any, NamedTuple

from ragwatch.detectors.base import register

DIRECTIONS = ("both", "down", "up")


class Deviation(NamedTuple):
    """The open bucket's mean against its forecast; ``relative`` is the signed deviation."""

    actual: float
    forecast: float
    relative: float


@register("holt_winters")
class HoltWinters:
    """Additive Holt-Winters baseline on event-time buckets (see module docstring)."""

    def __init__(
        self,
        bucket_s: float = 300.0,
        season_s: float = 86400.0,
        alpha: float = 0.3,
        beta: float = 0.1,
        gamma: float = 0.1,
        scale: float = 0.5,
        floor: float = 1.0,
        direction: str = "both",
        warmup_buckets: int = 12,
        warmup_seasons: float = 0.0,
        max_gap_s: float = 21600.0,
        clip: float = 0.05,
        hold: float = 0.2,
        hold_max_s: float = 21600.0,
    ) -> None:
        for name, v in (("bucket_s", bucket_s), ("scale", scale), ("floor", floor)):
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be finite and > 0, got {v!r}")
        if not clip > 0:  # math.inf: plain, non-robust Holt-Winters
            raise ValueError(f"clip must be > 0, got {clip!r}")
        if not hold > 0:  # math.inf: never hold
            raise ValueError(f"hold must be > 0, got {hold!r}")
        if not (math.isfinite(hold_max_s) and hold_max_s >= 0):
            raise ValueError(f"hold_max_s must be finite and >= 0, got {hold_max_s!r}")
        if not (0 < alpha <= 1 and 0 <= beta <= 1 and 0 <= gamma <= 1):
            raise ValueError(f"need 0 < alpha <= 1 and beta, gamma in [0, 1]: {alpha, beta, gamma}")
        m = season_s / bucket_s if math.isfinite(season_s) else math.nan
        if not (m >= 2 and abs(m - round(m)) < 1e-9):
            raise ValueError(f"season_s must be a multiple (>= 2) of bucket_s, got {season_s!r}")
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
        if int(warmup_buckets) != warmup_buckets or warmup_buckets < 1:
            raise ValueError(f"warmup_buckets must be an integer >= 1, got {warmup_buckets!r}")
        if not (math.isfinite(warmup_seasons) and warmup_seasons >= 0):
            raise ValueError(f"warmup_seasons must be finite and >= 0, got {warmup_seasons!r}")
        if not (math.isfinite(max_gap_s) and max_gap_s >= bucket_s):
            raise ValueError(f"max_gap_s must be finite and >= bucket_s, got {max_gap_s!r}")
        self.bucket_s = float(bucket_s)
        self.season_s = float(season_s)
        self.alpha, self.beta, self.gamma = float(alpha), float(beta), float(gamma)
        self.scale = float(scale)
        self.floor = float(floor)
        self.direction = direction
        self.warmup_buckets = int(warmup_buckets)
        self.warmup_seasons = float(warmup_seasons)
        self.max_gap_s = float(max_gap_s)
        self.clip = float(clip)
        self.hold = float(hold)
        self.hold_max_s = float(hold_max_s)
        self.m = round(m)
        self._max_gap = math.floor(self.max_gap_s / self.bucket_s)  # empty buckets tolerated
        # Buckets of data before the first score: a few, or seasons plus a few.
        self._min_seen = math.ceil(self.warmup_seasons * self.m) + self.warmup_buckets
        # Seasonal array: raw bucket means while collecting, offsets once ready; NaN = unknown.
        self._season = array("d", [math.nan]) * self.m
        self._ready = False  # offsets known (a full season has passed)
        self._first: int | None = None  # first bucket of the season being collected
        self._level = 0.0
        self._trend = 0.0
        self._last: int | None = None  # last closed bucket with data
        self._run = 0  # buckets learned since the start or the last restart
        self._seen = 0  # buckets learned since the collection began (capped)
        self._open: int | None = None
        self._mean = 0.0
        self._n = 0
        self._held_since: int | None = None  # first bucket of the deviation being held
        self.late = 0
        self.held = 0  # buckets not learned because they deviated by more than ``hold``

    def clone(self) -> HoltWinters:
        return HoltWinters(
            self.bucket_s,
            self.season_s,
            self.alpha,
            self.beta,
            self.gamma,
            self.scale,
            self.floor,
            self.direction,
            self.warmup_buckets,
            self.warmup_seasons,
            self.max_gap_s,
            self.clip,
            self.hold,
            self.hold_max_s,
        )

    # -- the protocol -------------------------------------------------------------------

    def learn_one(self, x: dict[str, Any]) -> None:
        t, v = _read(x)
        bucket = math.floor(t / self.bucket_s)
        if self._open is not None and bucket < self._open:
            self.late += 1  # its bucket is already closed
            return
        if self._open is not None and bucket > self._open:
            self._close()
        if self._open != bucket:
            self._open, self._mean, self._n = bucket, 0.0, 0
        self._n += 1
        self._mean += (v - self._mean) / self._n  # exact for constant input

    def score_one(self, x: dict[str, Any]) -> float:
        dev = self.deviation(x)
        if dev is None:
            return 0.0
        d = dev.relative
        if self.direction == "down":
            d = -d
        elif self.direction == "both":
            d = abs(d)
        if math.isnan(d) or d <= 0:
            return 0.0
        return min(1.0, d / self.scale)

    # -- explanations -------------------------------------------------------------------

    def deviation(self, x: dict[str, Any]) -> Deviation | None:
        """What ``score_one(x)`` judges: the bucket's mean including ``x`` against its
        forecast. None while warming up and for late samples. Changes nothing."""
        t, v = _read(x)
        bucket = math.floor(t / self.bucket_s)
        if self._open is not None and bucket < self._open:
            return None
        actual = self._mean + (v - self._mean) / (self._n + 1) if bucket == self._open else v
        return self._model_for(bucket)._deviation(bucket, actual)

    def report(self) -> Deviation | None:
        """The open bucket (everything learned so far) against its forecast; None while
        warming up. After ``score_then_learn(det, x)`` this is what ``x`` was scored on."""
        if self._open is None:
            return None
        return self._deviation(self._open, self._mean)

    @property
    def holding(self) -> bool:
        """Whether the baseline is held: the last closed bucket deviated by more than
        ``hold`` and was not learned."""
        return self._held_since is not None

    @property
    def last_deviation(self) -> float | None:
        """The signed relative deviation of :meth:`report`, or None."""
        rep = self.report()
        return None if rep is None else rep.relative

    def forecast_for(self, t: float) -> float | None:
        """The forecast for the bucket of ``t``, from everything learned so far (the open
        bucket counts as closed when ``t`` is later). None for buckets before the open
        one, before any data, and after a gap that would restart the model."""
        bucket = math.floor(float(t) / self.bucket_s)
        if self._open is None or bucket < self._open:
            return None
        return self._model_for(bucket)._forecast(bucket)

    # -- internals ----------------------------------------------------------------------

    def _model_for(self, bucket: int) -> HoltWinters:
        """Self, or a copy with the open bucket closed if ``bucket`` is a later one."""
        if self._open is None or bucket == self._open:
            return self
        model = copy.copy(self)
        model._season = array("d", self._season)
        model._close()
        return model

    def _forecast(self, bucket: int) -> float | None:
        """One-step forecast for ``bucket`` (> last closed): level + trend + its offset."""
        if self._last is None or bucket <= self._last or bucket - self._last - 1 > self._max_gap:
            return None
        s = self._season[bucket % self.m] if self._ready else 0.0
        return self._level + self._trend + s

    def _deviation(self, bucket: int, actual: float) -> Deviation | None:
        if self._run < self.warmup_buckets or self._seen < self._min_seen:
            return None
        forecast = self._forecast(bucket)
        if forecast is None:
            return None
        return Deviation(actual, forecast, (actual - forecast) / max(abs(forecast), self.floor))

    def _close(self) -> None:
        """Learn the open bucket's mean."""
        assert self._open is not None
        bucket, y = self._open, self._mean
        self._open, self._mean, self._n = None, 0.0, 0
        slot = bucket % self.m
        if self._last is None or bucket - self._last - 1 > self._max_gap:
            self._restart(bucket, y)
            return
        # One Holt-Winters step; empty buckets in between were skipped (nothing learned).
        # The error is clipped to +-clip of the forecast (robust Holt-Winters, as in
        # Gelper, Fried & Croux 2010), so a sustained anomaly is not learned in minutes.
        prior = self._level + self._trend
        s = self._season[slot] if self._ready else 0.0
        scale = max(abs(prior + s), self.floor)
        if self._run >= self.warmup_buckets and abs(y - prior - s) > self.hold * scale:
            # An anomaly: keep the baseline as it was, unless it has lasted hold_max_s.
            if self._held_since is None:
                self._held_since = bucket
            if (bucket - self._held_since + 1) * self.bucket_s <= self.hold_max_s:
                self.held += 1
                self._last = bucket
                return
            self._held_since = None  # a new normal: restart the level, keep the profile
            self._level, self._trend = y - s, 0.0
            if not self._ready:
                self._season[slot] = y
            self._last = bucket
            return
        self._held_since = None
        bound = self.clip * scale
        err = min(bound, max(-bound, y - prior - s))
        level = prior + self.alpha * err
        trend = self._trend + self.beta * ((level - self._level) - self._trend)
        offset = s + self.gamma * err if self._ready else y  # raw, until the season is complete
        if not (math.isfinite(level) and math.isfinite(trend) and math.isfinite(offset)):
            # Values near the float range overflowed the model: start over from this bucket
            # rather than carry inf or NaN forever (which would silence the detector).
            self._season = array("d", [math.nan]) * self.m
            self._ready = False
            self._restart(bucket, y)
            return
        self._level, self._trend = level, trend
        self._season[slot] = offset
        self._last = bucket
        self._run = min(self._run + 1, self.warmup_buckets)
        self._seen = min(self._seen + 1, self._min_seen)
        if not self._ready and self._first is not None and bucket - self._first >= self.m - 1:
            self._seasons_from_raw()

    def _restart(self, bucket: int, y: float) -> None:
        """First bucket, or after a long gap: level from ``y``; a partial first season is
        collected again, complete seasonal offsets are kept."""
        self._level = y - (self._season[bucket % self.m] if self._ready else 0.0)
        self._trend = 0.0
        self._last = bucket
        self._run = 1
        if not self._ready:
            self._season = array("d", [math.nan]) * self.m
            self._season[bucket % self.m] = y
            self._first = bucket
            self._seen = 1

    def _seasons_from_raw(self) -> None:
        """End of the first season: offsets = bucket means - their mean; level = that mean.
        Slots that saw no data get the offset interpolated between their known neighbours."""
        raw = self._season
        known = [i for i, y in enumerate(raw) if not math.isnan(y)]  # never empty
        mean = 0.0
        for k, i in enumerate(known, 1):
            mean += (raw[i] - mean) / k  # exact for a constant season
        nxt = {a: b for a, b in itertools.pairwise([*known, known[0] + self.m])}
        for a, b in nxt.items():
            ya, yb = raw[a], raw[b % self.m]
            for j in range(a + 1, b):
                raw[j % self.m] = ya + (yb - ya) * (j - a) / (b - a)
        for i in range(self.m):
            raw[i] -= mean
        self._level, self._trend = mean, 0.0
        self._ready = True
        self._first = None


def _read(x: dict[str, Any]) -> tuple[float, float]:
    t, v = float(x["t"]), float(x["value"])
    if not (math.isfinite(t) and math.isfinite(v)):
        raise ValueError(f"holt_winters needs finite t and value, got t={t!r} value={v!r}")
    return t, v
