"""Chart points in Redis (``RedisState.write_series``): indexed once per writer, trimmed
every ``TRIM_EVERY`` points, and read back as the newest ``SERIES_POINTS``."""

from __future__ import annotations

import orjson
import redis
import redis.asyncio as aioredis

from ragwatch.streams.state import SERIES_POINTS, TRIM_EVERY, Keys, RedisState, read_series


async def test_chart_points_are_indexed_once_trimmed_and_read_newest_first(
    rw_env: dict[str, str],
) -> None:
    prefix = rw_env["RAGWATCH_REDIS_PREFIX"]
    client = aioredis.from_url(rw_env["RAGWATCH_REDIS_URL"])
    store = RedisState(client, prefix)
    keys = Keys(prefix)
    meta = {"kind": "gpu", "labels": {"host": "h1"}, "signal": "fb_used_bytes", "unit": "bytes"}
    total = SERIES_POINTS + 2 * TRIM_EVERY + 5
    try:
        for i in range(total):
            await store.write_series({"gpu:h1:0:fb_used": (meta, [float(i), float(i), None, None])})
            if i == 0:
                await client.hdel(keys.series_index, "gpu:h1:0:fb_used")  # lost: not rewritten
        assert await client.hget(keys.series_index, "gpu:h1:0:fb_used") is None
        length = await client.llen(f"{keys.series}:gpu:h1:0:fb_used")
        assert SERIES_POINTS <= length < SERIES_POINTS + TRIM_EVERY
        # a new writer (a restarted worker) indexes it again and trims at its first point
        again = RedisState(client, prefix)
        await again.write_series({"gpu:h1:0:fb_used": (meta, [float(total), 1.0, None, None])})
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
