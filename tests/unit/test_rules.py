"""Alert rules: the YAML format, its parser, and how rules evaluate and render.

Every mistake in a rules file must be a :class:`~ragwatch.errors.ConfigError` that names
the rule and the field, at load time, never an exception at alert time.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from ragwatch.catalog import SERIES_LABELS, SERIES_SIGNALS
from ragwatch.errors import ConfigError
from ragwatch.streams.alerting.rules import Condition, Rule, load_rules, parse_expr, parse_rule

GIB = 1024.0**3


def rule(**fields: Any) -> Rule:
    return parse_rule({"name": "R", "series": "process", "expr": "gb_per_hour > 1", **fields})


def write(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "rules.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


# ---------------------------------------------------------------- expressions


@pytest.mark.parametrize(
    ("number", "threshold"),
    [
        ("1GB", 1e9),
        ("1.5GB", 1.5e9),
        ("1 GB", 1e9),
        ("1gb", 1e9),
        ("500MB", 5e8),
        ("2KB", 2e3),
        ("3TB", 3e12),
        ("1GiB", GIB),
        ("0.5GiB", GIB / 2),
        ("512MiB", 512 * 1024.0**2),
        ("4KiB", 4096.0),
        ("1TiB", 1024.0**4),
        ("1e9", 1e9),
        ("2.5e-3", 2.5e-3),
        (".5", 0.5),
        ("42", 42.0),
        ("-1", -1.0),
        ("+7", 7.0),
    ],
)
def test_numbers_and_units(number: str, threshold: float) -> None:
    (cond,) = parse_expr(f"mem_increase_bytes > {number}", "process", "rule R")
    assert cond == Condition("mem_increase_bytes", ">", pytest.approx(threshold))


@pytest.mark.parametrize(
    ("op", "holds_below", "holds_at", "holds_above"),
    [
        (">", False, False, True),
        (">=", False, True, True),
        ("<", True, False, False),
        ("<=", True, True, False),
        ("==", False, True, False),
        ("!=", True, False, True),
    ],
)
def test_operators(op: str, holds_below: bool, holds_at: bool, holds_above: bool) -> None:
    r = rule(expr=f"leak_score {op} 0.5")
    assert [r.holds({"leak_score": v}) for v in (0.4, 0.5, 0.6)] == [
        holds_below,
        holds_at,
        holds_above,
    ]


@pytest.mark.parametrize("spacing", ["gb_per_hour>1", "  gb_per_hour   >=   1  "])
def test_spacing_is_free(spacing: str) -> None:
    (cond,) = parse_expr(spacing, "process", "rule R")
    assert cond.signal == "gb_per_hour"


def test_and_joins_conditions() -> None:
    r = rule(expr="mem_increase_bytes > 1GB and gb_per_hour >= 0.5 and tte_h < 24")
    assert [c.signal for c in r.conditions] == ["mem_increase_bytes", "gb_per_hour", "tte_h"]
    ok = {"mem_increase_bytes": 2e9, "gb_per_hour": 1.2, "tte_h": 10.0}
    assert r.holds(ok)
    for key in ok:
        assert not r.holds(
            {**ok, key: {"mem_increase_bytes": 0.5e9, "gb_per_hour": 0.1, "tte_h": 30.0}[key]}
        )


def test_missing_none_and_nan_signals_do_not_hold() -> None:
    r = rule(expr="gb_per_hour > 1")
    assert not r.holds({})
    assert not r.holds({"gb_per_hour": None})
    assert not r.holds({"gb_per_hour": math.nan})
    r_ne = rule(expr="gb_per_hour != 1")
    assert not r_ne.holds({"gb_per_hour": math.nan})


def test_value_is_the_first_conditions_signal() -> None:
    r = rule(expr="mem_increase_bytes > 1GB and gb_per_hour > 0.5")
    assert r.value({"mem_increase_bytes": 2.5e9, "gb_per_hour": 1.2}) == 2.5e9
    assert math.isnan(r.value({"gb_per_hour": 1.2}))
    assert math.isnan(r.value({"mem_increase_bytes": None}))


def test_each_series_has_its_own_signals() -> None:
    assert parse_expr("temp_c > 80", "gpu", "rule R")[0].signal == "temp_c"
    with pytest.raises(ConfigError, match=r"rule R\.expr: unknown signal 'temp_c'.*'process'"):
        parse_expr("temp_c > 80", "process", "rule R")
    with pytest.raises(ConfigError, match="unknown signal 'pid'"):
        parse_expr("pid > 80", "gpu", "rule R")


@pytest.mark.parametrize(
    "expr",
    [
        "gb_per_hour",  # no operator
        "gb_per_hour =< 1",
        "gb_per_hour => 1",
        "gb_per_hour = 1",
        "gb_per_hour <> 1",
        "gb_per_hour > ",
        "gb_per_hour > one",
        "gb_per_hour > 1PB",
        "gb_per_hour > 1 GBs",
        "gb_per_hour > nan",
        "gb_per_hour > inf",
        "1 < gb_per_hour",
        "gb_per_hour > 1 or leak_score > 0.5",
        "gb_per_hour > 1 AND leak_score > 0.5",
        "gb_per_hour > 1 and",
        "",
        "Gb_per_hour > 1",
    ],
)
def test_bad_terms(expr: str) -> None:
    with pytest.raises(ConfigError, match=r"rule R\.expr"):
        rule(expr=expr)


# ---------------------------------------------------------------- rules


def test_full_rule() -> None:
    r = parse_rule(
        {
            "name": "GpuHot",
            "series": "gpu",
            "expr": "temp_c >= 85 and power_w > 600",
            "for": "5m",
            "severity": "critical",
            "expected": 70,
            "labels": {"team": "infra"},
            "annotations": {"summary": "{host} GPU {gpu} ({gpu_name}) at {temp_c:.0f} C"},
        }
    )
    assert r.name == "GpuHot" and r.series == "gpu"
    assert r.for_s == 300.0
    assert r.severity == "critical"
    assert r.expected == 70.0 and isinstance(r.expected, float)
    assert r.labels == {"team": "infra"}
    assert r.render({"host": "h1", "gpu": "3", "gpu_name": "H100"}, {"temp_c": 91.4}) == {
        "summary": "h1 GPU 3 (H100) at 91 C"
    }


def test_defaults() -> None:
    r = parse_rule({"name": "R", "expr": "gb_per_hour > 1"})
    assert (r.series, r.for_s, r.severity, r.expected) == ("process", 0.0, "warning", None)
    assert r.labels == {} and r.annotations == {}


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("90", 90.0),
        ("30s", 30.0),
        ("10m", 600.0),
        ("1.5h", 5400.0),
        ("1d", 86400.0),
        (0, 0.0),
        (45, 45.0),
        (2.5, 2.5),
        ("250ms", 0.25),
    ],
)
def test_for_durations(value: Any, seconds: float) -> None:
    assert rule(**{"for": value}).for_s == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"name": None}, r"^rule\.name: required"),
        ({"name": "has space"}, r"^rule\.name: required"),
        ({"name": "9lives"}, r"^rule\.name: required"),
        ({"name": 7}, r"^rule\.name: required"),
        ({"series": "host"}, r"^rule R\.series: must be one of process, gpu"),
        ({"series": None}, r"^rule R\.series"),
        ({"expr": None}, r"^rule R\.expr: required string"),
        ({"expr": 5}, r"^rule R\.expr: required string"),
        ({"expr": "temp_c > 1"}, r"^rule R\.expr: unknown signal 'temp_c'"),
        ({"expr": "gb_per_hour >> 1"}, r"^rule R\.expr: cannot parse 'gb_per_hour >> 1'"),
        ({"for": "10 minutes"}, r"^rule R\.for: bad duration"),
        ({"for": "10m30s"}, r"^rule R\.for: bad duration"),
        ({"for": -1}, r"^rule R\.for: duration must be finite and >= 0"),
        ({"for": "-1m"}, r"^rule R\.for: bad duration"),
        ({"for": True}, r"^rule R\.for: bad duration"),
        ({"for": None}, r"^rule R\.for: bad duration"),
        ({"severity": "fatal"}, r"^rule R\.severity: must be one of critical, error, warning"),
        ({"severity": "CRITICAL"}, r"^rule R\.severity"),
        ({"summary": "x"}, r"^rule: unknown field\(s\) summary"),
        ({"summary": "x", "runbook": "y"}, r"^rule: unknown field\(s\) runbook, summary"),
        ({"labels": {"team": 1}}, r"^rule R\.labels\.team: expected a string, got 1$"),
        ({"labels": ["team"]}, r"^rule R\.labels: expected a mapping of names to strings"),
        ({"labels": {"te am": "x"}}, r"^rule R\.labels: 'te am' is not a label name"),
        ({"labels": {3: "x"}}, r"^rule R\.labels: expected a label name, got 3$"),
        ({"annotations": {"summary": None}}, r"^rule R\.annotations\.summary: expected a str"),
        ({"annotations": "summary"}, r"^rule R\.annotations: expected a mapping of names"),
        ({"expr": "gb_per_hour > 1e999"}, r"^rule R\.expr: the threshold of gb_per_hour must"),
        ({"expr": "gb_per_hour > 1e300TB"}, r"^rule R\.expr: the threshold .* got 1e300TB$"),
        ({"expected": "1e999"}, r"^rule R\.expected: must be a finite number .*'1e999'$"),
        ({"expected": [0]}, r"^rule R\.expected: must be a finite number .*, got a list$"),
        ({"for": "9" * 400 + "d"}, r"^rule R\.for: bad duration"),
        ({"expected": "zero"}, r"^rule R\.expected: unknown signal .zero. for .process."),
        ({"expected": True}, r"^rule R\.expected: must be a finite number"),
        (
            {"annotations": {"s": "{nope}"}},
            r"^rule R\.annotations\.s: unknown field\(s\) \['nope'\]",
        ),
        ({"annotations": {"s": "{temp_c}"}}, r"^rule R\.annotations\.s: unknown field"),
        ({"annotations": {"s": "{gpu_name}"}}, r"^rule R\.annotations\.s: unknown field"),
        ({"annotations": {"s": "{host.upper}"}}, r"^rule R\.annotations\.s: unknown field"),
        ({"annotations": {"s": "{0}"}}, r"^rule R\.annotations\.s: unknown field"),
        ({"annotations": {"s": "{host"}}, r"^rule R\.annotations\.s: bad template"),
        ({"annotations": {"s": "host}"}}, r"^rule R\.annotations\.s: bad template"),
        ({"annotations": {"s": "{}"}}, r"^rule R\.annotations\.s: bad template"),
        ({"annotations": {"s": "{gb_per_hour:d}"}}, r"^rule R\.annotations\.s: bad template"),
        ({"annotations": {"s": "{gb_per_hour!z}"}}, r"^rule R\.annotations\.s: bad template"),
    ],
)
def test_every_mistake_is_a_config_error_naming_rule_and_field(
    fields: dict[str, Any], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        rule(**fields)


def test_rule_must_be_a_mapping() -> None:
    with pytest.raises(ConfigError, match=r"^rules\[3\]: expected a mapping"):
        parse_rule(["name", "R"], "rules[3]")  # type: ignore[arg-type]


def test_templates_may_use_every_label_and_signal_of_their_series() -> None:
    for series in SERIES_SIGNALS:
        fields = (*SERIES_LABELS[series], *SERIES_SIGNALS[series])
        template = " ".join("{%s}" % f for f in fields)  # noqa: UP031
        r = parse_rule(
            {
                "name": "All",
                "series": series,
                "expr": f"{SERIES_SIGNALS[series][0]} > 1",
                "annotations": {"all": template},
            }
        )
        assert set(r.annotations) == {"all"}


def test_templates_may_use_the_rules_own_labels() -> None:
    r = rule(labels={"team": "ml"}, annotations={"s": "page {team}"})
    assert r.render({"team": "ml"}, {}) == {"s": "page ml"}


# ---------------------------------------------------------------- rendering


def test_render_formats_labels_and_signals() -> None:
    r = rule(
        annotations={
            "summary": "{process} on {host}: {gb_per_hour:.2f} GB/h",
            "raw": "{mem_increase_bytes}",
        }
    )
    out = r.render(
        {"process": "rag-worker", "host": "h1"},
        {"gb_per_hour": 1.23456, "mem_increase_bytes": 2.5e9},
    )
    assert out == {"summary": "rag-worker on h1: 1.23 GB/h", "raw": "2500000000.0"}


def test_render_marks_a_missing_label() -> None:
    r = rule(annotations={"s": "{process} on {host}"})
    assert r.render({"host": "h1"}, {}) == {"s": "n/a on h1"}


def test_render_of_a_none_signal_does_not_raise() -> None:
    r = rule(annotations={"s": "{gb_per_hour:.2f} GB/h, {tte_h:.1f} h left", "t": "{tte_s}"})
    out = r.render({}, {"gb_per_hour": None, "tte_h": None, "tte_s": None})
    assert set(out) == {"s", "t"}
    assert out == {"s": "n/a GB/h, n/a h left", "t": "n/a"}


def test_render_labels_win_over_signals_of_the_same_name() -> None:
    r = rule(annotations={"s": "{host}"})
    assert r.render({"host": "h1"}, {"host": 5.0}) == {"s": "h1"}  # type: ignore[dict-item]


def test_bug_render_of_a_missing_signal_with_a_format_spec() -> None:
    r = rule(annotations={"s": "{gb_per_hour:.2f} GB/h"})
    assert r.render({}, {}) == {"s": "n/a GB/h"}


# ---------------------------------------------------------------- files


def test_default_rules_load() -> None:
    rules = load_rules()
    by_name = {r.name: r for r in rules}
    leak = by_name["GpuMemoryLeak"]
    assert leak.series == "process"
    assert leak.for_s == 300.0
    assert leak.severity == "critical"
    assert leak.expected == 0.0
    # judged by the time to OOM at the leak rate (issue 30): critical within 2 days
    assert leak.conditions == (Condition("tte_h", "<", 48.0),)
    # resolved only when both horizons show the growth gone (a sawtooth's recent slope
    # goes negative at each collection, its floor does not)
    assert leak.resolve == ((
        Condition("floor_gb_per_hour", "<", 0.05),
        Condition("recent_gb_per_hour", "<", 0.2),
    ),)  # fmt: skip
    assert leak.labels == {"team": "ml-platform"}
    assert {"summary", "description", "runbook"} <= set(leak.annotations)
    slow = by_name["GpuMemoryLeakSlow"]  # days to OOM: a warning, not a wake-up
    assert (slow.series, slow.severity) == ("process", "warning")
    assert slow.conditions == (Condition("tte_h", ">=", 48.0), Condition("tte_h", "<", 336.0))
    assert slow.resolve == leak.resolve


def test_default_leak_rule_renders_an_actionable_summary() -> None:
    (leak,) = [r for r in load_rules() if r.name == "GpuMemoryLeak"]
    labels = {
        "host": "gpu-node-01",
        "gpu": "1",
        "uuid": "GPU-x",
        "mig": "",
        "pid": "4011",
        "process": "rag-worker",
        "container": "abc",
    }
    signals = {
        "leak_gb_per_hour": 1.2,
        "recent_gb_per_hour": 1.25,
        "floor_gb_per_hour": 1.1,
        "gb_per_hour": 1.1,
        "tte_h": 11.5,
    }
    out = leak.render(labels, signals)
    summary = "GPU memory leak: rag-worker (pid 4011) on gpu-node-01 GPU 1 grows 1.20 GB/h"
    assert out["summary"] == summary + ", OOM in ~12 h"
    assert "last 30 min 1.25 GB/h" in out["description"]
    assert "low-water mark 1.10 GB/h over 2 h" in out["description"]
    assert "~11.5 h" in out["description"]
    assert "<" not in "".join(out.values())


def test_default_outlier_cluster_summary_counts_the_cluster() -> None:
    (rule,) = [r for r in load_rules() if r.name == "RequestOutlierCluster"]
    labels = {"service": "rag-api", "instance": "rag-api-1"}
    # the cluster's members are clustered, so the recent outlier count can be 0 beside it
    signals = {"new_outlier_cluster": 1.0, "outlier_cluster_size": 23.0, "recent_outliers": 0.0}
    assert rule.render(labels, signals)["summary"] == (
        "rag-api (rag-api-1): a new cluster of 23 unusual requests far from the usual traffic"
    )


def test_load_rules_from_a_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
rules:
  - name: LeakFast
    expr: gb_per_hour > 5 and mem_increase_bytes > 512MiB
    for: 2m
    severity: error
  - name: GpuFull
    series: gpu
    expr: fb_used_ratio >= 0.97
""",
    )
    a, b = load_rules(path)
    assert (a.name, a.for_s, a.severity) == ("LeakFast", 120.0, "error")
    assert a.conditions[1].threshold == 512 * 1024**2
    assert (b.name, b.series, b.for_s) == ("GpuFull", "gpu", 0.0)


