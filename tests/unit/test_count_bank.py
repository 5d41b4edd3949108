"""The count bank is held to the object ring it vectorises, bit for bit: on the same pushes
(expectations None, NaN and numbers, gaps, unobserved buckets, rings that wrap, counts past
2**53 and past int64), every row's window equals the object's field by field (types and
float bits), whatever the target, cap and minimum span; and state copies (adopt / export,
dump / load) are exact."""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ragwatch.detectors.counts import BucketCounts, CountBank, CountWindow
from tests.reference.evidence import CountRing, adopt_ring, ring_of

FIELDS = (
    "buckets",
    "span_s",
    "n",
    "errors",
    "tokens",
    "tokens_sq",
    "context",
    "expected",
    "start",
    "unexpected",
    "clustered",
)
ANY_FLOAT = st.floats(allow_nan=True, allow_infinity=True)
EDGE_FLOATS = [0.0, -0.0, 0.1, 1.0, 2.5, 750.0, 1e308, -1e308, 5e-324, math.inf, -math.inf]
BIG_INTS = [2**53, 2**53 + 1, 2**62, 2**63 - 1, -(2**63), 2**64 + 1, 10**30]
# counts of an example: small (the bank sums in int64), or any, past 2**53 and int64 too
# (it sums in Python ints once it has held one whose sums could pass int64)
SMALL = (st.integers(0, 20) | st.integers(-5, 2**40), st.integers(0, 5) | st.just(-1))
ANY = (
    st.integers(0, 20) | st.sampled_from(BIG_INTS) | st.integers(-(2**63), 2**63 - 1),
    st.integers(0, 5) | st.sampled_from([-1, 2**53 + 1, 2**63 - 1]),
)
FLOAT = st.floats(0.0, 1e4) | st.sampled_from(EDGE_FLOATS) | ANY_FLOAT
EXPECTED = (
    st.none()
    | st.just(math.nan)
    | st.floats(0.0, 20.0)
    | st.sampled_from([0.0, -0.0, 1.0, 6.0, math.inf, -1.0])
    | ANY_FLOAT
)
BUCKET_S = st.sampled_from([60.0, 1.0, 0.1, 7.3, 1e-3]) | st.floats(1e-6, 1e4)
# steps of a row's clock, in buckets: regular, gaps, repeats, going back, off the grid
STEPS = st.sampled_from([1.0, 1.0, 1.0, 2.0, 5.0, 0.0, -1.0, 0.5])
END_JUMPS = st.sampled_from([0.0, -0.0, 60.0]) | ANY_FLOAT


def bits(x: object) -> object:
    """A field as compared: its type and, for a float, its bits (so -0.0 != 0.0)."""
    if isinstance(x, float):
        return ("float", struct.pack("<d", x))
    return (type(x).__name__, x)


def same(a: CountWindow, b: CountWindow) -> bool:
    return all(bits(getattr(a, f)) == bits(getattr(b, f)) for f in FIELDS)


def same_end(bank_end: float, ring_end: float | None) -> bool:
    if ring_end is None:
        return math.isnan(bank_end)
    return bits(float(bank_end)) == bits(ring_end)


@st.composite
def bucket(
    draw: st.DrawFn, counts: tuple[st.SearchStrategy[int], st.SearchStrategy[int]]
) -> tuple[BucketCounts, float | None]:
    """One closed bucket's counts and expectation."""
    c = BucketCounts(
        n=draw(counts[0]),
        errors=draw(counts[1]),
        tokens=draw(FLOAT),
        tokens_sq=draw(st.sampled_from([0.0, -0.0, 1.0, 1e300])),
        context=draw(st.sampled_from([0.0, -0.0, 0.1, 3.0]) | ANY_FLOAT),
        observed=draw(st.booleans()),
        clustered=draw(counts[1]),
    )
    return c, draw(EXPECTED)


def push(bank: CountBank, rows: list[int], ends: list[float], got: list[Any]) -> None:
    """The pushes of ``got`` (one per row) onto the bank, as lists of Python values."""
    cs = [c for c, _ in got]
    bank.push(
        np.array(rows),
        ends,
        [c.n for c in cs],
        [c.errors for c in cs],
        [c.tokens for c in cs],
        [c.tokens_sq for c in cs],
        [c.context for c in cs],
        [c.observed for c in cs],
        [math.nan if x is None else x for _, x in got],
        [c.clustered for c in cs],
    )


