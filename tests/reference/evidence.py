"""The object forms of the request evidence, one series at a time: the references the banks
are tested against (``tests/unit/test_count_bank.py``, ``test_latency_bank.py``). Product
code never uses them: the banks in :mod:`ragwatch.detectors.counts` and
:mod:`ragwatch.detectors.latency` are the one implementation.

- :class:`CountRing` keeps, per closed bucket, the counts and sums that rates and means
  need, and :meth:`CountRing.window` walks back from the newest bucket until the
  *expected* number of requests reaches a target or the span reaches a cap.
- :class:`LatencyBaseline` is a seasonal baseline of a window quantile, fed the quantile
  each time ``entry_values`` new requests have entered the window, held while the
  quantile is more than ``hold`` times the baseline.

:func:`ring_of`, :func:`adopt_ring`, :func:`baseline_of` and :func:`adopt_baseline` copy
one row of a bank to its object and back, exactly.

>>> ring = CountRing(capacity=10, bucket_s=60.0)
>>> for minute in range(5):   # 3 requests a minute where 6 were expected
...     ring.push(60.0 * (minute + 1), BucketCounts(n=3, tokens=750.0), expected=6.0)
>>> w = ring.window(target=10.0, max_s=600.0)
>>> w.buckets, w.n, w.expected, w.span_s
(2, 6, 12.0, 120.0)
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ragwatch.detectors.counts import FLOATS, BucketCounts, CountBank, CountWindow
from ragwatch.detectors.latency import NO_ENTRY, TRUST_VALUES, LatencyBank, exp_or_inf
from ragwatch.detectors.seasonal import SeasonalBaseline


class CountRing:
    """Per-bucket counts of the newest ``capacity`` buckets (see module docstring), each
    with the number of requests the baseline expected when it closed (a one-step-ahead
    forecast: the bucket itself had not been learnt)."""

    __slots__ = ("_cols", "_end", "_head", "_len", "bucket_s", "capacity")

    _FIELDS = (
        "n",
        "errors",
        "tokens",
        "tokens_sq",
        "context",
        "observed",
        "expected",
        "clustered",
    )

    def __init__(self, capacity: int, bucket_s: float) -> None:
        if capacity < 1 or not bucket_s > 0:
            raise ValueError(f"need capacity >= 1 and bucket_s > 0, got {capacity, bucket_s}")
        self.capacity, self.bucket_s = capacity, float(bucket_s)
        # columns grow as buckets arrive, up to capacity (a new series holds one bucket)
        self._cols = {f: array("d") for f in self._FIELDS}
        self._end = array("d")  # bucket end times
        self._head = 0  # where the next bucket goes
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def push(self, end: float, c: BucketCounts, expected: float | None = None) -> None:
        """One closed bucket and the requests expected in it (None: no baseline yet)."""
        i = self._head
        cols = self._cols
        if len(self._end) < self.capacity:  # not full yet: the next bucket goes at the end
            for col in (*cols.values(), self._end):
                col.append(0.0)
        cols["n"][i], cols["errors"][i] = c.n, c.errors
        cols["tokens"][i], cols["tokens_sq"][i], cols["context"][i] = (
            c.tokens,
            c.tokens_sq,
            c.context,
        )
        cols["observed"][i] = 1.0 if c.observed else 0.0
        cols["clustered"][i] = c.clustered
        cols["expected"][i] = math.nan if expected is None else expected
        self._end[i] = end
        self._head = (i + 1) % self.capacity
        self._len = min(self._len + 1, self.capacity)

    def newest_end(self) -> float | None:
        return self._end[(self._head - 1) % self.capacity] if self._len else None

    def window(self, *, target: float, max_s: float, min_s: float = 0.0) -> CountWindow:
        """Newest observed buckets back until their expected requests sum to ``target``
        and the span to ``min_s``, or the span reaches ``max_s`` (a bucket closed without
        an expectation counts its observed requests). Unobserved buckets (gaps) are
        skipped and do not count towards the span."""
        cols, ends = self._cols, self._end
        n_col, e_col, t_col, q_col, c_col, o_col, x_col, k_col = (cols[f] for f in self._FIELDS)
        n = errors = unexpected = clustered = 0
        tokens = tokens_sq = context = exp = span = 0.0
        k = 0
        start = self.newest_end() or 0.0
        i = self._head
        for _ in range(self._len):
            i = (i - 1) % self.capacity
            if start - ends[i] >= max_s:  # the oldest bucket that may count ends here
                break
            if not o_col[i]:
                continue
            n += int(n_col[i])
            errors += int(e_col[i])
            tokens += t_col[i]
            tokens_sq += q_col[i]
            context += c_col[i]
            clustered += int(k_col[i])
            x = x_col[i]
            if x != x:  # NaN: no expectation when it closed
                x = n_col[i]
                unexpected += 1
            exp += x
            span += self.bucket_s
            k += 1
            if exp >= target and span >= min_s:
                break
        first = ends[i] - self.bucket_s if k else start
        return CountWindow(
            k, span, n, errors, tokens, tokens_sq, context, exp, first, unexpected, clustered
        )


@dataclass
class LatencyBaseline:
    """Seasonal baseline of one window quantile (see module docstring): a
    :class:`~ragwatch.detectors.seasonal.SeasonalBaseline` of its log, fed an entry every
    ``entry_values`` new requests, held while the quantile is more than ``hold`` times the
    baseline (and, past ``hold_max_s``, re-learnt from it). Latency follows load (queues
    grow at the daily peak), so the baseline follows the daily profile too."""

    entry_values: int = 100
    min_entries: int = 3
    hold: float = 1.2
    hold_max_s: float = 86400.0
    model: SeasonalBaseline | None = None
    seen_at_entry: int | None = None  # the window's values ever seen, at the last entry
    relearned_at: float | None = None
    relearned_before: float | None = None

    def __post_init__(self) -> None:
        if self.model is None:  # a slowdown far past any rhythm of latency: held a day
            self.model = SeasonalBaseline(
                warmup=self.min_entries,
                hold_max_s=self.hold_max_s,
                unprofiled_hold_s=self.hold_max_s,
            )

    def baseline(self, now: float) -> float | None:
        assert self.model is not None
        f = self.model.forecast(now)
        return None if f is None else exp_or_inf(f.mean)

    def update(self, now: float, value: float | None, seen: int) -> float | None:
        """Judge ``value`` (the window's quantile now; ``seen``: how many values the window
        has ever taken) against the baseline, then maybe learn it. Returns the baseline it
        was judged against."""
        model = self.model
        assert model is not None
        base = self.baseline(now)
        if value is None or not value > 0:
            return base
        z = math.log(value)
        trusted = seen >= TRUST_VALUES
        if model.hold(now, trusted and base is not None and value > self.hold * base, z):
            self.relearned_at, self.relearned_before = now, base  # a new normal
        due = self.seen_at_entry is None or seen - self.seen_at_entry >= self.entry_values
        if due and not model.holding:
            model.learn(now, z, 0.0)
            self.seen_at_entry = seen
        return base

    def held_s(self, now: float) -> float:
        assert self.model is not None
        return self.model.held_s(now)


# ---------------------------------------------------------------------- a bank's row <-> object


def adopt_ring(bank: CountBank, row: int, ring: CountRing) -> None:
    """Row ``row`` of ``bank`` from a ring of the same capacity and bucket size, exactly
    (ValueError, nothing changed, if it does not fit)."""
    r = bank._rows([row])
    if (ring.capacity, ring.bucket_s) != (bank.capacity, bank.bucket_s):
        raise ValueError("count bank: a ring of another capacity or bucket size")
    length = len(ring._end)
    if length != len(ring) or length > bank.capacity:
        raise ValueError("count bank: a ring whose columns are not its length")

    def column(values: Any) -> npt.NDArray[Any]:
        out = np.zeros((1, bank.capacity))
        out[0, :length] = np.asarray(values, dtype=np.float64)
        return out

    cols = ring._cols
    state = {name: column(cols[name]) for name in FLOATS if name != "end"}
    state["end"] = column(ring._end)
    state["observed"] = column(cols["observed"]) != 0.0  # a double's truth, as the ring's
    state["head"] = np.array([ring._head], dtype=np.int64)
    state["len"] = np.array([len(ring)], dtype=np.int64)
    bank._check(state)
    bank._write(r, state)


def ring_of(bank: CountBank, row: int) -> CountRing:
    """Row ``row`` of ``bank`` as a ring, exactly (its columns, head and len), built by
    pushes: a full ring's buckets from position 0, then those before its head again."""
    at = int(bank._rows([row])[0])
    ring = CountRing(bank.capacity, bank.bucket_s)
    length, head = int(bank._len[at]), int(bank._head[at])
    again = range(head) if length == bank.capacity else range(0)
    f = bank._f
    for j in [*range(length), *again]:
        counts = BucketCounts(
            n=int(f["n"][at, j]),
            errors=int(f["errors"][at, j]),
            tokens=float(f["tokens"][at, j]),
            tokens_sq=float(f["tokens_sq"][at, j]),
            context=float(f["context"][at, j]),
            observed=bool(bank._observed[at, j]),
            clustered=int(f["clustered"][at, j]),
        )
        expected = float(f["expected"][at, j])  # a NaN kept as it is: the ring stores it so
        ring.push(float(f["end"][at, j]), counts, expected)
    return ring


def adopt_baseline(bank: LatencyBank, row: int, base: LatencyBaseline) -> None:
    """Take the state of a baseline into ``row`` of ``bank`` (exactly)."""
    assert base.model is not None
    bank.model.adopt(row, base.model)
    bank.seen_at_entry[row] = NO_ENTRY if base.seen_at_entry is None else base.seen_at_entry
    bank.relearned_at[row] = _nan(base.relearned_at)
    bank.relearned_before[row] = _nan(base.relearned_before)


def baseline_of(bank: LatencyBank, row: int) -> LatencyBaseline:
    """Row ``row`` of ``bank`` as a baseline."""
    seen = int(bank.seen_at_entry[row])
    return LatencyBaseline(
        entry_values=bank.entry_values,
        min_entries=bank.min_entries,
        hold=bank.hold,
        hold_max_s=bank.hold_max_s,
        model=bank.model.export(row),
        seen_at_entry=None if seen == NO_ENTRY else seen,
        relearned_at=_none(bank.relearned_at[row]),
        relearned_before=_none(bank.relearned_before[row]),
    )


def _nan(v: float | None) -> float:
    return math.nan if v is None else v


def _none(v: np.float64) -> float | None:
    return None if np.isnan(v) else float(v)
