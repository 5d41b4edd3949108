"""The leak detector's specification: the algorithm of
:class:`~ragwatch.detectors.leak.LeakBank` written the simplest way, one object per
series, plain Python floats, lists and loops, every fit recomputed from scratch.
``tests/unit/test_leak_bank.py`` holds the bank to it within a tolerance.

Steps (the bank's module docstring has the reasons): samples are averaged into buckets of
event time (a sample older than the open bucket is late: counted, ignored); a closed
bucket's mean joins the window (``window_s``), which is fitted by Theil-Sen, whole and
over its last ``recent_s``; the bucket also joins its ``floor_block_s`` block (its lowest
and highest mean, its highest load); a closed block joins the floor (``floor_window_s``),
whose lows over ``floor_horizon_s`` are fitted, whose half hours' low-water marks are
compared, and whose older highs are the known range. The leak rate combines them.
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass, field

from ragwatch.detectors.leak import ROUNDING, LeakParams


def theil_sen(ts: list[float], vs: list[float]) -> float:
    """The median of the slopes of every pair of points with distinct times; 0 without one."""
    slopes = [
        (vs[j] - vs[i]) / (ts[j] - ts[i])
        for i in range(len(ts))
        for j in range(i + 1, len(ts))
        if ts[j] != ts[i]
    ]
    return statistics.median(slopes) if slopes else 0.0


def fmax(a: float, b: float) -> float:
    """The larger, a NaN ignored (numpy's fmax)."""
    return b if math.isnan(a) else a if math.isnan(b) else max(a, b)


@dataclass
class Block:
    t: float  # its middle
    lo: float
    hi: float
    load: float


@dataclass
class LeakReference:
    """One series."""

    p: LeakParams = field(default_factory=LeakParams)
    late: int = 0
    bucket: int | None = None
    samples: list[tuple[float, float]] = field(default_factory=list)  # the open bucket's
    bucket_load: float = math.nan
    points: list[tuple[float, float]] = field(default_factory=list)  # bucket means
    block: int | None = None
    block_means: list[float] = field(default_factory=list)
    block_load: float = math.nan
    blocks: list[Block] = field(default_factory=list)
    fit: dict[str, float] | None = None  # the window's, None while warming up
    noise: float = math.nan
    floor: dict[str, float] | None = None  # the floor's, None before its first block

    def learn(self, t: float, v: float, u: float = math.nan) -> None:
        b = math.floor(t / self.p.bucket)
        if self.bucket is not None and b < self.bucket:
            self.late += 1
            return
        if self.bucket is not None and b > self.bucket:
            self._close_bucket()
        opened = self.bucket is None or b > self.bucket
        self.bucket_load = u if opened else fmax(self.bucket_load, u)
        self.bucket = b
        self.samples.append((t, v))

    def _close_bucket(self) -> None:
        assert self.bucket is not None
        t = sum(s[0] for s in self.samples) / len(self.samples)
        m = sum(s[1] for s in self.samples) / len(self.samples)
        self.samples = []
        self.points.append((t, m))
        self.points = [q for q in self.points if not q[0] < t - self.p.window_s]
        self._fit()
        blk = math.floor(self.bucket * self.p.bucket / self.p.floor_block_s)
        if self.block is not None and blk > self.block:
            self._close_block()
        if blk != self.block:
            self.block_means, self.block_load = [], math.nan
        self.block_means.append(m)
        self.block_load = fmax(self.block_load, self.bucket_load)
        self.block = blk

    def _fit(self) -> None:
        p, ts, vs = self.p, [q[0] for q in self.points], [q[1] for q in self.points]
        if len(ts) < p.min_points or ts[-1] - ts[0] < p.min_span_s:
            self.fit = None
            return
        steps = [b - a for a, b in itertools.pairwise(vs)]
        ups = [s > ROUNDING * abs(a) for s, a in zip(steps, vs, strict=False)]  # not rounding
        mid = statistics.median(steps)
        mad = statistics.median(abs(s - mid) for s in steps)
        self.noise = max(p.noise_k * 1.4826 * mad, p.noise_floor_bytes)
        k = sum(1 for x in ts if x < ts[-1] - p.recent_s)
        recent = len(ts) - k >= p.min_points
        self.fit = {
            "slope": theil_sen(ts, vs),
            "span": ts[-1] - ts[0],
            "level": vs[-1],
            "steadiness": sum(ups) / len(steps),
            "rising": sum(s > self.noise for s in steps) / len(steps),
            "recent_slope": theil_sen(ts[k:], vs[k:]) if recent else math.nan,
            "recent_steadiness": (sum(ups[k:]) / (len(ts) - k - 1) if recent else math.nan),
        }

    def _close_block(self) -> None:
        p = self.p
        assert self.block is not None
        t = (self.block + 0.5) * p.floor_block_s
        self.blocks.append(Block(t, min(self.block_means), max(self.block_means), self.block_load))
        self.blocks = [b for b in self.blocks if not b.t < t - p.floor_window_s]
        inside = [b for b in self.blocks if not b.t < t - p.floor_horizon_s]
        exclude = math.ceil(p.recent_s / p.floor_block_s)
        older = self.blocks[: max(0, len(self.blocks) - exclude)]
        self.floor = {
            "slope": theil_sen([b.t for b in inside], [b.lo for b in inside])
            if len(inside) >= 3
            else math.nan,
            "steadiness": self._marks(inside),
            "known": max((b.hi for b in older), default=-math.inf),
            "low": min(b.lo for b in inside[: p.floor_group]),
        }

    def _marks(self, inside: list[Block]) -> float:
        """The share of the half hours' low-water marks (newest first) that rose beyond the
        noise with no new high of the load; NaN under three half hours."""
        g, noise = self.p.floor_group, fmax(self.noise, self.p.noise_floor_bytes)
        n = len(inside) // g
        if n < 3:
            return math.nan
        groups = [inside[len(inside) - g * (j + 1) : len(inside) - g * j] for j in range(n)]
        ups = 0
        for j in range(n - 1):
            before = self.blocks[: len(self.blocks) - g * (j + 1)]
            load = max((b.load for b in groups[j] if not math.isnan(b.load)), default=-math.inf)
            prior = max((b.load for b in before if not math.isnan(b.load)), default=-math.inf)
            rose = min(b.lo for b in groups[j]) - min(b.lo for b in groups[j + 1]) > noise
            ups += rose and not load > prior
        return ups / (n - 1)

    def leak_rate(self) -> float:
        """The floor's slope where established, the fast slope where the fast test holds, the
        larger of both; 0 without; NaN while warming up."""
        p, fit, floor, hour = self.p, self.fit, self.floor, 3600 / 1e9
        if fit is None and (floor is None or math.isnan(floor["slope"])):
            return math.nan
        fast = slow = 0.0
        if fit is None or floor is None:
            return 0.0
        if (
            fit["recent_slope"] * hour > p.fast_gb_per_hour
            and fit["recent_steadiness"] > p.fast_steadiness
            and fit["level"] - floor["known"] > p.margin_bytes + ROUNDING * abs(fit["level"])
            and fit["span"] >= p.recent_s - p.bucket
        ):
            fast = fit["recent_slope"]
        if (
            floor["steadiness"] >= p.floor_steadiness
            and floor["slope"] * hour > p.floor_gb_per_hour
            and fit["rising"] >= p.spread
            and fit["level"] > floor["low"]  # a restart or an OOM kill gave it all back
        ):
            slow = floor["slope"]
        return max(fast, slow)
