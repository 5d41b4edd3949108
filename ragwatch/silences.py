"""Silences and recurring maintenance windows, kept in Redis (``P:silences``).

A silence mutes the notifications of alerts whose labels match all its matchers
(``name=value`` or ``name=~regex``) while it is active; the alerts still show in status.
Operators act in real time, so silences use the wall clock, not event time:

- a one-off silence is active from ``starts_at`` to ``ends_at``;
- a recurring one (a maintenance window, which Alertmanager cannot express:
  alertmanager#214, #517) has a ``cron`` expression for the start of each window (five
  fields, evaluated in UTC, e.g. ``0 2 * * 6`` = Saturdays 02:00) and a ``duration_s``;
  it is active inside any window, from ``starts_at`` until it is expired.

``ragwatch silence add|list|expire`` manages them; the notifier reads them every few
seconds.

>>> s = Silence.new({"host": "rag-worker-01"}, comment="reboot", author="ana",
...                 now=1000.0, duration_s=7200.0)
>>> s.active(1500.0), s.active(9000.0), s.matches({"host": "rag-worker-01", "gpu": "1"})
(True, False, True)
>>> w = Silence.new({"alertname": "=~Gpu.*"}, comment="patching", author="ana",
...                 now=0.0, cron="0 2 * * 6", duration_s=3600.0)
>>> w.active(1_767_405_600.0 + 1800), w.active(1_767_405_600.0 + 7200)  # Sat 2026-01-03
(True, False)
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from croniter import croniter

from ragwatch.errors import ConfigError
from ragwatch.matchers import Matcher, matchers_of


@dataclass(frozen=True)
class Silence:
    id: str
    matchers: tuple[Matcher, ...]
    starts_at: float
    ends_at: float | None  # None: recurring until expired
    comment: str
    author: str
    created_at: float
    cron: str | None = None
    duration_s: float | None = None
    expired_at: float | None = None

    @classmethod
    def new(
        cls,
        matchers: Mapping[str, str],
        *,
        comment: str,
        author: str,
        now: float,
        duration_s: float | None = None,
        cron: str | None = None,
    ) -> Silence:
        """A silence from now on; ``ConfigError`` for bad matchers, cron or duration."""
        parsed = matchers_of(dict(matchers), "silence")
        if not parsed:
            raise ConfigError("silence: needs at least one matcher (LABEL=VALUE)")
        if not comment.strip():
            raise ConfigError("silence: needs a comment saying why")
        if duration_s is not None and not (math.isfinite(duration_s) and duration_s > 0):
            raise ConfigError(f"silence: duration must be > 0, got {duration_s!r}")
        if cron is not None:
            if not croniter.is_valid(cron) or len(cron.split()) != 5:
                raise ConfigError(f"silence: bad cron expression {cron!r} (5 fields, UTC)")
            if duration_s is None:
                raise ConfigError("silence: a recurring window needs --duration")
            end = None
        else:
            end = now + (duration_s if duration_s is not None else 3600.0)
        return cls(
            id=uuid.uuid4().hex[:12],
            matchers=parsed,
            starts_at=now,
            ends_at=end,
            comment=comment,
            author=author,
            created_at=now,
            cron=cron,
            duration_s=duration_s,
        )

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(m.matches(labels) for m in self.matchers)

    def active(self, now: float) -> bool:
        if now < self.starts_at or (self.expired_at is not None and now >= self.expired_at):
            return False
        if self.cron is None:
            return self.ends_at is not None and now < self.ends_at
        # the latest window start at or before now (croniter's get_prev is strictly before)
        start = croniter(self.cron, datetime.fromtimestamp(now + 1.0, tz=UTC)).get_prev(float)
        if start > now:
            start = croniter(self.cron, datetime.fromtimestamp(now, tz=UTC)).get_prev(float)
        return start <= now < start + (self.duration_s or 0.0)

    def state(self, now: float) -> str:
        """active | pending (a window not open now, or a start in the future) | expired"""
        if self.expired_at is not None and now >= self.expired_at:
            return "expired"
        if self.cron is None and self.ends_at is not None and now >= self.ends_at:
            return "expired"
        return "active" if self.active(now) else "pending"

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "matchers": [m.to_dict() for m in self.matchers],
            "starts_at": self.starts_at,
            "ends_at": self.ends_at,
            "comment": self.comment,
            "author": self.author,
            "created_at": self.created_at,
            "cron": self.cron,
            "duration_s": self.duration_s,
            "expired_at": self.expired_at,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Silence:
        return cls(
            id=d["id"],
            matchers=tuple(
                Matcher(m["name"], m["value"], m.get("op") == "=~") for m in d["matchers"]
            ),
            starts_at=float(d["starts_at"]),
            ends_at=None if d.get("ends_at") is None else float(d["ends_at"]),
            comment=d.get("comment", ""),
            author=d.get("author", ""),
            created_at=float(d.get("created_at", d["starts_at"])),
            cron=d.get("cron"),
            duration_s=d.get("duration_s"),
            expired_at=d.get("expired_at"),
        )


def parse_matchers(items: list[str]) -> dict[str, str]:
    """``["host=a", "alertname=~Gpu.*"]`` -> ``{"host": "a", "alertname": "=~Gpu.*"}``."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"silence: bad matcher {item!r} (use LABEL=VALUE or LABEL=~REGEX)")
        out[name.strip()] = value if not value.startswith("~") else "=" + value
    return out


def decode_all(raw: Mapping[Any, Any]) -> list[Silence]:
    """Silences from the ``P:silences`` hash (values as stored); unreadable ones skipped."""
    out = []
    for v in raw.values():
        try:
            out.append(Silence.from_dict(orjson.loads(v)))
        except (ValueError, KeyError, TypeError):
            continue
    return sorted(out, key=lambda s: s.created_at)
