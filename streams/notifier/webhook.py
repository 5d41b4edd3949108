"""Webhook delivery: an Alertmanager-v4-shaped JSON POST per notification.

Every existing Alertmanager webhook receiver understands the body::

    {"version": "4", "groupKey": ..., "status": "firing" | "resolved",
     "receiver": "ragwatch", "groupLabels": {...}, "commonLabels": {...},
     "commonAnnotations": {...}, "externalURL": ..., "truncatedAlerts": 0,
     "alerts": [{"status", "labels", "annotations", "startsAt", "endsAt",
                 "generatorURL", "fingerprint", "value", "expected"}]}

:class:`WebhookSender` is the notifier's sender (:mod:`ragwatch.streams.notifier.notification`):
one POST per notification, carrying its idempotency key in ``X-Ragwatch-Key`` (the same
on every attempt: a receiver that has seen a key may drop the request), signed with
``X-Ragwatch-Signature: sha256=<hex HMAC-SHA256 of the body>`` when the receiver has an
``hmac_secret``; 2xx is delivered, 408/425/429/5xx, timeouts and connection errors are
retried (after ``Retry-After`` when the receiver sends one, and nothing else goes to that
URL before then), other 4xx fail. A body over ``max_body_bytes`` keeps the first alerts
that fit and counts the rest in
``truncatedAlerts``, as Alertmanager's ``max_alerts`` does.

What the three senders (webhook, :mod:`~ragwatch.streams.notifier.slack`,
:mod:`~ragwatch.streams.notifier.pagerduty`) share is in :mod:`~ragwatch.streams.notifier.delivery`.

>>> from ragwatch.schema import Alert
>>> a = Alert(rule="R", severity="critical", status="firing", labels={"alertname": "R"},
...           annotations={}, value=2.0, expected=0.0, starts_at=0.0, ends_at=None,
...           fingerprint="abc")
>>> body = alertmanager_payload([a], external_url="http://rw")
>>> body["status"], body["alerts"][0]["startsAt"], body["alerts"][0]["endsAt"]
('firing', '1970-01-01T00:00:00Z', '0001-01-01T00:00:00Z')
>>> from ragwatch.streams.notifier.notification import Notification
>>> n = Notification.of("hook", {"alertname": "R"}, [a] * 50)
>>> small = orjson.loads(webhook_body(n, max_body_bytes=4096))
>>> len(small["alerts"]) + small["truncatedAlerts"], small["groupKey"]
(50, 'hook:{"alertname":"R"}')
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import quote

import aiohttp
import orjson

from ragwatch.config import Secret, mask_webhook
from ragwatch.schema import Alert
from ragwatch.streams.notifier.delivery import (
    Hold,
    PostingSender,
    ReceiverFields,
    count_outcomes,
    in_order,
    shared,
    target_key,
)
from ragwatch.streams.notifier.notification import (
    Notification,
    Outcome,
    Retry,
    Settle,
)

if TYPE_CHECKING:
    from ragwatch.streams.notifier.notification import Sender

log = logging.getLogger(__name__)
ZERO_TIME = "0001-01-01T00:00:00Z"  # Alertmanager's "not ended"
MIB = 1024 * 1024
MAX_TIMESTAMP = 253402300799.0  # 9999-12-31T23:59:59Z, the last time RFC 3339 can write


def rfc3339(ts: float | None) -> str:
    """Epoch seconds as RFC 3339 UTC; None (not ended) as Alertmanager's zero time.

    >>> rfc3339(1.5), rfc3339(None), rfc3339(1e300)
    ('1970-01-01T00:00:01.5Z', '0001-01-01T00:00:00Z', '9999-12-31T23:59:59Z')
    """
    if ts is None or math.isnan(ts):
        return ZERO_TIME
    dt = datetime.fromtimestamp(min(max(ts, 0.0), MAX_TIMESTAMP), tz=UTC)
    frac = f".{dt.microsecond:06d}".rstrip("0").rstrip(".")
    return dt.strftime("%Y-%m-%dT%H:%M:%S") + frac + "Z"


def alertmanager_payload(
    alerts: Sequence[Alert],
    *,
    receiver: str = "ragwatch",
    external_url: str = "",
    group_key: str | None = None,
    group_labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The Alertmanager v4 webhook body for a group of alerts.

    ``group_key`` and ``group_labels`` come from a :class:`Notification`; without them
    the group is the first alert's ``alertname``.
    """
    if not alerts:
        raise ValueError("alertmanager_payload needs at least one alert")
    common_labels = dict(alerts[0].labels)
    common_ann = dict(alerts[0].annotations)
    for a in alerts[1:]:
        common_labels = {k: v for k, v in common_labels.items() if a.labels.get(k) == v}
        common_ann = {k: v for k, v in common_ann.items() if a.annotations.get(k) == v}
    if group_labels is None:
        group_labels = {"alertname": alerts[0].labels.get("alertname", alerts[0].rule)}
    if group_key is None:
        group_key = "{}:" + orjson.dumps(dict(group_labels)).decode()
    pages = external_url.rstrip("/")  # an alert's page: ragwatch serve's /alerts/{fp}
    return {
        "version": "4",
        "groupKey": group_key,
        "truncatedAlerts": 0,
        "status": "firing" if any(a.status == "firing" for a in alerts) else "resolved",
        "receiver": receiver,
        "groupLabels": dict(group_labels),
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
                "generatorURL": f"{pages}/alerts/{quote(a.fingerprint, safe='')}",
                "fingerprint": a.fingerprint,
                "value": a.value,
                "expected": a.expected,
                **({"resolution": a.resolution} if a.status == "resolved" and a.resolution else {}),
            }
            for a in alerts
        ],
    }


