"""The alert engine's state machine, table-driven, in event time.

Each case feeds one series' ``temp_c`` to a ``temp_c > 80`` rule at given timestamps and
lists the transition expected after each step: ``(previous, status, starts_at,
ends_at)``, or ``None`` for no transition.
"""

from __future__ import annotations

import pytest

from ragwatch.schema import Alert, Transition
from ragwatch.streams.alerting.engine import AlertEngine, fingerprint
from ragwatch.streams.alerting.rules import Rule, parse_rule

HOT = 85.0
OK = 60.0

Expected = tuple[str, str, float, float | None] | None
Step = tuple[float, float | None, Expected]


def hot_rule(for_: str | float = "1m", **fields: object) -> Rule:
    return parse_rule(
        {
            "name": "GpuHot",
            "series": "gpu",
            "expr": "temp_c > 80",
            "for": for_,
            "severity": "critical",
            **fields,
        }
    )


CASES: dict[str, tuple[str | float, list[Step]]] = {
    "pending-firing-resolved": (
        "1m",
        [
            (0.0, HOT, ("inactive", "pending", 0.0, None)),
            (30.0, HOT, None),
            (59.9, HOT, None),
            (60.0, HOT, ("pending", "firing", 0.0, None)),
            (90.0, HOT, None),
            (120.0, OK, ("firing", "resolved", 0.0, 120.0)),
            (130.0, OK, None),
        ],
    ),
    "fires-late-when-samples-are-sparse": (
        "1m",
        [
            (1000.0, HOT, ("inactive", "pending", 1000.0, None)),
            (1045.0, HOT, None),
            (1090.0, HOT, ("pending", "firing", 1000.0, None)),
        ],
    ),
    "for-0-fires-at-once": (
        0,
        [
            (5.0, OK, None),
            (10.0, HOT, ("inactive", "firing", 10.0, None)),
            (20.0, HOT, None),
            (30.0, OK, ("firing", "resolved", 10.0, 30.0)),
        ],
    ),
    "pending-that-clears": (
        "1m",
        [
            (0.0, HOT, ("inactive", "pending", 0.0, None)),
            (30.0, OK, ("pending", "resolved", 0.0, 30.0)),
            (40.0, HOT, ("inactive", "pending", 40.0, None)),  # the timer starts over
            (99.0, HOT, None),
            (100.0, HOT, ("pending", "firing", 40.0, None)),
        ],
    ),
    "refires-with-a-new-start": (
        "10s",
        [
            (0.0, HOT, ("inactive", "pending", 0.0, None)),
            (10.0, HOT, ("pending", "firing", 0.0, None)),
            (20.0, OK, ("firing", "resolved", 0.0, 20.0)),
            (30.0, HOT, ("inactive", "pending", 30.0, None)),
            (40.0, HOT, ("pending", "firing", 30.0, None)),
        ],
    ),
    "missing-signal-neither-starts-nor-resolves": (
        "0s",
        [
            (0.0, None, None),
            (10.0, HOT, ("inactive", "firing", 10.0, None)),
            (20.0, None, None),  # unknown (no data, too little evidence): still firing
            (30.0, OK, ("firing", "resolved", 10.0, 30.0)),
        ],
    ),
    "missing-signal-drops-a-pending-alert": (
        "1m",
        [
            (0.0, HOT, ("inactive", "pending", 0.0, None)),
            (30.0, None, ("pending", "resolved", 0.0, 30.0)),  # `for` was not observed
        ],
    ),
    "never-holds": ("1m", [(float(t), OK, None) for t in range(0, 600, 60)]),
    "threshold-is-strict": (
        "0s",
        [
            (0.0, 80.0, None),
            (10.0, 80.01, ("inactive", "firing", 10.0, None)),
        ],
    ),
    "out-of-order-is-ignored": (
        "1m",
        [
            (100.0, HOT, ("inactive", "pending", 100.0, None)),
            (50.0, OK, None),  # older than the last evaluation: would have resolved it
            (160.0, HOT, ("pending", "firing", 100.0, None)),
            (150.0, OK, None),
            (170.0, HOT, None),
        ],
    ),
    "same-timestamp-is-not-out-of-order": (
        "1m",
        [
            (0.0, HOT, ("inactive", "pending", 0.0, None)),
            (0.0, OK, ("pending", "resolved", 0.0, 0.0)),
        ],
    ),
}


