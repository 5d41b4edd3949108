"""``ragwatch serve``'s door: slow clients (slowloris) cannot starve the server.

Request heads have a deadline (``HEAD_TIMEOUT_S`` from connecting; later heads aiohttp's
``keepalive_timeout``, set to the same), an unread body is drained for ``BODY_TIMEOUT_S``
at most, and connections are capped below the open-file limit (:func:`connection_limit`):
at the cap a new connection closes the oldest one waiting for a request, so ``/healthz``
keeps answering while a thousand connections trickle header bytes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

log = logging.getLogger("ragwatch.console.serve")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

HEAD_TIMEOUT_S = 10.0  # to send a request head: from connecting, or from the last response
BODY_TIMEOUT_S = 10.0  # an unread request body is drained this long after the response
LISTEN_BACKLOG = 128  # aiohttp's default: the kernel's queue, and asyncio's accept() burst
# asyncio accepts up to LISTEN_BACKLOG sockets per loop iteration; a socket reaches the guard
# two iterations after its accept() and one the guard evicts is closed an iteration later:
# up to 3 bursts of sockets beyond the guard's count (a fourth for margin)
ACCEPT_BURSTS = 4
FD_RESERVE = 64  # descriptors kept for Redis (one per worker thread), files and logs
MIN_CONNECTIONS, MAX_CONNECTIONS = 8, 4096  # above, memory decides (containers: 2**20 files)


def connection_limit(open_files: int) -> int:
    """The connections to keep open under an open-file limit (RLIMIT_NOFILE's soft
    limit, -1 for none): what it leaves after ``FD_RESERVE`` and the sockets asyncio
    accepts before the guard sees them, so accept() never meets EMFILE (asyncio then
    logs a traceback per socket and stops accepting for a second, ``/healthz`` included).

    >>> connection_limit(1024), connection_limit(2048), connection_limit(256)
    (448, 1472, 8)
    >>> connection_limit(-1), connection_limit(1 << 20)
    (4096, 4096)
    """
    spare = open_files - FD_RESERVE - ACCEPT_BURSTS * LISTEN_BACKLOG
    return MAX_CONNECTIONS if open_files < 0 else max(MIN_CONNECTIONS, min(MAX_CONNECTIONS, spare))


class ConnectionGuard:
    """The door of the listening socket: at most ``limit`` connections, and a deadline
    for the first request head.

    A connection (keyed by its aiohttp protocol, ``request.protocol``) is *waiting* while
    it is not inside a handler: sending its first head, or idle (or draining a body) after
    a response; :func:`guard_middleware` calls :meth:`busy` and :meth:`idle` around each
    handler. At the limit a new connection closes the oldest waiting one (as nginx reuses
    idle connections) or, when all are inside handlers, is closed itself. One that has
    not reached a handler ``head_timeout_s`` after connecting is closed; later heads are
    timed by aiohttp's ``keepalive_timeout`` (the same, :func:`_serve`), which closes a
    connection still waiting for one that long after its last response.
    """

    def __init__(self, limit: int, head_timeout_s: float) -> None:
        self.limit, self.head_timeout_s = limit, head_timeout_s
        self.evicted = self.refused = self.timed_out = 0
        self._open: dict[asyncio.Protocol, asyncio.Transport] = {}
        self._waiting: dict[asyncio.Protocol, None] = {}  # insertion order: oldest first
        self._deadlines: dict[asyncio.Protocol, asyncio.TimerHandle] = {}
        self._full = False

    def factory(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        """A protocol factory for ``loop.create_server``: ``inner``'s protocols, guarded."""
        return lambda: GuardedConnection(self, inner())

    def admit(self, protocol: asyncio.Protocol, transport: asyncio.Transport) -> bool:
        """Whether a new connection may stay (the oldest waiting one closed if need be)."""
        if len(self._open) >= self.limit and not self._evict_oldest():
            self.refused += 1
            return False
        self._open[protocol], self._waiting[protocol] = transport, None
        loop = asyncio.get_running_loop()
        self._deadlines[protocol] = loop.call_later(self.head_timeout_s, self._expire, protocol)
        if len(self._open) >= self.limit and not self._full:
            self._full = True
            log.warning("connection limit reached (%d): the oldest connections waiting for a "
                        "request make room for new ones", self.limit)  # fmt: skip
        return True

    def leave(self, protocol: asyncio.Protocol) -> None:
        """A connection closed (by either side)."""
        self._drop(protocol)
        if self._full and len(self._open) < self.limit * 0.9:
            self._full = False
            log.info("below the connection limit again (%d evicted, %d refused, %d timed "
                     "out so far)", self.evicted, self.refused, self.timed_out)  # fmt: skip

    def busy(self, protocol: asyncio.Protocol) -> None:
        """A request reached a handler: its head is complete."""
        self._waiting.pop(protocol, None)
        if (deadline := self._deadlines.pop(protocol, None)) is not None:
            deadline.cancel()

    def idle(self, protocol: asyncio.Protocol) -> None:
        """The handler returned: the connection waits again, the newest of all."""
        if protocol in self._open:
            self._waiting[protocol] = None

    def _drop(self, protocol: asyncio.Protocol) -> asyncio.Transport | None:
        self.busy(protocol)
        return self._open.pop(protocol, None)

    def _evict_oldest(self) -> bool:
        transport = self._drop(next(iter(self._waiting))) if self._waiting else None
        if transport is not None:
            transport.abort()
            self.evicted += 1
        return transport is not None

    def _expire(self, protocol: asyncio.Protocol) -> None:
        if (transport := self._drop(protocol)) is not None:
            transport.abort()
            self.timed_out += 1


class GuardedConnection(asyncio.Protocol):
    """aiohttp's protocol of one connection, passed every event once the guard has
    admitted it; a connection refused is aborted before aiohttp sees it."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self.guard, self.inner, self.admitted = guard, inner, False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.admitted = self.guard.admit(self.inner, transport)
        if self.admitted:
            self.inner.connection_made(transport)
        else:
            transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.admitted:
            self.guard.leave(self.inner)
            self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.admitted:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.admitted else None

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


def guard_middleware(guard: ConnectionGuard) -> Any:
    """Tells ``guard`` when a connection's request is inside a handler."""

    @web.middleware
    async def track(request: web.Request, handler: Handler) -> web.StreamResponse:
        guard.busy(request.protocol)
        try:
            return await handler(request)
        finally:
            guard.idle(request.protocol)

    return track
