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
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import orjson

from ragwatch.config import Settings
from ragwatch.embedded import EmbeddedStack, stop_process
from ragwatch.receiver import WebhookReceiver

HOSTS, GPUS, SPEED, INTERVAL = 4, 2, 720.0, 10.0


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


def _expected_alert(body: dict[str, Any], target: tuple[str, int, int, str]) -> bool:
    host, gpu, pid, _ = target
    return any(
        a.get("status") == "firing"
        and a["labels"].get("alertname") == "GpuMemoryLeak"
        and a["labels"].get("host") == host
        and a["labels"].get("gpu") == str(gpu)
        and a["labels"].get("pid") == str(pid)
        for a in body.get("alerts", [])
    )


def _print_alert(a: dict[str, Any], as_json: bool, out: TextIO) -> None:
    if as_json:
        out.write(orjson.dumps(a).decode() + "\n")
    else:
        lab = a["labels"]
        out.write(
            f"{a['status'].upper()} {lab.get('alertname')} host={lab.get('host')} "
            f"gpu={lab.get('gpu')} pid={lab.get('pid')} process={lab.get('process')} "
            f"container={lab.get('container')}\n"
        )
        for key in ("summary", "description", "runbook"):
            if key in a["annotations"]:
                out.write(f"  {key}: {a['annotations'][key]}\n")
    out.flush()


def _redis_has(settings: Settings, fingerprint: str) -> bool:
    import redis

    from ragwatch.streams.state import Keys

    client = redis.Redis.from_url(settings.redis_url, socket_timeout=5)
    try:
        raw = client.hget(Keys(settings.redis_prefix).active, fingerprint)
        return raw is not None and orjson.loads(raw).get("status") == "firing"
    finally:
        client.close()


def run_demo(
    settings: Settings,
    environ: Mapping[str, str],
    *,
    scenario: str = "leak",
    as_json: bool = False,
    timeout_s: float = 150.0,
    out: TextIO = sys.stdout,
) -> int:
    from ragwatch.agents.sim import FleetSimulator, SimConfig
    from ragwatch.kafka_admin import ensure_topics

    run_id = uuid.uuid4().hex[:8]
    run_dir = Path(tempfile.mkdtemp(prefix=f"ragwatch-demo-{run_id}-"))
    stack = EmbeddedStack(run_dir / "stack")
    own = tuple(
        n
        for n, f in (("kafka", "kafka_bootstrap"), ("redis", "redis_url"))
        if f not in settings.explicit
    )
    target = FleetSimulator(SimConfig(hosts=HOSTS, gpus=GPUS, scenario=scenario)).leak_target
    assert target is not None
    receiver = WebhookReceiver().start()
    children: _Children | None = None
    deadline = time.monotonic() + timeout_s
    ok = False
    try:
        if own:
            _say(f"starting embedded {' + '.join(own)} in {stack.state_dir}")
            stack.up(own)
        env = {
            **environ,
            **stack.env(),
            "RAGWATCH_WEBHOOK_URLS": receiver.url,
            "RAGWATCH_APP_ID": f"ragwatch-demo-{run_id}",
            "RAGWATCH_KAFKA_SESSION_TIMEOUT": "6",
            "RAGWATCH_STATE_DIR": str(run_dir),
        }
        if "kafka" not in own:
            env["RAGWATCH_TOPIC_PREFIX"] = f"demo-{run_id}."
        if "redis" not in own:
            env["RAGWATCH_REDIS_PREFIX"] = f"ragwatch-demo-{run_id}"
        demo_settings = Settings.from_env(env)
        ensure_topics(demo_settings)
        _say(f"kafka {demo_settings.kafka_bootstrap}, webhook receiver {receiver.url}")
        children = _Children(run_dir, env)
        children.start("worker", "worker")
        children.start(
            "agent",
            "agent",
            "--source",
            "sim",
            "--scenario",
            scenario,
            "--hosts",
            str(HOSTS),
            "--gpus",
            str(GPUS),
            "--speed",
            str(SPEED),
            "--interval",
            str(INTERVAL),
            "--duration",
            "12h",
        )
        host, gpu, pid, proc = target
        _say(
            f"fleet: {HOSTS} hosts x {GPUS} GPUs at {SPEED:g}x; {proc} pid {pid} on {host} "
            f"GPU {gpu} leaks 1.2 GB/h from minute 20; waiting for the page..."
        )
        seen = 0
        body = None
        while body is None and time.monotonic() < deadline:
            if children.dead():
                name = children.dead()[0]
                _say(f"{name} exited early; last log lines:\n{children.log_tail(name)}")
                return 1
            body = receiver.wait_for(lambda b: _expected_alert(b, target), 0.5)
            for b in receiver.bodies[seen:]:
                for a in b["alerts"]:
                    _print_alert(a, as_json, out)
            seen = len(receiver.bodies)
        if body is None:
            _say(
                f"timeout after {timeout_s:.0f}s: no firing GpuMemoryLeak alert for {host} "
                f"GPU {gpu} pid {pid} reached the webhook ({len(receiver.bodies)} bodies "
                f"received). Worker log tail:\n{children.log_tail('worker')}"
            )
            return 1
        fp = next(a["fingerprint"] for a in body["alerts"] if a["status"] == "firing")
        while not _redis_has(demo_settings, fp):
            if time.monotonic() > deadline:
                _say(f"the webhook got the alert but Redis has no firing alert {fp}")
                return 1
            time.sleep(0.2)
        _say(
            f"alert {fp} delivered to the webhook and stored in Redis "
            f"({timeout_s - (deadline - time.monotonic()):.1f}s)"
        )
        ok = True
        return 0
    finally:
        if children is not None:
            children.stop_all()
        receiver.stop()
        stack.down()
        if ok:
            shutil.rmtree(run_dir, ignore_errors=True)
        else:
            _say(f"logs kept in {run_dir}")
