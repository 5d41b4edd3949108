"""Alert state, alert history and fleet status in Redis: the one module that knows the keys.

Keys (``P`` = ``RAGWATCH_REDIS_PREFIX``, default ``ragwatch``):

========================  ======  ==========================================================
key                       type    content
========================  ======  ==========================================================
``P:alerts:active``       hash    fingerprint -> alert JSON (wire format), pending + firing
``P:alerts:history``      list    every transition, newest first, capped at 10,000
``P:hosts``               hash    host -> JSON snapshot: GPUs, processes, memory, slopes
``P:services``            hash    service -> JSON snapshot: per instance, the last bucket's
                                  rates, quantiles, forecasts and outlier counts
``P:workers``             hash    worker id -> JSON counters and last-seen wall time
``P:snapshots:hosts``     hash    host -> worker state snapshot (streams/snapshot.py)
``P:snapshots:services``  hash    service -> worker state snapshot
``P:notified:FP:S:T``     string  set once alert FP was sent to receivers as status S with
                                  starts_at T: a replay after a crash does not page twice
                                  (expires after 7 days)
``P:series:index``        hash    series id -> JSON {kind, labels, signal, unit}
``P:series:ID``           list    recent points of one series, newest first, capped at
                                  SERIES_POINTS: JSON [ts, value, forecast|null, score|null]
``P:silences``            hash    silence id -> JSON silence (streams/silences.py)
``P:outbox:due``          zset    notification key -> wall time it is due (streams/outbox.py)
``P:outbox:items``        hash    notification key -> JSON {notification, attempts, ...}
``P:outbox:sent``         string  prefix: ``P:outbox:sent:KEY`` marks a delivered notification
``P:outbox:dead``         list    JSON of notifications that failed for good, newest first
``P:notifier``            hash    notifier counters (per receiver) and last-seen wall time
========================  ======  ==========================================================

The worker writes with :class:`RedisState` (asyncio); ``ragwatch status`` reads with
:func:`read_status` (blocking client), from Redis only.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from ragwatch.codec import encode, from_dict
from ragwatch.schema import Alert
from ragwatch.streams.engine import Transition

HISTORY_MAX = 10_000
SERIES_POINTS = 1440  # a day of 1-minute points per series
NOTIFIED_TTL_S = 7 * 86400


class Keys:
    """The Redis key names under one prefix."""

    def __init__(self, prefix: str) -> None:
        self.active = f"{prefix}:alerts:active"
        self.history = f"{prefix}:alerts:history"
        self.hosts = f"{prefix}:hosts"
        self.services = f"{prefix}:services"
        self.workers = f"{prefix}:workers"
        self.snapshots = {
            "host": f"{prefix}:snapshots:hosts",
            "service": f"{prefix}:snapshots:services",
        }
        self.notified = f"{prefix}:notified"
        self.series_index = f"{prefix}:series:index"
        self.series = f"{prefix}:series"  # + ":" + series id
        self.silences = f"{prefix}:silences"
        self.outbox_due = f"{prefix}:outbox:due"
        self.outbox_items = f"{prefix}:outbox:items"
        self.outbox_sent = f"{prefix}:outbox:sent"  # + ":" + notification key
        self.outbox_dead = f"{prefix}:outbox:dead"
        self.notifier = f"{prefix}:notifier"


class RedisState:
    """Async writer used by the worker (``redis.asyncio`` client passed in)."""

    def __init__(self, client: Any, prefix: str) -> None:
        self.client = client
        self.keys = Keys(prefix)

    async def write_transition(self, t: Transition) -> None:
        data = encode(t.alert)
        async with self.client.pipeline(transaction=True) as pipe:
            if t.alert.status == "resolved":
                pipe.hdel(self.keys.active, t.alert.fingerprint)
            else:
                pipe.hset(self.keys.active, t.alert.fingerprint, data)
            pipe.lpush(self.keys.history, data)
            pipe.ltrim(self.keys.history, 0, HISTORY_MAX - 1)
            await pipe.execute()

    async def write_hosts(self, snapshots: dict[str, dict[str, Any]]) -> None:
        if snapshots:
            await self.client.hset(
                self.keys.hosts, mapping={h: orjson.dumps(s) for h, s in snapshots.items()}
            )

    async def write_services(self, snapshots: dict[str, dict[str, Any]]) -> None:
        if snapshots:
            await self.client.hset(
                self.keys.services, mapping={s: orjson.dumps(v) for s, v in snapshots.items()}
            )

    async def write_worker(self, worker_id: str, counters: dict[str, Any]) -> None:
        await self.client.hset(
            self.keys.workers, worker_id, orjson.dumps({**counters, "seen": time.time()})
        )

    async def write_series(self, points: dict[str, tuple[dict[str, Any], list[Any]]]) -> None:
        """Append one point per series (newest first, capped) and index the series."""
        if not points:
            return
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.hset(
                self.keys.series_index,
                mapping={sid: orjson.dumps(meta) for sid, (meta, _) in points.items()},
            )
            for sid, (_, point) in points.items():
                key = f"{self.keys.series}:{sid}"
                pipe.lpush(key, orjson.dumps(point))
                pipe.ltrim(key, 0, SERIES_POINTS - 1)
            await pipe.execute()

    async def write_snapshots(self, kind: str, snapshots: dict[str, bytes]) -> None:
        if snapshots:
            await self.client.hset(self.keys.snapshots[kind], mapping=snapshots)

    async def read_snapshot(self, kind: str, key: str) -> bytes | None:
        data = await self.client.hget(self.keys.snapshots[kind], key)
        return bytes(data) if data is not None else None

    async def claim_notification(self, alert: Alert) -> bool:
        """True the first time this transition (fingerprint, status, starts_at) is claimed."""
        key = f"{self.keys.notified}:{alert.fingerprint}:{alert.status}:{alert.starts_at!r}"
        return bool(await self.client.set(key, b"1", nx=True, ex=NOTIFIED_TTL_S))

    async def active_alerts(self) -> list[Alert]:
        raw = await self.client.hvals(self.keys.active)
        return [a for a in (from_dict(orjson.loads(v)) for v in raw) if isinstance(a, Alert)]


def read_status(client: Any, prefix: str, history: int = 20) -> dict[str, Any]:
    """Everything ``ragwatch status`` shows, from Redis only (blocking client)."""
    keys = Keys(prefix)
    hosts = {k.decode(): orjson.loads(v) for k, v in client.hgetall(keys.hosts).items()}
    active = [orjson.loads(v) for v in client.hvals(keys.active)]
    recent = [orjson.loads(v) for v in client.lrange(keys.history, 0, history - 1)]
    workers = {k.decode(): orjson.loads(v) for k, v in client.hgetall(keys.workers).items()}
    services = {k.decode(): orjson.loads(v) for k, v in client.hgetall(keys.services).items()}
    return {
        "hosts": [hosts[h] for h in sorted(hosts)],
        "services": [services[s] for s in sorted(services)],
        "alerts": sorted(active, key=lambda a: (a["status"] != "firing", a["starts_at"])),
        "history": recent,
        "workers": workers,
    }
