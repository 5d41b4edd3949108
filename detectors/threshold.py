"""Static bounds: a value above ``upper`` or below ``lower`` is anomalous, by how much it is.

Score mapping: 0 for a value inside ``[lower, upper]`` (bounds included). Outside, with
the relative excess ``r = distance to the nearest bound / scale``, the score is
``0.5 + 0.5 * r / (1 + r)``: just over 0.5 at the bound, 0.75 one ``scale`` beyond it,
approaching 1 far out. So ``score > 0.5`` means "outside the bounds", and larger breaches
score strictly higher. ``scale`` defaults to the band width ``upper - lower`` when both
bounds are given, else to ``|bound|``, else 1.

Either bound may be omitted (``None``: unbounded on that side). When both are omitted the
bounds are learned once from the first ``learn_count`` values (default 100) as
``[min - tol, max + tol]`` with ``tol = tolerance * max(max - min, |min|, |max|)``
(``tolerance`` default 0.1) and stay fixed afterwards; until then the score is 0. With
explicit bounds nothing needs learning and scoring starts at once.

Input: ``x["value"]`` and ``x["t"]`` must be present and finite.

>>> det = ThresholdDetector(upper=90.0, lower=10.0)
>>> det.score_one({"value": 50.0, "t": 0.0})
0.0
>>> det.score_one({"value": 170.0, "t": 0.0})  # one band width (80) above upper
0.75
>>> learned = ThresholdDetector(learn_count=3)
>>> for v in (10.0, 11.0, 12.0):
...     learned.learn_one({"value": v, "t": 0.0})
>>> learned.bounds  # 12 * 0.1 = 1.2 of tolerance on each side
(8.8, 13.2)
"""

from __future__ import annotations

import math
from typing import Any

from ragwatch.detectors.base import register
from ragwatch.detectors.mad import read_sample


def _check_bound(name: str, v: float | None) -> float | None:
    if v is None:
        return None
    v = float(v)
    if math.isnan(v):
        raise ValueError(f"{name} must be a number or None, got {v!r}")
    return v


@register("threshold")
class ThresholdDetector:
    """Static upper/lower bounds with a graded score outside them (see module docstring)."""

    def __init__(
        self,
        upper: float | None = None,
        lower: float | None = None,
        scale: float | None = None,
        learn_count: int = 100,
        tolerance: float = 0.1,
    ) -> None:
        up, lo = _check_bound("upper", upper), _check_bound("lower", lower)
        if up is not None and lo is not None and lo > up:
            raise ValueError(f"lower ({lo!r}) must be <= upper ({up!r})")
        if scale is not None and not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"scale must be finite and > 0, got {scale!r}")
        if not (isinstance(learn_count, int) and learn_count >= 1):
            raise ValueError(f"learn_count must be an int >= 1, got {learn_count!r}")
        if not (math.isfinite(tolerance) and tolerance >= 0):
            raise ValueError(f"tolerance must be finite and >= 0, got {tolerance!r}")
        self.upper, self.lower, self.scale = up, lo, scale
        self.learn_count, self.tolerance = learn_count, float(tolerance)
        self._learning = up is None and lo is None
        self._seen = 0
        self._min, self._max = math.inf, -math.inf
        self._bounds: tuple[float, float] | None = None
        self._scale = 1.0
        if not self._learning:
            self._set_bounds(-math.inf if lo is None else lo, math.inf if up is None else up, scale)

    def clone(self) -> ThresholdDetector:
        return ThresholdDetector(
            self.upper, self.lower, self.scale, self.learn_count, self.tolerance
        )

    @property
    def bounds(self) -> tuple[float, float] | None:
        """``(lower, upper)`` in use (+-inf for an open side); None while still learning."""
        return self._bounds

    def _set_bounds(self, lo: float, up: float, scale: float | None) -> None:
        self._bounds = (lo, up)
        if scale is None:
            width = up - lo
            if math.isfinite(width) and width > 0:
                scale = width
            else:
                finite = [abs(b) for b in (lo, up) if math.isfinite(b) and b != 0]
                scale = max(finite) if finite else 1.0
        self._scale = scale

    def learn_one(self, x: dict[str, Any]) -> None:
        v = read_sample(x)
        if not self._learning or self._seen >= self.learn_count:
            return
        self._seen += 1
        self._min, self._max = min(self._min, v), max(self._max, v)
        if self._seen == self.learn_count:
            lo, hi = self._min, self._max
            tol = self.tolerance * max(hi - lo, abs(lo), abs(hi))
            self._set_bounds(lo - tol, hi + tol, self.scale)

    def score_one(self, x: dict[str, Any]) -> float:
        if self._bounds is None:
            return 0.0
        v = float(x["value"])
        lo, up = self._bounds
        if not (v > up or v < lo):  # inside, or NaN
            return 0.0
        excess = v - up if v > up else lo - v
        r = excess / self._scale
        if not math.isfinite(r):
            return 1.0
        return 0.5 + 0.5 * r / (1.0 + r)