def ending(ring: CountRing, target: float, max_s: float, min_s: float) -> str:
    """How the object's walk ended, by the same walk (for the statistics: every way must
    be exercised)."""
    if not len(ring):
        return "empty ring"
    start, exp, span, k = ring.newest_end() or 0.0, 0.0, 0.0, 0
    o_col, x_col, n_col = ring._cols["observed"], ring._cols["expected"], ring._cols["n"]
    i = ring._head
    for _ in range(len(ring)):
        i = (i - 1) % ring.capacity
        if start - ring._end[i] >= max_s:
            return "break after taking" if k else "break before taking"
        if not o_col[i]:
            continue
        k += 1
        exp += n_col[i] if math.isnan(x_col[i]) else x_col[i]
        span += ring.bucket_s
        if exp >= target and span >= min_s:
            return "stop at target"
    return "ran out on a gap" if not o_col[i] else "ran out on a bucket taken"


def check(
    data: st.DataObject, bank: CountBank, rings: list[CountRing], bs: float, every: bool = False
) -> None:
    """Windows of some rows (every row if asked), in a random order, with random limits,
    equal the objects'."""
    rows = data.draw(st.permutations(range(len(rings))))
    rows = rows if every else rows[: data.draw(st.integers(1, len(rows)))]
    target = data.draw(
        st.sampled_from([0.0, 1.0, 10.0, 40.0, -1.0, math.inf, math.nan]) | st.floats(0, 100)
    )
    max_s = data.draw(
        st.sampled_from([b * bs for b in (0.0, 1.0, 2.5, 3.0, 4.0, 10.0)])
        | st.sampled_from([math.inf, -1.0, math.nan, 600.0])
        | st.floats(0.0, 20.0 * bs)
    )
    min_s = [data.draw(st.sampled_from([0.0, bs, 2 * bs, 3.5 * bs, 1e9])) for _ in rows]
    w = bank.window(np.array(rows, dtype=np.int64), target=target, max_s=max_s, min_s=min_s)
    ends = bank.newest_end(rows)
    for i, row in enumerate(rows):
        want = rings[row].window(target=target, max_s=max_s, min_s=min_s[i])
        assert same(w.one(i), want), (row, w.one(i), want)
        assert same_end(float(ends[i]), rings[row].newest_end())
        event(ending(rings[row], target, max_s, min_s[i]))
        event(f"wrapped: {len(rings[row]) == rings[row].capacity and rings[row]._head != 0}")
        event(f"n dtype {w.n.dtype}")


@given(st.data())
@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
def test_windows_equal_the_ring(data: st.DataObject) -> None:
    cap = data.draw(st.integers(1, 10))
    bs = data.draw(BUCKET_S)
    nrows = data.draw(st.integers(1, 4))
    counts = data.draw(st.sampled_from([SMALL, ANY]))
    bank = CountBank(cap, bs, rows=1)
    bank.reserve(nrows)
    rings = [CountRing(cap, bs) for _ in range(nrows)]
    clocks = [data.draw(st.sampled_from([0.0, 60.0, 1.7e9])) for _ in range(nrows)]
    for _ in range(data.draw(st.integers(0, 24))):
        op = data.draw(st.sampled_from(["push"] * 6 + ["reset", "check"]))
        if op == "check":
            check(data, bank, rings, bs)
            continue
        rows = data.draw(st.lists(st.integers(0, nrows - 1), min_size=1, unique=True))
        if op == "reset":
            bank.reset(rows)
            for row in rows:
                rings[row] = CountRing(cap, bs)
            continue
        ends = []
        for row in rows:
            if data.draw(st.integers(0, 15)) == 0:
                clocks[row] = data.draw(END_JUMPS)
            else:
                clocks[row] += data.draw(STEPS) * bs
            ends.append(clocks[row])
        got = [data.draw(bucket(counts)) for _ in rows]
        push(bank, rows, ends, got)
        for row, end, (c, x) in zip(rows, ends, got, strict=True):
            rings[row].push(end, c, x)
    check(data, bank, rings, bs, every=True)
    for row in range(nrows):  # exact state copies, both ways
        assert_same_state(ring_of(bank, row), rings[row])
    copy = CountBank(cap, bs, rows=nrows + 2)
    order = list(range(nrows))[::-1]
    copy.load([r + 2 for r in order], bank.dump(order))
    for row in range(nrows):
        adopt_ring(copy, row, rings[row])
        assert_same_state(ring_of(copy, row), rings[row])
        assert_same_state(ring_of(copy, row + 2), rings[row])


def assert_same_state(a: CountRing, b: CountRing) -> None:
    assert (a.capacity, a.bucket_s, a._head, a._len) == (b.capacity, b.bucket_s, b._head, b._len)
    assert a._end.tobytes() == b._end.tobytes()
    for name, col in b._cols.items():
        assert a._cols[name].tobytes() == col.tobytes(), name


def ring_and_bank(
    buckets: Sequence[tuple[float, BucketCounts, float | None]], cap: int = 10, bs: float = 60.0
) -> tuple[CountRing, CountBank]:
    ring, bank = CountRing(cap, bs), CountBank(cap, bs, rows=1)
    for end, c, x in buckets:
        ring.push(end, c, x)
        push(bank, [0], [end], [(c, x)])
    return ring, bank


