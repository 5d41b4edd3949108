"""``ragwatch serve`` under slow clients (issue 32): a real ``ragwatch serve`` with an
open-file limit of ``OPEN_FILES`` and more connections than that trickling request heads
at it (slowloris). ``/healthz`` answers throughout, the process never nears its
open-file limit, and a head or a body that does not come in time is cut off.

Before the guard, 1,100 such connections at a limit of 1,024 made ``/healthz`` time out
for a whole minute (asyncio stops accepting for a second at each EMFILE, and the
connections never ended) and a half-sent head stayed open for over two minutes.
"""

from __future__ import annotations

import contextlib
import errno
import http.client
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ragwatch.console.guard import BODY_TIMEOUT_S, HEAD_TIMEOUT_S, connection_limit
from ragwatch.embedded import EmbeddedStack, free_port
from tests.integration.conftest import clean_environ, wait_until

OPEN_FILES = 1024  # serve's RLIMIT_NOFILE, soft and hard (the probe's)
ATTACKERS = 1100  # slow connections held open: more than serve may open files
HEALTH_WITHIN_S = 2.0
PARTIAL_HEAD = b"GET /healthz HTTP/1.1\r\nHost: ragwatch\r\nX-Slow: "


@dataclass
class Limited:
    """``ragwatch serve`` started with a low open-file limit."""

    port: int
    popen: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def open_files(self) -> int:
        return len(os.listdir(f"/proc/{self.popen.pid}/fd"))


def _lower_open_files() -> None:  # in the child, before exec
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))


def healthz(port: int) -> tuple[int, float]:
    """``/healthz``'s status (0: no answer) and how long it took."""
    start = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=HEALTH_WITHIN_S)
    try:
        conn.request("GET", "/healthz")
        status = conn.getresponse().status
    except OSError:
        status = 0
    finally:
        conn.close()
    return status, time.monotonic() - start


@pytest.fixture(scope="module")
def served(stack: EmbeddedStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Limited]:
    env = {
        **clean_environ(),
        **stack.env(),
        "RAGWATCH_REDIS_PREFIX": f"slow-{uuid.uuid4().hex[:8]}",
    }
    port = free_port()
    log = tmp_path_factory.mktemp("slow") / "serve.log"
    with open(log, "wb") as out:
        popen = subprocess.Popen(
            [sys.executable, "-m", "ragwatch", "serve", "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_lower_open_files,
        )
    served = Limited(port, popen, log)
    try:
        wait_until(lambda: healthz(port)[0] == 200, 15, lambda: f"serve: {served.output()}")
        yield served
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGKILL)
        popen.wait(10)


class Slowloris:
    """``n`` connections that send a request head a byte at a time and never end it; one
    the server closes is opened again, as the attack does."""

    def __init__(self, port: int, n: int, every_s: float = 0.5) -> None:
        self.port, self.n, self.every_s = port, n, every_s
        self.opened = self.closed_by_server = 0
        self.socks: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Slowloris:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        for s in self.socks:
            s.close()

    def _open(self) -> None:
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=2)
            s.sendall(PARTIAL_HEAD)
        except OSError:
            return  # refused or slow to accept: try again next round
        s.setblocking(False)
        self.socks.append(s)
        self.opened += 1

    def _alive(self, s: socket.socket) -> bool:
        try:
            return s.recv(1) != b""  # b"": closed (the server never answers a partial head)
        except BlockingIOError:
            pass  # open, nothing to read: send the next byte
        except OSError:
            return False
        try:
            s.send(b"x")
        except OSError as exc:
            return exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK)
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            keep = []
            for s in self.socks:
                if self._alive(s):
                    keep.append(s)
                else:
                    s.close()
                    self.closed_by_server += 1
            self.socks = keep
            while len(self.socks) < self.n and not self._stop.is_set():
                self._open()
            self._stop.wait(self.every_s)


@pytest.fixture
def many_sockets() -> Iterator[None]:
    """Room in this process for the attack's sockets (its soft limit raised if need be)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = ATTACKERS + 256
    if soft != resource.RLIM_INFINITY and soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            pytest.fail(f"the test needs {want} open files, the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.serial  # latency under load: not beside another test
@pytest.mark.usefixtures("many_sockets")
def test_healthz_answers_while_more_slow_connections_than_open_files_are_held(
    served: Limited,
) -> None:
    limit = connection_limit(OPEN_FILES)
    assert f"at most {limit} connections (open-file limit {OPEN_FILES})" in served.output()
    answers: list[tuple[int, float]] = []
    with Slowloris(served.port, ATTACKERS) as attack, Sampler(served.open_files) as files:
        wait_until(lambda: attack.opened >= ATTACKERS, 15, "the slow connections")
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            answers.append(healthz(served.port))
            time.sleep(0.1)
    print(  # for -s: the margins
        f"{len(answers)} answers, slowest {max(t for _, t in answers):.3f}s; "
        f"{attack.opened} opened, {attack.closed_by_server} closed by serve; "
        f"at most {max(files.values)} open files"
    )
    slow = [a for a in answers if a[0] != 200 or a[1] > HEALTH_WITHIN_S]
    assert not slow, f"{len(slow)} of {len(answers)} /healthz failed or slow: {slow[:5]}"
    assert len(answers) > 20
    assert attack.closed_by_server > ATTACKERS - limit  # the oldest made room for new ones
    assert max(files.values) < OPEN_FILES - 16, max(files.values)
    log = served.output()
    assert f"connection limit reached ({limit})" in log
    assert "out of system resource" not in log  # asyncio's EMFILE message
    assert served.popen.poll() is None


class Sampler:
    """Samples ``read()`` 20 times a second in a thread while in the ``with`` block."""

    def __init__(self, read: Callable[[], int]) -> None:
        self.read = read
        self.values: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.values.append(self.read())


def test_a_head_or_a_body_that_does_not_come_in_time_is_cut_off(served: Limited) -> None:
    """A head sent a byte every half second is closed ``HEAD_TIMEOUT_S`` after connecting;
    a body sent so is closed ``BODY_TIMEOUT_S`` after the response (no route reads one)."""
    head = socket.create_connection(("127.0.0.1", served.port), timeout=2)
    head.sendall(PARTIAL_HEAD)
    body = socket.create_connection(("127.0.0.1", served.port), timeout=2)
    body.sendall(b"GET /healthz HTTP/1.1\r\nHost: ragwatch\r\nContent-Length: 100000\r\n\r\nx")
    started = time.monotonic()
    closed: dict[str, float] = {}
    answered = b""
    for s in (head, body):
        s.setblocking(False)
    while len(closed) < 2 and time.monotonic() - started < HEAD_TIMEOUT_S + BODY_TIMEOUT_S:
        for name, s in (("head", head), ("body", body)):
            if name in closed:
                continue
            try:
                data = s.recv(65536)
                if not data:
                    closed[name] = time.monotonic() - started
                answered += data if name == "body" else b""
                assert name == "body" or not data, data  # nothing for a partial head
            except BlockingIOError:
                with contextlib.suppress(OSError):
                    s.send(b"x")
            except OSError:
                closed[name] = time.monotonic() - started
        time.sleep(0.5)
    head.close()
    body.close()
    assert answered.startswith(b"HTTP/1.1 200 "), answered[:100]
    assert HEAD_TIMEOUT_S - 1 <= closed.get("head", -1) <= HEAD_TIMEOUT_S + 3, closed
    assert BODY_TIMEOUT_S - 1 <= closed.get("body", -1) <= BODY_TIMEOUT_S + 3, closed
