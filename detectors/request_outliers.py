"""Request outliers: bounded incremental DBSCAN-style density over recent requests.

Each request is a point, by default ``(context_tokens, output_tokens)``. The detector keeps
the last ``window`` points in a ring of doubles plus a grid index of cells of side ``eps``
(each cell its points' coordinates, in arrival order, as doubles too), so the neighbours of
a point are found in its own and the adjacent cells (9 cells in 2-D, ``3**d`` in d
dimensions), and a point leaving the window is dropped from both in O(1) (it is its
cell's oldest). Memory is bounded by ``window`` whatever the stream does: 16 bytes a 2-D
point in the ring, 16 in its cell, a byte in the core-point cache (a full window of
2,000 requests: 80-120 KiB with the cells' own overhead; as tuples of floats it was
about 400 KiB). (river's ``cluster.DBSTREAM``
keeps adding micro-clusters and slows down as they pile up, river#1086; this detector
never holds more than ``window`` points.) The functions over those arrays and cells are
:mod:`~ragwatch.detectors.outlier_grid`'s.

Density follows DBSCAN with the incident analysis' ``eps=128``, ``min_samples=3``:

* a window point is a *core* point when at least ``min_samples`` *other* window points lie
  within ``eps`` of it (Euclidean, in feature units). Note that ``min_samples`` counts
  neighbours, not the point itself as scikit-learn does;
* ``score_one(x)`` is 0.0 when ``x`` has at least ``min_samples`` window points within
  ``eps`` (a dense region, normal). Otherwise, with ``d`` the distance from ``x`` to the
  nearest core point: a *border* point (``d <= eps``) scores ``0.4 * d / eps`` (below
  0.5); a true outlier (``d > eps``) scores ``0.5 + 0.5 * (1 - exp(-(d - eps) / eps))``,
  in (0.5, 1), growing with the distance; with no core point at all it scores 1.0. Rules
  threshold at 0.5. While the window holds fewer than ``warmup`` points every score is 0;
* ``label_one(x)`` names where an outlier sits relative to the window's medians: more
  than 2x the median is "long", less than half is "short", e.g.
  ``"long context, short output"``; None for a normal point;
* ``clusters()`` returns the DBSCAN clusters of the window (connected core points) with
  their centroid and size, largest first, so a stream can notice a new cluster of
  outliers (a few similar outliers stop being outliers once ``min_samples`` of them have
  arrived: they have become a cluster of their own).

Features: ``features`` names the numeric keys to read. With the default ``None`` they are
chosen by the first learned point: ``("context_tokens", "output_tokens")`` when it has
both, else ``("value",)``, the shared univariate convention of the contract checks (a
1-D density over the value in its own units: a constant series is one dense region and
scores 0, a series whose noise is much wider than ``eps`` is all outliers). Every point
needs the features and a finite ``"t"``; a missing feature, a non-numeric or non-finite
value raises ValueError and changes nothing. Other keys are ignored.

Parameters: ``eps`` (128.0), ``min_samples`` (3), ``window`` (2000), ``warmup`` (50),
``features`` (None).

Cost: ``learn_one`` is O(1) (the cell it changes is noted; the ``3**d`` cells around the
cells changed since are marked stale only when core points are next looked for);
``score_one`` stops after ``min_samples`` neighbours for normal points, and for outliers
searches the cached core points (refreshed only in the stale cells it visits).

Batches: a caller that scores then learns a run of request points in turn (an envelope's
requests) can skip most of the per-point work. ``certified(points)`` says, in a few numpy
calls for the whole run, which points would score 0 at their turn anyway: the window then
holds fewer than ``warmup`` points, or ``min_samples`` of its points share the point's
*sub-cell* (side just under ``eps / sqrt(2)``, so any two points in one are within eps),
counting the run's earlier points and the window points that stay until the run's last
turn. ``learn_points(points, keys)`` then learns a run of certified points exactly as
``learn_point`` one at a time would (same window, cells, core-point cache and pickles),
grouping it by cell: the evicted points leave their cells' fronts a cell at a time and
each cell is extended once. The others are scored and learnt as before. On the
simulator's healthy traffic 98.5 % of the points of a full window are certified. The
window's sub-cells are kept beside the ring (8 bytes a point, made by the first
``certified`` call, derived: not pickled); only those of the points learnt since the last
call are computed.

>>> import random
>>> rng = random.Random(0)
>>> det = RequestOutliers()
>>> for i in range(500):
...     det.learn_one({"context_tokens": round(rng.gauss(3000, 200)),
...                    "output_tokens": round(rng.gauss(250, 40)), "t": float(i)})
>>> det.score_one({"context_tokens": 3010, "output_tokens": 240, "t": 500.0})
0.0
>>> odd = {"context_tokens": 12000, "output_tokens": 20, "t": 501.0}
>>> det.score_one(odd) > 0.5
True
>>> det.label_one(odd)
'long context, short output'
>>> [c.size for c in det.clusters()]
[500]
"""

