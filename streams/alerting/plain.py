"""Alert states as plain data: what a snapshot holds of the alert engine.

:func:`export_plain` gives the states of the active alerts that match (a snapshot's key's)
as str-keyed maps of strings and numbers, each alert in the wire form
(:func:`ragwatch.codec.to_dict`); :func:`states_of` reads them back, each equal to the one
exported, or raises ValueError (nothing is built from data of another shape), and
:meth:`~ragwatch.streams.alerting.engine.AlertEngine.restore` adopts them.

>>> from ragwatch.streams.alerting.engine import AlertEngine
>>> from ragwatch.streams.alerting.rules import parse_rule
>>> engine = AlertEngine()
>>> rule = parse_rule({"name": "Hot", "series": "gpu", "expr": "temp_c > 90", "for": "5m"})
>>> _ = engine.evaluate(rule, {"host": "h1"}, {"temp_c": 95.0}, 100.0)
>>> plain = export_plain(engine, lambda labels: labels.get("host") == "h1")
>>> plain[0]["status"], AlertEngine().restore(states_of(plain), {"Hot"})
('pending', 1)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from ragwatch.codec import to_dict
from ragwatch.errors import SchemaError
from ragwatch.schema import RESOLUTIONS, Alert, AlertStatus, check_header
from ragwatch.streams.alerting.engine import AlertEngine, AlertState

_STATE_STATUSES = ("pending", "firing")  # what an active alert's state can be


def export_plain(
    engine: AlertEngine, match: Callable[[Mapping[str, str]], bool]
) -> list[dict[str, Any]]:
    """:meth:`AlertEngine.export` as plain data (str keys, str, numbers, None)."""
    return [plain_state(fp, s) for fp, s in engine.export(match).items()]


def plain_state(fp: str, s: AlertState) -> dict[str, Any]:
    """One alert's state as plain data; its alert in the wire form (:func:`codec.to_dict`)."""
    a = s.alert
    return {
        "fingerprint": fp,
        "status": s.status,
        "starts_at": s.starts_at,
        "last_ts": s.last_ts,
        "alert": {**to_dict(a), "labels": dict(a.labels), "annotations": dict(a.annotations)},
        "cleared_since": s.cleared_since,
        "cleared_evidence": s.cleared_evidence,
    }


def states_of(plain: Sequence[Any]) -> dict[str, AlertState]:
    """The states :func:`plain_state` wrote, by fingerprint; ValueError if any is not of
    that shape. Numbers are taken as they are, inf and NaN included: an alert's value may be
    any float (the wire's :meth:`Alert.from_dict` would refuse them)."""
    if not isinstance(plain, list | tuple):
        raise ValueError(f"alert states: expected a list, got {type(plain).__name__}")
    out: dict[str, AlertState] = {}
    for d in plain:
        fp = _text(d, "fingerprint")
        status = _text(d, "status")
        if status not in _STATE_STATUSES:
            raise ValueError(f"alert state {fp}: status {status!r}")
        alert = _alert_of(_field(d, "alert"))
        if alert.fingerprint != fp:
            raise ValueError(f"alert state {fp}: holds the alert of {alert.fingerprint}")
        out[fp] = AlertState(
            cast(AlertStatus, status),
            _number(d, "starts_at"),
            _number(d, "last_ts"),
            alert,
            _opt_number(d, "cleared_since"),
            _opt_number(d, "cleared_evidence"),
        )
    return out


def _alert_of(d: Any) -> Alert:
    """An alert from :func:`codec.to_dict`'s form, every field of its type."""
    if not isinstance(d, Mapping):
        raise ValueError(f"alert: expected a map, got {type(d).__name__}")
    try:
        check_header(d, Alert.kind)
    except SchemaError as exc:
        raise ValueError(f"alert: {exc}") from None
    status = _text(d, "status")
    resolution = d.get("resolution")
    if status not in ("pending", "firing", "resolved"):
        raise ValueError(f"alert: status {status!r}")
    if resolution is not None and resolution not in RESOLUTIONS:
        raise ValueError(f"alert: resolution {resolution!r}")
    return Alert(
        rule=_text(d, "rule"),
        severity=_text(d, "severity"),
        status=cast(AlertStatus, status),
        labels=_text_map(d, "labels"),
        annotations=_text_map(d, "annotations"),
        value=_number(d, "value"),
        expected=_opt_number(d, "expected"),
        starts_at=_number(d, "starts_at"),
        ends_at=_opt_number(d, "ends_at"),
        fingerprint=_text(d, "fingerprint"),
        at=_opt_number(d, "at"),
        resolution=resolution,
    )


def _field(d: Any, key: str) -> Any:
    if not isinstance(d, Mapping) or key not in d:
        raise ValueError(f"alert state: {key} missing")
    return d[key]


def _text(d: Any, key: str) -> str:
    v = _field(d, key)
    if not isinstance(v, str):
        raise ValueError(f"alert state: {key} is {type(v).__name__}, not a string")
    return v


def _number(d: Any, key: str) -> float:
    v = _field(d, key)
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError(f"alert state: {key} is {type(v).__name__}, not a number")
    return v


def _opt_number(d: Any, key: str) -> float | None:
    return None if _field(d, key) is None else _number(d, key)


def _text_map(d: Any, key: str) -> dict[str, str]:
    v = _field(d, key)
    if not isinstance(v, Mapping) or not all(
        isinstance(k, str) and isinstance(x, str) for k, x in v.items()
    ):
        raise ValueError(f"alert state: {key} is not a map of strings")
    return dict(v)
