"""``ragwatch demo``: the GPU memory-leak incident, end to end, on this machine.

Brings up the embedded stack (unless ``RAGWATCH_KAFKA_BOOTSTRAP`` / ``RAGWATCH_REDIS_URL``
point at running services), a local webhook receiver, one ``ragwatch worker`` and one
simulated ``ragwatch agent`` (4 hosts x 2 GPUs at 720x speed, one rag-worker leaking
1.2 GB/h), and waits until the leak alert is firing both at the webhook and in Redis.
Everything it started is stopped again, whatever happens.

It says what the scenario injects (:mod:`ragwatch.commands.demo_scenarios`), reports its
progress while it waits (event time reached, messages processed, alerts so far: a bar on a
terminal, a line every 10 s otherwise), prints every alert the webhook gets, says why an
alert it does not wait for fires (a consequence of the injected faults), and fails on an
alert that nothing in the scenario explains.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from ragwatch.commands.children import Children
from ragwatch.commands.demo_scenarios import (
    GPUS,
    HEAL_AFTER,
    HEALING,
    HOSTS,
    SERVICES,
    Expectation,
    Story,
    story,
)
from ragwatch.commands.demo_watch import Watch, check_receivers, say
from ragwatch.config import Settings, parse_duration
from ragwatch.embedded import EmbeddedStack
from ragwatch.receiver import WebhookReceiver

# speed, sample interval, simulated duration: faults play 12 h at 720x (an hour in five
# seconds); healthy plays three days at 4320x with 1-minute samples, and must stay quiet.
# oom and all run until the leaking worker has been OOM-killed (~12.4 h in).
PACE = {"healthy": ("4320", "60", "3d"), "oom": ("720", "10", "13h"), "all": ("720", "10", "13h")}
# default --timeout per scenario (else 150 s): healthy plays 3 days; oom and all play 13 h
# and wait for the OOM kill and the healing (~95 s alone on 2 cores, twice that on a
# loaded one)
TIMEOUT_S = {"healthy": 300.0, "oom": 300.0, "all": 300.0}
PLAYED_OUT = ("healthy", "oom", "all")  # scenarios watched to (about) their end
# The notifier's routes in the demo: every alert to the Alertmanager-style webhook (one
# group per alert, at once: what the demo watches), critical and error ones to the
# PagerDuty-like receiver (one event per transition), and grouped digests to Slack.
NOTIFY_YAML = """\
receivers:
  - {{name: webhook, type: webhook, url: "{hook}"}}
  - {{name: oncall, type: pagerduty, url: "{pd}", routing_key: "${{DEMO_PD_ROUTING_KEY}}"}}
  - {{name: team-chat, type: slack, url: "{slack}"}}
route:
  receiver: team-chat
  group_by: [alertname]
  group_wait: 30s
  group_interval: 5m
  repeat_interval: 24h
  routes:
    - {{receiver: webhook, group_by: ['...'], group_wait: 0s, group_interval: 0s, continue: true}}
    - {{matchers: {{severity: "=~critical|error"}}, receiver: oncall, group_by: ['...'],
       group_wait: 0s, group_interval: 0s, continue: true}}
    - {{receiver: team-chat}}
inhibit_rules:
  - {{source_matchers: {{alertname: GpuOomKill}}, target_matchers: {{alertname: GpuMemoryHigh}},
     equal: [host, gpu]}}
