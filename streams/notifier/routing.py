"""The notifier's configuration: receivers, the routing tree and inhibition rules.

A YAML file (``RAGWATCH_NOTIFY_FILE``) in Alertmanager's shape::

    receivers:
      - name: oncall
        type: pagerduty            # pagerduty | slack | webhook
        routing_key: ${PD_ROUTING_KEY}   # ${VAR}: read from the environment (secrets)
      - name: team-chat
        type: slack
        url: ${SLACK_WEBHOOK_URL}
    route:                         # the root: every alert enters here
      receiver: team-chat
      group_by: [alertname, host]  # '...' = every label (one group per alert)
      group_wait: 30s              # first notification of a new group
      group_interval: 5m           # changes to a group that was notified
      repeat_interval: 4h          # re-send a group that is still firing
      routes:                      # children, first match wins unless continue: true
        - matchers: {severity: critical}     # equality; "=~regex" for a regular expression
          receiver: oncall
          continue: true
    inhibit_rules:                 # a firing source mutes matching targets
      - source_matchers: {alertname: GpuOomKill}
        target_matchers: {alertname: GpuMemoryLeak}
        equal: [host, gpu]
        linger: 30m                # ours: the source mutes this long after it resolved

Inhibition follows Alertmanager (:class:`InhibitRule`): only a firing source mutes, a
label missing on both alerts counts as equal, and an alert matching both sides of a rule
is muted only by a source that does not match the target side, never by itself. Rules
that can match one alert on both sides, and cycles of rules that can mute each other's
sources, are accepted (as Alertmanager does) with a warning naming them.

Children inherit ``receiver``, ``group_by`` and the three intervals from their parent.
An alert goes to the deepest matching routes (first match per level, unless a route says
``continue: true``); with no matching child, the parent handles it. Without a file, the
notifier sends every transition of every alert at once to one ``webhook`` receiver per
URL in ``RAGWATCH_WEBHOOK_URLS`` (``group_by: ['...']``, no waits).

Times of the intervals are event time (the alerts' own ``at``), advancing with the wall
clock between alerts (see :mod:`ragwatch.streams.notifier.grouping`).

Every key is checked when the file is read, and an error names the file, the line and
the path of the bad value (``notify.yaml:7:5: route.routes[0].continue: expected true or
false, got the string 'false' (write false without quotes)``): unknown fields, booleans
that are strings, label names that are not label names (``group_by``, ``equal``, matcher
names), a root route with matchers (the alerts it does not match would go nowhere), an
inhibition rule without source or target matchers (it would mute on any alert), a
``repeat_interval`` of 0, and every receiver's own fields (before anything connects).

>>> cfg = parse_config({"receivers": [{"name": "w", "type": "webhook", "url": "http://x/h"}],
...                     "route": {"receiver": "w", "group_by": ["alertname"]}}, {})
>>> [r.receiver for r in cfg.route.match({"alertname": "A", "severity": "critical"})]
['w']
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ragwatch import yamlfile
from ragwatch.config import parse_duration
from ragwatch.errors import ConfigError
from ragwatch.matchers import Matcher, matchers_of
from ragwatch.streams.notifier.inhibition import (
    DEFAULT_INHIBIT_RULES,
    InhibitRule,
    warn_about_inhibit_rules,
)

RECEIVER_TYPES = ("webhook", "slack", "pagerduty")
MAX_ATTEMPTS = 1000  # over 3 days of retries at the outbox's 5-minute backoff cap
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
ALL_LABELS = "..."


@dataclass(frozen=True)
class Route:
    """One node of the routing tree (inherited fields already filled in)."""

    receiver: str
    group_by: tuple[str, ...]
    group_wait_s: float
    group_interval_s: float
    repeat_interval_s: float
    matchers: tuple[Matcher, ...] = ()
    continue_: bool = False
    routes: tuple[Route, ...] = ()
    path: str = "0"  # position in the tree ("0", "0.1", ...): part of the group key

    def match(self, labels: Mapping[str, str]) -> list[Route]:
        """The routes that handle an alert with ``labels`` (this one if no child does)."""
        if not all(m.matches(labels) for m in self.matchers):
            return []
        out: list[Route] = []
        for child in self.routes:
            got = child.match(labels)
            out += got
            if got and not child.continue_:
                break
        return out or [self]

    def group_labels(self, labels: Mapping[str, str]) -> dict[str, str]:
        if ALL_LABELS in self.group_by:
            return dict(labels)
        return {k: labels.get(k, "") for k in self.group_by}


@dataclass(frozen=True)
class NotifyConfig:
    receivers: dict[str, dict[str, Any]]  # name -> the receiver's mapping (type included)
    route: Route
    inhibit_rules: tuple[InhibitRule, ...] = ()
    max_attempts: int = 10
    source: str = "defaults"
    extra: dict[str, Any] = field(default_factory=dict)


def _expand(v: Any, env: Mapping[str, str], where: str) -> Any:
    """``${VAR}`` in strings -> the environment's value (a missing one is an error)."""
    if isinstance(v, str):

        def sub(m: re.Match[str]) -> str:
            if m.group(1) not in env:
                raise ConfigError(f"{where}: environment variable {m.group(1)} is not set")
            return env[m.group(1)]

        return _ENV.sub(sub, v)
    if isinstance(v, Mapping):
        return {k: _expand(x, env, f"{where}.{k}") for k, x in v.items()}
    if isinstance(v, list):
        return [_expand(x, env, f"{where}[{i}]") for i, x in enumerate(v)]
    return v


