"""The notifier's persistent outbox in Redis: written before sending, retried, dead-lettered.

Every notification is stored (``P:outbox:items``, keyed by its idempotency key) and
scheduled (``P:outbox:due``, scored by the wall time it is due) before anything is sent;
the consumer offset of the alert that produced it is committed only after that. A
delivered notification is marked ``P:outbox:sent:KEY`` (kept 7 days) and removed, so the
same notification written again (a replay after a restart) is not sent again. Failed
attempts are rescheduled with exponential backoff and full jitter (1 s doubling up to 5
minutes, or the receiver's ``Retry-After`` if longer); after ``max_attempts`` and at least
``min_retry_s`` (15 minutes: a receiver down for a few minutes gets everything), or at
once on a permanent failure, the notification moves to ``P:outbox:dead`` (newest first,
capped), where status shows it. Notifications of one group (one receiver, one set of
group labels) go out in the order they were queued: a resolution waits for the firing
notification before it that is still backing off (``P:outbox:order:GROUP``).

While Redis is unreachable or refuses writes (``maxmemory`` with ``noeviction``, a
read-only replica, an ACL) the outbox degrades to memory (with a warning, counted in
``memory_fallbacks``): new notifications, retries and delivery marks are kept in this
process, sent from there, and written to Redis as soon as it answers again. What is only
in memory is lost if the notifier dies during the outage.

Each notification is marked as soon as its receiver answers, before the next one goes
(the sender hands every answer on at once, see ``Sender.send``'s ``settle``). The one gap
is between a 2xx from the receiver and the ``sent`` mark: a crash there makes the notifier
send that notification again after the restart, so a ``kill -9`` costs at most one
duplicate per request in flight (one per receiver). PagerDuty dedups by ``dedup_key``;
webhook receivers get the same ``X-Ragwatch-Key`` header (the idempotency key) on both
attempts; Alertmanager dedups by the alert's labels (its fingerprint).
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from redis.exceptions import RedisError

from ragwatch.outage import RedisTrouble
from ragwatch.store import Keys
from ragwatch.streams.notifier.notification import Notification

log = logging.getLogger(__name__)

SENT_TTL_S = 7 * 86400
DEAD_MAX = 1000
BACKOFF_BASE_S = 1.0
BACKOFF_MAX_S = 300.0
MIN_RETRY_S = 900.0


@dataclass
class Entry:
    """A notification in the outbox and how its delivery went so far."""

    notification: Notification
    attempts: int = 0
    first_at: float = 0.0
    last_error: str | None = None

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "notification": orjson.Fragment(self.notification.to_json()),
                "attempts": self.attempts,
                "first_at": self.first_at,
                "last_error": self.last_error,
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> Entry:
        d = orjson.loads(data)
        return cls(
            Notification.from_json(orjson.dumps(d["notification"])),
            int(d["attempts"]),
            float(d["first_at"]),
            d.get("last_error"),
        )


def backoff_s(attempts: int, rng: random.Random) -> float:
    """Full jitter (AWS architecture blog): uniform in [0, min(max, base * 2**attempts)],
    never below a tenth of the cap, so retries spread but do not spin."""
    cap = min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** min(attempts, 20))
    return float(max(cap / 10, rng.uniform(0, cap)))


class Outbox:
    """Async outbox over a ``redis.asyncio`` client, with a memory fallback."""

    def __init__(
        self,
        client: Any,
        keys: Keys,
        *,
        max_attempts: int = 10,
        min_retry_s: float = MIN_RETRY_S,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        where: str = "",
    ) -> None:
        self.client, self.keys = client, keys
        self.max_attempts = max_attempts
        self.min_retry_s = min_retry_s
        self._clock = clock
        self._rng = rng or random.Random()
        # the memory fallback: entries and due times, delivered keys and dead records
        # that Redis has not heard of yet
        self._mem: dict[str, Entry] = {}
        self._mem_due: dict[str, float] = {}
        self._mem_sent: dict[str, str] = {}  # key -> group key
        self._mem_dead: list[tuple[str, str, bytes]] = []
        # undelivered notifications this process knows are in Redis: key -> (group, first_at).
        # While Redis is away, a notification in memory must not overtake an older one of
        # its group that waits there (a resolution before its firing notification).
        self._in_redis: dict[str, tuple[str, float]] = {}
        self.memory_fallbacks = 0
        self._outage = RedisTrouble(log, where, prefix="outbox: ")  # where: its URL

    def _sent(self, key: str) -> str:
        return f"{self.keys.outbox_sent}:{key}"

    def _order(self, group_key: str) -> str:
        return f"{self.keys.outbox_order}:{group_key}"

    def _remove(self, pipe: Any, key: str, group_key: str) -> None:
        """Queue, on ``pipe``, the removal of a notification from the outbox's item hash,
        due schedule and its group's order."""
        pipe.hdel(self.keys.outbox_items, key)
        pipe.zrem(self.keys.outbox_due, key)
        pipe.zrem(self._order(group_key), key)

    @property
    def in_memory(self) -> int:
        """Notifications (and marks) waiting for Redis to come back."""
        return len(self._mem) + len(self._mem_sent) + len(self._mem_dead)

    def _fallback(self, what: str, exc: Exception) -> None:
        self.memory_fallbacks += 1
        self._outage.failed(  # the first at once, then one line per 30 s
            what, exc, f"; {what} kept in memory until it is back ({self.in_memory} in memory)"
        )

    async def put(self, n: Notification) -> bool:
        """Store and schedule ``n`` now; False if it is queued or was delivered already."""
        if n.key in self._mem or n.key in self._mem_sent:
            return False
        entry = Entry(n, first_at=self._clock())
        try:
            await self._flush()
            if await self.client.exists(self._sent(n.key)):
                return False
            if not await self.client.hsetnx(self.keys.outbox_items, n.key, entry.to_json()):
                queued = await self.client.hget(self.keys.outbox_items, n.key)
                if queued is not None:  # queued before (a replay): it orders its group too
                    first_at = Entry.from_json(queued).first_at
                    await self._schedule(n, first_at)
                    self._in_redis[n.key] = (n.group_key, first_at)
                return False
            async with self.client.pipeline(transaction=True) as p:
                p.zadd(self.keys.outbox_due, {n.key: self._clock()})
                p.zadd(self._order(n.group_key), {n.key: entry.first_at})
                await p.execute()
            self._in_redis[n.key] = (n.group_key, entry.first_at)
        except RedisError as exc:
            self._mem[n.key] = entry
            self._mem_due[n.key] = self._clock()
            self._fallback("a new notification", exc)
        return True

    async def _schedule(self, n: Notification, first_at: float) -> None:
        """Make sure a stored notification is scheduled and in its group's order: a
        process killed between storing it and scheduling it (two round trips) left it
        stored and never due; its alert's offset was not committed, so the replay that
        puts it again lands here. Nothing changes for one already scheduled (NX)."""
        async with self.client.pipeline(transaction=True) as p:
            p.zadd(self.keys.outbox_due, {n.key: self._clock()}, nx=True)
            p.zadd(self._order(n.group_key), {n.key: first_at}, nx=True)
            added = await p.execute()
        if added[0]:
            log.warning(
                "outbox: notification %s was stored but not scheduled: scheduled now", n.key
            )

    async def _flush(self) -> None:
        """Write what the memory fallback holds to Redis (raises RedisError if it can't)."""
        if not self.in_memory:
            return
        async with self.client.pipeline(transaction=True) as p:
            for key, group in self._mem_sent.items():
                p.set(self._sent(key), b"1", ex=SENT_TTL_S)
                self._remove(p, key, group)
            for key, group, record in self._mem_dead:
                p.lpush(self.keys.outbox_dead, record)
                self._remove(p, key, group)
            p.ltrim(self.keys.outbox_dead, 0, DEAD_MAX - 1)
            for key, e in self._mem.items():
                p.hset(self.keys.outbox_items, key, e.to_json())
                p.zadd(self.keys.outbox_due, {key: self._mem_due[key]})
                p.zadd(self._order(e.notification.group_key), {key: e.first_at})
            await p.execute()
        n = self.in_memory
        for key, e in self._mem.items():
            self._in_redis[key] = (e.notification.group_key, e.first_at)
        self._mem.clear()
        self._mem_due.clear()
        self._mem_sent.clear()
        self._mem_dead.clear()
        self._outage.wrote(f": wrote {n} notification(s) and marks kept in memory")

    async def due(self, limit: int = 100) -> list[Entry]:
        """Entries due now, oldest first (from memory too while Redis is unreachable)."""
        now = self._clock()
        try:
            await self._flush()
            keys = await self.client.zrangebyscore(
                self.keys.outbox_due, "-inf", now, start=0, num=limit
            )
        except RedisError as exc:
            if not self._mem:
                raise
            self._fallback("reading the outbox", exc)
            keys = []
        if self._mem:
            # in memory, per group only the oldest queued notification may go, and not
            # before an older one of its group that waits in Redis
            in_redis: dict[str, float] = {}
            for group, first_at in self._in_redis.values():
                in_redis[group] = min(first_at, in_redis.get(group, math.inf))
            heads: dict[str, Entry] = {}
            for e in sorted(self._mem.values(), key=lambda e: e.first_at):
                heads.setdefault(e.notification.group_key, e)
            mem = sorted(
                (self._mem_due[e.notification.key], e.notification.key)
                for e in heads.values()
                if self._mem_due[e.notification.key] <= now
                and in_redis.get(e.notification.group_key, math.inf) >= e.first_at
            )
            if mem:
                return [self._mem[k] for _, k in mem[:limit]]
        if not keys:
            return []
        raw = await self.client.hmget(self.keys.outbox_items, keys)
        entries = []
        for k, v in zip(keys, raw, strict=True):
            if v is None:  # scheduled without an item: a leftover, drop it
                await self.client.zrem(self.keys.outbox_due, k)
                continue
            e = Entry.from_json(v)
            self._in_redis[e.notification.key] = (e.notification.group_key, e.first_at)
            entries.append(e)
        if not entries:
            return []
        async with self.client.pipeline(transaction=False) as p:
            for e in entries:
                p.zrange(self._order(e.notification.group_key), 0, 0)
            heads_raw = await p.execute()
        out, blocked = [], []
        entries_by_key = {e.notification.key: e for e in entries}
        for e, head in zip(entries, heads_raw, strict=True):
            # the oldest of its group (or queued before groups were ordered): it may go
            if not head or head[0].decode() == e.notification.key:
                out.append(e)
            else:
                blocked.append((e.notification.key, head[0]))
        if blocked:
            # not before its head: off the due window until then, so entries waiting behind
            # heads that back off cannot fill it and starve every other group
            async with self.client.pipeline(transaction=False) as p:
                for _, head_key in blocked:
                    p.zscore(self.keys.outbox_due, head_key)
                    p.hexists(self.keys.outbox_items, head_key)
                replies = await p.execute()
            async with self.client.pipeline(transaction=False) as p:
                for i, (key, head_key) in enumerate(blocked):
                    score, exists = replies[2 * i], replies[2 * i + 1]
                    group = entries_by_key[key].notification.group_key
                    if not exists:
                        # a head without an item (a leftover) would block its group for
                        # good: drop it from the order; the next one goes next tick
                        p.zrem(self._order(group), head_key)
                    p.zadd(self.keys.outbox_due, {key: max(now + 1.0, score or 0.0)}, xx=True)
                await p.execute()
        return out

    async def delivered(self, e: Entry) -> None:
        key = e.notification.key
        self._in_redis.pop(key, None)
        self._mem.pop(key, None)
        self._mem_due.pop(key, None)
        try:
            async with self.client.pipeline(transaction=True) as p:
                p.set(self._sent(key), b"1", ex=SENT_TTL_S)
                self._remove(p, key, e.notification.group_key)
                await p.execute()
        except RedisError as exc:
            # not sent again from Redis's copy when it is back
            self._mem_sent[key] = e.notification.group_key
            self._fallback("a delivery mark", exc)

    async def retry(self, e: Entry, reason: str, after_s: float | None) -> bool:
        """Reschedule (True), or dead-letter after ``max_attempts`` (False)."""
        e.attempts += 1
        e.last_error = reason
        if e.attempts >= self.max_attempts and self._clock() - e.first_at >= self.min_retry_s:
            await self.dead(e, f"gave up after {e.attempts} attempts: {reason}")
            return False
        wait = max(backoff_s(e.attempts, self._rng), after_s or 0.0)
        key = e.notification.key
        if key not in self._mem:
            try:
                async with self.client.pipeline(transaction=True) as p:
                    p.hset(self.keys.outbox_items, key, e.to_json())
                    p.zadd(self.keys.outbox_due, {key: self._clock() + wait})
                    await p.execute()
                return True
            except RedisError as exc:
                self._fallback("a retry", exc)
        self._in_redis.pop(key, None)  # memory holds the newer copy now
        self._mem[key] = e
        self._mem_due[key] = self._clock() + wait
        return True

    async def defer(self, entries: list[Entry], seconds: float) -> None:
        """Take due entries off the due window for ``seconds`` without counting an attempt
        (their receiver is busy with an earlier send): they cannot crowd the window and
        starve the other receivers' notifications meanwhile."""
        later = self._clock() + seconds
        in_redis = {}
        for e in entries:
            key = e.notification.key
            if key in self._mem:
                self._mem_due[key] = max(self._mem_due.get(key, later), later)
            else:
                in_redis[key] = later
        if not in_redis:
            return
        try:
            await self.client.zadd(self.keys.outbox_due, in_redis, xx=True, gt=True)
        except RedisError as exc:  # they come due again at once: delivered a little later
            self._fallback("deferring a busy receiver's notifications", exc)

    async def dead(self, e: Entry, reason: str) -> None:
        key = e.notification.key
        record = orjson.dumps(
            {
                "notification": orjson.Fragment(e.notification.to_json()),
                "attempts": e.attempts,
                "error": reason,
                "dead_at": self._clock(),
            }
        )
        self._in_redis.pop(key, None)
        self._mem.pop(key, None)
        self._mem_due.pop(key, None)
        try:
            async with self.client.pipeline(transaction=True) as p:
                p.lpush(self.keys.outbox_dead, record)
                p.ltrim(self.keys.outbox_dead, 0, DEAD_MAX - 1)
                self._remove(p, key, e.notification.group_key)
                await p.execute()
        except RedisError as exc:
            self._mem_dead.append((key, e.notification.group_key, record))
            self._fallback("a dead letter", exc)

    async def sizes(self) -> tuple[int, int]:
        """(pending, dead)"""
        return (
            int(await self.client.zcard(self.keys.outbox_due)),
            int(await self.client.llen(self.keys.outbox_dead)),
        )
