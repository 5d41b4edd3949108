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
``P:snapshots:hosts``     hash    host -> worker state snapshot (streams/worker/snapshot.py)
``P:snapshots:services``  hash    service -> worker state snapshot
``P:notified:FP:S:T``     string  set once alert FP was sent to receivers as status S with
                                  starts_at T: a replay after a crash does not page twice
                                  (expires after 7 days)
``P:series:index``        hash    series id -> JSON {kind, labels, signal, unit}
``P:series:ID``           list    recent points of one series, newest first, capped at
                                  SERIES_POINTS: JSON [ts, value, forecast|null, score|null]
``P:silences``            hash    silence id -> JSON silence (ragwatch/silences.py)
``P:outbox:due``          zset    notification key -> wall time it is due (notifier/outbox.py)
``P:outbox:items``        hash    notification key -> JSON {notification, attempts, ...}
``P:outbox:order:G``      zset    the queued notifications of group G by first_at: only
                                  the oldest is sent (in order per alert group)
``P:outbox:sent``         string  prefix: ``P:outbox:sent:KEY`` marks a delivered notification
``P:outbox:dead``         list    JSON of notifications that failed for good, newest first
``P:notifier``            hash    notifier counters (per receiver) and last-seen wall time
========================  ======  ==========================================================

The worker writes with :class:`RedisState` (asyncio); ``ragwatch status`` and ``ragwatch
serve`` read with :func:`read_status` and the other ``read_*`` functions (blocking client),
from Redis only.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

import orjson
import redis.asyncio as aioredis

from ragwatch.advisor import MIN_SCORE, explain
from ragwatch.chart_ids import multiple_starts, multiples
from ragwatch.codec import encode, from_dict
from ragwatch.schema import Alert, Transition
from ragwatch.silences import decode_all

HISTORY_MAX = 10_000
SERIES_POINTS = 1440  # a day of 1-minute points per series
REINDEX_S = 600.0
SERIES_CHUNK = 1000
# KEYS: series lists; ARGV[1]: points kept; then for each of KEYS in turn, how many new
# points it has and those points, oldest first. One Redis (not a cluster: the keys of a
# call may live in different slots).
PUSH_POINTS = """
local keep = tonumber(ARGV[1])
local at = 2
for i, key in ipairs(KEYS) do
  local n = tonumber(ARGV[at])
  for j = at + 1, at + n do
    redis.call('LPUSH', key, ARGV[j])
  end
  redis.call('LTRIM', key, 0, keep - 1)
  at = at + n + 1
end
return #KEYS
"""
NOTIFIED_TTL_S = 7 * 86400


class Keys:
    """The Redis key names under one prefix."""

    def __init__(self, prefix: str) -> None:
        self.active = f"{prefix}:alerts:active"
        self.history = f"{prefix}:alerts:history"
        self.flaps = f"{prefix}:alerts:flaps"  # "RULE:FINGERPRINT" -> times it flapped
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
        self.outbox_order = f"{prefix}:outbox:order"  # + ":" + group key: zset by first_at
        self.outbox_sent = f"{prefix}:outbox:sent"  # + ":" + notification key
        self.outbox_dead = f"{prefix}:outbox:dead"
        self.notifier = f"{prefix}:notifier"


def async_client(url: str) -> Any:
    """The ``redis.asyncio`` client of the worker and the notifier, with timeouts: a hung
    Redis must not stall the coroutines that await it (:func:`blocking_client` is the
    console's and the commands')."""
    return aioredis.from_url(url, socket_timeout=5.0, socket_connect_timeout=2.0)


def blocking_client(url: str, *, connect_s: float = 5.0) -> Any:
    """A blocking Redis client for the console and the commands: ``connect_s`` to connect,
    5 s per command."""
    import redis

    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=connect_s)


