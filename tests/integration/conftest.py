"""Real components for integration tests: a Tansu broker and a redis-server (one each per
session, on free loopback ports), uuid-named topics, Redis prefixes and consumer groups per
test, a local webhook receiver, and ragwatch processes started as a user would start them.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from ragwatch.config import Settings
from ragwatch.embedded import EmbeddedStack, pid_alive
from ragwatch.kafka_admin import ensure_topics
from ragwatch.receiver import WebhookReceiver
from ragwatch.store import Keys

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    st = EmbeddedStack(tmp_path_factory.mktemp("stack"))
    st.up()
    yield st
    st.down()


def clean_environ() -> dict[str, str]:
    """The test process's environment without any RAGWATCH_* variable."""
    return {k: v for k, v in os.environ.items() if not k.startswith("RAGWATCH_")}


def run_ragwatch(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``python -m ragwatch ARGS`` as a user runs it: only the given RAGWATCH_* settings."""
    return subprocess.run(
        [sys.executable, "-m", "ragwatch", *args],
        env={**clean_environ(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def own_stack(tmp_path: Path) -> Iterator[EmbeddedStack]:
    """A stack of the test's own, for tests that kill, freeze or restart its services."""
    st = EmbeddedStack(tmp_path / "own-stack")
    st.up()
    yield st
    for svc in st.services().values():  # never leave a frozen (SIGSTOPped) service behind
        with contextlib.suppress(ProcessLookupError):
            os.kill(svc.pid, signal.SIGCONT)
    st.down()


@pytest.fixture
def rw_env(stack: EmbeddedStack, tmp_path: Path) -> dict[str, str]:
    """RAGWATCH_* variables for one test: the session stack, fresh topics/group/keys."""
    return stack_env(stack, tmp_path)


def stack_env(stack: EmbeddedStack, tmp_path: Path) -> dict[str, str]:
    """RAGWATCH_* variables pointing at ``stack``, with fresh topics, group and keys."""
    run = uuid.uuid4().hex[:8]
    return {
        **stack.env(),
        "RAGWATCH_TOPIC_PREFIX": f"t{run}.",
        "RAGWATCH_APP_ID": f"ragwatch-test-{run}",
        "RAGWATCH_REDIS_PREFIX": f"rw-{run}",
        "RAGWATCH_KAFKA_SESSION_TIMEOUT": "6",
        "RAGWATCH_TOPIC_PARTITIONS": "2",
        "RAGWATCH_SNAPSHOT_INTERVAL": "1",  # the restart tests wait for snapshots
        # simulated 2026 telemetry must not depend on the wall clock (test_hostile_input
        # sets a small skew)
        "RAGWATCH_MAX_CLOCK_SKEW": str(10 * 365 * 86400),
        "RAGWATCH_STATE_DIR": str(tmp_path / "state"),
    }


@pytest.fixture
def exporter() -> Iterator[str]:
    """A real HTTP server serving the recorded exposition texts of tests/fixtures/prom
    (``{exporter}/vllm.txt``, ``/dcgm.txt``...), as a scrape target."""
    handler = partial(SimpleHTTPRequestHandler, directory=str(HERE.parent / "fixtures" / "prom"))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's chromium, for the live page's tests: ``make test`` installs it, so its
    absence fails the tests that need it instead of skipping them."""
    path = shutil.which("chromium")
    if path is None:
        pytest.fail("chromium is not installed: make chromium (make test installs it)")
    return path


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as rx:
        yield rx


@pytest.fixture
def redis_client(stack: EmbeddedStack) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(stack.env()["RAGWATCH_REDIS_URL"])
    yield client
    client.close()


class Proc:
    """A ``python -m ragwatch ...`` child process with its own log file."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        with open(log, "wb") as out:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "ragwatch", *args],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait()
            raise


@pytest.fixture
def start_ragwatch(tmp_path: Path) -> Iterator[Callable[..., Proc]]:
    procs: list[Proc] = []

    def start(args: list[str], env: dict[str, str]) -> Proc:
        p = Proc(args, {**clean_environ(), **env}, tmp_path / f"{args[0]}-{len(procs)}.log")
        procs.append(p)
        return p

    yield start
    for p in procs:
        with contextlib.suppress(Exception):
            p.stop(signal.SIGKILL, timeout=10)


@pytest.fixture
def make_settings() -> Callable[[dict[str, str]], Settings]:
    def make(env: dict[str, str]) -> Settings:
        settings = Settings.from_env(env)
        ensure_topics(settings)
        return settings

    return make


def hook_notify_env(
    env: dict[str, str], tmp_path: Path, url: str, extra: str = ""
) -> dict[str, str]:
    """``env`` with a notify file of one webhook receiver at ``url``: one group per alert,
    sent at once (no group wait), repeated daily; ``extra`` is more of the file's YAML
    (``inhibit_rules: ...``)."""
    path = tmp_path / "notify.yaml"
    path.write_text(
        f"receivers: [{{name: hook, type: webhook, url: '{url}'}}]\n"
        "route: {receiver: hook, group_by: ['...'], group_wait: 0s, group_interval: 1m,"
        " repeat_interval: 24h}\n" + extra
    )
    return {**env, "RAGWATCH_NOTIFY_FILE": str(path)}


def wait_until(predicate: Callable[[], Any], timeout: float, what: str | Callable[[], str]) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` (or its
    result, evaluated at the time of failure)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(
        f"timed out after {timeout:.0f}s waiting for {what if isinstance(what, str) else what()}"
    )


def worker_envelopes(client: redis.Redis, keys: Keys) -> int:
    """The most envelopes one worker reports having processed (its status in Redis, written
    once a second)."""
    raw = client.hvals(keys.workers)
    return max((int(orjson.loads(r)["envelopes"]) for r in raw), default=0)


def hosts_reached(client: redis.Redis, keys: Keys, hosts: int, ts: float) -> bool:
    """``hosts`` hosts have a status and each one's newest GPU sample is at ``ts`` or later
    (whichever worker processed it)."""
    rows = [orjson.loads(v) for v in client.hvals(keys.hosts)]
    done = [max((g["ts"] for g in r["gpus"]), default=0) >= ts for r in rows]
    return len(done) == hosts and all(done)


SENTINEL = b"ragwatch-test-sentinel"


def read_records(settings: Settings, topic: str, expect: int, timeout: float = 60) -> list[Any]:
    """The first ``expect`` records of ``topic`` (all partitions), counted, not watermarked.

    Tansu's high watermark can lag one record batch behind, which hides the last batch from
    fetches until something else is written: one sentinel record per partition, produced
    first, moves it past the data (and is skipped here). Partitions are assigned, not
    subscribed, so no group join (which Tansu delays by half the session timeout).
    """
    producer = Producer(settings.kafka_config())
    for p in range(settings.topic_partitions):
        producer.produce(topic, SENTINEL, partition=p)
    assert producer.flush(10) == 0
    consumer = Consumer({**settings.kafka_config(), "group.id": f"reader-{uuid.uuid4().hex}"})
    consumer.assign(
        [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(settings.topic_partitions)]
    )
    out: list[Any] = []

    def more() -> bool:
        for msg in consumer.consume(1000, timeout=0.5):
            assert msg.error() is None, msg.error()
            if msg.value() != SENTINEL:
                out.append(msg)
        return len(out) >= expect

    try:
        wait_until(more, timeout, lambda: f"{expect} records on {topic} (got {len(out)})")
        more()  # a duplicate beyond `expect` gets a chance to show up
    finally:
        consumer.close()
    return out


OURS = re.compile(rb"tansu|redis-server|-m\x00ragwatch\x00(worker|agent)")


def our_processes() -> set[int]:
    """PIDs of every Tansu, redis-server and ragwatch worker/agent on this machine (under
    pytest-xdist: those this test worker started, by the PYTEST_XDIST_WORKER they inherit;
    an orphan keeps it too)."""
    mine = os.environ.get("PYTEST_XDIST_WORKER")
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
                if mine is not None and OURS.search(cmdline):
                    environ = (entry / "environ").read_bytes().split(b"\0")
                    if f"PYTEST_XDIST_WORKER={mine}".encode() not in environ:
                        continue
            except OSError:
                continue
            if OURS.search(cmdline) and pid_alive(int(entry.name)):
                pids.add(int(entry.name))
    return pids
