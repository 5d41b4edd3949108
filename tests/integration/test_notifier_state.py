"""The notifier's group state survives Redis losing it: a running notifier saves it again,
and a notifier restarted without it rebuilds it from the alerts topic, so the resolution
of an alert it paged for is delivered, not dropped as "never notified"."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from ragwatch.config import Settings
from ragwatch.store import Keys
from tests.fakes import FakeServer
from tests.integration.conftest import hook_notify_env, wait_until
from tests.integration.test_notify import T0, alert, publish


def _lose_everything(client: redis.Redis, prefix: str) -> int:
    """What Redis restarted empty does to this test's keys (the stack is shared)."""
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    return int(client.delete(*keys)) if keys else 0


def test_a_resolution_is_delivered_after_redis_lost_the_notifiers_state(
    rw_env: dict[str, str],
    tmp_path: Path,
    start_ragwatch: Callable[..., Any],
    make_settings: Callable[[dict[str, str]], Settings],
    redis_client: redis.Redis,
) -> None:
    prefix = rw_env["RAGWATCH_REDIS_PREFIX"]
    groups = f"{Keys(prefix).notifier}:groups"
    with FakeServer() as hook:
        env = hook_notify_env(rw_env, tmp_path, hook.url)
        settings = make_settings(env)
        notifier = start_ragwatch(["notify"], env)
        publish(settings, alert("GpuMemoryLeak", "firing", T0 + 600, host="h1"))
        wait_until(lambda: hook.bodies(), 60, notifier.output)

        # Redis loses everything while the notifier runs: it saves its groups again
        assert _lose_everything(redis_client, prefix) > 0
        wait_until(lambda: redis_client.exists(groups), 10, notifier.output)
        assert "group state was missing in Redis" in notifier.output()

        # ... and again while it is down: restarted, it rebuilds them from the topic
        notifier.stop(signal.SIGKILL)
        assert _lose_everything(redis_client, prefix) > 0
        notifier = start_ragwatch(["notify"], env)
        wait_until(
            lambda: "rebuilt 1 group(s) from 1 alert" in notifier.output(), 60, notifier.output
        )
        publish(settings, alert("GpuMemoryLeak", "resolved", T0 + 7200, host="h1"))
        wait_until(lambda: len(hook.bodies()) >= 2, 60, notifier.output)
        assert [b["status"] for b in hook.bodies()] == ["firing", "resolved"]
        assert notifier.stop() == 0