class RedisState:
    """Async writer used by the worker (``redis.asyncio`` client passed in)."""

    def __init__(self, client: Any, prefix: str) -> None:
        self.client = client
        self.keys = Keys(prefix)
        # Chart writes are the worker's most frequent Redis commands (a point per series
        # per minute of event time, thousands a second on a replay): index a series once
        # (again every REINDEX_S, in case Redis lost it) and push a flush's points with one
        # script call per SERIES_CHUNK series instead of two commands per point.
        self._indexed: set[str] = set()
        self._indexed_at = time.monotonic()
        self._push = client.register_script(PUSH_POINTS)

    async def write_transition(self, t: Transition) -> None:
        data = encode(t.alert)
        async with self.client.pipeline(transaction=True) as pipe:
            if t.alert.status == "resolved":
                pipe.hdel(self.keys.active, t.alert.fingerprint)
            else:
                pipe.hset(self.keys.active, t.alert.fingerprint, data)
            pipe.lpush(self.keys.history, data)
            pipe.ltrim(self.keys.history, 0, HISTORY_MAX - 1)
            if t.flapped:  # fired again soon after resolving: one fault paging twice
                pipe.hincrby(self.keys.flaps, f"{t.alert.rule}:{t.alert.fingerprint}", 1)
            await pipe.execute()

    def forget_index(self) -> None:
        """Index every chart series again on its next point (Redis may have restarted)."""
        self._indexed.clear()

    async def rewrite_active(self, active: Mapping[str, Alert], resolved: Iterable[str]) -> None:
        """Write every active alert of a worker again and drop the resolved ones (after
        Redis was unreachable or restarted empty)."""
        async with self.client.pipeline(transaction=True) as pipe:
            gone = list(resolved)
            if gone:
                pipe.hdel(self.keys.active, *gone)
            if active:
                pipe.hset(self.keys.active, mapping={fp: encode(a) for fp, a in active.items()})
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

    async def write_worker(self, worker_id: str, counters: dict[str, Any]) -> dict[str, Any]:
        """Write a worker's counters under its id; returns the record it replaced ({} if
        none), so that a worker can tell another process writing under its id."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hget(self.keys.workers, worker_id)
            pipe.hset(self.keys.workers, worker_id, orjson.dumps({**counters, "seen": time.time()}))
            previous, _ = await pipe.execute()
        old = _json(previous) if previous is not None else None
        return old if isinstance(old, dict) else {}

    async def write_series(self, points: Mapping[str, tuple[dict[str, Any], list[Any]]]) -> None:
        """Append each series' new points (the list is kept newest first, capped at
        ``SERIES_POINTS``) and index the series. ``points``: series id -> (index entry, its
        points ``[ts, value, forecast, score]``, oldest first)."""
        if not points:
            return
        now = time.monotonic()
        if now - self._indexed_at > REINDEX_S:
            self._indexed.clear()
            self._indexed_at = now
        new = {
            sid: orjson.dumps(meta) for sid, (meta, _) in points.items() if sid not in self._indexed
        }
        if new:
            await self.client.hset(self.keys.series_index, mapping=new)
        items = [(sid, given[-SERIES_POINTS:]) for sid, (_, given) in points.items()]
        chunk: list[tuple[str, list[Any]]] = []
        size = 0
        for sid, pts in items:
            chunk.append((sid, pts))
            size += len(pts)
            if len(chunk) >= SERIES_CHUNK or size >= SERIES_CHUNK * 4:
                await self._push_chunk(chunk)
                chunk, size = [], 0
        if chunk:
            await self._push_chunk(chunk)
        self._indexed.update(new)

    async def _push_chunk(self, chunk: list[tuple[str, list[Any]]]) -> None:
        args: list[Any] = [SERIES_POINTS]
        for _, pts in chunk:
            args += [len(pts), *map(orjson.dumps, pts)]
        await self._push(keys=[f"{self.keys.series}:{sid}" for sid, _ in chunk], args=args)

    async def prune(self, hosts: set[str], services: set[str], prefixes: tuple[str, ...]) -> int:
        """Delete what Redis holds about hosts and services that went silent and were
        swept from memory: their status entries, snapshots, and the chart series whose ids
        start with ``prefixes`` (index entries and point lists, found by one scan of the
        index: a previous worker may have written them). Returns how many charts went."""
        charts = []
        if prefixes:
            async for raw, _ in self.client.hscan_iter(self.keys.series_index, count=1000):
                sid = raw.decode() if isinstance(raw, bytes) else str(raw)
                if sid.startswith(prefixes):
                    charts.append(sid)
        async with self.client.pipeline(transaction=False) as pipe:
            if hosts:
                pipe.hdel(self.keys.hosts, *hosts)
                pipe.hdel(self.keys.snapshots["host"], *hosts)
            if services:
                pipe.hdel(self.keys.services, *services)
                pipe.hdel(self.keys.snapshots["service"], *services)
            for i in range(0, len(charts), 1000):
                chunk = charts[i : i + 1000]
                pipe.hdel(self.keys.series_index, *chunk)
                pipe.delete(*(f"{self.keys.series}:{sid}" for sid in chunk))
            await pipe.execute()
        self._indexed.difference_update(charts)
        return len(charts)

    async def write_snapshots(self, kind: str, snapshots: dict[str, bytes]) -> None:
        if snapshots:
            await self.client.hset(self.keys.snapshots[kind], mapping=snapshots)

    async def read_snapshot(self, kind: str, key: str) -> bytes | None:
        data = await self.client.hget(self.keys.snapshots[kind], key)
        return bytes(data) if data is not None else None

    async def claim_notification(self, alert: Alert) -> bool:
        """True the first time this transition (fingerprint, status, starts_at) is claimed."""
        key = self._notified(alert)
        return bool(await self.client.set(key, b"1", nx=True, ex=NOTIFIED_TTL_S))

    async def notified(self, alert: Alert) -> bool:
        """Whether this transition was claimed (published) before."""
        return bool(await self.client.exists(self._notified(alert)))

    def _notified(self, alert: Alert) -> str:
        return f"{self.keys.notified}:{alert.fingerprint}:{alert.status}:{alert.starts_at!r}"

    async def active_alerts(self) -> list[Alert]:
        raw = await self.client.hvals(self.keys.active)
        return [a for a in (from_dict(orjson.loads(v)) for v in raw) if isinstance(a, Alert)]


def _json(raw: Any) -> Any:
    """A stored JSON value, or None if it does not decode (a reader never crashes on one)."""
    try:
        return orjson.loads(raw)
    except (orjson.JSONDecodeError, TypeError):
        return None


def _json_hash(client: Any, key: str) -> dict[str, Any]:
    """field -> decoded JSON object of a hash, skipping values that are not JSON objects."""
    return _json_objects((k.decode(errors="replace"), v) for k, v in client.hgetall(key).items())


def _json_objects(pairs: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """name -> decoded JSON object, skipping values that are not JSON objects."""
    out = {}
    for name, raw in pairs:
        value = _json(raw)
        if isinstance(value, dict):
            out[name] = value
    return out


def _json_page(client: Any, key: str, limit: int | None, offset: int) -> tuple[dict[str, Any], int]:
    """:func:`_json_hash` of the fields ``offset`` .. ``offset + limit`` in name order (all
    of them without ``limit``), and how many fields the hash has: the field names are read,
    the values of the page only."""
    if limit is None and offset == 0:
        return _json_hash(client, key), int(client.hlen(key))
    names = sorted(k.decode(errors="replace") for k in client.hkeys(key))
    page = names[offset:] if limit is None else names[offset : offset + limit]
    values = client.hmget(key, page) if page else []
    return _json_objects(zip(page, values, strict=True)), len(names)


def _float(raw: Any) -> float | None:
    try:
        return float(raw) if raw is not None else None
    except (TypeError, ValueError):
        return None


def read_silences(
    client: Any, prefix: str, *, now: float, include_expired: bool = False
) -> list[dict[str, Any]]:
    """Stored silences (as ``ragwatch silence list`` sees them) with their ``state`` at
    wall time ``now`` (active, pending or expired), oldest first; unreadable ones skipped."""
    out = []
    for s in decode_all(client.hgetall(Keys(prefix).silences)):
        state = s.state(now)
        if include_expired or state != "expired":
            out.append({**s.to_dict(), "state": state})
    return out


def read_notifier(client: Any, prefix: str) -> dict[str, Any]:
    """The notifier's backlog and counters: outbox size, dead letters, last-seen wall time."""
    keys = Keys(prefix)
    with client.pipeline(transaction=False) as pipe:
        pipe.zcard(keys.outbox_due)
        pipe.llen(keys.outbox_dead)
        pipe.hmget(keys.notifier, ["counters", "seen"])
        pending, dead, (counters, seen) = pipe.execute()
    counters = _json(counters) if counters is not None else None
    return {
        "outbox_pending": int(pending),
        "dead_letters": int(dead),
        "counters": counters if isinstance(counters, dict) else {},
        "seen": _float(seen),
    }


