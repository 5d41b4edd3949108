"""The worker's Faust app builds its aiokafka consumer with RAGWATCH_KAFKA_FETCH_MAX_WAIT_MS
(faust-streaming fixes it at 1500 ms, which brokers such as Tansu wait out on every fetch)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragwatch.config import Settings
from ragwatch.streams.worker.app import build_app


async def test_the_worker_consumer_waits_at_most_the_configured_fetch_wait(tmp_path: Path) -> None:
    base = {"RAGWATCH_KAFKA_BOOTSTRAP": "127.0.0.1:1", "RAGWATCH_STATE_DIR": str(tmp_path)}
    for env, wait_ms in (({**base, "RAGWATCH_KAFKA_FETCH_MAX_WAIT_MS": "40"}, 40), (base, 100)):
        app = build_app(Settings.from_env(env), worker_id="w")
        thread = app.consumer._thread
        consumer = thread._create_worker_consumer(app.transport)
        try:
            assert consumer._fetch_max_wait_ms == wait_ms
        finally:
            await consumer.stop()
            thread.thread_loop.close()  # the consumer thread's own loop, never started here


def test_a_worker_is_named_by_its_host_or_ragwatch_worker_id_not_its_pid(tmp_path: Path) -> None:
    """The ``worker`` label of /metrics stays the same across restarts."""
    import socket

    from ragwatch.streams.worker.app import Delivery

    base = {"RAGWATCH_KAFKA_BOOTSTRAP": "127.0.0.1:1", "RAGWATCH_STATE_DIR": str(tmp_path)}
    for env, name in ((base, socket.gethostname()), ({**base, "RAGWATCH_WORKER_ID": "w-2"}, "w-2")):
        app = build_app(Settings.from_env(env))
        (delivery,) = (s for s in app._extra_services if isinstance(s, Delivery))
        assert delivery.worker_id == name


def test_two_processes_writing_under_one_worker_id_are_told(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A restarted worker replaces its predecessor's record quietly; a record another live
    process wrote since this one's last write is a clash: warned once, counted each time."""
    from ragwatch.streams.worker.app import Delivery

    env = {"RAGWATCH_KAFKA_BOOTSTRAP": "127.0.0.1:1", "RAGWATCH_STATE_DIR": str(tmp_path)}
    delivery = Delivery(Settings.from_env(env), "gpu-box")
    delivery._check_identity({"process": "the-one-before-a-restart"})  # its first write
    delivery._check_identity({"process": delivery.process})  # its own, since
    assert delivery.counters.worker_id_clashes == 0 and not caplog.records
    for _ in range(3):
        delivery._check_identity({"process": "another-worker"})
    assert delivery.counters.worker_id_clashes == 3
    (warning,) = caplog.records
    assert "RAGWATCH_WORKER_ID" in warning.getMessage()
