"""Windows sized by evidence, for N request series in arrays: the counts behind a series'
rates and means, and the test the throughput rules make of them.

A minute of a quiet service holds one or two requests; a 25 % drop of them is noise. So
the request pipeline does not compute its rates per bucket but over windows that hold
enough requests. :class:`CountBank` keeps, per row (a series) and closed bucket, the counts
and sums that rates and means need (:class:`BucketCounts`: requests, errors, output tokens
and their squares, context tokens, whether the bucket was observed at all) and how many
requests were expected in it when it closed. :meth:`CountBank.window` walks back from the
newest bucket until the *expected* number of requests reaches a target or the span
reaches a cap. Expected, not observed: choosing the window by what was seen would make a
drop pick a longer window than normal traffic (a biased test). :func:`count_z` is the
standardised difference between an observed and an expected count of a compound Poisson
process (requests, or tokens carried by requests), with the expectation's own
uncertainty added.

The reference (``tests/reference/evidence.py``: a ring of one series, a loop per bucket)
is held to the bank in ``tests/unit/test_count_bank.py``. The bank's cost: a window of
many rows is a handful of array operations over ``rows x capacity`` matrices.

State per row: per bucket ``end`` and the fields of :class:`BucketCounts` and the
expectation, all float64 (so a count above 2**53 is rounded), except ``observed`` (bool);
and the ring's ``head`` and ``len``.
How a window is taken without a loop over buckets: the rings of the rows asked for are
read newest bucket first (``rows x capacity`` matrices gathered by an index matrix from
head and len), unobserved buckets are masked to +0.0, and the expected requests are
summed with ``np.cumsum`` along the bucket axis, started at +0.0 (numpy's cumsum is
sequential, so its partial sums are a loop's, bit for bit; ``np.sum`` is pairwise and is
not). A walk ends at the first bucket that either ends
``max_s`` or more before the newest end (before adding it) or brings the expected sum to
``target`` and the span to ``min_s`` (after adding it): an ``argmax`` over that condition
(the span of k buckets is a table, so "span >= min_s" is "k >= the fewest buckets that
span it"). Most walks end in the newest buckets, so the newest quarter of each ring is
walked first, and only the rows whose walk went on are walked again over the whole ring.
The sums are then taken over the buckets each walk took: the floats by cumsum again, the
counts (whole numbers, exact in any order) by sum.

>>> bank = CountBank(capacity=10, bucket_s=60.0, rows=2)
>>> for minute in range(5):   # row 0: 3 requests a minute of 6 expected; row 1: 9 of 6
...     bank.push([0, 1], 60.0 * (minute + 1), [3, 9], 0, [750.0, 2250.0], 0.0, 0.0,
...               True, 6.0, 0)
>>> w = bank.window([0, 1], target=10.0, max_s=600.0, min_s=[0.0, 180.0])
>>> w.buckets.tolist(), w.n.tolist(), w.expected.tolist(), w.start.tolist()
([2, 3], [6, 27], [12.0, 18.0], [180.0, 120.0])
>>> w.one(0)
CountWindow(buckets=2, span_s=120.0, n=6, errors=0, tokens=1500.0, tokens_sq=0.0, \
context=0.0, expected=12.0, start=180.0, unexpected=0, clustered=0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]
Rows = npt.NDArray[np.intp]
# sums of counts: int64, or object (Python ints) where sums might pass int64
Ints = npt.NDArray[Any]

FIRST_WIDTH = 8  # ring columns allocated at first (they grow with the longest ring)
COUNTS = ("n", "errors", "clustered")  # whole numbers, summed as the reference's int()s
# the float64 columns per bucket: the fields of BucketCounts (less ``observed``) and the end time
FLOATS = ("n", "errors", "tokens", "tokens_sq", "context", "expected", "clustered", "end")
INT64_SAFE = 2.0**62  # counts are summed in int64 while capacity * max |count| is below
FIRST_SHARE = 4  # a window walks the newest quarter of the rings first (the rest if need be)
FORMAT = 1  # of :meth:`CountBank.dump`


def count_z(observed: float, expected: float, size: float, rel_var: float) -> float:
    """How many standard deviations ``observed`` is from ``expected``.

    ``expected`` is the mean of a compound Poisson sum (requests: ``size`` 1; tokens:
    ``size`` = E[tokens^2] / E[tokens] per request), so its sampling variance is
    ``expected * size``; ``rel_var`` is the relative variance of the expectation itself
    (the baseline's uncertainty), which adds ``(expected * sqrt(rel_var))^2``.

    >>> round(count_z(60, 100, 1.0, 0.0), 1)     # 60 requests where 100 were expected
    -4.0
    >>> round(count_z(60, 100, 1.0, 0.01), 1)    # ... by a baseline good to 10 %
    -2.8
    """
    var = expected * size + expected * expected * rel_var
    if not var > 0:
        return 0.0 if observed == expected else math.copysign(math.inf, observed - expected)
    return (observed - expected) / math.sqrt(var)


@dataclass(frozen=True, slots=True)
class BucketCounts:
    """What one closed bucket of one series counted."""

    n: int = 0
    errors: int = 0
    tokens: float = 0.0  # output tokens
    tokens_sq: float = 0.0  # sum of squares of output tokens per request
    context: float = 0.0  # context tokens
    observed: bool = True  # False: the sender was silent (a gap), not zero traffic
    clustered: int = 0  # requests of an active outlier cluster, not counted in the above


@dataclass(frozen=True, slots=True)
class CountWindow:
    """Sums over the newest ``buckets`` observed buckets, and what was expected there."""

    buckets: int
    span_s: float
    n: int
    errors: int
    tokens: float
    tokens_sq: float
    context: float
    expected: float  # expected requests (the expectations the buckets were closed with)
    start: float  # start of the oldest bucket in it (event time)
    unexpected: int = 0  # buckets closed without an expectation (counted as observed)
    clustered: int = 0  # requests of an active outlier cluster, not counted in ``n``


@dataclass(frozen=True, slots=True, eq=False)
class CountWindows:
    """:class:`CountWindow` of many rows, a field per array (row ``i`` of the
    call at index ``i``); ``n``, ``errors`` and ``clustered`` are int64 arrays, or object
    arrays of Python ints from a bank that has held a count so large that a sum of them
    could pass int64."""

    buckets: I64
    span_s: F64
    n: Ints
    errors: Ints
    tokens: F64
    tokens_sq: F64
    context: F64
    expected: F64
    start: F64
    unexpected: I64
    clustered: Ints

    def __len__(self) -> int:
        return len(self.buckets)

    def one(self, i: int) -> CountWindow:
        """Row ``i``'s window as the reference gives it (plain ints and floats)."""
        return CountWindow(
            int(self.buckets[i]),
            float(self.span_s[i]),
            int(self.n[i]),
            int(self.errors[i]),
            float(self.tokens[i]),
            float(self.tokens_sq[i]),
            float(self.context[i]),
            float(self.expected[i]),
            float(self.start[i]),
            int(self.unexpected[i]),
            int(self.clustered[i]),
        )


def _floats(values: npt.ArrayLike, m: int, name: str) -> F64:
    """``values`` as float64, one per row (a scalar is every row's)."""
    try:
        a = np.asarray(values).astype(np.float64)
        return np.broadcast_to(a, (m,))
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"count bank: {name}: {exc}") from exc


