"""Label matchers, as Alertmanager writes them: ``name: value`` or ``name: =~regex``.

Routes, inhibition rules and silences select alerts with them; silences are stored in
Redis with theirs, so the matchers live in the core.

>>> m = Matcher.parse("host", "=~gpu-node-0[12]", "route")
>>> m.matches({"host": "gpu-node-02"}), m.matches({"host": "gpu-node-10"})
(True, False)

:func:`may_overlap` says whether two sets of matchers could select one alert (the
notifier warns about inhibition rules that can mute their own sources with it):

>>> leak = (Matcher("alertname", "GpuMemoryLeak"),)
>>> may_overlap(leak, (Matcher("alertname", "Gpu.*", regex=True),))
True
>>> may_overlap(leak, (Matcher("alertname", "GpuOomKill|GpuXid", regex=True),))
False
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
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


# A regular expression that is only plain words joined by "|" accepts just those words.
_WORDS = re.compile(r"[A-Za-z0-9_:/ -]*(?:\|[A-Za-z0-9_:/ -]*)*")


def _values(m: Matcher) -> frozenset[str] | None:
    """The values ``m`` accepts when they are few: an equality's value, or the words of a
    regex like ``A|B|C``; None for any other regex (it may accept endless values)."""
    if not m.regex:
        return frozenset({m.value})
    if _WORDS.fullmatch(m.value):
        return frozenset(m.value.split("|"))
    return None


def _share_a_value(a: Matcher, b: Matcher) -> bool:
    """Whether one value of the label could satisfy both ``a`` and ``b`` (same name);
    two open regular expressions are assumed to share one."""
    va, vb = _values(a), _values(b)
    if va is not None and vb is not None:
        return bool(va & vb)
    if va is not None:
        return any(b.matches({b.name: v}) for v in va)
    if vb is not None:
        return any(a.matches({a.name: v}) for v in vb)
    return True


def may_overlap(a: Iterable[Matcher], b: Iterable[Matcher]) -> bool:
    """Whether some alert could match every matcher of ``a`` and every one of ``b``.

    Conservative: False only when a label is matched on both sides by matchers that
    provably share no value (two equalities with different values; an equality whose value
    a regex rejects; two regexes of plain alternatives, ``A|B`` and ``C|D``, with no word
    in common). Two other regexes on one label are assumed to share a value, and matchers
    on different labels never conflict. A missing label counts as the empty value, as in
    :meth:`Matcher.matches`.
    """
    bs = list(b)
    return all(_share_a_value(x, y) for x in a for y in bs if x.name == y.name)


def shown(matchers: Iterable[Matcher]) -> str:
    """Matchers as Alertmanager prints them: ``{alertname=~"Gpu.*", host="h1"}``."""
    parts = (f"{m.name}{'=~' if m.regex else '='}{json.dumps(m.value)}" for m in matchers)
    return "{" + ", ".join(parts) + "}"
