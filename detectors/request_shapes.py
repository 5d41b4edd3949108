"""A service's long memory of request shapes: which ``(context, output)`` it has served.

Why: a burst of requests of a kind the service serves every day (a client's batch, the mix
shifting toward long answers in the evening) is not news, while a kind it has never
served (contexts 20x the usual, short outputs) is, even when both form a new dense
cluster in the last few thousand requests. The outlier window
(:class:`~ragwatch.detectors.request_outliers.RequestOutliers`) only remembers those last
few thousand; this memory remembers days.

What it holds: decayed request counts over log-scaled cells, ``PER_OCTAVE`` cells per
doubling of each token count (a cell is about 19 % wide: the same kind of request varies
by tens of percent, two kinds twice apart stay apart), ``OCTAVES`` doublings per axis
(up to 16.7M tokens; longer ones share the last cell). Counts halve every
``HALF_LIFE_S`` of event time: a client seen once a week is still known the next week at
half weight; a kind gone for a month weighs 1/16. One ``(96, 96)`` array of doubles
(72 KiB) whatever the traffic.

Requests *settle* into it ``LAG_S`` after they were added, not at once (they wait in
slots of ``SLOT_S``): a new kind of request needs minutes to an hour to gather into a
cluster (at a few requests a minute beside a busy service), and its first requests must
not vouch for it by then. What waits is kept as occupied cells and counts, at most
``LAG_S / SLOT_S + 1`` slots; it settles at full weight (its decay over the lag, under
0.5 % of a half-life, is not worth a rule).

What it says: a shape is *familiar* when its cell, smoothed over the cells next to it
(sums of 3 x 3 cells, so a shape 19-38 % off a known one is still known), is among the
densest cells that together hold ``1 - RARE`` (99.9 %) of the settled mass. That is a
highest-density region: it needs no threshold in requests per second, follows any traffic
level, and leaves out by construction the one-in-a-thousand tail. Before ``MIN_MASS``
requests have settled it cannot tell a rare shape from one never seen: :attr:`trusted` is
False and callers judge as they did without it.

>>> mem = ShapeMemory()
>>> usual = [(3000.0 + 10 * (i % 50), 250.0 + i % 40) for i in range(2000)]
>>> mem.add(usual, t=0.0)
>>> mem.trusted  # not settled yet
False
>>> mem.age(LAG_S + SLOT_S)
>>> mem.trusted, mem.familiar([(3100.0, 260.0), (60000.0, 20.0)]).tolist()
(True, [True, False])
>>> mem.age(LAG_S + SLOT_S + HALF_LIFE_S)  # a half-life later: half the weight
>>> round(mem.mass)
1000
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

PER_OCTAVE = 4  # cells per doubling of a token count: each about 2**0.25 - 1 = 19 % wide
OCTAVES = 24  # doublings per axis: 2**24 = 16.7M tokens, beyond any context window today
CELLS = PER_OCTAVE * OCTAVES  # cells per axis
HALF_LIFE_S = 7 * 86400.0  # a weekly client is known the next week at half its weight
LAG_S = 3600.0  # requests settle an hour after they came: a new kind gathers in less
SLOT_S = 600.0  # requests waiting to settle are kept by slots of 10 minutes
RARE = 1e-3  # the share of the memory left out of the familiar region: its rarest shapes
MIN_MASS = 1 / RARE  # fewer requests than this: the 99.9 % region leaves out none
PRUNE = 1e-3  # a cell whose decayed count falls below this (10 half-lives) is forgotten
FORMAT = "shape-memory/1"

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


_EMPTY: F64 = np.zeros((CELLS, CELLS), dtype=np.float64)
_EMPTY.flags.writeable = False


class ShapeMemory:
    """Decayed counts of request shapes over log-scaled cells (see the module docstring)."""

    def __init__(self, half_life_s: float = HALF_LIFE_S) -> None:
        if not (math.isfinite(half_life_s) and half_life_s > 0):
            raise ValueError(f"half_life_s must be finite and > 0, got {half_life_s!r}")
        self.half_life_s = float(half_life_s)
        # settled, decayed; the shared empty grid until something settles (a flood of new
        # services that never last an hour costs no grid each: docs/security.md)
        self.counts: F64 = _EMPTY
        self.t = -math.inf  # the event time ``counts`` are decayed to (none yet)
        self.now = -math.inf  # the latest event time seen
        self.waiting: dict[int, tuple[I64, F64]] = {}  # slot -> its flat cells and counts
        self._region: tuple[F64, float] | None = None  # (smoothed counts, region's edge)

    @property
    def mass(self) -> float:
        """The decayed number of settled requests, now."""
        self._decay()
        return float(self.counts.sum())

    @property
    def trusted(self) -> bool:
        """Whether enough requests (``MIN_MASS``) settled to call a shape rare."""
        return self.mass >= MIN_MASS

    @staticmethod
    def cells(points: npt.ArrayLike) -> I64:
        """The flat cell of each ``(context, output)`` point: ``floor(PER_OCTAVE *
        log2(1 + v))`` per axis, clipped to the grid (negative counts in the first cell)."""
        pts = np.asarray(points, dtype=np.float64).reshape(-1, 2)
        with np.errstate(invalid="ignore"):
            f = np.floor(PER_OCTAVE * np.log2(1.0 + np.maximum(pts, 0.0)))
        k = np.clip(np.nan_to_num(f, nan=0.0), 0, CELLS - 1).astype(np.int64)
        flat: I64 = k[:, 0] * CELLS + k[:, 1]
        return flat

    def add(self, points: npt.ArrayLike, t: float) -> None:
        """Requests (an ``(m, 2)`` array) seen at event time ``t``: they settle at
        ``t + LAG_S`` (rounded up to their slot's end)."""
        flat = self.cells(points)
        if not len(flat):
            self.age(t)
            return
        slot = math.floor(t / SLOT_S)
        cells, counts = self.waiting.get(slot, (np.empty(0, np.int64), np.empty(0)))
        cells, at = np.unique(np.concatenate((cells, flat)), return_inverse=True)
        weights = np.concatenate((counts, np.ones(len(flat))))
        summed = np.bincount(at, weights, len(cells)).astype(np.float64)
        self.waiting[slot] = (cells.astype(np.int64), summed)
        self.age(t)

    def age(self, t: float) -> None:
        """Move the memory's clock to event time ``t`` (earlier times change nothing):
        the slots that ended ``LAG_S`` before settle."""
        if not t > self.now:
            return
        self.now = float(t)
        due = sorted(s for s in self.waiting if (s + 1) * SLOT_S + LAG_S <= t)
        if not due:
            return
        self._decay()
        flat = self._writable().ravel()
        for s in due:
            cells, counts = self.waiting.pop(s)
            flat[cells] += counts
        self._region = None

    def _decay(self) -> None:
        """The settled counts decayed to the clock (done when they are read or added to)."""
        if self.now <= self.t:
            return
        if math.isfinite(self.t) and self.counts is not _EMPTY:
            self.counts *= 2.0 ** (-(self.now - self.t) / self.half_life_s)
            self.counts[self.counts < PRUNE] = 0.0
            self._region = None
        self.t = self.now

    def _writable(self) -> F64:
        """The counts, given a grid of their own first if they still share the empty one."""
        if self.counts is _EMPTY:
            self.counts = np.zeros((CELLS, CELLS), dtype=np.float64)
        return self.counts

    def familiar(self, points: npt.ArrayLike) -> npt.NDArray[np.bool_]:
        """Per point, whether its shape lies in the densest region holding ``1 - RARE`` of
        the settled mass (all False when nothing settled)."""
        self._decay()
        if self._region is None:
            self._region = _region(self.counts)
        smooth, edge = self._region
        s = smooth.ravel()[self.cells(points)]
        return (s >= edge) & (s > 0)

    # -- snapshots -----------------------------------------------------------------------

    def dump(self) -> dict[str, Any]:
        """Plain data: the occupied cells and their counts as little-endian bytes, settled
        and waiting (by slot)."""
        self._decay()
        flat = self.counts.ravel()
        at = np.flatnonzero(flat)
        return {
            "format": FORMAT,
            "half_life_s": self.half_life_s,
            "t": None if math.isinf(self.now) else self.now,
            "cells": at.astype("<i4").tobytes(),
            "counts": flat[at].astype("<f8").tobytes(),
            "waiting": [
                [s, c.astype("<i4").tobytes(), n.astype("<f8").tobytes()]
                for s, (c, n) in sorted(self.waiting.items())
            ],
        }

    @classmethod
    def load(cls, state: Mapping[str, Any] | None) -> ShapeMemory:
        """A memory from :meth:`dump`'s data; a fresh one for None (a snapshot written
        before the memory existed). ValueError if the data does not fit."""
        if state is None:
            return cls()
        if not isinstance(state, Mapping) or state.get("format") != FORMAT:
            raise ValueError("shape memory: not a shape-memory/1 state")
        try:
            return cls._load(state)
        except (KeyError, TypeError) as exc:  # a part missing, or of another type
            raise ValueError(f"shape memory: {type(exc).__name__}: {exc}") from None

    @classmethod
    def _load(cls, state: Mapping[str, Any]) -> ShapeMemory:
        mem = cls(float(state["half_life_s"]))
        t = state["t"]
        mem.t = mem.now = -math.inf if t is None else float(t)
        if math.isnan(mem.now):
            raise ValueError("shape memory: time is NaN")
        at, counts = _cells(state["cells"], state["counts"])
        if len(at):
            mem._writable().ravel()[at] = counts
        for s, c, n in state["waiting"][: int(LAG_S / SLOT_S) + 2]:
            mem.waiting[int(s)] = _cells(c, n)
        return mem


def _cells(cells: Any, counts: Any) -> tuple[I64, F64]:
    """Flat cells and their counts from little-endian bytes (ValueError if they do not
    fit the grid, or a count is not finite and >= 0)."""
    at = np.frombuffer(cells, dtype="<i4").astype(np.int64)
    n = np.frombuffer(counts, dtype="<f8").astype(np.float64)
    if len(at) != len(n) or ((at < 0) | (at >= CELLS * CELLS)).any():
        raise ValueError("shape memory: cells that do not fit the grid")
    if not (np.isfinite(n) & (n >= 0)).all():
        raise ValueError("shape memory: counts not finite and >= 0")
    return at, n


def _region(counts: F64) -> tuple[F64, float]:
    """The 3 x 3 sums of ``counts``, and the smallest of them among the densest cells (by
    that sum) that hold ``1 - RARE`` of ``counts``' total (inf when it is empty)."""
    c = np.pad(counts, 1)
    n = len(counts)
    smooth = np.zeros_like(counts)
    for a in range(3):
        for b in range(3):
            smooth += c[a : a + n, b : b + n]
    total = float(counts.sum())
    if total <= 0:
        return smooth, math.inf
    order = np.argsort(-smooth.ravel(), kind="stable")
    held = np.cumsum(counts.ravel()[order])
    k = int(np.searchsorted(held, (1.0 - RARE) * total))
    return smooth, float(smooth.ravel()[order[min(k, len(order) - 1)]])
