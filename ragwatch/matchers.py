"""Label matchers, as Alertmanager writes them: ``name: value`` or ``name: =~regex``.

Routes, inhibition rules and silences select alerts with them; silences are stored in
Redis with theirs, so the matchers live in the core.

>>> m = Matcher.parse("host", "=~gpu-node-0[12]", "route")
>>> m.matches({"host": "gpu-node-02"}), m.matches({"host": "gpu-node-10"})
(True, False)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ragwatch.errors import ConfigError


@dataclass(frozen=True)
class Matcher:
    """``name = value`` or ``name =~ regex`` (anchored, like Alertmanager)."""

    name: str
    value: str
    regex: bool = False

    def matches(self, labels: Mapping[str, str]) -> bool:
        v = labels.get(self.name, "")
        return re.fullmatch(self.value, v) is not None if self.regex else v == self.value

    @classmethod
    def parse(cls, name: str, raw: Any, where: str) -> Matcher:
        if not isinstance(raw, str | int | float) or isinstance(raw, bool):
            raise ConfigError(f"{where}.{name}: expected a string")
        value = str(raw)
        if value.startswith("=~"):
            try:
                re.compile(value[2:])
            except re.error as exc:
                raise ConfigError(f"{where}.{name}: bad regular expression: {exc}") from None
            return cls(name, value[2:], regex=True)
        return cls(name, value)

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "op": "=~" if self.regex else "=", "value": self.value}


def matchers_of(d: Any, where: str) -> tuple[Matcher, ...]:
    if d is None:
        return ()
    if not isinstance(d, Mapping):
        raise ConfigError(f"{where}: expected a mapping of label: value")
    return tuple(Matcher.parse(str(k), v, where) for k, v in d.items())
