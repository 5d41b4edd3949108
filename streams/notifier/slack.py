"""Slack delivery: Block Kit messages to an incoming webhook, at most ``rate_per_s``.

One notification is one message: a header (severity emoji, status, alert name), then per
alert its summary, description and value against expected, its labels as fields, the
root-cause hint and runbook, and a context line linking to the alert on the status page
(``{external_url}/alerts/{fingerprint}``). A text fallback goes with it for notifications
and screen readers.

Rate limit (Slack allows about one message per second per webhook, with short bursts): a
token bucket of ``rate_per_s`` tokens per second, ``burst`` deep, per webhook URL. When
several notifications are due together and the bucket cannot send them all, they are
folded into ONE digest message ("N alerts: ...", listing up to ``max_digest``, then
"... and K more"), so a burst becomes one message; every folded notification is Delivered
when it is. An empty bucket answers Retry with ``after_s`` = when the next token comes.

A 429 answers Retry with Slack's ``Retry-After`` (header, or ``retry_after`` in the JSON
body; 30 s if neither) for the whole batch, and nothing else goes to that URL until then:
Slack disables apps that keep posting after a rate limit (alertmanager#2111, #2128).

Nothing that comes from telemetry is sent as ``mrkdwn``, which has no escape for ``*``,
``_``, ``~`` or a backtick (a label ``*URGENT*`` would be bold, ``~ok~`` struck through):
labels are ``plain_text`` fields, and annotations (summaries, descriptions, hints,
runbooks, resolutions: rules template them from labels) and digest lines are ``rich_text``
blocks, whose ``text`` elements Slack shows as they are, our own emphasis given as their
``style`` and our links as ``link`` elements. So ``<!channel>``, ``<http://evil|x>`` or
``*URGENT*`` in a label or an annotation can neither ping, link nor format. Only our own
words, times and the status page's URL are ``mrkdwn`` (``verbatim``, escaped).
Limits are held by truncating: 50 blocks, 150 characters per header, 3000 per section
text, 2000 per field, 10 fields, and about 10,000 characters over all blocks (Slack
documents 40,000, but answers ``msg_blocks_too_long`` near 13,200: slackapi/bolt-js#2509).
Lengths are counted in UTF-16 code units, as Slack's JavaScript-side limits count them.

The webhook URL is a secret (the path is the credential): it never appears in logs,
errors, ``describe()`` or reprs, only its scheme and host.

>>> from ragwatch.schema import Alert
>>> a = Alert(rule="GpuMemoryLeak", severity="critical", status="firing",
...           labels={"alertname": "GpuMemoryLeak", "host": "<!channel>"},
...           annotations={"summary": "leak"}, value=1.3e9, expected=0.0,
...           starts_at=0.0, ends_at=None, fingerprint="f1")
>>> msg = slack_message(Notification.of("chat", {"alertname": "GpuMemoryLeak"}, [a]))
>>> msg["blocks"][0]["text"]["text"]
':red_circle: FIRING: GpuMemoryLeak'
>>> msg["blocks"][2]["fields"][0]          # shown as it is: no ping, no formatting
{'type': 'plain_text', 'text': 'host: <!channel>', 'emoji': False}
>>> rich = msg["blocks"][1]["elements"][0]["elements"]  # summary: shown as it is, in bold
>>> "".join(e.get("text", "") for e in rich).splitlines()
[' leak', 'Value: 1,300,000,000  ·  Expected: 0']
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import quote

import aiohttp
import orjson

from ragwatch.catalog import LABEL_ORDER
from ragwatch.config import Secret, mask_webhook
from ragwatch.schema import Alert
from ragwatch.streams.notifier.delivery import (
    Hold,
    PostingSender,
    ReceiverFields,
    count_outcomes,
    in_order,
    shared,
    target_key,
)
from ragwatch.streams.notifier.notification import (
    Delivered,
    Notification,
    Outcome,
    Retry,
    Settle,
)
from ragwatch.streams.notifier.webhook import rfc3339

if TYPE_CHECKING:
    from ragwatch.streams.notifier.notification import Sender

log = logging.getLogger(__name__)

MAX_BLOCKS = 50
MAX_HEADER = 150
MAX_SECTION = 3000
MAX_FIELD = 2000
MAX_FIELDS = 10
MAX_CONTEXT_ELEMENTS = 10
MAX_TEXT = 3000  # the fallback text (Slack truncates at 40,000; a preview needs less)
BLOCKS_BUDGET = 10_000  # all text in all blocks (msg_blocks_too_long near 13,200)
DEFAULT_RETRY_AFTER_S = 30.0  # a 429 that does not say how long

EMOJI = {
    "critical": ":red_circle:",
    "error": ":large_orange_circle:",
    "warning": ":large_yellow_circle:",
    "info": ":large_blue_circle:",
}
RESOLVED_EMOJI = ":white_check_mark:"
RELEARNED_EMOJI = ":arrows_counterclockwise:"  # resolved because the baseline gave up
SEVERITY_ORDER = ("critical", "error", "warning", "info")
FIRST_LABELS = LABEL_ORDER
HEADER_LABELS = frozenset({"alertname", "severity"})  # shown in the header already


# ---------------------------------------------------------------- text helpers


def escape(s: str) -> str:
    """Escape Slack's control characters, so user text can neither ping nor link.

    >>> escape("<!channel> & <http://evil|x>")
    '&lt;!channel&gt; &amp; &lt;http://evil|x&gt;'
    """
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def units(s: str) -> int:
    """Length in UTF-16 code units (an emoji counts 2)."""
    return len(s) + sum(1 for ch in s if ord(ch) > 0xFFFF)


_PARTIAL_ENTITY = re.compile(r"&[a-z]{0,3}$")


def clip(s: str, limit: int) -> str:
    """``s`` cut to ``limit`` UTF-16 units, ending in "…" when cut (never inside an
    ``&amp;`` entity). Looks at no more than ``limit`` characters of a huge string.

    >>> clip("abcdef", 4), clip("a&amp;b", 4), clip("ok", 4)
    ('abc…', 'a…', 'ok')
    """
    used, end = 0, -1
    for i, ch in enumerate(s):
        used += 2 if ord(ch) > 0xFFFF else 1
        if used > limit:
            end = i
            break
    if end < 0:
        return s
    cut = s[:end]  # fits in limit units; the ellipsis needs one more
    while cut and units(cut) > limit - 1:
        cut = cut[:-1]
    return _PARTIAL_ENTITY.sub("", cut) + "…"


def _safe_url(url: str) -> str:
    """A URL fit for ``<url|text>``: no control characters, no ``|``."""
    return escape(url).replace("|", "%7C")


def _usable(url: str, max_url: int) -> bool:
    """An http(s) URL of at most ``max_url`` characters without spaces: one to link."""
    fits = url.startswith(("http://", "https://")) and len(url) <= max_url
    return fits and not any(c.isspace() for c in url)


def link(url: str, text: str, *, max_url: int = 1000) -> str:
    """``<url|text>`` with ``text`` escaped; just the text if the URL is unusable."""
    if not _usable(url, max_url):
        return escape(text)
    return f"<{_safe_url(url)}|{escape(text)}>"


def alert_url(external_url: str, alert: Alert) -> str:
    """The alert's page on the status server ("" without an external URL)."""
    if not external_url:
        return ""
    return f"{external_url.rstrip('/')}/alerts/{quote(alert.fingerprint, safe='')}"


