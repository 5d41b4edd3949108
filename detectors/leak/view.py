"""Memory-leak detector for one series: a one-row view of :class:`~.bank.LeakBank`,
with river's protocol (``learn_one`` / ``score_one`` / ``clone``), for ``ragwatch replay
--detector leak`` and the detector contract. The algorithm, its parameters and their
reasons are the bank's (``bank.py``): memory that grows and does not come back, judged
on a fast horizon (30 min, above the range the series held and left) and on its floor (the
low-water mark over 2 h). ``score_one`` is ``g / (g + scale_bytes)`` for the growth ``g``
over the window at the leak rate: 0 while warming up and without a leak.

>>> det = LeakDetector()
>>> for i in range(0, 5 * 3600, 10):          # flat for 2 h, then 1.2 GB/h, 10 s samples
...     leak = max(0, i - 7200) * 1.2e9 / 3600
...     det.learn_one({"value": 40e9 + leak, "t": 1_700_000_000.0 + i})
>>> round(det.estimate.leak_gb_per_hour, 2), round(det.estimate.floor_gb_per_hour, 2)
(1.2, 1.2)
>>> round(det.score_one({"value": 0.0, "t": 0.0}), 2)
0.71
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ragwatch.detectors.base import register
from ragwatch.detectors.leak.bank import (
    LeakBank,
    LeakEstimate,
    LeakParams,
)

_ROW = np.zeros(1, dtype=np.intp)


@register("leak")
class LeakDetector:
    """One series' leak detector: row 0 of a one-row :class:`LeakBank` (see the module)."""

    def __init__(self, **params: Any) -> None:
        self.bank = LeakBank(1, **params)

    @property
    def params(self) -> LeakParams:
        return self.bank.params

    def __getattr__(self, name: str) -> Any:
        # window_s, bucket_s, ...: the parameters, as the object detector had them
        if name != "bank" and name in LeakParams.__dataclass_fields__:
            return getattr(self.bank.params, name if name != "bucket_s" else "bucket")
        raise AttributeError(name)

    def __getstate__(self) -> dict[str, Any]:
        return {"params": self.params.as_dict(), "row": self.bank.dump(_ROW)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.bank = LeakBank(1, **state["params"])
        self.bank.load(_ROW, state["row"])

    def clone(self) -> LeakDetector:
        return LeakDetector(**self.params.as_dict())

    @property
    def late(self) -> int:
        """Samples older than the open bucket: counted, and ignored."""
        return int(self.bank.late[0])

    @property
    def estimate(self) -> LeakEstimate | None:
        """The series as of its last closed bucket; None while warming up."""
        return self.bank.estimate(0)

    def learn_one(self, x: dict[str, Any]) -> None:
        t, v = float(x["t"]), float(x["value"])
        if not (math.isfinite(t) and math.isfinite(v)):
            raise ValueError(f"leak detector needs finite t and value, got t={t!r} value={v!r}")
        self.learn(t, v)

    def learn(self, t: float, v: float) -> None:
        """:meth:`learn_one` for a finite time and value the caller has already checked."""
        self.bank.learn_distinct(_ROW, np.array([t]), np.array([v]))

    def score_one(self, x: dict[str, Any]) -> float:
        return float(self.bank.scores(_ROW)[0])