def _counts(values: npt.ArrayLike, m: int, name: str) -> F64:
    """Whole numbers as the reference's double columns hold them (rounded to nearest as
    ``array("d")`` rounds an int); a fraction, NaN or infinity is refused: the reference's
    ``int()`` of it would be lost or would raise when a window is taken."""
    a = np.asarray(values)
    out = _floats(a, m, name)
    if a.dtype.kind not in "biu" and not _whole(out):
        raise ValueError(f"count bank: {name} must be whole numbers")
    return out


def _whole(a: F64) -> bool:
    """All finite whole numbers."""
    return bool(np.isfinite(a).all() and (np.trunc(a) == a).all())


def _running(values: F64, keep: Bools) -> F64:
    """Along each row (its buckets, newest first), the running sums of the kept values
    from +0.0, in place: bit for bit the reference's ``x = 0.0; x += v`` (np.cumsum is
    sequential). A skipped value adds +0.0, which changes no running sum (one started at
    +0.0 is never -0.0); +0.0 added to the first value is the start at +0.0."""
    np.copyto(values, 0.0, where=~keep)
    values[:, :1] += 0.0
    return np.cumsum(values, axis=1, out=values)


def _total(values: F64, keep: Bools) -> F64:
    """Per row, the reference's sum of the kept values (0.0 where none)."""
    return _running(values, keep)[:, -1] if values.shape[1] else np.zeros(len(values))


