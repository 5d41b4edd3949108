"""PagerDuty delivery: one Events API v2 event per alert, trigger and resolve.

Each alert of a notification becomes one event posted to ``/v2/enqueue``: a firing alert
``event_action: trigger`` with a ``payload`` (``summary`` from the alert's summary
annotation, cut to PagerDuty's 1024 characters; ``source`` from the first of the labels
``host``, ``service``, ``instance``; ``severity`` through ``severity_map``; ``timestamp``;
``component``, ``group`` and ``class`` from labels and the rule; ``custom_details`` with
labels, value, expected and annotations, the root-cause hint first) and ``links`` to the
alert on the status page; a resolved alert ``event_action: resolve``. A pending alert
sends nothing. An alert that resolved only because its baseline accepted the deviation as
the new normal (``Alert.resolution == "relearned"``: the fault went on for a day) is not
a recovery, so it does not close the PagerDuty alert: it sends a trigger that updates it,
its summary starting "NOT RECOVERED, new level accepted", and a person resolves it.

Both carry the same ``dedup_key``: ``ragwatch-`` + the SHA-256 hex of the rule and the
alert's sorted labels (the identity the engine fingerprints), so a resolve closes the
alert its trigger opened, after any restart, and repeated triggers update one alert
instead of opening new ones (alertmanager#298, kibana#76908). PagerDuty keeps the key
per routing key: a resolve must use the trigger's ``routing_key``.

Answers: 202 is accepted; 429 is Retry after ``Retry-After`` (30 s without one, as
PagerDuty suggests), and nothing more goes to that routing key until then; 5xx, timeouts
and connection errors are Retry; 400 (an invalid event) and other 4xx are Failed.

PagerDuty takes about 120 events a minute per routing key over a sliding 60 s window and
drops what is over (429). The sender keeps under ``rate_per_min`` itself: an event the
window has no room for is not sent, and its notification answers Retry with ``after_s``
= when the window frees.

A notification with several alerts is Delivered only when all its events are accepted.
If some were accepted and another must be retried, the notification is retried whole:
events this process saw accepted for it are skipped, and after a restart all of them are
sent again, which is harmless because PagerDuty dedups by ``dedup_key`` (a second trigger
adds a log entry to the open alert, a second resolve of a resolved alert is dropped).

>>> from ragwatch.schema import Alert
>>> a = Alert(rule="GpuMemoryLeak", severity="critical", status="firing",
...           labels={"alertname": "GpuMemoryLeak", "host": "h1", "gpu": "0"},
...           annotations={"summary": "leak", "hint": "FAISS index never reset"},
...           value=1.3e9, expected=0.0, starts_at=0.0, ends_at=None, fingerprint="f1")
>>> cfg = PagerDutyConfig.from_mapping("pager", {"routing_key": "R" * 32})
>>> ev = pagerduty_event(a, cfg)
>>> ev["event_action"], ev["payload"]["source"], ev["payload"]["severity"], len(ev["dedup_key"])
('trigger', 'h1', 'critical', 73)
>>> from dataclasses import replace
>>> gone = pagerduty_event(replace(a, status="resolved", ends_at=60.0), cfg)
>>> gone == {"routing_key": "R" * 32, "event_action": "resolve", "dedup_key": ev["dedup_key"]}
True
>>> kept = pagerduty_event(replace(a, status="resolved", resolution="relearned"), cfg)
>>> kept["event_action"], kept["payload"]["summary"][:35]
('trigger', 'NOT RECOVERED, new level accepted: ')
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import quote

import aiohttp
import orjson

from ragwatch.config import Secret, redact_url
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
    Delivered,
    Failed,
    Notification,
    Outcome,
    Retry,
    Settle,
)
from ragwatch.streams.notifier.webhook import rfc3339
from ragwatch.yamlfile import label_name

if TYPE_CHECKING:
    from ragwatch.streams.notifier.notification import Sender

log = logging.getLogger(__name__)

EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"
PD_SEVERITIES = ("critical", "error", "warning", "info")
DEFAULT_SEVERITY_MAP = {s: s for s in PD_SEVERITIES}
UNMAPPED_SEVERITY = "error"  # a severity the map does not name
MAX_SUMMARY = 1024  # characters, PagerDuty's limit
MAX_FIELD = 1024  # source, component, group, class: ours, to stay readable
MAX_DETAIL = 4096  # one string in custom_details, before the size check
MAX_EVENT_BYTES = 512_000  # PagerDuty's limit on one event
WINDOW_S = 60.0
DEFAULT_RETRY_AFTER_S = 30.0
REMEMBER_ACCEPTED = 4096  # (notification, event) pairs, to skip on a retry
COMPONENT_LABELS = ("process", "container", "instance", "target")  # else "GPU <gpu>"
GROUP_LABELS = ("service", "team", "cluster")
TOP_DETAILS = ("hint", "description", "runbook")  # annotations shown first


@dataclass(frozen=True, slots=True)
class PagerDutyConfig:
    """An Events API v2 integration (its routing key is a secret).

    >>> c = PagerDutyConfig.from_mapping("pager", {"routing_key": "k" * 32,
    ...                                            "severity_map": {"warning": "error"}})
    >>> c.severity_map["warning"], c.severity_map["critical"], c.rate_per_min, c.routing_key
    ('error', 'critical', 120, Secret('**********'))
    """

    name: str
    routing_key: Secret
    url: str = EVENTS_URL
    rate_per_min: int = 120
    timeout_s: float = 10.0
    severity_map: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_SEVERITY_MAP))
    source_labels: tuple[str, ...] = ("host", "service", "instance")

    FIELDS: ClassVar[tuple[str, ...]] = (
        "routing_key",
        "url",
        "rate_per_min",
        "timeout_s",
        "severity_map",
        "source_labels",
    )

    @classmethod
    def from_mapping(cls, name: str, d: Mapping[str, Any]) -> PagerDutyConfig:
        f = ReceiverFields("pagerduty", name, d, cls.FIELDS)
        severity_map = f.string_map("severity_map", DEFAULT_SEVERITY_MAP, values=PD_SEVERITIES)
        for ours in set(severity_map) - set(DEFAULT_SEVERITY_MAP):  # a typo would map nothing
            raise f.error(f"severity_map.{ours}", f"not a severity ({', '.join(PD_SEVERITIES)})")
        labels = f.names("source_labels", ("host", "service", "instance"))
        return cls(
            name=name,
            routing_key=f.secret("routing_key"),
            url=f.url("url", EVENTS_URL),
            rate_per_min=f.integer("rate_per_min", 120),
            timeout_s=f.number("timeout_s", 10.0, duration=True),
            severity_map=severity_map,
            source_labels=tuple(label_name(x, f"{f.where}.source_labels") for x in labels),
        )


# ---------------------------------------------------------------- events (pure)


def dedup_key(alert: Alert) -> str:
    """``ragwatch-`` + SHA-256 hex of the rule and the sorted labels (73 characters):
    the same for trigger and resolve, across restarts and notifier replicas.

    >>> from ragwatch.schema import Alert
    >>> a = Alert(rule="R", severity="info", status="firing", labels={"b": "2", "a": "1"},
    ...           annotations={}, value=0.0, expected=None, starts_at=0.0, ends_at=None,
    ...           fingerprint="x")
    >>> dedup_key(a)[:17]
    'ragwatch-4cf8fae8'
    """
    raw = orjson.dumps([alert.rule, sorted(alert.labels.items())])
    return "ragwatch-" + hashlib.sha256(raw).hexdigest()


def _cut(s: str, limit: int) -> str:
    return s if len(s) <= limit else s[: limit - 1] + "…"


def _first(labels: Mapping[str, str], names: Sequence[str]) -> str:
    return next((labels[k] for k in names if labels.get(k)), "")


def _number(v: float | None) -> float | str | None:
    """JSON has no NaN or infinity: those become strings."""
    return v if v is None or math.isfinite(v) else str(v)


def _details(alert: Alert) -> dict[str, Any]:
    ann = alert.annotations
    top = {k: _cut(ann[k], MAX_DETAIL) for k in TOP_DETAILS if ann.get(k)}
    rest = {k: _cut(v, MAX_DETAIL) for k, v in ann.items() if k not in TOP_DETAILS}
    return {
        **top,
        "value": _number(alert.value),
        "expected": _number(alert.expected),
        "labels": {_cut(k, MAX_DETAIL): _cut(v, MAX_DETAIL) for k, v in alert.labels.items()},
        "annotations": rest,
        "starts_at": rfc3339(alert.starts_at),
        "fingerprint": _cut(alert.fingerprint, MAX_DETAIL),
    }


def pagerduty_event(
    alert: Alert, config: PagerDutyConfig, *, external_url: str = ""
) -> dict[str, Any] | None:
    """The Events API v2 event for one alert (None for a pending one). Pure; never
    raises; at most ``MAX_EVENT_BYTES`` of JSON (custom details go first when over)."""
    base = {"routing_key": config.routing_key.get(), "dedup_key": dedup_key(alert)}
    if alert.status == "resolved" and alert.resolution != "relearned":
        return {**base, "event_action": "resolve"}
    if alert.status not in ("firing", "resolved"):
        return None
    payload = _payload(alert, config)
    if alert.status == "resolved":  # re-learnt, not recovered: the incident stays open
        note = alert.annotations.get("resolution", "the baseline accepted the new level")
        payload["summary"] = _cut(f"NOT RECOVERED, new level accepted: {note}", MAX_SUMMARY)
    event: dict[str, Any] = {**base, "event_action": "trigger", "payload": payload}
    event["client"] = "ragwatch"
    if external_url and len(external_url) <= 2048:
        href = f"{external_url.rstrip('/')}/alerts/{quote(alert.fingerprint, safe='')}"
        if len(href) <= 2048:
            event["links"] = [{"href": href, "text": f"ragwatch: {_cut(alert.rule, 200)}"}]
        event["client_url"] = external_url
    if len(orjson.dumps(event)) > MAX_EVENT_BYTES:
        payload["custom_details"] = {
            "note": "custom details removed: the event was over PagerDuty's 512 KB",
            "value": _number(alert.value),
            "expected": _number(alert.expected),
        }
    return event


def _payload(alert: Alert, config: PagerDutyConfig) -> dict[str, Any]:
    labels = alert.labels
    source = _first(labels, config.source_labels) or "ragwatch"
    summary = alert.annotations.get("summary", "").strip() or f"{alert.rule} on {source}"
    payload: dict[str, Any] = {
        "summary": _cut(summary, MAX_SUMMARY),
        "source": _cut(source, MAX_FIELD),
        "severity": config.severity_map.get(alert.severity, UNMAPPED_SEVERITY),
        "timestamp": rfc3339(alert.at if alert.at is not None else alert.starts_at),
        "class": _cut(alert.rule, MAX_FIELD) or "ragwatch",
        "custom_details": _details(alert),
    }
    gpu = f"GPU {labels['gpu']}" if labels.get("gpu") else ""
    component = _first(labels, COMPONENT_LABELS) or gpu
    for key, value in (("component", component), ("group", _first(labels, GROUP_LABELS))):
        if value:
            payload[key] = _cut(value, MAX_FIELD)
    return payload


def pagerduty_events(n: Notification, config: PagerDutyConfig) -> list[dict[str, Any]]:
    """The events of one notification, in the order of its alerts."""
    events = (pagerduty_event(a, config, external_url=n.external_url) for a in n.alerts)
    return [e for e in events if e is not None]


# ---------------------------------------------------------------- the sender


@dataclass
class SlidingWindow:
    """At most ``limit`` sends in any ``span_s`` seconds.

    >>> w = SlidingWindow(limit=2)
    >>> w.room(0.0), w.record(0.0), w.record(1.0), w.room(2.0), w.frees_in(2.0)
    (2, None, None, 0, 58.0)
    """

    limit: int
    span_s: float = WINDOW_S
    sent: deque[float] = field(default_factory=deque)

    def _prune(self, now: float) -> None:
        while self.sent and self.sent[0] <= now - self.span_s:
            self.sent.popleft()

    def room(self, now: float) -> int:
        self._prune(now)
        return max(0, self.limit - len(self.sent))

    def record(self, now: float) -> None:
        self.sent.append(now)

    def frees_in(self, now: float) -> float:
        self._prune(now)
        if len(self.sent) < self.limit:
            return 0.0
        return max(0.0, self.sent[len(self.sent) - self.limit] + self.span_s - now)


@dataclass
class _KeyState:
    """What every sender using one routing key shares (see ``delivery.shared``)."""

    window: SlidingWindow
    hold: Hold = field(default_factory=Hold)


class PagerDutySender(PostingSender[PagerDutyConfig]):
    """Sends notifications to one PagerDuty routing key (rules: module docstring)."""

    kind: ClassVar[str] = "pagerduty"

    default_retry_after_s: ClassVar[float | None] = DEFAULT_RETRY_AFTER_S

    def __init__(
        self,
        config: PagerDutyConfig,
        session: aiohttp.ClientSession,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._accepted: OrderedDict[tuple[str, str, str], None] = OrderedDict()
        super().__init__(config, session, clock=clock)

    def _url(self) -> str:
        return self.config.url

    def _share(self, session: aiohttp.ClientSession) -> Hold:
        window = SlidingWindow(self.config.rate_per_min)
        key = target_key("pagerduty", self.config.url, self.config.routing_key.get())
        self._key = shared(session, key, lambda: _KeyState(window))
        return self._key.hold

    def describe(self) -> str:
        return f"pagerduty {self.name} -> {redact_url(self.config.url)}"

    async def send(
        self, batch: Sequence[Notification], settle: Settle | None = None
    ) -> list[Outcome]:
        # held, window full or PagerDuty in trouble: the rest waits
        out = await in_order(batch, self._notify, settle)
        count_outcomes(self.stats, out)
        return out

    async def _notify(self, n: Notification) -> Outcome:
        failed: Failed | None = None
        events = pagerduty_events(n, self.config)
        for event in events:
            seen = (n.key, event["dedup_key"], event["event_action"])
            if seen in self._accepted:
                continue
            now = self._clock()
            if (wait := self._key.hold.left(now)) > 0:
                self.stats.rate_limited += 1
                return Retry(f"held: PagerDuty asked to wait {wait:.1f}s", wait)
            if self._key.window.room(now) < 1:
                self.stats.rate_limited += 1
                wait = self._key.window.frees_in(now)
                return Retry(f"over {self.config.rate_per_min}/min: retry in {wait:.1f}s", wait)
            self._key.window.record(now)
            what = f"{event['event_action']} {event['dedup_key']}"
            outcome = await self._target.post(orjson.dumps(event), what)
            if isinstance(outcome, Retry):
                return outcome
            if isinstance(outcome, Failed):
                failed = failed or outcome
                continue
            self._remember(seen)
        return failed or Delivered(f"{len(events)} event(s) accepted")

    def _remember(self, seen: tuple[str, str, str]) -> None:
        self._accepted[seen] = None
        while len(self._accepted) > REMEMBER_ACCEPTED:
            self._accepted.popitem(last=False)


if TYPE_CHECKING:

    def _is_a_sender(s: PagerDutySender) -> Sender:
        return s
