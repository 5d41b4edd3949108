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

Children inherit ``receiver``, ``group_by`` and the three intervals from their parent.
An alert goes to the deepest matching routes (first match per level, unless a route says
``continue: true``); with no matching child, the parent handles it. Without a file, the
notifier sends every transition of every alert at once to one ``webhook`` receiver per
URL in ``RAGWATCH_WEBHOOK_URLS`` (``group_by: ['...']``, no waits).

Times of the intervals are event time (the alerts' own ``at``), advancing with the wall
clock between alerts (see :mod:`ragwatch.streams.notifier.grouping`).

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

import yaml

from ragwatch.config import parse_duration
from ragwatch.errors import ConfigError
from ragwatch.matchers import Matcher, matchers_of

RECEIVER_TYPES = ("webhook", "slack", "pagerduty")
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
class InhibitRule:
    """A firing alert matching ``source`` mutes alerts matching ``target`` that have the
    same values of the ``equal`` labels (and are not the source itself)."""

    source: tuple[Matcher, ...]
    target: tuple[Matcher, ...]
    equal: tuple[str, ...] = ()

    def inhibits(self, source: Mapping[str, str], target: Mapping[str, str]) -> bool:
        return (
            all(m.matches(source) for m in self.source)
            and all(m.matches(target) for m in self.target)
            and all(source.get(k, "") == target.get(k, "") for k in self.equal)
        )


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
        return parse_duration(d[key])
    except ValueError as exc:
        raise ConfigError(f"{where}.{key}: {exc}") from None


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
        raise ConfigError(f"{where}: expected a mapping")
    extra = set(d) - ROUTE_FIELDS
    if extra:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(sorted(extra))}")
    receiver = d.get("receiver", parent.receiver if parent else None)
    if not isinstance(receiver, str) or receiver not in receivers:
        raise ConfigError(f"{where}.receiver: {receiver!r} is not a configured receiver")
    group_by = d.get("group_by", list(parent.group_by) if parent else ["alertname"])
    if not isinstance(group_by, list) or not all(isinstance(x, str) for x in group_by):
        raise ConfigError(f"{where}.group_by: expected a list of label names")
    node = Route(
        receiver=receiver,
        group_by=tuple(group_by),
        group_wait_s=_interval(d, "group_wait", parent.group_wait_s if parent else 30.0, where),
        group_interval_s=_interval(
            d, "group_interval", parent.group_interval_s if parent else 300.0, where
        ),
        repeat_interval_s=_interval(
            d, "repeat_interval", parent.repeat_interval_s if parent else 4 * 3600.0, where
        ),
        matchers=matchers_of(d.get("matchers"), f"{where}.matchers"),
        continue_=bool(d.get("continue", False)),
        path=path,
    )
    children = d.get("routes", [])
    if not isinstance(children, list):
        raise ConfigError(f"{where}.routes: expected a list")
    kids = tuple(
        _route(c, node, receivers, f"{where}.routes[{i}]", f"{path}.{i}")
        for i, c in enumerate(children)
    )
    return replace(node, routes=kids)


def parse_config(d: Any, env: Mapping[str, str], source: str = "<dict>") -> NotifyConfig:
    """Validate a decoded notify file; ``ConfigError`` names the bad field."""
    if not isinstance(d, Mapping):
        raise ConfigError(f"{source}: expected a mapping with receivers and route")
    extra = set(d) - {"receivers", "route", "inhibit_rules", "max_attempts"}
    if extra:
        raise ConfigError(f"{source}: unknown field(s) {', '.join(sorted(extra))}")
    receivers: dict[str, dict[str, Any]] = {}
    raw = d.get("receivers")
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{source}: receivers: expected a non-empty list")
    for i, r in enumerate(raw):
        where = f"{source}: receivers[{i}]"
        if not isinstance(r, Mapping) or not isinstance(r.get("name"), str) or not r["name"]:
            raise ConfigError(f"{where}: needs a name")
        if r.get("type") not in RECEIVER_TYPES:
            raise ConfigError(f"{where}.type: must be one of {', '.join(RECEIVER_TYPES)}")
        if r["name"] in receivers:
            raise ConfigError(f"{where}: duplicate receiver name {r['name']!r}")
        receivers[r["name"]] = _expand(dict(r), env, where)
    route = _route(d.get("route"), None, receivers, f"{source}: route")
    rules = []
    for i, r in enumerate(d.get("inhibit_rules") or []):
        where = f"{source}: inhibit_rules[{i}]"
        if not isinstance(r, Mapping):
            raise ConfigError(f"{where}: expected a mapping")
        equal = r.get("equal", [])
        if not isinstance(equal, list):
            raise ConfigError(f"{where}.equal: expected a list of label names")
        rules.append(
            InhibitRule(
                matchers_of(r.get("source_matchers"), f"{where}.source_matchers"),
                matchers_of(r.get("target_matchers"), f"{where}.target_matchers"),
                tuple(str(x) for x in equal),
            )
        )
    attempts = d.get("max_attempts", 10)
    if not isinstance(attempts, int) or attempts < 1:
        raise ConfigError(f"{source}: max_attempts: expected an integer >= 1")
    return NotifyConfig(receivers, route, tuple(rules), attempts, source)


def default_config(
    urls: Sequence[str],
    *,
    hmac_secret: str = "",
    timeout_s: float = 10.0,
    max_attempts: int = 10,
) -> NotifyConfig:
    """No notify file: every transition at once to one webhook receiver per URL."""
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
        return NotifyConfig({}, Route("", (ALL_LABELS,), 0.0, 0.0, 4 * 3600.0), (), max_attempts)
    children = tuple(
        Route(name, (ALL_LABELS,), 0.0, 0.0, 4 * 3600.0, continue_=True, path=f"0.{i}")
        for i, name in enumerate(receivers)
    )
    root = Route(next(iter(receivers)), (ALL_LABELS,), 0.0, 0.0, 4 * 3600.0, routes=children)
    return NotifyConfig(receivers, root, (), max_attempts)


def load_config(path: Path, env: Mapping[str, str] | None = None) -> NotifyConfig:
    """The notify file at ``path``; ``${VAR}`` read from ``env`` (default: the process's)."""
    env = os.environ if env is None else env
    try:
        d = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"notify file {path}: {exc.strerror or exc}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"notify file {path}: not valid YAML: {exc}") from None
    return parse_config(d, env, str(path))
