"""The notifier's outbox on a real Redis: notifications queued behind a group head that
backs off must not fill the due window and starve every other group; a head whose item is
gone must not block its group."""

from __future__ import annotations

import redis.asyncio as aioredis

from ragwatch.schema import Alert
from ragwatch.store import Keys
from ragwatch.streams.notifier.notification import Notification
from ragwatch.streams.notifier.outbox import Outbox


def _alert(host: str, status: str) -> Alert:
    return Alert(
        rule="GpuMemoryLeak",
        severity="critical",
        status=status,  # type: ignore[arg-type]
        labels={"alertname": "GpuMemoryLeak", "host": host},
        annotations={},
        value=1.0,
        expected=None,
        starts_at=0.0,
        ends_at=60.0 if status == "resolved" else None,
        fingerprint=f"fp-{host}",
        at=0.0,
    )


async def test_entries_behind_backing_off_heads_do_not_starve_the_due_window(
    rw_env: dict[str, str],
) -> None:
    client = aioredis.from_url(rw_env["RAGWATCH_REDIS_URL"])
    now = [1000.0]
    outbox = Outbox(client, Keys(rw_env["RAGWATCH_REDIS_PREFIX"]), clock=lambda: now[0])
    groups = 120  # more than due()'s window of 100
    try:
        for g in range(groups):
            assert await outbox.put(
                Notification.of("hook", {"host": f"h{g}"}, [_alert(f"h{g}", "firing")])
            )
        heads = []
        while len(heads) < groups:
            batch = await outbox.due()
            assert batch
            for e in batch:
                await outbox.retry(e, "503", 60.0)  # the receiver is down: back off a minute
            heads += batch
        now[0] += 1
        for g in range(groups):
            n = Notification.of("hook", {"host": f"h{g}"}, [_alert(f"h{g}", "resolved")])
            assert await outbox.put(n)
        now[0] += 1
        assert await outbox.due() == []  # every resolution waits behind its firing head
        now[0] += 60
        sent = []  # (group, status) in the order they went out
        for _ in range(5):  # the notifier asks every tick; a second apart here
            while batch := await outbox.due():
                for e in batch:
                    sent.append((e.notification.group_key, e.notification.status))
                    await outbox.delivered(e)
            now[0] += 1
        assert len(sent) == 2 * groups
        for g in {k for k, _ in sent}:
            assert [st for k, st in sent if k == g] == ["firing", "resolved"]
    finally:
        await client.aclose()


async def test_a_group_head_without_its_item_does_not_block_the_group(
    rw_env: dict[str, str],
) -> None:
    client = aioredis.from_url(rw_env["RAGWATCH_REDIS_URL"])
    now = [1000.0]
    keys = Keys(rw_env["RAGWATCH_REDIS_PREFIX"])
    outbox = Outbox(client, keys, clock=lambda: now[0])
    try:
        firing = Notification.of("hook", {"host": "h1"}, [_alert("h1", "firing")])
        assert await outbox.put(firing)
        now[0] += 1
        resolved = Notification.of("hook", {"host": "h1"}, [_alert("h1", "resolved")])
        assert await outbox.put(resolved)
        # the head's item and schedule are lost (a partial write, a manual cleanup), its
        # entry in the group's order stays behind
        await client.hdel(keys.outbox_items, firing.key)
        await client.zrem(keys.outbox_due, firing.key)
        sent = []
        for _ in range(3):
            now[0] += 2
            for e in await outbox.due():
                sent.append(e.notification.status)
                await outbox.delivered(e)
        assert sent == ["resolved"]
    finally:
        await client.aclose()


async def test_while_redis_is_away_a_resolution_waits_for_its_firing_notification(
    rw_env: dict[str, str],
) -> None:
    """The firing notification backs off in Redis; Redis goes away (the outbox's client
    points at a port nobody listens on); the resolution, kept in memory, must not go
    first. Once Redis is back, both go, firing first."""
    live = aioredis.from_url(rw_env["RAGWATCH_REDIS_URL"])
    away = aioredis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=1)
    now = [1000.0]
    outbox = Outbox(live, Keys(rw_env["RAGWATCH_REDIS_PREFIX"]), clock=lambda: now[0])
    try:
        firing = Notification.of("hook", {"host": "h1"}, [_alert("h1", "firing")])
        assert await outbox.put(firing)
        (head,) = await outbox.due()
        await outbox.retry(head, "503", 60.0)  # the receiver is down: back off a minute
        outbox.client = away
        now[0] += 1
        resolved = Notification.of("hook", {"host": "h1"}, [_alert("h1", "resolved")])
        assert await outbox.put(resolved)
        assert outbox.in_memory == 1
        sent = []
        for _ in range(3):
            now[0] += 30
            assert await outbox.due() == []  # the firing one is out of reach in Redis
        outbox.client = live
        for _ in range(3):
            for e in await outbox.due():
                sent.append(e.notification.status)
                await outbox.delivered(e)
            now[0] += 1
        assert sent == ["firing", "resolved"]
    finally:
        await live.aclose()
        await away.aclose()


async def test_a_notification_stored_but_not_scheduled_is_scheduled_when_put_again(
    rw_env: dict[str, str],
) -> None:
    """A notifier killed between storing a notification and scheduling it (two round
    trips) left it stored and never due; the replay of its alert puts it again (its offset
    was not committed), and then it is scheduled (found by the random kills of
    test_notifier_kills.py: a notification never sent)."""
    client = aioredis.from_url(rw_env["RAGWATCH_REDIS_URL"])
    now = [1000.0]
    keys = Keys(rw_env["RAGWATCH_REDIS_PREFIX"])
    outbox = Outbox(client, keys, clock=lambda: now[0])
    try:
        n = Notification.of("hook", {"host": "h1"}, [_alert("h1", "firing")])
        assert await outbox.put(n)
        await client.zrem(keys.outbox_due, n.key)  # as if killed before scheduling it
        await client.zrem(f"{keys.outbox_order}:{n.group_key}", n.key)
        assert await outbox.due() == []
        assert not await outbox.put(n)  # the replay: already stored, not a new one
        (e,) = await outbox.due()
        assert e.notification.key == n.key
        await outbox.delivered(e)
        assert not await outbox.put(n)  # delivered: not again
        now[0] += 10
        assert await outbox.due() == []
    finally:
        await client.aclose()