UNSEEN = BucketCounts(n=5, observed=False)


def test_a_break_after_taking_starts_the_window_at_the_breaking_bucket() -> None:
    """The object's ``first`` is from the last bucket *visited*: where the walk breaks at
    ``max_s`` after taking buckets, that is the bucket it did not take (the bank agrees)."""
    ring, bank = ring_and_bank([(60.0 * m, BucketCounts(n=1), 1.0) for m in range(1, 6)])
    want = ring.window(target=100.0, max_s=120.0)
    assert (want.buckets, want.span_s) == (2, 120.0)  # the buckets ending at 300 and 240
    assert want.start == 120.0  # not 180.0: the start of the bucket ending at 180
    assert same(bank.window([0], target=100.0, max_s=120.0).one(0), want)


def test_trailing_gaps_start_the_window_at_the_oldest_gap() -> None:
    """A walk that runs out on unobserved buckets starts at the oldest of them."""
    old = [(60.0, UNSEEN, 1.0), (120.0, UNSEEN, None)]
    ring, bank = ring_and_bank([*old, (180.0, BucketCounts(n=2), math.nan)])
    want = ring.window(target=100.0, max_s=1e9)
    assert (want.buckets, want.n, want.expected, want.unexpected) == (1, 2, 2.0, 1)
    assert want.start == 0.0  # the gap ending at 60, not the bucket ending at 180
    assert same(bank.window([0], target=100.0, max_s=1e9).one(0), want)


@pytest.mark.parametrize("newest", [0.0, -0.0])
def test_a_newest_end_of_zero_is_a_start_of_positive_zero(newest: float) -> None:
    ring, bank = ring_and_bank([(-60.0, UNSEEN, None), (newest, UNSEEN, None)])
    want = ring.window(target=1.0, max_s=1e9)
    assert bits(want.start) == bits(0.0)
    assert same(bank.window([0], target=1.0, max_s=1e9).one(0), want)
    assert same_end(float(bank.newest_end([0])[0]), ring.newest_end())


def test_an_empty_row() -> None:
    ring, bank = ring_and_bank([])
    assert same(bank.window([0], target=1.0, max_s=1e9).one(0), ring.window(target=1, max_s=1e9))
    assert math.isnan(bank.newest_end([0])[0])


def test_counts_past_int64_sum_exactly() -> None:
    big = [2**63 - 1, 2**63 - 1, 2**64 + 1, -(2**63)]
    ring, bank = ring_and_bank(
        [(60.0 * (m + 1), BucketCounts(n=v), None) for m, v in enumerate(big)]
    )
    want = ring.window(target=math.inf, max_s=1e9)
    w = bank.window([0], target=math.inf, max_s=1e9)
    assert same(w.one(0), want)
    assert want.n == 2**63 + 2**63 + 2**64 - 2**63  # each rounded to a double, then summed


def test_spans_are_added_not_multiplied() -> None:
    """0.1 added three times is not 3 * 0.1 in every case; the bank adds as the object."""
    pushes = [(0.1 * m, BucketCounts(n=1), 1.0) for m in range(1, 11)]
    ring, bank = ring_and_bank(pushes, bs=0.1)
    for k in range(11):
        want = ring.window(target=float(k), max_s=1e9)
        assert same(bank.window([0], target=float(k), max_s=1e9).one(0), want)


def test_many_rows_in_one_call_wrap_independently() -> None:
    bank = CountBank(3, 60.0, rows=2)
    bank.reserve(40)
    rings = [CountRing(3, 60.0) for _ in range(40)]
    for m in range(1, 8):
        rows = [r for r in range(40) if (r + m) % 3]
        c = [BucketCounts(n=r * m, tokens=0.1 * r, observed=bool((r * m) % 4)) for r in rows]
        x = [None if (r + m) % 5 == 0 else 0.7 * r for r in rows]
        push(bank, rows, [60.0 * m] * len(rows), list(zip(c, x, strict=True)))
        for r, ci, xi in zip(rows, c, x, strict=True):
            rings[r].push(60.0 * m, ci, xi)
    w = bank.window(np.arange(40), target=5.0, max_s=150.0, min_s=np.full(40, 60.0))
    assert len(w) == 40
    for r in range(40):
        assert same(w.one(r), rings[r].window(target=5.0, max_s=150.0, min_s=60.0))


