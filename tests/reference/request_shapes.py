"""The shape memory's specification by brute force: every request kept with the time it
was added, weighed at reading time, no arrays, no slots kept apart.

A request added at ``t`` settles at the end of its ``SLOT_S`` slot plus ``LAG_S`` and
weighs ``2 ** (-(now - settled) / half_life_s)`` from then on (``now``: the latest time
seen). A point's *smoothed count* is the weight of the settled requests whose cell is at
most one cell away on each axis. The *edge* is the smoothed count of the last cell taken
when the cells are taken densest first (by smoothed count) until they hold ``1 - RARE``
of the settled weight; a point is familiar when its smoothed count is positive and at
least the edge. Cells: ``floor(PER_OCTAVE * log2(1 + v))`` per axis, within the grid.

The product (:mod:`ragwatch.detectors.request_shapes`) settles a slot at the first clock
time at or after that moment and drops cells below ``PRUNE``: its weights match these
within a bucket's decay (relative 1e-6 for one-minute clock steps) and a prune.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ragwatch.detectors.request_shapes import (
    CELLS,
    HALF_LIFE_S,
    LAG_S,
    PER_OCTAVE,
    RARE,
    SLOT_S,
)


def cell(v: float) -> int:
    return int(min(CELLS - 1, max(0, math.floor(PER_OCTAVE * math.log2(1.0 + max(v, 0.0))))))


class BruteShapeMemory:
    def __init__(self, half_life_s: float = HALF_LIFE_S) -> None:
        self.half_life_s = half_life_s
        self.seen: list[tuple[float, int, int]] = []  # (settles at, cell x, cell y)
        self.now = -math.inf

    def add(self, points: Iterable[tuple[float, float]], t: float) -> None:
        settles = (math.floor(t / SLOT_S) + 1) * SLOT_S + LAG_S
        self.seen += [(settles, cell(x), cell(y)) for x, y in points]
        self.now = max(self.now, t)

    def age(self, t: float) -> None:
        self.now = max(self.now, t)

    def weights(self) -> dict[tuple[int, int], float]:
        out: dict[tuple[int, int], float] = {}
        for settles, i, j in self.seen:
            if settles <= self.now:
                w = 2.0 ** (-(self.now - settles) / self.half_life_s)
                out[(i, j)] = out.get((i, j), 0.0) + w
        return out

    @property
    def mass(self) -> float:
        return sum(self.weights().values())

    def smoothed(self, i: int, j: int, weights: dict[tuple[int, int], float]) -> float:
        return sum(w for (a, b), w in weights.items() if abs(a - i) <= 1 and abs(b - j) <= 1)

    def edge(self) -> float:
        weights = self.weights()
        total = sum(weights.values())
        if total <= 0:
            return math.inf
        near = {(a + da, b + db) for a, b in weights for da in (-1, 0, 1) for db in (-1, 0, 1)}
        # (farther cells hold nothing and smooth to 0)
        cells = [(self.smoothed(i, j, weights), weights.get((i, j), 0.0), (i, j)) for i, j in near]
        cells.sort(key=lambda c: -c[0])
        held = 0.0
        for smooth, w, _ in cells:
            held += w
            if held >= (1.0 - RARE) * total:
                return smooth
        return cells[-1][0]

    def familiar(self, points: Iterable[tuple[float, float]]) -> list[bool]:
        weights, edge = self.weights(), self.edge()
        out = []
        for x, y in points:
            s = self.smoothed(cell(x), cell(y), weights)
            out.append(s > 0 and s >= edge)
        return out
