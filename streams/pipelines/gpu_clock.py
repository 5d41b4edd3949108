"""Each host's clock, judged: which GPU envelopes the pipeline takes, and which hosts are alive.

Event time is the host's own stamp, and a host's clock can be wrong: NTP steps it back,
an RTC battery resets it to 1970, a new host was imaged with a clock a year behind. What
:class:`HostClocks` decides, per envelope, before any of its samples is read:

- **behind its host's own watermark** (the newest event time taken from that host) by
  more than ``tolerance_s`` (the pipeline's ``stale_s``; closer than that is a late or
  repeated envelope, whose samples the pipeline counts as ``duplicates`` as before): a
  *clock jump back*. The whole envelope is refused, its samples counted as
  ``clock_jumps_back`` and one line logged per jump (not per sample); so is every envelope
  of the host after it that far behind, until its clock passes its watermark again (a
  line says so). A jump is a drop between two envelopes of the host in arrival order:
  after a restart the first envelopes of a host restored from its snapshot may be far
  behind it (Kafka reads again from the last committed offset), and those, and the ones
  after them in order, are redeliveries, counted as ``duplicates`` as before.
- **too old**: stamped before :data:`FLOOR_TS` (2000-01-01T00:00:00Z), or more than
  ``max_behind_s`` (a day) behind the pipeline's watermark (against its slowest partition
  in a worker, so a catch-up that reads partitions at different paces is not judged).
  Refused and counted as ``too_old``; a host refused so, with no series, gets no status
  (the pipeline reports it as swept).

A refused envelope moves nothing on: no series, no rule, no timer, no sweep in the
host's time. So a live alert never resolves (nor fires) because a clock went back; its
series wait at the host's watermark, neither re-created nor evicted.

**Liveness is judged on arrival.** A host is alive while its envelopes arrive, whatever
their stamps (too old ones aside): :meth:`alive` reads the pipeline's watermark when its
last envelope arrived (and whether one arrived since the sweep before the last). The
pipeline sweeps a silent host only once that, not only the event time of its newest
sample, is far behind (a host whose clock runs two hours behind the others is not silent).

**Refused, not re-based.** Shifting a host's stamps forward after a sustained jump would
keep its samples, but a wrong clock is not the only thing that arrives behind: an agent's
spool flushed after a broker outage, Kafka's redeliveries after a crash. Moved to "now",
their old memory readings would be learned as the present (a leak that seems to drop,
an alert resolved on a made-up timeline), and the offset would have to be undone when the
clock is fixed (a jump forward that moves every other host's sweep). Refusing loses at
most the span of the jump for that host and invents nothing; the counter and the log line
say which host to fix.

>>> clocks = HostClocks(tolerance_s=300.0)
>>> clocks.judge("h1", 1_767_225_600.0, watermark=1_767_225_600.0)
<Verdict.TAKE: 1>
>>> clocks.judge("h1", 1_767_225_600.0 - 7200, watermark=1_767_225_630.0)
<Verdict.JUMP_BACK: 2>
>>> clocks.judge("h2", 1.0, watermark=1_767_225_630.0)
<Verdict.TOO_OLD: 3>
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

FLOOR_TS = 946_684_800.0  # 2000-01-01T00:00:00Z: no GPU telemetry is stamped before
MAX_BEHIND_S = 86_400.0  # a new host's stamps more than a day behind the fleet: too old


class Verdict(enum.Enum):
    """What becomes of an envelope."""

    TAKE = 1  # its samples are read (each one not newer than its series: a duplicate)
    JUMP_BACK = 2  # refused: its host's clock went back
    TOO_OLD = 3  # refused: stamped before the floor, or far behind the pipeline


@dataclass(slots=True)
class HostClock:
    """One host's clock as the pipeline has seen it."""

    newest: float  # the newest event time taken from the host: its own watermark
    arrived: float  # the pipeline's watermark when its last envelope arrived
    sweep: int  # the pipeline's silence sweeps done before it arrived
    last: float = math.nan  # the stamp of its last envelope (NaN: none since a restore)
    behind: bool = False  # in a jump back: its envelopes refused until it catches up
    refused: int = 0  # envelopes refused in this jump


