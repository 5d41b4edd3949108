"""Tail windows: the latency values of a request series' newest buckets, and the quantiles
and shares its latency signals are taken from.

A minute of a quiet service holds one or two requests; a P99 of them is not a P99. So
:class:`TailWindow` keeps latency values of the newest buckets: the tails (P95, P99) are
taken over the last ``min_values`` requests or the last ``min_s`` seconds, whichever holds
more, never more than ``max_s`` back; a quantile needs :data:`MIN_VALUES` values (10 for a
P50, 40 for a P95, 100 for a P99) or it is unknown. The counts and sums that rates and
means need are windowed the same way in :mod:`~ragwatch.detectors.counts`, and the
baselines of the window quantiles are :mod:`~ragwatch.detectors.latency`'s.

>>> quantile([1.0, 2.0, 3.0, 4.0], 0.5)
2.5
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

QUANTILES = (("p50", 0.50), ("p95", 0.95), ("p99", 0.99))
# the fewest values a quantile is taken from: below, the signal is unknown (None)
MIN_VALUES = {"p50": 10, "p95": 40, "p99": 100}


def quantile(sorted_values: list[float], q: float) -> float | None:
    """The ``q`` quantile, linear between closest ranks (numpy's default); None if empty."""
    if not sorted_values:
        return None
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


TRIM_MIN = 64  # values: what may sit before a window's start before it is dropped ...
TRIM_SHARE = 4  # ... or this fraction of the values held, whichever is more


@dataclass
class TailWindow:
    """Latency values of the newest buckets, by name (e2e, retriever, ..., ttft, queue).

    Per name, the values in arrival order, in runs of one bucket each (the run's bucket and
    the index of its first value), so a window is a suffix found by bisection, whatever the
    traffic: the last ``min_values`` values (whole buckets) or the last ``min_s`` seconds,
    whichever holds more, never a bucket ``max_s`` old or older. Values no window can reach
    again are dropped once they are ``TRIM_MIN`` or a ``TRIM_SHARE``-th of those held."""

    min_values: int = 200
    min_s: float = 120.0
    max_s: float = 3 * 3600.0
    bucket_s: float = 60.0
    _vals: dict[str, array[float]] = field(default_factory=dict)
    _runs: dict[str, array[int]] = field(default_factory=dict)  # each run's bucket (end / bucket_s)
    _starts: dict[str, array[int]] = field(default_factory=dict)  # each run's first value
    seen: dict[str, int] = field(default_factory=dict)  # values ever added, by name
    version: int = 0  # changes whenever values are added or dropped
    cache: tuple[int, bool, dict[str, float | None]] | None = None  # tail_signals'
    newest: float = -math.inf  # end of the newest bucket that added values
    expiry: float = -math.inf  # until when tail_signals' cache may stand (see there)

    def __setstate__(self, state: dict[str, object]) -> None:
        buckets = state.pop("_buckets", None)
        self.__dict__.update(state)
        if isinstance(buckets, dict):  # snapshot version 5: each value's bucket
            self._runs, self._starts = {}, {}
            for name, each in buckets.items():
                runs, starts = self._runs[name], self._starts[name] = array("q"), array("q")
                for i, b in enumerate(each):
                    if not runs or runs[-1] != b:
                        runs.append(b)
                        starts.append(i)

    def push(self, end: float, values: dict[str, Iterable[float]]) -> None:
        """Add one closed bucket's values (an empty bucket adds nothing), then drop what
        no window needs any more."""
        b = round(end / self.bucket_s)
        for name, vs in values.items():
            a = array("d", vs)
            if not a:
                continue
            vals = self._vals.get(name)
            if vals is None:
                vals = self._vals[name] = array("d")
                self._runs[name], self._starts[name] = array("q"), array("q")
            runs = self._runs[name]
            if not runs or runs[-1] != b:
                runs.append(b)
                self._starts[name].append(len(vals))
            vals.extend(a)
            self.seen[name] = self.seen.get(name, 0) + len(a)
            self.version += 1
            self.newest = end
        self._trim(end)

    def values(self, name: str, now: float) -> list[float]:
        """The window's values of ``name``, sorted."""
        return sorted(self.window(name, now))

    def window(self, name: str, now: float) -> array[float]:
        """The window's values of ``name``, in arrival order."""
        vals = self._vals.get(name)
        if vals is None:
            return array("d")
        return vals[self._start(name, now) :]

    def _after(self, name: str, bucket: int) -> int:
        """The index of the first value of ``name`` from a bucket after ``bucket``."""
        runs, starts = self._runs[name], self._starts[name]
        r = bisect.bisect_right(runs, bucket)
        return starts[r] if r < len(starts) else len(self._vals[name])

    def recent(self, name: str, now: float, min_values: int) -> array[float]:
        """The newest values of ``name``, in arrival order: the last ``min_values`` (whole
        buckets) or the last ``min_s`` seconds, whichever holds more; never more than
        the window. For a statistic that needs fewer values than the tails (a median)
        and should follow a change sooner."""
        vals = self._vals.get(name)
        if vals is None:
            return array("d")
        return vals[max(self._start(name, now), self._start(name, now, min_values)) :]

    def _start(self, name: str, now: float, min_values: int | None = None) -> int:
        n, bs = len(self._vals[name]), self.bucket_s
        least = self.min_values if min_values is None else min_values
        young = self._after(name, math.floor((now - self.min_s) / bs + 1e-9))
        if n > least:  # the whole bucket of the least-th newest value
            starts = self._starts[name]
            start = min(young, starts[bisect.bisect_right(starts, n - least) - 1])
        else:
            start = 0
        return max(start, self._after(name, math.floor((now - self.max_s) / bs + 1e-9)))

    def _trim(self, now: float) -> None:
        """Drop the values no window can reach again (windows only move forward; a cut is
        always where a run starts)."""
        for name in list(self._vals):
            vals, runs, starts = self._vals[name], self._runs[name], self._starts[name]
            cut = self._start(name, now)
            if cut >= max(TRIM_MIN, len(vals) // TRIM_SHARE):
                del vals[:cut]
                r = bisect.bisect_left(starts, cut)
                del runs[:r], starts[:r]
                for i in range(len(starts)):
                    starts[i] -= cut
                self.version += 1
            if not vals:
                del self._vals[name], self._runs[name], self._starts[name]


def tail_signals(window: TailWindow, now: float, out: dict[str, float | None]) -> None:
    """Quantiles and stage shares over the tail window (unknown below ``MIN_VALUES``).

    Computed again only when the window may have changed: values were added or dropped
    (a quiet minute adds none), its newest values are still younger than ``min_s``
    (ageing past it may end the window sooner), or its oldest are about to be ``max_s``
    old (:attr:`TailWindow.expiry`). Otherwise the last result stands."""
    cached = window.cache
    if cached is not None and cached[0] == window.version and cached[1] and now < window.expiry:
        out.update(cached[2])
        return
    got: dict[str, float | None] = {}
    _tail_signals(window, now, got)
    window.cache = (window.version, now - window.newest >= window.min_s, got)
    window.expiry = _expiry(window, now)
    out.update(got)


def _expiry(window: TailWindow, now: float) -> float:
    """When the oldest bucket in any of the window's names at ``now`` is ``max_s`` old and
    leaves it (a little before: the cut's rounding), changing its quantiles with no value
    added or dropped."""
    out = math.inf
    for name, vals in window._vals.items():
        start = window._start(name, now)
        if start < len(vals):
            starts = window._starts[name]
            b = window._runs[name][bisect.bisect_right(starts, start) - 1]
            out = min(out, (b - 1e-6) * window.bucket_s + window.max_s)
    return out


def _tail_signals(window: TailWindow, now: float, out: dict[str, float | None]) -> None:
    xs = {name: _sorted(window.window(name, now)) for name in (*LATENCIES, "ttft", "queue")}
    e2e = xs["e2e"]
    enough = len(e2e) >= MIN_VALUES["p50"]
    for name in LATENCIES:
        v = xs[name]
        for q, p in QUANTILES:
            out[f"{name}_{q}_ms"] = _quantile(v, p) if len(v) >= MIN_VALUES[q] else None
        if name != "e2e":
            out[f"{name}_share"] = _share(v, e2e) if enough and len(v) else None
    for name in ("ttft", "queue"):
        v = xs[name]
        out[f"{name}_p95_ms"] = _quantile(v, 0.95) if len(v) >= MIN_VALUES["p95"] else None


LATENCIES = ("e2e", "retriever", "reranker", "llm")


def _share(part: npt.NDArray[np.float64], whole: npt.NDArray[np.float64]) -> float | None:
    """sum(part) / sum(whole) of two sorted arrays, summed in units of their largest value:
    latencies near the float maximum (all finite, all accepted) cannot overflow to inf."""
    scale = max(float(part[-1]), float(whole[-1]))
    if not scale > 0:
        return None
    total = float((whole / scale).sum())
    return float((part / scale).sum()) / total if total > 0 else None


def _sorted(values: array[float]) -> npt.NDArray[np.float64]:
    return np.sort(np.frombuffer(values, dtype=np.float64)) if len(values) else np.empty(0)


def _quantile(sorted_values: npt.NDArray[np.float64], q: float) -> float:
    """:func:`quantile` of a sorted numpy array (linear between closest ranks)."""
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    a, b = float(sorted_values[lo]), float(sorted_values[hi])
    return a + (b - a) * (pos - lo)
