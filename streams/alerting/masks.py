"""Rules over arrays: a rule's condition for many series at once (issue 17).

A pipeline that keeps its series in rows computes each signal as an array over the rows
it just updated; :func:`holds` is :meth:`~ragwatch.streams.alerting.rules.Rule.holds` of
all of them in one pass (NaN: the signal is not known, so the condition does not hold).
Only the rows where a rule holds or an alert is active need the alert engine: an inactive
alert whose condition does not hold cannot start.

>>> import numpy as np
>>> from ragwatch.streams.alerting.rules import parse_rule
>>> rule = parse_rule({"name": "Slow", "series": "service", "expr": "e2e_p95_ratio > 2"})
>>> holds(rule, {"e2e_p95_ratio": np.array([1.0, 2.5, np.nan])}, 3).tolist()
[False, True, False]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from ragwatch.streams.alerting.rules import OPS, Rule

F64 = npt.NDArray[np.float64]


def holds(rule: Rule, signals: Mapping[str, F64], n: int) -> npt.NDArray[np.bool_]:
    """:meth:`Rule.holds` of ``n`` rows at once (NaN: not known, never holds)."""
    out = np.ones(n, dtype=np.bool_)
    for i, c in enumerate(rule.conditions):
        if i and not out.any():  # no row left: the next signals are not computed at all
            return out
        v = signals.get(c.signal)
        if v is None:  # a signal this kind of series does not have
            return np.zeros(n, dtype=np.bool_)
        op: Any = OPS[c.op]  # the scalar operator, on arrays
        if c.op == "!=":  # the one comparison NaN passes
            out &= ~np.isnan(v) & op(v, c.threshold)
        else:  # NaN compares False, and silently
            out &= op(v, c.threshold)
    return out