class HostClocks:
    """The clocks of a pipeline's hosts."""

    def __init__(
        self,
        tolerance_s: float,
        *,
        newest: Callable[[str], float | None] = lambda _: None,
        floor_ts: float = FLOOR_TS,
        max_behind_s: float = MAX_BEHIND_S,
    ) -> None:
        """``tolerance_s``: how far behind its host's watermark an envelope may come and
        still be read (a late or repeated one), not refused as a jump back; ``newest``: a
        host's watermark as its series have it (None: it has none), for a host restored
        from a snapshot."""
        self.tolerance_s = tolerance_s
        self._newest = newest
        self.floor_ts = floor_ts
        self.max_behind_s = max_behind_s
        self._clocks: dict[str, HostClock] = {}
        self._old = 0  # envelopes refused as too old (their log lines)
        self._sweeps = 0  # the pipeline's silence sweeps so far

    def __len__(self) -> int:
        return len(self._clocks)

    def judge(self, host: str, ts: float, watermark: float, mark: float = math.inf) -> Verdict:
        """The verdict on an envelope of ``host`` stamped ``ts``, arriving when the
        pipeline's watermark is ``watermark`` (``mark``: its slowest partition's, if
        known); the host's clock moves on with it."""
        clock = self._clocks.get(host)
        if (
            clock is not None
            and clock.newest < ts
            and not clock.behind
            and ts >= watermark - self.max_behind_s
        ):  # the usual: newer than its last, in step with the rest
            clock.newest = clock.last = ts
            clock.arrived = max(watermark, ts)
            clock.sweep = self._sweeps
            return Verdict.TAKE
        if clock is None and (known := self._newest(host)) is not None:
            clock = self._clocks[host] = HostClock(known, watermark, self._sweeps)
        if clock is not None and ts < clock.newest - self.tolerance_s:
            clock.arrived = max(clock.arrived, watermark)
            clock.sweep = self._sweeps
            return self._behind(host, clock, ts)
        # (a worker's mark is -inf until its partitions' first marks: the watermark then)
        fleet = min(watermark, mark) if math.isfinite(mark) else watermark
        if ts < self.floor_ts or ts < fleet - self.max_behind_s:
            self._too_old(host, ts, fleet)
            return Verdict.TOO_OLD
        if clock is None:
            self._clocks[host] = HostClock(ts, max(watermark, ts), self._sweeps, ts)
            return Verdict.TAKE
        clock.arrived = max(clock.arrived, watermark, ts)
        clock.sweep = self._sweeps
        clock.last = ts
        if ts > clock.newest:
            clock.newest = ts
            if clock.behind:
                self._caught_up(host, clock)
        return Verdict.TAKE

    def _behind(self, host: str, clock: HostClock, ts: float) -> Verdict:
        """An envelope beyond the tolerance behind its host's watermark: a jump back if
        its host is in one or its stamp dropped from the last one's (else a redelivery
        after a restore, read as before: its samples are duplicates)."""
        dropped = ts < clock.last - self.tolerance_s
        clock.last = ts
        if not (clock.behind or dropped):
            return Verdict.TAKE
        if dropped:
            log.warning(
                "host %s: clock jumped back: ts=%.0f is %.0f s behind its newest sample "
                "(ts=%.0f); its samples are refused until its clock passes that (check its NTP)",
                host,
                ts,
                clock.newest - ts,
                clock.newest,
            )
        clock.behind = True
        clock.refused += 1
        return Verdict.JUMP_BACK

    def _caught_up(self, host: str, clock: HostClock) -> None:
        log.info(
            "host %s: clock caught up with its newest sample; %d envelope(s) were refused "
            "while it was behind",
            host,
            clock.refused,
        )
        clock.behind, clock.refused = False, 0

    def _too_old(self, host: str, ts: float, fleet: float) -> None:
        self._old += 1
        if self._old in (1, 10, 100) or self._old % 10_000 == 0:
            why = (
                f"before {self.floor_ts:.0f} (2000-01-01)"
                if ts < self.floor_ts
                else f"{fleet - ts:.0f} s behind the newest event time {fleet:.0f} (at most "
                f"{self.max_behind_s:.0f})"
            )
            log.warning(
                "host %s: refused an envelope stamped ts=%.0f, %s (refused so far: %d)",
                host,
                ts,
                why,
                self._old,
            )

    def alive(self, host: str, now: float, within_s: float) -> bool:
        """Whether an envelope of ``host`` arrived (whatever its stamp, too old ones
        aside) within ``within_s`` of event time before ``now`` (the pipeline's watermark
        when it arrived), or since the sweep before the pipeline's last: at its start the
        watermark finds its level (the first envelope sweeps, the next may move it hours
        on), and a host that arrived then is not silent at the next sweep."""
        clock = self._clocks.get(host)
        return clock is not None and (
            self._sweeps - clock.sweep <= 1 or now - clock.arrived <= within_s
        )

    def swept(self, now: float, within_s: float, tracked: Callable[[str], bool]) -> None:
        """The pipeline swept its silent hosts at ``now``: forget the clocks of those not
        :meth:`alive` whose series are gone (``tracked``: whether a host still has any)."""
        for host in list(self._clocks):
            if not self.alive(host, now, within_s) and not tracked(host):
                del self._clocks[host]
        self._sweeps += 1

    def forget(self, host: str) -> None:
        """Drop what is known of ``host``'s clock (another worker owns it now)."""
        self._clocks.pop(host, None)

    def redelivered(self, host: str) -> None:
        """Kafka delivers ``host``'s envelopes again from the last committed offset (a
        rebalance left its partition here): the first ones behind its newest are
        redeliveries, as after a restore, not a jump back (one already in a jump stays
        in it)."""
        if (clock := self._clocks.get(host)) is not None:
            clock.last = math.nan
