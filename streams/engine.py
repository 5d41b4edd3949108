"""The alert engine: inactive -> pending -> firing -> resolved, in event time.

One state per fingerprint (rule + labels). Each evaluation passes the series' signals
and the event timestamp; the engine never reads a clock, so a replay at any speed gives
the same transitions. Semantics follow Prometheus: the condition starts a ``pending``
alert (``starts_at`` = that time); it turns ``firing`` once the condition has held for
the rule's ``for`` duration; a firing alert is ``resolved`` (``ends_at`` = that time)
once it is cleared (its ``resolve`` condition holds, or its ``expr`` stops holding) and
has stayed cleared for the rule's ``keep_firing_for``. A pending alert whose condition
stops holding is dropped; the engine reports that as a ``resolved`` transition from
``pending`` so state stores can forget it, and notifiers only page on transitions that
involve ``firing``.

>>> from ragwatch.streams.rules import parse_rule
>>> rule = parse_rule({"name": "Hot", "series": "gpu", "expr": "temp_c > 80", "for": "1m"})
>>> eng = AlertEngine()
>>> eng.evaluate(rule, {"host": "h1"}, {"temp_c": 85.0}, ts=0.0).alert.status
'pending'
>>> eng.evaluate(rule, {"host": "h1"}, {"temp_c": 86.0}, ts=30.0) is None
True
>>> eng.evaluate(rule, {"host": "h1"}, {"temp_c": 86.0}, ts=60.0).alert.status
'firing'
>>> t = eng.evaluate(rule, {"host": "h1"}, {"temp_c": 60.0}, ts=90.0)
>>> t.alert.status, t.previous, t.alert.ends_at
('resolved', 'firing', 90.0)
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace

import orjson

from ragwatch.schema import Alert, AlertStatus
from ragwatch.streams.rules import Rule


def fingerprint(rule_name: str, labels: Mapping[str, str]) -> str:
    """Stable id of an alert: hash of the rule name and its sorted labels."""
    raw = orjson.dumps([rule_name, sorted(labels.items())])
    return hashlib.sha256(raw).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Transition:
    """One alert changing state; ``previous`` is inactive, pending or firing."""

    alert: Alert
    previous: str

    @property
    def notify(self) -> bool:
        """Whether receivers should hear about it (firing, or resolved after firing)."""
        return self.alert.status == "firing" or (
            self.alert.status == "resolved" and self.previous == "firing"
        )


@dataclass(slots=True)
class _State:
    status: AlertStatus
    starts_at: float
    last_ts: float
    alert: Alert
    cleared_since: float | None = None  # firing, but its resolve condition holds since


class AlertEngine:
    """Keeps the state of every active alert and turns evaluations into transitions."""

    def __init__(self) -> None:
        self._states: dict[str, _State] = {}
        self.out_of_order = 0

    @property
    def active(self) -> dict[str, Alert]:
        """Pending and firing alerts by fingerprint."""
        return {fp: s.alert for fp, s in self._states.items()}

    @staticmethod
    def alert_key(rule: Rule, series_labels: Mapping[str, str]) -> tuple[dict[str, str], str]:
        """The labels and fingerprint of ``rule``'s alert on a series: a pipeline computes
        them once per (series, rule) and passes them to :meth:`evaluate_key`."""
        labels = {"alertname": rule.name, "severity": rule.severity, **series_labels, **rule.labels}
        return labels, fingerprint(rule.name, labels)

    def is_active(self, fp: str) -> bool:
        """Whether the alert with fingerprint ``fp`` is pending or firing."""
        return fp in self._states

    def evaluate(
        self,
        rule: Rule,
        series_labels: Mapping[str, str],
        signals: Mapping[str, float | None],
        ts: float,
    ) -> Transition | None:
        labels, fp = self.alert_key(rule, series_labels)
        return self.evaluate_key(rule, labels, fp, signals, ts)

    def evaluate_key(
        self,
        rule: Rule,
        labels: dict[str, str],
        fp: str,
        signals: Mapping[str, float | None],
        ts: float,
    ) -> Transition | None:
        """:meth:`evaluate` with the alert's labels and fingerprint already computed."""
        state = self._states.get(fp)
        if state is not None and ts < state.last_ts:
            self.out_of_order += 1
            return None
        holds = rule.holds(signals)
        if state is None:
            if not holds:
                return None
            alert = self._alert(rule, labels, signals, fp, "pending", ts, None, ts)
            self._states[fp] = _State("pending", ts, ts, alert)
            if rule.for_s <= 0:
                return self._fire(fp, rule, labels, signals, ts, previous="inactive")
            return Transition(alert, "inactive")
        state.last_ts = ts
        if state.status == "firing":
            return self._while_firing(state, fp, rule, labels, signals, ts)
        if not holds:
            del self._states[fp]
            alert = self._alert(rule, labels, signals, fp, "resolved", state.starts_at, ts, ts)
            return Transition(alert, state.status)
        if ts - state.starts_at >= rule.for_s:
            return self._fire(fp, rule, labels, signals, ts, previous="pending")
        # Still pending or firing: refresh value and annotations, no transition.
        state.alert = self._alert(
            rule, labels, signals, fp, state.status, state.starts_at, None, ts
        )
        return None

    def export(self, match: Callable[[Mapping[str, str]], bool]) -> dict[str, _State]:
        """The states of the active alerts whose labels ``match`` (for a snapshot)."""
        return {fp: s for fp, s in self._states.items() if match(s.alert.labels)}

    def restore(self, states: Mapping[str, _State], rules: Collection[str]) -> int:
        """Adopt states from a snapshot: only alerts of ``rules`` that are not active here
        (what this engine already knows is newer). Returns how many it adopted."""
        n = 0
        for fp, state in states.items():
            if fp not in self._states and state.alert.rule in rules:
                self._states[fp] = state
                n += 1
        return n

    def forget(self, match: Callable[[Mapping[str, str]], bool]) -> int:
        """Drop the states of the alerts whose labels ``match``, without a transition
        (another worker owns their host or service now); returns how many."""
        gone = [fp for fp, s in self._states.items() if match(s.alert.labels)]
        for fp in gone:
            del self._states[fp]
        return len(gone)

    def clear(self, match: Mapping[str, str], ts: float) -> list[Transition]:
        """Resolve every active alert whose labels include ``match`` (its series is gone)."""
        out = []
        for fp, state in list(self._states.items()):
            labels = state.alert.labels
            if all(labels.get(k) == v for k, v in match.items()):
                del self._states[fp]
                a = state.alert
                end = max(ts, state.last_ts)
                resolved = replace(a, status="resolved", ends_at=end, at=end)
                out.append(Transition(resolved, state.status))
        return out

    def _while_firing(
        self,
        state: _State,
        fp: str,
        rule: Rule,
        labels: dict[str, str],
        signals: Mapping[str, float | None],
        ts: float,
    ) -> Transition | None:
        if not rule.cleared(signals):
            state.cleared_since = None
        else:
            if state.cleared_since is None:
                state.cleared_since = ts
            if ts - state.cleared_since >= rule.keep_firing_for_s:
                del self._states[fp]
                alert = self._alert(rule, labels, signals, fp, "resolved", state.starts_at, ts, ts)
                return Transition(alert, "firing")
        state.alert = self._alert(rule, labels, signals, fp, "firing", state.starts_at, None, ts)
        return None

    def _fire(
        self,
        fp: str,
        rule: Rule,
        labels: dict[str, str],
        signals: Mapping[str, float | None],
        ts: float,
        previous: str,
    ) -> Transition:
        state = self._states[fp]
        state.status = "firing"
        state.alert = self._alert(rule, labels, signals, fp, "firing", state.starts_at, None, ts)
        return Transition(state.alert, previous)

    @staticmethod
    def _alert(
        rule: Rule,
        labels: dict[str, str],
        signals: Mapping[str, float | None],
        fp: str,
        status: AlertStatus,
        starts_at: float,
        ends_at: float | None,
        at: float,
    ) -> Alert:
        value = rule.value(signals)
        return Alert(
            rule=rule.name,
            severity=rule.severity,
            status=status,
            labels=dict(labels),  # the caller's dict is reused across evaluations
            annotations=rule.render(labels, signals),
            value=0.0 if value != value else value,
            expected=rule.expected_value(signals),
            starts_at=starts_at,
            ends_at=ends_at,
            fingerprint=fp,
            at=at,
        )
