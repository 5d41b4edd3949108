"""argparse ``type=`` converters with range checks, for every command's numeric options.

A value out of range is an ``argparse.ArgumentTypeError``: argparse prints the usage and
``argument --NAME: MESSAGE`` and exits 2, before anything connects.

>>> positive_duration("90s"), nonnegative_float("0"), positive_int("3")
(90.0, 0.0, 3)
>>> positive_duration("0")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: must be > 0, got '0'
"""

from __future__ import annotations

import argparse
import math

from ragwatch.config import parse_duration


def _number(v: str, kind: type[int] | type[float]) -> float:
    try:
        n = kind(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {kind.__name__}, got {v!r}") from None
    if not math.isfinite(n):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {v!r}")
    return n


def duration(v: str) -> float:
    """Seconds from ``30s``, ``10m``, ``2h``, ``1d`` or a plain number; 0 allowed."""
    try:
        return parse_duration(v)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_duration(v: str) -> float:
    """A :func:`duration` > 0."""
    d = duration(v)
    if d <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {v!r}")
    return d


def nonnegative_float(v: str) -> float:
    f = _number(v, float)
    if f < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v!r}")
    return f


def fraction(v: str) -> float:
    """A float in (0, 1]."""
    f = _number(v, float)
    if not 0.0 < f <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {v!r}")
    return f


def positive_int(v: str) -> int:
    n = int(_number(v, int))
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v!r}")
    return n


def worker_count(v: str) -> int:
    """How many workers a demo starts: 1..8."""
    n = positive_int(v)
    if n > 8:
        raise argparse.ArgumentTypeError(f"must be at most 8, got {v!r}")
    return n


def nonnegative_int(v: str) -> int:
    n = int(_number(v, int))
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v!r}")
    return n


def port(v: str) -> int:
    n = int(_number(v, int))
    if not 0 < n < 65536:
        raise argparse.ArgumentTypeError(f"must be a port in 1..65535, got {v!r}")
    return n