from __future__ import annotations

import functools
import itertools
import math
import statistics
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ragwatch.detectors.base import register
from ragwatch.detectors.outlier_grid import (
    F64,
    I64,
    Key,
    Point,
    around_2d,
    by_cell,
    cyclic,
    earlier,
    leaving,
    linked_groups,
    near_offsets,
    pairs,
    sub_keys,
    tuples,
)

REQUEST_FEATURES = ("context_tokens", "output_tokens")
VALUE_FEATURES = ("value",)
# A core point farther than this many eps is as far as it matters (a score >= 0.975):
# beyond it the nearest-core search need not look, so its cost is bounded by the grid
# around the point, not by how many cells a scattered (or hostile) window occupies.
FAR_EPS = 4
LONG, SHORT = 2.0, 0.5  # x / median above LONG is "long", below SHORT is "short"
# certified()'s sub-cells: side eps / sqrt(2) shrunk by SUB_SHRINK, which absorbs how far
# float division may stretch a sub-cell whose indices are in range
# (:data:`~ragwatch.detectors.outlier_grid.SUB_OUT`).
SUB_SHRINK = 1e-6


@dataclass(frozen=True, slots=True)
class Cluster:
    """One DBSCAN cluster of the window: its core points' centroid (in ``features`` order),
    how many core points it has, the grid cells (side ``eps``) it covers: the cell of one
    core point per sub-cell, so every cell with its core points is at most one away; and
    its core points (for a caller that asks what kind of requests it holds)."""

    centroid: Point
    size: int
    cells: frozenset[Key] = frozenset()
    points: tuple[Point, ...] = field(default=(), compare=False, repr=False)


