"""What a normal interpreter exit delivers: buffered telemetry is not lost when a script or
a service ends without closing anything.

One ``atexit`` hook, registered with the first object, closes what is still open, as the
OpenTelemetry SDK's shutdown flushes span processors, then exporters: request recorders
(``first``) drain into their sinks, then publishers send, each within its
``exit_timeout_s``. The registry holds weak references only (it never keeps an object
alive), and skips objects of another process (made before a fork). It is the one piece of
process-wide state the agents keep: an exit hook is process-wide by nature.

>>> class Closable:
...     exit_timeout_s, closed = 1.0, None
...     def __init__(self): self._pid = os.getpid()
...     def close(self, timeout): self.closed = timeout
>>> hooks, rec, pub = AtExit(), Closable(), Closable()
>>> hooks.add(pub, first=False, register=False); hooks.add(rec, first=True, register=False)
>>> hooks.run(); rec.closed, pub.closed is not None
(1.0, True)
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class AtExit:
    """What a normal interpreter exit delivers: one ``atexit`` hook, registered with the
    first object. Recorders (``first``) drain into their sinks, then publishers send, all
    at once (each waits at most its ``exit_timeout_s``, counted from the start of the
    publishers' turn). Weak references only; objects of another process (made before a
    fork) are skipped."""

    def __init__(self) -> None:
        self._first: weakref.WeakSet[Any] = weakref.WeakSet()
        self._last: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._armed = False

    def add(self, obj: Any, *, first: bool, register: bool = True) -> None:
        """Close ``obj`` at exit (``register=False``: not armed, for tests to call
        :meth:`run` themselves)."""
        with self._lock:
            (self._first if first else self._last).add(obj)
            if register and not self._armed:
                atexit.register(self.run)
                self._armed = True

    def run(self) -> None:
        pid = os.getpid()
        for rec in [r for r in list(self._first) if r._pid == pid]:
            _quietly(rec.close, rec.exit_timeout_s)
        start = time.monotonic()
        for pub in [p for p in list(self._last) if p._pid == pid]:
            budget = pub.exit_timeout_s or 0.0
            _quietly(pub.close, max(0.0, start + budget - time.monotonic()))


def _quietly(close: Callable[[float], None], timeout: float) -> None:
    try:
        close(timeout)
    except Exception:  # one broken object must not keep the others from delivering
        log.exception("closing at interpreter exit failed")


_AT_EXIT = AtExit()


def register_at_exit(obj: Any, *, first: bool = False) -> None:
    """Close ``obj`` (``close(timeout)``, ``_pid`` and ``exit_timeout_s`` attributes) when
    the interpreter exits normally; ``first`` objects (recorders) before the others
    (publishers). Called by the constructors; a weak reference, so it never keeps ``obj``
    alive."""
    _AT_EXIT.add(obj, first=first)