def _int_total(values: F64, keep: Bools, big: bool) -> Ints:
    """Per row, the sum of ``int()`` of the kept whole doubles: in int64, or in Python ints
    where a sum might pass int64 (``big``); exact either way, as the reference's (the order
    of whole numbers does not matter)."""
    if big:
        ints: Ints = np.vectorize(int, otypes=[object])(np.where(keep, values, 0.0))
        total: Ints = ints.sum(axis=1)
    else:
        total = values.astype(np.int64).sum(axis=1, where=keep)
    return total


def _spans(capacity: int, bucket_s: float) -> F64:
    """The span of ``k`` buckets, k = 0..capacity: ``bucket_s`` added k times from 0.0
    (as the reference adds it; ``k * bucket_s`` may differ in the last bit)."""
    out = np.full(capacity + 1, bucket_s)
    out[0] = 0.0
    return np.cumsum(out)


def _le(a: npt.NDArray[Any]) -> bytes:
    """The raw little-endian bytes of ``a``."""
    return a.astype(a.dtype.newbyteorder("<")).tobytes()


class CountBank:
    """Count rings for ``rows`` series (it grows: :meth:`reserve`), each
    of ``capacity`` buckets of ``bucket_s`` seconds. Rows are plain indices: the caller
    keeps the key -> row map and calls :meth:`reset` on a row it reuses. Every method takes
    rows below :attr:`rows` only (ValueError otherwise); ``push`` and ``load`` distinct
    ones."""

    def __init__(self, capacity: int, bucket_s: float, rows: int = 16) -> None:
        if capacity < 1 or not bucket_s > 0 or rows < 0:
            raise ValueError(
                f"need capacity >= 1, bucket_s > 0, rows >= 0, got {capacity, bucket_s, rows}"
            )
        self.capacity, self.bucket_s = int(capacity), float(bucket_s)
        self.rows = 0
        # Columns allocated so far: they grow with the longest ring up to ``capacity`` (a
        # flood of new series holds a bucket each, not 90). Until they reach it no ring
        # has wrapped: each holds its buckets at positions 0 .. len - 1.
        self._width = min(self.capacity, FIRST_WIDTH)
        self._f: dict[str, F64] = {f: np.zeros((0, self._width)) for f in FLOATS}
        self._observed: Bools = np.zeros((0, self._width), dtype=np.bool_)
        self._head: I64 = np.zeros(0, dtype=np.int64)  # where the next bucket goes
        self._len: I64 = np.zeros(0, dtype=np.int64)
        self._spans = _spans(self.capacity, self.bucket_s)
        self._k_dtype = np.int16 if self.capacity < 2**15 else np.int64
        self._big = False  # a count held may be one whose sums pass int64 (sticky)
        self._grow(rows)

    # ------------------------------------------------------------------ rows

    def _grow(self, rows: int) -> None:
        def grown(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
            new = np.zeros((rows, *a.shape[1:]), dtype=a.dtype)
            new[: len(a)] = a
            return new

        self._f = {f: grown(a) for f, a in self._f.items()}
        self._observed, self._head, self._len = (
            grown(self._observed),
            grown(self._head),
            grown(self._len),
        )
        self.rows = rows

    def _widen(self, need: int) -> None:
        """Columns for rings of ``need`` buckets (doubling, up to ``capacity``)."""
        if need <= self._width:
            return
        width = min(self.capacity, max(need, 2 * self._width))

        def wider(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
            new = np.zeros((len(a), width), dtype=a.dtype)
            new[:, : a.shape[1]] = a
            return new

        self._f = {f: wider(a) for f, a in self._f.items()}
        self._observed = wider(self._observed)
        self._width = width

    def reserve(self, n: int) -> None:
        """Rows below ``n`` usable (new rows empty; growing doubles, so it is amortised)."""
        if n > self.rows:
            self._grow(max(n, 2 * self.rows))

    def _rows(self, rows: npt.ArrayLike, *, distinct: bool = False) -> Rows:
        """``rows`` as indices, checked: integers below :attr:`rows`, distinct if asked."""
        a = np.asarray(rows)
        if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
            raise ValueError("count bank: rows must be a 1-d array of integers")
        r = a.astype(np.intp)
        if r.size and (r.min() < 0 or r.max() >= self.rows):
            raise ValueError(f"count bank: rows must be in 0..{self.rows - 1}")
        if distinct and np.unique(r).size != r.size:
            raise ValueError("count bank: rows must be distinct")
        return r

    def reset(self, rows: npt.ArrayLike) -> None:
        """The rows empty again (a freed row reused for a new series starts afresh)."""
        r = self._rows(rows)
        for a in self._f.values():
            a[r] = 0.0
        self._observed[r] = False
        self._head[r] = self._len[r] = 0

    def nbytes(self) -> int:
        """Bytes held by the arrays."""
        held = [*self._f.values(), self._observed, self._head, self._len, self._spans]
        return sum(a.nbytes for a in held)

    # ------------------------------------------------------------------ pushing

    def push(
        self,
        rows: npt.ArrayLike,
        end: npt.ArrayLike,
        n: npt.ArrayLike,
        errors: npt.ArrayLike,
        tokens: npt.ArrayLike,
        tokens_sq: npt.ArrayLike,
        context: npt.ArrayLike,
        observed: npt.ArrayLike,
        expected: npt.ArrayLike,
        clustered: npt.ArrayLike,
    ) -> None:
        """One closed bucket for each of the distinct ``rows``, as
        the reference ring's ``push`` takes it (``expected`` NaN: None there); a scalar is every
        row's. Counts are whole numbers (ValueError, nothing changed, otherwise)."""
        r = self._rows(rows, distinct=True)
        m = len(r)
        cols = {
            "end": _floats(end, m, "end"),
            "n": _counts(n, m, "n"),
            "errors": _counts(errors, m, "errors"),
            "tokens": _floats(tokens, m, "tokens"),
            "tokens_sq": _floats(tokens_sq, m, "tokens_sq"),
            "context": _floats(context, m, "context"),
            "expected": _floats(expected, m, "expected"),
            "clustered": _counts(clustered, m, "clustered"),
        }
        seen = np.broadcast_to(np.asarray(observed, dtype=np.bool_), (m,))
        self._note_counts([cols[name] for name in COUNTS])
        if m and self._width < self.capacity:
            self._widen(int(self._len[r].max()) + 1)
        h = self._head[r]
        for name, v in cols.items():
            self._f[name][r, h] = v
        self._observed[r, h] = seen
        self._head[r] = (h + 1) % self.capacity
        self._len[r] = np.minimum(self._len[r] + 1, self.capacity)

    # ------------------------------------------------------------------ reading

    def newest_end(self, rows: npt.ArrayLike) -> F64:
        """The end of each row's newest bucket; NaN where a row holds none."""
        r = self._rows(rows)
        ends = self._f["end"][r, self._position(self._head[r] - 1)]
        return np.where(self._len[r] > 0, ends, np.nan)

    def _position(self, k: npt.ArrayLike) -> Any:
        """The column of ring position ``k`` (mod capacity); 0 for a position a ring
        cannot hold yet (beyond the columns: not held, read and ignored)."""
        pos = np.asarray(k) % self.capacity
        return np.where(pos < self._width, pos, 0) if self._width < self.capacity else pos

    def _start(self, r: Rows) -> F64:
        """The object's ``self.newest_end() or 0.0``: 0.0 for an empty ring and for a
        newest end of (either) zero."""
        newest = self.newest_end(r)
        return np.where((self._len[r] > 0) & (newest != 0.0), newest, 0.0)

    def _newest_first(self, r: Rows, width: int) -> tuple[I64, Bools]:
        """Flat indices of each row's newest ``width`` buckets, newest first (``m x
        width``: a row's run of its ring, rotated), and which of them the row holds."""
        width = min(width, self._width)  # a ring holds at most a column each
        head = self._head[r][:, None]
        j = np.arange(width)
        if self._width == self.capacity:
            cap = self.capacity
            at = (r[:, None] * cap + head - 1) - j
            at += cap * (j >= head)  # wrapped past position 0
        else:  # no ring has wrapped
            at = r[:, None] * self._width + self._position(head - 1 - j)
        return at, j < self._len[r][:, None]

    def window(
        self, rows: npt.ArrayLike, *, target: float, max_s: float, min_s: npt.ArrayLike = 0.0
    ) -> CountWindows:
        """The window of each row (see the module) (``min_s`` per row, or one for all)."""
        r = self._rows(rows)
        mins = np.broadcast_to(np.asarray(min_s, dtype=np.float64), r.shape)
        args = (float(target), float(max_s))
        with np.errstate(all="ignore"):  # infinities and NaN, as the reference's floats
            # most walks end in the newest buckets: walk those first, the rest again
            took, last, done = self._walk(r, *args, mins, max(1, self.capacity // FIRST_SHARE))
            if done.all():
                return self._sums(r, took, last)
            more = ~done
            took[more], last[more], _ = self._walk(r[more], *args, mins[more], self.capacity)
            if not done.any():
                return self._sums(r, took, last)
            parts = [(m, self._sums(r[m], took[m], last[m])) for m in (done, more)]
        return _merged(parts)

    def _walk(
        self, r: Rows, target: float, max_s: float, min_s: F64, width: int
    ) -> tuple[I64, I64, Bools]:
        """Where the walk of each row over its newest ``width`` buckets ends (see
        :func:`_walk_ends`)."""
        at, held = self._newest_first(r, width)
        observed = self._observed.take(at)
        observed &= held
        exp = _running(self._expected_counts(at), observed)
        # buckets taken (int16 while it fits: the cheapest cumsum)
        k: npt.NDArray[np.integer[Any]] = np.cumsum(observed, axis=1, dtype=self._k_dtype)
        brk = self._start(r)[:, None] - self._f["end"].take(at) >= max_s
        brk &= held
        stop = exp >= target
        stop &= observed
        stop &= k >= np.searchsorted(self._spans, min_s)[:, None]  # the fewest spanning min_s
        return _walk_ends(brk, stop, self._len[r])

    def _expected_counts(self, at: I64) -> F64:
        """The expected requests of the buckets ``at``: where none was, their requests."""
        x = self._f["expected"].take(at)
        np.copyto(x, self._f["n"].take(at), where=np.isnan(x))
        return x

    def _sums(self, r: Rows, took: I64, last: I64) -> CountWindows:
        """The windows of rows ``r`` whose walks went over their newest ``took`` buckets
        and visited the bucket at position ``last`` last."""
        at, _ = self._newest_first(r, int(took.max(initial=0)))
        taken = np.arange(at.shape[1]) < took[:, None]
        taken &= self._observed.take(at)
        buckets = np.count_nonzero(taken, axis=1)
        newest = self._start(r)
        # the reference's ``ends[i] - bucket_s`` of the last bucket *visited* (not taken)
        last_end = self._f["end"][r, self._position(self._head[r] - 1 - last)]
        ints = {f: _int_total(self._f[f].take(at), taken, self._big) for f in COUNTS}
        return CountWindows(
            buckets=buckets,
            span_s=self._spans[buckets],
            tokens=_total(self._f["tokens"].take(at), taken),
            tokens_sq=_total(self._f["tokens_sq"].take(at), taken),
            context=_total(self._f["context"].take(at), taken),
            expected=_total(self._expected_counts(at), taken),
            start=np.where(buckets > 0, last_end - self.bucket_s, newest),
            unexpected=np.count_nonzero(taken & np.isnan(self._f["expected"].take(at)), axis=1),
            **ints,
        )

    # ------------------------------------------------------------------ state

    def _note_counts(self, counts: list[F64]) -> None:
        """Note counts so large that a window's sums of them might pass int64."""
        most = max((float(np.abs(a).max(initial=0.0)) for a in counts), default=0.0)
        self._big |= most * self.capacity >= INT64_SAFE

    def _write(self, r: Rows, state: dict[str, npt.NDArray[Any]]) -> None:
        """Put checked state (``FLOATS``, ``observed``, ``head``, ``len``) on rows ``r``."""
        self._note_counts([state[name] for name in COUNTS])
        self._widen(int(state["len"].max(initial=0)))
        w = self._width
        for name in FLOATS:
            self._f[name][r] = state[name][:, :w]
        self._observed[r] = state["observed"][:, :w]
        self._head[r], self._len[r] = state["head"], state["len"]

    def _check(self, state: dict[str, npt.NDArray[Any]]) -> None:
        """ValueError unless ``state`` is rings as pushes leave them: head and len in
        range, head == len until full, counts whole numbers, nothing beyond len."""
        cap, head, length = self.capacity, state["head"], state["len"]
        if ((head < 0) | (head >= cap) | (length < 0) | (length > cap)).any():
            raise ValueError("count bank state: head or len out of range")
        if ((length < cap) & (head != length)).any():
            raise ValueError("count bank state: head != len in a ring not full")
        if not all(_whole(state[name]) for name in COUNTS):
            raise ValueError("count bank state: counts must be whole numbers")
        beyond = np.arange(cap) >= length[:, None]
        held = [state[name] for name in FLOATS]
        if state["observed"][beyond].any() or any(a[beyond].any() for a in held):
            raise ValueError("count bank state: values beyond len")

    def dump(self, rows: npt.ArrayLike) -> dict[str, Any]:
        """The state of ``rows`` as plain data (raw little-endian arrays by name, and the
        bank's parameters): :meth:`load` puts it back, onto any rows."""
        r = self._rows(rows)
        out: dict[str, Any] = {
            "format": FORMAT,
            "capacity": self.capacity,
            "bucket_s": self.bucket_s,
            "rows": len(r),
            "observed": self._full(self._observed[r]).astype(np.uint8).tobytes(),
            "head": _le(self._head[r]),
            "len": _le(self._len[r]),
        }
        out.update({name: _le(self._full(self._f[name][r])) for name in FLOATS})
        return out

    def _full(self, a: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """Rows of columns as ``capacity`` columns (a snapshot does not depend on how far
        this bank's columns have grown)."""
        if a.shape[1] == self.capacity:
            return a
        out = np.zeros((len(a), self.capacity), dtype=a.dtype)
        out[:, : a.shape[1]] = a
        return out

    def load(self, rows: npt.ArrayLike, data: dict[str, Any]) -> None:
        """Rows ``rows`` from a :meth:`dump` of as many rows by a bank of the same
        capacity and bucket size (ValueError, with nothing changed, if it does not fit)."""
        r = self._rows(rows, distinct=True)
        if not isinstance(data, dict):
            raise ValueError("count bank state must be a dict")
        mine = {"format": FORMAT, "capacity": self.capacity, "bucket_s": self.bucket_s}
        mine["rows"] = len(r)
        for key, want in mine.items():
            got = data.get(key)
            if type(got) is not type(want) or got != want:
                raise ValueError(f"count bank state: {key} is {got!r}, not {want!r}")
        shape = (len(r), self.capacity)
        state = {name: self._raw(data, name, "<f8", shape) for name in FLOATS}
        observed = self._raw(data, "observed", "u1", shape)
        if (observed > 1).any():
            raise ValueError("count bank state: observed must be 0 or 1")
        state["observed"] = observed.astype(np.bool_)
        state["head"] = self._raw(data, "head", "<i8", (len(r),))
        state["len"] = self._raw(data, "len", "<i8", (len(r),))
        self._check(state)
        self._write(r, state)

    @staticmethod
    def _raw(data: dict[str, Any], name: str, dtype: str, shape: tuple[int, ...]) -> Any:
        """``data[name]``: bytes of ``shape`` values of ``dtype``, as an array."""
        raw = data.get(name)
        size = math.prod(shape) * np.dtype(dtype).itemsize
        if not isinstance(raw, bytes) or len(raw) != size:
            raise ValueError(f"count bank state: {name} must be {size} bytes")
        return np.frombuffer(raw, dtype=dtype).reshape(shape)


def _walk_ends(brk: Bools, stop: Bools, length: I64) -> tuple[I64, I64, Bools]:
    """Where each walk (a row, newest bucket first) ends: how many buckets it went over,
    the position of the last bucket it visited (-1 for an empty ring), and whether it
    ended within the buckets given. It ends at the first bucket that breaks (``max_s``:
    before adding it, but visited) or stops (target and ``min_s`` reached: after adding
    it), else after all ``length`` buckets."""
    ends = brk | stop
    found = ends.any(axis=1)
    j = ends.argmax(axis=1)
    broke = brk[np.arange(len(j)), j]
    width = brk.shape[1]
    took = np.where(found, np.where(broke, j, j + 1), np.minimum(length, width))
    last = np.where(found, j, np.minimum(length, width) - 1)
    return took, last, found | (length <= width)


def _merged(parts: list[tuple[Bools, CountWindows]]) -> CountWindows:
    """One set of windows from the windows of disjoint rows, each with its rows' mask."""
    fields = {}
    for f in CountWindows.__slots__:
        first = getattr(parts[0][1], f)
        out = np.empty(len(parts[0][0]), dtype=first.dtype)
        for rows, w in parts:
            out[rows] = getattr(w, f)
        fields[f] = out
    return CountWindows(**fields)
