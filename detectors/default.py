"""The general-purpose univariate detector: robust z-scores, judged against their own past.

Used for any series without a specific detector. For every value three robust
(median/MAD, see :mod:`ragwatch.detectors.robust`) z-scores are computed:

- **level**: the value against the median and spread of the last ``long_window`` values
  (spikes, dips, values outside the usual range);
- **change**: the step from the previous value against the last ``long_window`` steps
  (sudden jumps and drops, even inside the usual range);
- **shift**: the mean of the last ``short`` values (the new one included) against the
  long window (level shifts that build up over a few samples).

Each |z| is divided by its own scale (``level_z``, ``change_z``, ``shift_z``) and the
largest ratio is the raw anomaly ``m``. Raw anomalies are not comparable between series
(spiky traffic has heavy tails, a smooth temperature has none), so ``m`` is judged against
the largest raw anomaly of the same series over the last ``history`` values, ``M``:
``e = m / (floor + M)`` and the score is ``e / (e + 1)``. A value is news when it is more
extreme than anything seen lately; an anomaly that goes on raises ``M`` and so stops
scoring high (only its start is news), and a series that is always wild needs a wilder
value. ``floor`` keeps a quiet series (``M`` near 0) from flagging its usual noise.

Flat-signal safe: a value equal to the median of a constant window scores 0 (NAB's
``art_flatline``: a constant series is never anomalous). Warm-up: 0 until ``min_samples``
values were learned. Memory: two windows of ``long_window`` floats (each kept twice, FIFO
and sorted) plus at most ``history`` peaks. ``learn_one`` costs O(log long_window)
comparisons plus list insertions. Scores depend on the order of the values, not on their
time stamps, but ``x["t"]`` must be present and finite.

Parameters: ``long_window`` (800), ``short`` (6), ``history`` (400), ``level_z`` (6.0),
``change_z`` (8.0), ``shift_z`` (4.0), ``floor`` (1.0), ``min_samples`` (30). Tuned on the
NAB subset in ``../shared/nab`` (see ``bench/quality.py``); all are corpus-wide, nothing is
per file.

>>> import math
>>> det = DefaultDetector()
>>> for i in range(600):
...     det.learn_one({"value": 50 + 5 * math.sin(i / 10) + (i * 7919 % 13) / 13, "t": i})
>>> round(det.score_one({"value": 51.0, "t": 600.0}), 2)  # an ordinary value
0.25
>>> round(det.score_one({"value": 120.0, "t": 600.0}), 2)  # a spike
0.93
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from ragwatch.detectors.base import register
from ragwatch.detectors.robust import RobustWindow, read_sample, robust_z

RAW_CAP = 1e6  # the raw anomaly of a value off a constant window (z = inf)


@register("default")
class DefaultDetector:
    """Robust multi-component ensemble, normalised by its own recent history (module doc)."""

    def __init__(
        self,
        long_window: int = 800,
        short: int = 6,
        history: int = 400,
        level_z: float = 6.0,
        change_z: float = 8.0,
        shift_z: float = 4.0,
        floor: float = 1.0,
        min_samples: int = 30,
    ) -> None:
        for name, n, lo in (("long_window", long_window, 10), ("short", short, 1)):
            if not (isinstance(n, int) and n >= lo):
                raise ValueError(f"{name} must be an int >= {lo}, got {n!r}")
        if short > long_window:
            raise ValueError(f"short must be <= long_window, got {short!r} > {long_window!r}")
        if not (isinstance(history, int) and history >= 1):
            raise ValueError(f"history must be an int >= 1, got {history!r}")
        if not (isinstance(min_samples, int) and 2 <= min_samples <= long_window):
            raise ValueError(f"min_samples must be an int in [2, long_window], got {min_samples!r}")
        for name, v in (
            ("level_z", level_z),
            ("change_z", change_z),
            ("shift_z", shift_z),
            ("floor", floor),
        ):
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be finite and > 0, got {v!r}")
        self.long_window, self.short, self.history = long_window, short, history
        self.level_z, self.change_z, self.shift_z = float(level_z), float(change_z), float(shift_z)
        self.floor, self.min_samples = float(floor), min_samples
        self._level = RobustWindow(long_window)
        self._steps = RobustWindow(long_window)
        self._recent: deque[float] = deque(maxlen=short - 1)
        self._prev: float | None = None
        self._n = 0  # values learned
        # sliding maximum of the raw anomaly over the last `history` values: (index, raw),
        # raws strictly decreasing, so the front is the maximum
        self._peaks: deque[tuple[int, float]] = deque()

    def clone(self) -> DefaultDetector:
        return DefaultDetector(
            self.long_window,
            self.short,
            self.history,
            self.level_z,
            self.change_z,
            self.shift_z,
            self.floor,
            self.min_samples,
        )

    def _raw(self, v: float) -> float:
        """The largest component ratio for ``v`` given the current state, at most ``RAW_CAP``."""
        lvl = self._level
        m = abs(robust_z(v, lvl)) / self.level_z
        if self._prev is not None and len(self._steps) >= 2:
            m = max(m, abs(robust_z(v - self._prev, self._steps)) / self.change_z)
        if self.short > 1 and len(self._recent) == self.short - 1:
            # as an offset from v, so that a constant series gives exactly v (no rounding)
            mean = v + sum(r - v for r in self._recent) / self.short
            m = max(m, abs(robust_z(mean, lvl)) / self.shift_z)
        return min(m, RAW_CAP)

    def learn_one(self, x: dict[str, Any]) -> None:
        v = read_sample(x)
        if len(self._level) >= self.min_samples:
            raw = self._raw(v)
            peaks = self._peaks
            while peaks and peaks[-1][1] <= raw:
                peaks.pop()
            peaks.append((self._n, raw))
            if peaks[0][0] <= self._n - self.history:
                peaks.popleft()
        if self._prev is not None:
            self._steps.add(v - self._prev)
        self._level.add(v)
        if self._recent.maxlen:
            self._recent.append(v)
        self._prev = v
        self._n += 1

    def score_one(self, x: dict[str, Any]) -> float:
        if len(self._level) < self.min_samples:
            return 0.0
        v = float(x["value"])
        if not math.isfinite(v):
            return 0.0
        raw = self._raw(v)
        if raw == 0:
            return 0.0
        e = raw / (self.floor + (self._peaks[0][1] if self._peaks else 0.0))
        return e / (e + 1.0)
