"""Webhook delivery: an Alertmanager-v4-shaped JSON POST per alert transition.

Every existing Alertmanager webhook receiver understands the body::

    {"version": "4", "groupKey": ..., "status": "firing" | "resolved",
     "receiver": "ragwatch", "groupLabels": {...}, "commonLabels": {...},
     "commonAnnotations": {...}, "externalURL": ..., "truncatedAlerts": 0,
     "alerts": [{"status", "labels", "annotations", "startsAt", "endsAt",
                 "generatorURL", "fingerprint", "value", "expected"}]}

One delivery queue per URL, so a dead receiver delays only itself; each POST is retried
with exponential backoff and jitter on connection errors, timeouts and non-2xx answers,
up to ``max_attempts``, then dropped with an error log and a counter.

>>> from ragwatch.schema import Alert
>>> a = Alert(rule="R", severity="critical", status="firing", labels={"alertname": "R"},
...           annotations={}, value=2.0, expected=0.0, starts_at=0.0, ends_at=None,
...           fingerprint="abc")
>>> body = alertmanager_payload([a], external_url="http://rw")
>>> body["status"], body["alerts"][0]["startsAt"], body["alerts"][0]["endsAt"]
('firing', '1970-01-01T00:00:00Z', '0001-01-01T00:00:00Z')
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
import orjson

from ragwatch.config import mask_webhook
from ragwatch.schema import Alert

log = logging.getLogger(__name__)
ZERO_TIME = "0001-01-01T00:00:00Z"  # Alertmanager's "not ended"


def rfc3339(ts: float | None) -> str:
    if ts is None:
        return ZERO_TIME
    dt = datetime.fromtimestamp(ts, tz=UTC)
    frac = f".{dt.microsecond:06d}".rstrip("0").rstrip(".")
    return dt.strftime("%Y-%m-%dT%H:%M:%S") + frac + "Z"


def alertmanager_payload(
    alerts: list[Alert], *, receiver: str = "ragwatch", external_url: str = ""
) -> dict[str, Any]:
    """The Alertmanager v4 webhook body for a group of alerts."""
    if not alerts:
        raise ValueError("alertmanager_payload needs at least one alert")
    common_labels = dict(alerts[0].labels)
    common_ann = dict(alerts[0].annotations)
    for a in alerts[1:]:
        common_labels = {k: v for k, v in common_labels.items() if a.labels.get(k) == v}
        common_ann = {k: v for k, v in common_ann.items() if a.annotations.get(k) == v}
    group_labels = {"alertname": alerts[0].labels.get("alertname", alerts[0].rule)}
    return {
        "version": "4",
        "groupKey": "{}:" + orjson.dumps(group_labels).decode(),
        "truncatedAlerts": 0,
        "status": "firing" if any(a.status == "firing" for a in alerts) else "resolved",
        "receiver": receiver,
        "groupLabels": group_labels,
        "commonLabels": common_labels,
        "commonAnnotations": common_ann,
        "externalURL": external_url,
        "alerts": [
            {
                "status": "firing" if a.status == "firing" else "resolved",
                "labels": a.labels,
                "annotations": a.annotations,
                "startsAt": rfc3339(a.starts_at),
                "endsAt": rfc3339(a.ends_at),
                "generatorURL": f"{external_url}/alerts/{a.fingerprint}",
                "fingerprint": a.fingerprint,
                "value": a.value,
                "expected": a.expected,
            }
            for a in alerts
        ],
    }


@dataclass
class WebhookStats:
    sent: int = 0
    retries: int = 0
    failed: int = 0


class WebhookNotifier:
    """Posts alerts to every configured URL; one ordered queue and task per URL."""

    def __init__(
        self,
        urls: tuple[str, ...],
        *,
        external_url: str = "",
        timeout_s: float = 5.0,
        max_attempts: int = 8,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
    ) -> None:
        self.urls = urls
        self.external_url = external_url
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.stats = WebhookStats()
        self._queues: dict[str, asyncio.Queue[bytes]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=self.timeout)
        for url in self.urls:
            q: asyncio.Queue[bytes] = asyncio.Queue()
            self._queues[url] = q
            self._tasks.append(asyncio.create_task(self._run(url, q)))

    def submit(self, alert: Alert) -> None:
        """Queue one alert for every URL; never blocks the caller."""
        body = orjson.dumps(alertmanager_payload([alert], external_url=self.external_url))
        for q in self._queues.values():
            q.put_nowait(body)

    async def drain(self, timeout_s: float) -> bool:
        """Wait until every queue is empty (or the timeout); True if all was delivered."""
        try:
            await asyncio.wait_for(
                asyncio.gather(*(q.join() for q in self._queues.values())), timeout_s
            )
            return True
        except TimeoutError:
            return False

    async def stop(self, timeout_s: float = 5.0) -> None:
        if not await self.drain(timeout_s):
            pending = sum(q.qsize() for q in self._queues.values())
            log.error("webhook notifier stopped with %d undelivered notification(s)", pending)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    async def _run(self, url: str, q: asyncio.Queue[bytes]) -> None:
        while True:
            body = await q.get()
            try:
                await self._deliver(url, body)
            finally:
                q.task_done()

    async def _deliver(self, url: str, body: bytes) -> None:
        assert self._session is not None
        shown = mask_webhook(url)
        for attempt in range(1, self.max_attempts + 1):
            try:
                async with self._session.post(
                    url, data=body, headers={"Content-Type": "application/json"}
                ) as resp:
                    if 200 <= resp.status < 300:
                        self.stats.sent += 1
                        return
                    why = f"HTTP {resp.status}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                why = f"{type(exc).__name__}"
            if attempt == self.max_attempts:
                break
            self.stats.retries += 1
            delay = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
            delay *= random.uniform(0.8, 1.2)
            log.warning(
                "webhook %s failed (%s), attempt %d/%d, retrying in %.1fs",
                shown,
                why,
                attempt,
                self.max_attempts,
                delay,
            )
            await asyncio.sleep(delay)
        self.stats.failed += 1
        log.error("webhook %s: giving up after %d attempts (%s)", shown, self.max_attempts, why)
