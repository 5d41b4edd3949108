"""``ragwatch demo``: the GPU memory-leak incident, end to end, on this machine.

Brings up the embedded stack (unless ``RAGWATCH_KAFKA_BOOTSTRAP`` / ``RAGWATCH_REDIS_URL``
point at running services), a local webhook receiver, one ``ragwatch worker`` and one
simulated ``ragwatch agent`` (4 hosts x 2 GPUs at 720x speed, one rag-worker leaking
1.2 GB/h), and waits until the leak alert is firing both at the webhook and in Redis.
Everything it started is stopped again, whatever happens.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import orjson

from ragwatch.config import Settings, parse_duration
from ragwatch.embedded import EmbeddedStack, stop_process
from ragwatch.receiver import WebhookReceiver

HOSTS, GPUS, SERVICES = 4, 2, 2
REQUEST_RULES = {
    "throughput": ("TokensPerRequestDrop",),
    "retrieval": ("RetrievalSlowdown",),
    "outliers": ("RequestOutlierCluster",),
    "all": ("TokensPerRequestDrop", "RetrievalSlowdown", "RequestOutlierCluster"),
}
# speed, sample interval, simulated duration: faults play 12 h at 720x (an hour in five
# seconds); healthy plays three days at 4320x with 1-minute samples, and must stay quiet.
# oom and all run until the leaking worker has been OOM-killed (~12.4 h in).
PACE = {"healthy": ("4320", "60", "3d"), "oom": ("720", "10", "13h"), "all": ("720", "10", "13h")}
OOM_SCENARIOS = ("oom", "all")
TIMEOUT_S = {"healthy": 300.0}  # default --timeout per scenario (else 150 s)
HEALING, HEAL_AFTER = ("all",), "5h"  # the request faults of `all` end 5 h in
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


def _say(msg: str) -> None:
    print(f"[demo] {msg}", file=sys.stderr, flush=True)


class _Children:
    """Subprocesses of the demo, each in its own session, logs in the run dir."""

    def __init__(self, run_dir: Path, env: Mapping[str, str]) -> None:
        self.run_dir, self.env = run_dir, dict(env)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *args: str) -> None:
        with open(self.run_dir / f"{name}.log", "wb") as out:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "ragwatch", *args],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def dead(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.poll() is not None and n != "agent"]

    def log_tail(self, name: str, chars: int = 1500) -> str:
        with contextlib.suppress(OSError):
            return (self.run_dir / f"{name}.log").read_text(errors="replace")[-chars:]
        return ""

    def stop_all(self) -> None:
        for proc in reversed(list(self.procs.values())):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            stop_process(proc.pid, 0.1)


@dataclass(frozen=True)
class Expectation:
    """An alert the scenario must produce: its rule, the labels naming the culprit, and a
    root-cause hint."""

    rule: str
    labels: tuple[tuple[str, str], ...]
    what: str

    def met_by(self, alert: dict[str, Any]) -> bool:
        lab = alert["labels"]
        return (
            alert.get("status") == "firing"
            and lab.get("alertname") == self.rule
            and all(lab.get(k) == v for k, v in self.labels)
            and bool(alert.get("annotations", {}).get("hint"))
        )


def expectations(scenario: str) -> list[Expectation]:
    """What ``ragwatch demo --scenario`` waits for (nothing, for ``healthy``)."""
    from ragwatch.agents.scenario import GPU_LEAK_SCENARIOS, build

    world = build(scenario, hosts=HOSTS, gpus=GPUS, services=SERVICES)
    out = []
    if scenario in GPU_LEAK_SCENARIOS:
        leak = world.fleet.leak_target
        assert leak is not None
        host, gpu, pid, _ = leak
        if scenario in OOM_SCENARIOS:
            out.append(
                Expectation(
                    "GpuOomKill",
                    (("host", host), ("gpu", str(gpu)), ("pid", str(pid))),
                    f"GpuOomKill alert for {host} GPU {gpu} pid {pid}",
                )
            )
        out.append(
            Expectation(
                "GpuMemoryLeak",
                (("host", host), ("gpu", str(gpu)), ("pid", str(pid))),
                f"GpuMemoryLeak alert for {host} GPU {gpu} pid {pid}",
            )
        )
    fault = world.requests.fault_target if world.requests is not None else None
    for rule in REQUEST_RULES.get(scenario, ()):
        assert fault is not None
        out.append(
            Expectation(
                rule,
                (("service", fault.service), ("instance", fault.instance)),
                f"{rule} alert for {fault.service} ({fault.instance})",
            )
        )
    return out


def _print_alert(a: dict[str, Any], as_json: bool, out: TextIO) -> None:
    if as_json:
        out.write(orjson.dumps(a).decode() + "\n")
    else:
        lab = a["labels"]
        who = " ".join(
            f"{k}={lab[k]}"
            for k in ("host", "gpu", "pid", "process", "container", "service", "instance")
            if k in lab
        )
        out.write(f"{a['status'].upper()} {lab.get('alertname')} {who}\n")
        for key in ("summary", "description", "hint", "runbook"):
            if key in a["annotations"]:
                out.write(f"  {key}: {a['annotations'][key]}\n")
    out.flush()


def _redis_fired(settings: Settings) -> set[str]:
    """Fingerprints of every alert that has been firing, from the Redis alert history."""
    from ragwatch.store import Keys, blocking_client

    client = blocking_client(settings.redis_url)
    try:
        history = client.lrange(Keys(settings.redis_prefix).history, 0, -1)
        return {a["fingerprint"] for a in map(orjson.loads, history) if a["status"] == "firing"}
    finally:
        client.close()


def _worker_messages(settings: Settings) -> int:
    from ragwatch.store import Keys, blocking_client

    client = blocking_client(settings.redis_url)
    try:
        return sum(
            orjson.loads(v)["messages"] for v in client.hvals(Keys(settings.redis_prefix).workers)
        )
    finally:
        client.close()


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


def _start_agent(children: _Children, scenario: str, wanted: Sequence[Expectation]) -> None:
    """The simulated fleet of ``scenario``, played at the scenario's pace."""
    speed, interval, duration = PACE.get(scenario, DEFAULT_PACE)
    children.start(
        "agent",
        "agent",
        *("--source", "sim", "--scenario", scenario),
        *("--hosts", str(HOSTS), "--gpus", str(GPUS), "--services", str(SERVICES)),
        *("--speed", speed, "--interval", interval, "--duration", duration),
        *("--start", str(_start(duration))),
        *(("--heal-after", HEAL_AFTER) if scenario in HEALING else ()),
    )
    _say(
        f"scenario {scenario}: {HOSTS} hosts x {GPUS} GPUs and {SERVICES} RAG services "
        f"x 2 instances, {duration} of telemetry at {speed}x; the fault starts at minute "
        f"20; waiting for: {'; '.join(e.what for e in wanted) or 'silence'}"
    )


