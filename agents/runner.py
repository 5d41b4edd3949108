"""The agent loop: take samples from a source, encode them, hand them to a sink.

Event time comes from the source. ``speed`` paces a simulated source against the wall
clock (``speed=720`` plays an hour in five seconds; ``0`` = as fast as possible). The
loop stops at ``duration_s`` of event time or when ``stop`` is set (SIGTERM), and always
flushes the sink.

>>> from ragwatch.agents.publisher import ListSink
>>> from ragwatch.agents.sim import FleetSimulator, SimConfig
>>> sink = ListSink()
>>> stats = run_simulation(FleetSimulator(SimConfig(hosts=2, gpus=1)), sink,
...                        topics={"gpu": "ragwatch.gpu", "events": "ragwatch.events"},
...                        speed=0, duration_s=60)
>>> stats.ticks, stats.envelopes, len(sink.records)
(6, 12, 12)
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ragwatch.agents.publisher import Sink
from ragwatch.agents.sim import FleetSimulator
from ragwatch.codec import encode

log = logging.getLogger(__name__)


@dataclass
class RunStats:
    ticks: int = 0
    envelopes: int = 0
    events: int = 0
    first_ts: float | None = None
    last_ts: float | None = None


def run_simulation(
    sim: FleetSimulator,
    sink: Sink,
    *,
    topics: Mapping[str, str],
    speed: float = 0.0,
    duration_s: float | None = None,
    stop: threading.Event | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> RunStats:
    """Publish the simulator's ticks until ``duration_s`` of event time or ``stop``."""
    stop = stop or threading.Event()
    stats = RunStats()
    wall0 = clock()
    try:
        for ts, envelopes, events in sim.ticks():
            if stats.first_ts is None:
                stats.first_ts = ts
            if duration_s is not None and ts - stats.first_ts >= duration_s:
                break
            if speed > 0:
                due = wall0 + (ts - stats.first_ts) / speed
                if stop.wait(max(0.0, due - clock())):
                    break
            elif stop.is_set():
                break
            for env in envelopes:
                sink.write(topics["gpu"], env.host, encode(env))
            for ev in events:
                log.warning("simulated %s on host=%s: %s", ev.type, ev.host, ev.attrs)
                sink.write(topics["events"], ev.host, encode(ev))
            stats.ticks += 1
            stats.envelopes += len(envelopes)
            stats.events += len(events)
            stats.last_ts = ts
    finally:
        sink.close()
    return stats