def webhook_body(n: Notification, *, max_body_bytes: int = MIB) -> bytes:
    """The JSON body for one notification, at most ``max_body_bytes`` long.

    Too long: the first alerts that fit are kept and ``truncatedAlerts`` counts the
    others (group status and common labels still describe all of them, as Alertmanager's
    ``max_alerts`` does). At least one alert is always kept, even if it alone is longer.
    """
    payload = alertmanager_payload(
        n.alerts,
        receiver=n.receiver,
        external_url=n.external_url,
        group_key=n.group_key,
        group_labels=n.group_labels,
    )
    body = orjson.dumps(payload)
    alerts = payload["alerts"]
    if len(body) <= max_body_bytes or len(alerts) == 1:
        return body

    def cut(k: int) -> bytes:
        return orjson.dumps({**payload, "truncatedAlerts": len(alerts) - k, "alerts": alerts[:k]})

    lo, hi = 1, len(alerts) - 1  # the largest k whose body fits, by bisection
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if len(cut(mid)) <= max_body_bytes else (lo, mid - 1)
    return cut(lo)


def sign(secret: str, body: bytes) -> str:
    """The ``X-Ragwatch-Signature`` header value: ``sha256=<hex HMAC-SHA256 of body>``.

    >>> sign("s3cret", b'{"a":1}')[:15]
    'sha256=5910e620'
    """
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


# ---------------------------------------------------------------- the webhook sender


@dataclass(frozen=True, slots=True)
class WebhookConfig:
    """A generic webhook receiver: Alertmanager v4 JSON to ``url``, optionally signed.

    >>> c = WebhookConfig.from_mapping("audit", {"url": "https://h.example/x/tok",
    ...                                          "hmac_secret": "s3cret", "timeout_s": "5s"})
    >>> c.timeout_s, c.max_body_bytes, c.hmac_secret
    (5.0, 1048576, Secret('**********'))
    >>> "tok" in repr(c) or "s3cret" in repr(c)
    False
    """

    name: str
    url: str = field(repr=False)  # may carry a token in its path or query
    hmac_secret: Secret | None = None
    timeout_s: float = 10.0
    max_body_bytes: int = MIB

    FIELDS: ClassVar[tuple[str, ...]] = ("url", "hmac_secret", "timeout_s", "max_body_bytes")

    @classmethod
    def from_mapping(cls, name: str, d: Mapping[str, Any]) -> WebhookConfig:
        f = ReceiverFields("webhook", name, d, cls.FIELDS)
        return cls(
            name=name,
            url=f.url("url", secret=True),
            hmac_secret=f.optional_secret("hmac_secret"),
            timeout_s=f.number("timeout_s", 10.0, duration=True),
            max_body_bytes=f.integer("max_body_bytes", MIB, minimum=4096),
        )


class WebhookSender(PostingSender[WebhookConfig]):
    """Posts each notification to one URL (see the module docstring for the rules).

    A Retry answer (or a ``Retry-After``) stops the batch: the notifications after it are
    answered Retry without being sent, so a dead receiver costs one timeout per batch.
    """

    kind: ClassVar[str] = "webhook"

    def _url(self) -> str:
        return self.config.url

    def _share(self, session: aiohttp.ClientSession) -> Hold:
        return shared(session, target_key("webhook", self.config.url), Hold)

    def describe(self) -> str:
        signed = ", signed" if self.config.hmac_secret else ""
        return f"webhook {self.name} -> {mask_webhook(self.config.url)}{signed}"

    async def send(
        self, batch: Sequence[Notification], settle: Settle | None = None
    ) -> list[Outcome]:
        out = await in_order(batch, self._post, settle)
        # each notification held back by the receiver's Retry-After counts as rate limited
        self.stats.rate_limited += sum(isinstance(o, Retry) and "held:" in o.reason for o in out)
        count_outcomes(self.stats, out)
        return out

    async def _post(self, n: Notification) -> Outcome:
        if (wait := self._target.hold.left(self._clock())) > 0:
            return Retry(f"held: the receiver asked to wait {wait:.1f}s", wait)
        body = webhook_body(n, max_body_bytes=self.config.max_body_bytes)
        headers = {"User-Agent": "ragwatch", "X-Ragwatch-Key": n.key}
        if self.config.hmac_secret:
            headers["X-Ragwatch-Signature"] = sign(self.config.hmac_secret.get(), body)
        return await self._target.post(body, f"notification {n.key}", headers)


if TYPE_CHECKING:

    def _is_a_sender(s: WebhookSender) -> Sender:
        return s