def number(v: float | None) -> str:
    """A value for people: integers with thousands separators, others to 4 digits.

    >>> number(1.3e9), number(0.1234567), number(None), number(float("nan"))
    ('1,300,000,000', '0.1235', '-', 'nan')
    """
    if v is None:
        return "-"
    if not math.isfinite(v):
        return str(v)
    if v == int(v) and abs(v) < 1e15:
        return f"{int(v):,}"
    return f"{v:.4g}"


def _name(a: Alert) -> str:
    return a.labels.get("alertname") or a.rule or "alert"


def _emoji(a: Alert) -> str:
    if a.status == "firing":
        return EMOJI.get(a.severity, EMOJI["warning"])
    return RELEARNED_EMOJI if a.resolution == "relearned" else RESOLVED_EMOJI


def _status(a: Alert) -> str:
    if a.status == "firing":
        return "FIRING"
    return "NOT RECOVERED (new level accepted)" if a.resolution == "relearned" else "RESOLVED"


def _worst(alerts: Iterable[Alert]) -> Alert:
    rank = {s: i for i, s in enumerate(SEVERITY_ORDER)}
    return min(alerts, key=lambda a: (a.status != "firing", rank.get(a.severity, 2)))


def _ordered_labels(labels: Mapping[str, str]) -> list[tuple[str, str]]:
    first = [(k, labels[k]) for k in FIRST_LABELS if k in labels]
    rest = sorted((k, v) for k, v in labels.items() if k not in FIRST_LABELS)
    return [(k, v) for k, v in first + rest if k not in HEADER_LABELS]


