"""``ragwatch status`` over a real Redis: the full view, --json, --watch, and whatever
partial or old data a Redis may hold. (Redis unreachable: ``test_cli.py``.)"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
import uuid
from pathlib import Path

import orjson
import pytest
import redis

from ragwatch.embedded import EmbeddedStack
from ragwatch.store import Keys
from tests.integration.conftest import clean_environ, run_ragwatch
from tests.integration.fleet_data import Fleet, write_fleet


@pytest.fixture(scope="module")
def fleet_env(stack: EmbeddedStack) -> tuple[dict[str, str], Fleet]:
    env = {**stack.env(), "RAGWATCH_REDIS_PREFIX": f"status-{uuid.uuid4().hex[:8]}"}
    return env, write_fleet(env["RAGWATCH_REDIS_URL"], env["RAGWATCH_REDIS_PREFIX"])


def test_status_shows_fleet_services_alerts_silences_and_notifier(
    fleet_env: tuple[dict[str, str], Fleet],
) -> None:
    env, fleet = fleet_env
    out = run_ragwatch("status", env=env)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for section in ("HOSTS", "GPUS", "SERVICES", "ALERTS (2 firing, 1 pending)", "SILENCES"):
        assert section in text, section
    # the leaking GPU: growth, time to exhaustion and its top process
    row = next(line.split() for line in text.splitlines() if line.startswith("gpu-node-01  1 "))
    growth, oom_in = float(row[4]), row[5]
    assert growth > 0.8 and oom_in.endswith("h") and 5 < float(oom_in[:-1]) < 20
    assert row[-5:-2] == ["rag-worker", "pid", "4011"]
    assert "growth GPU1 +1.1" in text  # the host's top GPUs
    assert "http://vllm-0:8000/metrics" in text  # its scraped engine
    # per instance: tokens/request vs forecast, stages, queue
    row = next(line for line in text.splitlines() if line.startswith("rag-api  rag-api-1 "))
    assert re.search(r"\d+/\d+ [+-]\d+%", row) and "retriever " in row  # vs forecast, stages
    assert "FIRING" in text and "GpuMemoryLeak" in text and "pid=4011" in text
    assert "hint: " + fleet.leak.annotations["hint"][:60] in text
    active, pending, expired = fleet.silences
    assert active in text and pending in text and expired not in text
    assert "cron '0 0 29 2 *' UTC" in text and "deploy of rag-api" in text
    assert "NOTIFIER outbox 2 due, 1 dead letters, last seen" in text
    assert "receivers.slack.sent=3" in text
    assert "\x1b" not in text  # a hostile process name cannot drive the terminal


def test_status_json_has_silences_and_notifier(fleet_env: tuple[dict[str, str], Fleet]) -> None:
    env, fleet = fleet_env
    out = run_ragwatch("status", "--json", env=env)
    status = json.loads(out.stdout)
    assert set(status) == {
        "hosts", "services", "total_hosts", "total_services", "alerts", "history", "workers",
        "silences", "notifier", "flaps",
    }  # fmt: skip
    assert status["flaps"] == []  # nothing here fired again soon after resolving
    assert [a["fingerprint"] for a in status["alerts"] if a["status"] == "firing"] == [
        fleet.leak.fingerprint,
        fleet.hostile.fingerprint,
    ]
    assert status["notifier"]["outbox_pending"] == 2
    assert [s["id"] for s in status["silences"]] == fleet.silences[1::-1]
    # silenced alerts still show, with the active silences that mute them
    muted = {a["labels"]["alertname"]: a["silenced_by"] for a in status["alerts"]}
    assert muted.pop("DecodeSpeedDrop") == [fleet.silences[0]]  # the pending one, silenced
    assert all(ids == [] for ids in muted.values())


def test_silenced_alerts_still_show_with_their_silence(
    fleet_env: tuple[dict[str, str], Fleet],
) -> None:
    env, fleet = fleet_env
    host = fleet.leak.labels["host"]
    out = run_ragwatch(
        "silence", "add", "--match", f"host={host}", "--match", "alertname=GpuMemoryLeak",
        "--duration", "1h", "--comment", "test", env=env,
    )  # fmt: skip
    sid = out.stdout.split()[0]
    try:
        status = json.loads(run_ragwatch("status", "--json", env=env).stdout)
        by_fp = {a["fingerprint"]: a["silenced_by"] for a in status["alerts"]}
        assert by_fp[fleet.leak.fingerprint] == [sid]
        assert by_fp[fleet.hostile.fingerprint] == []
        assert "SILENCED" in run_ragwatch("status", env=env).stdout
    finally:
        assert run_ragwatch("silence", "expire", sid, env=env).returncode == 0


def test_status_watch_redraws_in_a_terminal_until_ctrl_c(
    fleet_env: tuple[dict[str, str], Fleet],
) -> None:
    env, _ = fleet_env
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 120, 200, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "ragwatch", "status", "--watch", "--interval", "0.2s"],
        env={**clean_environ(), **env, "TERM": "xterm-256color"},
        stdin=slave,
        stdout=slave,
        stderr=subprocess.PIPE,
    )
    os.close(slave)
    screen = b""
    deadline = time.monotonic() + 20
    interrupted = False
    while proc.poll() is None and time.monotonic() < deadline:  # keep reading: a full pty
        if select.select([master], [], [], 0.2)[0]:  # buffer would block the redraws
            try:
                screen += os.read(master, 1 << 16)
            except OSError:  # EIO: the child closed the terminal
                break
        if not interrupted and screen.count(b"ALERTS (2 firing, 1 pending)") >= 3:
            proc.send_signal(signal.SIGINT)
            interrupted = True
    os.close(master)
    try:
        code = proc.wait(5)
    except subprocess.TimeoutExpired:  # never leave it running (nor block on its stderr)
        proc.kill()
        code = proc.wait(5)
    err = proc.stderr.read() if proc.stderr else b""
    assert interrupted and code == 0, (screen[-2000:], err)
    assert screen.count(b"ALERTS (2 firing, 1 pending)") >= 3  # drawn, then redrawn
    assert b"\x1b[2J" not in screen  # the hostile name's escape is shown, not obeyed


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_status_watch_into_a_file_appends_plain_snapshots_until_a_signal(
    fleet_env: tuple[dict[str, str], Fleet], tmp_path: Path, sig: signal.Signals
) -> None:
    """No terminal (``status --watch > file``): a plain-text snapshot per refresh, each
    flushed as it is written; SIGTERM or Ctrl-C ends it with exit 0."""
    env, _ = fleet_env
    path = tmp_path / "status.txt"
    header = "ALERTS (2 firing, 1 pending)"
    with open(path, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ragwatch", "status", "--watch", "--interval", "0.2s"],
            env={**clean_environ(), **env},
            stdout=out,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + 30
        # Bytes while it runs: a read can land mid-write, inside a multi-byte character.
        while path.read_bytes().count(header.encode()) < 3 and time.monotonic() < deadline:
            assert proc.poll() is None
            time.sleep(0.1)
        assert path.read_bytes().count(header.encode()) >= 3  # written while it runs
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert b"Traceback" not in err
    text = path.read_text()
    assert "\x1b" not in text  # plain text: no cursor moves, no colours
    snapshots = text.split("ragwatch status  ")[1:]
    assert len(snapshots) >= 3
    for snap in snapshots:  # each one whole, the last one too
        assert header in snap and "HOSTS" in snap and "NOTIFIER outbox" in snap
        assert snap.endswith("\n\n")


def _watch_json(env: dict[str, str]) -> subprocess.Popen[str]:
    """``ragwatch status --watch --json``, refreshing every 0.2 s, its output piped."""
    return subprocess.Popen(
        [sys.executable, "-m", "ragwatch", "status", "--watch", "--json", "--interval", "0.2s"],
        env={**clean_environ(), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_status_watch_json_prints_a_line_per_refresh(
    fleet_env: tuple[dict[str, str], Fleet],
) -> None:
    env, fleet = fleet_env
    proc = _watch_json(env)
    assert proc.stdout is not None
    lines = [proc.stdout.readline() for _ in range(3)]
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 0, stderr
    for line in lines:
        assert json.loads(line)["alerts"][0]["fingerprint"] == fleet.leak.fingerprint


def test_status_watch_ends_at_once_on_a_signal_while_a_read_of_redis_hangs(
    own_stack: EmbeddedStack,
) -> None:
    """Ctrl-C while a read hangs (Redis frozen, its 5 s timeout still running: a loaded
    machine) ends the watch at once with exit 0, and every JSON line it wrote is whole."""
    pid = own_stack.services()["redis"].pid
    env = {**own_stack.env(), "RAGWATCH_REDIS_PREFIX": "frozen"}
    fleet = write_fleet(env["RAGWATCH_REDIS_URL"], env["RAGWATCH_REDIS_PREFIX"])
    proc = _watch_json(env)
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(2)]
        os.kill(pid, signal.SIGSTOP)
        time.sleep(1.0)  # the next read has begun, and hangs
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=3)  # Redis still frozen: not its timeout's end
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    for line in [*lines, *out.splitlines()]:
        assert json.loads(line)["alerts"][0]["fingerprint"] == fleet.leak.fingerprint


def test_status_survives_empty_partial_and_old_data(
    stack: EmbeddedStack, redis_client: redis.Redis
) -> None:
    env = {**stack.env(), "RAGWATCH_REDIS_PREFIX": f"partial-{uuid.uuid4().hex[:8]}"}
    empty = run_ragwatch("status", env=env)
    assert empty.returncode == 0, empty.stderr
    assert (
        "no hosts reported yet" in empty.stdout and "ALERTS (0 firing, 0 pending)" in empty.stdout
    )
    status = json.loads(run_ragwatch("status", "--json", env=env).stdout)
    assert status["silences"] == [] and status["notifier"] == {
        "outbox_pending": 0,
        "dead_letters": 0,
        "counters": {},
        "seen": None,
    }

    keys = Keys(env["RAGWATCH_REDIS_PREFIX"])
    old_gpu = {"index": 0, "mig": None, "procs": [{"pid": 7, "name": "p"}],
               "fb_used_bytes": 1e9, "fb_total_bytes": 8e10, "gb_per_hour": None}  # fmt: skip
    redis_client.hset(
        keys.hosts,
        mapping={
            "no-gpus": orjson.dumps({"host": "no-gpus", "gpus": [], "top_gpus": {}}),
            "old": orjson.dumps({"host": "old", "gpus": [old_gpu]}),  # before top_gpus/engines
            "bare": orjson.dumps({"host": "bare"}),
            "garbage": b"{not json",
        },
    )
    redis_client.hset(
        keys.services,
        mapping={
            "svc": orjson.dumps({"service": "svc", "instances": [{"instance": "i0"}]}),
            "nosig": orjson.dumps(
                {"service": "nosig", "instances": [{"instance": "i", "signals": {}}]}
            ),
        },
    )
    partial = {"rule": "X", "status": "firing", "labels": {}, "annotations": {}}
    redis_client.hset(keys.active, mapping={"fp": orjson.dumps(partial), "bad": b"["})
    redis_client.hset(keys.silences, mapping={"s1": b'{"matchers": []}', "s2": b"x"})
    redis_client.hset(keys.notifier, "counters", b"not json")
    for args in (["status"], ["status", "--json"]):
        out = run_ragwatch(*args, env=env)
        assert out.returncode == 0, out.stderr
        assert "Traceback" not in out.stderr
    text = run_ragwatch("status", env=env).stdout
    assert "ALERTS (1 firing, 0 pending)" in text and "old" in text and "no-gpus" in text
