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
VERSION = 3  # of row_state / dump (3: the held score's anchor)
# The surprise histograms: log2 bins of half an octave from 2**-4 (a sixteenth of the
# scale: anything smaller is no surprise) to 2**9 (512 scales).
LO, STEP, BINS = -4.0, 0.5, 26
CAP = 10.0  # a single observation's surprise counts at most 10 decades (p = 1e-10)
# Shape prototypes are stored in eighths of a deviation (int8: at most 127/8 = 15.9), so a
# window's RMS distance to one is below 2 * 127/8 < 2**5: its histogram needs 18 of the bins.
PROTO_STEP = 8.0
SHAPE_BINS = 18


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
    # The held score's level, the anchor, learns as the slow level does, but not while a
    # deviation lasts (from hold_from_s on: an excursion of a few minutes, the band's 1 %,
    # is learnt as before, so a healthy series' anchor is its level), for up to hold_s of
    # event time: a fault of hours is not half-learnt
    # as the new normal (whose end would then read as a deviation of its own); one that
    # lasts longer is learnt from then on, as a new level is; nor during the warm-up (a
    # deviation is not known from normal yet). The forecast (and so the onset) is not
    # held: it follows the series as it is. 0: no hold.
    hold_from_s: float = 600.0
    hold_s: float = 4 * 3600.0
    # Shape novelty (the KNN-CAD / ARTime idea, in bounded memory): the window of the last
    # shape_n values, standardised by the row's mean and mean |deviation| over memory_s and
    # rotated so that its largest |value| is the last (a spike or a burst's peak anywhere
    # in the window is one shape), against shape_k prototypes learnt online (int8 in
    # PROTO_STEPs, with their hits: 10 bytes each). The nearest within shape_r deviations
    # RMS (two windows of the same noise are ~1.8 apart) learns the window (a running mean
    # of its hits, at least shape_lr); a window farther from all replaces the least used
    # one (hits decayed over memory_s). Its distance to the nearest is judged against the
    # row's histogram of such distances: a shape not seen in days is news (a burst, a new
    # level, a flat stretch, a changed rhythm), a recurring one is not (a daily spike, a
    # rhythm's edges). 8 to 16 prototypes score alike on NAB (~67.8); 8 keep a row of the
    # bank at 968 bytes, under 1 KiB with the ~52 bytes the product holds beside it.
    shape_n: int = 6
    shape_k: int = 8
    shape_r: float = 2.0
    shape_lr: float = 0.05
    # The onset's surprise is the larger of the residual's (point + burst: two terms) and
    # shape_weight times the shape's (one term: a window is already a run of observations).
    shape_weight: float = 2.0
    # News once: an onset not above the row's peak onset (decaying over quiet_s, event
    # time) is 0; NAB counts only the first detection in a window, the product's ``score``
    # keeps the raw onset. 0: no quiet period.
    quiet_s: float = DAY

    def __post_init__(self) -> None:
        for name in ("slots", "burst_n", "warmup", "shape_n", "shape_k"):
            v = getattr(self, name)
            if int(v) != v or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        for name in ("level_s", "fast_s", "profile_s", "weekly_s", "error_s", "scale_s"):
            _positive(self, name)
        for name in ("memory_s", "burst_s", "prior", "huber", "score_span", "held_span"):
            _positive(self, name)
        for name in ("shape_r", "shape_weight"):
            _positive(self, name)
        if not 0 < self.shape_lr <= 1:
            raise ValueError(f"shape_lr must be in (0, 1], got {self.shape_lr!r}")
        for name in ("quiet_s", "hold_from_s", "hold_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be >= 0, got {v!r}")
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
# its weight (a young row's mean is not biased to 0), hist_w the histograms' total count;
# mean / dev the shape's standardisation (dev's weight: slow_w, the same memory), peak
# the row's peak onset (decaying over quiet_s: the quiet period); anchor the held score's
# level, held_for how long the deviation under way has lasted (0: none).
SCALARS: dict[str, tuple[type[np.generic], float]] = {
    "t": (np.float64, math.nan), "n": (np.int32, 0), "level": (np.float64, 0.0),
    "fast": (np.float64, 0.0), "err_seasonal": (np.float64, 0.0),
    "err_fast": (np.float64, 0.0), "scale": (np.float64, 0.0), "scale_w": (np.float64, 0.0),
    "burst": (np.float64, 0.0), "hist_w": (np.float64, 0.0),
    "slow": (np.float64, 0.0), "slow_w": (np.float64, 0.0), "q_hold": (np.float64, 0.0),
    "mean": (np.float64, 0.0), "dev": (np.float64, 0.0), "peak": (np.float64, 0.0),
    "anchor": (np.float64, 0.0), "held_for": (np.float32, 0.0),
}  # fmt: skip
# Per-row vectors (float32 unless DTYPES says otherwise: offsets and counts, far from
# float32's limits of precision): the daily profile and its visits per slot, the weekday
# offsets and their days of evidence, the histograms of z, of the burst and of zs; the
# shape's window (raw values, oldest first), prototypes (shape_k x shape_n, int8 in
# PROTO_STEPs), their decayed hits, and the histogram of its distances (SHAPE_BINS).
VECTORS = (
    "profile", "visits", "weekly", "weekly_days", "hz", "hb", "hs", "win", "proto", "use", "hn",
)  # fmt: skip
# visits in float16 counts exactly to 2048, where it stays: by then the slot's running mean
# forgets by profile_s (a weight above 1/2048 at any cadence of 10 s or more), as before.
DTYPES: dict[str, type[np.generic]] = {"visits": np.float16, "proto": np.int8}
N_MAX = 2**30