def _interval(d: Mapping[str, Any], key: str, parent: float, where: str) -> float:
    if key not in d:
        return parent
    try:
        seconds = parse_duration(d[key])
    except ValueError as exc:
        raise ConfigError(f"{where}.{key}: {exc}") from None
    if key == "repeat_interval" and seconds == 0:
        raise ConfigError(
            f"{where}.{key}: must be > 0 (0 would re-send every firing group at every flush)"
        )
    return seconds


def _matchers(d: Any, where: str) -> tuple[Matcher, ...]:
    if d is not None and not isinstance(d, Mapping):
        raise ConfigError(f"{where}: expected a mapping of label: value, got {yamlfile.shown(d)}")
    for name in d or {}:
        yamlfile.label_name(name, where)
    return matchers_of(d, where)


ROUTE_FIELDS = {
    "receiver",
    "group_by",
    "group_wait",
    "group_interval",
    "repeat_interval",
    "matchers",
    "continue",
    "routes",
}


def _route(
    d: Any, parent: Route | None, receivers: Mapping[str, Any], where: str, path: str = "0"
) -> Route:
    if not isinstance(d, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {yamlfile.shown(d)}")
    extra = {str(k) for k in d} - ROUTE_FIELDS
    if extra:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(sorted(extra))}")
    receiver = d.get("receiver", parent.receiver if parent else None)
    if parent is None and receiver is None:
        raise ConfigError(f"{where}.receiver: required on the root route")
    if not isinstance(receiver, str) or receiver not in receivers:
        raise ConfigError(f"{where}.receiver: {receiver!r} is not a configured receiver")
    group_by = yamlfile.label_names(
        d.get("group_by", list(parent.group_by) if parent else ["alertname"]),
        f"{where}.group_by",
        wildcard=ALL_LABELS,
    )
    node = Route(
        receiver=receiver,
        group_by=group_by,
        group_wait_s=_interval(d, "group_wait", parent.group_wait_s if parent else 30.0, where),
        group_interval_s=_interval(
            d, "group_interval", parent.group_interval_s if parent else 300.0, where
        ),
        repeat_interval_s=_interval(
            d, "repeat_interval", parent.repeat_interval_s if parent else 4 * 3600.0, where
        ),
        matchers=_matchers(d.get("matchers"), f"{where}.matchers"),
        continue_=yamlfile.boolean(d.get("continue", False), f"{where}.continue"),
        path=path,
    )
    if parent is None and node.matchers:
        raise ConfigError(
            f"{where}.matchers: not allowed on the root route (the alerts they do not match "
            "would go nowhere): put them on a child route"
        )
    if parent is None and node.continue_:
        raise ConfigError(f"{where}.continue: not allowed on the root route (it has no sibling)")
    children = d.get("routes", [])
    if not isinstance(children, list):
        raise ConfigError(f"{where}.routes: expected a list, got {yamlfile.shown(children)}")
    kids = tuple(
        _route(c, node, receivers, f"{where}.routes[{i}]", f"{path}.{i}")
        for i, c in enumerate(children)
    )
    return replace(node, routes=kids)