def run_demo(
    settings: Settings,
    environ: Mapping[str, str],
    *,
    scenario: str = "leak",
    as_json: bool = False,
    timeout_s: float | None = None,
    out: TextIO = sys.stdout,
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
    wanted = expectations(scenario)
    if timeout_s is None:
        timeout_s = TIMEOUT_S.get(scenario, 150.0)
    receiver = WebhookReceiver().start()
    slack = WebhookReceiver().start()
    pager = WebhookReceiver().start()
    pager.status = 202  # as PagerDuty's Events API answers
    children: _Children | None = None
    deadline = time.monotonic() + timeout_s
    ok = False
    try:
        if own:
            _say(f"starting embedded {' + '.join(own)} in {stack.state_dir}")
            stack.up(own)
        notify_file = run_dir / "notify.yaml"
        notify_file.write_text(NOTIFY_YAML.format(hook=receiver.url, slack=slack.url, pd=pager.url))
        env = _demo_env(environ, stack, own, run_id, run_dir, notify_file)
        demo_settings = Settings.from_env(env)
        ensure_topics(demo_settings, command="demo")
        _say(
            f"kafka {demo_settings.kafka_bootstrap}; local receivers: webhook {receiver.url}, "
            f"Slack-like {slack.url}, PagerDuty-like {pager.url}"
        )
        children = _Children(run_dir, env)
        children.start("worker", "worker")
        children.start("notify", "notify")
        _start_agent(children, scenario, wanted)
        ok = _watch(children, receiver, demo_settings, wanted, deadline, timeout_s, as_json, out)
        if ok and scenario in HEALING:
            ok = _healed(children, receiver, wanted, deadline)
        if ok or not wanted:
            ok = _check_receivers(receiver, slack, pager, wanted, healed=scenario in HEALING) and ok
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
            _say(f"logs kept in {run_dir}")


def _healed(
    children: _Children, receiver: WebhookReceiver, wanted: list[Expectation], deadline: float
) -> bool:
    """Wait until every expected alert has also resolved at the webhook."""
    names = {e.rule for e in wanted}
    while time.monotonic() < deadline:
        if children.dead():
            return False
        resolved = {
            a["labels"].get("alertname")
            for b in receiver.bodies
            for a in b["alerts"]
            if a["status"] == "resolved"
        }
        if names <= resolved:
            _say(f"the scenario healed: {len(names)} alert(s) resolved at the webhook")
            return True
        receiver.wait_for(lambda b: False, 0.5)
    _say(f"timeout: not resolved: {', '.join(sorted(names - resolved))}")
    return False


def _check_receivers(
    hook: WebhookReceiver,
    slack: WebhookReceiver,
    pager: WebhookReceiver,
    wanted: list[Expectation],
    *,
    healed: bool,
) -> bool:
    """What each receiver got: every transition once at the webhook and PagerDuty (one
    trigger, and after healing one resolve, per alert), and Slack in few messages."""
    time.sleep(1.0)  # let the last deliveries land
    if wanted:  # Slack's group waits 30 s of event time; the notifier's clock may lag a bit
        slack.wait_for(lambda b: True, 10.0)
    seen: dict[tuple[str, str], int] = {}
    for b in hook.bodies:
        for a in b["alerts"]:
            k = (a["fingerprint"], a["status"])
            seen[k] = seen.get(k, 0) + 1
    events: dict[tuple[str, str], int] = {}
    for e in pager.bodies:
        k = (e.get("dedup_key", ""), e.get("event_action", ""))
        events[k] = events.get(k, 0) + 1
    triggers = sum(n for (_, act), n in events.items() if act == "trigger")
    resolves = sum(n for (_, act), n in events.items() if act == "resolve")
    _say(
        f"receivers: webhook {len(hook.bodies)} bodies, Slack-like {len(slack.bodies)} "
        f"messages, PagerDuty-like {triggers} triggers + {resolves} resolves"
    )
    problems = [f"webhook got {k[1]} of {k[0]} {n} times" for k, n in seen.items() if n > 1]
    problems += [f"PagerDuty got {k[1]} {k[0]} {n} times" for k, n in events.items() if n > 1]
    if healed:  # every alert that resolved at the webhook was resolved at PagerDuty too
        resolved_fps = {
            a["fingerprint"] for b in hook.bodies for a in b["alerts"] if a["status"] == "resolved"
        }
        fp_of = {
            e.get("dedup_key", ""): (e.get("payload") or {})
            .get("custom_details", {})
            .get("fingerprint")
            for e in pager.bodies
            if e.get("event_action") == "trigger"
        }
        resolved_keys = {k for (k, act) in events if act == "resolve"}
        problems += [
            f"PagerDuty incident {k} was never resolved"
            for k, fp in sorted(fp_of.items())
            if fp in resolved_fps and k not in resolved_keys
        ]
    if wanted and not slack.bodies:
        problems.append("Slack got no message")
    for p in problems:
        _say(p)
    return not problems


def _start(duration: str) -> float:
    """The fleet's first event time: midnight UTC, far enough back that the run ends before
    now. Always the same time of day, so every run of a scenario replays the same telemetry
    (same daily phase, same bucket boundaries) and gives the same alerts."""
    day = 86400.0
    return (time.time() - parse_duration(duration)) // day * day - day


def _watch(
    children: _Children,
    receiver: WebhookReceiver,
    settings: Settings,
    wanted: list[Expectation],
    deadline: float,
    timeout_s: float,
    as_json: bool,
    out: TextIO,
) -> bool:
    """Print alerts as they arrive until every expectation is met at the webhook and in
    Redis (or, with none, until the agent is done and the worker drained with no page)."""
    seen, met = 0, {}
    quiet_since, last_count = None, -1
    while time.monotonic() < deadline:
        if children.dead():
            name = children.dead()[0]
            _say(f"{name} exited early; last log lines:\n{children.log_tail(name)}")
            return False
        receiver.wait_for(lambda b: False, 0.5)
        for b in receiver.bodies[seen:]:
            for a in b["alerts"]:
                _print_alert(a, as_json, out)
                met.update({e.what: a["fingerprint"] for e in wanted if e.met_by(a)})
        seen = len(receiver.bodies)
        if wanted and len(met) == len(wanted):
            while not set(met.values()) <= _redis_fired(settings):
                if time.monotonic() > deadline:
                    _say("the webhook got the alerts but Redis did not record them firing")
                    return False
                time.sleep(0.2)
            _say(
                f"{len(met)} expected alert(s) delivered to the webhook and stored in Redis "
                f"({timeout_s - (deadline - time.monotonic()):.1f}s)"
            )
            return True
        if not wanted and children.procs["agent"].poll() is not None:
            count = _worker_messages(settings)  # drained = the count stopped moving
            quiet_since = time.monotonic() if count != last_count else quiet_since
            last_count = count
            if quiet_since is not None and time.monotonic() - quiet_since > 3:
                paged = [a for b in receiver.bodies for a in b["alerts"] if a["status"] == "firing"]
                _say(f"healthy fleet: {count} messages processed, {len(paged)} page(s)")
                return not paged
    missing = [e.what for e in wanted if e.what not in met]
    _say(
        f"timeout after {timeout_s:.0f}s: no firing {'; no firing '.join(missing)} reached "
        f"the webhook ({len(receiver.bodies)} bodies received). Worker log tail:\n"
        f"{children.log_tail('worker')}"
    )
    return False
