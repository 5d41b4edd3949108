"""Latency baselines in arrays: :class:`LatencyBank` holds N of them, a row each.

A latency baseline is a seasonal baseline of the log of a window quantile (a request
series' retriever P99 or end-to-end P95), fed an entry every ``entry_values`` new requests
and held while the quantile is more than ``hold`` times the baseline (once the window
has taken :data:`TRUST_VALUES` values). Latency follows load (queues grow at the daily
peak), so the baseline follows the daily profile too. The baselines are rows of one
:class:`~ragwatch.detectors.seasonal.SeasonalBank` and the rest of their state three
columns: the window's count at the last entry and when and from what the baseline last
accepted a new level. The reference (``tests/reference/evidence.py``, one series) is held
to it in ``tests/unit/test_latency_bank.py``.

>>> bank = LatencyBank(capacity=2)
>>> rows = np.array([0, 1])
>>> for i in range(5):   # row 0 at 100 ms, row 1 at 400 ms, an entry every 100 requests
...     base = bank.update(rows, np.full(2, 60.0 * i), np.array([100.0, 400.0]),
...                        np.array([100 * i, 100 * i]))
>>> [round(float(v)) for v in bank.baseline(rows, np.full(2, 300.0))]
[100, 400]
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from ragwatch.detectors.seasonal import SeasonalBank, SeasonalBaseline

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
NO_ENTRY = -1  # seen_at_entry of a baseline that has had no entry yet (None)

# A latency baseline holds (learns nothing while its quantile is above ``hold`` x it) only
# once its window has taken this many values (15 entries): one learnt from the first few
# windows of a series (often a quiet start) can sit 1.4x below the quantile's usual level,
# and a hold that starts then lasts a day (a healthy retriever's P99 "slow" all morning).
TRUST_VALUES = 1500


def exp_or_inf(x: float) -> float:
    """``math.exp(x)``, or inf past the float range: a latency baseline is learnt in logs,
    and one of latencies near the float maximum (finite, so accepted) can forecast past
    it; the baseline is then inf, which no quantile exceeds, instead of an error on every
    close of the series.

    >>> exp_or_inf(0.0), exp_or_inf(710.0)
    (1.0, inf)
    """
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def _exp(a: F64) -> F64:
    """:func:`exp_or_inf` of each value (numpy's exp differs from ``math.exp`` in
    the last bit at times), NaN staying NaN."""
    return np.array([exp_or_inf(v) if v == v else math.nan for v in a.tolist()], dtype=np.float64)


class LatencyBank:
    """Latency baselines for up to ``capacity`` rows (it grows): each a seasonal baseline
    of the log of a window quantile, fed an entry every ``entry_values`` new values, at
    least ``min_entries`` before it forecasts, held while the quantile is more than
    ``hold`` times it (and, past ``hold_max_s``, re-learnt from it)."""

    def __init__(
        self,
        capacity: int = 16,
        *,
        entry_values: int = 100,
        min_entries: int = 3,
        hold: float = 1.2,
        hold_max_s: float = 86400.0,
    ) -> None:
        self.entry_values, self.hold = entry_values, hold
        self.min_entries, self.hold_max_s = min_entries, hold_max_s
        # a slowdown far past any rhythm of latency: held a day
        proto = SeasonalBaseline(
            warmup=min_entries, hold_max_s=hold_max_s, unprofiled_hold_s=hold_max_s
        )
        self.model = SeasonalBank(proto, capacity)
        self.seen_at_entry: I64 = np.full(capacity, NO_ENTRY, dtype=np.int64)
        self.relearned_at: F64 = np.full(capacity, np.nan)
        self.relearned_before: F64 = np.full(capacity, np.nan)

    def reserve(self, n: int) -> None:
        """Rows ``0 .. n - 1`` usable (new rows fresh)."""
        self.model.reserve(n)
        old = len(self.seen_at_entry)
        if n <= old:
            return
        size = max(n, 2 * old)
        self.seen_at_entry = np.concatenate(
            [self.seen_at_entry, np.full(size - old, NO_ENTRY, dtype=np.int64)]
        )
        self.relearned_at = np.concatenate([self.relearned_at, np.full(size - old, np.nan)])
        self.relearned_before = np.concatenate([self.relearned_before, np.full(size - old, np.nan)])

    def reset(self, rows: npt.ArrayLike) -> None:
        r = np.asarray(rows, dtype=np.intp)
        self.model.reset(r)
        self.seen_at_entry[r] = NO_ENTRY
        self.relearned_at[r] = self.relearned_before[r] = np.nan

    def baseline(self, rows: npt.ArrayLike, now: F64) -> F64:
        """The baselines at ``now`` (NaN while warming up)."""
        mean, _, _ = self.model.forecast(np.asarray(rows, dtype=np.intp), now)
        return _exp(mean)

    def held_s(self, rows: npt.ArrayLike, now: F64) -> F64:
        return self.model.held_s(np.asarray(rows, dtype=np.intp), now)

    def log_var(self, rows: npt.ArrayLike, now: F64) -> F64:
        """How uncertain each baseline is at ``now``, as a variance of its log: the
        level's own uncertainty plus the measured scatter of the entries around it (NaN
        while warming up). A test of a window's quantile against the baseline adds it to
        the window's sampling variance."""
        _, var, noise = self.model.forecast(np.asarray(rows, dtype=np.intp), now)
        return var + noise

    def update(self, rows: npt.ArrayLike, now: F64, value: F64, seen: I64) -> F64:
        """For each row (distinct): judge ``value`` (the
        window's quantile, NaN if unknown; ``seen``: the values the window ever took)
        against the baseline, then maybe learn it. Returns the baselines judged against."""
        r = np.asarray(rows, dtype=np.intp)
        base = self.baseline(r, now)
        with np.errstate(invalid="ignore"):
            ok = value > 0  # False for NaN
        if not ok.any():
            return base
        r, t, v, b = r[ok], now[ok], value[ok], base[ok]
        z = np.array([math.log(x) for x in v.tolist()], dtype=np.float64)
        with np.errstate(invalid="ignore", over="ignore"):  # hold * b past the float range: inf
            deviating = ~np.isnan(b) & (v > self.hold * b) & (seen[ok] >= TRUST_VALUES)
        accepted = self.model.hold(r, t, deviating, z)
        self.relearned_at[r[accepted]] = t[accepted]
        self.relearned_before[r[accepted]] = b[accepted]
        last = self.seen_at_entry[r]
        s = seen[ok]
        due = (last == NO_ENTRY) | (s - last >= self.entry_values)
        due &= ~self.model.holding(r)
        if due.any():
            d = r[due]
            self.model.learn(d, t[due], z[due], np.zeros(len(d)), np.ones(len(d)))
            self.seen_at_entry[d] = s[due]
        return base

    # -- snapshots ------------------------------------------------------------------

    def dump(self, rows: npt.ArrayLike) -> dict[str, Any]:
        """``rows``' state as plain data (raw little-endian arrays)."""
        r = np.asarray(rows, dtype=np.intp)
        return {
            "model": self.model.dump(r),
            "seen_at_entry": self.seen_at_entry[r].astype("<i8").tobytes(),
            "relearned_at": self.relearned_at[r].astype("<f8").tobytes(),
            "relearned_before": self.relearned_before[r].astype("<f8").tobytes(),
        }

    def load(self, rows: npt.ArrayLike, data: dict[str, Any]) -> None:
        """Inverse of :meth:`dump` (ValueError, before changing anything, if it does not
        fit ``rows``)."""
        r = np.asarray(rows, dtype=np.intp)
        seen = _array(data["seen_at_entry"], "<i8", len(r))
        at = _array(data["relearned_at"], "<f8", len(r))
        before = _array(data["relearned_before"], "<f8", len(r))
        probe = SeasonalBank(self.model.params, max(1, len(r)))
        probe.load(np.arange(len(r)), data["model"])  # raises before anything changes here
        self.model.load(r, data["model"])
        self.seen_at_entry[r], self.relearned_at[r], self.relearned_before[r] = seen, at, before

    def nbytes(self) -> int:
        own = self.seen_at_entry.nbytes + self.relearned_at.nbytes + self.relearned_before.nbytes
        return self.model.nbytes() + own


def _array(raw: Any, dtype: str, n: int) -> npt.NDArray[Any]:
    if not isinstance(raw, bytes | bytearray | memoryview):
        raise ValueError(f"expected bytes, got {type(raw).__name__}")
    a = np.frombuffer(raw, dtype=dtype)
    if len(a) != n:
        raise ValueError(f"{len(a)} values for {n} rows")
    return a
