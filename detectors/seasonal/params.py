"""A seasonal baseline's parameters, constants and row layout (what :class:`~.bank.
SeasonalBank` keeps per row), each with its reason."""

from __future__ import annotations

import math
from dataclasses import astuple, dataclass, fields
from typing import Protocol

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
IDX = npt.NDArray[np.intp]
BOOL = npt.NDArray[np.bool_]
DAY = 86400.0
NO_DAY = int(np.iinfo(np.int64).min)  # a row that has seen no day
DAY_LIMIT = 2.0**62  # |t / season_s| must stay below: a day number fits an int64
VERSION = 2  # 2: the weekly table; a version 1 dump loads with the weekly table fresh
NAN = math.nan
# Without a daily profile (the first day), a held level cannot follow the rhythm: one with
# a steep trend is accepted as the new normal after this long (see _longest_hold).
UNPROFILED_HOLD_S = 3 * 3600.0
HOLD_DRIFT = 0.1  # without a profile: how far the trend may carry the level while held
OUTLIER_RUN = 5  # outliers in a row on one side are a step, not spikes
DRIFT_ALPHA = 0.01  # per observation: the average |trend| spans hours, not a fault's onset
PROFILED_TREND = 0.1  # trend_noise is scaled by this once there is a profile
# trend_noise is per step of this length before a profile (with the weekly profile on): a
# day's rhythm moves at a pace of its own, whatever the step, and the first day's level and
# trend alone must follow it (a trend per step wandering like a per-minute one's: (step /
# 60 s) ** 1.5 as fast); weekly_sd=0 keeps the previous algorithm (per step, as specified)
TREND_STEP_S = 60.0
# -- the weekly profile (see the module docstring) --
WEEK = 7  # seasons in a week
BLOCKS = 6  # weekly cells per season: 4-hour blocks of a day (a weekend's late morning and
# a Friday's early evening are their own), few enough that a week fills them at a few
# requests a minute
WEEKLY_SD = 0.5  # prior sd of a weekday's offset: user-facing demand runs at 10-50 % of a
# weekday at weekends, so an unseen weekday at a quarter (log -1.39) is < 3 sd away
WEEK_SD = 0.1  # prior sd of one block from one week to the next (the same weekday of two
# ordinary weeks differs by ~10 %): one week seen gives a ~0.1 sd forecast
WEEK_SD_WEIGHT = 8.0  # the prior counts as this many week-to-week differences of the row
WEEK_MEMORY = 6  # weeks a block's offset averages over: an old pattern fades in ~6 weeks
SHAPE_SD = 0.15  # within a day under way, how far a block's level may drift from the
# daily profile's (a weekend's later, flatter rhythm), as far as the block is uncertain
ODD_WEEK_Z = 3.0  # a week further than this from the earlier ones is clipped to it (a
# holiday that was not held moves a block's mean by at most 3 sd / the weeks seen)
BLOCK_COVERAGE = 0.5  # a block's mean needs half of its slots seen


@dataclass(frozen=True, slots=True)
class SeasonalParams:
    """A baseline's parameters (see :mod:`~.view` for what each means)."""

    step_s: float = 60.0
    season_s: float = DAY
    slot_s: float = 1800.0
    days: int = 7
    level_noise: float = 0.001
    trend_noise: float = 2e-4
    damping: float = 0.995
    min_coverage: float = 0.75
    warmup: int = 5
    hold_max_s: float = DAY
    outlier_z: float = 3.5
    unprofiled_hold_s: float | None = None
    weekly_sd: float = WEEKLY_SD

    def __post_init__(self) -> None:
        for name in ("step_s", "season_s", "slot_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be finite and > 0, got {v!r}")
        slots = self.season_s / self.slot_s
        if not (slots >= 2 and abs(slots - round(slots)) < 1e-9):
            raise ValueError(f"season_s must be a multiple (>= 2) of slot_s, got {self.season_s!r}")
        for name in ("days", "warmup"):
            v = getattr(self, name)
            if int(v) != v or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        for name in ("level_noise", "trend_noise", "weekly_sd"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {v!r}")
        if not 0 < self.damping <= 1:
            raise ValueError(f"damping must be in (0, 1], got {self.damping!r}")
        if not 0 < self.min_coverage <= 1:
            raise ValueError(f"min_coverage must be in (0, 1], got {self.min_coverage!r}")
        if not (math.isfinite(self.hold_max_s) and self.hold_max_s >= 0):
            raise ValueError(f"hold_max_s must be finite and >= 0, got {self.hold_max_s!r}")
        if not self.outlier_z > 0:
            raise ValueError(f"outlier_z must be > 0, got {self.outlier_z!r}")
        u = self.unprofiled_hold_s
        if u is not None and not u >= 0:
            raise ValueError(f"unprofiled_hold_s must be >= 0, got {u!r}")

    @property
    def slots(self) -> int:
        return round(self.season_s / self.slot_s)

    def as_list(self) -> list[float]:
        """The parameters as floats (None: NaN), as a dump carries them."""
        return [NAN if v is None else float(v) for v in astuple(self)]


PARAMS = tuple(f.name for f in fields(SeasonalParams))


class HasParams(Protocol):
    @property
    def params(self) -> SeasonalParams: ...


# per-row arrays: name -> (dtype, a fresh baseline's value)
FIELDS: dict[str, tuple[type[np.generic], float]] = {
    "level": (np.float64, 0.0), "trend": (np.float64, 0.0), "p00": (np.float64, 1e6),
    "p01": (np.float64, 0.0), "p11": (np.float64, 0.0), "at": (np.float64, NAN),
    "n": (np.int64, 0), "model_var": (np.float64, 0.0), "run": (np.int8, 0),
    "drift": (np.float64, 0.0), "day": (np.int64, NO_DAY), "cur": (np.int32, 0),
    "refreshed": (np.float64, NAN), "held_since": (np.float64, NAN),
    "held_q": (np.float64, NAN), "rel_at": (np.float64, NAN),
    "rel_held_s": (np.float64, NAN), "rel_before": (np.float64, NAN),
    "rel_after": (np.float64, NAN), "late": (np.int64, 0), "outliers": (np.int64, 0),
    "profiled": (np.bool_, False),
}  # fmt: skip
# the weekly table, (rows, WEEK * blocks) each: weeks seen, their mean offset, spread and
# sampling variance; the posterior mean and variance the forecast reads
WEEKLY = ("wk_n", "wk_mean", "wk_m2", "wk_s2", "wk_w", "wk_v")
