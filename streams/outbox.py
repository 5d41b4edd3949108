"""The notifier's persistent outbox in Redis: written before sending, retried, dead-lettered.

Every notification is stored (``P:outbox:items``, keyed by its idempotency key) and
scheduled (``P:outbox:due``, scored by the wall time it is due) before anything is sent;
the consumer offset of the alert that produced it is committed only after that. A
delivered notification is marked ``P:outbox:sent:KEY`` (kept 7 days) and removed, so the
same notification written again (a replay after a restart) is not sent again. Failed
attempts are rescheduled with exponential backoff and full jitter (1 s doubling up to 5
minutes, or the receiver's ``Retry-After`` if longer); after ``max_attempts`` (or a
permanent failure) the notification moves to ``P:outbox:dead`` (newest first, capped),
where status shows it.

The one gap is Redis' own: between a 2xx from the receiver and the ``sent`` mark, a
crash makes the notifier send it again after the restart (at least once). PagerDuty
dedups by ``dedup_key``; webhook receivers get the same ``X-Ragwatch-Key`` header (the
idempotency key) on both attempts.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from ragwatch.streams.notification import Notification
from ragwatch.streams.state import Keys

SENT_TTL_S = 7 * 86400
DEAD_MAX = 1000
BACKOFF_BASE_S = 1.0
BACKOFF_MAX_S = 300.0


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
    """Async outbox over a ``redis.asyncio`` client."""

    def __init__(
        self,
        client: Any,
        keys: Keys,
        *,
        max_attempts: int = 10,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.client, self.keys = client, keys
        self.max_attempts = max_attempts
        self._clock = clock
        self._rng = rng or random.Random()

    def _sent(self, key: str) -> str:
        return f"{self.keys.outbox_sent}:{key}"

    async def put(self, n: Notification) -> bool:
        """Store and schedule ``n`` now; False if it is queued or was delivered already."""
        if await self.client.exists(self._sent(n.key)):
            return False
        entry = Entry(n, first_at=self._clock())
        if not await self.client.hsetnx(self.keys.outbox_items, n.key, entry.to_json()):
            return False
        await self.client.zadd(self.keys.outbox_due, {n.key: self._clock()})
        return True

    async def due(self, limit: int = 100) -> list[Entry]:
        """Entries due now, oldest first."""
        keys = await self.client.zrangebyscore(
            self.keys.outbox_due, "-inf", self._clock(), start=0, num=limit
        )
        if not keys:
            return []
        raw = await self.client.hmget(self.keys.outbox_items, keys)
        out = []
        for k, v in zip(keys, raw, strict=True):
            if v is None:  # scheduled without an item: a leftover, drop it
                await self.client.zrem(self.keys.outbox_due, k)
                continue
            out.append(Entry.from_json(v))
        return out

    async def delivered(self, e: Entry) -> None:
        key = e.notification.key
        async with self.client.pipeline(transaction=True) as p:
            p.set(self._sent(key), b"1", ex=SENT_TTL_S)
            p.hdel(self.keys.outbox_items, key)
            p.zrem(self.keys.outbox_due, key)
            await p.execute()

    async def retry(self, e: Entry, reason: str, after_s: float | None) -> bool:
        """Reschedule (True), or dead-letter after ``max_attempts`` (False)."""
        e.attempts += 1
        e.last_error = reason
        if e.attempts >= self.max_attempts:
            await self.dead(e, f"gave up after {e.attempts} attempts: {reason}")
            return False
        wait = max(backoff_s(e.attempts, self._rng), after_s or 0.0)
        key = e.notification.key
        async with self.client.pipeline(transaction=True) as p:
            p.hset(self.keys.outbox_items, key, e.to_json())
            p.zadd(self.keys.outbox_due, {key: self._clock() + wait})
            await p.execute()
        return True

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
        async with self.client.pipeline(transaction=True) as p:
            p.lpush(self.keys.outbox_dead, record)
            p.ltrim(self.keys.outbox_dead, 0, DEAD_MAX - 1)
            p.hdel(self.keys.outbox_items, key)
            p.zrem(self.keys.outbox_due, key)
            await p.execute()

    async def sizes(self) -> tuple[int, int]:
        """(pending, dead)"""
        return (
            int(await self.client.zcard(self.keys.outbox_due)),
            int(await self.client.llen(self.keys.outbox_dead)),
        )