def _ident(a: Alert, limit: int = 120) -> str:
    """``host=h1 gpu=0``: the labels that say where (not escaped)."""
    pairs = [f"{k}={v}" for k, v in _ordered_labels(a.labels) if k in FIRST_LABELS]
    return clip(" ".join(pairs), limit)


# ---------------------------------------------------------------- blocks


def _mrkdwn(text: str, limit: int = MAX_SECTION) -> dict[str, Any]:
    """Our markup; ``verbatim``: a URL or #channel in escaped user text stays text."""
    return {"type": "mrkdwn", "text": clip(text, limit) or " ", "verbatim": True}


def _plain(text: str, limit: int = MAX_FIELD) -> dict[str, Any]:
    """Text Slack shows as it is: no bold, italics, strike, code, links or mentions."""
    return {"type": "plain_text", "text": clip(text, limit) or " ", "emoji": False}


def _header(text: str) -> dict[str, Any]:
    plain = {"type": "plain_text", "text": clip(text, MAX_HEADER) or "alert", "emoji": True}
    return {"type": "header", "text": plain}


def _text(text: str, **style: bool) -> dict[str, Any]:
    """A ``rich_text`` text element: shown as it is (no mrkdwn), styled by ``style``."""
    element: dict[str, Any] = {"type": "text", "text": text}
    if style:
        element["style"] = style
    return element


def _emoji_element(code: str) -> dict[str, Any]:
    return {"type": "emoji", "name": code.strip(":")}


def _link_element(url: str, text: str, *, max_url: int = 1000) -> dict[str, Any] | None:
    """A ``rich_text`` link to one of our pages; None if the URL is unusable."""
    if not _usable(url, max_url):
        return None
    return {"type": "link", "url": url, "text": text}


def _rich(elements: list[dict[str, Any]]) -> dict[str, Any]:
    """One ``rich_text`` block of one paragraph (empty text elements left out)."""
    kept = [e for e in elements if e["type"] != "text" or e["text"]]
    section = {"type": "rich_text_section", "elements": kept or [_text(" ")]}
    return {"type": "rich_text", "elements": [section]}


def _context(parts: Sequence[str]) -> dict[str, Any]:
    elements = [_mrkdwn(p) for p in parts if p][:MAX_CONTEXT_ELEMENTS]
    return {"type": "context", "elements": elements or [_mrkdwn(" ")]}


def _text_units(node: Any) -> int:
    """The characters Slack counts in blocks: every ``text`` string in them."""
    if isinstance(node, dict):
        return sum(
            units(v) if k == "text" and isinstance(v, str) else _text_units(v)
            for k, v in node.items()
        )
    if isinstance(node, list):
        return sum(_text_units(v) for v in node)
    return 0


def _alert_blocks(a: Alert, external_url: str) -> list[dict[str, Any]]:
    """One alert: its summary and value, its labels, the cause, the link."""
    blocks = [_alert_summary(a)]
    fields = _label_fields(a)
    if fields:
        blocks.append({"type": "section", "fields": fields})
    cause = _cause(a)
    if cause:
        blocks.append(_rich(cause))
    url = alert_url(external_url, a)
    ended = a.status != "firing"
    when = f"ended {rfc3339(a.ends_at)}" if ended else f"since {rfc3339(a.starts_at)}"
    blocks.append(_context([link(url, "Open in ragwatch") if url else "", when]))
    return blocks


