"""A Redis that refuses writes is visible on ``ragwatch serve`` (issue 32): ``/healthz``
503 with the reason, ``ragwatch_redis_writable 0`` beside ``ragwatch_redis_up 1``, one log
line per change, and all of it back when Redis takes writes again.

A redis-server of the test's own (it is driven out of memory, made a replica and stripped
of write rights), a real ``ragwatch serve`` over it, real HTTP.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from ragwatch.console.exporter import WRITE_PROBE_S
from ragwatch.embedded import EmbeddedStack, free_port
from tests.integration.conftest import wait_until
from tests.integration.test_serve import Reply, get, start_serve


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[str]:
    """A redis-server of this test's own (its memory, role and ACL are changed)."""
    stack = EmbeddedStack(tmp_path / "redis")
    stack.up(("redis",))
    yield stack.env()["RAGWATCH_REDIS_URL"]
    stack.down()


def gauges(url: str) -> dict[str, float]:
    """The unlabelled ``ragwatch_redis_*`` samples of one scrape of ``/metrics``."""
    text = get(url + "/metrics", token=None).body.decode()
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("ragwatch_redis_")
    }


def health(url: str) -> Reply:
    return get(url + "/healthz", token=None)


def unhealthy(url: str) -> Reply | None:
    reply = health(url)
    return reply if reply.status == 503 else None


def fill_until_refused(client: redis.Redis, prefix: str) -> None:
    """Redis at ``maxmemory`` with ``noeviction``: writes go in until it refuses them, and
    then the limit is lowered under what it holds (at the limit itself a small write can
    still slip in when a client's buffers are freed)."""
    client.config_set("maxmemory-policy", "noeviction")
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", used + 2_000_000)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        for i in range(1000):  # 10 MB at most, 2 MB fit
            client.set(f"{prefix}:fill:{i}", b"x" * 10_000)
    client.config_set("maxmemory", used + 1_000_000)


def test_serve_says_when_redis_refuses_writes_and_when_it_takes_them_again(
    own_redis: str, tmp_path: Path
) -> None:
    prefix = f"writable-{uuid.uuid4().hex[:8]}"
    env = {"RAGWATCH_REDIS_URL": own_redis, "RAGWATCH_REDIS_PREFIX": prefix}
    admin = redis.Redis.from_url(own_redis)
    proc, url = start_serve(env, tmp_path / "serve.log")
    assert wait_until(lambda: gauges(url).get("ragwatch_redis_writable") == 1.0, 10, "probe")
    assert (health(url).status, health(url).json()) == (200, {"status": "ok"})

    nobody = free_port()  # a master that is not there: the replica keeps serving reads
    episodes: list[tuple[str, Callable[[], object], Callable[[], object]]] = [
        (
            "OOM",
            lambda: fill_until_refused(admin, prefix),
            lambda: admin.config_set("maxmemory", 0),
        ),
        (
            "READONLY",
            lambda: admin.execute_command("REPLICAOF", "127.0.0.1", str(nobody)),
            lambda: admin.execute_command("REPLICAOF", "NO", "ONE"),
        ),
        (
            "NOPERM",  # serve's user (the default one) loses its write rights
            lambda: admin.execute_command("ACL", "SETUSER", "default", "-@write"),
            lambda: admin.execute_command("ACL", "SETUSER", "default", "+@all"),
        ),
    ]
    for code, refuse, restore in episodes:
        refuse()
        down = wait_until(lambda: unhealthy(url), 3 * WRITE_PROBE_S, f"a 503 for {code}")
        assert down.json()["status"] == "unavailable"  # the schema's (openapi Health)
        assert down.json()["reason"].startswith(f"redis refuses writes: {code}: "), down.json()
        assert gauges(url) == {"ragwatch_redis_up": 1.0, "ragwatch_redis_writable": 0.0}
        assert get(url + "/api/v1/status", token=None).status == 200  # reads still work
        # the pods stay in the Service and are not restarted (deploy/kubernetes probes)
        assert get(url + "/readyz", token=None).status == 200
        assert get(url + "/livez", token=None).status == 200
        if code == "OOM":  # several probes and requests in the state: still one line
            for _ in range(int(2.5 * WRITE_PROBE_S / 0.25)):
                assert health(url).status == 503
                time.sleep(0.25)
        restore()
        wait_until(lambda: health(url).status == 200, 3 * WRITE_PROBE_S, f"{code} cleared")
        assert gauges(url)["ragwatch_redis_writable"] == 1.0

    log = proc.output()
    refusals = [line for line in log.splitlines() if "refuses writes" in line]
    assert len(refusals) == 3, log
    for line, (code, _, _) in zip(refusals, episodes, strict=True):
        assert f"({code}: " in line and "WARNING" in line, line
    assert "command not allowed when used memory > 'maxmemory'" in refusals[0]  # Redis's words
    assert log.count("takes writes again") == 3, log
    assert proc.stop(signal.SIGTERM, timeout=10) == 0
    admin.close()
