"""``kill -9`` of ``ragwatch notify`` at random points while it sends a burst of 200 alerts
to a slow webhook: nothing is lost, and each kill costs at most the one request in flight
(the sender concurrency per receiver) sent twice, with the same ``X-Ragwatch-Key``.

Before each notification was marked delivered on its own answer, a batch of due
notifications (up to 100) was marked only after the whole batch had gone: one kill sent
dozens again (61 duplicates for 200 alerts in the issue's probe).
"""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from ragwatch.config import Settings
from ragwatch.store import Keys
from tests.fakes import Received, SlowServer
from tests.integration.conftest import hook_notify_env, wait_until
from tests.integration.test_notify import T0, alert, publish

ALERTS = 200
KILLS = 20
CONCURRENCY = 1  # one send in flight per receiver (the notifier's sender loop)


def _alert_of(req: Received) -> str:
    (a,) = req.json["alerts"]
    return str(a["fingerprint"])


def test_kill_9_at_random_points_loses_nothing_and_repeats_only_the_send_in_flight(
    rw_env: dict[str, str],
    tmp_path: Path,
    start_ragwatch: Callable[..., Any],
    make_settings: Callable[[dict[str, str]], Settings],
    redis_client: redis.Redis,
) -> None:
    rng = random.Random(32)
    with SlowServer(delay_s=0.1) as hook:
        env = hook_notify_env(rw_env, tmp_path, hook.url)
        settings = make_settings(env)
        publish(
            settings, *(alert("GpuMemoryLeak", "firing", T0, host=f"h{i}") for i in range(ALERTS))
        )
        notifier = start_ragwatch(["notify"], env)
        segments: list[int] = []  # how many requests the receiver had when each run was killed
        for _ in range(KILLS):
            seen = len(hook.received)
            k = rng.randint(1, 6)  # a random point: k answers into this run, then part of one
            assert len(hook.wait_for(seen + k, timeout_s=60)) >= seen + k, notifier.output()
            time.sleep(rng.uniform(0.0, 0.15))  # mid-request, or between two
            notifier.stop(signal.SIGKILL)
            time.sleep(0.2)  # a request sent just before the kill is recorded in its run
            segments.append(len(hook.received))
            notifier = start_ragwatch(["notify"], env)
        wait_until(
            lambda: len({_alert_of(r) for r in hook.received}) == ALERTS, 120, notifier.output
        )
        keys = Keys(env["RAGWATCH_REDIS_PREFIX"])
        wait_until(lambda: redis_client.zcard(keys.outbox_due) == 0, 30, notifier.output)
        assert notifier.stop() == 0
        received = list(hook.received)

    assert len(segments) == KILLS
    assert redis_client.llen(keys.outbox_dead) == 0
    # 0 lost: every alert reached the receiver
    assert {_alert_of(r) for r in received} == {
        alert("GpuMemoryLeak", "firing", T0, host=f"h{i}").fingerprint for i in range(ALERTS)
    }
    # every duplicate carries the key of the first delivery
    key_of: dict[str, str] = {}
    for r in received:
        assert (
            key_of.setdefault(_alert_of(r), r.headers["X-Ragwatch-Key"])
            == r.headers["X-Ragwatch-Key"]
        )
    # a request is sent again only if it was the one in flight when a run was killed:
    # the last request a run sent before its kill (each kill at most CONCURRENCY of them)
    in_flight_at_kill = {end - 1 for end in segments}
    last_sent: dict[str, int] = {}
    again = []
    for i, r in enumerate(received):
        fp = _alert_of(r)
        if fp in last_sent:
            again.append(i)
            assert last_sent[fp] in in_flight_at_kill, (i, last_sent[fp], segments)
        last_sent[fp] = i
    assert len(received) - ALERTS == len(again) <= KILLS * CONCURRENCY