def _alert_summary(a: Alert) -> dict[str, Any]:
    summary = a.annotations.get("summary") or f"{_name(a)} {a.status}"
    parts = [_emoji_element(_emoji(a)), _text(" "), _text(clip(summary, 1000), bold=True)]
    if a.annotations.get("description"):
        parts += [_text("\n"), _text(clip(a.annotations["description"], 1200))]
    parts += [_text("\n"), _text("Value:", bold=True), _text(f" {number(a.value)}")]
    if a.expected is not None:
        parts += [_text("  ·  "), _text("Expected:", bold=True), _text(f" {number(a.expected)}")]
    return _rich(parts)


def _cause(a: Alert) -> list[dict[str, Any]]:
    """The hint, the resolution and the runbook, as rich text (they quote telemetry)."""
    ann = a.annotations
    lines: list[list[dict[str, Any]]] = []
    if a.status == "resolved" and ann.get("resolution"):
        title = f" {_status(a)}: "
        lines.append([_emoji_element(_emoji(a)), _text(title, bold=True),
                      _text(clip(ann["resolution"], 1000))])  # fmt: skip
    if ann.get("hint"):
        lines.append([_emoji_element(":mag:"), _text(" Likely cause: ", bold=True),
                      _text(clip(ann["hint"], 1500))])  # fmt: skip
    if ann.get("runbook"):
        lines.append([_emoji_element(":book:"), _text(" Runbook: ", bold=True),
                      _text(clip(ann["runbook"], 1000))])  # fmt: skip
    out: list[dict[str, Any]] = []
    for i, line in enumerate(lines):
        out += [_text("\n")] * (i > 0) + line
    return out


def _label_fields(a: Alert) -> list[dict[str, Any]]:
    labels = _ordered_labels(a.labels)
    fields = [_plain(f"{clip(k, 100)}: {clip(v, 300)}") for k, v in labels]
    if len(fields) > MAX_FIELDS:
        more = _mrkdwn(f"_and {len(labels) - MAX_FIELDS + 1} more labels_")
        fields = [*fields[: MAX_FIELDS - 1], more]
    return fields


def _fit(
    head: list[dict[str, Any]], groups: list[list[dict[str, Any]]], more: str
) -> list[dict[str, Any]]:
    """``head`` plus as many whole groups as Slack's block and text limits allow; a last
    context line says how many groups were left out (``more`` names them)."""
    blocks, used = list(head), _text_units(head)
    for i, group in enumerate(groups):
        cost = _text_units(group)
        if len(blocks) + len(group) > MAX_BLOCKS - 1 or used + cost > BLOCKS_BUDGET - 200:
            blocks.append(_context([f"_… and {len(groups) - i} more {more} not shown_"]))
            break
        blocks += group
        used += cost
    return blocks


def slack_message(n: Notification) -> dict[str, Any]:
    """The Block Kit message for one notification (pure: no I/O, never raises)."""
    worst = _worst(n.alerts)
    name = n.group_labels.get("alertname") or _name(worst)
    count = f" ({len(n.alerts)} alerts)" if len(n.alerts) > 1 else ""
    status = "FIRING" if n.status == "firing" else "RESOLVED"
    emoji = _emoji(worst) if n.status == "firing" else RESOLVED_EMOJI
    if n.status != "firing" and any(a.resolution == "relearned" for a in n.alerts):
        status, emoji = "NOT RECOVERED (new level accepted)", RELEARNED_EMOJI
    groups = [_alert_blocks(a, n.external_url) for a in n.alerts]
    blocks = _fit([_header(f"{emoji} {status}: {escape(name)}{count}")], groups, "alerts")
    summary = worst.annotations.get("summary") or _ident(worst)
    text = f"{emoji} {status}: {escape(clip(name, 200))}{count}: {escape(clip(summary, 1000))}"
    return _message(clip(text, MAX_TEXT), blocks)


