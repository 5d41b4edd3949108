"""Two workers share the partitions; one is SIGKILLed: the other takes over its partitions
(restoring their hosts from the snapshots) and keeps alerting; the killed one comes back
and the partitions rebalance again. The leak pages exactly once throughout."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import orjson
import redis

from ragwatch.agents.sim import SimConfig
from ragwatch.config import Settings
from ragwatch.receiver import WebhookReceiver
from ragwatch.store import Keys
from tests.integration.conftest import hosts_reached, wait_until
from tests.integration.test_restart import MIN, START, leak_bodies, publish, telemetry


def test_a_killed_worker_s_partitions_move_to_the_other_and_back_without_a_second_page(
    rw_env: dict[str, str],
    receiver: WebhookReceiver,
    redis_client: redis.Redis,
    start_ragwatch: Callable[..., Any],
    make_settings: Callable[[dict[str, str]], Settings],
) -> None:
    env = {**rw_env, "RAGWATCH_WEBHOOK_URLS": receiver.url}
    settings = make_settings(env)
    keys = Keys(env["RAGWATCH_REDIS_PREFIX"])
    # 6 hosts over 2 partitions: both workers get some; the leak is on gpu-node-01
    ticks = telemetry(SimConfig(hosts=6, gpus=1, scenario="leak", start_ts=START), 90)

    def per_worker() -> dict[str, tuple[str, int]]:
        """worker id -> (the process writing under it, envelopes it processed)"""
        records = {
            wid.decode(): orjson.loads(raw)
            for wid, raw in redis_client.hgetall(keys.workers).items()
        }
        return {wid: (r["process"], int(r["envelopes"])) for wid, r in records.items()}

    def hosts_at(minute: float) -> bool:
        return hosts_reached(redis_client, keys, 6, START + minute * MIN)

    notifier = start_ragwatch(["notify"], env)
    # two workers on one host: each its own RAGWATCH_WORKER_ID
    a = start_ragwatch(["worker"], {**env, "RAGWATCH_WORKER_ID": "worker-a"})
    b = start_ragwatch(["worker"], {**env, "RAGWATCH_WORKER_ID": "worker-b"})
    try:
        publish(settings, ticks, 0, 30)
        wait_until(
            lambda: hosts_at(29.8), 90, lambda: "both workers to catch up:\n" + a.output()[-2000:]
        )
        wait_until(
            lambda: len([n for _, n in per_worker().values() if n > 0]) == 2,
            30,
            "both workers to own partitions",
        )
        before = per_worker()

        # kill -9 one worker before the leak fires (pending at minute 36, firing at 41)
        a.stop(signal.SIGKILL)
        publish(settings, ticks, 30, 60)
        wait_until(
            lambda: hosts_at(59.8),
            120,
            lambda: "the survivor to take every host:\n" + b.output()[-3000:],
        )
        wait_until(lambda: leak_bodies(receiver, "firing"), 60, lambda: b.output()[-3000:])
        # the survivor processed every new envelope, its own partition's and the killed
        # one's (30 minutes of 6 hosts at 10 s); its counters are written once a second, so
        # a catch-up faster than that shows in the next write
        wait_until(
            lambda: per_worker()["worker-b"][1] - before["worker-b"][1] >= 6 * 180,
            10,
            lambda: f"the survivor's counters to show every envelope: {per_worker()}",
        )

        # the killed worker comes back, under its name: partitions rebalance, nobody pages
        # again, and its status carries on under worker-a
        c = start_ragwatch(["worker"], {**env, "RAGWATCH_WORKER_ID": "worker-a"})
        try:
            gpu_topic = settings.topic("gpu")
            wait_until(
                lambda: (
                    "Setting newly assigned partitions" in c.output()
                    and gpu_topic in c.output().rsplit("Setting newly assigned partitions", 1)[1]
                ),
                60,
                lambda: (
                    "the restarted worker to be assigned a gpu partition:\n" + c.output()[-3000:]
                ),
            )
            publish(settings, ticks, 60, 90)
            wait_until(
                lambda: hosts_at(89.8), 120, lambda: "after the rebalance:\n" + c.output()[-3000:]
            )
            killed = before["worker-a"][0]
            wait_until(
                lambda: per_worker()["worker-a"][0] != killed and per_worker()["worker-a"][1] > 0,
                30,
                "the restarted worker to take partitions",
            )
            assert set(per_worker()) == {"worker-a", "worker-b"}
            assert "RAGWATCH_WORKER_ID" not in c.output() + b.output()  # no clash warned
        finally:
            c.stop()
        (firing,) = leak_bodies(receiver, "firing")
        assert firing["labels"]["host"] == "gpu-node-01"
        active = [orjson.loads(v) for v in redis_client.hvals(keys.active)]
        assert [(x["rule"], x["status"]) for x in active] == [("GpuMemoryLeak", "firing")]
    finally:
        b.stop()
        notifier.stop()
