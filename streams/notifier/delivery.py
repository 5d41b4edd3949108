"""What every sender shares: reading a receiver's mapping, one POST answered as an
:class:`Answer`, outcomes, per-target holds.

The three senders (:mod:`~ragwatch.streams.notifier.webhook`,
:mod:`~ragwatch.streams.notifier.slack`, :mod:`~ragwatch.streams.notifier.pagerduty`)
build their payloads themselves and use this module for the rest:
:class:`ReceiverFields` (a receiver's YAML mapping, validated; errors name the receiver
and the field, never a secret), :func:`post_json` (one POST, answered as an
:class:`Answer`, never raising), :func:`outcome_of` (an answer as Delivered, Retry or
Failed) and :func:`shared` with :func:`target_key` and :class:`Hold` (state per target,
such as a ``Retry-After`` hold, shared by every sender posting to the same target).

>>> f = ReceiverFields("webhook", "audit", {"url": "https://h.example/x", "timeout_s": "5s"},
...                    known=("url", "timeout_s"))
>>> f.url("url"), f.number("timeout_s", 10.0, duration=True)
('https://h.example/x', 5.0)
>>> outcome_of(Answer(204)), outcome_of(Answer(503, retry_after_s=2.0))
(Delivered(detail='HTTP 204'), Retry(reason='HTTP 503', after_s=2.0))
>>> outcome_of(Answer(404, text="no such hook")), outcome_of(Answer(0, error="TimeoutError"))
(Failed(reason='HTTP 404 no such hook'), Retry(reason='TimeoutError', after_s=None))
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, ClassVar, Generic, Protocol, TypeVar, cast
from urllib.parse import urlsplit

import aiohttp
import orjson

from ragwatch.config import Secret, parse_duration
from ragwatch.errors import ConfigError
from ragwatch.streams.notifier.notification import (
    Delivered,
    Failed,
    Outcome,
    Retry,
    SenderStats,
    Settle,
)

RETRY_STATUSES = frozenset({408, 425, 429})  # and every 5xx
MAX_RETRY_AFTER_S = 3600.0  # a longer Retry-After is cut to an hour
MAX_ANSWER_BYTES = 4096  # of a response body, kept for reasons and retry_after
log = logging.getLogger(__name__)
T = TypeVar("T")


class ReceiverFields:
    """One receiver's YAML mapping, read field by field; errors name receiver and field.

    The mapping may carry the receiver's ``name`` and ``type`` (the notify file's
    receivers list does); they must agree. Any other unknown field is an error. Secrets
    are never quoted in an error, only their type.
    """

    def __init__(self, kind: str, name: object, d: object, known: Iterable[str]) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{kind} receiver: name must be a non-empty string")
        self.where = f"receiver {name}"
        if not isinstance(d, Mapping):
            raise ConfigError(f"{self.where}: expected a mapping, got {type(d).__name__}")
        if d.get("name", name) != name:
            raise ConfigError(f"{self.where}.name: {d.get('name')!r} disagrees with {name!r}")
        if d.get("type", kind) != kind:
            raise ConfigError(f"{self.where}.type: must be {kind!r} here")
        allowed = {*known, "name", "type"}
        unknown = sorted(str(k) for k in d if k not in allowed)
        if unknown:
            raise ConfigError(
                f"{self.where}: unknown field(s) {', '.join(unknown)} "
                f"(a {kind} receiver takes {', '.join(sorted(known))})"
            )
        self.d: Mapping[Any, Any] = d

    def error(self, field: str, why: str) -> ConfigError:
        return ConfigError(f"{self.where}.{field}: {why}")

    def _text(self, field: str, default: str | None) -> str:
        v = self.d.get(field, default)
        if isinstance(v, Secret):
            v = v.get()
        if v is None or v == "":
            raise self.error(field, "required")
        if not isinstance(v, str):
            raise self.error(field, f"expected a string, got {type(v).__name__}")
        return v.strip()

    def url(self, field: str, default: str | None = None, *, secret: bool = False) -> str:
        """An http(s) URL; a ``secret`` one is shown as scheme and host only."""
        v = self._text(field, default)
        try:
            parts = urlsplit(v)
            ok = parts.scheme in ("http", "https") and bool(parts.hostname)
            _ = parts.port  # a bad port raises ValueError
        except ValueError:
            ok = False
        if not ok:
            shown = "a URL that does not parse" if secret else repr(v)
            raise self.error(field, f"must be an http(s)://host/... URL, got {shown}")
        return v

    def secret(self, field: str) -> Secret:
        return Secret(self._text(field, None))

    def optional_secret(self, field: str) -> Secret | None:
        return None if self.d.get(field) in (None, "") else self.secret(field)

    def number(self, field: str, default: float, *, duration: bool = False) -> float:
        """A finite number > 0 (``duration``: also ``"10s"``, ``"2m"``...)."""
        v = self.d.get(field, default)
        try:
            if isinstance(v, bool) or not isinstance(v, int | float | str):
                raise ValueError
            f = parse_duration(v) if duration else float(v)
        except (ValueError, OverflowError):
            kind = "a duration (e.g. 10, 10s, 2m)" if duration else "a number"
            raise self.error(field, f"expected {kind}, got {v!r}") from None
        if not (math.isfinite(f) and f > 0):
            raise self.error(field, f"must be > 0, got {v!r}")
        return f

    def integer(self, field: str, default: int, *, minimum: int = 1) -> int:
        v = self.d.get(field, default)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise self.error(field, f"expected an integer >= {minimum}, got {v!r}")
        return v

    def names(self, field: str, default: tuple[str, ...]) -> tuple[str, ...]:
        v = self.d.get(field, list(default))
        if not isinstance(v, list | tuple) or not all(isinstance(x, str) and x for x in v):
            raise self.error(field, "expected a list of label names")
        return tuple(v)

    def string_map(
        self, field: str, default: Mapping[str, str], *, values: Iterable[str] = ()
    ) -> dict[str, str]:
        v = self.d.get(field, {})
        if not isinstance(v, Mapping):
            raise self.error(field, f"expected a mapping, got {type(v).__name__}")
        allowed = tuple(values)
        for k, x in v.items():
            if not isinstance(k, str) or not isinstance(x, str):
                raise self.error(field, "expected a mapping of strings to strings")
            if allowed and x not in allowed:
                raise self.error(f"{field}.{k}", f"must be one of {', '.join(allowed)}, got {x!r}")
        return {**default, **v}


@dataclass(frozen=True, slots=True)
class Answer:
    """What a receiver answered: ``status`` 0 means no HTTP answer (see ``error``)."""

    status: int
    retry_after_s: float | None = None
    text: str = ""  # the start of the body, for reasons (never the request)
    error: str = ""  # the exception's type when status is 0

    @property
    def why(self) -> str:
        if self.status == 0:
            return self.error or "no answer"
        detail = "".join(c for c in " ".join(self.text.split())[:120] if c.isprintable())
        return f"HTTP {self.status}" + (f" {detail}" if detail and self.status >= 300 else "")


def parse_retry_after(
    header: str | None, body: bytes = b"", *, now: float | None = None
) -> float | None:
    """Seconds to wait from ``Retry-After`` (seconds or an HTTP date), else from a JSON
    body's ``retry_after`` (Slack); None if neither says. Cut to [0, 1 h].

    >>> parse_retry_after("7"), parse_retry_after(None, b'{"ok":false,"retry_after":2}')
    (7.0, 2.0)
    >>> parse_retry_after("soon"), parse_retry_after(None, b"ok")
    (None, None)
    """
    secs: float | None = None
    if header:
        try:
            secs = float(header.strip())
        except ValueError:
            try:
                when = parsedate_to_datetime(header).timestamp()
                secs = when - (time.time() if now is None else now)
            except (TypeError, ValueError, IndexError):
                secs = None
    if secs is None and body[:1] == b"{":
        try:
            v = orjson.loads(body).get("retry_after")
        except (orjson.JSONDecodeError, AttributeError):
            v = None
        if isinstance(v, int | float) and not isinstance(v, bool):
            secs = float(v)
    if secs is None or not math.isfinite(secs):
        return None
    return min(max(secs, 0.0), MAX_RETRY_AFTER_S)


async def post_json(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    *,
    timeout_s: float,
    headers: Mapping[str, str] | None = None,
) -> Answer:
    """POST ``body`` as JSON; never raises for the network. The answer never quotes the
    URL (exception messages can: only the exception's type is kept)."""
    try:
        async with session.post(
            url,
            data=body,
            headers={"Content-Type": "application/json", **(headers or {})},
            timeout=aiohttp.ClientTimeout(total=timeout_s),
            allow_redirects=False,
        ) as resp:
            raw = await resp.content.read(MAX_ANSWER_BYTES)
            return Answer(
                resp.status,
                parse_retry_after(resp.headers.get("Retry-After"), raw),
                raw.decode("utf-8", "replace"),
            )
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
        return Answer(0, error=type(exc).__name__)


def outcome_of(answer: Answer, *, default_retry_after_s: float | None = None) -> Outcome:
    """2xx: Delivered; 408/425/429/5xx and no answer: Retry; other statuses: Failed."""
    if 200 <= answer.status < 300:
        return Delivered(f"HTTP {answer.status}")
    if answer.status == 0 or answer.status in RETRY_STATUSES or answer.status >= 500:
        after = answer.retry_after_s
        if after is None and answer.status == 429:
            after = default_retry_after_s
        return Retry(answer.why, after)
    return Failed(answer.why)


_SHARED: weakref.WeakKeyDictionary[aiohttp.ClientSession, dict[str, object]] = (
    weakref.WeakKeyDictionary()
)


def shared(session: aiohttp.ClientSession, key: str, factory: Callable[[], T]) -> T:
    """Per-session state for one target, shared by every sender that posts to it.

    Two receivers with the same Slack URL (or PagerDuty routing key) share one rate limit
    and one Retry-After hold when they share the notifier's session. ``key`` must not be
    a secret in clear (hash it): it may show up in a debugger.
    """
    per = _SHARED.setdefault(session, {})
    if key not in per:
        per[key] = factory()
    return cast(T, per[key])


def target_key(kind: str, *parts: str) -> str:
    """A key for :func:`shared` that does not hold the secret it is derived from."""
    return f"{kind}:" + hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


@dataclass
class Hold:
    """Nothing goes to the target before ``until`` (its clock): it asked us to wait."""

    until: float = 0.0

    def left(self, now: float) -> float:
        return max(0.0, self.until - now)

    def extend(self, now: float, after_s: float) -> None:
        self.until = max(self.until, now + after_s)


async def in_order(
    batch: Sequence[T],
    send_one: Callable[[T], Awaitable[Outcome]],
    settle: Settle | None = None,
) -> list[Outcome]:
    """Send ``batch`` one after another; the first Retry stops it, and the rest are answered
    a Retry that names it, unsent (a receiver that is down or limiting costs one attempt per
    batch, and order holds: nothing overtakes what must be retried). Each answer is handed
    to ``settle`` as soon as it is known, before the next is sent."""
    out: list[Outcome] = []
    stop: Retry | None = None
    for i, item in enumerate(batch):
        if stop is not None:
            out.append(stop)
            continue
        outcome = await send_one(item)
        out.append(outcome)
        if settle is not None:
            await settle(i, outcome)
        if isinstance(outcome, Retry):
            stop = Retry(f"not sent: an earlier one got {outcome.reason}", outcome.after_s)
    return out


def count_outcomes(stats: SenderStats, out: Sequence[Outcome]) -> None:
    """A batch's Retry and Failed answers, in the sender's counters."""
    stats.retried += sum(isinstance(o, Retry) for o in out)
    stats.failed += sum(isinstance(o, Failed) for o in out)


@dataclass(frozen=True)
class Target:
    """Where a sender posts and what it shares while it does: the URL, the timeout, the
    hold (``Retry-After``), the counters, the clock and how it names itself in logs."""

    session: aiohttp.ClientSession
    url: str
    timeout_s: float
    hold: Hold
    stats: SenderStats
    clock: Callable[[], float]
    name: str  # a describe() line: never the secret part of the URL
    default_retry_after_s: float | None = None
    log: logging.Logger = log  # the sender's own

    async def post(
        self, body: bytes, what: str, headers: Mapping[str, str] | None = None
    ) -> Outcome:
        """One POST, answered as an outcome: a ``Retry-After`` extends the hold, 429s and
        deliveries are counted, a retry is logged as a warning and a failure as an error
        (``what``: what was posted, for the log)."""
        answer = await post_json(
            self.session, self.url, body, timeout_s=self.timeout_s, headers=headers
        )
        outcome = outcome_of(answer, default_retry_after_s=self.default_retry_after_s)
        if isinstance(outcome, Retry) and outcome.after_s is not None:  # nothing until then
            self.hold.extend(self.clock(), outcome.after_s)
        self.stats.rate_limited += 1 if answer.status == 429 else 0
        if isinstance(outcome, Delivered):
            self.stats.sent += 1
        elif isinstance(outcome, Failed):
            self.log.error("%s: %s failed: %s", self.name, what, outcome.reason)
        else:
            self.log.warning("%s: %s to retry: %s", self.name, what, outcome.reason)
        return outcome


class ReceiverConfig(Protocol):
    """What every receiver's config has (they are frozen: read-only here)."""

    @property
    def name(self) -> str: ...

    @property
    def timeout_s(self) -> float: ...


C = TypeVar("C", bound=ReceiverConfig)


class PostingSender(Generic[C]):
    """What every sender holds: its receiver's config and name, its counters and clock, and
    the :class:`Target` it posts to. A sender says where it posts (:meth:`_url`), which
    state it shares with other senders of the same target (:meth:`_share`, returning
    the target's hold) and how it names itself (:meth:`describe`); it sends with
    :func:`in_order` and ``self._target.post``."""

    kind: ClassVar[str]
    default_retry_after_s: ClassVar[float | None] = None  # a 429 without Retry-After

    def __init__(
        self,
        config: C,
        session: aiohttp.ClientSession,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.name = config.name
        self.stats = SenderStats()
        self._clock = clock
        self._target = Target(
            session,
            self._url(),
            config.timeout_s,
            self._share(session),
            self.stats,
            clock,
            self.describe(),
            self.default_retry_after_s,
            logging.getLogger(type(self).__module__),
        )

    def _url(self) -> str:
        raise NotImplementedError

    def _share(self, session: aiohttp.ClientSession) -> Hold:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError
