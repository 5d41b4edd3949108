"""Long work says how far it got: a rate line every interval into a pipe or a file, a bar
on a terminal, nothing on stdout. Replay reports reading, then replaying with event time;
record and ``agent --json`` use the same reporter (their tests are in
tests/integration/test_agent_sources.py and test_replay.py)."""

from __future__ import annotations

import contextlib
import io
import os
import pty
import sys
from collections.abc import Callable
from pathlib import Path

from ragwatch.agents.scenario import build
from ragwatch.codec import encode
from ragwatch.commands.replay import replay
from ragwatch.progress import Progress
from ragwatch.streams.alerting.rules import load_rules


def ticking(step: float) -> Callable[[], float]:
    """A clock that moves ``step`` seconds each time it is read."""
    now = [0.0]

    def clock() -> float:
        now[0] += step
        return now[0]

    return clock


def test_plain_lines_come_every_interval_with_rate_and_eta() -> None:
    out = io.StringIO()
    p = Progress("job", "items", total=1000, out=out, tty=False, interval_s=10, clock=ticking(1))
    for _ in range(100):
        p.advance(10)
    p.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 11  # a line every 10 s over ~100 s, then the final one
    assert lines[0] == "[job] 100 of 1,000 items (10.0%), 10/s, 1.5 min left"
    assert lines[-1].startswith("[job] done: 1,000 items in ")


def test_phases_count_from_zero_with_their_own_unit() -> None:
    out = io.StringIO()
    p = Progress("replay", "MB", out=out, tty=False, interval_s=5, clock=ticking(1))
    p.phase("reading", total=50)
    for _ in range(10):
        p.advance(5)
    p.phase("replaying", unit="envelopes", total=400)
    for _ in range(10):
        p.advance(40)
    p.close(final_line=False)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[replay] reading: 20 of 50 MB (40.0%), 5/s")
    assert lines[-1].startswith("[replay] replaying: ") and "of 400 envelopes" in lines[-1]
    assert not any("done" in line for line in lines)


def test_details_are_computed_only_when_shown_and_never_raise() -> None:
    out, calls = io.StringIO(), []

    def detail() -> str:
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("broken")
        return "event time 2026-12-01 04:00 UTC"

    p = Progress("job", "items", out=out, tty=False, interval_s=10, clock=ticking(3))
    p.note(detail)
    for _ in range(8):
        p.advance()
    p.close()
    assert len(calls) == 3  # two lines and the final one, not once per advance
    assert out.getvalue().splitlines()[0].endswith("; event time 2026-12-01 04:00 UTC")


def test_a_terminal_gets_a_bar_and_a_disabled_reporter_says_nothing() -> None:
    out = io.StringIO()
    with Progress("job", "items", total=10, out=out, tty=True, clock=ticking(1)) as p:
        p.advance(10)
    assert "[job] items" in out.getvalue() and "10/10" in out.getvalue()
    quiet = io.StringIO()
    with Progress("job", "items", out=quiet, enabled=False, clock=ticking(100)) as p:
        p.advance(5)
    assert quiet.getvalue() == ""


def test_a_closed_stderr_does_not_stop_the_work() -> None:
    out = io.StringIO()
    out.close()
    with Progress("job", "items", out=out, tty=False, interval_s=1, clock=ticking(2)) as p:
        p.advance()


def test_replay_reports_reading_then_replaying_with_event_time(tmp_path: Path) -> None:
    world = build("leak", hosts=2, gpus=1, services=0, seed=1, interval_s=60, start_ts=1.767e9)
    lines = []
    for _, envs, _ in world.fleet.ticks():
        lines += [encode(e) for e in envs]
        if len(lines) >= 600:
            break
    f = tmp_path / "fleet.jsonl"
    f.write_bytes(b"\n".join(lines) + b"\n")
    out, err = io.StringIO(), io.StringIO()
    progress = Progress("replay", "MB", out=err, tty=False, interval_s=1, clock=ticking(0.01))
    assert replay([f], load_rules(), out, err=err, progress=progress) == 0
    report = err.getvalue().splitlines()
    reading = [ln for ln in report if ln.startswith("[replay] reading: ")]
    replaying = [ln for ln in report if ln.startswith("[replay] replaying: ")]
    assert reading and f"of {f.stat().st_size / 1e6:,.1f} MB" in reading[0]
    assert replaying and "of 600 envelopes" in replaying[-1]
    assert "; event time 2025-12-29T" in replaying[-1]
    assert "replayed 600 envelopes" in out.getvalue()  # stdout: transitions and summary only
    assert "[replay]" not in out.getvalue()


CHILD = """
import sys
from ragwatch.progress import Progress
with Progress("job", "items", total=2) as p:   # stderr: the terminal, in the foreground
    assert p._bar is not None, "no bar on a terminal in the foreground"
    print('{"v":1}', flush=True)
    p.advance(2)
"""


def test_a_bar_on_the_terminal_never_takes_stdout(tmp_path: Path) -> None:
    """``agent --json > file`` on a terminal: the bar is drawn on stderr, the data still
    goes to the file (rich redirects stdout into its console while a bar is live, unless
    told not to). The child runs on a pseudo-terminal of its own, in its foreground."""
    data = tmp_path / "out.jsonl"
    pid, master = pty.fork()
    if pid == 0:  # the child: stdout to the file, stderr the terminal
        fd = os.open(data, os.O_WRONLY | os.O_CREAT)
        os.dup2(fd, 1)
        os.execv(sys.executable, [sys.executable, "-c", CHILD])
    drawn = b""
    with contextlib.suppress(OSError):
        while chunk := os.read(master, 4096):
            drawn += chunk
    _, status = os.waitpid(pid, 0)
    os.close(master)
    assert os.waitstatus_to_exitcode(status) == 0, drawn.decode(errors="replace")
    assert data.read_text() == '{"v":1}\n'
    assert b"[job] items" in drawn and b'{"v":1}' not in drawn


def test_a_terminal_this_process_does_not_hold_in_the_foreground_gets_lines() -> None:
    """A background job (``ragwatch agent ... &``) must not redraw a bar over the shell:
    a terminal whose foreground is another process group gets plain lines."""
    master, slave = pty.openpty()
    with os.fdopen(slave, "w") as out:
        assert out.isatty()
        p = Progress("job", "items", total=10, out=out, interval_s=1, clock=ticking(2))
        assert p._bar is None  # not our terminal's foreground: lines, not a bar
        p.close()
    os.close(master)