def test_an_empty_rules_list_is_refused(tmp_path: Path) -> None:
    """A rules file with no rule would never page: refused, naming the file and line."""
    path = write(tmp_path, "# our rules\nrules: []\n")
    with pytest.raises(ConfigError) as err:
        load_rules(path)
    assert str(err.value) == (
        f"{path}:2:8: rules: the list is empty: without a rule nothing would ever page "
        "(set no rules file to run the shipped default rules)"
    )


def test_a_number_yaml_reads_as_a_string_is_still_a_number() -> None:
    assert rule(expected="1e3").expected == 1000.0  # YAML 1.1 reads 1e3 (no dot) as text


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", r"expected a top-level 'rules:' list"),
        ("{}", r"expected a top-level 'rules:' list"),
        ("rules:\n", r"expected a top-level 'rules:' list"),
        ("rules: {name: R}\n", r"expected a top-level 'rules:' list"),
        ("- name: R\n  expr: gb_per_hour > 1\n", r"expected a top-level 'rules:' list"),
        ("rules: [\n", r":2:1: expected the node content, but found '<stream end>'"),
        ("rules:\n  - name: R\n   expr: x\n", r":3:4: expected <block end>, but found"),
        (
            "rules:\n  - name: A\n    expr: gb_per_hour > 1\n  - name: A\n    expr: tte_h < 1\n",
            r":4:11: rules\[1\]\.name: duplicate rule name 'A' \(rules\[0\] has it\)$",
        ),
        (
            "rules:\n  - name: A\n    expr: gb_per_hour > 1\n  - oops\n",
            r":4:5: rules\[1\]: expected a mapping, got the string 'oops'$",
        ),
        (
            "rules:\n  - name: A\n    expr: gb_per_hour > 1\n  - name: B\n    expr: x >> 1\n",
            r":5:11: rules\[1\]\.expr: cannot parse 'x >> 1'",
        ),
    ],
    ids=[
        "empty",
        "empty-map",
        "null-rules",
        "map-rules",
        "top-level-list",
        "unclosed",
        "bad-indent",
        "duplicates",
        "not-a-mapping",
        "bad-expr",
    ],
)
def test_bad_files(tmp_path: Path, text: str, match: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=match) as err:
        load_rules(path)
    assert str(err.value).startswith(f"{path}:" if match.startswith(":") else f"{path}: ")
    assert "\n" not in str(err.value)