@pytest.mark.parametrize(("for_", "steps"), list(CASES.values()), ids=list(CASES))
def test_state_machine(for_: str | float, steps: list[Step]) -> None:
    eng, rule = AlertEngine(), hot_rule(for_)
    for i, (ts, temp, expected) in enumerate(steps):
        t = eng.evaluate(rule, {"host": "h1", "gpu": "0"}, {"temp_c": temp}, ts=ts)
        got = (
            None if t is None else (t.previous, t.alert.status, t.alert.starts_at, t.alert.ends_at)
        )
        assert got == expected, f"step {i} (ts={ts}, temp_c={temp})"


def test_out_of_order_evaluations_are_counted() -> None:
    eng, rule = AlertEngine(), hot_rule()
    labels = {"host": "h1"}
    eng.evaluate(rule, labels, {"temp_c": OK}, ts=100.0)
    eng.evaluate(rule, labels, {"temp_c": OK}, ts=50.0)  # no state: nothing to compare with
    assert eng.out_of_order == 0
    eng.evaluate(rule, labels, {"temp_c": HOT}, ts=200.0)
    for ts in (150.0, 199.9, 10.0):
        assert eng.evaluate(rule, labels, {"temp_c": OK}, ts=ts) is None
    assert eng.out_of_order == 3
    assert [a.status for a in eng.active.values()] == ["pending"]


# ---------------------------------------------------------------- the alert itself


def test_alert_carries_rule_labels_value_and_fingerprint() -> None:
    eng = AlertEngine()
    rule = hot_rule(
        0,
        expected=70,
        labels={"team": "infra"},
        annotations={"summary": "{host} GPU {gpu} at {temp_c:.0f} C"},
    )
    t = eng.evaluate(rule, {"host": "h1", "gpu": "3"}, {"temp_c": 91.2}, ts=5.0)
    assert t is not None
    a = t.alert
    assert (a.rule, a.severity, a.status) == ("GpuHot", "critical", "firing")
    assert a.labels == {
        "alertname": "GpuHot",
        "severity": "critical",
        "host": "h1",
        "gpu": "3",
        "team": "infra",
    }
    assert a.annotations == {"summary": "h1 GPU 3 at 91 C"}
    assert (a.value, a.expected) == (91.2, 70.0)
    assert a.fingerprint == fingerprint("GpuHot", a.labels)
    assert eng.active == {a.fingerprint: a}


def test_annotations_and_value_refresh_while_firing() -> None:
    eng = AlertEngine()
    rule = hot_rule("1m", annotations={"summary": "{temp_c:.0f} C"})
    labels = {"host": "h1"}
    eng.evaluate(rule, labels, {"temp_c": 81.0}, ts=0.0)
    (fp,) = eng.active
    assert eng.active[fp].annotations == {"summary": "81 C"}  # refreshed while pending too
    eng.evaluate(rule, labels, {"temp_c": 83.0}, ts=30.0)
    assert (eng.active[fp].value, eng.active[fp].annotations) == (83.0, {"summary": "83 C"})
    t = eng.evaluate(rule, labels, {"temp_c": 88.0}, ts=60.0)
    assert t is not None and t.alert.annotations == {"summary": "88 C"}
    assert eng.evaluate(rule, labels, {"temp_c": 95.0}, ts=90.0) is None
    firing = eng.active[fp]
    assert (firing.status, firing.value, firing.annotations) == (
        "firing",
        95.0,
        {"summary": "95 C"},
    )
    assert firing.starts_at == 0.0
    resolved = eng.evaluate(rule, labels, {"temp_c": 70.0}, ts=120.0)
    assert resolved is not None
    assert (resolved.alert.value, resolved.alert.annotations) == (70.0, {"summary": "70 C"})
    assert eng.active == {}


def test_unknown_value_is_reported_as_zero() -> None:
    eng = AlertEngine()
    rule = hot_rule("1m")
    eng.evaluate(rule, {"host": "h1"}, {"temp_c": HOT}, ts=0.0)
    t = eng.evaluate(rule, {"host": "h1"}, {"temp_c": None}, ts=10.0)
    assert t is not None and t.alert.status == "resolved" and t.alert.value == 0.0


def test_a_firing_alert_keeps_its_last_known_value_while_the_signal_is_unknown() -> None:
    eng = AlertEngine()
    rule = hot_rule(0)
    eng.evaluate(rule, {"host": "h1"}, {"temp_c": 91.0}, ts=0.0)
    assert eng.evaluate(rule, {"host": "h1"}, {"temp_c": None}, ts=10.0) is None
    (alert,) = eng.active.values()
    assert (alert.status, alert.value, alert.at) == ("firing", 91.0, 0.0)


