"""Alert groups, as Alertmanager keeps them, on the notifier's clock (event time).

Every firing or resolved alert transition is routed (:mod:`ragwatch.streams.notifier.routing`) into
the group of its route and group labels. A new group is notified ``group_wait`` after its
first alert; a group that was notified and then changes (a new alert fires, one resolves)
is notified again ``group_interval`` after its last notification; a group that is still
firing and has not changed is notified again every ``repeat_interval``. A notification
carries the group's firing alerts and the alerts that resolved since the last one.

Muting happens here, at flush time: an alert inhibited by a firing source alert
(``inhibit_rules``, with Alertmanager's rule for an alert matching both sides of a rule:
see :class:`~ragwatch.streams.notifier.inhibition.InhibitRule`) or matched by a silence is
left out, and the group is checked again later, so the alert is sent once the source
resolves (and its rule's ``linger`` has passed, or, for an alert whose condition began
while the source fired, once it resolves too: the source's tail) or the silence expires. A
resolution is always sent to a receiver that was told the alert was firing, silenced or
not: a PagerDuty incident must not stay open because someone muted the alert meanwhile.
A resolution of an alert the group never saw firing (it was only pending, or it fired
before the notifier knew the group) is dropped.

The clock is the caller's ``now``: the notifier passes event time (the alerts' ``at``)
advanced by the wall clock between alerts, so a replay at 720x groups as it would live.
An alert that arrives behind the clock (the worker's GPU path lags its events path, so
an OOM kill at 12:13 can reach the notifier before the "memory over 95 %" of 08:44) is
grouped at its own event time, and a source mutes it only if the source fired by the
time its group was due: live, the 08:44 page went out long before the OOM.

>>> from ragwatch.schema import Alert
>>> from ragwatch.streams.notifier.routing import parse_config
>>> cfg = parse_config({"receivers": [{"name": "w", "type": "webhook", "url": "http://x"}],
...     "route": {"receiver": "w", "group_by": ["alertname"], "group_wait": "30s"}}, {})
>>> def alert(fp, status="firing", at=0.0):
...     return Alert(rule="Leak", severity="critical", status=status,
...                  labels={"alertname": "Leak", "host": fp}, annotations={}, value=1.0,
...                  expected=None, starts_at=0.0, ends_at=None, fingerprint=fp, at=at)
>>> g = Grouper(cfg)
>>> g.add(alert("a"), now=0.0); g.add(alert("b"), now=10.0)
>>> g.flush(now=20.0)                       # group_wait not over
[]
>>> [sorted(a.fingerprint for a in n.alerts) for n in g.flush(now=30.0)]
[['a', 'b']]
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from ragwatch.codec import from_dict, to_dict
from ragwatch.schema import Alert
from ragwatch.streams.notifier.inhibition import TAIL_S
from ragwatch.streams.notifier.notification import Notification
from ragwatch.streams.notifier.routing import NotifyConfig, Route

RECHECK_S = 60.0  # muted alerts are looked at again at least this often


@dataclass
class Group:
    route: Route
    labels: dict[str, str]
    alerts: dict[str, Alert] = field(default_factory=dict)  # fingerprint -> latest
    notified: set[str] = field(default_factory=set)  # fingerprints the receiver has as firing
    next_flush: float | None = None
    last_sent: float | None = None
    repeat_at: float | None = None


@dataclass
class GrouperStats:
    transitions: int = 0
    notifications: int = 0
    silenced: int = 0  # alerts left out of a notification by a silence
    inhibited: int = 0  # ... by an inhibition rule
    dropped_resolved: int = 0  # resolutions of alerts never notified as firing


def _key(route: Route, labels: dict[str, str]) -> str:
    return f"{route.path}:{route.receiver}:{orjson.dumps(dict(sorted(labels.items()))).decode()}"


class Grouper:
    """All groups of one notifier; ``add`` transitions, ``flush`` what is due."""

    def __init__(self, config: NotifyConfig, *, external_url: str = "") -> None:
        self.config = config
        self.external_url = external_url
        self.groups: dict[str, Group] = {}
        self.firing: dict[str, Alert] = {}  # every alert firing now (inhibition sources)
        # sources resolved within TAIL_S, if a rule has a linger: (alert, when)
        self.ended: dict[str, tuple[Alert, float]] = {}
        self._linger = any(r.linger_s for r in config.inhibit_rules)
        self.stats = GrouperStats()
        self._routes = {r.path: r for r in _walk(config.route)}

    def add(self, alert: Alert, now: float) -> None:
        """Take one transition from the alerts topic (pending ones are ignored)."""
        if alert.status == "pending":
            return
        self.stats.transitions += 1
        fp = alert.fingerprint
        at = min(now, alert.at) if alert.at is not None else now  # a late one: its own time
        self._source(alert, at)
        if not self.config.receivers:
            return
        for route in self.config.route.match(alert.labels):
            labels = route.group_labels(alert.labels)
            key = _key(route, labels)
            g = self.groups.get(key)
            if alert.status == "resolved" and (g is None or fp not in g.alerts):
                self.stats.dropped_resolved += 1
                continue
            if g is None:
                g = self.groups[key] = Group(route, labels, next_flush=at + route.group_wait_s)
            prev = g.alerts.get(fp)
            g.alerts[fp] = alert
            if prev is not None and (prev.status, prev.starts_at) == (
                alert.status,
                alert.starts_at,
            ):
                continue  # the same transition again (a replay): nothing changed
            if g.next_flush is None:
                due = (g.last_sent if g.last_sent is not None else at) + route.group_interval_s
                g.next_flush = max(at, due)

    def flush(
        self, now: float, silenced: Callable[[Alert], bool] = lambda a: False
    ) -> list[Notification]:
        """The notifications due at ``now``; ``silenced`` says whether an alert is muted."""
        out = []
        for key, g in list(self.groups.items()):
            due = g.next_flush is not None and now >= g.next_flush
            repeat = not due and g.repeat_at is not None and now >= g.repeat_at
            if due or repeat:
                was = g.repeat_at if repeat else g.next_flush
                n = self._flush_group(g, now, silenced, repeat, min(now, was or now))
                if n is not None:
                    out.append(n)
            if not g.alerts:
                del self.groups[key]
        self.stats.notifications += len(out)
        return out

    def _flush_group(
        self, g: Group, now: float, silenced: Callable[[Alert], bool], repeat: bool, due: float
    ) -> Notification | None:
        """The group's notification at ``now``; ``due``: the event time it was due at,
        when its inhibition is decided."""
        firing, muted = [], False
        for a in g.alerts.values():
            if a.status != "firing":
                continue
            if self._inhibited(a, due):
                self.stats.inhibited += 1
                muted = True
            elif silenced(a):
                self.stats.silenced += 1
                muted = True
            else:
                firing.append(a)
        resolved = [
            a for a in g.alerts.values() if a.status == "resolved" and a.fingerprint in g.notified
        ]
        for fp in [fp for fp, a in g.alerts.items() if a.status == "resolved"]:
            if fp not in g.notified:
                self.stats.dropped_resolved += 1
            del g.alerts[fp]
            g.notified.discard(fp)
        g.next_flush = now + max(g.route.group_interval_s, RECHECK_S) if muted else None
        fresh = {a.fingerprint for a in firing}
        if not repeat and not resolved and fresh <= g.notified:
            return None  # nothing the receiver does not know
        if not firing and not resolved:
            return None
        g.notified |= fresh
        g.last_sent = now
        g.repeat_at = now + g.route.repeat_interval_s if firing else None
        reason = "repeat" if repeat else ("resolved" if not firing else "new")
        return Notification.of(
            g.route.receiver,
            g.labels,
            sorted(firing + resolved, key=lambda a: (a.starts_at, a.fingerprint)),
            external_url=self.external_url,
            reason=reason,
        )

    def _source(self, alert: Alert, at: float) -> None:
        """Keep the firing alerts (inhibition sources), and those that resolved within
        TAIL_S (a rule with a linger mutes after its source resolved)."""
        fp = alert.fingerprint
        if alert.status == "firing":
            self.firing[fp] = alert
            self.ended.pop(fp, None)
            return
        src = self.firing.pop(fp, None)
        if src is not None and self._linger:
            self.ended[fp] = (src, at)
        for old in [k for k, (_, end) in self.ended.items() if end + TAIL_S < at]:
            del self.ended[old]

    def _inhibited(self, target: Alert, at: float) -> bool:
        """Whether an alert other than ``target``, firing by event time ``at`` (or
        resolved, by its rule's linger), mutes it by some inhibit rule."""
        sources = [(src, math.inf) for src in self.firing.values()]
        sources += self.ended.values()
        return any(
            (end == math.inf or rule.mutes_after(end, target.starts_at, at))
            and rule.inhibits(src.labels, target.labels)
            for rule in self.config.inhibit_rules
            for src, end in sources
            if src.fingerprint != target.fingerprint and _fired(src) <= at
        )

    # ------------------------------------------------------------------ persistence

    def dumps(self) -> bytes:
        """Groups and firing alerts as JSON (the notifier keeps them in Redis)."""
        return orjson.dumps(
            {
                "groups": {
                    k: {
                        "route": g.route.path,
                        "labels": g.labels,
                        "alerts": [to_dict(a) for a in g.alerts.values()],
                        "notified": sorted(g.notified),
                        "next_flush": g.next_flush,
                        "last_sent": g.last_sent,
                        "repeat_at": g.repeat_at,
                    }
                    for k, g in self.groups.items()
                },
                "firing": [to_dict(a) for a in self.firing.values()],
                "ended": [[to_dict(a), end] for a, end in self.ended.values()],
            }
        )

    def loads(self, data: bytes) -> int:
        """Restore :meth:`dumps` output; groups of routes that no longer exist are
        dropped. Returns the number of groups restored."""
        d: dict[str, Any] = orjson.loads(data)
        self.firing = {a.fingerprint: a for a in _alerts(d.get("firing", []))}
        ended = [(a, float(end)) for raw, end in d.get("ended", []) for a in _alerts([raw])]
        self.ended = {a.fingerprint: (a, end) for a, end in ended}
        for key, raw in d.get("groups", {}).items():
            route = self._routes.get(raw.get("route"))
            if route is None or key != _key(route, raw["labels"]):
                continue
            self.groups[key] = Group(
                route,
                raw["labels"],
                {a.fingerprint: a for a in _alerts(raw["alerts"])},
                set(raw["notified"]),
                raw["next_flush"],
                raw["last_sent"],
                raw["repeat_at"],
            )
        return len(self.groups)


def _fired(a: Alert) -> float:
    """When ``a`` fired, by event time."""
    return a.at if a.at is not None else a.starts_at


def _alerts(raw: list[Any]) -> list[Alert]:
    return [a for a in (from_dict(x) for x in raw) if isinstance(a, Alert)]


def _walk(route: Route) -> list[Route]:
    out = [route]
    for child in route.routes:
        out += _walk(child)
    return out
