"""Alert rules: a small, Prometheus-like YAML format and its parser.

A rule applies to every series of one ``series`` type (``process``: one compute process
on one GPU; ``gpu``: one GPU or MIG instance) and fires when its ``expr`` holds for
``for`` of event time. Once firing it resolves when ``resolve`` holds (a separate,
usually looser condition: hysteresis against flapping) or, without ``resolve``, when
``expr`` stops holding; ``keep_firing_for`` keeps it firing that much longer (Prometheus'
field of the same name), and for series that count requests ``keep_firing_requests``
also wants that many new requests seen meanwhile, so a quiet night cannot resolve an
alert on two requests. A signal without a value (no data, or too little evidence behind
it) neither starts, nor clears, nor resolves anything. ``value`` names the signal the
alert's value reports (default: ``expr``'s first), so that it can be in the units of
``expected`` (a P99 in ms beside its baseline, not their ratio)::

    rules:
      - name: GpuMemoryLeak
        series: process
        expr: mem_increase_bytes > 1GB
        for: 10m
        severity: critical
        expected: 0
        labels: {team: ml-platform}
        annotations:
          summary: "{process} (pid {pid}) on {host} GPU {gpu} grows {gb_per_hour:.2f} GB/h"

``expr`` is one or more ``signal OP number`` terms joined by ``and``; ``resolve`` may also
list alternatives joined by ``or`` (``and`` binds tighter: any alternative that holds
clears, as a P99 back under its baseline or evidence that the newest requests recovered
while the window still holds the fault's); OP is one of
``> >= < <= == !=``; numbers take the suffixes ``KB MB GB TB`` (powers of 1000) and
``KiB MiB GiB TiB``. Annotations are ``str.format`` templates over the alert's labels and
the series' signals. Everything is checked at load time: a bad rule is a
:class:`~ragwatch.errors.ConfigError` naming the field; from a file, its path, file and line
(``rules.yaml:12:11: rules[3].expr: ...``). Thresholds and numbers are finite, label and
annotation names follow Prometheus' rule for label names, a key given twice is an error,
and a file without a rule is refused (nothing would ever page).

>>> rule = parse_rule({"name": "Big", "series": "gpu", "expr": "fb_used_bytes > 1.5GB"})
>>> rule.conditions[0].threshold
1500000000.0
>>> rule.holds({"fb_used_bytes": 2e9})
True
"""

from __future__ import annotations

import math
import operator
import re
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ragwatch import yamlfile
from ragwatch.catalog import (
    BASELINES,
    EVIDENCE_SIGNAL,
    SERIES_LABELS,
    SERIES_SIGNALS,
)
from ragwatch.config import parse_duration
from ragwatch.errors import ConfigError