def test_each_series_has_its_own_state() -> None:
    eng, rule = AlertEngine(), hot_rule("1m")
    eng.evaluate(rule, {"host": "h1"}, {"temp_c": HOT}, ts=0.0)
    eng.evaluate(rule, {"host": "h2"}, {"temp_c": HOT}, ts=30.0)
    t1 = eng.evaluate(rule, {"host": "h1"}, {"temp_c": HOT}, ts=60.0)
    t2 = eng.evaluate(rule, {"host": "h2"}, {"temp_c": HOT}, ts=60.0)
    assert t1 is not None and t1.alert.status == "firing"
    assert t2 is None
    assert sorted(a.status for a in eng.active.values()) == ["firing", "pending"]


def test_rules_do_not_share_state() -> None:
    eng = AlertEngine()
    a = hot_rule(0)
    b = parse_rule({"name": "GpuVeryHot", "series": "gpu", "expr": "temp_c > 90"})
    ta = eng.evaluate(a, {"host": "h1"}, {"temp_c": 95.0}, ts=0.0)
    tb = eng.evaluate(b, {"host": "h1"}, {"temp_c": 95.0}, ts=0.0)
    assert ta is not None and tb is not None
    assert ta.alert.fingerprint != tb.alert.fingerprint
    assert len(eng.active) == 2


# ---------------------------------------------------------------- fingerprints


def test_fingerprint_is_stable() -> None:
    labels = {"alertname": "GpuMemoryLeak", "host": "gpu-node-01", "pid": "4011"}
    # Redis state and receivers key alerts by this value: changing it orphans live alerts.
    assert fingerprint("GpuMemoryLeak", labels) == "117ce1cb9bd31805"


def test_fingerprint_ignores_label_order() -> None:
    a = {"host": "h1", "gpu": "0", "pid": "7"}
    b = {"pid": "7", "gpu": "0", "host": "h1"}
    assert fingerprint("R", a) == fingerprint("R", b)


@pytest.mark.parametrize(
    ("rule_name", "labels"),
    [
        ("R", {"host": "h2", "gpu": "0"}),
        ("R", {"host": "h1", "gpu": "1"}),
        ("R", {"host": "h1", "gpu": "0", "pid": "1"}),
        ("R", {"host": "h1"}),
        ("R", {"host": "h1", "gpu": "0 "}),
        ("R", {"gpu": "h1", "host": "0"}),
        ("S", {"host": "h1", "gpu": "0"}),
    ],
)
def test_fingerprint_differs_per_rule_and_labels(rule_name: str, labels: dict[str, str]) -> None:
    base = fingerprint("R", {"host": "h1", "gpu": "0"})
    assert fingerprint(rule_name, labels) != base


def test_fingerprint_is_16_hex_digits() -> None:
    fp = fingerprint("R", {})
    assert len(fp) == 16 and int(fp, 16) >= 0


# ---------------------------------------------------------------- clear


def _fire(eng: AlertEngine, rule: Rule, host: str, pid: str, ts: float = 0.0) -> str:
    t = eng.evaluate(rule, {"host": host, "gpu": "0", "pid": pid}, {"temp_c": HOT}, ts=ts)
    assert t is not None
    return t.alert.fingerprint


def test_clear_resolves_only_matching_alerts() -> None:
    eng, firing, pending = AlertEngine(), hot_rule(0), hot_rule("1h", labels={"kind": "slow"})
    gone = _fire(eng, firing, "h1", "1")
    gone_pending = _fire(eng, pending, "h1", "1")
    other_pid = _fire(eng, firing, "h1", "2")
    other_host = _fire(eng, firing, "h2", "1")
    eng.evaluate(firing, {"host": "h1", "gpu": "0", "pid": "1"}, {"temp_c": HOT}, ts=500.0)

    out = eng.clear({"host": "h1", "gpu": "0", "pid": "1"}, ts=800.0)

    by_fp = {t.alert.fingerprint: t for t in out}
    assert set(by_fp) == {gone, gone_pending}
    assert (by_fp[gone].previous, by_fp[gone].notify) == ("firing", True)
    assert (by_fp[gone_pending].previous, by_fp[gone_pending].notify) == ("pending", False)
    for t in out:
        assert (t.alert.status, t.alert.starts_at, t.alert.ends_at) == ("resolved", 0.0, 800.0)
    assert set(eng.active) == {other_pid, other_host}
    assert eng.clear({"host": "h1", "gpu": "0", "pid": "1"}, ts=900.0) == []


