"""The seasonal baseline's once-a-day arithmetic, as functions over a bank's cells and
tables: the daily profile from the days held (:func:`daily_profile`, :func:`curve`) and the
weekly table's folding and posterior (:func:`fold_into`, :func:`posterior`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ragwatch.detectors.seasonal.params import (
    F64,
    IDX,
    ODD_WEEK_Z,
    SHAPE_SD,
    WEEK,
    WEEK_MEMORY,
    SeasonalParams,
)

if TYPE_CHECKING:
    from ragwatch.detectors.seasonal.bank import SeasonalBank


# -- the daily profile ----------------------------------------------------------------------


def daily_profile(
    p: SeasonalParams, t: float, newest: int, days: list[int], pools: IDX, bank: SeasonalBank
) -> F64 | None:
    """The daily profile at ``t`` (None: no day has enough slots): each of the last
    ``days`` 24-hour spans' offsets (each slot's latest cell before the span's end, minus
    their mean), their median (from 3 spans; fewer: their mean), smoothed over
    neighbouring slots and shrunk towards 0 by how much of the slots' spread is noise (a
    flat series learnt from a few requests a minute gets no profile, a 20x rhythm all)."""
    curves = [
        c for k in range(p.days) if (c := curve(p, t - k * p.season_s, newest, days, pools, bank))
    ]
    if not curves:
        return None
    raw = np.array([c[0] for c in curves])
    var = np.array([c[1] for c in curves])
    m = len(curves)
    if m >= 3:  # the median of m values is about pi/2 times as noisy as their mean
        new, nvar = np.median(raw, axis=0), math.pi / 2 * var.sum(axis=0) / m**2
    else:
        new, nvar = raw.mean(axis=0), var.sum(axis=0) / m**2
    smooth = 0.25 * np.roll(new, 1) + 0.5 * new + 0.25 * np.roll(new, -1)
    svar = 0.0625 * np.roll(nvar, 1) + 0.25 * nvar + 0.0625 * np.roll(nvar, -1)
    rhythm = max(0.0, float(smooth.var() - svar.mean()))
    with np.errstate(all="ignore"):
        keep = np.where(rhythm + svar > 0, rhythm / (rhythm + svar), 0.0)
    out: F64 = (smooth - smooth.mean()) * keep
    return out if np.isfinite(out).all() else None


def curve(
    p: SeasonalParams, end: float, newest: int, days: list[int], pools: IDX, bank: SeasonalBank
) -> tuple[F64, F64] | None:
    """The offsets of the season ending at ``end`` (each slot's latest complete cell
    before it, minus their mean) and their sampling variances, or None if fewer than
    ``min_coverage`` of its slots were seen (the unseen ones: circular interpolation)."""
    slots = p.slots
    s = np.arange(slots)
    day = np.floor((end - (s + 1) * p.slot_s) / p.season_s).astype(np.int64)
    where = {d: i for i, d in enumerate(days) if d > newest - p.days}
    idx = np.array([where.get(int(d), -1) for d in day])
    ok = idx >= 0
    w = np.zeros(slots)
    zw = np.zeros(slots)
    w[ok] = bank.cell_w[pools[idx[ok]], s[ok]]
    zw[ok] = bank.cell_zw[pools[idx[ok]], s[ok]]
    known = np.flatnonzero(w > 0)
    if len(known) < p.min_coverage * slots:
        return None
    raw, var = zw[known] / w[known], 1.0 / w[known]
    ext = np.append(known, known[0] + slots)  # circular linear interpolation over gaps
    raw_ext, var_ext = np.append(raw, raw[0]), np.append(var, var[0])
    u = s + slots * (s < known[0])
    full = np.interp(u, ext, raw_ext)
    a = np.searchsorted(ext, u, side="right") - 1
    gap_var = 2 * np.maximum(var_ext[a], var_ext[np.minimum(a + 1, len(known))])
    fvar = np.where(w > 0, var_ext[a], gap_var)
    if not np.isfinite(full).all():
        return None
    return full - full.mean(), fvar


# -- the weekly table -------------------------------------------------------------------------


def fold_into(stats: Sequence[F64], cells: IDX, e: F64, s2: F64, delta2: float) -> None:
    """One week's offsets ``e`` (NaN: not seen) into ``cells`` of the table ``stats``
    (weeks, mean, spread, sampling variance; in place): an exponentially weighted mean over
    ``WEEK_MEMORY`` weeks, a week further than ``ODD_WEEK_Z`` sd from the earlier ones
    clipped to that distance (a one-off quiet day moves a block's mean little)."""
    n, mean, m2, ss = stats
    ok = np.isfinite(e) & np.isfinite(s2)
    c, e, s2 = cells[ok], e[ok], s2[ok]
    prior_n = n[c]
    k = np.minimum(prior_n + 1, WEEK_MEMORY)
    lim = ODD_WEEK_Z * np.sqrt(delta2 + ss[c] + s2)
    dev = e - mean[c]
    dev = np.where(prior_n > 0, np.clip(dev, -lim, lim), dev)
    mean[c] += dev / k
    seen = prior_n > 0
    m2[c] = np.where(seen, m2[c] + (dev * dev * (k - 1) / k - m2[c]) / np.maximum(k - 1, 1), 0.0)
    ss[c] += (s2 - ss[c]) / k
    n[c] = prior_n + 1


def posterior(stats: Sequence[F64], delta2: float, tau2: float, blocks: int) -> tuple[F64, F64]:
    """Each block's offset (the weeks' mean shrunk towards 0, a prior of variance
    ``tau2`` against weeks of variance ``delta2`` plus their sampling noise) and its
    variance; a block no week has seen, on a weekday others blocks of which were, takes
    their mean and a shape's variance more (a held morning is not a typical one)."""
    n, mean, _, ss = stats
    if tau2 == 0:
        return np.zeros_like(mean), np.zeros_like(mean)
    ne = np.minimum(n, WEEK_MEMORY)
    obs = delta2 + ss
    v = 1.0 / (1.0 / tau2 + ne / obs)
    w = v * ne * mean / obs
    seen = (ne > 0).reshape(WEEK, blocks)
    w2, v2 = w.reshape(WEEK, blocks), v.reshape(WEEK, blocks)
    k = seen.sum(axis=1, keepdims=True)
    fill = ~seen & (k > 0)
    with np.errstate(all="ignore"):
        day_w = np.where(seen, w2, 0.0).sum(axis=1, keepdims=True) / k
        day_v = np.where(seen, v2, 0.0).sum(axis=1, keepdims=True) / k + SHAPE_SD**2
    w2 = np.where(fill, day_w, w2)
    v2 = np.where(fill, np.minimum(day_v, tau2), v2)
    return w2.reshape(-1), v2.reshape(-1)
