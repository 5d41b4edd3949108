"""The broker unreachable for 30 s under a running agent, worker and notifier (its own
embedded stack). Tansu keeps its log in memory, so a killed broker would come back empty; the
broker is frozen instead (SIGSTOP, then SIGCONT): every connection hangs, as with a hung
broker or a network partition, and its log survives. The agent keeps sampling and spools
what the broker does not take, and waits for the broker without rebuilding its producer (a
rebuild re-sends what the frozen broker may already hold, under a new producer id: a
duplicate); the worker and the notifier reconnect by themselves; every sample reaches the
topic exactly once, in order per host; the leak that fires after the outage pages once.
(The agent's publisher through a killed-and-restarted broker is test_outage.py.)"""

from __future__ import annotations

import os
import re
import signal
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import redis

from ragwatch.config import Settings
from ragwatch.embedded import EmbeddedStack
from ragwatch.receiver import WebhookReceiver
from ragwatch.store import Keys
from tests.integration.conftest import hosts_reached, read_records, stack_env, wait_until
from tests.integration.test_restart import MIN, START, leak_bodies

OUTAGE_S = 30.0
SPEED = 60  # event seconds per wall second: 45 minutes of telemetry in 45 s
HOSTS, MINUTES, STEP = 2, 45, 10.0  # the leak fires at minute 41


def test_broker_frozen_30s_agents_spool_workers_reconnect_and_the_leak_pages_once(
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
    broker = own_stack.services()["kafka"].pid

    def hosts_at(minute: float) -> bool:
        return hosts_reached(client, keys, HOSTS, START + minute * MIN)

    notifier = start_ragwatch(["notify"], env)
    worker = start_ragwatch(["worker"], env)
    try:
        agent = start_ragwatch(
            [
                "agent",
                "--source=sim",
                "--scenario=leak",
                f"--hosts={HOSTS}",
                "--gpus=2",
                "--services=0",
                "--queue-max=100",  # a small memory queue: the backlog goes to the spool
                f"--speed={SPEED}",
                f"--duration={MINUTES * MIN:g}",
                f"--start={START:.0f}",
                f"--interval={STEP:g}",
                f"--spool-dir={tmp_path / 'spool'}",
            ],
            env,
        )
        wait_until(lambda: hosts_at(5), 60, lambda: "data before the outage:\n" + worker.output())

        os.kill(broker, signal.SIGSTOP)
        time.sleep(OUTAGE_S)
        os.kill(broker, signal.SIGCONT)

        assert agent.popen.wait(120) == 0, agent.output()[-3000:]
        report = re.search(r"agent done: .*", agent.output())
        assert report is not None, agent.output()[-3000:]
        counts = dict(re.findall(r"(\w+)=(\d+)", report.group(0)))
        sent = HOSTS * int(MINUTES * MIN / STEP)
        assert int(counts["envelopes"]) == sent
        assert counts["failed"] == counts["dropped"] == "0", report.group(0)
        assert int(counts["spooled"]) > 0, f"the outage never reached the agent: {report}"

        # nothing the agent spooled is lost, nothing arrives twice or out of order: every
        # host's samples are on the topic once each, in the order they were taken
        seen: dict[str, list[float]] = defaultdict(list)
        for msg in read_records(settings, settings.topic("gpu"), sent):
            e = orjson.loads(msg.value())
            seen[e["host"]].append(e["ts"])
        expected = [START + i * STEP for i in range(int(MINUTES * MIN / STEP))]
        assert sorted(seen) == [f"gpu-node-{i:02d}" for i in range(1, HOSTS + 1)]
        for host, ts in seen.items():
            assert ts == expected, f"{host}: {len(ts)} samples, {len(set(ts))} distinct"
        closed = re.findall(r"publisher closed: .*", agent.output())
        assert closed, agent.output()[-3000:]
        publisher = dict(re.findall(r"(\w+)=(\d+)", closed[-1]))
        # a frozen broker is waited for, never "stalled": no rebuild, nothing re-sent
        assert (publisher.get("recoveries"), publisher.get("resent")) == ("0", "0"), closed

        # the worker reconnected by itself and processed everything, the leak paged once
        wait_until(
            lambda: hosts_at(MINUTES - STEP / MIN),
            120,
            lambda: "the worker to process the rest:\n" + worker.output()[-3000:],
        )
        wait_until(
            lambda: leak_bodies(receiver, "firing"),
            60,
            lambda: "the leak page:\n" + notifier.output()[-3000:],
        )
        assert worker.popen.poll() is None and notifier.popen.poll() is None
        assert "Traceback" not in worker.output() + notifier.output()
        time.sleep(3)  # a duplicate would come within the notifier's next ticks
        (firing,) = leak_bodies(receiver, "firing")
        assert firing["labels"]["host"] == "gpu-node-01"
    finally:
        client.close()
        worker.stop()
        notifier.stop()