def test_bad_arguments_change_nothing() -> None:
    _, bank = ring_and_bank([(60.0, BucketCounts(n=3), 2.0)])
    before = bank.dump([0])
    args = (60.0, 1, 0, 0.0, 0.0, 0.0, True, 1.0, 0)
    with pytest.raises(ValueError, match="distinct"):
        bank.push([0, 0], *args)
    with pytest.raises(ValueError, match="rows must be in"):
        bank.push([1], *args)
    with pytest.raises(ValueError, match="rows must be in"):
        bank.window([-1], target=1.0, max_s=1.0)
    with pytest.raises(ValueError, match="whole"):
        bank.push([0], 60.0, 2.5, 0, 0.0, 0.0, 0.0, True, 1.0, 0)
    with pytest.raises(ValueError, match="whole"):
        bank.push([0], 60.0, 1, math.nan, 0.0, 0.0, 0.0, True, 1.0, 0)
    with pytest.raises(ValueError):
        CountBank(0, 60.0)
    assert bank.dump([0]) == before


def corrupt(data: dict[str, Any], key: str, value: object) -> dict[str, Any]:
    return {**data, key: value}


def test_load_validates_before_changing_anything() -> None:
    _, bank = ring_and_bank([(60.0 * m, BucketCounts(n=m), 2.0) for m in range(1, 14)])
    data = bank.dump([0])
    other = CountBank(10, 60.0, rows=1)
    _, target = ring_and_bank([(60.0, BucketCounts(n=7), 1.0)])
    before = target.dump([0])
    head = np.frombuffer(data["head"], "<i8")[0]
    bad = [
        "not a dict",
        corrupt(data, "capacity", 9),
        corrupt(data, "capacity", 10.0),
        corrupt(data, "bucket_s", 30.0),
        corrupt(data, "format", 2),
        corrupt(data, "rows", 2),
        corrupt(data, "end", data["end"][:-1]),
        corrupt(data, "n", list(data["n"])),
        corrupt(data, "observed", b"\x02" * 10),
        corrupt(data, "head", np.int64(10).tobytes()),
        corrupt(data, "len", np.int64(11).tobytes()),
        corrupt(data, "n", np.full(10, 0.5).tobytes()),
        corrupt(data, "errors", np.full(10, math.inf).tobytes()),
        {k: v for k, v in data.items() if k != "expected"},
    ]
    for each in bad:
        with pytest.raises(ValueError):
            target.load([0], each)  # type: ignore[arg-type]
    part = CountBank(10, 60.0, rows=1)
    part.push([0], 60.0, 1, 0, 0.0, 0.0, 0.0, True, 1.0, 0)
    loose = part.dump([0])
    with pytest.raises(ValueError, match="head != len"):
        target.load([0], corrupt(loose, "head", np.int64(0).tobytes()))
    with pytest.raises(ValueError, match="beyond len"):
        target.load([0], corrupt(loose, "n", np.ones(10).tobytes()))
    assert target.dump([0]) == before
    assert head == 3
    other.load([0], data)
    assert other.dump([0]) == data


def test_adopt_refuses_another_ring() -> None:
    bank = CountBank(10, 60.0, rows=1)
    with pytest.raises(ValueError):
        adopt_ring(bank, 0, CountRing(9, 60.0))
    with pytest.raises(ValueError):
        adopt_ring(bank, 0, CountRing(10, 30.0))
    ring = CountRing(10, 60.0)
    ring.push(60.0, BucketCounts(n=2.5), 1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="whole"):
        adopt_ring(bank, 0, ring)


def test_reserve_keeps_rows_and_nbytes_counts_them() -> None:
    ring, bank = ring_and_bank([(60.0, BucketCounts(n=3), 2.0)], cap=90)
    small = bank.nbytes()
    bank.reserve(1000)
    assert bank.rows >= 1000
    assert same(bank.window([0], target=1.0, max_s=1e9).one(0), ring.window(target=1, max_s=1e9))
    per_row = (bank.nbytes() - small) / (bank.rows - 1)
    assert per_row == 8 * (8 * 8 + 1) + 2 * 8  # the columns the longest ring needs so far


def test_columns_grow_with_the_longest_ring_up_to_capacity() -> None:
    """A new series holds one bucket: its row takes the columns the longest ring needs
    (8 at first), not ``capacity``; they widen as rings grow, and rings wrap only once
    they reach capacity: the windows of the object ring all along."""
    ring, bank = CountRing(90, 60.0), CountBank(90, 60.0, rows=3)
    for k in range(200):
        c = BucketCounts(n=k % 7, errors=k % 2, tokens=10.0 * k)
        ring.push(60.0 * (k + 1), c, 5.0)
        bank.push([1], [60.0 * (k + 1)], [c.n], [c.errors], [c.tokens], [0.0], [0.0], [True],
                  [5.0], [0])  # fmt: skip
        if k in (0, 7, 8, 20, 89, 90, 199):
            for target in (1.0, 30.0, 1e9):
                got = bank.window([1, 0], target=target, max_s=1e9).one(0)
                assert same(got, ring.window(target=target, max_s=1e9))
    assert bank.nbytes() == 3 * (90 * (8 * 8 + 1) + 2 * 8) + 91 * 8
