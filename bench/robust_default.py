"""The NAB baseline issue 34 measures from: the generic detector ragwatch registered as
``default`` until issue 31.

It scored CSV series in ``ragwatch replay`` and nothing else: the worker never ran it, and
it is one Python object per series, not a bank. Issue 31 made the registry hold exactly
what the worker runs (``leak``, ``seasonal``, ``request_outliers``), so it left the
product for here, unchanged, as the baseline ``bench/quality.py --part nab`` scores beside
whatever replaces it (issue 34: a generic detector in array form that the worker runs on
every signal). Run by NAB's ``run_detector`` as ``bench.robust_default:DefaultDetector``.

**The detector.**
The general-purpose univariate detector: robust z-scores, judged against their own past.

Used for any series without a specific detector. For every value three robust
(median/MAD, see the robust window below) z-scores are computed:

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

**Its robust window.** The median of the last ``window`` values and their spread, and a
value's robust z-score against them (what the detector's components are made of).

The centre is the median of the window and the spread its MAD (median absolute deviation
from the median) scaled by 1.4826, so that it estimates the standard deviation of normal
noise while ignoring up to half of the window being outliers: ``z = (value - median) /
(1.4826 * MAD)``. Quantised series (CPU percentages, counters) often have MAD = 0 although
they are not constant; the spread then falls back to the 75th and the 90th percentile of
the absolute deviations (scaled to a normal standard deviation). A window in which every
value is the same has no spread: a value equal to it has z 0 (a flat signal is never
flagged) and any other value an infinite one. Memory: two lists of at most ``window``
floats; ``add`` costs O(log window) comparisons plus one list insertion.

>>> win = RobustWindow(100)
>>> for i in range(200):
...     win.add(10.0 + (i % 5) * 0.1)
>>> robust_z(10.2, win)
0.0
>>> round(robust_z(14.0, win), 1)
25.6
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from typing import Any

MAD_TO_SIGMA = 1.4826  # 1 / Phi^-1(3/4): MAD of normal noise -> its standard deviation
Q75_TO_SIGMA = 1 / 1.1503  # 75th percentile of |N(0, 1)|
Q90_TO_SIGMA = 1 / 1.6449  # 90th percentile of |N(0, 1)|


def read_sample(x: dict[str, Any]) -> float:
    """The finite ``x["value"]`` of a sample whose ``x["t"]`` is finite too, else ValueError."""
    v, t = float(x["value"]), float(x["t"])
    if not (math.isfinite(v) and math.isfinite(t)):
        raise ValueError(f"detector needs finite t and value, got t={t!r} value={v!r}")
    return v


class RobustWindow:
    """Median and robust spread of the last ``size`` values, kept sorted.

    ``add`` is O(log size) comparisons plus one list insertion and deletion (a memmove);
    the median and the spread are recomputed on every ``add`` (the k-th absolute deviation
    is a k-th smallest element of two sorted sequences, found by bisection), so reading
    them costs nothing and never changes the state.
    """

    __slots__ = ("_fifo", "_sorted", "median", "scale", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self._fifo: deque[float] = deque()
        self._sorted: list[float] = []
        self.median = 0.0
        self.scale = 0.0

    def __len__(self) -> int:
        return len(self._fifo)

    def __getstate__(self) -> tuple[int, list[float]]:
        return self.size, list(self._fifo)

    def __setstate__(self, state: tuple[int, list[float]]) -> None:
        size, values = state
        self.__init__(size)  # type: ignore[misc]
        for v in values:
            self.add(v)

    @property
    def values(self) -> deque[float]:
        """The window, oldest first (do not modify)."""
        return self._fifo

    def add(self, v: float) -> None:
        self._fifo.append(v)
        insort(self._sorted, v)
        if len(self._fifo) > self.size:
            old = self._fifo.popleft()
            del self._sorted[bisect_left(self._sorted, old)]
        self._update()

    def _update(self) -> None:
        s = self._sorted
        n = len(s)
        m = n // 2
        med = s[m] if n % 2 else _midpoint(s[m - 1], s[m])
        self.median = med
        if s[0] == s[-1]:
            self.scale = 0.0
            return
        mad = self._kth_dev((n + 1) // 2, m, med)
        if n % 2 == 0:
            mad = (mad + self._kth_dev(m + 1, m, med)) / 2
        scale = MAD_TO_SIGMA * mad
        if scale <= 0:
            scale = Q75_TO_SIGMA * self._kth_dev(max(1, math.ceil(0.75 * n)), m, med)
        if scale <= 0:
            scale = Q90_TO_SIGMA * self._kth_dev(max(1, math.ceil(0.9 * n)), m, med)
        if scale <= 0:  # more than 90 % of the window is one value: a tenth of the largest gap
            scale = max(med - s[0], s[-1] - med) / 10
        self.scale = scale

    def _kth_dev(self, k: int, m: int, med: float) -> float:
        """The k-th smallest (1-based) of ``|s[i] - med|``; ``s[:m] <= med <= s[m:]``."""
        s = self._sorted
        a_len, b_len = m, len(s) - m

        def a(i: int) -> float:  # deviations left of the median, ascending
            return med - s[m - 1 - i]

        def b(j: int) -> float:  # deviations right of the median, ascending
            return s[m + j] - med

        lo, hi = max(0, k - b_len), min(k, a_len)
        while True:  # take i from a and k - i from b
            i = (lo + hi) // 2
            j = k - i
            if i < a_len and j > 0 and b(j - 1) > a(i):
                lo = i + 1
            elif i > 0 and j < b_len and a(i - 1) > b(j):
                hi = i - 1
            else:
                left = a(i - 1) if i > 0 else -math.inf
                right = b(j - 1) if j > 0 else -math.inf
                return max(left, right)


def _midpoint(a: float, b: float) -> float:
    """``(a + b) / 2`` without overflowing to inf for huge ``a`` and ``b`` (exact for a == b)."""
    mid = (a + b) / 2
    return mid if math.isfinite(mid) else a / 2 + b / 2


def robust_z(value: float, window: RobustWindow) -> float:
    """``(value - median) / scale``; 0 for the median itself, +-inf off a constant window."""
    d = value - window.median
    if d == 0:
        return 0.0
    if window.scale > 0:
        z = d / window.scale
        if math.isfinite(z):
            return z
    return math.copysign(math.inf, d)


RAW_CAP = 1e6  # the raw anomaly of a value off a constant window (z = inf)


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
