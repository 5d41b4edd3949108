"""A restarted process's warm-up (streams/pipelines/warmup.py): its cold start's latencies
are not evidence, a fault that outlasts the warm-up still pages, a crash loop gets no grace.

The traffic is test_requests_serving's (one instance, 60 requests a minute, the shipped
rules); the envelopes say when their process started, as the SDK's do.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace

from ragwatch.schema import Transition
from ragwatch.streams.pipelines.requests import RequestPipeline
from ragwatch.streams.pipelines.warmup import WARMUP_S
from tests.unit.test_requests_serving import MIN, RULES, T0, Service, _firing, _minute

HOUR = 3600.0
RESTART = T0 + 4 * HOUR
HEALTHY = Service()
COLD = Service(retriever_ms=4 * HEALTHY.retriever_ms)  # lazy initialisation
WARMING = Service(retriever_ms=1.5 * HEALTHY.retriever_ms)  # caches filling


def cold_start(at: float) -> Callable[[float], Service]:
    """A restart at ``at``: no requests for 2 minutes, the retriever 4x slower for three
    (an index paged in lazily), then 1.5x for four. Slower for three minutes, not the one
    of bench/shape_changes.py's ``restarts``: a minute's requests are one event to the
    tail's CUSUM, which a minute alone no longer pages (streams/pipelines/serving.py)."""

    def plan(t: float) -> Service:
        since = (t - at) / MIN
        if 0 <= since < 2:
            return Service(rpm=0.0)
        if 2 <= since < 5:
            return COLD
        return WARMING if 5 <= since < 9 else HEALTHY

    return plan


def run(
    plan: Callable[[float], Service],
    hours: float,
    starts: tuple[float, ...] | None,
    *,
    pids: bool = False,
) -> tuple[list[Transition], RequestPipeline]:
    """The instance's envelopes, each with its process's start (the newest of ``starts``
    before its minute; None: the envelopes do not say) or, with ``pids``, its pid only
    (a new one at each start)."""
    rng, pipe, out = random.Random(0), RequestPipeline(RULES), []
    for m in range(int(hours * 60)):
        env = _minute(rng, plan, m)
        if starts is not None:
            begun = max(s for s in starts if s <= env.ts - MIN)
            pid = 100 + starts.index(begun)
            env = replace(env, pid=pid) if pids else replace(env, started=begun)
        out += pipe.process(env)
    return out, pipe


def test_a_cold_start_pages_without_its_start_time_and_not_with_it() -> None:
    blind, unaware = run(cold_start(RESTART), 6.0, None)
    assert [r for r, _ in _firing(blind)] == ["RetrievalSlowdown"]
    told, pipe = run(cold_start(RESTART), 6.0, (T0 - HOUR, RESTART))
    assert _firing(told) == []
    assert (pipe.stats.restarts, unaware.stats.restarts) == (1, 0)
    # the warm-up's records (of its buckets: from the restart's on, none before) count as
    # traffic, only their latencies are held back
    rng = random.Random(0)  # run()'s envelopes again
    envs = [_minute(rng, cold_start(RESTART), m) for m in range(6 * 60)]
    warm = [r for e in envs for r in e.records if RESTART <= r.ts < RESTART + WARMUP_S]
    assert pipe.stats.warmup_records == len(warm) > 7 * 60
    row = pipe.rows.index.get(("rag", "a"))
    assert row is not None
    for name in ("requests_total", "errors_total"):
        assert pipe.rows.col[name][row] == unaware.rows.col[name][row]
    assert pipe.rows.col["warm_until"][row] == RESTART + WARMUP_S


def test_a_sender_that_does_not_say_when_it_started_restarts_with_a_new_pid() -> None:
    """An older SDK, another client: a pid the instance has not had is a new process,
    started at its envelope's first record, or at the envelope if it has none (here a
    heartbeat at the end of the restart's second minute, without requests)."""
    out, pipe = run(cold_start(RESTART), 6.0, (T0 - HOUR, RESTART), pids=True)
    assert _firing(out) == [] and pipe.stats.restarts == 1
    row = pipe.rows.index.get(("rag", "a"))
    assert row is not None
    first = pipe.rows.col["started"][row]
    assert first == RESTART + 2 * MIN - 0.001
    assert pipe.rows.col["warm_until"][row] == first + WARMUP_S


def test_a_retriever_slow_from_the_restart_on_pages_when_the_warmup_ends() -> None:
    slow = Service(retriever_ms=4 * HEALTHY.retriever_ms)

    def plan(t: float) -> Service:
        return slow if RESTART <= t < RESTART + HOUR else HEALTHY

    out, _ = run(plan, 6.0, (T0 - HOUR, RESTART))
    fired = _firing(out)
    assert [r for r, _ in fired] == ["RetrievalSlowdown"]
    assert RESTART + WARMUP_S < fired[0][1] <= RESTART + WARMUP_S + 4 * MIN


def test_a_restart_soon_after_the_last_is_a_crash_loop_and_gets_no_grace() -> None:
    again = RESTART + 15 * MIN
    slow = Service(retriever_ms=4 * HEALTHY.retriever_ms)
    first = cold_start(RESTART)

    def plan(t: float) -> Service:
        return slow if again <= t < again + HOUR else first(t)

    out, pipe = run(plan, 6.0, (T0 - HOUR, RESTART, again))
    fired = _firing(out)
    assert [r for r, _ in fired] == ["RetrievalSlowdown"]
    assert again < fired[0][1] <= again + 4 * MIN  # no warm-up: as any slowdown
    assert pipe.stats.restarts == 1  # the first; the second was the loop's


def test_an_older_process_late_envelope_starts_no_warmup() -> None:
    """The old process (pid 6) sends its last envelope after the new one (pid 7) began:
    not a duplicate (its own envelopes are older), and not a restart either."""
    rng, pipe = random.Random(1), RequestPipeline(RULES)
    for m in range(5 * 60):
        env = _minute(rng, lambda t: HEALTHY, m)
        new = env.ts - MIN >= RESTART
        pipe.process(replace(env, pid=7 if new else 6, started=RESTART if new else T0 - HOUR))
        if m == 4 * 60 + 30:
            late = replace(_minute(rng, lambda t: HEALTHY, m), pid=6, started=T0 - HOUR)
            pipe.process(late)
    row = pipe.rows.index.get(("rag", "a"))
    assert row is not None and pipe.stats.duplicates == 0
    assert pipe.stats.restarts == 1
    assert pipe.rows.col["started"][row] == RESTART
    assert pipe.rows.col["warm_until"][row] == RESTART + WARMUP_S


def test_a_start_after_its_envelope_is_not_used_and_counted() -> None:
    """Milliseconds for seconds: a start from the future would stand for good (no later
    one would be newer), so it is not used, and counted; the restart after it still is."""
    rng, pipe = random.Random(2), RequestPipeline(RULES)
    for m in range(5 * 60):
        env = _minute(rng, lambda t: HEALTHY, m)
        start = RESTART if env.ts - MIN >= RESTART else T0 - HOUR
        pipe.process(replace(env, started=start * 1000.0 if m == 60 else start))
    row = pipe.rows.index.get(("rag", "a"))
    assert row is not None
    assert (pipe.stats.bad_starts, pipe.stats.restarts) == (1, 1)
    assert pipe.rows.col["warm_until"][row] == RESTART + WARMUP_S
