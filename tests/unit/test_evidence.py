"""The tail window of recent latencies: the window its docstring defines, whatever the
traffic, after any number of trims, and from a snapshot of the form before runs."""

from __future__ import annotations

import bisect
import math
import pickle
from array import array

from hypothesis import given, settings
from hypothesis import strategies as st

from ragwatch.detectors.tails import TailWindow

BS = 60.0


class Reference:
    """Every value with its bucket, never dropped; the window by bisection over them."""

    def __init__(self, min_values: int, min_s: float, max_s: float) -> None:
        self.min_values, self.min_s, self.max_s = min_values, min_s, max_s
        self.vals: dict[str, list[float]] = {}
        self.buckets: dict[str, list[int]] = {}

    def push(self, end: float, values: dict[str, list[float]]) -> None:
        for name, vs in values.items():
            self.vals.setdefault(name, []).extend(vs)
            self.buckets.setdefault(name, []).extend([round(end / BS)] * len(vs))

    def window(self, name: str, now: float) -> list[float]:
        vals, buckets = self.vals.get(name, []), self.buckets.get(name, [])
        n = len(vals)
        young = bisect.bisect_right(buckets, math.floor((now - self.min_s) / BS + 1e-9))
        start = 0
        if n > self.min_values:
            start = min(young, bisect.bisect_left(buckets, buckets[n - self.min_values]))
        old = bisect.bisect_right(buckets, math.floor((now - self.max_s) / BS + 1e-9))
        return vals[max(start, old) :]


buckets = st.lists(
    st.tuples(
        st.integers(1, 40),  # minutes since the previous bucket closed
        st.dictionaries(
            st.sampled_from(["e2e", "retriever", "ttft"]),
            st.lists(st.floats(0.0, 1e4, allow_nan=False), max_size=120),
            max_size=3,
        ),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(buckets, st.integers(1, 300), st.sampled_from([60.0, 120.0, 600.0]))
def test_the_window_is_what_the_docstring_says_after_any_trims(
    pushes: list[tuple[int, dict[str, list[float]]]], min_values: int, min_s: float
) -> None:
    tail, ref = (
        TailWindow(min_values, min_s, 3 * 3600.0, BS),
        Reference(min_values, min_s, 3 * 3600.0),
    )
    end = 1_767_225_600.0
    for gap, values in pushes:
        end += gap * BS
        tail.push(end, values)
        ref.push(end, values)
        for name in ("e2e", "retriever", "ttft"):
            assert list(tail.window(name, end)) == ref.window(name, end)
        held = sum(len(v) for v in tail._vals.values())
        window = sum(len(ref.window(name, end)) for name in ("e2e", "retriever", "ttft"))
        assert held <= window + 3 * (64 + 120) + window // 3  # dropped as they leave
    copy = pickle.loads(pickle.dumps(tail))
    assert all(list(copy.window(k, end)) == ref.window(k, end) for k in ("e2e", "ttft"))


def test_a_window_pickled_with_a_bucket_per_value_reads_the_same() -> None:
    """Snapshots of version 5 hold each value's bucket (``_buckets``), not runs."""
    tail = TailWindow(5, 120.0, 3 * 3600.0, BS)
    for minute, values in enumerate([[1.0, 2.0], [], [3.0, 4.0, 5.0], [6.0]]):
        tail.push(60.0 * (minute + 1), {"e2e": values})
    state = dict(vars(tail))
    runs, starts = state.pop("_runs"), state.pop("_starts")
    each = array("i")
    for name in ("e2e",):
        bounds = [*starts[name], len(tail._vals[name])]
        for b, lo, hi in zip(runs[name], bounds, bounds[1:], strict=False):
            each.extend([b] * (hi - lo))
    state["_buckets"] = {"e2e": each}
    old = TailWindow.__new__(TailWindow)
    old.__setstate__(state)
    assert (old._runs, old._starts) == (tail._runs, tail._starts)
    assert (
        list(old.window("e2e", 240.0))
        == list(tail.window("e2e", 240.0))
        == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]  # whole buckets
    )
