"""The worker's Faust app builds its aiokafka consumer with RAGWATCH_KAFKA_FETCH_MAX_WAIT_MS
(faust-streaming fixes it at 1500 ms, which brokers such as Tansu wait out on every fetch)."""

from __future__ import annotations

from pathlib import Path

from ragwatch.config import Settings
from ragwatch.streams.app import build_app


async def test_the_worker_consumer_waits_at_most_the_configured_fetch_wait(tmp_path: Path) -> None:
    settings = Settings.from_env(
        {
            "RAGWATCH_KAFKA_BOOTSTRAP": "127.0.0.1:1",
            "RAGWATCH_KAFKA_FETCH_MAX_WAIT_MS": "40",
            "RAGWATCH_STATE_DIR": str(tmp_path),
        }
    )
    app = build_app(settings, worker_id="w")
    thread = app.consumer._thread
    consumer = thread._create_worker_consumer(app.transport)
    assert consumer._fetch_max_wait_ms == 40
    default = build_app(Settings.from_env({"RAGWATCH_STATE_DIR": str(tmp_path)}), worker_id="d")
    assert (
        default.consumer._thread._create_worker_consumer(default.transport)._fetch_max_wait_ms
        == 100
    )
