"""The commands a user types: demo, dev up/down/status, status, agent; their errors."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest

from ragwatch.embedded import EmbeddedStack, pid_alive
from tests.integration.conftest import our_processes
from tests.integration.conftest import run_ragwatch as ragwatch


def test_demo_catches_the_leak_and_leaves_nothing_running(stack: EmbeddedStack) -> None:
    """With two workers in one consumer group (the partitions shared, as in production):
    the leak pages, and every process the demo started is gone after it."""
    before = our_processes()
    out = ragwatch("demo", "--json", "--workers", "2", env={}, timeout=200)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "starting embedded kafka + redis" in out.stderr
    alerts = [json.loads(line) for line in out.stdout.splitlines()]
    firing = [a for a in alerts if a["status"] == "firing"]
    assert firing, out.stdout
    labels = firing[0]["labels"]
    assert (labels["alertname"], labels["host"], labels["gpu"], labels["pid"]) == (
        "GpuMemoryLeak",
        "gpu-node-01",
        "1",
        "4011",
    )
    assert "GB/h" in firing[0]["annotations"]["summary"]
    assert our_processes() == before


def as_the_docs_say(scenario: str, out: Any, keys: tuple[str, ...]) -> None:
    """A fresh demo run's numbers are within what the docs quote: the runs recorded by
    bench/docs_numbers.py (README's and docs/commands.md's blocks are rendered from them,
    tests/unit/test_docs_numbers.py), widened by its stated tolerance. A change that moves
    them fails here until the script is run again and the docs say the new numbers."""
    from tests.bench_modules import load

    tool = load("docs_numbers")
    data = json.loads(tool.RESULTS.read_text())
    said = "\n".join(ln for ln in out.stderr.splitlines() if ln.startswith("[demo] "))
    got = tool.numbers(scenario, out.stdout, said)
    for key in keys:
        lo, hi = tool.spread(data, scenario, key)
        tol = data["tolerance"][key]
        assert got[key] is not None and lo - tol <= got[key] <= hi + tol, (key, got, lo, hi)


def test_demo_uses_existing_kafka_and_redis_when_configured(stack: EmbeddedStack) -> None:
    before = our_processes()
    out = ragwatch("demo", env=stack.env(), timeout=200)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "starting embedded" not in out.stderr
    assert "FIRING GpuMemoryLeak host=gpu-node-01 gpu=1 pid=4011" in out.stdout
    assert our_processes() == before
    assert all(s.alive for s in stack.services().values())
    # what it injects, true for the scenario; the numbers the README quotes
    assert (
        "at minute 20, rag-worker pid 4011 on gpu-node-01 GPU 1 starts leaking 1.2 GB/h; "
        "waiting for: GpuMemoryLeak alert for gpu-node-01 GPU 1 pid 4011"
    ) in out.stderr
    as_the_docs_say(
        "leak",
        out,
        ("gb_per_hour", "increase_gb", "window_h", "tte_h", "webhook_bodies", "slack_messages"),
    )


def test_dev_up_is_idempotent_prints_exports_and_down_stops(tmp_path: Path) -> None:
    env = {"RAGWATCH_STATE_DIR": str(tmp_path / "dev")}
    first = ragwatch("dev", "up", env=env)
    assert first.returncode == 0, first.stderr
    exports = dict(re.findall(r"^export (RAGWATCH_\w+)=(\S+)$", first.stdout, re.M))
    assert set(exports) == {"RAGWATCH_KAFKA_BOOTSTRAP", "RAGWATCH_REDIS_URL"}
    again = ragwatch("dev", "up", env=env)
    assert again.stdout == first.stdout  # same services, same ports
    assert ragwatch("dev", "status", env=env).returncode == 0
    services = EmbeddedStack(tmp_path / "dev").services()
    try:
        # The printed settings work: a status read goes to that Redis.
        status = ragwatch("status", "--json", env=exports)
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["alerts"] == []
    finally:
        down = ragwatch("dev", "down", env=env)
    assert down.returncode == 0 and "kafka" in down.stdout and "redis" in down.stdout
    assert not any(pid_alive(s.pid) for s in services.values())
    assert ragwatch("dev", "status", env=env).returncode == 1


def test_dev_up_without_redis_server_is_one_clear_error(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {"RAGWATCH_STATE_DIR": str(tmp_path / "dev"), "PATH": str(empty)}
    out = ragwatch("dev", "up", env=env)
    assert out.returncode == 2
    assert out.stderr.startswith("ragwatch: error: redis-server not found")
    assert "apt-get install -y redis-server" in out.stderr
    assert "Traceback" not in out.stderr
    assert EmbeddedStack(tmp_path / "dev").services() == {}  # nothing half-started


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RAGWATCH_KAFKA_BOOTSTRAP": "no-port"}, "RAGWATCH_KAFKA_BOOTSTRAP: expected host:port"),
        ({"RAGWATCH_WEBHOOK_URLS": "ftp://x/y"}, "RAGWATCH_WEBHOOK_URLS: webhook URLs must be"),
        ({"RAGWATCH_BOGUS": "1"}, "unknown setting(s): RAGWATCH_BOGUS"),
    ],
)
def test_bad_settings_exit_2_with_one_line(env: dict[str, str], message: str) -> None:
    out = ragwatch("status", env=env)
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("ragwatch: error: ") and message in line


def test_status_with_redis_unreachable_is_one_clear_error() -> None:
    from ragwatch.embedded import free_port

    out = ragwatch(
        "status", env={"RAGWATCH_REDIS_URL": f"redis://:s3cret@127.0.0.1:{free_port()}/0"}
    )
    assert out.returncode == 2
    assert out.stderr.startswith("ragwatch: error: cannot read status from Redis")
    assert "s3cret" not in out.stderr and "Traceback" not in out.stderr


def test_bad_rules_file_stops_the_worker_with_a_clear_error(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - name: X\n    expr: no_such_signal > 1\n")
    out = ragwatch(
        "worker", env={"RAGWATCH_RULES_FILE": str(rules), "RAGWATCH_KAFKA_BOOTSTRAP": "127.0.0.1:1"}
    )
    assert out.returncode == 2
    assert "unknown signal 'no_such_signal'" in out.stderr
    assert "Traceback" not in out.stderr


KAFKA_COMMANDS = [
    ("worker",),
    ("notify",),
    ("record", "--out", "{tmp}/rec.jsonl", "--duration", "30s"),
    ("agent", "--once"),
    ("agent", "--speed", "60"),
    ("agent", "--source", "prom", "--target", "http://127.0.0.1:9/metrics", "--once"),
    ("demo",),
]


@pytest.mark.parametrize("args", KAFKA_COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_unreachable_kafka_is_one_line_and_exit_2_within_seconds(
    args: tuple[str, ...], tmp_path: Path
) -> None:
    import time

    from ragwatch.embedded import free_port

    bootstrap = f"127.0.0.1:{free_port()}"  # nothing listens: connection refused
    env = {
        "RAGWATCH_KAFKA_BOOTSTRAP": bootstrap,
        "RAGWATCH_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
        "RAGWATCH_STATE_DIR": str(tmp_path / "state"),
    }
    started = time.monotonic()
    out = ragwatch(*(a.format(tmp=tmp_path) for a in args), env=env, timeout=60)
    took = time.monotonic() - started
    assert out.returncode == 2, out.stderr[-3000:]
    (line,) = out.stderr.strip().splitlines()  # not librdkafka's line per refused connect
    assert line.startswith(
        f"ragwatch: error: {args[0]}: cannot reach Kafka at {bootstrap} "
        "(RAGWATCH_KAFKA_BOOTSTRAP): "
    ), line
    assert "Connection refused" in line
    # the check gives up after CHECK_TIMEOUT_S (5 s); the rest is the interpreter's start,
    # which a loaded machine stretches (22.8 s for the worker beside other runs): a command
    # waiting on librdkafka's retries would still run at the 60 s limit
    assert took < 45, f"took {took:.1f}s"
    assert not (tmp_path / "rec.jsonl").exists()  # record: no empty file left behind


def test_an_agent_with_a_spool_keeps_sampling_while_kafka_is_unreachable(
    tmp_path: Path, start_ragwatch: Any
) -> None:
    """Continuous mode with --spool-dir: the spool is for outages, one at start too."""
    import time

    from ragwatch.embedded import free_port

    env = {"RAGWATCH_KAFKA_BOOTSTRAP": f"127.0.0.1:{free_port()}"}
    agent = start_ragwatch(["agent", "--spool-dir", str(tmp_path / "spool")], env)
    deadline = time.monotonic() + 30
    while "spooling to" not in agent.output() and time.monotonic() < deadline:
        assert agent.popen.poll() is None, agent.output()
        time.sleep(0.2)
    assert "cannot reach Kafka at" in agent.output(), agent.output()
    time.sleep(1)
    assert agent.popen.poll() is None, agent.output()  # still sampling, not exit 2
    agent.stop(signal.SIGKILL)


def test_agent_rejects_bad_arguments() -> None:
    out = ragwatch("agent", "--hosts", "0", env={})
    assert out.returncode == 2 and "argument --hosts: must be at least 1" in out.stderr
    out = ragwatch("agent", "--duration", "soon", env={})
    assert out.returncode == 2 and "bad duration" in out.stderr


def test_settings_lists_every_variable_without_secrets() -> None:
    env = {
        "RAGWATCH_KAFKA_SASL_PASSWORD": "hunter2",
        "RAGWATCH_WEBHOOK_URLS": "https://hooks.example/T0/B0/XYZ",
    }
    out = ragwatch("settings", env=env)
    assert out.returncode == 0
    assert "hunter2" not in out.stdout and "XYZ" not in out.stdout
    from ragwatch.config import env_names

    assert {line.split("=", 1)[0] for line in out.stdout.splitlines()} == set(env_names())
    assert os.environ.get("RAGWATCH_KAFKA_SASL_PASSWORD") is None


def test_demo_timeout_exits_1_says_what_is_missing_and_cleans_up(stack: EmbeddedStack) -> None:
    before = our_processes()
    out = ragwatch("demo", "--timeout", "1s", env={}, timeout=120)
    assert out.returncode == 1
    assert "timeout after 1s: no firing GpuMemoryLeak alert for gpu-node-01 GPU 1 pid 4011" in (
        out.stderr
    )
    kept = re.search(r"logs kept in (\S+)", out.stderr)
    assert kept, out.stderr
    run_dir = Path(kept.group(1))  # what a user reads after a timeout: each process's log
    assert {"agent.log", "worker.log", "notify.log"} <= {p.name for p in run_dir.iterdir()}
    shutil.rmtree(run_dir)
    assert our_processes() == before


def test_agent_sigterm_flushes_everything_it_produced(
    rw_env: dict[str, str], start_ragwatch: Any
) -> None:
    import time

    from ragwatch.config import Settings
    from ragwatch.kafka_admin import ensure_topics

    ensure_topics(Settings.from_env(rw_env))
    agent = start_ragwatch(["agent", "--hosts", "2", "--gpus", "2", "--speed", "60"], rw_env)
    time.sleep(3)
    assert agent.stop(signal.SIGTERM) == 0
    log = agent.output()
    done = re.search(
        r"agent done: ticks=(\d+) envelopes=(\d+) .*produced=(\d+) delivered=(\d+)"
        r" failed=0",
        log,
    )
    assert done, log
    ticks, envelopes, produced, delivered = map(int, done.groups())
    # 2 host envelopes and 4 request envelopes (2 services x 2 instances) per tick
    assert ticks > 5 and envelopes == 6 * ticks and produced == delivered == envelopes


def test_demo_all_pages_every_fault_with_its_culprit(stack: EmbeddedStack) -> None:
    before = our_processes()
    out = ragwatch("demo", "--scenario", "all", "--json", env={}, timeout=360)
    assert out.returncode == 0, out.stderr[-3000:]
    firing = [a for a in map(json.loads, out.stdout.splitlines()) if a["status"] == "firing"]
    got = {
        (a["labels"]["alertname"], a["labels"].get("pid") or a["labels"].get("instance"))
        for a in firing
    }
    assert {
        ("GpuMemoryLeak", "4011"),
        ("GpuOomKill", "4011"),
        ("DecodeSpeedDrop", "rag-api-1"),
        ("TokensPerRequestDrop", "rag-api-1"),
        ("RetrievalSlowdown", "rag-api-1"),
        ("RequestOutlierCluster", "rag-api-1"),
    } <= got
    # every page explains itself, and only the faulty instance pages
    assert all(a["annotations"].get("summary") for a in firing)
    assert {a["labels"]["instance"] for a in firing if "instance" in a["labels"]} == {"rag-api-1"}
    assert our_processes() == before
    # the alerts it does not wait for are consequences of the faults, and it says why
    err = out.stderr
    assert (
        "[demo] also firing: GpuMemoryHigh host=gpu-node-01 gpu=1: the leak fills GPU 1 of "
        "gpu-node-01"
    ) in err
    assert "UNEXPECTED" not in err
    # progress while it waits: event time, messages processed, alerts so far
    progress = re.findall(
        r"^\[demo\] [\d.]+ of 13 simulated hours \([\d.]+%\), .*; event time "
        r"\d{4}-\d\d-\d\d \d\d:\d\d UTC, [\d,]+ messages processed, \d+ alerts? so far$",
        err,
        re.M,
    )
    assert len(progress) >= 3, err[-3000:]
    # resolved alerts say what happened, in the past tense
    resolved = {
        a["labels"]["alertname"]: a["annotations"]["summary"]
        for a in map(json.loads, out.stdout.splitlines())
        if a["status"] == "resolved"
    }
    assert re.fullmatch(
        r"rag-api \(rag-api-1\): the cluster of \d+ unusual requests ended after \d\.\d h",
        resolved["RequestOutlierCluster"],
    ), resolved
    assert re.fullmatch(
        r"rag-api \(rag-api-1\): retrieval P99 came back to \d+ ms \(baseline \d+ ms\) after "
        r"\d\.\d h",
        resolved["RetrievalSlowdown"],
    ), resolved
    # what docs/commands.md quotes of this scenario
    as_the_docs_say(
        "all",
        out,
        (
            "expected",
            "webhook_bodies",
            "slack_messages",
            "pagerduty_triggers",
            "pagerduty_resolves",
        ),
    )
