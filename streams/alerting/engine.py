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

>>> from ragwatch.streams.alerting.rules import parse_rule
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
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace

import orjson

from ragwatch.catalog import EVIDENCE_SIGNAL
from ragwatch.schema import Alert, AlertStatus, Transition
from ragwatch.streams.alerting.rules import Rule


def fingerprint(rule_name: str, labels: Mapping[str, str]) -> str:
    """Stable id of an alert: hash of the rule name and its sorted labels."""
    raw = orjson.dumps([rule_name, sorted(labels.items())])
    return hashlib.sha256(raw).hexdigest()[:16]


@dataclass(slots=True)
class AlertState:
    status: AlertStatus
    starts_at: float
    last_ts: float
    alert: Alert
    cleared_since: float | None = None  # firing, but its resolve condition holds since
    cleared_evidence: float | None = None  # the series' evidence counter at cleared_since


RESOLVED_SUMMARY = "resolved_summary"  # the annotation that is a recovered alert's summary
FLAP_WINDOW_S = 6 * 3600.0  # firing again this soon after resolving is a flap
MAX_RECENT_RESOLVED = 100_000  # resolved alerts remembered to count flaps


class AlertEngine:
    """Keeps the state of every active alert and turns evaluations into transitions.

    Resolutions say why (``Alert.resolution``): the condition cleared ("recovered"), the
    rule's baseline accepted the deviation as a new level ("relearned", with an
    annotation ``resolution`` that says so), or the series went silent ("gone"). A rule's
    ``resolved_summary`` annotation is the summary of its alert once it has recovered:
    what happened, in the past tense, and the engine adds how long it lasted (" after
    1.2 h"); the firing alert's ``description`` (the present, while it fires) is left
    out then. Pending and firing alerts never carry ``resolved_summary``. A firing alert
    whose series ended says so as its summary ("ended after 11.9 h: its series went
    silent (no data since then); while firing: ..."). An alert
    that fires again within ``flap_window_s`` of resolving is a flap: counted per
    fingerprint in :attr:`flaps` and marked on its transition.
    """

    def __init__(self, *, flap_window_s: float = FLAP_WINDOW_S) -> None:
        self._states: dict[str, AlertState] = {}
        self.out_of_order = 0
        self.flap_window_s = flap_window_s
        self.flaps: dict[str, int] = {}  # fingerprint -> times it fired again too soon
        self._resolved_at: dict[str, float] = {}  # fingerprint -> when it last resolved

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
            self._states[fp] = AlertState("pending", ts, ts, alert)
            if rule.for_s <= 0:
                return self._fire(fp, rule, labels, signals, ts, previous="inactive")
            return Transition(alert, "inactive")
        state.last_ts = ts
        if state.status == "firing":
            return self._while_firing(state, fp, rule, labels, signals, ts)
        if not holds:  # a pending alert whose condition stopped holding (or went unknown)
            del self._states[fp]
            alert = self._alert(rule, labels, signals, fp, "resolved", state.starts_at, ts, ts)
            return Transition(replace(alert, resolution="recovered"), state.status)
        if ts - state.starts_at >= rule.for_s:
            return self._fire(fp, rule, labels, signals, ts, previous="pending")
        # Still pending or firing: refresh value and annotations, no transition.
        state.alert = self._alert(
            rule, labels, signals, fp, state.status, state.starts_at, None, ts
        )
        return None

    def export(self, match: Callable[[Mapping[str, str]], bool]) -> dict[str, AlertState]:
        """The states of the active alerts whose labels ``match`` (for a snapshot)."""
        return {fp: s for fp, s in self._states.items() if match(s.alert.labels)}

    def restore(self, states: Mapping[str, AlertState], rules: Collection[str]) -> int:
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
        """Resolve every active alert whose labels include ``match`` (its series is gone).
        An empty ``match`` resolves nothing: no series is named by no labels."""
        if not match:
            return []
        gone = [
            fp
            for fp, state in self._states.items()
            if all(state.alert.labels.get(k) == v for k, v in match.items())
        ]
        return self.clear_fingerprints(gone, ts, "its series went silent (no data since then)")

    def clear_fingerprints(self, fps: Iterable[str], ts: float, note: str) -> list[Transition]:
        """Resolve the active alerts among ``fps`` as gone, with ``note`` as the reason (a
        series that ended, or whose workload changed under it)."""
        out = []
        for fp in fps:
            state = self._states.pop(fp, None)
            if state is None:
                continue
            a = state.alert
            end = max(ts, state.last_ts)
            resolved = replace(
                a,
                status="resolved",
                ends_at=end,
                at=end,
                resolution="gone",
                annotations=_gone(a, state.status, end, note),
            )
            self._remember(fp, state.status, end)
            out.append(Transition(resolved, state.status))
        return out

    def _while_firing(
        self,
        state: AlertState,
        fp: str,
        rule: Rule,
        labels: dict[str, str],
        signals: Mapping[str, float | None],
        ts: float,
    ) -> Transition | None:
        evidence = _evidence(rule, signals)
        if not rule.cleared(signals) or (rule.keep_firing_requests and evidence is None):
            state.cleared_since = state.cleared_evidence = None
        else:
            if state.cleared_since is None:
                state.cleared_since, state.cleared_evidence = ts, evidence
            seen = 0.0 if evidence is None else evidence - (state.cleared_evidence or 0.0)
            if (
                ts - state.cleared_since >= rule.keep_firing_for_s
                and seen >= rule.keep_firing_requests
            ):
                del self._states[fp]
                alert = self._alert(rule, labels, signals, fp, "resolved", state.starts_at, ts, ts)
                self._remember(fp, "firing", ts)
                return Transition(_resolution(rule, alert, signals), "firing")
        if all(c.known(signals) for c in rule.conditions):  # else keep the last known
            state.alert = self._alert(
                rule, labels, signals, fp, "firing", state.starts_at, None, ts
            )
        return None

    def _remember(self, fp: str, previous: str, ts: float) -> None:
        """A firing alert resolved at ``ts``: firing again soon after is a flap."""
        if previous != "firing":
            return
        recent = self._resolved_at
        recent.pop(fp, None)
        recent[fp] = ts
        while len(recent) > MAX_RECENT_RESOLVED:  # oldest first (insertion order)
            del recent[next(iter(recent))]

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
        last = self._resolved_at.pop(fp, None)
        flapped = last is not None and ts - last <= self.flap_window_s
        if flapped:
            self.flaps[fp] = self.flaps.get(fp, 0) + 1
        return Transition(state.alert, previous, flapped)

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
        annotations = rule.render(labels, signals)
        annotations.pop(RESOLVED_SUMMARY, None)  # only a recovered alert's (_resolution)
        return Alert(
            rule=rule.name,
            severity=rule.severity,
            status=status,
            labels=dict(labels),  # the caller's dict is reused across evaluations
            annotations=annotations,
            value=0.0 if value != value else value,
            expected=rule.expected_value(signals),
            starts_at=starts_at,
            ends_at=ends_at,
            fingerprint=fp,
            at=at,
        )


