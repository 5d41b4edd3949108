"""The generic detector for one series: a one-row view of :class:`~.bank.GenericBank` with
river's protocol (``learn_one`` / ``score_one`` / ``clone``), registered as ``generic``.
The algorithm, its parameters and their reasons are the bank's (``bank.py``,
``params.py``): a seasonal and a fast forecast, the surprise of the residual and of a
run of residuals and the novelty of the last values' shape, judged against the series'
own history, a score in [0, 1] (``score_one``: the onset, reported once in its quiet
period) and a band.
``x = {"value": float, "t": epoch seconds}``; keyword arguments are
:class:`~.params.GenericParams` fields.

>>> det = GenericDetector()
>>> for i in range(300):                         # 5 h of a quiet series, one a minute
...     det.learn_one({"value": 50.0 + (i * 7919 % 13) / 13, "t": 1_767_225_600.0 + 60 * i})
>>> det.score_one({"value": 50.5, "t": 1_767_243_600.0})
0.0
>>> round(det.score_one({"value": 80.0, "t": 1_767_243_600.0}), 2)
0.42
>>> yhat, lower, upper = det.forecast_one(1_767_243_600.0)
>>> bool(lower < 50.5 < upper)
True
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ragwatch.detectors.base import register
from ragwatch.detectors.generic.bank import GenericBank, Scored, _Step
from ragwatch.detectors.generic.params import GenericParams

_ROW = np.zeros(1, dtype=np.intp)


def _finite(x: dict[str, Any]) -> tuple[float, float]:
    t, v = float(x["t"]), float(x["value"])
    if not (math.isfinite(t) and math.isfinite(v)):
        raise ValueError(f"generic detector needs finite t and value, got t={t!r} value={v!r}")
    return t, v


@register("generic")
class GenericDetector:
    """One series' generic detector: row 0 of a one-row :class:`GenericBank`."""

    def __init__(self, **params: Any) -> None:
        self.bank = GenericBank(GenericParams(**params), capacity=1)
        self._scored: tuple[float, float, _Step] | None = None  # score_one's, for learn_one

    def __getstate__(self) -> dict[str, Any]:
        return {"bank": self.bank}  # the cache is not state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.bank, self._scored = state["bank"], None

    @property
    def params(self) -> GenericParams:
        return self.bank.params

    @property
    def late(self) -> int:
        """Observations not after the last learnt one: counted, not learnt."""
        return self.bank.late

    def clone(self) -> GenericDetector:
        return GenericDetector(**self.params.as_dict())

    def learn_one(self, x: dict[str, Any]) -> None:
        """Learn ``x`` (ValueError, with nothing learnt, for a non-finite value or time)."""
        t, v = _finite(x)
        cached, self._scored = self._scored, None
        if cached is not None and cached[0] == t and cached[1] == v:
            step = cached[2]  # the bank has not changed since score_one computed it
        else:
            step = self.bank._score(_ROW, np.array([t]), np.array([v]))
        self.bank._apply(_ROW, np.array([t]), np.array([v]), step)

    def predict_one(self, x: dict[str, Any]) -> Scored:
        """Score, expected value and band for ``x``, read-only (one-element arrays)."""
        return self.bank.score(_ROW, float(x["t"]), float(x["value"]))

    def score_one(self, x: dict[str, Any]) -> float:
        """The onset score :meth:`learn_one` would give ``x`` (0 for a non-finite one),
        read-only: whether it is news, what NAB asks (only the first detection in each
        anomaly window counts, later ones outside it are false positives); the bank's
        ``score`` (:meth:`predict_one`) also holds a lasting deviation, for the product's
        rules on sustained anomalies."""
        t, v = float(x["t"]), float(x["value"])
        step = self.bank._score(_ROW, np.array([t]), np.array([v]))
        self._scored = (t, v, step)
        return float(step.out.onset[0])

    def forecast_one(self, t: float) -> tuple[float, float, float]:
        """``(yhat, lower, upper)`` at ``t`` (NaN before the first observation)."""
        yhat, lower, upper = self.bank.forecast(_ROW, t)
        return float(yhat[0]), float(lower[0]), float(upper[0])
