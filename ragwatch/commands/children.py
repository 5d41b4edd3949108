"""The processes a demo starts: ``python -m ragwatch ...`` children, as a user starts them.

Used by ``ragwatch demo`` and ``scripts/screenshots.py``. Each child runs in its own
session, with its output in ``<run_dir>/<name>.log``; :meth:`Children.stop_all` stops
every process group it started, whatever happens.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from ragwatch.embedded import stop_process


class Children:
    """``python -m ragwatch ...`` subprocesses, each in its own session (so a stop reaches
    what they start), logs in ``run_dir``."""

    def __init__(self, run_dir: Path, env: Mapping[str, str]) -> None:
        self.run_dir, self.env = run_dir, dict(env)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(
        self, name: str, *args: str, env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start ``python -m ragwatch ARGS`` as ``name`` (``env``: settings of its own)."""
        with open(self.run_dir / f"{name}.log", "wb") as out:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "ragwatch", *args],
                env={**self.env, **(env or {})},
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return self.procs[name]

    def dead(self) -> list[str]:
        """The children that exited (the agent ends when its telemetry does), but not a
        worker of several while another is running: its partitions go to the others (a
        fleet outlives a worker; ``fallen`` names it)."""
        gone = [n for n, p in self.procs.items() if p.poll() is not None and n != "agent"]
        workers = [n for n in self.procs if n.startswith("worker-")]
        if any(self.procs[n].poll() is None for n in workers):
            gone = [n for n in gone if not n.startswith("worker-")]
        return gone

    def fallen(self) -> list[tuple[str, int]]:
        """The workers of several that exited, with their exit codes (-9: killed)."""
        return [
            (n, code)
            for n, p in self.procs.items()
            if n.startswith("worker-") and (code := p.poll()) is not None
        ]

    def agent_done(self) -> bool:
        return "agent" in self.procs and self.procs["agent"].poll() is not None

    def agent_delivered(self) -> int | None:
        """How many envelopes the agent delivered, from its last line (None: not said)."""
        found = re.findall(r"\bdelivered=(\d+)", self.log_tail("agent", 4000))
        return int(found[-1]) if found else None

    def log_tail(self, name: str, chars: int = 1500) -> str:
        with contextlib.suppress(OSError):
            return (self.run_dir / f"{name}.log").read_text(errors="replace")[-chars:]
        return ""

    def stop_all(self) -> None:
        """SIGTERM to every process group, newest first; SIGKILL after 20 s."""
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
