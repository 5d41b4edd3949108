"""From ``ragwatch.events`` (OOM kills, XIDs, device events) to alerts that fire at once.

Each event is one evaluation of the ``event`` rules with signals that say what happened
(``oom_kill``, ``xid``, ``xid_critical``, ``device_event``, ``process_exit`` = 1 or the XID
code) and labels naming the culprit (host, gpu, pid, process, container, xid). Events are
instants: nothing later says "it is over". So the worker moves each host's event alerts
forward in event time with :meth:`EventPipeline.advance` on every GPU envelope of that
host, evaluating them with all signals at 0; a rule's ``keep_firing_for`` then decides when
the alert resolves.

>>> from ragwatch.schema import EventEnvelope
>>> from ragwatch.streams.alerting.rules import load_rules
>>> pipe = EventPipeline(load_rules())
>>> oom = EventEnvelope(host="h1", ts=100.0, type="oom_kill",
...                    attrs={"gpu": 1, "pid": 4711, "process": "rag-worker"})
>>> [(t.alert.rule, t.alert.status) for t in pipe.process(oom)]
[('GpuOomKill', 'firing')]
>>> [t.alert.status for t in pipe.advance("h1", 100.0 + 16 * 60)]
['resolved']
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ragwatch.catalog import SERIES_LABELS, SERIES_SIGNALS
from ragwatch.schema import EventEnvelope, Transition
from ragwatch.streams.alerting.engine import AlertEngine
from ragwatch.streams.alerting.rules import Rule
from ragwatch.streams.pipelines.base import ChartSeries, Domain, Tap

SERIES = "event"
SIGNALS = SERIES_SIGNALS[SERIES]
LABELS = SERIES_LABELS[SERIES]
QUIET: Mapping[str, float | None] = dict.fromkeys(SIGNALS, 0.0)
CRITICAL_XIDS = frozenset({31, 43, 48, 79})  # page faults, stopped channel, DBE, off the bus


@dataclass
class EventStats:
    events: int = 0
    active: int = 0
    duplicates: int = 0  # events seen already (a replay after a crash, a producer retry)
    aggregated: int = 0  # events beyond MAX_EVENT_ALERTS of a host and rule (see bounded)


RECENT_EVENTS = 256  # per host: how many event identities are remembered to drop duplicates
# Per host and rule, at most this many alerts of distinct culprits; the events beyond (an
# OOM flood: 5,000 pids killed) share one alert whose labels say so, and are counted.
MAX_EVENT_ALERTS = 20
EventId = tuple[float, str, tuple[tuple[str, str], ...]]


def signals_of(event: EventEnvelope) -> dict[str, float | None]:
    """What the event says, as rule signals (everything else 0)."""
    sig: dict[str, float | None] = dict.fromkeys(SIGNALS, 0.0)
    if event.type == "xid":
        code = event.attrs.get("xid")
        xid = float(code) if isinstance(code, int | float) and not isinstance(code, bool) else 0
        sig["xid"] = xid
        sig["xid_critical"] = 1.0 if int(xid) in CRITICAL_XIDS else 0.0
    elif event.type in sig:
        sig[event.type] = 1.0
    return sig


def labels_of(event: EventEnvelope) -> dict[str, str]:
    """The culprit: the event's host and the attributes that identify what was hit."""
    labels = {"host": event.host, "type": event.type}
    for key in LABELS[1:]:
        value = event.attrs.get(key)
        if value is not None and key not in labels and not isinstance(value, dict | list):
            labels[key] = str(value)
    return labels


