"""Deviations that come back at the same hour every day: the service's rhythm, not a fault.

A serving baseline (:data:`~.service_rows.SERVING`: decode time per token, time to first
token, queue wait) holds while its value is well above it, and learns nothing meanwhile:
a fault must not teach the baseline its own level. A queue that builds at every daily
peak (a service at capacity for a few hours a day, a batch of clients that all start at
09:00), or a decode that slows at every peak as the engine batches more requests, is then
held each day and never learnt: the hold ends with the peak, long before the day it would
take to accept the level, and the rule pages every day (``bench/space.py`` seed 59:
QueueWaitHigh on days 2 and 3, a queue of ~1 s at every evening peak on a 50 ms floor).

Here each row remembers its last :data:`REMEMBERED` holds that lasted
:data:`RECUR_MIN_S` or more: when each began and the highest value over the baseline it
reached. A hold that began within :data:`RECUR_TOL_S` of a remembered one's start one
or two days later, and is no more than :data:`RECUR_MARGIN` times as high as that one
got, is the rhythm: ``<family>_recurring`` is 1, and the family's rule does not page.
The first time pages (nothing tells it from a fault); a fault during a recurring hold
pages once it is :data:`RECUR_MARGIN` times beyond yesterday's peak.

>>> from ragwatch.streams.pipelines.service_rows import ServiceRows
>>> st = ServiceRows(bucket_s=60.0, rate_max_s=600.0, tail=(200, 120.0, 3600.0),
...                  min_baseline=3, hold_max_s=86400.0)
>>> rows = np.array([st.add(("rag", "a"), at=0.0)])
>>> def close(t: float, held: float, ratio: float) -> float:
...     return float(recurring(st, rows, np.array([t]), np.array([held]),
...                            np.array([ratio]), "queue_p95")[0])
>>> day, hour = 86400.0, 3600.0
>>> [close(18 * hour + m * 60, m * 60, 8.0) for m in (1, 120)]  # the first evening
[0.0, 0.0]
>>> close(21 * hour, 0.0, 1.0)  # over: a hold of 2 h at 8x, remembered
0.0
>>> close(day + 18.5 * hour, 60.0, 9.0)  # the next evening, as high: the rhythm
1.0
>>> close(day + 18.6 * hour, 420.0, 30.0)  # far beyond it: a fault on top
0.0
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from ragwatch.streams.pipelines.service_rows import ServiceRows

F64 = npt.NDArray[np.float64]
Rows = npt.NDArray[np.intp]
DAY_S = 86400.0
RECUR_MIN_S = 3600.0  # a hold this long is remembered: not the flapping at a peak's edges
RECUR_TOL_S = 3600.0  # how far from a remembered hold's start, a day or two later
# how much higher than the remembered hold got it may go: a queue P95 of the newest 60
# requests swings 6-30x a 50 ms floor within one evening (seed 59), so a day's highest is
# a noisy mark; a fault on top of the rhythm pages once it triples it
RECUR_MARGIN = 3.0
REMEMBERED = 2  # holds remembered per row and family
DAYS_BACK = (1, 2)  # a rhythm missed one day (a quiet Sunday) is still one


def recurring(
    st: ServiceRows, rows: Rows, end: F64, held_s: F64, ratio: F64, family: str
) -> F64:  # fmt: skip
    """``<family>_recurring`` of ``rows`` closing at ``end``: 1 where the family's
    baseline has been holding for ``held_s`` (0: learning) since a time of day at which a
    remembered hold began a day or two before, and ``ratio`` (value over baseline) is
    within :data:`RECUR_MARGIN` of that hold's highest; else 0. Then the row remembers:
    the hold under way (its start, highest ratio and last close), and a hold that ended
    after :data:`RECUR_MIN_S` or more among its last :data:`REMEMBERED`."""
    col = st.col
    at, peak, last = (col[f"{family}_hold_{x}"] for x in ("at", "peak", "last"))
    out = np.zeros(len(rows))
    for i, (r, t, h, q) in enumerate(
        zip(rows.tolist(), end.tolist(), held_s.tolist(), ratio.tolist(), strict=True)
    ):
        began = t - h if h > 0 else math.nan
        if at[r] == at[r] and not abs(began - at[r]) <= 1.0:  # the hold it watched is over
            _remember(st, family, r)
        if began != began:
            continue
        if at[r] != at[r]:
            at[r], peak[r] = began, -math.inf
        peak[r] = max(peak[r], q) if q == q else peak[r]
        last[r] = t
        out[i] = float(_recurs(st, family, r, began, q))
    return out


def _recurs(st: ServiceRows, family: str, r: int, began: float, ratio: float) -> bool:
    for k in range(REMEMBERED):
        start, high = st.col[f"{family}_hold{k}_at"][r], st.col[f"{family}_hold{k}_peak"][r]
        if start != start or not ratio <= RECUR_MARGIN * high:
            continue
        if any(abs(began - (start + d * DAY_S)) <= RECUR_TOL_S for d in DAYS_BACK):
            return True
    return False


def _remember(st: ServiceRows, family: str, r: int) -> None:
    """The hold row ``r`` watched is over: among the remembered if it lasted long
    enough (the oldest forgotten), and the row watches none."""
    col = st.col
    at, peak, last = (col[f"{family}_hold_{x}"] for x in ("at", "peak", "last"))
    if last[r] - at[r] >= RECUR_MIN_S:
        for k in range(REMEMBERED - 1, 0, -1):
            for x in ("at", "peak"):
                col[f"{family}_hold{k}_{x}"][r] = col[f"{family}_hold{k - 1}_{x}"][r]
        col[f"{family}_hold0_at"][r], col[f"{family}_hold0_peak"][r] = at[r], peak[r]
    at[r] = peak[r] = last[r] = math.nan
