"""Webhook delivery against a real local HTTP receiver: retries, backoff, giving up."""

from __future__ import annotations

import asyncio
import logging

import pytest

from ragwatch.receiver import WebhookReceiver
from ragwatch.schema import Alert
from ragwatch.streams.webhook import WebhookNotifier


def alert(status: str = "firing", fp: str = "f1") -> Alert:
    return Alert(
        rule="GpuMemoryLeak",
        severity="critical",
        status=status,  # type: ignore[arg-type]
        labels={"alertname": "GpuMemoryLeak", "host": "h1", "gpu": "0", "pid": "7"},
        annotations={"summary": "leak"},
        value=1.3e9,
        expected=0.0,
        starts_at=1_767_225_600.0,
        ends_at=None if status == "firing" else 1_767_229_200.0,
        fingerprint=fp,
    )


async def test_retries_until_the_receiver_accepts_then_delivers_once() -> None:
    with WebhookReceiver(fail_first=3) as rx:
        notifier = WebhookNotifier((rx.url,), backoff_s=0.01, max_attempts=5)
        await notifier.start()
        notifier.submit(alert())
        assert await notifier.drain(10)
        await notifier.stop()
    assert rx.requests == 4
    assert len(rx.bodies) == 1 and rx.bodies[0]["alerts"][0]["fingerprint"] == "f1"
    assert (notifier.stats.sent, notifier.stats.retries, notifier.stats.failed) == (1, 3, 0)


async def test_gives_up_after_max_attempts_and_logs_without_the_url_secret(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with WebhookReceiver(fail_first=100) as rx:
        url = rx.url + "/T000/B000/secret-token"
        notifier = WebhookNotifier((url,), backoff_s=0.01, max_attempts=3)
        await notifier.start()
        with caplog.at_level(logging.WARNING):
            notifier.submit(alert())
            assert await notifier.drain(10)
        await notifier.stop()
    assert rx.requests == 3 and rx.bodies == []
    assert (notifier.stats.sent, notifier.stats.failed) == (0, 1)
    assert "giving up after 3 attempts" in caplog.text
    assert "secret-token" not in caplog.text


async def test_order_is_kept_per_url_and_a_dead_url_does_not_block_a_live_one() -> None:
    with WebhookReceiver() as live, WebhookReceiver(fail_first=100) as dead:
        notifier = WebhookNotifier((dead.url, live.url), backoff_s=0.05, max_attempts=4)
        await notifier.start()
        notifier.submit(alert("firing"))
        notifier.submit(alert("resolved"))
        for _ in range(100):  # the receiver runs in a thread; poll without blocking the loop
            if len(live.bodies) == 2:
                break
            await asyncio.sleep(0.05)
        assert [b["status"] for b in live.bodies] == ["firing", "resolved"]
        assert dead.bodies == []
        await notifier.stop(timeout_s=0.1)


async def test_unreachable_url_counts_as_failure() -> None:
    from ragwatch.embedded import free_port

    notifier = WebhookNotifier(
        (f"http://127.0.0.1:{free_port()}/hook",), backoff_s=0.01, max_attempts=2, timeout_s=1
    )
    await notifier.start()
    notifier.submit(alert())
    assert await notifier.drain(10)
    await notifier.stop()
    assert notifier.stats.failed == 1
