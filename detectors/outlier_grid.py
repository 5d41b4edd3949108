"""The grid under :class:`~ragwatch.detectors.request_outliers.RequestOutliers`: points kept
as flat arrays of doubles, cells of side ``eps`` and the sub-cells of its batches.

The detector holds its window as doubles (a ring, and each cell's points in arrival order)
because thousands of detectors hold a window each: these are the pure functions over
those arrays, apart from the detector's own state, so each reads (and is tested) alone.
A point is a tuple of floats in ``features`` order, a cell (or sub-cell) the tuple of the
integer parts of its coordinates over the side.

>>> list(tuples(array("d", [1.0, 2.0, 3.0, 4.0]), 2))
[(1.0, 2.0), (3.0, 4.0)]
>>> around_2d(0, 0)[:3]
((0, 0), (-1, -1), (-1, 0))
"""

from __future__ import annotations

import functools
import itertools
import math
from array import array
from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt

Point = tuple[float, ...]
Key = tuple[int, ...]
F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

NEAR_CACHE = 4096  # 2-D cells whose neighbours' keys are kept, for all detectors together
# A sub-cell index is clipped to +-SUB_OUT, which marks it out of range (there float
# division could stretch a sub-cell by more than 2 * 2**30 * 2**-53 = 2**-22 of its side);
# the two indices of a 2-D point are packed in an int64 as ``x * 2**32 + y``.
SUB_OUT = 2**30


@functools.cache  # one copy per dimension, shared by every detector (they are many)
def near_offsets(d: int) -> list[Key]:
    """The offsets of the ``3**d`` cells around a cell, its own first (so a dense point
    finds its neighbours early)."""
    return sorted(itertools.product((-1, 0, 1), repeat=d), key=lambda o: any(o))


def tuples(values: array[float], d: int) -> Iterator[Point]:
    """The points of a flat array of ``d`` doubles each, as tuples (zip reuses the tuple
    of a point the caller does not keep)."""
    it = iter(values)
    return zip(*(it,) * d, strict=True)  # a partial point would be a bug


@functools.lru_cache(maxsize=NEAR_CACHE)  # shared by every detector: a pure function
def around_2d(k0: int, k1: int) -> tuple[Key, ...]:
    """The keys of cell ``(k0, k1)`` and its 8 neighbours, in ``near_offsets(2)`` order."""
    return tuple((k0 + a, k1 + b) for a, b in near_offsets(2))


def _linked(
    sub: dict[Key, list[Point]],
    blocks: dict[Key, npt.NDArray[np.float64]],
    ka: Key,
    kb: Key,
    eps: float,
) -> bool:
    """Whether any point of sub-cell ``ka`` is within ``eps`` of one of ``kb``: a loop for
    a few pairs, numpy (each sub-cell's array made once per scan) for many."""
    a, b = sub[ka], sub[kb]
    if len(a) * len(b) <= 64:
        return any(math.dist(p, q) <= eps for p in a for q in b)
    xa, xb = (blocks.get(k) for k in (ka, kb))
    if xa is None:
        xa = blocks[ka] = np.asarray(a, dtype=np.float64)
    if xb is None:
        xb = blocks[kb] = np.asarray(b, dtype=np.float64)
    d2 = ((xa[:, None, :] - xb[None, :, :]) ** 2).sum(axis=-1)
    return bool((d2 <= eps * eps).any())


def linked_groups(points: Sequence[Point], eps: float) -> list[list[list[Point]]]:
    """DBSCAN's connectivity: ``points`` grouped by chains of links (two points within
    ``eps``), each group as the points of its sub-cells, groups in order of their first
    sub-cell, sub-cells in order of their first point. Sub-cells have sides below
    ``eps / sqrt(d)``: any two points in one are within eps, so links are only looked for
    between sub-cells, stopping at the first.

    >>> linked_groups([(0.0, 0.0), (5.0, 0.0), (0.5, 0.5), (9.0, 0.0)], 4.0)
    [[[(0.0, 0.0), (0.5, 0.5)]], [[(5.0, 0.0)], [(9.0, 0.0)]]]
    """
    if not points:
        return []
    d = len(points[0])
    side = eps / math.sqrt(d) * (1 - 1e-9)
    reach = math.ceil(eps / side)
    sub: dict[Key, list[Point]] = {}
    for p in points:
        sub.setdefault(tuple(math.floor(v / side) for v in p), []).append(p)
    parent = {k: k for k in sub}

    def find(k: Key) -> Key:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    offsets = [o for o in itertools.product(range(-reach, reach + 1), repeat=d) if o > (0,) * d]
    blocks: dict[Key, F64] = {}
    for key in sorted(sub):
        for off in offsets:
            other = tuple(a + b for a, b in zip(key, off, strict=True))
            if other not in sub:
                continue
            ra, rb = find(key), find(other)
            if ra != rb and _linked(sub, blocks, key, other, eps):
                parent[max(ra, rb)] = min(ra, rb)
    groups: dict[Key, list[list[Point]]] = {}
    for key, pts in sub.items():
        groups.setdefault(find(key), []).append(pts)
    return list(groups.values())


