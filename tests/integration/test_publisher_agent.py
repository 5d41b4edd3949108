"""The agent's publisher as a user runs it (``ragwatch agent``, a real broker): a scrape
interval longer than the stall timeout is not a stall, a spool directory that cannot be
used is refused at start in one line, and records a full spool drops show in the exit
line and the exit code."""

from __future__ import annotations

import os
import re
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from ragwatch.config import Settings
from ragwatch.embedded import EmbeddedStack
from tests.integration.conftest import read_records, run_ragwatch, stack_env, wait_until


@pytest.fixture
def metrics_url(exporter: str) -> str:
    """A real HTTP server serving a vLLM /metrics page."""
    return f"{exporter}/vllm.txt"


def counters(output: str, line: str) -> dict[str, int]:
    """The ``name=N`` counters of the last log line containing ``line``."""
    found = re.findall(re.escape(line) + r".*", output)
    assert found, f"no {line!r} line in:\n{output[-3000:]}"
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", found[-1])}


def test_a_scrape_interval_longer_than_the_stall_timeout_never_rebuilds_the_producer(
    rw_env: dict[str, str],
    metrics_url: str,
    make_settings: Callable[[dict[str, str]], Settings],
    start_ragwatch: Callable[..., Any],
) -> None:
    """Scrapes 11 s apart (the stall timeout is 10 s): each is delivered at once and the
    producer is never rebuilt (it was, on every scrape after the first)."""
    settings = make_settings(rw_env)
    agent = start_ragwatch(
        ["agent", "--source=prom", f"--target={metrics_url}", "--interval=11", "--host=n1"],
        rw_env,
    )
    scrapes = read_records(settings, settings.topic("metrics"), expect=2, timeout=40)
    assert agent.stop() == 0, agent.output()[-3000:]
    out = agent.output()
    done = counters(out, "agent done:")
    closed = counters(out, "publisher closed:")
    assert done["ticks"] >= 2 and len(scrapes) == 2
    assert done["produced"] == done["delivered"] == done["envelopes"] + done["events"]
    assert done["failed"] == done["dropped"] == 0
    assert (closed["recoveries"], closed["resent"]) == (0, 0), out[-3000:]
    assert "rebuilding" not in out


def test_a_spool_directory_that_cannot_be_used_is_refused_at_start_in_one_line(
    rw_env: dict[str, str], tmp_path: Path
) -> None:
    a_file = tmp_path / "not-a-dir"
    a_file.write_text("")
    out = run_ragwatch(
        "agent", "--source=sim", f"--spool-dir={a_file / 'spool'}", "--duration=1m", env=rw_env
    )
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines()[-1] == (
        f"ragwatch: error: spool directory {a_file / 'spool'} is not usable: "
        "cannot create it: Not a directory"
    )
    assert "Traceback" not in out.stderr


def test_what_a_full_spool_drops_is_in_the_exit_line_and_fails_the_exit_code(
    own_stack: EmbeddedStack,
    tmp_path: Path,
    make_settings: Callable[[dict[str, str]], Settings],
    start_ragwatch: Callable[..., Any],
) -> None:
    """The broker frozen while a fleet is sampled into a small memory queue and an 8 KiB
    spool: the spool drops its oldest records; once the broker is back the rest arrive,
    once each, in order per host, and the agent's last line counts the loss (exit 1)."""
    env = stack_env(own_stack, tmp_path)
    settings = make_settings(env)
    broker = own_stack.services()["kafka"].pid
    os.kill(broker, signal.SIGSTOP)
    try:
        agent = start_ragwatch(
            [
                "agent", "--source=sim", "--scenario=healthy", "--hosts=2", "--gpus=1",
                "--services=0", "--speed=0", "--duration=1h", "--interval=10",
                "--start=1767225600", "--queue-max=10", f"--spool-dir={tmp_path / 'spool'}",
                "--spool-max=8192",
            ],
            env,
        )  # fmt: skip
        wait_until(
            lambda: "oldest record(s)" in agent.output(),
            60,
            lambda: "the spool to drop:\n" + agent.output()[-3000:],
        )
    finally:
        os.kill(broker, signal.SIGCONT)
    assert agent.popen.wait(60) == 1, agent.output()[-3000:]
    out = agent.output()
    done = counters(out, "agent done:")
    closed = counters(out, "publisher closed:")
    assert (done["envelopes"], done["events"]) == (2 * 360, 0) and done["dropped"] > 0
    assert done["delivered"] + done["dropped"] == done["envelopes"]
    assert (closed["recoveries"], closed["resent"]) == (0, 0), out[-3000:]
    got = [
        orjson.loads(m.value())
        for m in read_records(settings, settings.topic("gpu"), done["delivered"])
    ]
    pairs = [(e["host"], e["ts"]) for e in got]
    assert len(pairs) == done["delivered"] == len(set(pairs))  # nothing twice
    for host in Counter(h for h, _ in pairs):
        ts = [t for h, t in pairs if h == host]
        assert ts == sorted(ts), f"{host} out of order"
