"""A restarted process's warm-up: its first minutes' latencies are not evidence.

A serving process starts cold: lazy initialisation, empty caches, an index to page in.
Its first minute can be several times slower and the next few mildly so; the tail window
of 200 requests holds that for a quarter of an hour, and the retriever's tail tests read it
as a slowdown that has not ended (``bench/shapes.py``'s ``restarts``: 9
``RetrievalSlowdown`` pages in 10 restarts before this). Datadog's monitors have the
same idea as ``new_group_delay``.

The sender says when its process started (``started`` on a requests envelope: the SDK
sets it when its recorder is created; OTLP spans bring the resource attribute
``process.creation.time``). A sender that does not say (an SDK from before ``started``,
another client) but names a pid the series has not had is a new process too, started at
its envelope's first record (outside a container's pid namespace a restart changes the
pid; inside one it often does not, and only ``started`` tells). A start newer than the
one the series knew is a restart: buckets that begin before ``started + WARMUP_S`` do not
give their latencies to the tail window (so not to the quantiles, the tail tests and
CUSUMs, the decode, TTFT and queue signals, nor the baselines that learn from them);
their requests and errors count as any others'.

- A restart less than :data:`CRASH_LOOP_S` after the one before is a crash loop, a
  fault: no grace, and a grace under way ends at the new start.
- The first start a series sees is no restart (a new series has no baselines to fool).
- An older start than the series' (an old process's last envelopes) changes nothing.
- A sender that says neither (no ``started``; no pid, or always the same) gets no grace.

>>> started, warm = np.array([np.nan]), np.array([-np.inf])
>>> restart(started, warm, 0, 1_000.0)  # the first start seen: none
False
>>> restart(started, warm, 0, 90_000.0), float(warm[0])  # a day later: 10 minutes' grace
(True, 90600.0)
>>> [in_warmup(started, warm, 0, t, t + 60.0) for t in (89_940.0, 90_540.0, 90_600.0)]
[False, True, False]
>>> restart(started, warm, 0, 90_300.0), float(warm[0])  # 5 minutes later: a crash loop
(False, 90300.0)
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Literal

import numpy as np
import numpy.typing as npt

from ragwatch.streams.pipelines.buckets import RequestsMessage

__all__ = ["CRASH_LOOP_S", "WARMUP_S", "in_warmup", "note_start", "restart"]

WARMUP_S = 600.0  # a restarted process's latencies are held back this long
CRASH_LOOP_S = 1800.0  # a restart sooner than this after the last one gets no grace
SAME_START_S = 1.0  # starts closer than this are one (clocks, rounding of ISO 8601 times)

F64 = npt.NDArray[np.float64]
Start = Literal["restart", "bad", ""]  # what an envelope says of its process (note_start)


def note_start(
    started: F64, warm_until: F64, row: int, env: RequestsMessage, pids: Collection[object]
) -> Start:
    """``row``'s envelope ``env`` (``pids``: those the series had before it): whether its
    process restarted, with a warm-up (:func:`restart`); ``"bad"``: it says its process
    started after the envelope was sent (milliseconds for seconds, a broken clock), which
    is not used (a start from the future would stand for good: no later one is newer)."""
    start = env.started
    if start is None:
        if env.pid is None or env.pid in pids:
            return ""
        start = min((r.ts for r in env.records), default=env.ts)  # a new process's
    elif start > env.ts + SAME_START_S:
        return "bad"
    return "restart" if restart(started, warm_until, row, start) else ""


def restart(started: F64, warm_until: F64, row: int, start: float) -> bool:
    """Note that ``row``'s sender started at ``start`` (epoch s); whether that is a
    restart with a warm-up (``warm_until[row]`` then moves to its end)."""
    known = float(started[row])
    if not math.isnan(known) and start <= known + SAME_START_S:
        return False  # the same process, or an older one's late envelope
    started[row] = start
    if math.isnan(known):
        return False
    if start - known < CRASH_LOOP_S:
        warm_until[row] = min(float(warm_until[row]), start)
        return False
    warm_until[row] = start + WARMUP_S
    return True


def in_warmup(started: F64, warm_until: F64, row: int, begins: float, ends: float) -> bool:
    """Whether ``row``'s bucket from ``begins`` to ``ends`` is in a warm-up: it ends after
    the process started and begins before the warm-up ends (as the envelopes so far say:
    decided when the bucket is closed, not when its round runs)."""
    return ends > float(started[row]) and begins < float(warm_until[row])