class EventPipeline:
    """Evaluates the ``event`` rules on each event and ages their alerts in event time."""

    def __init__(self, rules: list[Rule], engine: AlertEngine | None = None) -> None:
        self.rules = [r for r in rules if r.series == SERIES]
        self.engine = engine or AlertEngine()
        self.stats = EventStats()
        # host -> (rule, labels) of the alerts its events raised, to age them
        self._active: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], Rule]] = {}
        self._recent: dict[str, deque[EventId]] = {}  # host -> identities of recent events
        self.swept: set[str] = set()  # never filled: no series to sweep
        self.tap: Tap | None = None  # never told: events are not charted
        self._watermark = 0.0  # the newest event time seen

    def process(self, event: EventEnvelope) -> list[Transition]:
        self.stats.events += 1
        self._watermark = max(self._watermark, event.ts)
        labels, sig = labels_of(event), signals_of(event)
        recent = self._recent.setdefault(event.host, deque(maxlen=RECENT_EVENTS))
        ident = (event.ts, event.type, tuple(sorted(labels.items())))
        if ident in recent:
            self.stats.duplicates += 1
            return []
        recent.append(ident)
        out = []
        for rule in self.rules:
            holds = rule.holds(sig)
            lab = self._bounded(event.host, rule, labels) if holds else labels
            t = self.engine.evaluate(rule, lab, sig, event.ts)
            if t is not None:
                out.append(t)
            if holds:
                # An event is an instant: its alert counts as cleared from the event on, so
                # keep_firing_for runs from the event's own time.
                t = self.engine.evaluate(rule, lab, QUIET, event.ts)
                if t is not None:
                    out.append(t)
                else:
                    key = (rule.name, tuple(sorted(lab.items())))
                    self._active.setdefault(event.host, {})[key] = rule
        self.stats.active = sum(len(v) for v in self._active.values())
        return out

    def _bounded(self, host: str, rule: Rule, labels: dict[str, str]) -> dict[str, str]:
        """``labels``, or, once the host has ``MAX_EVENT_ALERTS`` alerts of ``rule`` for
        other culprits, the labels of the one alert that stands for all the others
        (``culprits="more than 20"``, the culprit labels ``*``): a flood pages once more,
        not once per pid, and its hints stay short."""
        active = self._active.get(host, {})
        if (rule.name, tuple(sorted(labels.items()))) in active:
            return labels
        if sum(name == rule.name for name, _ in active) < MAX_EVENT_ALERTS:
            return labels
        self.stats.aggregated += 1
        more = {k: "*" for k in LABELS if k not in ("host", "type")}
        return {
            **more,
            "host": host,
            "type": labels["type"],
            "culprits": f"more than {MAX_EVENT_ALERTS}",
        }

    def advance(self, host: str, ts: float) -> list[Transition]:
        """Evaluate the host's event alerts at ``ts`` with nothing happening."""
        self._watermark = max(self._watermark, ts)
        active = self._active.get(host)
        if not active:
            return []
        out = []
        for key, rule in list(active.items()):
            t = self.engine.evaluate(rule, dict(key[1]), QUIET, ts)
            if t is not None:
                out.append(t)
                if t.alert.status == "resolved":
                    del active[key]
        if not active:
            del self._active[host]
        self.stats.active = sum(len(v) for v in self._active.values())
        return out

    # -- the SignalPipeline seam (streams/pipelines/base.py) -----------------------------

    name: ClassVar[str] = "events"
    domain: ClassVar[Domain] = "host"
    sweep_mark = math.inf  # events keep no series to sweep: their alerts age with the host

    @property
    def watermark(self) -> float:
        return self._watermark

    def tracks(self, key: str) -> bool:
        return key in self._active or key in self._recent

    def dump(self, key: str) -> dict[str, Any]:
        return self.host_state(key)

    def status(self, keys: Collection[str]) -> dict[str, dict[str, Any]]:
        return {}  # the events' alerts are in the alert list

    def charts(self, keys: Collection[str]) -> Iterable[ChartSeries]:
        return ()  # device events are not charted: their alerts show the process's memory

    def host_state(self, host: str) -> dict[str, Any]:
        """The host's aging event alerts and recent event identities (for a snapshot), as
        plain data: lists of strings and numbers (labels as ``[name, value]`` pairs)."""
        active = [
            [rule.name, [list(p) for p in labels]]
            for (_, labels), rule in self._active.get(host, {}).items()
        ]
        recent = [
            [ts, kind, [list(p) for p in labels]] for ts, kind, labels in self._recent.get(host, ())
        ]
        return {"active": active, "recent": recent}

    def forget(self, host: str) -> None:
        """Drop a host's event state without resolving anything (another worker owns it)."""
        self._active.pop(host, None)
        self._recent.pop(host, None)
        self.stats.active = sum(len(v) for v in self._active.values())

    def adopt(self, host: str, state: Mapping[str, Any]) -> int:
        """Take over a host's event state from a snapshot, unless this pipeline has its own
        (events hold no series: 0)."""
        if host in self._active or host in self._recent:
            return 0
        rules = {r.name: r for r in self.rules}
        active = {}
        for name, labels in state.get("active", ()):  # pairs of lists, or of tuples (v6)
            pairs = _pairs(labels)
            own = dict(pairs)
            if own.get("host") != host or "type" not in own or "service" in own:
                raise ValueError("event state: an alert's labels name another host")
            if _text(name) in rules:
                active[(name, pairs)] = rules[name]
        recent = [
            (_time(ts), _text(kind), _pairs(lab)) for ts, kind, lab in state.get("recent", ())
        ]
        if active:
            self._active[host] = active
        self._recent[host] = deque(recent, maxlen=RECENT_EVENTS)
        self.stats.active = sum(len(v) for v in self._active.values())
        return 0

    def snapshot(self) -> dict[str, Any]:
        return {"events": self.stats.events, "active": self.stats.active}


def _text(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError(f"event state: expected a string, got {type(v).__name__}")
    return v


def _time(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError(f"event state: expected a time, got {type(v).__name__}")
    return v


def _pairs(v: Any) -> tuple[tuple[str, str], ...]:
    """Sorted labels as the pipeline keys them (lists in a snapshot, tuples in version 6)."""
    if not isinstance(v, list | tuple):
        raise ValueError("event state: labels are not a list of pairs")
    return tuple((_text(k), _text(x)) for k, x in v)