SEVERITIES = ("critical", "error", "warning", "info")
OPS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
}
UNITS = {
    "": 1.0,
    "KB": 1e3,
    "MB": 1e6,
    "GB": 1e9,
    "TB": 1e12,
    "KIB": 1024.0,
    "MIB": 1024.0**2,
    "GIB": 1024.0**3,
    "TIB": 1024.0**4,
}
_TERM = re.compile(
    r"^\s*([a-z_][a-z0-9_]*)\s*(>=|<=|==|!=|>|<)\s*([-+]?[0-9]*\.?[0-9]+(?:e[-+]?\d+)?)"
    r"\s*([KMGT]i?B)?\s*$",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Condition:
    signal: str
    op: str
    threshold: float

    def holds(self, signals: Mapping[str, float | None]) -> bool:
        v = signals.get(self.signal)
        return v is not None and not math.isnan(v) and OPS[self.op](v, self.threshold)

    def known(self, signals: Mapping[str, float | None]) -> bool:
        """Whether the signal has a value (None: no data, or too little evidence)."""
        v = signals.get(self.signal)
        return v is not None and not math.isnan(v)


@dataclass(frozen=True)
class Rule:
    name: str
    series: str
    conditions: tuple[Condition, ...]
    for_s: float = 0.0
    severity: str = "warning"
    expected: float | str | None = None  # a number, or the signal that holds the forecast
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    keep_firing_for_s: float = 0.0
    resolve: tuple[tuple[Condition, ...], ...] = ()  # alternatives ('or') of conjunctions
    keep_firing_requests: int = 0
    value_signal: str | None = None  # what the alert's value reports (default: expr's first)

    def holds(self, signals: Mapping[str, float | None]) -> bool:
        return all(c.holds(signals) for c in self.conditions)

    @property
    def reads(self) -> frozenset[str]:
        """The signals whose values decide whether an inactive alert starts (``expr``)."""
        return frozenset(c.signal for c in self.conditions)

    def cleared(self, signals: Mapping[str, float | None]) -> bool:
        """Whether a firing alert may resolve: its ``resolve`` condition holds (hysteresis),
        or, without one, its ``expr`` is known and no longer holds. A signal without a
        value (too little evidence) clears nothing."""
        if self.resolve:
            return any(all(c.holds(signals) for c in alt) for alt in self.resolve)
        return all(c.known(signals) for c in self.conditions) and not self.holds(signals)

    @property
    def baseline(self) -> str | None:
        """The baseline family whose forecast is this rule's ``expected`` (rules.BASELINES),
        if any: its re-learning is what a resolution must not call a recovery."""
        for family, signal in BASELINES.get(self.series, {}).items():
            if self.expected == signal:
                return family
        return None

    def expected_value(self, signals: Mapping[str, float | None]) -> float | None:
        """What the value should have been: the rule's number, or its forecast signal."""
        if isinstance(self.expected, str):
            v = signals.get(self.expected)
            return None if v is None or math.isnan(v) else float(v)
        return self.expected

    def value(self, signals: Mapping[str, float | None]) -> float:
        """The alert's value: the rule's ``value`` signal, else the first condition's (so
        that value and expected can be in the same units: a P99 and its baseline)."""
        v = signals.get(self.value_signal or self.conditions[0].signal)
        return float(v) if v is not None else math.nan

    def render(
        self, labels: Mapping[str, str], signals: Mapping[str, float | None]
    ) -> dict[str, str]:
        ctx = _Context({**{k: v for k, v in signals.items() if v is not None}, **labels})
        return {k: string.Formatter().vformat(t, (), ctx) for k, t in self.annotations.items()}


class _Unknown:
    """Stands in for a signal without a value; ignores the format spec."""

    def __format__(self, spec: str) -> str:
        return "n/a"


class _Context(dict[str, Any]):
    def __missing__(self, key: str) -> _Unknown:
        return _Unknown()


def _duration(v: Any, where: str) -> float:
    try:
        return parse_duration(v)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def parse_expr(expr: str, series: str, where: str) -> tuple[Condition, ...]:
    terms = re.split(r"\s+and\s+", expr.strip())
    conds = []
    for term in terms:
        m = _TERM.match(term)
        if not m:
            raise ConfigError(f"{where}.expr: cannot parse {term!r} (want 'signal > 1GB')")
        signal, op, num, unit = m.group(1), m.group(2), m.group(3), (m.group(4) or "")
        if signal not in SERIES_SIGNALS[series]:
            raise ConfigError(
                f"{where}.expr: unknown signal {signal!r} for series {series!r}; "
                f"known: {', '.join(SERIES_SIGNALS[series])}"
            )
        threshold = float(num) * UNITS[unit.upper()]
        if not math.isfinite(threshold):
            raise ConfigError(
                f"{where}.expr: the threshold of {signal} must be a finite number, got {num}{unit}"
            )
        conds.append(Condition(signal, op, threshold))
    return tuple(conds)


def _signal(v: Any, series: str, where: str) -> str | None:
    if v is None:
        return None
    if not isinstance(v, str) or v not in SERIES_SIGNALS[series]:
        raise ConfigError(f"{where}: unknown signal {v!r} for series {series!r}")
    return v


def _evidence(v: Any, series: str, where: str) -> int:
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ConfigError(f"{where}.keep_firing_requests: must be an integer >= 0, got {v!r}")
    if v and series not in EVIDENCE_SIGNAL:
        raise ConfigError(
            f"{where}.keep_firing_requests: only for series that count requests "
            f"({', '.join(EVIDENCE_SIGNAL)}), not {series!r}"
        )
    return v


def _resolve(v: Any, series: str, where: str) -> tuple[tuple[Condition, ...], ...]:
    """``resolve``'s alternatives: conjunctions joined by ``or``."""
    if v is None:
        return ()
    if not isinstance(v, str):
        raise ConfigError(f"{where}.resolve: must be an expression string")
    alts = re.split(r"\s+or\s+", v.strip())
    return tuple(parse_expr(alt, series, f"{where}.resolve") for alt in alts)


def _expected(v: Any, series: str, where: str) -> float | str | None:
    """A finite number, or the signal that holds the forecast. A number YAML 1.1 reads as
    a string (``1e3``: no dot) counts as the number."""
    if v is None or (isinstance(v, str) and v in SERIES_SIGNALS[series]):
        return v
    try:
        number = float(v) if isinstance(v, str | int | float) and not isinstance(v, bool) else None
    except ValueError:
        raise ConfigError(f"{where}: unknown signal {v!r} for {series!r}") from None
    if number is None or not math.isfinite(number):
        raise ConfigError(
            f"{where}: must be a finite number or a signal name, got {yamlfile.shown(v)}"
        )
    return number


def parse_rule(d: Mapping[str, Any], where: str = "rule") -> Rule:
    """One rule from its mapping; ``where`` names it in errors: ``rule`` (the default)
    becomes ``rule NAME``, a path from a file (``rules[3]``) stays, so its line is found."""
    if not isinstance(d, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {yamlfile.shown(d)}")
    known = {
        "name",
        "series",
        "expr",
        "for",
        "keep_firing_for",
        "resolve",
        "severity",
        "expected",
        "labels",
        "annotations",
        "keep_firing_requests",
        "value",
    }
    extra = {str(k) for k in d} - known
    if extra:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(sorted(extra))}")
    name = d.get("name")
    if not isinstance(name, str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
        raise ConfigError(f"{where}.name: required, letters/digits/underscore, got {name!r}")
    where = f"rule {name}" if where == "rule" else where
    series = d.get("series", "process")
    if not isinstance(series, str) or series not in SERIES_SIGNALS:
        raise ConfigError(f"{where}.series: must be one of {', '.join(SERIES_SIGNALS)}")
    if not isinstance(d.get("expr"), str):
        raise ConfigError(f"{where}.expr: required string")
    if re.search(r"\sor\s", d["expr"]):
        raise ConfigError(f"{where}.expr: terms join with 'and' ('or' is for resolve only)")
    severity = d.get("severity", "warning")
    if severity not in SEVERITIES:
        raise ConfigError(f"{where}.severity: must be one of {', '.join(SEVERITIES)}")
    labels = yamlfile.label_map(d.get("labels"), f"{where}.labels")
    annotations = yamlfile.label_map(d.get("annotations"), f"{where}.annotations")
    rule = Rule(
        name=name,
        series=series,
        conditions=parse_expr(d["expr"], series, where),
        for_s=_duration(d.get("for", 0), f"{where}.for"),
        keep_firing_for_s=_duration(d.get("keep_firing_for", 0), f"{where}.keep_firing_for"),
        keep_firing_requests=_evidence(d.get("keep_firing_requests"), series, where),
        value_signal=_signal(d.get("value"), series, f"{where}.value"),
        resolve=_resolve(d.get("resolve"), series, where),
        severity=severity,
        expected=_expected(d.get("expected"), series, f"{where}.expected"),
        labels=labels,
        annotations=annotations,
    )
    _check_templates(rule, where)
    return rule


def _check_templates(rule: Rule, where: str) -> None:
    labels = dict.fromkeys((*SERIES_LABELS[rule.series], "alertname", "severity"), "x")
    labels |= rule.labels
    signals: dict[str, float | None] = dict.fromkeys(SERIES_SIGNALS[rule.series], 1.0)
    for key, tmpl in rule.annotations.items():
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(tmpl) if f]
            unknown = [f for f in fields if f not in labels and f not in signals]
            if unknown:
                raise ConfigError(f"{where}.annotations.{key}: unknown field(s) {unknown}")
            rule.render(labels, signals)
        except (ValueError, IndexError, KeyError) as exc:
            raise ConfigError(f"{where}.annotations.{key}: bad template: {exc}") from None


def load_rules(path: Path | None = None) -> list[Rule]:
    """Rules from a YAML file, or the shipped defaults (``default_rules.yaml``); a
    ConfigError names the file, the line and the field."""
    if path is None:
        text = (
            resources.files("ragwatch.streams.alerting").joinpath("default_rules.yaml").read_text()
        )
        doc = yamlfile.parse(text, "default_rules.yaml")
    else:
        doc = yamlfile.read(Path(path), "rules file")
    try:
        return rules_of(doc.data)
    except ConfigError as exc:
        raise doc.locate(exc) from None


def rules_of(doc: Any) -> list[Rule]:
    """The rules of a decoded rules file (errors start with the path of the bad node)."""
    if not isinstance(doc, Mapping) or not isinstance(doc.get("rules"), list):
        hint = ""
        if isinstance(doc, Mapping) and "groups" in doc:
            hint = " (this looks like a Prometheus rules file: ragwatch's has no groups)"
        raise ConfigError(f"expected a top-level 'rules:' list{hint}")
    for key in doc:
        if key != "rules":
            raise ConfigError(f"{key}: unknown field (a rules file holds one list, rules:)")
    if not doc["rules"]:
        raise ConfigError(
            "rules: the list is empty: without a rule nothing would ever page "
            "(set no rules file to run the shipped default rules)"
        )
    rules = [parse_rule(r, f"rules[{i}]") for i, r in enumerate(doc["rules"])]
    first: dict[str, int] = {}
    for i, r in enumerate(rules):
        if r.name in first:
            raise ConfigError(
                f"rules[{i}].name: duplicate rule name {r.name!r} (rules[{first[r.name]}] has it)"
            )
        first[r.name] = i
    return rules
