"""Redis down for 30 s under a worker and the notifier (its own embedded stack: Redis is
SIGKILLed and restarted empty on the same port): the worker keeps processing, the leak that
fires during the outage still reaches the webhook (the notifier's outbox degrades to
memory), `ragwatch status` says it cannot read Redis instead of crashing, and once Redis is
back the active alert and the delivery mark are written again; nothing is paged twice."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from ragwatch.agents.sim import SimConfig
from ragwatch.config import Settings
from ragwatch.embedded import EmbeddedStack
from ragwatch.receiver import WebhookReceiver
from ragwatch.store import Keys
from tests.integration.conftest import run_ragwatch, stack_env, wait_until, worker_envelopes
from tests.integration.test_restart import START, leak_bodies, publish, telemetry

OUTAGE_S = 30.0


def test_redis_down_30s_alerts_still_page_once_and_state_is_rewritten(
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

        own_stack.kill("redis")
        down_at = time.monotonic()
        out = run_ragwatch("status", env=env)
        assert out.returncode != 0
        assert "Traceback" not in out.stderr
        assert "cannot read status from Redis" in out.stderr, out.stderr

        publish(settings, ticks, 30, 60)  # fires at minute 41, while Redis is down
        wait_until(
            lambda: leak_bodies(receiver, "firing"),
            60,
            lambda: "the leak page during the outage:\n" + notifier.output()[-3000:],
        )
        assert time.monotonic() - down_at < OUTAGE_S + 60
        assert "kept in memory" in notifier.output()
        assert worker.popen.poll() is None and notifier.popen.poll() is None
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))

        own_stack.up(("redis",))  # same port, empty
        wait_until(
            lambda: any(
                b"GpuMemoryLeak" in v and b'"firing"' in v for v in client.hvals(keys.active)
            ),
            30,
            lambda: "the worker to write the firing leak again:\n" + worker.output()[-3000:],
        )
        wait_until(
            lambda: list(client.scan_iter(f"{keys.outbox_sent}:*")),
            30,
            "the notifier to write its delivery mark kept in memory",
        )
        assert client.hexists(keys.hosts, "gpu-node-01") or wait_until(
            lambda: client.hexists(keys.hosts, "gpu-node-01"), 10, "host status rewritten"
        )
        assert "Redis is back after" in worker.output()
        # one warning at once, then one per 30 s at most: not one per operation
        for proc, prefix in ((worker, ""), (notifier, "notify: "), (notifier, "outbox: ")):
            warned = re.findall(rf"{prefix}Redis (?:still )?unreachable at", proc.output())
            assert 1 <= len(warned) <= 4, proc.output()[-3000:]
        time.sleep(3)  # a duplicate would come within the notifier's next ticks
        assert len(leak_bodies(receiver, "firing")) == 1
    finally:
        client.close()
        worker.stop()
        notifier.stop()
