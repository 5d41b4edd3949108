"""Redis at ``maxmemory`` with ``noeviction`` under a worker and the notifier: it answers
reads and refuses writes. Both keep working (the leak that fires meanwhile is paged, from
the notifier's memory), and both say so once: "Redis refuses writes" (not "unreachable"
and "is back" in turn, ten lines a second), the worker names the reason its offsets stop
being committed, and when memory is freed everything is written again and commits resume.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from ragwatch.agents.sim import SimConfig
from ragwatch.config import Settings
from ragwatch.embedded import EmbeddedStack
from ragwatch.receiver import WebhookReceiver
from ragwatch.store import Keys
from tests.integration.conftest import stack_env, wait_until, worker_envelopes
from tests.integration.test_restart import START, leak_bodies, publish, telemetry


def refuse_writes(client: redis.Redis) -> None:
    """Fill Redis to a ``maxmemory`` just above what it holds, with ``noeviction``."""
    client.config_set("maxmemory-policy", "noeviction")
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", used + 1_000_000)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        for i in range(1000):
            client.set(f"filler:{i}", b"x" * 10_000)
    client.config_set("maxmemory", int(client.info("memory")["used_memory"]) - 200_000)


def lines(output: str, pattern: str) -> list[str]:
    return re.findall(pattern, output)


def test_redis_refusing_writes_is_said_once_and_nothing_stops(
    own_stack: EmbeddedStack,
    tmp_path: Path,
    receiver: WebhookReceiver,
    start_ragwatch: Callable[..., Any],
    make_settings: Callable[[dict[str, str]], Settings],
) -> None:
    env = {**stack_env(own_stack, tmp_path), "RAGWATCH_WEBHOOK_URLS": receiver.url}
    settings = make_settings(env)
    keys = Keys(env["RAGWATCH_REDIS_PREFIX"])
    client = redis.Redis.from_url(env["RAGWATCH_REDIS_URL"], socket_timeout=5)
    ticks = telemetry(SimConfig(hosts=2, gpus=2, scenario="leak", start_ts=START), 60)
    notifier = start_ragwatch(["notify"], env)
    worker = start_ragwatch(["worker"], env)
    try:
        sent = publish(settings, ticks, 0, 30)  # the leak goes pending at minute 36
        wait_until(
            lambda: worker_envelopes(client, keys) >= sent - 20, 90, "the worker to catch up"
        )
        refuse_writes(client)
        publish(settings, ticks, 30, 60)  # fires at minute 41, while writes are refused
        wait_until(
            lambda: leak_bodies(receiver, "firing"),
            60,
            lambda: "the leak page while Redis refuses writes:\n" + notifier.output()[-3000:],
        )
        wait_until(
            lambda: "offsets not committed" in worker.output(),
            30,
            lambda: "the worker to say its commits wait:\n" + worker.output()[-3000:],
        )
        time.sleep(3)  # a notifier flapping between "unreachable" and "back" logs 30 lines
        for proc in (worker, notifier):
            out = proc.output()
            assert "unreachable" not in out and "Redis is back" not in out, out[-3000:]
            assert 1 <= len(lines(out, r"Redis (?:still )?refuses writes")) <= 4, out[-3000:]
        (stalled,) = lines(worker.output(), r"offsets not committed: [^\n]*")
        assert "command not allowed when used memory > 'maxmemory'" in stalled

        client.config_set("maxmemory", 0)  # memory freed
        wait_until(
            lambda: "snapshots written again: committing offsets" in worker.output(),
            30,
            lambda: "the worker's commits to resume:\n" + worker.output()[-3000:],
        )
        wait_until(
            lambda: any(
                b"GpuMemoryLeak" in v and b'"firing"' in v for v in client.hvals(keys.active)
            ),
            30,
            lambda: "the worker to write the firing leak:\n" + worker.output()[-3000:],
        )
        wait_until(
            lambda: list(client.scan_iter(f"{keys.outbox_sent}:*")),
            30,
            lambda: "the notifier to write its delivery mark:\n" + notifier.output()[-3000:],
        )
        assert "Redis takes writes again" in worker.output()
        assert "Redis takes writes again" in notifier.output()
        assert "group state was missing" not in notifier.output()  # it was never lost
        assert len(leak_bodies(receiver, "firing")) == 1
    finally:
        client.close()
        worker.stop()
        notifier.stop()
