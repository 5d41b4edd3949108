"""Cost checks that need no wall-clock floor: time a loop in chunks and compare the late
chunks with the early ones of the same run. The time is this thread's CPU time
(``time.thread_time``), not the wall clock: on a loaded machine (three pytest workers on
two cores) the scheduler takes the core away for tens of milliseconds, in one chunk and
not the next, and a wall-clock chunk once read twice its neighbours for no growth at all."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any


def chunk_seconds(step: Callable[[Any], object], items: Sequence[Any], size: int) -> list[float]:
    """CPU seconds ``step`` took over each consecutive chunk of ``size`` items."""
    out: list[float] = []
    for i in range(0, len(items), size):
        start = time.thread_time()
        for x in items[i : i + size]:
            step(x)
        out.append(time.thread_time() - start)
    return out
