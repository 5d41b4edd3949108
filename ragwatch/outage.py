"""Rate-limited logging of an outage (Redis away), shared by the worker and the notifier.

A process that talks to Redis many times a second would log a warning per failed
operation while it is away. :class:`OutageLog` logs the first failure at once, then at
most one line per ``every_s`` with the count of failures since the last line, and one
line when the service answers again, with how long it was away. Counting every failure
stays the caller's job (its ``redis_errors`` counter); this only decides what is logged.

>>> import logging
>>> now = [0.0]
>>> outage = OutageLog(logging.getLogger("doc"), "Redis", "redis://r:6379/0",
...                    clock=lambda: now[0])
>>> [outage.failed("write status", OSError("refused")) for now[0] in (0.0, 1.0, 31.0)]
[True, False, True]
>>> outage.failures, outage.down
(3, True)
>>> outage.recovered()
31.0
>>> outage.down, outage.recovered()
(False, None)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

EVERY_S = 30.0


class OutageLog:
    """Warns when ``service`` at ``where`` (a redacted URL, or "") fails: the first failure at
    once, then one line per ``every_s`` at most; says when it is back. ``prefix`` starts
    every line; ``clock`` (monotonic seconds) is injectable."""

    def __init__(
        self,
        logger: logging.Logger,
        service: str,
        where: str,
        *,
        prefix: str = "",
        every_s: float = EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        trouble: str = "unreachable",
        back: str = "is back",
    ) -> None:
        if every_s <= 0:
            raise ValueError(f"every_s must be > 0, got {every_s}")
        self._log, self.service, self.where, self.prefix = logger, service, where, prefix
        self.trouble, self.back = trouble, back
        self.every_s, self._clock = every_s, clock
        self.down_since: float | None = None
        self.failures = 0  # in this outage
        self._reported = 0  # failures already counted in a log line
        self._last_line = 0.0

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def failed(self, operation: str, exc: BaseException, detail: str = "") -> bool:
        """Count one failed operation; log it if it is the first of the outage or the
        last line is ``every_s`` old. Return whether a line was logged."""
        now = self._clock()
        self.failures += 1
        if self.down_since is None:
            self.down_since = now
        elif now - self._last_line < self.every_s:
            return False
        self._log.warning(
            "%s%s (%s: %s), retrying (%s)%s",
            self.prefix,
            self._state(now - self.down_since),
            operation,
            exc,
            self._count(),
            detail,
        )
        self._last_line, self._reported = now, self.failures
        return True

    def recovered(self, detail: str = "") -> float | None:
        """The service answered: log how long it was away (and ``detail``) if it was;
        return that time in seconds, or None if it was not down."""
        if self.down_since is None:
            return None
        away = self._clock() - self.down_since
        self._log.warning(
            "%s%s %s after %.0f s (%s failed)%s",
            self.prefix,
            self.service,
            self.back,
            away,
            _operations(self.failures),
            detail,
        )
        self.down_since, self.failures, self._reported = None, 0, 0
        return away

    def _state(self, down_s: float) -> str:
        at = f" at {self.where}" if self.where else ""
        if self.failures == 1:
            return f"{self.service} {self.trouble}{at}"
        return f"{self.service} still {self.trouble}{at} after {down_s:.0f} s"

    def _count(self) -> str:
        so_far = f"{_operations(self.failures)} failed so far"
        if self.failures == 1:
            return so_far
        return f"{so_far}, {self.failures - self._reported} since the last report"


def _operations(n: int) -> str:
    return f"{n} operation{'' if n == 1 else 's'}"


class RedisTrouble:
    """The two ways Redis fails a process, logged apart: *unreachable* (no answer: a
    connection refused, a timeout), back as soon as any command is answered, and *refusing
    writes* (it answers, but with an error: ``OOM command not allowed`` at ``maxmemory``
    with ``noeviction``, ``READONLY`` on a replica, ``NOPERM`` from an ACL), back only
    when a write succeeds. Kept apart, a Redis that serves reads and refuses writes logs
    one line per 30 s, not an "unreachable / is back" pair per command.

    >>> from redis.exceptions import ConnectionError, ResponseError
    >>> t = RedisTrouble(logging.getLogger("doc"), "redis://r:6379/0")
    >>> t.failed("write status", ResponseError("OOM command not allowed"))
    True
    >>> t.answered()  # a read: reachable, but writes are still refused
    >>> t.writable, t.refusing.down, t.unreachable.down
    (False, True, False)
    >>> t.wrote(); t.writable
    True
    """

    def __init__(self, logger: logging.Logger, where: str, *, prefix: str = "") -> None:
        self.unreachable = OutageLog(logger, "Redis", where, prefix=prefix)
        self.refusing = OutageLog(
            logger,
            "Redis",
            where,
            prefix=prefix,
            trouble="refuses writes",
            back="takes writes again",
        )
        self.last_error = ""  # the newest failure, for whoever reports a stall

    @property
    def writable(self) -> bool:
        return not self.refusing.down

    def failed(self, operation: str, exc: BaseException, detail: str = "") -> bool:
        """Count and maybe log one failed command (see :meth:`OutageLog.failed`)."""
        from redis.exceptions import ResponseError

        self.last_error = f"{operation}: {exc}"
        log = self.refusing if isinstance(exc, ResponseError) else self.unreachable
        return log.failed(operation, exc, detail)

    def answered(self, detail: str = "") -> float | None:
        """A command was answered: Redis is reachable."""
        return self.unreachable.recovered(detail)

    def wrote(self, detail: str = "") -> None:
        """A write was accepted: Redis is reachable and takes writes (``detail`` goes on
        the line of whichever trouble ends)."""
        if self.unreachable.recovered(detail) is None:
            self.refusing.recovered(detail)
        else:
            self.refusing.recovered()
