"""A rolling robust window: the median of the last ``window`` values and their spread, and
a value's robust z-score against them (what :mod:`~.default`'s components are made of).

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
