"""Deviations that come back at the same hour every day: the service's rhythm, not a fault.

A serving baseline (decode time per token, time to first token, queue wait: the request
pipeline's ``SERVING`` families) holds while its value is well above it, and learns nothing
meanwhile: a fault must not teach the baseline its own level. A queue that builds at every daily
peak (a service at capacity for a few hours a day, a batch of clients that all start at
09:00), or a decode that slows at every peak as the engine batches more requests, is then
held each day and never learnt: the hold ends with the peak, long before the day it would
take to accept the level, and the rule pages every day (``bench/space.py`` seed 59:
QueueWaitHigh on days 2 and 3, a queue of ~1 s at every evening peak on a 50 ms floor).

A :class:`HoldMemory` keeps, per row (a series), its last :data:`REMEMBERED` holds that lasted
:data:`RECUR_MIN_S` or more: when each began and the highest value over the baseline it
reached. A hold that began within :data:`RECUR_TOL_S` of a remembered one's start one
or two days later, and is no more than :data:`RECUR_MARGIN` times as high as that one
got, is the rhythm: ``<family>_recurring`` is 1, and the family's rule does not page.
The first time pages (nothing tells it from a fault); a fault during a recurring hold
pages once it is :data:`RECUR_MARGIN` times beyond yesterday's peak.

>>> mem = HoldMemory.fresh(1)
>>> def close(t: float, held: float, ratio: float) -> float:
...     return float(recurring(mem, np.array([0]), np.array([t]), np.array([held]),
...                            np.array([ratio]))[0])
>>> day, hour = 86400.0, 3600.0
>>> [close(18 * hour + m * 60, m * 60, 8.0) for m in (1, 120)]  # the first evening
[0.0, 0.0]
>>> close(21 * hour, 0.0, 1.0)  # over: a hold of 2 h at 8x, remembered
0.0
>>> close(day + 18.5 * hour, 60.0, 9.0)  # the next evening, as high: the rhythm
1.0
>>> close(day + 18.6 * hour, 420.0, 30.0)  # far beyond it: a fault on top
0.0
>>> for t, held in ((3 * day + 3 * hour, 60.0), (3 * day + 5 * hour, 7260.0)):
...     _ = close(t, held, 0.0)  # two hours held, its height no evidence (0)
>>> _ = close(3 * day + 6 * hour, 0.0, 1.0)  # over, and not remembered
>>> float(mem.starts[0][0]) / hour  # the first evening's is
18.0
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

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
# a family's columns in a caller's table, after ``<family>_hold`` (see HoldMemory)
HOLD_COLUMNS = (
    "_at",
    "_peak",
    "_last",
    *(f"{k}_{x}" for k in range(REMEMBERED) for x in ("at", "peak")),
)


@dataclass(frozen=True, slots=True)
class HoldMemory:
    """One family's hold memory for many rows, a float array per field (views of the
    caller's columns, written in place; NaN: none): the hold under way (``at``, its start;
    ``peak``, its highest value over the baseline; ``last``, its last close) and the
    remembered ones, newest first (``starts[k]``, ``peaks[k]``)."""

    at: F64
    peak: F64
    last: F64
    starts: tuple[F64, ...]
    peaks: tuple[F64, ...]

    @classmethod
    def of(cls, columns: Mapping[str, F64], family: str) -> HoldMemory:
        """The memory of ``family`` in ``columns``, named ``<family>_hold`` +
        :data:`HOLD_COLUMNS`."""
        c = {x: columns[f"{family}_hold{x}"] for x in HOLD_COLUMNS}
        starts = tuple(c[f"{k}_at"] for k in range(REMEMBERED))
        peaks = tuple(c[f"{k}_peak"] for k in range(REMEMBERED))
        return cls(c["_at"], c["_peak"], c["_last"], starts, peaks)

    @classmethod
    def fresh(cls, n: int) -> HoldMemory:
        """A memory of ``n`` rows of its own, remembering nothing."""
        return cls.of({f"h_hold{x}": np.full(n, np.nan) for x in HOLD_COLUMNS}, "h")


def recurring(mem: HoldMemory, rows: Rows, end: F64, held_s: F64, ratio: F64) -> F64:
    """``<family>_recurring`` of ``rows`` closing at ``end``: 1 where the family's
    baseline has been holding for ``held_s`` (0: learning) since a time of day at which a
    remembered hold began a day or two before, and ``ratio`` (value over baseline) is
    within :data:`RECUR_MARGIN` of that hold's highest; else 0. Then the row remembers:
    the hold under way (its start, highest ratio and last close), and a hold that ended
    after :data:`RECUR_MIN_S` or more among its last :data:`REMEMBERED`."""
    at, peak, last = mem.at, mem.peak, mem.last
    out = np.zeros(len(rows))
    for i, (r, t, h, q) in enumerate(
        zip(rows.tolist(), end.tolist(), held_s.tolist(), ratio.tolist(), strict=True)
    ):
        began = t - h if h > 0 else math.nan
        if at[r] == at[r] and not abs(began - at[r]) <= 1.0:  # the hold it watched is over
            _remember(mem, r)
        if began != began:
            continue
        if at[r] != at[r]:
            at[r], peak[r] = began, -math.inf
        peak[r] = max(peak[r], q) if q == q else peak[r]
        last[r] = t
        out[i] = float(_recurs(mem, r, began, q))
    return out


def _recurs(mem: HoldMemory, r: int, began: float, ratio: float) -> bool:
    for start_k, peak_k in zip(mem.starts, mem.peaks, strict=True):
        start, high = start_k[r], peak_k[r]
        if start != start or not ratio <= RECUR_MARGIN * high:
            continue
        if any(abs(began - (start + d * DAY_S)) <= RECUR_TOL_S for d in DAYS_BACK):
            return True
    return False


def _remember(mem: HoldMemory, r: int) -> None:
    """The hold row ``r`` watched is over: among the remembered if it lasted long
    enough and rose above 0 (the oldest forgotten), and the row watches none. A caller
    gives a height of 0 where a deviation is no evidence: such a hold is not the rhythm
    of anything, and must not push a remembered one out."""
    at, peak, last = mem.at, mem.peak, mem.last
    if last[r] - at[r] >= RECUR_MIN_S and peak[r] > 0:
        for k in range(REMEMBERED - 1, 0, -1):
            mem.starts[k][r], mem.peaks[k][r] = mem.starts[k - 1][r], mem.peaks[k - 1][r]
        mem.starts[0][r], mem.peaks[0][r] = at[r], peak[r]
    at[r] = peak[r] = last[r] = math.nan