def test_clear_never_ends_before_the_last_evaluation() -> None:
    eng, rule = AlertEngine(), hot_rule(0)
    _fire(eng, rule, "h1", "1", ts=0.0)
    eng.evaluate(rule, {"host": "h1", "gpu": "0", "pid": "1"}, {"temp_c": HOT}, ts=500.0)
    (t,) = eng.clear({"host": "h1"}, ts=100.0)
    assert t.alert.ends_at == 500.0


def test_clear_matches_on_label_values_including_missing_ones() -> None:
    eng, rule = AlertEngine(), hot_rule(0)
    _fire(eng, rule, "h1", "1")
    assert eng.clear({"host": "h1", "container": "abc"}, ts=1.0) == []  # no such label
    # an empty match names no series: it resolves nothing (a series whose labels were
    # lost, e.g. from a spoiled snapshot, must not resolve every alert of the worker)
    assert eng.clear({}, ts=1.0) == []
    assert len(eng.clear({"host": "h1"}, ts=1.0)) == 1
    assert eng.active == {}


def _resolved_alert() -> Alert:
    return Alert(
        rule="GpuHot",
        severity="critical",
        status="resolved",
        labels={},
        annotations={},
        value=0.0,
        expected=None,
        starts_at=0.0,
        ends_at=1.0,
        fingerprint="0" * 16,
    )


# ---------------------------------------------------------------- notify


@pytest.mark.parametrize(
    ("status", "previous", "notify"),
    [
        ("pending", "inactive", False),
        ("firing", "inactive", True),
        ("firing", "pending", True),
        ("resolved", "pending", False),
        ("resolved", "firing", True),
    ],
)
def test_transition_notify_truth_table(status: str, previous: str, notify: bool) -> None:
    alert = Alert(
        rule="R",
        severity="warning",
        status=status,  # type: ignore[arg-type]
        labels={},
        annotations={},
        value=1.0,
        expected=None,
        starts_at=0.0,
        ends_at=1.0 if status == "resolved" else None,
        fingerprint="f" * 16,
    )
    assert Transition(alert, previous).notify is notify


def test_notify_over_a_whole_episode() -> None:
    eng, rule = AlertEngine(), hot_rule("1m")
    steps = [(0.0, HOT), (30.0, OK), (40.0, HOT), (100.0, HOT), (130.0, OK)]
    got = []
    for ts, temp in steps:
        t = eng.evaluate(rule, {"host": "h1"}, {"temp_c": temp}, ts=ts)
        if t is not None:
            got.append((t.alert.status, t.notify))
    assert got == [
        ("pending", False),
        ("resolved", False),
        ("pending", False),
        ("firing", True),
        ("resolved", True),
    ]


def test_firing_again_soon_after_resolving_is_a_flap() -> None:
    eng, rule = AlertEngine(flap_window_s=3600.0), hot_rule(0)
    labels = {"host": "h1"}
    first = eng.evaluate(rule, labels, {"temp_c": HOT}, ts=0.0)
    assert first is not None and not first.flapped
    eng.evaluate(rule, labels, {"temp_c": OK}, ts=60.0)  # resolved
    again = eng.evaluate(rule, labels, {"temp_c": HOT}, ts=1800.0)  # 29 min later: a flap
    assert again is not None and again.flapped and again.alert.status == "firing"
    eng.evaluate(rule, labels, {"temp_c": OK}, ts=1860.0)
    later = eng.evaluate(rule, labels, {"temp_c": HOT}, ts=1860.0 + 3601.0)  # over an hour
    assert later is not None and not later.flapped
    assert eng.flaps == {again.alert.fingerprint: 1}


def test_a_pending_alert_that_clears_is_no_flap_and_resolutions_say_why() -> None:
    eng, rule = AlertEngine(), hot_rule("1m")
    labels = {"host": "h1"}
    eng.evaluate(rule, labels, {"temp_c": HOT}, ts=0.0)
    dropped = eng.evaluate(rule, labels, {"temp_c": OK}, ts=30.0)
    assert dropped is not None and dropped.alert.resolution == "recovered"
    eng.evaluate(rule, labels, {"temp_c": HOT}, ts=40.0)
    fired = eng.evaluate(rule, labels, {"temp_c": HOT}, ts=100.0)
    assert fired is not None and fired.alert.status == "firing" and not fired.flapped
    (gone,) = eng.clear(labels, ts=500.0)
    assert gone.alert.resolution == "gone" and "silent" in gone.alert.annotations["resolution"]
    assert eng.flaps == {}