def read_alerts(client: Any, prefix: str) -> list[dict[str, Any]]:
    """Active (pending and firing) alerts, firing first, oldest first."""
    active = [a for a in map(_json, client.hvals(Keys(prefix).active)) if isinstance(a, dict)]
    return sorted(
        active, key=lambda a: (a.get("status") != "firing", _float(a.get("starts_at")) or 0.0)
    )


def read_host(client: Any, prefix: str, host: str) -> dict[str, Any] | None:
    """One host's status entry (its GPUs, their processes, memory and slopes), if any."""
    found = _json(client.hget(Keys(prefix).hosts, host))
    return found if isinstance(found, dict) else None


def read_around(
    client: Any,
    prefix: str,
    *,
    fingerprint: str | None = None,
    host: str | None = None,
    service: str | None = None,
) -> dict[str, Any]:
    """What the advisor (:func:`ragwatch.advisor.explain`) reads, in a status' shape: the
    alert ``fingerprint`` (if active), and the host and service it or the arguments
    name with their neighbours (the services with an instance on the host, the hosts
    of the service's instances); not the whole fleet."""
    keys = Keys(prefix)
    alerts = []
    if fingerprint is not None:
        found = _json(client.hget(keys.active, fingerprint))
        if isinstance(found, dict):
            alerts.append(found)
            raw = found.get("labels")
            labels: dict[str, Any] = raw if isinstance(raw, dict) else {}
            host, service = host or labels.get("host"), service or labels.get("service")
    services = _json_hash(client, keys.services) if host or service else {}
    near = {
        name: s
        for name, s in services.items()
        if isinstance(s, dict)
        and (name == service or any(_on(i, host) for i in s.get("instances") or []))
    }
    hosts = {host} if host else set()
    for inst in (near.get(service or "") or {}).get("instances") or []:
        if isinstance(inst, dict) and isinstance(inst.get("host"), str):
            hosts.add(inst["host"])
    entries = {h: read_host(client, prefix, h) for h in sorted(hosts)}
    return {
        "alerts": alerts,
        "hosts": [{**e, "host": h} for h, e in entries.items() if e is not None],
        "services": [{**s, "service": name} for name, s in sorted(near.items())],
    }


