"""The agent loops: take samples from a source, encode them, hand them to a sink.

Two loops share :func:`publish`, which routes each envelope to its topic by kind and keys
it (host for GPU telemetry, events and metrics):

- :func:`run_simulation` plays a simulated fleet; event time comes from the simulator and
  ``speed`` paces it against the wall clock (``speed=720`` plays an hour in five seconds,
  ``0`` = as fast as possible), up to ``duration_s`` of event time.
- :func:`run_polling` calls a real source (NVML, Prometheus scrapes) every ``interval_s``
  of wall time, at a fixed rate, until ``stop`` is set.

Both stop when ``stop`` is set (SIGTERM) and always close the sink, which flushes.

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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from ragwatch.agents.publisher import Sink
from ragwatch.agents.sim import FleetSimulator
from ragwatch.agents.sim_requests import RequestSimulator
from ragwatch.codec import encode
from ragwatch.schema import Envelope, EventEnvelope

log = logging.getLogger(__name__)

# envelope kind -> topic role (the key of ``topics``, as in ragwatch.config.TOPICS)
KIND_TOPIC = {"gpu": "gpu", "event": "events", "metrics": "metrics", "requests": "requests"}


@dataclass
class RunStats:
    ticks: int = 0
    envelopes: int = 0
    events: int = 0
    errors: int = 0
    first_ts: float | None = None
    last_ts: float | None = None


def publish(
    envelopes: Iterable[Envelope], sink: Sink, topics: Mapping[str, str], stats: RunStats
) -> None:
    """Encode each envelope and write it to its kind's topic, keyed by host or service."""
    for env in envelopes:
        if isinstance(env, EventEnvelope):
            log.warning("%s on host=%s: %s", env.type, env.host, env.attrs)
            stats.events += 1
        else:
            stats.envelopes += 1
        sink.write(topics[KIND_TOPIC[env.kind]], env.key, encode(env))


def run_simulation(
    sim: FleetSimulator,
    sink: Sink,
    *,
    topics: Mapping[str, str],
    speed: float = 0.0,
    duration_s: float | None = None,
    stop: threading.Event | None = None,
    clock: Callable[[], float] = time.monotonic,
    requests: RequestSimulator | None = None,
    on_tick: Callable[[RunStats], None] | None = None,
) -> RunStats:
    """Publish the simulator's ticks until ``duration_s`` of event time or ``stop``.

    With ``requests``, each tick also publishes that simulator's request envelopes (its
    ``batch_s`` must equal the fleet's ``interval_s``, so both share one clock).
    ``on_tick`` is called with the counters after each tick (progress reports).
    """
    stop = stop or threading.Event()
    stats = RunStats()
    wall0 = clock()
    if requests is not None and requests.config.batch_s != sim.config.interval_s:
        raise ValueError("the request simulator's batch_s must equal the fleet's interval_s")
    request_ticks = requests.ticks() if requests is not None else None
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
            batch: list[Envelope] = [*envelopes, *events]
            if request_ticks is not None:
                batch += next(request_ticks)[1]
            publish(batch, sink, topics, stats)
            stats.ticks += 1
            stats.last_ts = ts
            if on_tick is not None:
                on_tick(stats)
    finally:
        sink.close()
    return stats


def run_polling(
    sample: Callable[[], list[Envelope]],
    sink: Sink,
    *,
    topics: Mapping[str, str],
    interval_s: float,
    stop: threading.Event | None = None,
    max_ticks: int | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> RunStats:
    """Call ``sample`` every ``interval_s`` (fixed rate) and publish what it returns.

    A sample that raises is logged and counted, and the loop goes on: one bad tick must
    not stop a host's telemetry.
    """
    stop = stop or threading.Event()
    stats = RunStats()
    next_due = clock()
    try:
        while not stop.is_set() and (max_ticks is None or stats.ticks < max_ticks):
            try:
                envelopes = sample()
            except Exception:
                stats.errors += 1
                log.exception("sampling failed (errors so far: %d)", stats.errors)
                envelopes = []
            publish(envelopes, sink, topics, stats)
            stats.ticks += 1
            next_due += interval_s
            if max_ticks is not None and stats.ticks >= max_ticks:
                break
            if stop.wait(max(0.0, next_due - clock())):
                break
            next_due = max(next_due, clock() - interval_s)  # after a stall, don't burst
    finally:
        sink.close()
    return stats
