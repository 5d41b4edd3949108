"""What the notifier asks a receiver to deliver, and what a receiver answers.

The notifier (:mod:`ragwatch.streams.notifier.service`) groups alert transitions, writes each
:class:`Notification` to its Redis outbox, and hands due notifications to the
:class:`Sender` of their receiver: Slack, PagerDuty or a generic Alertmanager-style
webhook. A sender builds its payloads with pure functions (so they can be tested and
fuzzed without a network), keeps to its service's rate limits, and answers one
:class:`Outcome` per notification: :class:`Delivered`, :class:`Retry` (a 5xx, a 429, a
timeout, a connection error, or its own rate limit: the outbox tries again no sooner than
``after_s``) or :class:`Failed` (a 4xx that will not get better: dead-lettered at once).

>>> from ragwatch.schema import Alert
>>> a = Alert(rule="GpuMemoryLeak", severity="critical", status="firing",
...           labels={"alertname": "GpuMemoryLeak", "host": "h1"}, annotations={},
...           value=1.3e9, expected=0.0, starts_at=0.0, ends_at=None, fingerprint="f1")
>>> n = Notification.of("pager", {"alertname": "GpuMemoryLeak"}, [a])
>>> n.status, n.group_key, len(n.key)
('firing', 'pager:{"alertname":"GpuMemoryLeak"}', 32)
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

import orjson

from ragwatch.codec import from_dict, to_dict
from ragwatch.schema import Alert


@dataclass(frozen=True, slots=True)
class Notification:
    """One message for one receiver: a group of alerts at one moment.

    ``key`` is the idempotency key: the same receiver, group and alert transitions give
    the same key, so a notification written twice (a replay, a notifier restart) is
    sent once. ``status`` is ``firing`` if any alert in it is firing, else ``resolved``.
    """

    key: str
    receiver: str
    group_key: str
    group_labels: dict[str, str]
    status: Literal["firing", "resolved"]
    alerts: tuple[Alert, ...]
    external_url: str = ""
    reason: str = "new"  # new | update | repeat | resolved

    @classmethod
    def of(
        cls,
        receiver: str,
        group_labels: Mapping[str, str],
        alerts: Iterable[Alert],
        *,
        external_url: str = "",
        reason: str = "new",
    ) -> Notification:
        """A notification with its group key and idempotency key derived from the alerts
        (their fingerprints, statuses and start and end times)."""
        alerts = tuple(alerts)
        if not alerts:
            raise ValueError("a notification needs at least one alert")
        group_key = f"{receiver}:{orjson.dumps(dict(sorted(group_labels.items()))).decode()}"
        ident = [(a.fingerprint, a.status, a.starts_at, a.ends_at) for a in alerts]
        raw = orjson.dumps([group_key, sorted(ident, key=repr), reason == "repeat"])
        if reason == "repeat":  # a repeat of the same alerts is a new message each time
            raw += orjson.dumps(max(a.at or a.starts_at for a in alerts))
        status: Literal["firing", "resolved"] = (
            "firing" if any(a.status == "firing" for a in alerts) else "resolved"
        )
        return cls(
            key=hashlib.sha256(raw).hexdigest()[:32],
            receiver=receiver,
            group_key=group_key,
            group_labels=dict(group_labels),
            status=status,
            alerts=alerts,
            external_url=external_url,
            reason=reason,
        )

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "key": self.key,
                "receiver": self.receiver,
                "group_key": self.group_key,
                "group_labels": self.group_labels,
                "status": self.status,
                "alerts": [to_dict(a) for a in self.alerts],
                "external_url": self.external_url,
                "reason": self.reason,
            }
        )

    @classmethod
    def from_json(cls, data: bytes | str) -> Notification:
        d = orjson.loads(data)
        alerts = tuple(a for a in (from_dict(x) for x in d["alerts"]) if isinstance(a, Alert))
        return cls(
            key=d["key"],
            receiver=d["receiver"],
            group_key=d["group_key"],
            group_labels=dict(d["group_labels"]),
            status=d["status"],
            alerts=alerts,
            external_url=d.get("external_url", ""),
            reason=d.get("reason", "new"),
        )


@dataclass(frozen=True, slots=True)
class Delivered:
    """The receiver accepted it (2xx)."""

    detail: str = ""


@dataclass(frozen=True, slots=True)
class Retry:
    """Try again, no sooner than ``after_s`` seconds (None: the outbox's own backoff)."""

    reason: str
    after_s: float | None = None


@dataclass(frozen=True, slots=True)
class Failed:
    """It will not get better (e.g. 400, 404): dead-letter it now."""

    reason: str


Outcome = Delivered | Retry | Failed
Settle = Callable[[int, Outcome], Awaitable[None]]
"""Told each answer as soon as it is known: (its index in the batch, the outcome)."""


@dataclass
class SenderStats:
    sent: int = 0  # HTTP requests that were accepted
    retried: int = 0
    failed: int = 0
    rate_limited: int = 0  # 429 answers, plus sends held back by our own rate limit
    digests: int = 0  # several notifications folded into one message (Slack)
    extra: dict[str, Any] = field(default_factory=dict)


class Sender(Protocol):
    """One configured receiver. ``send`` never raises for a delivery problem: it answers."""

    kind: ClassVar[str]  # "slack" | "pagerduty" | "webhook"
    name: str  # the receiver's name in the notify config
    stats: SenderStats

    async def send(
        self, batch: Sequence[Notification], settle: Settle | None = None
    ) -> list[Outcome]:
        """Deliver due notifications (oldest first); one outcome each, in order. Each
        outcome known before the batch ends is handed to ``settle`` at once (the notifier
        marks a notification delivered before the next one goes, so a crash re-sends at
        most the one in flight); the caller settles the rest from the returned list."""
        ...

    def describe(self) -> str:
        """The target without secrets (for logs and status)."""
        ...