"""
DEFAULT_PACE = ("720", "10", "12h")


def expectations(scenario: str) -> list[Expectation]:
    """What ``ragwatch demo --scenario`` waits for (nothing, for ``healthy``)."""
    return story(scenario).expected


def _demo_env(
    environ: Mapping[str, str],
    stack: EmbeddedStack,
    own: tuple[str, ...],
    run_id: str,
    run_dir: Path,
    notify_file: Path,
) -> dict[str, str]:
    """The environment of the demo's processes: the stack's servers, its own consumer
    group, state dir, and topic and key prefixes on an external Kafka or Redis."""
    env = {
        **environ,
        **stack.env(),
        "RAGWATCH_NOTIFY_FILE": str(notify_file),
        "DEMO_PD_ROUTING_KEY": "demo" * 8,
        "RAGWATCH_APP_ID": f"ragwatch-demo-{run_id}",
        "RAGWATCH_KAFKA_SESSION_TIMEOUT": "6",
        "RAGWATCH_STATE_DIR": str(run_dir),
    }
    if "kafka" not in own:
        env["RAGWATCH_TOPIC_PREFIX"] = f"demo-{run_id}."
    if "redis" not in own:
        env["RAGWATCH_REDIS_PREFIX"] = f"ragwatch-demo-{run_id}"
    return env


def _start_agent(children: Children, told: Story) -> tuple[float, float | None]:
    """The simulated fleet of the scenario, played at its pace; says what it injects and
    what the demo waits for. Returns the fleet's first event time and how many hours the
    demo watches it play (None: it ends when the alerts come, long before the end)."""
    scenario = told.scenario
    speed, interval, duration = PACE.get(scenario, DEFAULT_PACE)
    start = _start(duration)
    children.start(
        "agent",
        "agent",
        *("--source", "sim", "--scenario", scenario),
        *("--hosts", str(HOSTS), "--gpus", str(GPUS), "--services", str(SERVICES)),
        *("--speed", speed, "--interval", interval, "--duration", duration),
        *("--start", str(start)),
        *(("--heal-after", HEAL_AFTER) if scenario in HEALING else ()),
    )
    wanted = "; ".join(e.what for e in told.expected)
    say(
        f"scenario {scenario}: {HOSTS} hosts x {GPUS} GPUs and {SERVICES} RAG services "
        f"x 2 instances, {duration} of telemetry at {speed}x; {told.fault}"
        + (f"; waiting for: {wanted}" if wanted else "")
    )
    hours = parse_duration(duration) / 3600
    return start, hours if scenario in PLAYED_OUT else None


def run_demo(
    settings: Settings,
    environ: Mapping[str, str],
    *,
    scenario: str = "leak",
    as_json: bool = False,
    timeout_s: float | None = None,
    out: TextIO | None = None,
    workers: int = 1,
) -> int:
    from ragwatch.kafka_admin import check_kafka, ensure_topics

    own = tuple(
        n
        for n, f in (("kafka", "kafka_bootstrap"), ("redis", "redis_url"))
        if f not in settings.explicit
    )
    if "kafka" not in own:  # an external broker: one line now, before anything starts
        check_kafka(settings, "demo")
    run_id = uuid.uuid4().hex[:8]
    run_dir = Path(tempfile.mkdtemp(prefix=f"ragwatch-demo-{run_id}-"))
    stack = EmbeddedStack(run_dir / "stack")
    told = story(scenario)
    if timeout_s is None:  # each worker more: a rebalance or two (seconds each)
        timeout_s = TIMEOUT_S.get(scenario, 150.0) + 20.0 * (workers - 1)
    receiver = WebhookReceiver().start()
    slack = WebhookReceiver().start()
    pager = WebhookReceiver().start()
    pager.status = 202  # as PagerDuty's Events API answers
    children: Children | None = None
    deadline = time.monotonic() + timeout_s
    ok = False
    try:
        if own:
            say(f"starting embedded {' + '.join(own)} in {stack.state_dir}")
            stack.up(own)
        notify_file = run_dir / "notify.yaml"
        notify_file.write_text(NOTIFY_YAML.format(hook=receiver.url, slack=slack.url, pd=pager.url))
        env = _demo_env(environ, stack, own, run_id, run_dir, notify_file)
        demo_settings = Settings.from_env(env)
        ensure_topics(demo_settings, command="demo")
        say(
            f"kafka {demo_settings.kafka_bootstrap}; local receivers: webhook {receiver.url}, "
            f"Slack-like {slack.url}, PagerDuty-like {pager.url}"
        )
        children = Children(run_dir, env)
        _start_workers(children, workers, run_dir)
        children.start("notify", "notify")
        start, hours = _start_agent(children, told)
        watch = Watch(
            told,
            receiver,
            demo_settings,
            start_ts=start,
            hours=hours,
            as_json=as_json,
            out=out,
            timeout_s=timeout_s,
        )
        try:
            ok = watch.until_expected(children, deadline)
            if ok and scenario in HEALING:
                ok = watch.until_healed(children, deadline)
        finally:
            watch.close()
        if ok or not told.expected:
            healed = scenario in HEALING
            ok = (
                check_receivers(receiver, slack, pager, expected=bool(told.expected), healed=healed)
                and ok
            )
        ok = watch.verdict() and ok
        return 0 if ok else 1
    finally:
        if children is not None:
            children.stop_all()
        for r in (receiver, slack, pager):
            r.stop()
        stack.down()
        if ok:
            shutil.rmtree(run_dir, ignore_errors=True)
        else:
            say(f"logs kept in {run_dir}")


def _start_workers(children: Children, workers: int, run_dir: Path) -> None:
    """``workers`` workers in one consumer group (the demo's app id), each with its own id
    and state dir; one is called ``worker`` as before."""
    if workers == 1:
        children.start("worker", "worker")
        return
    for i in range(1, workers + 1):
        children.start(
            f"worker-{i}",
            "worker",
            env={
                "RAGWATCH_WORKER_ID": f"demo-worker-{i}",
                "RAGWATCH_STATE_DIR": str(run_dir / f"worker-{i}"),
            },
        )


def _start(duration: str) -> float:
    """The fleet's first event time: midnight UTC, far enough back that the run ends before
    now. Always the same time of day, so every run of a scenario replays the same telemetry
    (same daily phase, same bucket boundaries) and gives the same alerts."""
    day = 86400.0
    return (time.time() - parse_duration(duration)) // day * day - day
