"""Alertmanager as a sink: alerts posted to an existing Alertmanager's ``/api/v2/alerts``
the way Prometheus posts them, so a fleet keeps its routes, silences and receivers.

Prometheus' contract, which Alertmanager relies on: every firing alert is sent again
every ``resend_s`` (Prometheus' ``--rules.alert.resend-delay``, 1 minute) with ``endsAt``
a few resends ahead (Alertmanager resolves an alert whose ``endsAt`` passes: if ragwatch
stops, its alerts resolve there rather than fire forever); a resolved alert is sent with
its ``endsAt``. Pending alerts are not sent (Prometheus does not either). Labels are the
alert's (``alertname``, ``severity`` and the series'), ``generatorURL`` the alert's page on
``ragwatch serve``; ``startsAt`` is the alert's event time.

:class:`AlertmanagerForwarder` holds the firing set (restored from Redis when the notifier
starts, so a restart neither drops nor resolves them); a post that fails is retried at the
next resend (a resolution too, until it is delivered or superseded).

>>> from ragwatch.schema import Alert
>>> a = Alert(rule="GpuMemoryLeak", severity="critical", status="firing",
...           labels={"alertname": "GpuMemoryLeak", "host": "h1"}, annotations={"summary": "s"},
...           value=1.3e9, expected=0.0, starts_at=1767225600.0, ends_at=None, fingerprint="f1")
>>> body = postable(a, external_url="http://rw:8080", now=1767229200.0, resend_s=60.0)
>>> body["labels"]
{'alertname': 'GpuMemoryLeak', 'severity': 'critical', 'host': 'h1'}
>>> body["startsAt"], body["endsAt"], body["generatorURL"]
('2026-01-01T00:00:00Z', '2026-01-01T01:04:00Z', 'http://rw:8080/alerts/f1')
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson

from ragwatch.codec import decode_as
from ragwatch.config import redact_url
from ragwatch.errors import SchemaError
from ragwatch.schema import Alert
from ragwatch.streams.notifier.delivery import outcome_of, post_json
from ragwatch.streams.notifier.notification import Delivered
from ragwatch.streams.notifier.webhook import rfc3339

log = logging.getLogger(__name__)

RESENDS_AHEAD = 4  # endsAt of a firing alert: this many resends from now (as Prometheus)


def postable(alert: Alert, *, external_url: str, now: float, resend_s: float) -> dict[str, Any]:
    """One ``postableAlert`` of Alertmanager's API v2."""
    labels = {"alertname": alert.rule, "severity": alert.severity, **alert.labels}
    ends = alert.ends_at if alert.status == "resolved" else now + RESENDS_AHEAD * resend_s
    out: dict[str, Any] = {
        "labels": labels,
        "annotations": dict(alert.annotations),
        "startsAt": rfc3339(alert.starts_at),
        "endsAt": rfc3339(ends),
    }
    if external_url:
        out["generatorURL"] = f"{external_url.rstrip('/')}/alerts/{quote(alert.fingerprint)}"
    return out


@dataclass
class ForwarderStats:
    posts: int = 0
    alerts_sent: int = 0
    failures: int = 0


class AlertmanagerForwarder:
    """Posts firing and resolved alerts to Alertmanagers (see the module docstring)."""

    def __init__(
        self,
        urls: Sequence[str],
        session: aiohttp.ClientSession,
        *,
        external_url: str,
        resend_s: float = 60.0,
        timeout_s: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.urls = [u.rstrip("/") + "/api/v2/alerts" for u in urls]
        self.session, self.external_url = session, external_url
        self.resend_s, self.timeout_s, self._clock = resend_s, timeout_s, clock
        self.stats = ForwarderStats()
        self.firing: dict[str, Alert] = {}
        self._changed: dict[str, Alert] = {}  # to send at the next flush (and resolutions)
        self._last_resend = 0.0

    def adopt(self, active: Iterable[Alert]) -> None:
        """The firing alerts stored in Redis when the notifier starts."""
        for a in active:
            if a.status == "firing":
                self.firing[a.fingerprint] = a
                self._changed[a.fingerprint] = a

    def observe(self, alert: Alert) -> None:
        """A transition read from the alerts topic."""
        if alert.status == "firing":
            self.firing[alert.fingerprint] = alert
        elif alert.status == "resolved":
            if self.firing.pop(alert.fingerprint, None) is None and alert.ends_at is None:
                return
        else:
            return  # pending: not Alertmanager's business yet
        self._changed[alert.fingerprint] = alert

    async def flush(self) -> None:
        """Post what changed; every ``resend_s``, every firing alert again."""
        now = self._clock()
        batch = dict(self._changed)
        if now - self._last_resend >= self.resend_s:
            self._last_resend = now
            batch.update(self.firing)
        if not batch:
            return
        body = orjson.dumps(
            [
                postable(a, external_url=self.external_url, now=now, resend_s=self.resend_s)
                for a in batch.values()
            ]
        )
        if all([await self._post(url, body) for url in self.urls]):
            for fp in batch:
                self._changed.pop(fp, None)
            self.stats.alerts_sent += len(batch)

    async def _post(self, url: str, body: bytes) -> bool:
        answer = await post_json(self.session, url, body, timeout_s=self.timeout_s)
        self.stats.posts += 1
        if isinstance(outcome_of(answer), Delivered):
            return True
        self.stats.failures += 1
        log.warning("alertmanager %s: %s (sent again at the next resend)", _where(url), answer.why)
        return False


def _where(url: str) -> str:
    return redact_url(url)


def decode_active(values: Mapping[Any, bytes] | Iterable[bytes]) -> list[Alert]:
    """The alerts of the Redis active-alert hash (bad entries skipped)."""
    out = []
    for v in values.values() if isinstance(values, Mapping) else values:
        try:
            out.append(decode_as(Alert, v))
        except SchemaError:
            continue
    return out