@register("request_outliers")
class RequestOutliers:
    """Bounded incremental DBSCAN-style outlier detector (see the module docstring)."""

    def __init__(
        self,
        eps: float = 128.0,
        min_samples: int = 3,
        window: int = 2000,
        warmup: int = 50,
        features: Sequence[str] | None = None,
    ) -> None:
        if not (math.isfinite(eps) and eps > 0):
            raise ValueError(f"eps must be finite and > 0, got {eps!r}")
        if min_samples < 1 or window < 1 or not 0 <= warmup <= window:
            raise ValueError(
                "need min_samples >= 1, window >= 1 and 0 <= warmup <= window, got "
                f"min_samples={min_samples!r} window={window!r} warmup={warmup!r}"
            )
        if features is not None and (
            isinstance(features, str) or not features or len(set(features)) != len(features)
        ):
            raise ValueError(f"features must be distinct names, got {features!r}")
        self.eps = float(eps)
        self.min_samples = int(min_samples)
        self.window = int(window)
        self.warmup = int(warmup)
        self._features_param = None if features is None else tuple(features)
        self._features: tuple[str, ...] | None = self._features_param
        # The window's points, ``d`` doubles each: appended until ``window`` are held,
        # then the oldest (at ``_head``) is overwritten.
        self._ring: array[float] = array("d")
        self._head = 0
        self._init_index()

    # -- state ---------------------------------------------------------------------------

    def _init_index(self) -> None:
        """Build the grid index and the (derived, unpickled) core-point cache from the ring."""
        d = self._dim
        self._cells: dict[Key, array[float]] = {}  # cell -> its points, oldest first
        for p in self.points():
            key = self._key(p)
            cell = self._cells.get(key)
            if cell is None:
                cell = self._cells[key] = array("d")
            cell.extend(p)
        # cell -> which of its points are core points (a byte each, 1 for a core point),
        # for the clean cells that have any
        self._core: dict[Key, bytes] = {}
        self._learnt = 0  # points learnt since (un)pickling: when the window last moved
        self._spread_cache: tuple[int, list[float], list[float]] | None = None
        self._dirty: set[Key] = set(self._cells)  # occupied cells whose cache is stale
        # Cells that gained or lost a point since the last _flush: the core points of every
        # occupied cell around them may have changed. Marking those dirty waits until a
        # core point is looked for (an outlier, or clusters()), so a stream of normal
        # points landing in the same few cells costs one set insertion each.
        self._changed: set[Key] = set()
        self._offsets, self._far_offsets = self._make_offsets(d)
        # certified()'s sub-cell of each ring slot, made on its first call; the points
        # learnt since it last looked (``_learnt - _subs_at``, the newest) are stale.
        self._subs: I64 | None = None
        self._subs_at = 0

    @property
    def _dim(self) -> int:
        return 1 if self._features is None else len(self._features)

    def points(self) -> list[Point]:
        """The window's points, oldest first (in ``features`` order)."""
        return list(tuples(self._ordered(), self._dim))

    @staticmethod
    @functools.cache  # one copy per dimension, shared by every detector (they are many)
    def _make_offsets(d: int) -> tuple[list[Key], list[list[Key]]]:
        near = near_offsets(d)  # own cell first, so a dense point finds its neighbours early
        rings: list[list[Key]] = [[] for _ in range(FAR_EPS + 2)]
        for off in itertools.product(range(-FAR_EPS - 1, FAR_EPS + 2), repeat=d):
            rings[max(map(abs, off))].append(off)
        return near, rings

    def __getstate__(self) -> dict[str, Any]:
        return {
            "eps": self.eps,
            "min_samples": self.min_samples,
            "window": self.window,
            "warmup": self.warmup,
            "features_param": self._features_param,
            "features": self._features,
            "points": self._ordered(),  # the window, oldest first, ``d`` doubles a point
        }

    def _ordered(self) -> array[float]:
        """The ring's doubles, oldest point first (a copy)."""
        ring, h = self._ring, self._head
        return ring[h:] + ring[:h]

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.eps = state["eps"]
        self.min_samples = state["min_samples"]
        self.window = state["window"]
        self.warmup = state["warmup"]
        self._features_param = state["features_param"]
        self._features = state["features"]
        if "buf" in state:  # written before the window was doubles: a list of tuples
            self._ring = array("d", [v for p in state["buf"] for v in p])
        else:
            self._ring = array("d", state["points"])
        self._head = 0
        self._init_index()

    def clone(self) -> RequestOutliers:
        return RequestOutliers(
            self.eps, self.min_samples, self.window, self.warmup, self._features_param
        )

    def __len__(self) -> int:
        """How many requests the window holds (at most ``window``)."""
        return len(self._ring) // self._dim

    @property
    def features(self) -> tuple[str, ...] | None:
        """The feature names in point order; None until the first point picks them."""
        return self._features

    # -- input ---------------------------------------------------------------------------

    @staticmethod
    def _pick_features(x: dict[str, Any]) -> tuple[str, ...]:
        if all(f in x for f in REQUEST_FEATURES):
            return REQUEST_FEATURES
        if "value" in x:
            return VALUE_FEATURES
        raise ValueError(
            "request_outliers needs 'context_tokens' and 'output_tokens' (or 'value'), "
            f"got keys {sorted(map(str, x))}"
        )

    def _point(self, x: dict[str, Any]) -> tuple[tuple[str, ...], Point]:
        features = self._features or self._pick_features(x)
        missing = [f for f in (*features, "t") if f not in x]
        if missing:
            raise ValueError(
                f"request_outliers: missing feature(s) {missing}; needs {[*features, 't']}"
            )
        values = []
        for f in (*features, "t"):
            try:
                v = float(x[f])
            except (TypeError, ValueError):
                raise ValueError(f"request_outliers: {f}={x[f]!r} is not a number") from None
            if not math.isfinite(v):
                raise ValueError(f"request_outliers: {f}={x[f]!r} is not finite")
            values.append(v)
        return features, tuple(values[:-1])

    def _key(self, p: Point) -> Key:
        eps = self.eps
        if len(p) == 2:  # the request features: the hot path
            return (math.floor(p[0] / eps), math.floor(p[1] / eps))
        return tuple(math.floor(v / eps) for v in p)

    # -- learning ------------------------------------------------------------------------

    def learn_one(self, x: dict[str, Any]) -> None:
        features, p = self._point(x)
        if self._features is None:
            self._features = features
            self._offsets, self._far_offsets = self._make_offsets(len(features))
        self.learn_point(p)

    def learn_point(self, p: Point, key: Key | None = None) -> None:
        """:meth:`learn_one` for a point already read: finite values in ``features`` order
        (the features known: given, or picked by a first :meth:`learn_one`). For a caller
        that has validated its input (the request pipeline's records); ``key``, if given,
        is ``cell(p)``."""
        ring, d = self._ring, len(p)
        if len(ring) >= self.window * d:  # full: the oldest point's slot takes the new one
            i = self._head
            self._evict(tuple(ring[i : i + d]))
            ring[i : i + d] = array("d", p)
            self._head = (i + d) % len(ring)
        else:
            ring.extend(p)
        self._learnt += 1
        if key is None:
            key = self._key(p)
        cell = self._cells.get(key)
        if cell is None:
            cell = self._cells[key] = array("d")
        cell.extend(p)
        self._changed.add(key)

    def _evict(self, old: Point) -> None:
        key = self._key(old)
        cell = self._cells[key]
        del cell[: len(old)]  # per-cell order is arrival order, so the oldest is first
        if not cell:
            del self._cells[key]
            self._core.pop(key, None)
            self._dirty.discard(key)
        self._changed.add(key)

    # -- batches: a run of points scored then learnt in turn -----------------------------

    def cells(self, points: npt.ArrayLike) -> list[Key]:
        """:meth:`cell` of each row of ``points`` (``m`` points, ``d`` values each) at once:
        ``floor(v / eps)`` as Python ints, exactly as :meth:`cell` gives them (numpy's
        float64 quotient and floor are the same IEEE operations as ``math.floor(v / eps)``).

        >>> RequestOutliers(eps=10.0).cells([(25.0, -0.5), (2.0**64, 9.99)])
        [(2, -1), (1844674407370955264, 0)]
        """
        pts = np.asarray(points, dtype=np.float64)
        with np.errstate(all="ignore"):
            f = np.floor(pts / self.eps)
        if bool((np.abs(f) <= 2.0**62).all()):  # NaN fails this: int() raises as math.floor
            return list(map(tuple, f.astype(np.int64).tolist()))
        return [tuple(map(int, row)) for row in f.tolist()]

    def certified(self, points: npt.ArrayLike) -> npt.NDArray[np.bool_]:
        """For a run of ``m`` request points (an ``(m, 2)`` array) that will be scored then
        learnt one after the other: True where :meth:`score_point` of that point, at its
        turn, certainly returns 0.0 (a sufficient test: False says nothing). At point
        ``i``'s turn the window holds the last ``window`` of the window now and points
        ``0..i-1``; the point is certified when that window holds fewer than
        ``max(warmup, 1)`` points, or when at least ``min_samples`` of its points share the
        point's *sub-cell* (side ``eps / sqrt(2)``, shrunk by ``SUB_SHRINK``: any two points
        in one are within eps, and in grid cells next to each other, so
        :meth:`score_point` finds them). Counted are the run's earlier points and the
        window points still there at the last turn; a point with a sub-cell index of
        ``SUB_OUT`` or more in magnitude (where float division could stretch a sub-cell)
        is neither certified nor counted. All False unless the features are the request
        features.

        >>> det = RequestOutliers(eps=100.0, min_samples=2, window=10, warmup=2)
        >>> run = [(0.0, 0.0), (10.0, 10.0), (1e4, 0.0), (5.0, 5.0), (2.0**64, 0.0)]
        >>> det.certified(run).tolist()
        [False, False, False, False, False]
        >>> det.learn_one({"context_tokens": 1, "output_tokens": 1, "t": 0.0})
        >>> det.certified(run).tolist()  # warming up, then 2 window points near or more
        [True, True, False, True, False]
        """
        pts = pairs(points)
        m, n, w = len(pts), len(self), self.window
        if self._features != REQUEST_FEATURES or m == 0:
            return np.zeros(m, dtype=np.bool_)
        old, run, valid = self._sub_cells(pts)
        gone = min(n, max(0, n + m - 1 - w))  # the oldest points: some turns no longer see
        stable = np.sort(cyclic(old, self._head // 2 + gone, n - gone))
        count = np.searchsorted(stable, run, "right") - np.searchsorted(stable, run, "left")
        count += earlier(run)
        count[w + 1 :] = 0  # a run longer than the window: its first points are gone too
        sure = (count >= self.min_samples) & valid
        if n < max(self.warmup, 1):  # fewer than warmup points at turn i: scores 0
            sure |= n + np.arange(m) < max(self.warmup, 1)
        return sure

    def _sub_cells(self, pts: F64) -> tuple[I64, I64, npt.NDArray[np.bool_]]:
        """The packed sub-cells of the window's points (by ring slot) and of ``pts``, and
        which of ``pts`` have theirs in range. The window's are kept: only those of the
        points learnt since the last call (the newest, before the head) are computed."""
        n, h = len(self), self._head // 2
        fresh, subs = self._learnt - self._subs_at, self._subs
        if subs is None:
            subs = self._subs = np.empty(self.window, dtype=np.int64)
            fresh = n
        fresh = min(fresh, n)
        xy = np.concatenate((np.frombuffer(self._newest(fresh), dtype=np.float64), pts.ravel()))
        keys, ok = sub_keys(xy, self.eps / math.sqrt(2.0) * (1.0 - SUB_SHRINK))
        start = (h - fresh) % max(n, 1)
        a = min(fresh, n - start)
        subs[start : start + a] = keys[:a]
        subs[: fresh - a] = keys[a:fresh]
        self._subs_at = self._learnt
        return subs[:n], keys[fresh:], ok[fresh:]

    def learn_points(self, points: npt.ArrayLike, keys: Sequence[Key] | None = None) -> None:
        """``for p, k in zip(points, keys): self.learn_point(tuple(p), k)`` in effect (the
        same window, cells, and core-point bookkeeping afterwards), at the cost of a dict
        look-up a point (learnt and evicted) and of trimming then extending each cell touched
        once. ``keys``, if given, are ``cells(points)``.

        >>> a, b = (RequestOutliers(window=3, warmup=0, features=REQUEST_FEATURES) for _ in 'ab')
        >>> run = [(1.0, 2.0), (300.0, 5.0), (2.0, 1.0), (1.0, 1.0)]
        >>> a.learn_points(run)
        >>> for p in run:
        ...     b.learn_point(p)
        >>> a.points() == b.points() == run[1:]
        True
        """
        pts = np.ascontiguousarray(points, dtype=np.float64)
        if pts.ndim != 2 and pts.size:
            raise ValueError(f"learn_points: need an (m, d) array of points, got {pts.shape}")
        m = len(pts)
        if keys is not None and len(keys) != m:
            raise ValueError(f"learn_points: {len(keys)} keys for {m} points")
        if self._features is None or len(self._features) != 2 or pts.shape[1:] != (2,):
            for i, p in enumerate(pts):  # not the request features' layout: one by one
                self.learn_point(tuple(map(float, p)), None if keys is None else keys[i])
            return
        for s in range(0, m, self.window):  # a run longer than the window, a window at a time
            e = s + self.window
            self._learn_run(pts[s:e], self.cells(pts[s:e]) if keys is None else keys[s:e])

    def _learn_run(self, pts: F64, keys: Sequence[Key]) -> None:
        """:meth:`learn_points` of at most ``window`` 2-D points with their cells."""
        flat: list[float] = pts.ravel().tolist()
        room = self.window - len(self)
        old = self._oldest(max(0, len(keys) - room))  # evicted in turn from turn ``room``
        self._write_ring(flat, room)
        groups, first = by_cell(keys, flat)
        self._evict_run(old, room, first)
        cells = self._cells
        for key, values in groups.items():  # new cells in order of first arrival
            cell = cells.get(key)
            if cell is None:
                cell = cells[key] = array("d")
            cell.extend(values)
        self._changed.update(groups)
        self._learnt += len(keys)

    def _newest(self, n: int) -> array[float]:
        """The doubles of the window's ``n`` newest points, oldest first (a copy)."""
        ring, h, start = self._ring, self._head, self._head - 2 * n
        if start >= 0:
            return ring[start:h]
        return ring[len(ring) + start :] + ring[:h]

    def _oldest(self, n: int) -> array[float]:
        """The doubles of the window's ``n`` oldest points, oldest first (a copy)."""
        ring, h, end = self._ring, self._head, self._head + 2 * n
        if end <= len(ring):
            return ring[h:end]
        return ring[h:] + ring[: end - len(ring)]

    def _write_ring(self, flat: list[float], room: int) -> None:
        """The run's doubles into the ring: ``room`` points appended, the rest written over
        the oldest."""
        ring = self._ring
        ring.extend(flat[: 2 * room])
        rest = flat[2 * room :]
        if not rest:
            return
        slots, h, n = len(ring) // 2, self._head // 2, len(rest) // 2
        a = min(n, slots - h)
        ring[2 * h : 2 * (h + a)] = array("d", rest[: 2 * a])
        ring[: 2 * (n - a)] = array("d", rest[2 * a :])
        self._head = 2 * ((h + n) % slots)

    def _evict_run(self, old: array[float], room: int, first: dict[Key, int]) -> None:
        """Drop the evicted points (``old``, evicted at turns ``room``, ``room + 1``, ...)
        from their cells' fronts; a cell all of whose points left before a run point
        (first at turn ``first[key]``) joined it is dropped as :meth:`_evict` drops it."""
        taken, last = leaving(old, room, self.eps)
        cells = self._cells
        for key, k in taken.items():
            cell = cells[key]
            if 2 * k == len(cell) and first.get(key, last[key]) >= last[key]:
                del cells[key]
                self._core.pop(key, None)
                self._dirty.discard(key)
            else:
                del cell[: 2 * k]
        self._changed.update(taken)

    def _flush(self) -> None:
        """Core status may have changed in every occupied cell around a changed one."""
        if not self._changed:
            return
        cells, dirty = self._cells, self._dirty
        for key in self._changed:
            for k in self._around(key):
                if k in cells:
                    dirty.add(k)
        self._changed.clear()

    def _around(self, key: Key) -> Sequence[Key]:
        """The cell keys next to ``key`` (itself first), in ``_offsets`` order."""
        if len(key) == 2:  # the request features: the hot path, kept for the cells seen lately
            return around_2d(*key)
        return [tuple(a + b for a, b in zip(key, off, strict=True)) for off in self._offsets]

    # -- density queries -----------------------------------------------------------------

    def _neighbours(self, q: Point, need: int, key: Key) -> int:
        """How many window points lie within eps of ``q`` (in cell ``key``), counting up to
        ``need``."""
        eps, cells, dist, d = self.eps, self._cells, math.dist, len(q)
        n = 0
        for k in self._around(key):
            cell = cells.get(k)
            if cell is None:
                continue
            for p in tuples(cell, d):
                if dist(p, q) <= eps:
                    n += 1
                    if n >= need:
                        return n
        return n

    def _refresh_cell(self, key: Key) -> None:
        """Recompute the cached core points of one occupied cell."""
        cells, eps, dist, d = self._cells, self.eps, math.dist, self._dim
        need = self.min_samples + 1  # the point itself is in the window
        blocks = [cells[k] for k in self._around(key) if k in cells]
        flags = bytearray()
        for q in tuples(cells[key], d):
            n = 0
            for block in blocks:
                for p in tuples(block, d):
                    if dist(p, q) <= eps:
                        n += 1
                        if n >= need:
                            break
                if n >= need:
                    break
            flags.append(n >= need)
        if any(flags):
            self._core[key] = bytes(flags)
        else:
            self._core.pop(key, None)

    def _refresh(self) -> None:
        """Recompute the core points of every cell touched since the last refresh."""
        self._flush()
        for key in sorted(self._dirty):
            self._refresh_cell(key)
        self._dirty.clear()

    def _nearest_core(self, q: Point) -> float:
        """Distance from ``q`` to the nearest core point of the window (inf if none), or
        ``FAR_EPS * eps`` when none is that near and the window occupies more cells than
        lie within that reach (then only those are looked at, ring by ring outwards: the
        cost is bounded by the grid around ``q``, not by the window).

        A stale cell is refreshed only when visited, so far-away churn costs nothing.
        """
        self._flush()
        if (2 * FAR_EPS + 3) ** len(q) < len(self._cells):  # cheaper to look around q
            return self._nearest_core_around(q)
        eps, dirty = self.eps, self._dirty
        bounds = []
        for key in self._core.keys() | dirty:
            gap2 = 0.0
            for v, k in zip(q, key, strict=True):
                lo = k * eps
                g = lo - v if v < lo else v - lo - eps if v > lo + eps else 0.0
                gap2 += g * g
            bounds.append((gap2, key))
        bounds.sort()
        best = math.inf
        for gap2, key in bounds:
            if gap2 > best * best * (1 + 1e-9):
                break
            self._clean(key)
            for p in self._cores(key):
                best = min(best, math.dist(p, q))
        return best

    def _nearest_core_around(self, q: Point) -> float:
        """:meth:`_nearest_core` over the cells within ``FAR_EPS + 1`` of ``q``'s, ring
        ``r`` (``r`` cells away, so at least ``(r - 1) * eps`` from ``q``) after ring
        ``r - 1``, until no nearer core point can be in the rings left."""
        eps, cells = self.eps, self._cells
        c = self._key(q)
        best = math.inf
        for r, ring in enumerate(self._far_offsets):
            if best <= (r - 1) * eps:
                break
            for off in ring:
                key = (
                    (c[0] + off[0], c[1] + off[1])
                    if len(c) == 2
                    else tuple(a + b for a, b in zip(c, off, strict=True))
                )
                if key in cells:
                    self._clean(key)
                    for p in self._cores(key):
                        best = min(best, math.dist(p, q))
        return min(best, FAR_EPS * eps)  # beyond the reach, nothing was looked for

    def _cores(self, key: Key) -> Iterator[Point]:
        """The core points of a clean cell."""
        flags = self._core.get(key)
        if flags is None:
            return iter(())
        return itertools.compress(tuples(self._cells[key], self._dim), flags)

    def _clean(self, key: Key) -> None:
        if key in self._dirty:
            self._refresh_cell(key)
            self._dirty.discard(key)

    def score_one(self, x: dict[str, Any]) -> float:
        _, q = self._point(x)
        return self.score_point(q)

    def score_point(self, q: Point, key: Key | None = None) -> float:
        """:meth:`score_one` for a point already read (see :meth:`learn_point`)."""
        if self._features is None or len(self._ring) < max(self.warmup, 1) * len(q):
            return 0.0
        if key is None:
            key = self._key(q)
        if self._neighbours(q, self.min_samples, key) >= self.min_samples:
            return 0.0
        d = self._nearest_core(q)
        if math.isinf(d):
            return 1.0
        if d <= self.eps:
            return 0.4 * d / self.eps
        return min(1.0, 0.5 + 0.5 * (1.0 - math.exp(-(d - self.eps) / self.eps)))

    # -- explanations --------------------------------------------------------------------

    def medians(self) -> dict[str, float]:
        """Median of each feature over the window (empty before the first point)."""
        if self._features is None or not self._ring:
            return {}
        cols = self._columns()
        return {f: float(statistics.median(c)) for f, c in zip(self._features, cols, strict=True)}

    def _columns(self) -> list[array[float]]:
        """The window's values of each feature (in no particular order)."""
        d = self._dim
        return [self._ring[j::d] for j in range(d)]

    def describe(self, point: Point) -> str | None:
        """Where a point (a cluster's centroid, say) sits relative to the window's medians,
        in :meth:`label_one`'s words ("long context, short output"); None before any
        point or if it is typical in every feature."""
        if self._features is None or not self._ring:
            return None
        meds = [statistics.median(c) for c in self._columns()]
        if self._features == REQUEST_FEATURES:
            words = [_ratio_word(v, m) for v, m in zip(point, meds, strict=True)]
            if words != ["typical", "typical"]:
                return f"{words[0]} context, {words[1]} output"
        return None

    def _spread(self, bands: bool = True) -> tuple[list[float], list[float]]:
        """The window's median and "typical" band (``max(eps, 3 * 1.4826 * MAD)``) per
        feature, recomputed once 5 % of the window is new since (labels describe a
        window, and a flood of outliers must not sort it once per outlier). The bands only
        if asked (request labels read the medians alone): empty otherwise."""
        stamp = self._learnt // max(1, len(self) // 20)
        cache = self._spread_cache
        if cache is None or cache[0] != stamp or (bands and not cache[2]):
            cols = [sorted(c) for c in self._columns()]
            meds = [statistics.median(c) for c in cols]
            widths = [
                max(self.eps, 3 * 1.4826 * statistics.median(abs(u - m) for u in c))
                for m, c in zip(meds, cols, strict=True)
            ] if bands else []  # fmt: skip
            cache = self._spread_cache = (stamp, meds, widths)
        return cache[1], cache[2]

    def label_one(self, x: dict[str, Any]) -> str | None:
        """A human label for an outlier (score >= 0.5); None for a normal point.

        For requests, relative to the window medians ("long" above 2x the median, "short"
        below half of it, else "typical"): "long context, short output",
        "short context, long output", ... For other features, which may sit near zero,
        "high"/"low" mean more than ``max(eps, 3 * 1.4826 * MAD)`` above/below the median:
        "high a, typical b", ...
        """
        if self.score_one(x) < 0.5:
            return None
        _, q = self._point(x)
        return self.label_point(q)

    def label_point(self, q: Point) -> str:
        """:meth:`label_one` of a point already read and scored an outlier (>= 0.5) by
        the caller (the request pipeline: it need not be scored twice)."""
        features = self._features
        assert features is not None  # a score above 0 needs learned points
        if features == REQUEST_FEATURES:
            meds, _ = self._spread(bands=False)
            words = [_ratio_word(v, m) for v, m in zip(q, meds, strict=True)]
            if words == ["typical", "typical"]:
                return "unusual mix of context and output"
            return f"{words[0]} context, {words[1]} output"
        meds, bands = self._spread()
        words = []
        for v, m, band in zip(q, meds, bands, strict=True):
            words.append("high" if v > m + band else "low" if v < m - band else "typical")
        if all(w == "typical" for w in words):
            return "unusual combination of " + ", ".join(features)
        return ", ".join(f"{w} {f}" for w, f in zip(words, features, strict=True))

    def cell(self, point: Point) -> Key:
        """The grid cell (side ``eps``) a point (in ``features`` order) falls in."""
        return self._key(point)

    def around(self, cells: Iterable[Key], margin: int = 1) -> frozenset[Key]:
        """``cells`` and every cell within ``margin`` cells of them (for a caller that wants
        to know when a point lands away from known clusters, without scanning them)."""
        d = len(self._features or ()) or 1
        offsets = list(itertools.product(range(-margin, margin + 1), repeat=d))
        return frozenset(
            tuple(a + b for a, b in zip(key, off, strict=True)) for key in cells for off in offsets
        )

    def clusters(self) -> list[Cluster]:
        """The window's DBSCAN clusters (connected core points), largest first."""
        if self._features is None:
            return []
        self._refresh()
        cores = [p for key in self._core for p in self._cores(key)]
        out = []
        for parts in linked_groups(cores, self.eps):
            pts = [p for part in parts for p in part]
            out.append(
                Cluster(
                    tuple(sum(c) / len(pts) for c in zip(*pts, strict=True)),
                    len(pts),
                    frozenset(self._key(min(part)) for part in parts),  # a cell per sub-cell
                    tuple(pts),
                )
            )
        out.sort(key=lambda c: (-c.size, c.centroid))
        return out


def _ratio_word(v: float, median: float) -> str:
    if median > 0:
        return "long" if v > LONG * median else "short" if v < SHORT * median else "typical"
    return "long" if v > median else "short" if v < median else "typical"
