"""Surprise histograms, a row each: how often each size of a nonnegative quantity (a
standardised residual, a burst of surprise) was seen, in log2 bins of half an octave,
counts decayed by event time. :func:`tail` reads the probability of a value at least as
large, :func:`quantile` its inverse; both add a heavy-tailed prior (``prior``
pseudo-observations with tail ``min(1, 1/f)``), so that a row with little history finds
nothing very surprising, and a size never seen is ranked by how far beyond it is.

>>> h = np.zeros((1, BINS), dtype=np.float32)
>>> for z in [0.5, 1.0, 1.0, 2.0] * 25:
...     add(h, np.array([0]), np.array([z]))
>>> tail(h, np.array([100.0]), np.array([1.5, 40.0]), 5.0).round(3).tolist()
[0.27, 0.001]
"""

from __future__ import annotations

import numpy as np

from ragwatch.detectors.generic.params import BINS, F32, F64, IDX, LO, STEP

_EDGES = 2.0 ** (LO + np.arange(BINS + 1) * STEP)  # the bins' lower edges, and the top
_TOP = float(_EDGES[-1])
MANY = 256  # rows from which _above sums a bin at a time


def _position(f: F64) -> F64:
    """Where ``f`` falls, in bins from the first edge (0 or less: NaN or -inf)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        pos: F64 = (np.log2(f) - LO) / STEP
    return pos


def _above(h: F32) -> F64:
    """Counts at or above each edge: ``out[:, k] = h[:, k:].sum()``, ``out[:, nb] = 0``
    (``nb`` bins: the histogram's width, BINS or fewer, the first ones), summed in float64
    from the top bin down."""
    nb, n = h.shape[1], len(h)
    out = np.zeros((nb + 1, n))
    if n < MANY:  # numpy's running sum over the bins: one call, the fastest on few rows
        np.cumsum(h.T[::-1], axis=0, dtype=np.float64, out=out[1:])
        return out[::-1].T
    # one add a bin, all rows at once: the same sums in the same order, twice as fast on
    # many rows (numpy's running sum over the bins, even of a contiguous copy, does not
    # vectorise across rows)
    ht = np.ascontiguousarray(h.T, dtype=np.float64)
    for k in range(nb - 1, -1, -1):
        np.add(out[k + 1], ht[k], out=out[k])
    return out.T


def tail(h: F32, w: F64, f: F64, prior: float) -> F64:
    """P(F >= f) for each row of ``h`` (counts; ``w`` all it counted, below the first bin
    included): linear within a bin; 1 for ``f <= 0``, 0 for ``f = inf``."""
    pos, nb = _position(f), h.shape[1]
    above = _above(h)
    k = np.fmin(np.fmax(pos, 0.0), nb - 1).astype(np.intp)  # NaN -> 0
    rows = np.arange(len(h))
    with np.errstate(divide="ignore", invalid="ignore"):
        inside = above[rows, k + 1] + h[rows, k] * (k + 1 - pos)
        part = np.where(pos < 0, above[:, 0], np.where(pos >= nb, 0.0, inside))
        q = np.minimum(1.0, (part + prior * np.minimum(1.0, 1.0 / f)) / (w + prior))
    out: F64 = np.where(f > 0, np.where(np.isinf(f), 0.0, q), 1.0)
    return out


def quantile(h: F32, w: F64, p: float, prior: float) -> F64:
    """The ``f`` with ``P(F >= f) = p`` per row: linear in the bin position between the
    edges around it; past the last edge, the prior's tail alone."""
    q = (_above(h) + prior * np.minimum(1.0, 1.0 / _EDGES)) / (w + prior)[:, None]
    ok = q <= p
    k = np.argmax(ok, axis=1)
    rows = np.arange(len(h))
    prev = np.where(k > 0, q[rows, k - 1], 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        pos = np.where(k > 0, k - 1 + (prev - p) / (prev - q[rows, k]), 0.0)
        beyond = np.maximum(_TOP, prior / ((w + prior) * p))
    out: F64 = np.where(ok.any(axis=1), 2.0 ** (LO + pos * STEP), beyond)
    return out


def add(h: F32, rows: IDX, f: F64) -> None:
    """Count each ``f`` in its row's bin (a value below the first bin: in none)."""
    pos = _position(f)
    ok = (f > 0) & (pos >= 0)
    k = np.fmin(pos[ok], h.shape[1] - 1).astype(np.intp)
    h[rows[ok], k] += 1.0