def slack_digest(batch: Sequence[Notification], *, max_digest: int = 20) -> dict[str, Any]:
    """One message for several notifications: "N alerts: ..." with one line per alert, up
    to ``max_digest`` (and as many as Slack's limits allow), then "... and K more"."""
    pairs = [(n, a) for n in batch for a in n.alerts]
    firing = sum(a.status == "firing" for _, a in pairs)
    title = f"{len(pairs)} alerts: {firing} firing, {len(pairs) - firing} resolved"
    emoji = _emoji(_worst(a for _, a in pairs)) if pairs else RESOLVED_EMOJI
    head = _header(f"{emoji} {title}")
    lines = [_digest_line(n, a) for n, a in pairs[:max_digest]]
    paragraphs, shown = _pack(lines, _text_units(head))
    blocks = [head, *(_rich(p) for p in paragraphs)]
    tail = [f"… and {len(pairs) - shown} more"] if shown < len(pairs) else []
    home = next((n.external_url for n in batch if n.external_url), "")
    if home:
        tail.append(link(home, "Open ragwatch", max_url=300))
    if tail:
        blocks.append(_context(tail))
    return _message(clip(f"{emoji} {title}", MAX_TEXT), blocks)


def _digest_line(n: Notification, a: Alert) -> list[dict[str, Any]]:
    """One alert of a digest as rich text: what it is, where (in code style), its page."""
    summary = a.annotations.get("summary") or _name(a)
    line = [_emoji_element(_emoji(a)), _text(" "), _text(_status(a), bold=True),
            _text(f" {clip(_name(a), 100)}: {clip(summary, 300)}")]  # fmt: skip
    where = _ident(a)
    if where:
        line += [_text(" ("), _text(where, code=True), _text(")")]
    url = alert_url(n.external_url, a)
    details = _link_element(url, "details", max_url=300) if url else None
    if details is not None:
        line += [_text(" "), details]
    return line


def _pack(lines: list[list[dict[str, Any]]], used: int) -> tuple[list[list[dict[str, Any]]], int]:
    """Lines joined into paragraphs within the block and text limits; also how many
    lines made it (the first ones)."""
    paragraphs: list[list[dict[str, Any]]] = []
    sizes: list[int] = []
    for shown, line in enumerate(lines):
        cost = _text_units(line) + 1
        if used + cost > BLOCKS_BUDGET - 300:
            return paragraphs, shown
        if paragraphs and sizes[-1] + cost <= MAX_SECTION:
            paragraphs[-1] += [_text("\n"), *line]
            sizes[-1] += cost
        elif len(paragraphs) < MAX_BLOCKS - 2:
            paragraphs.append(list(line))
            sizes.append(cost)
        else:
            return paragraphs, shown
        used += cost
    return paragraphs, len(lines)


def _message(text: str, blocks: list[dict[str, Any]]) -> dict[str, Any]:
    return {"text": text, "blocks": blocks, "unfurl_links": False, "unfurl_media": False}


# ---------------------------------------------------------------- the sender


@dataclass(frozen=True, slots=True)
class SlackConfig:
    """A Slack incoming webhook.

    >>> c = SlackConfig.from_mapping("chat", {"url": "https://hooks.slack.com/services/T/B/x"})
    >>> c.rate_per_s, c.burst, c.max_digest, "services" in repr(c)
    (1.0, 1, 20, False)
    """

    name: str
    url: Secret  # the path is the credential
    rate_per_s: float = 1.0
    burst: int = 1
    max_digest: int = 20
    timeout_s: float = 10.0

    FIELDS: ClassVar[tuple[str, ...]] = ("url", "rate_per_s", "burst", "max_digest", "timeout_s")

    @classmethod
    def from_mapping(cls, name: str, d: Mapping[str, Any]) -> SlackConfig:
        f = ReceiverFields("slack", name, d, cls.FIELDS)
        return cls(
            name=name,
            url=Secret(f.url("url", secret=True)),
            rate_per_s=f.number("rate_per_s", 1.0),
            burst=f.integer("burst", 1),
            max_digest=f.integer("max_digest", 20),
            timeout_s=f.number("timeout_s", 10.0, duration=True),
        )