def _evidence(rule: Rule, signals: Mapping[str, float | None]) -> float | None:
    """The series' cumulative evidence counter, for ``keep_firing_requests``."""
    name = EVIDENCE_SIGNAL.get(rule.series)
    v = signals.get(name) if name is not None else None
    return None if v is None or v != v else float(v)


def _resolution(rule: Rule, alert: Alert, signals: Mapping[str, float | None]) -> Alert:
    """A firing alert's resolution: "relearned" if its baseline accepted a new level while
    it fired (and an annotation that says so, with the level before), else "recovered"
    (and, if the rule has a ``resolved_summary``, that as its summary)."""
    family = rule.baseline
    at = signals.get(f"{family}_relearned_at") if family else None
    if family is None or at is None or at < alert.starts_at:
        return _recovered(rule, alert, signals)
    before = signals.get(f"{family}_relearned_from")
    now = rule.expected_value(signals)
    note = (
        f"not recovered: the baseline accepted the new level "
        f"{(at - alert.starts_at) / 3600:.1f} h after the alert started"
    )
    if before is not None and now is not None:
        note += f" ({_num(now)} vs {_num(before)} before)"
    return replace(
        alert, resolution="relearned", annotations={**alert.annotations, "resolution": note}
    )


def _recovered(rule: Rule, alert: Alert, signals: Mapping[str, float | None]) -> Alert:
    """A recovered alert: its summary says what happened and how long it lasted, from the
    rule's ``resolved_summary`` over the signals at the resolution (else as it was)."""
    if RESOLVED_SUMMARY not in rule.annotations:
        return replace(alert, resolution="recovered")
    text = rule.render(alert.labels, signals)[RESOLVED_SUMMARY]
    ends = alert.ends_at if alert.ends_at is not None else alert.starts_at
    annotations = {k: v for k, v in alert.annotations.items() if k != "description"}
    annotations["summary"] = f"{text} after {lasted(ends - alert.starts_at)}"
    return replace(alert, resolution="recovered", annotations=annotations)


def _gone(alert: Alert, status: str, end: float, note: str) -> dict[str, str]:
    """The annotations of an alert resolved because its series ended: ``resolution`` says
    why; a firing one's summary says so in the past tense, and what it fired with."""
    ann = {**alert.annotations, "resolution": note}
    if status == "firing":
        ann.pop("description", None)  # the present while it fired (a time to OOM...)
        was = ann.get("summary")
        ann["summary"] = f"ended after {lasted(end - alert.starts_at)}: {note}" + (
            f"; while firing: {was}" if was else ""
        )
    return ann


def lasted(seconds: float) -> str:
    """How long an alert lasted, for a person: minutes under an hour, then hours, then days.

    >>> lasted(25 * 60), lasted(4320), lasted(3 * 86400)
    ('25 min', '1.2 h', '3.0 days')
    """
    if seconds < 3600:
        return f"{max(seconds, 0.0) / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _num(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
