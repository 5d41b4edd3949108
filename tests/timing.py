"""Cost checks that need no wall-clock floor: time a loop in chunks and compare the late
chunks with the early ones of the same run (a loaded machine slows both alike)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any


def chunk_seconds(step: Callable[[Any], object], items: Sequence[Any], size: int) -> list[float]:
    """Seconds ``step`` took over each consecutive chunk of ``size`` items."""
    out: list[float] = []
    for i in range(0, len(items), size):
        start = time.perf_counter()
        for x in items[i : i + size]:
            step(x)
        out.append(time.perf_counter() - start)
    return out
