"""Progress of long work on stderr: a bar on a terminal, a rate line every few seconds
otherwise.

Replay, ``record``, ``agent --json`` and the long demos can run for minutes while their
standard output carries data (alerts, JSON lines). :class:`Progress` reports on a separate
stream (stderr by default) how far they got: on a terminal a ``rich`` progress bar
(``rich`` comes with the stream extra; without it, or into a pipe or a file, plain lines);
otherwise one line every ``interval_s`` seconds and one at the end, each flushed (one
line, folded here):

    [replay] replaying: 41,000 of 103,681 envelopes (39.5%), 12,300/s, 5.1 s left;
    event time 2026-12-01T04:00:00Z

It never raises into the work it reports on, and it is cheap to call per item
(:meth:`Progress.advance` adds to a counter and looks at the clock).

>>> import io
>>> out, now = io.StringIO(), iter(range(0, 100, 5))
>>> with Progress("replay", "envelopes", total=300, out=out, tty=False, interval_s=10,
...               clock=lambda: float(next(now))) as p:
...     p.advance(100)                    # 5 s after the start: not yet a line
...     p.advance(100)                    # 10 s: a line
...     p.note("event time 2026-12-01 04:00 UTC")
>>> print(out.getvalue(), end="")
[replay] 200 of 300 envelopes (66.7%), 20/s, 5.0 s left
[replay] done: 200 envelopes in 15.0 s (13/s); event time 2026-12-01 04:00 UTC
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, TextIO

INTERVAL_S = 10.0  # between two plain lines
_TTY_REFRESH_S = 0.1  # between two redraws of the bar
BAR_WIDTH = 20
_BESIDE_BAR = BAR_WIDTH + 18  # the bar, "/", percentage and time left, the gaps, a margin


class Progress:
    """How far one piece of long work got; see the module docstring.

    ``what`` names the command (``[replay]``), ``unit`` what is counted, ``total`` how
    many there will be (None: unknown, no percentage). :meth:`phase` starts a new stage
    of the same work (``reading`` files, then ``replaying`` them). ``tty`` forces the
    bar (True) or the lines (False); by default the bar is drawn when ``out`` is a
    terminal and ``rich`` is installed. ``enabled=False`` prints nothing at all.
    """

    def __init__(
        self,
        what: str,
        unit: str,
        *,
        total: float | None = None,
        out: TextIO | None = None,
        interval_s: float = INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        tty: bool | None = None,
        enabled: bool = True,
    ) -> None:
        self.what, self.unit, self.total = what, unit, total
        self.out = sys.stderr if out is None else out
        self.interval_s, self.clock, self.enabled = interval_s, clock, enabled
        self.done = 0.0
        self.stage = ""
        self._detail: str | Callable[[], str] = ""
        self.lines = 0  # plain lines written
        self._t0 = self._phase_t0 = clock()
        self._next = self._t0 + interval_s  # the next line (or redraw of the bar) is due
        self._bar: Any = None
        self._task: Any = None
        if enabled and (_is_tty(self.out) if tty is None else tty):
            self._bar = _rich_bar(self.out)
            if self._bar is not None:
                self._task = self._bar.add_task(self._label(), total=total, detail="")
                self._bar.start()

    # ------------------------------------------------------------ counting

    def advance(self, n: float = 1) -> None:
        """``n`` more done."""
        self.done += n
        self._tick()

    def update(self, done: float) -> None:
        """``done`` so far (for work measured by a position, such as event time)."""
        self.done = done
        self._tick()

    def note(self, detail: str | Callable[[], str]) -> None:
        """A detail shown after the counts (event time reached, alerts so far); a function
        is called only when a line is written or the bar redrawn."""
        self._detail = detail

    @property
    def detail(self) -> str:
        d = self._detail
        if callable(d):
            try:
                return d()
            except Exception:  # a report must never break the work it reports on
                return ""
        return d

    def phase(self, stage: str, *, unit: str | None = None, total: float | None = None) -> None:
        """Start a new stage of the work: counts from 0 again, with its own unit and total."""
        self.stage, self.done, self.total = stage, 0.0, total
        self.unit = unit or self.unit
        self._phase_t0 = self.clock()
        if self._bar is not None:
            self._bar.reset(self._task, total=total, description=self._label())

    # ------------------------------------------------------------ output

    def _tick(self) -> None:
        if not self.enabled:
            return
        now = self.clock()
        if self._bar is not None:
            if now >= self._next:
                self._next = now + _TTY_REFRESH_S
                self._redraw()
            return
        if now >= self._next:
            self._next = now + self.interval_s
            self._write(self.line(now))

    def line(self, now: float | None = None) -> str:
        """The plain progress line for now."""
        now = self.clock() if now is None else now
        elapsed = max(now - self._phase_t0, 1e-9)
        rate = self.done / elapsed
        parts = [f"{_num(self.done)} {self.unit}"]
        if self.total:
            pct = 100.0 * self.done / self.total
            parts = [f"{_num(self.done)} of {_num(self.total)} {self.unit} ({pct:.1f}%)"]
        parts.append(f"{_num(rate)}/s")
        if self.total and rate > 0 and self.done < self.total:
            parts.append(f"{_duration((self.total - self.done) / rate)} left")
        detail = self.detail
        text = ", ".join(parts) + (f"; {detail}" if detail else "")
        return f"[{self.what}] {self.stage + ': ' if self.stage else ''}{text}"

    def close(self, *, final_line: bool = True) -> None:
        """Stop the bar and write the final line (what was done, how long it took), unless
        ``final_line`` is False (the command prints a summary of its own)."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._redraw()
            self._bar.stop()
            self._bar = None
        self.enabled = False
        if not final_line:
            return
        elapsed = self.clock() - self._t0
        rate = self.done / elapsed if elapsed > 0 else 0.0
        detail = f"; {self.detail}" if self.detail else ""
        self._write(
            f"[{self.what}] done: {_num(self.done)} {self.unit} in {_duration(elapsed)} "
            f"({_num(rate)}/s){detail}"
        )

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _redraw(self) -> None:
        label, detail = self._label(), self.detail
        room = self._bar.console.width - len(label) - len(f"{self.total or 0:,.0f}") * 2
        room -= _BESIDE_BAR
        if len(detail) > room:  # the detail is cut to the line, never the bar
            detail = detail[: room - 1] + "…" if room > 12 else ""
        self._bar.update(
            self._task, completed=self.done, description=label, detail=detail, refresh=True
        )

    def _label(self) -> str:
        stage = f" {self.stage}" if self.stage else ""
        return f"[{self.what}]{stage} {self.unit}"

    def _write(self, text: str) -> None:
        with contextlib.suppress(OSError, ValueError):  # a closed or broken stderr
            self.out.write(text + "\n")
            self.out.flush()
            self.lines += 1