def read_explained(
    client: Any,
    prefix: str,
    *,
    fingerprint: str | None = None,
    host: str | None = None,
    service: str | None = None,
    min_score: float = MIN_SCORE,
) -> dict[str, Any]:
    """:func:`~ragwatch.advisor.explain` on what :func:`read_around` reads, with what an
    alert's page draws beside it: the ids of its small multiples (``charts``) and each
    service's newest requests (``requests``). LookupError as ``explain``."""
    around = read_around(client, prefix, fingerprint=fingerprint, host=host, service=service)
    found = explain(
        around, fingerprint=fingerprint, host=host, service=service, min_score=min_score
    )
    found["charts"] = read_multiples(client, prefix, around, found["host"], found["service"])
    found["requests"] = {
        s["service"]: s["requests"] for s in around["services"] if s.get("requests")
    }
    return found


def read_multiples(
    client: Any, prefix: str, around: Mapping[str, Any], host: str | None, service: str | None
) -> list[str]:
    """The small multiples (:func:`~ragwatch.chart_ids.multiples`) around ``host`` and
    ``service`` of what :func:`read_around` read: the host's GPUs and processes (without
    a host: those of every host of the service), the instances on it, and every instance
    of the service."""
    hosts = [host] if host else [h["host"] for h in around.get("hosts") or []]
    pairs = []
    for s in around.get("services") or []:
        for inst in s.get("instances") or []:
            name = inst.get("instance") if isinstance(inst, dict) else None
            on = isinstance(inst, dict) and inst.get("host") in hosts
            if isinstance(name, str) and (s.get("service") == service or on):
                pairs.append((str(s.get("service")), name))
    return multiples(read_index_of(client, prefix, multiple_starts(hosts, pairs)), hosts, pairs)


def _on(instance: Any, host: str | None) -> bool:
    return host is not None and isinstance(instance, dict) and instance.get("host") == host


def read_series_index(client: Any, prefix: str) -> dict[str, dict[str, Any]]:
    """series id -> {kind, labels, signal, unit}."""
    return _json_hash(client, Keys(prefix).series_index)


