"""The generic detector's parameters (corpus-wide defaults, each with its reason), its
constants and the row layout of :class:`~.bank.GenericBank`."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]
IDX = npt.NDArray[np.intp]
BOOL = npt.NDArray[np.bool_]
DAY = 86400.0
WEEK = 7  # weekdays
VERSION = 1  # of row_state / dump
# The surprise histograms: log2 bins of half an octave from 2**-4 (a sixteenth of the
# scale: anything smaller is no surprise) to 2**9 (512 scales).
LO, STEP, BINS = -4.0, 0.5, 26
CAP = 10.0  # a single observation's surprise counts at most 10 decades (p = 1e-10)


@dataclass(frozen=True, slots=True)
class GenericParams:
    """What the generic detector assumes of a series; every memory is in event-time
    seconds, so the defaults hold from 10 s to 5 min cadence. Tuned as a whole on the NAB
    subset (``bench/quality.py --part nab``), never per file."""

    # Time of day in slots of 30 min (UTC): a daily rhythm's edges within half an hour.
    slots: int = 48
    # The slow level follows the deseasonalised series over ~3 h: a shift is absorbed
    # within hours (then accepted), a spike barely moves it (residuals clipped at huber).
    level_s: float = 10800.0
    # The fast level, an EWMA over ~15 min: the forecast of a series with no rhythm (a
    # random walk, a burst under way); the two forecasts mix by inverse squared error.
    fast_s: float = 900.0
    # A profile slot remembers ~a week of its days: a changed rhythm is learnt in days.
    profile_s: float = 7 * DAY
    # A weekday's offset remembers ~4 of its weeks ...
    weekly_s: float = 28 * DAY
    # ... and is trusted half at 3 days of evidence on that weekday (0 on an unseen one).
    weekly_days: float = 3.0
    # The forecasts' squared errors (their mixing weights) average over a day.
    error_s: float = DAY
    # The residual scale (mean |residual|) over ~6 h: surprise is judged against the
    # series' current volatility (a burst in a busy hour is less news than in a quiet one).
    scale_s: float = 21600.0
    # The surprise histograms remember ~3 days: "never seen in 3 days" is the news.
    memory_s: float = 3 * DAY
    # The burst (short mean of surprise) spans the shorter of 30 min and 12 observations:
    # a denser run of surprises than usual, a shift's first half hour.
    burst_s: float = 1800.0
    burst_n: int = 12
    # Pseudo-observations of a heavy-tailed prior (tail 1/z): with little history, nothing
    # is very surprising; a surprise never seen is ranked by its size.
    prior: float = 5.0
    # Learning clips residuals at 4 scales: a spike does not drag the level or profile.
    huber: float = 4.0
    # Observations learnt before scoring: the histograms need some history.
    warmup: int = 100
    # score = (nl - score_from) / score_span, clipped to [0, 1], nl the combined surprise
    # in decades (-log10 p): 0 below p = 1e-3, 1 at p = 1e-9.
    score_from: float = 3.0
    score_span: float = 6.0
    # The held score: the residual against the seasonal forecast alone (no fast level:
    # a shift keeps it until the slow level has learnt it, hours), in units of its own
    # (1 - held_p) quantile of the last days (the band): 0 within it, 1 at 1 + held_span
    # times its width.
    held_p: float = 0.01
    held_span: float = 0.5

    def __post_init__(self) -> None:
        for name in ("slots", "burst_n", "warmup"):
            v = getattr(self, name)
            if int(v) != v or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        for name in ("level_s", "fast_s", "profile_s", "weekly_s", "error_s", "scale_s"):
            _positive(self, name)
        for name in ("memory_s", "burst_s", "prior", "huber", "score_span", "held_span"):
            _positive(self, name)
        if not (math.isfinite(self.weekly_days) and self.weekly_days >= 0):
            raise ValueError(f"weekly_days must be >= 0, got {self.weekly_days!r}")
        if not math.isfinite(self.score_from):
            raise ValueError(f"score_from must be finite, got {self.score_from!r}")
        if not 0 < self.held_p < 1:
            raise ValueError(f"held_p must be in (0, 1), got {self.held_p!r}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _positive(p: GenericParams, name: str) -> None:
    v = getattr(p, name)
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be finite and > 0, got {v!r}")


# Per-row scalars: name -> (dtype, a fresh row's value). t is the last learnt event time,
# n how many were learnt (capped), scale / scale_w the unnormalised EW mean |residual| and
# its weight (a young row's mean is not biased to 0), hist_w the histograms' total count.
SCALARS: dict[str, tuple[type[np.generic], float]] = {
    "t": (np.float64, math.nan), "n": (np.int32, 0), "level": (np.float64, 0.0),
    "fast": (np.float64, 0.0), "err_seasonal": (np.float64, 0.0),
    "err_fast": (np.float64, 0.0), "scale": (np.float64, 0.0), "scale_w": (np.float64, 0.0),
    "burst": (np.float64, 0.0), "hist_w": (np.float64, 0.0),
    "slow": (np.float64, 0.0), "slow_w": (np.float64, 0.0), "q_hold": (np.float64, 0.0),
}  # fmt: skip
# Per-row vectors (float32: offsets and counts, far from float32's limits of precision):
# the daily profile and its visits per slot, the weekday offsets and their days of
# evidence, the histograms of z and of the burst.
VECTORS = ("profile", "visits", "weekly", "weekly_days", "hz", "hb", "hs")
N_MAX = 2**30