def pairs(points: npt.ArrayLike) -> F64:
    """``points`` as an ``(m, 2)`` array of doubles (ValueError if it is not one)."""
    pts = np.asarray(points, dtype=np.float64)
    if pts.size == 0:
        pts = pts.reshape(0, 2)
    if pts.ndim != 2 or pts.shape[1] != 2:
        raise ValueError(f"need an (m, 2) array of points, got shape {pts.shape}")
    return pts


def sub_keys(xy: F64, side: float) -> tuple[I64, npt.NDArray[np.bool_]]:
    """The sub-cell (side ``side``) of each point of a flat array of ``(x, y)`` doubles,
    its indices clipped to ``+-SUB_OUT`` and packed in an int64; and whether both were in
    range (NaN is not).

    >>> keys, ok = sub_keys(np.array([0.5, 1.5, -0.5, 2.0**64, 3.0, np.nan]), 1.0)
    >>> keys.tolist() == [1, -(2**32) + SUB_OUT, 3 * 2**32 - SUB_OUT], ok.tolist()
    (True, [True, False, False])
    """
    if side >= 1.0:  # |x / side| <= |x|: no overflow
        f = np.floor(xy / side)
    else:
        with np.errstate(over="ignore"):  # a huge x / side is inf, clipped as out of range
            f = np.floor(xy / side)
    k = np.fmin(np.fmax(f, -SUB_OUT), SUB_OUT).astype(np.int64)  # fmax: NaN -> -SUB_OUT
    ok = np.abs(k) < SUB_OUT
    return k[0::2] * 2**32 + k[1::2], ok[0::2] & ok[1::2]


def cyclic(a: I64, start: int, k: int) -> I64:
    """``k`` items of ``a`` from ``start`` on, wrapping around its end."""
    start %= max(len(a), 1)
    end = start + k
    if end <= len(a):
        return a[start:end]
    return np.concatenate((a[start:], a[: end - len(a)]))


def earlier(keys: I64) -> I64:
    """For each item, how many items before it have its key.

    >>> earlier(np.array([7, 8, 7, 7, 8])).tolist()
    [0, 0, 1, 2, 1]
    """
    order = np.argsort(keys, kind="stable")
    ranked = keys[order]
    out = np.empty(len(keys), dtype=np.int64)
    out[order] = np.arange(len(keys)) - np.searchsorted(ranked, ranked)
    return out


def leaving(old: array[float], room: int, eps: float) -> tuple[dict[Key, int], dict[Key, int]]:
    """For the cells (side ``eps``) of 2-D points (``old``'s doubles) leaving the window at
    turns ``room``, ``room + 1``, ...: how many of each cell's leave, and the turn the last
    leaves at.

    >>> leaving(array("d", [1.0, 1.0, 5.0, 1.0, 1.5, 0.0]), 3, 2.0)
    ({(0, 0): 2, (2, 0): 1}, {(0, 0): 5, (2, 0): 4})
    """
    floor = math.floor
    taken: dict[Key, int] = {}
    last: dict[Key, int] = {}
    it = iter(old)
    for t, (x, y) in enumerate(zip(it, it, strict=True), start=room):
        key = (floor(x / eps), floor(y / eps))
        taken[key] = taken.get(key, 0) + 1
        last[key] = t
    return taken, last


def by_cell(
    keys: Sequence[Key], flat: list[float]
) -> tuple[dict[Key, list[float]], dict[Key, int]]:
    """The doubles of 2-D points (``flat``) by cell (``keys``), cells in order of first
    arrival, and the turn each cell's first point arrives at.

    >>> by_cell([(1, 2), (0, 0), (1, 2)], [1.0, 2.0, 0.0, 0.0, 1.5, 2.5])
    ({(1, 2): [1.0, 2.0, 1.5, 2.5], (0, 0): [0.0, 0.0]}, {(1, 2): 0, (0, 0): 1})
    """
    groups: dict[Key, list[float]] = {}
    first: dict[Key, int] = {}
    it = iter(flat)
    for i, (key, x, y) in enumerate(zip(keys, it, it, strict=True)):
        values = groups.get(key)
        if values is None:
            values = groups[key] = []
            first[key] = i
        values += (x, y)
    return groups, first