def parse_config(d: Any, env: Mapping[str, str], source: str = "<dict>") -> NotifyConfig:
    """Validate a decoded notify file; ``ConfigError`` names ``source`` and the bad field."""
    try:
        return _config(d, env, source)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def _config(d: Any, env: Mapping[str, str], source: str) -> NotifyConfig:
    """The checked config; errors start with the path of the bad node (``route.receiver``)."""
    if not isinstance(d, Mapping):
        raise ConfigError(f"expected a mapping with receivers and route, got {yamlfile.shown(d)}")
    for key in d:
        if key not in ("receivers", "route", "inhibit_rules", "max_attempts"):
            raise ConfigError(
                f"{key}: unknown field (a notify file holds receivers, route, inhibit_rules "
                "and max_attempts)"
            )
    receivers: dict[str, dict[str, Any]] = {}
    raw = d.get("receivers")
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"receivers: expected a non-empty list, got {yamlfile.shown(raw)}")
    for i, r in enumerate(raw):
        where = f"receivers[{i}]"
        if not isinstance(r, Mapping) or not isinstance(r.get("name"), str) or not r["name"]:
            raise ConfigError(f"{where}: needs a name")
        if r.get("type") not in RECEIVER_TYPES:
            raise ConfigError(f"{where}.type: must be one of {', '.join(RECEIVER_TYPES)}")
        if r["name"] in receivers:
            raise ConfigError(f"{where}.name: duplicate receiver name {r['name']!r}")
        receivers[r["name"]] = _expand(dict(r), env, where)
    route = _route(d.get("route"), None, receivers, "route")
    rules = _inhibit_rules(d.get("inhibit_rules", []))
    warn_about_inhibit_rules(rules, source)
    attempts = d.get("max_attempts", 10)
    if isinstance(attempts, bool) or not isinstance(attempts, int):
        raise ConfigError(f"max_attempts: expected an integer, got {yamlfile.shown(attempts)}")
    if not 1 <= attempts <= MAX_ATTEMPTS:
        raise ConfigError(f"max_attempts: expected 1..{MAX_ATTEMPTS}, got {attempts}")
    return NotifyConfig(receivers, route, rules, attempts, source)


INHIBIT_FIELDS = ("source_matchers", "target_matchers", "equal", "linger")


def _inhibit_rules(raw: Any) -> tuple[InhibitRule, ...]:
    if not isinstance(raw, list):
        raise ConfigError(f"inhibit_rules: expected a list, got {yamlfile.shown(raw)}")
    rules = []
    for i, r in enumerate(raw):
        where = f"inhibit_rules[{i}]"
        if not isinstance(r, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {yamlfile.shown(r)}")
        extra = sorted(str(k) for k in r if k not in INHIBIT_FIELDS)
        if extra:
            raise ConfigError(
                f"{where}: unknown field(s) {', '.join(extra)} (an inhibit rule takes "
                f"{', '.join(INHIBIT_FIELDS)})"
            )
        source, target = (_matchers(r.get(k), f"{where}.{k}") for k in INHIBIT_FIELDS[:2])
        for key, got in (("source_matchers", source), ("target_matchers", target)):
            if not got:
                raise ConfigError(
                    f"{where}.{key}: required (without it the rule would mute on any alert)"
                )
        equal = yamlfile.label_names(r.get("equal", []), f"{where}.equal")
        rules.append(InhibitRule(source, target, equal, _interval(r, "linger", 0.0, where)))
    return tuple(rules)


def default_config(
    urls: Sequence[str],
    *,
    hmac_secret: str = "",
    timeout_s: float = 10.0,
    max_attempts: int = 10,
) -> NotifyConfig:
    """No notify file: every transition at once to one webhook receiver per URL, with
    :data:`DEFAULT_INHIBIT_RULES`."""
    receivers = {
        f"webhook-{i + 1}": {
            "name": f"webhook-{i + 1}",
            "type": "webhook",
            "url": url,
            "timeout_s": timeout_s,
            **({"hmac_secret": hmac_secret} if hmac_secret else {}),
        }
        for i, url in enumerate(urls)
    }
    if not receivers:
        root = Route("", (ALL_LABELS,), 0.0, 0.0, 4 * 3600.0)
        return NotifyConfig({}, root, DEFAULT_INHIBIT_RULES, max_attempts)
    children = tuple(
        Route(name, (ALL_LABELS,), 0.0, 0.0, 4 * 3600.0, continue_=True, path=f"0.{i}")
        for i, name in enumerate(receivers)
    )
    root = Route(next(iter(receivers)), (ALL_LABELS,), 0.0, 0.0, 4 * 3600.0, routes=children)
    return NotifyConfig(receivers, root, DEFAULT_INHIBIT_RULES, max_attempts)


def load_config(path: Path, env: Mapping[str, str] | None = None) -> NotifyConfig:
    """The notify file at ``path``; ``${VAR}`` read from ``env`` (default: the process's).
    Every receiver is checked too; an error names the file, the line and the field."""
    env = os.environ if env is None else env
    doc = yamlfile.read(Path(path), "notify file")
    try:
        config = _config(doc.data, env, str(path))
        for i, (name, spec) in enumerate(config.receivers.items()):
            _check_receiver(i, name, spec)
    except ConfigError as exc:
        raise doc.locate(exc) from None
    return config


def _check_receiver(i: int, name: str, spec: Mapping[str, Any]) -> None:
    """The receiver's own fields, its errors as ``receivers[i].field: ...``."""
    from ragwatch.streams.notifier.service import sender_config

    try:
        sender_config(name, spec)
    except ConfigError as exc:
        message, own = str(exc), f"receiver {name}"
        rest = message[len(own) :] if message.startswith(own) else f": {message}"
        raise ConfigError(f"receivers[{i}]{rest}") from None