def test_unreadable_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=rf"rules file {missing}: No such file"):
        load_rules(missing)
    with pytest.raises(ConfigError, match="Is a directory"):
        load_rules(tmp_path)


def test_bug_non_utf8_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        load_rules(write(tmp_path, b"\xff\xfe r\x00u\x00l\x00e\x00s\x00"))


def test_bug_unhashable_series_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"rule R\.series"):
        rule(series=["process"])


@pytest.mark.parametrize(
    "fields",
    [{"for": math.nan}, {"for": math.inf}, {"expected": math.nan}, {"expected": math.inf}],
    ids=["for-nan", "for-inf", "expected-nan", "expected-inf"],
)
def test_bug_non_finite_numbers_are_config_errors(fields: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        rule(**fields)


def test_expected_may_name_the_forecast_signal() -> None:
    r = rule(series="service", expr="tpr_deviation < -0.25", expected="tpr_forecast")
    assert r.expected_value({"tpr_forecast": 250.0}) == 250.0
    assert r.expected_value({"tpr_forecast": None}) is None


def test_value_names_the_signal_the_alert_reports() -> None:
    rule = parse_rule(
        {"name": "Slow", "series": "service", "expr": "retriever_p99_ratio > 3",
         "value": "retriever_p99_ms", "expected": "retriever_p99_baseline_ms"}
    )  # fmt: skip
    signals = {
        "retriever_p99_ratio": 4.0,
        "retriever_p99_ms": 480.0,
        "retriever_p99_baseline_ms": 120.0,
    }
    assert (rule.value(signals), rule.expected_value(signals)) == (480.0, 120.0)
    with pytest.raises(ConfigError, match="value: unknown signal"):
        parse_rule({"name": "X", "series": "service", "expr": "rps > 1", "value": "nope"})


def test_keep_firing_requests_is_for_series_that_count_requests() -> None:
    ok = parse_rule(
        {"name": "A", "series": "service", "expr": "rps > 1", "keep_firing_requests": 200}
    )
    assert ok.keep_firing_requests == 200
    with pytest.raises(ConfigError, match="only for series that count requests"):
        parse_rule({"name": "B", "series": "gpu", "expr": "temp_c > 1", "keep_firing_requests": 5})
    with pytest.raises(ConfigError, match="integer >= 0"):
        parse_rule(
            {"name": "C", "series": "service", "expr": "rps > 1", "keep_firing_requests": -1}
        )


# ---------------------------------------------------------------- file and line (issue 29, point 9)

RULES_WITH_A_BAD_FOURTH = """\
rules:
  - {name: A, series: gpu, expr: temp_c > 90}
  - {name: B, series: gpu, expr: temp_c > 95}
  - name: C
    series: gpu
    expr: fb_used_ratio > 0.97
  - name: D
    series: gpu
    for: 5m
    severity: critical
    # the threshold is beyond any float
    expr: fb_used_bytes > 1e999
"""


def test_a_bad_value_names_the_file_the_line_and_the_path(tmp_path: Path) -> None:
    path = write(tmp_path, RULES_WITH_A_BAD_FOURTH)
    with pytest.raises(ConfigError) as err:
        load_rules(path)
    assert str(err.value) == (
        f"{path}:12:11: rules[3].expr: the threshold of fb_used_bytes must be a finite number, "
        "got 1e999"
    )


def test_a_yaml_syntax_error_is_one_line_with_file_line_and_column(tmp_path: Path) -> None:
    path = write(
        tmp_path, "rules:\n  - name: A\n    expr: temp_c > 1\n    series: gpu\n  severity: x\n"
    )
    with pytest.raises(ConfigError) as err:
        load_rules(path)
    message = str(err.value)
    assert message.startswith(f"{path}:5:3: expected <block end>, but found '?'")
    assert "\n" not in message and "<unicode string>" not in message


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "rules:\n  - name: A\n    series: gpu\n    expr: temp_c > 90\n    expr: temp_c > 50\n",
            ":5:5: duplicate key 'expr' (first at 4:5)",
        ),
        (
            "rules:\n  - {name: A, series: gpu, expr: temp_c > 90}\nalerts: []\n",
            ":3:9: alerts: unknown field (a rules file holds one list, rules:)",
        ),
        (
            "groups:\n  - name: g\n    rules: []\n",
            ": expected a top-level 'rules:' list (this looks like a Prometheus rules file: "
            "ragwatch's has no groups)",
        ),
        (
            "rules:\n  - {name: A, series: gpu, expr: temp_c > 90, labels: {team: [ml]}}\n",
            ":2:62: rules[0].labels.team: expected a string, got a list",
        ),
        (
            "rules:\n  - name: A\n    series: gpu\n    expr: temp_c > 90\n    expected: .inf\n",
            ":5:15: rules[0].expected: must be a finite number or a signal name, got inf",
        ),
    ],
    ids=["duplicate-key", "unknown-top-level", "prometheus-groups", "label-list", "expected-inf"],
)
def test_every_key_is_checked_where_it_is(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_rules(path)
    assert str(err.value) == f"{path}{message}"


def test_the_cli_prints_a_bad_rules_file_as_one_line_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ragwatch.cli import main

    path = write(tmp_path, RULES_WITH_A_BAD_FOURTH)
    env = {"RAGWATCH_RULES_FILE": str(path)}
    assert main(["replay", str(tmp_path / "recording.jsonl")], environ=env) == 2
    err = capsys.readouterr().err
    assert err == (
        f"ragwatch: error: {path}:12:11: rules[3].expr: the threshold of fb_used_bytes must be "
        "a finite number, got 1e999\n"
    )