@dataclass
class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` kept; starts full.

    >>> b = TokenBucket(rate=1.0, burst=1)
    >>> b.take(0.0), b.take(0.5), round(b.wait_s(0.5), 2), b.take(1.0)
    (True, False, 0.5, True)
    """

    rate: float
    burst: float
    tokens: float = math.nan
    last: float = math.nan

    def available(self, now: float) -> float:
        if math.isnan(self.last):
            self.tokens, self.last = self.burst, now
        elapsed = max(0.0, now - self.last)
        self.tokens, self.last = min(self.burst, self.tokens + elapsed * self.rate), now
        return self.tokens

    def take(self, now: float) -> bool:
        if self.available(now) < 1.0 - 1e-9:
            return False
        self.tokens -= 1.0
        return True

    def wait_s(self, now: float) -> float:
        return max(0.0, (1.0 - self.available(now)) / self.rate)

    def drain(self, now: float) -> None:
        self.available(now)
        self.tokens = 0.0


@dataclass
class _UrlState:
    """What every sender posting to one webhook URL shares (see ``delivery.shared``)."""

    bucket: TokenBucket
    hold: Hold = field(default_factory=Hold)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class SlackSender(PostingSender[SlackConfig]):
    """Sends notifications to one Slack incoming webhook (rules: module docstring)."""

    kind: ClassVar[str] = "slack"

    default_retry_after_s: ClassVar[float | None] = DEFAULT_RETRY_AFTER_S

    def _url(self) -> str:
        return self.config.url.get()

    def _share(self, session: aiohttp.ClientSession) -> Hold:
        bucket = TokenBucket(self.config.rate_per_s, float(self.config.burst))
        self._url_state = shared(
            session, target_key("slack", self.config.url.get()), lambda: _UrlState(bucket)
        )
        return self._url_state.hold

    def describe(self) -> str:
        return f"slack {self.name} -> {mask_webhook(self.config.url.get())}"

    async def send(
        self, batch: Sequence[Notification], settle: Settle | None = None
    ) -> list[Outcome]:
        if not batch:
            return []
        async with self._url_state.lock:
            out = await self._send(batch, settle)
        count_outcomes(self.stats, out)
        return out

    async def _send(self, batch: Sequence[Notification], settle: Settle | None) -> list[Outcome]:
        now, state = self._clock(), self._url_state
        if state.hold.left(now) > 0:
            return self._held(batch, state.hold.left(now), "Slack asked to wait")
        tokens = math.floor(state.bucket.available(now) + 1e-9)
        if tokens < 1:
            return self._held(batch, state.bucket.wait_s(now), f"over {self.config.rate_per_s:g}/s")
        if len(batch) <= tokens:
            return await self._one_by_one(batch, settle)
        state.bucket.take(now)
        outcome = await self._post(
            slack_digest(batch, max_digest=self.config.max_digest), len(batch)
        )
        if isinstance(outcome, Delivered):
            self.stats.digests += 1
            outcome = Delivered(f"{outcome.detail}, in a digest of {len(batch)}")
        return [outcome] * len(batch)

    async def _one_by_one(
        self, batch: Sequence[Notification], settle: Settle | None
    ) -> list[Outcome]:
        async def one(n: Notification) -> Outcome:
            self._url_state.bucket.take(self._clock())
            return await self._post(slack_message(n), 1)

        return await in_order(batch, one, settle)  # Slack is down or limiting: the rest is not sent

    def _held(self, batch: Sequence[Notification], wait: float, why: str) -> list[Outcome]:
        self.stats.rate_limited += len(batch)
        return [Retry(f"rate limited ({why}): retry in {wait:.2f}s", wait)] * len(batch)

    async def _post(self, message: dict[str, Any], count: int) -> Outcome:
        outcome = await self._target.post(orjson.dumps(message), f"{count} notification(s)")
        if isinstance(outcome, Retry) and outcome.after_s is not None:  # the hold is on
            self._url_state.bucket.drain(self._clock())
        return outcome


if TYPE_CHECKING:

    def _is_a_sender(s: SlackSender) -> Sender:
        return s
