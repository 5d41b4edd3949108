"""``deploy/grafana/ragwatch.json`` asks Prometheus only for what ``/metrics`` exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from ragwatch.console.serve import METRIC_NAMES

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "ragwatch.json"
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
            "or", "unless", "offset", "inf", "nan"}  # fmt: skip
RUNBOOK_PANELS = (
    "GPU memory used",
    "GPU memory growth",
    "Token throughput ratio (actual / forecast)",
    "Stage latency breakdown (P95)",
    "Alert timeline",
)


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers outside strings, label matchers,
    ranges and grouping clauses that are neither functions nor keywords."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set()
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr):
        after = expr[m.end() :].lstrip()
        if not after.startswith("(") and m.group() not in KEYWORDS:
            names.add(m.group())
    return names


def panels(node: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in node.get("panels", []):
        out.append(p)
        out += panels(p)
    return out


DASH = json.loads(DASHBOARD.read_text())
TARGETS = [
    (p["title"], t["expr"]) for p in panels(DASH) if p["type"] != "row" for t in p["targets"]
]


def test_the_parser_finds_names_not_functions_labels_or_keywords() -> None:
    expr = 'max by (host, gpu) (rate(a_total{x="b c", y=~"$h"}[5m])) / on(host) b < 168'
    assert metric_names(expr) == {"a_total", "b"}


@pytest.mark.parametrize(("title", "expr"), TARGETS)
def test_every_query_uses_only_exported_metrics(title: str, expr: str) -> None:
    names = metric_names(expr)
    assert names, f"{title}: no metric in {expr!r}"
    assert names <= METRIC_NAMES, f"{title}: {sorted(names - METRIC_NAMES)} not exported"


def test_variables_use_exported_metrics_and_panels_the_prometheus_datasource() -> None:
    for var in DASH["templating"]["list"]:
        if var["type"] == "query":
            (metric,) = re.findall(r"label_values\((\w+)(?:\{[^}]*\})?,", var["definition"])
            assert metric in METRIC_NAMES
    for p in panels(DASH):
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
            assert p["targets"], p["title"]


def test_the_runbook_panels_are_there_and_ids_are_unique() -> None:
    titles = [p["title"] for p in panels(DASH)]
    for title in RUNBOOK_PANELS:
        assert title in titles
    ids = [p["id"] for p in panels(DASH)]
    assert len(ids) == len(set(ids))
    assert DASH["uid"] == "ragwatch" and DASH["schemaVersion"] >= 36


def selectors(expr: str) -> list[tuple[str, str]]:
    """(metric, its label matchers) of each metric selector in a PromQL expression."""
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    return re.findall(r"\b(ragwatch_[a-z0-9_]+)(\{[^}]*\})?", expr)


@pytest.mark.parametrize(("title", "expr"), TARGETS)
def test_every_query_is_scoped_to_ragwatchs_job(title: str, expr: str) -> None:
    """Prometheus' own ALERTS, or another job's series of the same name, stay out."""
    found = selectors(expr)
    assert found, f"{title}: no ragwatch metric in {expr!r}"
    for metric, labels in found:
        assert 'job=~"$job"' in labels, f"{title}: {metric} is not scoped to $job"
    assert "ALERTS" not in metric_names(expr)


def test_one_unit_per_axis() -> None:
    """Each graph declares one unit and no series overrides it ("Requests/s and errors"
    once drew a ratio on a requests/s axis)."""
    for p in panels(DASH):
        if p["type"] not in ("timeseries", "bargauge"):
            continue
        unit = p["fieldConfig"]["defaults"].get("unit")
        assert unit, p["title"]
        for o in p["fieldConfig"]["overrides"]:
            props = {prop["id"] for prop in o["properties"]}
            assert "unit" not in props, p["title"]
            assert "custom.axisPlacement" not in props, p["title"]  # a second axis


def test_the_job_variable_defaults_to_ragwatch() -> None:
    (job,) = (v for v in DASH["templating"]["list"] if v["name"] == "job")
    assert job["current"]["value"] == "ragwatch" and job["definition"].startswith("label_values(")
