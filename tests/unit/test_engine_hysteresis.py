"""keep_firing_for and a separate resolve condition (hysteresis), in event time."""

from __future__ import annotations

import pytest

from ragwatch.errors import ConfigError
from ragwatch.streams.alerting.engine import AlertEngine
from ragwatch.streams.alerting.rules import parse_rule

LABELS = {"host": "h1", "gpu": "0"}


def run(
    rule_fields: dict[str, object], series: list[tuple[float, float]]
) -> list[tuple[float, str]]:
    rule = parse_rule({"name": "Hot", "series": "gpu", "expr": "temp_c > 80", **rule_fields})
    eng = AlertEngine()
    out = []
    for ts, temp in series:
        t = eng.evaluate(rule, LABELS, {"temp_c": temp}, ts)
        if t is not None:
            out.append((ts, t.alert.status))
    return out


def test_without_either_a_dip_resolves_at_once() -> None:
    got = run({}, [(0, 85), (60, 85), (120, 79), (180, 85)])
    assert got == [(0, "firing"), (120, "resolved"), (180, "firing")]


def test_keep_firing_for_rides_out_a_short_dip() -> None:
    got = run({"keep_firing_for": "5m"}, [(0, 85), (60, 79), (120, 79), (180, 85), (240, 79)])
    assert got == [(0, "firing")]  # the dips never lasted 5 minutes


def test_keep_firing_for_resolves_after_the_condition_stays_false_that_long() -> None:
    got = run({"keep_firing_for": "2m"}, [(0, 85), (60, 79), (120, 79), (180, 79), (240, 79)])
    assert got == [(0, "firing"), (180, "resolved")]  # cleared since 60, +2 min


def test_resolve_condition_gives_hysteresis() -> None:
    rule = {"resolve": "temp_c < 70"}
    got = run(rule, [(0, 85), (60, 75), (120, 72), (180, 81), (240, 69), (300, 75)])
    # 75 and 72 are below the trigger but above the resolve line: still firing
    assert got == [(0, "firing"), (240, "resolved")]


def test_resolve_and_keep_firing_for_combine() -> None:
    rule = {"resolve": "temp_c < 70", "keep_firing_for": "1m"}
    got = run(rule, [(0, 85), (60, 65), (90, 75), (120, 65), (180, 65)])
    assert got == [(0, "firing"), (180, "resolved")]  # cleared again from 120, +1 min


def test_resolve_alternatives_joined_by_or_clear_on_either() -> None:
    rule = parse_rule({"name": "Hot", "series": "gpu", "expr": "temp_c > 80",
                       "resolve": "temp_c < 70 and power_w < 300 or gpu_util < 0.1"})  # fmt: skip
    eng = AlertEngine()

    def at(ts: float, temp: float, power: float, util: float) -> str | None:
        t = eng.evaluate(rule, LABELS, {"temp_c": temp, "power_w": power, "gpu_util": util}, ts)
        return None if t is None else t.alert.status

    assert at(0, 85, 400, 0.9) == "firing"
    assert at(60, 65, 400, 0.9) is None  # cool but drawing power: neither alternative
    assert at(120, 65, 250, 0.9) == "resolved"  # the first alternative, whole
    assert at(180, 85, 400, 0.9) == "firing"
    assert at(240, 85, 400, 0.05) == "resolved"  # the second, alone


def test_pending_still_drops_when_expr_stops_holding() -> None:
    got = run({"for": "5m", "resolve": "temp_c < 70"}, [(0, 85), (60, 75), (120, 85)])
    assert got == [(0, "pending"), (60, "resolved"), (120, "pending")]


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"resolve": 5}, r"rule Hot\.resolve: must be an expression string"),
        ({"resolve": "nope > 1"}, r"rule Hot\.resolve\.expr: unknown signal 'nope'"),
        ({"keep_firing_for": "soon"}, r"rule Hot\.keep_firing_for: bad duration"),
        ({"resolve": "temp_c < 70 or nope > 1"}, r"rule Hot\.resolve\.expr: unknown signal"),
        ({"expr": "temp_c > 80 or power_w > 400"}, r"rule Hot\.expr: .*'or' is for resolve"),
    ],
)
def test_bad_fields_are_config_errors(fields: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_rule({"name": "Hot", "series": "gpu", "expr": "temp_c > 80", **fields})