def _is_tty(out: TextIO) -> bool:
    """``out`` is a terminal this process has in the foreground: a background job
    (``ragwatch agent ... &``) prints lines instead of redrawing a bar over the shell."""
    try:
        if not out.isatty():
            return False
        return os.tcgetpgrp(out.fileno()) == os.getpgrp()
    except (AttributeError, ValueError, OSError):
        return False


def _rich_bar(out: TextIO) -> Any:
    """A rich progress bar on ``out``, or None without rich (an agent-only install)."""
    try:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TaskProgressColumn,
            TextColumn,
            TimeRemainingColumn,
        )
        from rich.progress import Progress as RichProgress
        from rich.table import Column
    except ImportError:
        return None

    def fixed() -> Column:
        return Column(no_wrap=True)

    return RichProgress(
        TextColumn("{task.description}", markup=False, table_column=fixed()),
        BarColumn(bar_width=BAR_WIDTH, table_column=fixed()),
        MofNCompleteColumn(table_column=fixed()),
        TaskProgressColumn(table_column=fixed()),
        TimeRemainingColumn(table_column=fixed()),
        TextColumn("{task.fields[detail]}", markup=False, table_column=fixed()),
        console=Console(file=out),
        transient=False,
        auto_refresh=False,
        # stdout carries the command's data (JSON lines, alerts), whatever the bar does
        redirect_stdout=False,
        redirect_stderr=False,
    )


def _num(x: float) -> str:
    """A count with thousands separators; rates under 10 with one decimal."""
    if not math.isfinite(x):
        return str(x)
    return f"{x:,.1f}" if 0 < abs(x) < 10 and x != int(x) else f"{x:,.0f}"


def _duration(s: float) -> str:
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"
