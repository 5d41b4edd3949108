"""Replica outliers: each member of a peer group compared with its peers, robustly, in arrays.

A series compared only with its own past follows a slow drift: one of six replicas behind a
load balancer that creeps to 3x their retrieval latency over hours moves its own baseline
with it and never pages, while its siblings show plainly that it is wrong. This detector
compares the members of a *group* (a service's instances; like GPUs: same model and pod
template) with one another on one *signal* at a time (retrieval P99, decode speed,
tokens per request, error ratio; memory growth, utilisation, power, temperature), as the
MAD outlier monitors of Datadog and Grafana do.

Per update, for one group and one signal at event time ``t``, the current value of each
member (NaN or another non-finite value: unknown). For each member with a known value,
against its *peers* (the group's other known members, itself excluded, so a member
cannot drag its own reference):

* ``peer_median``: the median of the peers; ``ratio``: value / peer median (NaN where
  that median is 0);
* ``z``: (value - peer median) / scale, with the robust scale
  ``max(1.4826 * MAD of the peers, rel_floor * |peer median|, abs_floor)``: the floors
  keep a tight group (six replicas within 1 % of one another) from turning noise into
  large z (``abs_floor`` is in the signal's units: set it per signal);
* ``deviant``: at least ``min_members`` members are known (3 at least: in a group of two
  which one is wrong is unknowable, so it never flags), ``|z| >= z_min`` and the relative
  difference ``|value - peer median| >= rel_min * |peer median|``, both in the signal's
  ``direction`` ("high": above the peers, for latency; "low": below, for decode speed;
  "both");
* ``outlier``: deviant continuously for at least ``for_s`` of event time. Each member
  keeps the event time its current streak began (``since``). A member judged not
  deviant ends its streak. An update where the member is not judged (its value unknown,
  it is absent from the update, or fewer than ``min_members`` are known) neither extends
  nor ends it, unless it lasts more than ``gap_s``: a member judged again after a longer
  gap starts a new streak.

An update older than the group's last for that signal is *late*: it is scored, changes
nothing, flags nothing, and is counted (:attr:`ReplicaBank.late`). Members come and go:
a member absent from an update keeps its state; :meth:`ReplicaBank.forget_member`,
:meth:`ReplicaBank.forget` (a whole group) and :meth:`ReplicaBank.prune` (every member
without a known value since a time: pods replaced by a rollout) free its row.

Layout: a row per (group, signal, member), its state in arrays (``value``: last known,
``seen``: when it was last known, ``judged``: when last judged, ``since``: NaN outside a
streak); dicts map group -> signal -> member -> row; freed rows are reused and the
arrays double when full. Cost of an update of ``k`` members: the peers' medians and MADs
of every member at once from the sorted values (:func:`peer_stats`: a member's peers are
the sorted values less one, so their median and MAD are order statistics found by position,
O(k log k)), a few array operations. ``tests/reference/replicas.py`` is the specification
(loops, ``statistics.median``), held to this bank by ``tests/unit/test_replicas.py``.

Why no river one-row view (``learn_one``/``score_one``): the protocol's ``x`` is one
series' ``{"value", "t"}``, and a member's score depends on its peers' values at the same
time; a dict of the whole group would not pass the contract's single-series checks
(constant input, missing features) in any meaningful way. :class:`ReplicaGroup` is the
convenience for one group on one signal.

Parameters (:class:`ReplicaParams`, defaults for every signal, overridable per signal):
``direction`` ("both"), ``min_members`` (3), ``z_min`` (4.0), ``rel_min`` (0.5),
``rel_floor`` (0.1), ``abs_floor`` (0.0), ``for_s`` (1800.0), ``gap_s`` (900.0).

>>> bank = ReplicaBank(signals={"retrieval_p99_ms": ReplicaParams("high", for_s=600.0)})
>>> pods = ["rag-api-0", "rag-api-1", "rag-api-2", "rag-api-3"]
>>> for minute in range(11):       # rag-api-1 at 3x its peers' latency for ten minutes
...     s = bank.update("rag-api", "retrieval_p99_ms", 60.0 * minute, pods,
...                     [101.0, 300.0, 98.0, 100.0])
>>> s.peer_median.tolist(), s.ratio.round(2).tolist()
([100.0, 100.0, 101.0, 101.0], [1.01, 3.0, 0.97, 0.99])
>>> s.z.round(1).tolist()
[0.1, 20.0, -0.3, -0.1]
>>> s.flagged(), s.since.tolist()
(['rag-api-1'], [nan, 0.0, nan, nan])
>>> bank.update("rag-api", "retrieval_p99_ms", 660.0, pods[:2], [101.0, 300.0]).flagged()
[]
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]
Idx = npt.NDArray[np.intp]
Direction = Literal["high", "low", "both"]
DIRECTIONS = ("high", "low", "both")
MAD_TO_SD = 1.4826  # the MAD of a normal sample times this estimates its standard deviation


@dataclass(frozen=True, slots=True)
class ReplicaParams:
    """When a member is an outlier among its peers (see the module); ValueError names a
    bad parameter."""

    direction: Direction = "both"
    min_members: int = 3  # known members an update needs before anyone is judged
    z_min: float = 4.0  # robust z: 4 sd of the peers' spread, ~1 in 16,000 for normal noise
    rel_min: float = 0.5  # and 50 % away from the peers' median: a difference worth a page
    rel_floor: float = 0.1  # the scale is at least 10 % of the peers' median ...
    abs_floor: float = 0.0  # ... and at least this much, in the signal's units
    for_s: float = 1800.0  # deviant this long (event time) before it is an outlier
    gap_s: float = 900.0  # unjudged longer than this: a streak starts again

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, got {self.direction!r}")
        if self.min_members < 3:
            raise ValueError(f"min_members must be >= 3, got {self.min_members!r}")
        if not (math.isfinite(self.z_min) and self.z_min > 0):
            raise ValueError(f"z_min must be finite and > 0, got {self.z_min!r}")
        for name in ("rel_min", "rel_floor", "abs_floor", "for_s", "gap_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {v!r}")


@dataclass(frozen=True, slots=True)
class ReplicaScore:
    """One member at one update, in plain floats (``since`` None outside a streak)."""

    member: str
    value: float
    peer_median: float
    ratio: float
    z: float
    deviant: bool
    outlier: bool
    since: float | None


@dataclass(frozen=True, slots=True, eq=False)
class ReplicaScores:
    """The members of one update, an array per field in the order given (NaN where the
    member's value is unknown or it has fewer than one known peer); ``known``: how many
    members had a known value."""

    group: str
    signal: str
    t: float
    members: tuple[str, ...]
    value: F64
    peer_median: F64
    ratio: F64
    z: F64
    deviant: Bools
    outlier: Bools
    since: F64
    known: int

    def __len__(self) -> int:
        return len(self.members)

    def one(self, i: int) -> ReplicaScore:
        """Member ``i`` (its index in the update) in plain floats."""
        since = float(self.since[i])
        return ReplicaScore(
            self.members[i],
            float(self.value[i]),
            float(self.peer_median[i]),
            float(self.ratio[i]),
            float(self.z[i]),
            bool(self.deviant[i]),
            bool(self.outlier[i]),
            None if math.isnan(since) else since,
        )

    def flagged(self) -> list[str]:
        """The members that are outliers, in the update's order."""
        return [self.members[i] for i in np.flatnonzero(self.outlier)]


def peer_stats(x: F64) -> tuple[F64, F64]:
    """For each element of ``x`` (finite values, at least two), the median of the *other*
    elements and their median absolute deviation from it.

    >>> med, mad = peer_stats(np.array([1.0, 2.0, 3.0, 10.0]))
    >>> med.tolist(), mad.tolist()
    ([3.0, 3.0, 2.0, 2.0], [1.0, 2.0, 1.0, 1.0])
    """
    k = len(x)
    if k < 2:
        raise ValueError(f"peer_stats needs at least two values, got {k}")
    order = np.argsort(x, kind="stable")
    s = x[order]
    med, mad = np.empty(k), np.empty(k)
    lo, hi = _middle(np.arange(k), k - 1)  # each one's peers' middle two, as positions in s
    pairs = lo * k + hi
    for pair in np.unique(pairs).tolist():  # at most 3 distinct
        at = np.flatnonzero(pairs == pair)
        centre = s[pair // k] / 2 + s[pair % k] / 2  # (a + b) / 2 overflows near 1.8e308
        med[at] = centre
        dev = np.abs(s - centre)
        dorder = np.argsort(dev, kind="stable")
        rank = np.empty(k, dtype=np.intp)
        rank[dorder] = np.arange(k)
        sorted_dev = dev[dorder]
        dlo, dhi = _middle(rank[at], k - 1)  # the peers' deviations less its own
        mad[at] = (sorted_dev[dlo] + sorted_dev[dhi]) / 2
    out_med, out_mad = np.empty(k), np.empty(k)
    out_med[order], out_mad[order] = med, mad
    return out_med, out_mad


def _middle(skip: Idx, m: int) -> tuple[Idx, Idx]:
    """The positions, in a sorted array of ``m + 1`` values, of the two middle values (the
    same one when ``m`` is odd) of the ``m`` left when the value at ``skip`` is taken out."""
    lo, hi = (m - 1) // 2, m // 2
    return np.where(skip > lo, lo, lo + 1), np.where(skip > hi, hi, hi + 1)


def judge(values: F64, p: ReplicaParams) -> tuple[F64, F64, F64, Bools]:
    """Peer median, ratio, robust z and whether deviant, for each member of one update
    (``values``: NaN or any non-finite value is unknown; see the module for the rules).

    >>> med, ratio, z, dev = judge(np.array([100.0, 160.0, np.nan, 98.0, 102.0]),
    ...                            ReplicaParams())
    >>> z.round(2).tolist(), dev.tolist()
    ([-0.2, 6.0, nan, -0.39, 0.2], [False, True, False, False, False])
    """
    n = len(values)
    med, ratio, z = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
    dev = np.zeros(n, dtype=np.bool_)
    known = np.flatnonzero(np.isfinite(values))
    if len(known) < 2:
        return med, ratio, z, dev
    v = values[known]
    m, mad = peer_stats(v)
    scale = np.maximum(np.maximum(MAD_TO_SD * mad, p.rel_floor * np.abs(m)), p.abs_floor)
    diff = v - m
    with np.errstate(divide="ignore", invalid="ignore"):
        zk = np.where(diff == 0, 0.0, diff / scale)  # scale 0: +-inf unless no difference
        rk = np.where(m == 0, np.nan, v / m)
    big = np.abs(diff) >= p.rel_min * np.abs(m)
    high, low = (zk >= p.z_min) & (diff > 0), (zk <= -p.z_min) & (diff < 0)
    side = high if p.direction == "high" else low if p.direction == "low" else high | low
    med[known], ratio[known], z[known] = m, rk, zk
    dev[known] = side & big & (len(known) >= p.min_members)
    return med, ratio, z, dev


@dataclass(slots=True)
class _Panel:
    """One group on one signal: its members' rows and the event time of its last update."""

    t: float
    rows: dict[str, int] = field(default_factory=dict)


class ReplicaBank:
    """Replica outliers of many groups, signals and members, a row per (group, signal,
    member) (see the module). ``params`` are every signal's defaults, ``signals`` the
    parameters of named signals; ``capacity``: rows allocated at first (they double)."""

    def __init__(
        self,
        params: ReplicaParams | None = None,
        signals: Mapping[str, ReplicaParams] | None = None,
        capacity: int = 64,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity!r}")
        self.params = ReplicaParams() if params is None else params
        self.signals = dict(signals or {})
        self.late = 0  # updates older than their group's last on that signal, ignored
        self._groups: dict[str, dict[str, _Panel]] = {}
        self._keys: list[tuple[str, str, str] | None] = [None] * capacity
        self._free = list(range(capacity - 1, -1, -1))  # popped from the end: lowest first
        self._value, self._seen = np.full(capacity, np.nan), np.full(capacity, np.nan)
        self._judged, self._since = np.full(capacity, np.nan), np.full(capacity, np.nan)

    def params_for(self, signal: str) -> ReplicaParams:
        """The parameters ``signal`` is judged by."""
        return self.signals.get(signal, self.params)

    @property
    def capacity(self) -> int:
        return len(self._keys)

    @property
    def rows(self) -> int:
        """Rows in use: (group, signal, member) triples held."""
        return self.capacity - len(self._free)

    @property
    def nbytes(self) -> int:
        """Bytes of the state arrays."""
        return sum(a.nbytes for a in (self._value, self._seen, self._judged, self._since))

    def members(self, group: str, signal: str) -> tuple[str, ...]:
        """The members held for ``group`` on ``signal``, in the order they first came."""
        panel = self._groups.get(group, {}).get(signal)
        return () if panel is None else tuple(panel.rows)

    def last_value(self, group: str, signal: str, member: str) -> float:
        """The member's last known value on ``signal`` (NaN if none or not held)."""
        panel = self._groups.get(group, {}).get(signal)
        row = None if panel is None else panel.rows.get(member)
        return math.nan if row is None else float(self._value[row])

    def update(
        self,
        group: str,
        signal: str,
        t: float,
        members: Sequence[str],
        values: npt.ArrayLike,
    ) -> ReplicaScores:
        """Judge one group on one signal at event time ``t``: ``values[i]`` is member
        ``members[i]``'s (NaN: unknown). Members must be distinct."""
        t, names = float(t), tuple(members)
        v = np.asarray(values, dtype=np.float64).reshape(-1)
        if not math.isfinite(t):
            raise ValueError(f"t must be finite, got {t!r}")
        if len(v) != len(names) or len(set(names)) != len(names):
            raise ValueError(f"need distinct members, one value each: {names!r}, {len(v)} values")
        p = self.params_for(signal)
        med, ratio, z, dev = judge(v, p)
        known = np.isfinite(v)
        panel = self._groups.get(group, {}).get(signal)
        if panel is not None and t < panel.t:
            self.late += 1
            none = np.zeros(len(v), dtype=np.bool_)
            return ReplicaScores(group, signal, t, names, v, med, ratio, z, dev, none,
                                 np.full(len(v), np.nan), int(known.sum()))  # fmt: skip
        rows = self._rows(group, signal, names, t)
        self._value[rows[known]], self._seen[rows[known]] = v[known], t
        judged = known & (int(known.sum()) >= p.min_members)
        since = self._streak(rows, judged, dev, t, p.gap_s)
        outlier = dev & (t - since >= p.for_s)
        return ReplicaScores(group, signal, t, names, v, med, ratio, z, dev, outlier, since,
                             int(known.sum()))  # fmt: skip

    def _rows(self, group: str, signal: str, names: tuple[str, ...], t: float) -> Idx:
        """The members' rows (new members get fresh ones); the panel's time moves to ``t``."""
        panel = self._groups.setdefault(group, {}).setdefault(signal, _Panel(t))
        panel.t = t
        out = np.empty(len(names), dtype=np.intp)
        for i, name in enumerate(names):
            row = panel.rows.get(name)
            if row is None:
                row = panel.rows[name] = self._alloc((group, signal, name))
                self._seen[row] = t
            out[i] = row
        return out

    def _streak(self, rows: Idx, judged: Bools, dev: Bools, t: float, gap_s: float) -> F64:
        """Start, keep or end the judged members' streaks; every member's ``since``."""
        r, d = rows[judged], dev[judged]
        since = self._since[r]
        fresh = t - self._judged[r] <= gap_s  # False for a member never judged (NaN)
        self._since[r] = np.where(d, np.where(np.isnan(since) | ~fresh, t, since), np.nan)
        self._judged[r] = t
        out: F64 = self._since[rows]
        return out

    def _alloc(self, key: tuple[str, str, str]) -> int:
        if not self._free:
            self._grow()
        row = self._free.pop()
        self._keys[row] = key
        return row

    def _grow(self) -> None:
        n = self.capacity
        self._keys.extend([None] * n)
        self._free.extend(range(2 * n - 1, n - 1, -1))
        for name in ("_value", "_seen", "_judged", "_since"):
            setattr(self, name, np.concatenate([getattr(self, name), np.full(n, np.nan)]))

    def _release(self, row: int) -> None:
        self._keys[row] = None
        self._value[row] = self._seen[row] = self._judged[row] = self._since[row] = np.nan
        self._free.append(row)

    def forget(self, group: str) -> int:
        """Drop a group (every signal and member); how many rows were freed."""
        panels = self._groups.pop(group, {})
        rows = [row for panel in panels.values() for row in panel.rows.values()]
        for row in rows:
            self._release(row)
        return len(rows)

    def forget_member(self, group: str, member: str, signal: str | None = None) -> int:
        """Drop a member of a group on ``signal`` (None: every signal); rows freed."""
        panels = self._groups.get(group, {})
        freed = 0
        for sig in [signal] if signal is not None else list(panels):
            panel = panels.get(sig)
            row = None if panel is None else panel.rows.pop(member, None)
            if panel is None or row is None:
                continue
            self._release(row)
            freed += 1
            if not panel.rows:
                del panels[sig]
        if not panels:
            self._groups.pop(group, None)
        return freed

    def prune(self, before: float) -> int:
        """Drop every member whose value was last known before event time ``before`` (or,
        never known, that came before it); how many rows were freed."""
        stale = np.flatnonzero(self._seen < before)
        for row in stale.tolist():
            key = self._keys[row]
            assert key is not None  # a free row's seen is NaN, never < before
            self.forget_member(key[0], key[2], key[1])
        return len(stale)


class ReplicaGroup:
    """One group on one signal: a :class:`ReplicaBank` of a single group, for a caller
    (a notebook, a test, ``ragwatch replay``) that has one.

    >>> g = ReplicaGroup(ReplicaParams(direction="low", for_s=0.0))
    >>> g.update(0.0, {"gpu-0": 41.0, "gpu-1": 40.0, "gpu-2": 12.0, "gpu-3": 39.5}).flagged()
    ['gpu-2']
    >>> g.update(60.0, {"gpu-0": 41.0, "gpu-2": 12.0}).flagged()   # two known: no verdict
    []
    """

    GROUP, SIGNAL = "group", "signal"

    def __init__(self, params: ReplicaParams | None = None) -> None:
        self.bank = ReplicaBank(params, capacity=8)

    def update(self, t: float, values: Mapping[str, float]) -> ReplicaScores:
        """Judge the members' current ``values`` (member -> value, NaN unknown) at ``t``."""
        return self.bank.update(self.GROUP, self.SIGNAL, t, list(values), list(values.values()))

    def forget_member(self, member: str) -> bool:
        """Drop a member; whether it was held."""
        return self.bank.forget_member(self.GROUP, member, self.SIGNAL) > 0

    @property
    def members(self) -> tuple[str, ...]:
        return self.bank.members(self.GROUP, self.SIGNAL)
