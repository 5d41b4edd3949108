"""Parsers of ``RAGWATCH_*`` values, each with the bounds of what the value means.

Each takes the variable's text and returns the value or raises ``ValueError`` with a
message that says what is expected and what was given; :class:`ragwatch.config.Settings`
puts the variable's name in front (``RAGWATCH_SERVE_PORT: expected a port number
1..65535, got 'abc'``). Durations take a number of seconds or ``30s``, ``5m``, ``2h``.

>>> seconds(6, 1800)("45"), seconds(6, 1800)("10m"), integer(1, 1000)("12")
(45.0, 600.0, 12)
>>> seconds(6, 1800)("100000")
Traceback (most recent call last):
ValueError: expected 6 s..30 min (seconds, or a duration such as 30s or 5m), got '100000'
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections.abc import Callable
from pathlib import Path

KERNEL_FILE_SYSTEMS = ("/proc", "/sys", "/dev")
DAY = 86400.0


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)?$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(v: str | float) -> float:
    """Seconds from ``"90"``, ``"30s"``, ``"10m"``, ``"2h"``, ``"1d"`` or a number.

    >>> parse_duration("10m"), parse_duration(5)
    (600.0, 5.0)
    """
    if isinstance(v, int | float) and not isinstance(v, bool):
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"duration must be finite and >= 0, got {v!r}")
        return float(v)
    m = _DURATION.match(str(v).strip())
    secs = float(m.group(1)) * _DURATION_UNITS[m.group(2) or "s"] if m else math.nan
    if not math.isfinite(secs):  # a string of 400 digits is inf
        raise ValueError(f"bad duration {v!r} (use e.g. 30s, 10m, 2h)")
    return secs


def span(secs: float) -> str:
    """``1800`` -> ``'30 min'``: the largest unit that divides it evenly."""
    for unit, size in (("d", DAY), ("h", 3600.0), ("min", 60.0), ("s", 1.0)):
        if secs >= size and secs % size == 0:
            return f"{secs / size:g} {unit}"
    return f"{secs:g} s" if secs >= 1 else f"{secs * 1000:g} ms"


def seconds(lo: float, hi: float) -> Callable[[str], float]:
    """Seconds in ``lo..hi``: a number (``30``, ``2.5``, ``1e3``) or a duration (``30s``,
    ``5m``, ``2h``); ``nan``, ``inf`` and anything out of range are refused."""

    def parse(v: str) -> float:
        try:
            f = parse_duration(v)
        except ValueError:
            try:
                f = float(v)
            except ValueError:
                f = math.nan
        if not lo <= f <= hi:
            raise ValueError(
                f"expected {span(lo)}..{span(hi)} (seconds, or a duration such as 30s or "
                f"5m), got {v!r}"
            )
        return f

    return parse


def integer(lo: int, hi: int, unit: str = "") -> Callable[[str], int]:
    """An integer in ``lo..hi`` (``1.5`` and ``1e5`` are not integers)."""

    def parse(v: str) -> int:
        try:
            i: int | None = int(v)
        except ValueError:
            i = None
        if i is None or not lo <= i <= hi:
            raise ValueError(f"expected an integer {lo:,}..{hi:,}{unit}, got {v!r}")
        return i

    return parse


def boolean(v: str) -> bool:
    low = v.lower()
    if low not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
        raise ValueError(f"expected true or false (or 1/0, yes/no, on/off), got {v!r}")
    return low in ("true", "1", "yes", "on")


def port(v: str) -> int:
    if not (v.isdigit() and 0 < int(v) < 65536):
        raise ValueError(f"expected a port number 1..65535, got {v!r}")
    return int(v)


def choice(choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(v: str) -> str:
        if v.upper() not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}, got {v!r}")
        return v.upper()

    return parse


def optional_path(v: str) -> Path | None:
    return Path(v) if v else None


def ca_file(v: str) -> Path | None:
    """A CA bundle for TLS: a file (Python's ssl takes no directory). Whether it exists
    and can be read is checked where a Kafka client starts: settings are also checked on
    machines that do not hold the file (``ragwatch settings`` over a deployment's env)."""
    if not v:
        return None
    if os.path.exists(v) and not os.path.isfile(v):
        raise ValueError(f"not a file: {v!r}")
    return Path(v)


def state_dir(v: str) -> Path:
    """Checked here as far as it can be without creating anything: not under a kernel file
    system, and the nearest part of it that exists is a directory. Whether it can be
    created and written is checked by the commands that use it (Settings.state_subdir)."""
    if not v or v.startswith("~"):
        raise ValueError(f"expected a directory path ('~' is not expanded here), got {v!r}")
    real = Path(os.path.realpath(v))
    for fs in KERNEL_FILE_SYSTEMS:
        if real == Path(fs) or Path(fs) in real.parents:
            raise ValueError(
                f"{v!r} is under {fs}, a kernel file system: no state can be kept there"
            )
    existing = next(p for p in (real, *real.parents) if os.path.exists(p))  # "/" exists
    if not existing.is_dir():
        raise ValueError(f"{v!r}: {existing} is a file, not a directory")
    return Path(v)


def text(v: str) -> str:
    if not v.isprintable():
        raise ValueError(f"holds a control character (a pasted newline?), got {v!r}")
    return v


_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
    r"(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?$"
)


def bind_host(v: str) -> str:
    try:
        ipaddress.ip_address(v)
    except ValueError:
        if not _HOSTNAME.match(v):
            raise ValueError(
                f"expected an IP address (127.0.0.1, 0.0.0.0, ::) or a host name, got {v!r}"
            ) from None
    return v


def name(what: str, pattern: str, longest: int, *, empty: bool = False) -> Callable[[str], str]:
    """A name made of ``pattern``'s characters, at most ``longest`` long; ``what`` says
    where it goes (why the characters are limited)."""
    rx = re.compile(f"^(?:{pattern})*$")

    def parse(v: str) -> str:
        if (not v and not empty) or not rx.match(v) or v in (".", ".."):
            raise ValueError(f"{what}, got {v!r}")
        if len(v) > longest:
            raise ValueError(f"at most {longest} characters, got {len(v)}")
        return v

    return parse