def read_index_of(client: Any, prefix: str, starts: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The series index entries whose ids start with one of ``starts`` (a scan of the
    index per start, matched in Redis: not the whole index over the wire)."""
    key, out = Keys(prefix).series_index, {}
    for start in dict.fromkeys(starts):
        pattern = re.sub(r"([*?\[\]\\])", r"\\\1", start) + "*"
        found = client.hscan_iter(key, match=pattern, count=1000)
        out.update(_json_objects((k.decode(errors="replace"), v) for k, v in found))
    return out


def read_series(
    client: Any, prefix: str, series_id: str, limit: int = SERIES_POINTS
) -> tuple[dict[str, Any], list[list[Any]]] | None:
    """A series' index entry and its newest ``limit`` points, oldest first; None if unknown."""
    keys = Keys(prefix)
    with client.pipeline(transaction=False) as pipe:
        pipe.hget(keys.series_index, series_id)
        pipe.lrange(f"{keys.series}:{series_id}", 0, max(0, limit - 1))
        meta, raw = pipe.execute()
    if meta is None:
        return None
    points = [p for p in map(_json, reversed(raw)) if isinstance(p, list) and len(p) >= 2]
    meta = _json(meta)
    return (meta if isinstance(meta, dict) else {}), points


def read_last_points(client: Any, prefix: str, series_ids: list[str]) -> dict[str, list[Any]]:
    """The newest point of each of ``series_ids`` that has one."""
    if not series_ids:
        return {}
    keys = Keys(prefix)
    with client.pipeline(transaction=False) as pipe:
        for sid in series_ids:
            pipe.lindex(f"{keys.series}:{sid}", 0)
        raw = pipe.execute()
    points = {sid: _json(r) for sid, r in zip(series_ids, raw, strict=True) if r is not None}
    return {sid: p for sid, p in points.items() if isinstance(p, list) and len(p) >= 2}


def read_status(
    client: Any,
    prefix: str,
    history: int = 20,
    *,
    now: float | None = None,
    limit: int | None = None,
    offset: int = 0,
) -> dict[str, Any]:
    """Everything ``ragwatch status`` shows, from Redis only (blocking client); with
    ``limit``, hosts and services ``offset`` .. ``offset + limit`` in name order (each;
    ``total_hosts`` and ``total_services`` say how many there are).

    Values that do not decode are skipped, never raised: a status read works on whatever
    the worker and the notifier wrote, including snapshots of older versions.
    """
    keys = Keys(prefix)
    now = time.time() if now is None else now
    hosts, total_hosts = _json_page(client, keys.hosts, limit, offset)
    services, total_services = _json_page(client, keys.services, limit, offset)
    recent = [_json(v) for v in client.lrange(keys.history, 0, history - 1)] if history > 0 else []
    active = [s for s in decode_all(client.hgetall(keys.silences)) if s.active(now)]
    alerts = read_alerts(client, prefix)
    for a in alerts:  # silenced alerts still show, with the silences that mute them
        raw = a.get("labels")
        labels: dict[str, str] = raw if isinstance(raw, dict) else {}
        a["silenced_by"] = [s.id for s in active if s.matches(labels)]
    return {
        "hosts": [{"host": h, **hosts[h]} for h in sorted(hosts)],
        "services": [{"service": s, **services[s]} for s in sorted(services)],
        "total_hosts": total_hosts,
        "total_services": total_services,
        "alerts": alerts,
        "history": [r for r in recent if isinstance(r, dict)],
        "workers": _json_hash(client, keys.workers),
        "silences": read_silences(client, prefix, now=now),
        "notifier": read_notifier(client, prefix),
        "flaps": read_flaps(client, prefix),
    }


def read_flaps(client: Any, prefix: str) -> list[dict[str, Any]]:
    """Alerts that fired again within ``engine.FLAP_WINDOW_S`` of resolving, and how often
    (``rule``, ``fingerprint``, ``count``), most flapping first."""
    out = []
    for field, raw in client.hgetall(Keys(prefix).flaps).items():
        name = field.decode() if isinstance(field, bytes) else str(field)
        rule, _, fp = name.partition(":")
        count = _float(raw)
        if fp and count is not None:
            out.append({"rule": rule, "fingerprint": fp, "count": int(count)})
    return sorted(out, key=lambda f: (-f["count"], f["rule"], f["fingerprint"]))
