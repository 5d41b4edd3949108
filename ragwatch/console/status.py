"""``ragwatch status``: the fleet at a glance in the terminal, read from Redis only.

Hosts and their GPUs (memory, growth, time to exhaustion, utilisation, the top GPUs and
scraped engines), service instances (tokens/request against its forecast, tokens/s,
P95/P99 per stage, queueing, errors), firing and pending alerts with their root-cause
hint, silences, and the notifier's backlog (the view: :mod:`ragwatch.console.status_view`).
``--json`` prints :func:`~ragwatch.store.read_status`'s dict; ``--watch``
redraws a terminal until Ctrl-C or SIGTERM, and into a pipe or file (no terminal to
redraw) appends a plain-text snapshot per refresh, flushed.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

import orjson
from rich.console import Console, Group
from rich.text import Text

from ragwatch.config import Settings, redact_url
from ragwatch.console.status_view import clean, render
from ragwatch.errors import ConfigError
from ragwatch.store import blocking_client


def blocking_redis(settings: Settings) -> Any:
    """A blocking Redis client for the CLI: 5 s to connect and per command."""
    return blocking_client(settings.redis_url)


def fetch_status(settings: Settings, now: float | None = None) -> dict[str, Any]:
    from redis.exceptions import RedisError

    from ragwatch.store import read_status

    client = blocking_redis(settings)
    try:
        return read_status(client, settings.redis_prefix, now=now)
    except RedisError as exc:
        raise ConfigError(
            f"cannot read status from Redis at {redact_url(settings.redis_url)}: {exc}"
        ) from None
    finally:
        client.close()


# ---------------------------------------------------------------------------- command


def show_status(
    settings: Settings,
    *,
    as_json: bool,
    out: TextIO,
    watch: bool = False,
    interval_s: float = 2.0,
    sleep: Callable[[float], object] = time.sleep,
    clock: Callable[[], float] = time.time,
) -> int:
    """Print the status once, or with ``watch`` until Ctrl-C (KeyboardInterrupt: the CLI
    raises it on SIGTERM too) or ``sleep`` returns true: exit 0. Redis unreachable at
    the start: ``ConfigError`` (one line, exit 2); later, the view says so and keeps trying.
    ``--json --watch`` prints one compact JSON object per line and refresh."""
    status = fetch_status(settings, clock())
    if as_json:
        option = orjson.OPT_NON_STR_KEYS | (0 if watch else orjson.OPT_INDENT_2)

        def emit(s: dict[str, Any], error: str | None = None) -> None:
            if error is not None:  # stdout stays one status object per line
                print(f"ragwatch: warning: {error}", file=sys.stderr, flush=True)
                return
            out.write(orjson.dumps(s, option=option).decode() + "\n")
            out.flush()

        if not watch:
            emit(status)
            return 0
        return _watch(settings, status, emit, interval_s, sleep, clock)
    console = Console(
        file=out,
        width=None if out.isatty() else 160,
        highlight=False,
        markup=False,
        emoji=False,
    )
    unicode = console.encoding.lower().startswith("utf")
    if not watch:
        console.print(render(status, clock(), unicode=unicode))
        return 0
    if not out.isatty():  # rich's Live only draws on a terminal: append snapshots instead

        def append(s: dict[str, Any], error: str | None = None) -> None:
            view = render(s, clock(), unicode=unicode)
            console.print(Group(Text(clean(error)), view) if error else view)
            console.print()
            out.flush()

        return _watch(settings, status, append, interval_s, sleep, clock)
    from rich.live import Live

    with Live(console=console, auto_refresh=False) as live:

        def draw(s: dict[str, Any], error: str | None = None) -> None:
            view = render(s, clock(), unicode=unicode)
            if error:
                view = Group(Text(clean(error), "bold red"), view)
            live.update(view, refresh=True)

        return _watch(settings, status, draw, interval_s, sleep, clock)


def _watch(
    settings: Settings,
    status: dict[str, Any],
    show: Callable[[dict[str, Any], str | None], None],
    interval_s: float,
    sleep: Callable[[float], object],
    clock: Callable[[], float],
) -> int:
    """Show ``status``, then refresh every ``interval_s`` (at least 0.1 s) until Ctrl-C
    (KeyboardInterrupt, at once: a read of Redis under way is not waited out) or ``sleep``
    returns true; a failed read keeps the last status and says why. A view is written
    whole: a signal that comes while it is written takes effect after it."""
    error: str | None = None
    try:
        while True:
            with _whole():
                show(status, error)
            if sleep(max(interval_s, 0.1)):
                break
            try:
                status, error = fetch_status(settings, clock()), None
            except ConfigError as exc:
                error = f"{exc} (showing the last status; retrying)"
    except KeyboardInterrupt:
        pass
    return 0


@contextmanager
def _whole() -> Iterator[None]:
    """SIGINT and SIGTERM held while a view is written (a snapshot appended to a file, a
    JSON line, a redraw), delivered after it."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
