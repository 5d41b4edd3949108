"""Windows sized by evidence: what a request series' signals are computed over.

A minute of a quiet service holds one or two requests; a P99 of them is not a P99 and a
25 % drop of them is noise. So the request pipeline does not compute its signals per
bucket but over windows that hold enough requests:

- :class:`CountRing` keeps, per closed bucket, the counts and sums that rates and means
  need (requests, errors, output tokens and their squares, context tokens, whether the
  bucket was observed at all, and how many requests were expected in it when it closed).
  :meth:`CountRing.window` walks back from the newest bucket until the *expected*
  number of requests reaches a target or the span reaches a cap. Expected, not observed:
  choosing the window by what was seen would make a drop pick a longer window than
  normal traffic (a biased test).
- :class:`TailWindow` keeps latency values of the newest buckets: the tails (P95, P99)
  are taken over the last ``min_values`` requests or the last ``min_s`` seconds,
  whichever holds more, never more than ``max_s`` back; a quantile needs
  :data:`MIN_VALUES` values (10 for a P50, 40 for a P95, 100 for a P99) or it is unknown.
- :class:`LatencyBaseline` is a seasonal baseline of a window quantile, fed the quantile
  each time ``entry_values`` new requests have entered the window, held while the
  quantile is more than ``hold`` times the baseline (for up to ``hold_max_s``, then
  accepted as the new normal).
- :func:`count_z` is the standardised difference between an observed and an expected
  count of a compound Poisson process (requests, or tokens carried by requests), with the
  expectation's own uncertainty added: the test behind the throughput rules.

>>> ring = CountRing(capacity=10, bucket_s=60.0)
>>> for minute in range(5):   # 3 requests a minute where 6 were expected
...     ring.push(60.0 * (minute + 1), BucketCounts(n=3, tokens=750.0), expected=6.0)
>>> w = ring.window(target=10.0, max_s=600.0)
>>> w.buckets, w.n, w.expected, w.span_s
(2, 6, 12.0, 120.0)
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ragwatch.detectors.seasonal import SeasonalBaseline

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


# A latency baseline holds (learns nothing while its quantile is above ``hold`` x it) only
# once its window has taken this many values (15 entries): one learnt from the first few
# windows of a series (often a quiet start) can sit 1.4x below the quantile's usual level,
# and a hold that starts then lasts a day (a healthy retriever's P99 "slow" all morning).
TRUST_VALUES = 1500


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
