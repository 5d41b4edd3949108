"""Chart points in Redis (``RedisState.write_series``): indexed once per writer, pushed
by a script in chunks, capped, and read back as the newest ``SERIES_POINTS``."""

from __future__ import annotations

import orjson
import redis
import redis.asyncio as aioredis

from ragwatch.store import SERIES_CHUNK, SERIES_POINTS, Keys, RedisState, read_series


async def test_chart_points_are_indexed_once_trimmed_and_read_newest_first(
    rw_env: dict[str, str],
) -> None:
    prefix = rw_env["RAGWATCH_REDIS_PREFIX"]
    client = aioredis.from_url(rw_env["RAGWATCH_REDIS_URL"])
    store = RedisState(client, prefix)
    keys = Keys(prefix)
    meta = {"kind": "gpu", "labels": {"host": "h1"}, "signal": "fb_used_bytes", "unit": "bytes"}
    total = SERIES_POINTS + 5
    try:
        for i in range(total):
            await store.write_series(
                {"gpu:h1:0:fb_used": (meta, [[float(i), float(i), None, None]])}
            )
            if i == 0:
                await client.hdel(keys.series_index, "gpu:h1:0:fb_used")  # lost: not rewritten
        assert await client.hget(keys.series_index, "gpu:h1:0:fb_used") is None
        assert await client.llen(f"{keys.series}:gpu:h1:0:fb_used") == SERIES_POINTS
        # a new writer (a restarted worker) indexes it again
        again = RedisState(client, prefix)
        await again.write_series({"gpu:h1:0:fb_used": (meta, [[float(total), 1.0, None, None]])})
        assert orjson.loads(await client.hget(keys.series_index, "gpu:h1:0:fb_used")) == meta
        assert await client.llen(f"{keys.series}:gpu:h1:0:fb_used") == SERIES_POINTS
    finally:
        await client.aclose()
    sync = redis.Redis.from_url(rw_env["RAGWATCH_REDIS_URL"])
    try:
        got = read_series(sync, prefix, "gpu:h1:0:fb_used")
    finally:
        sync.close()
    assert got is not None
    entry, points = got
    assert entry == meta
    assert len(points) == SERIES_POINTS
    assert points[-1][0] == float(total)  # oldest first, ending with the newest
    assert points[0][0] == float(total - SERIES_POINTS + 1)


async def test_a_flush_of_more_series_than_a_chunk_writes_every_point(
    rw_env: dict[str, str],
) -> None:
    prefix = rw_env["RAGWATCH_REDIS_PREFIX"]
    client = aioredis.from_url(rw_env["RAGWATCH_REDIS_URL"])
    store = RedisState(client, prefix)
    keys = Keys(prefix)
    n = SERIES_CHUNK * 2 + 7
    points = {
        f"process:h1:0:{pid}:gpu_mem": ({"kind": "process"}, [[1.0, float(pid), None, 0.5]])
        for pid in range(n)
    }
    try:
        await store.write_series(points)
        assert await client.hlen(keys.series_index) == n
        for pid in (0, SERIES_CHUNK, n - 1):
            raw = await client.lrange(f"{keys.series}:process:h1:0:{pid}:gpu_mem", 0, -1)
            assert [orjson.loads(r) for r in raw] == [[1.0, float(pid), None, 0.5]]
    finally:
        await client.aclose()


async def test_a_flapping_alert_is_counted_in_redis(rw_env: dict[str, str]) -> None:
    from ragwatch.store import read_flaps
    from ragwatch.streams.alerting.engine import AlertEngine
    from ragwatch.streams.alerting.rules import parse_rule

    prefix = rw_env["RAGWATCH_REDIS_PREFIX"]
    client = aioredis.from_url(rw_env["RAGWATCH_REDIS_URL"])
    store = RedisState(client, prefix)
    rule = parse_rule({"name": "Hot", "series": "gpu", "expr": "temp_c > 80"})
    eng, labels = AlertEngine(), {"host": "h1", "gpu": "0"}
    try:
        for ts, temp in ((0.0, 90.0), (60.0, 50.0), (120.0, 90.0), (180.0, 50.0), (240.0, 90.0)):
            t = eng.evaluate(rule, labels, {"temp_c": temp}, ts)
            assert t is not None
            await store.write_transition(t)
    finally:
        await client.aclose()
    sync = redis.Redis.from_url(rw_env["RAGWATCH_REDIS_URL"])
    try:
        (flap,) = read_flaps(sync, prefix)
    finally:
        sync.close()
    assert flap == {"rule": "Hot", "fingerprint": t.alert.fingerprint, "count": 2}
