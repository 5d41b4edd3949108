"""Says when the worker's committed offsets stop moving, and why, once per change.

A message's offset is committed only after the snapshot that includes it is written
(:mod:`ragwatch.streams.worker.acks`). While Redis cannot take the snapshots (unreachable,
or refusing writes: ``OOM command not allowed`` at ``maxmemory`` with ``noeviction``,
``READONLY``, ``NOPERM``), the worker goes on detecting and publishing alerts, but its
offsets wait: a restart would read those messages again. That is the safe choice, and
bounded (at ``HeldAcks.limit`` messages held, everything is committed anyway, with a
warning); :class:`CommitStall` makes it visible: one warning when commits stop, with the
reason and how many messages wait, one line when they move again, and the count in the
worker's ``held_acks`` / ``commit_stalls`` counters.

>>> import logging
>>> stall = CommitStall(logging.getLogger("doc"))
>>> stall.blocked(12, "write snapshots: OOM command not allowed"), stall.blocked(40, "")
(True, False)
>>> stall.cleared(40), stall.cleared(3), stall.stalls
(True, False, 1)
"""

from __future__ import annotations

import logging


class CommitStall:
    """Whether commits are held back by snapshots that cannot be written."""

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self.since_held: int | None = None  # messages held when the stall began
        self.stalls = 0

    @property
    def stalled(self) -> bool:
        return self.since_held is not None

    def blocked(self, held: int, why: str) -> bool:
        """A snapshot write failed with ``held`` messages waiting; True if this starts a
        stall (and it was logged)."""
        if self.since_held is not None:
            return False
        self.since_held = held
        self.stalls += 1
        self._log.warning(
            "offsets not committed: %d message(s) read wait for snapshots that cannot be "
            "written (%s); the worker goes on detecting, and commits resume once a snapshot "
            "is written (a restart meanwhile reads those messages again)",
            held,
            why or "Redis error",
        )
        return True

    def cleared(self, released: int) -> bool:
        """A snapshot was written and ``released`` acks went; True if a stall ended."""
        if self.since_held is None:
            return False
        self.since_held = None
        self._log.warning("snapshots written again: committing offsets (%d released)", released)
        return True
