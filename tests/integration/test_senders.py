"""The three senders against real local HTTP servers (tests/fakes.py), with real aiohttp.

No broker, no Redis: these only need loopback sockets. Payloads are checked exactly as
they arrive; rate limits by arrival times at the fake server (or an injected clock where
the real wait would be a minute).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import logging
import re
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
import pytest

from ragwatch.config import Secret
from ragwatch.errors import ConfigError
from ragwatch.schema import Alert
from ragwatch.streams.notifier.notification import Delivered, Failed, Notification, Outcome, Retry
from ragwatch.streams.notifier.pagerduty import PagerDutyConfig, PagerDutySender, dedup_key
from ragwatch.streams.notifier.slack import SlackConfig, SlackSender
from ragwatch.streams.notifier.webhook import WebhookConfig, WebhookSender
from tests.fakes import (
    SLACK_TOKEN,
    FakePagerDuty,
    FakeServer,
    FakeSlack,
    SlowServer,
    block_problems,
    closed_port_url,
    slack_texts,
)

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
STATUS_PAGE = "http://ragwatch.example:8080"
ROUTING_KEY = "R0UT1NGK3Ys3cretR0UT1NGK3Ys3cret"  # 32 characters, like PagerDuty's
HMAC_SECRET = "hmac-s3cret-value"


def alert(
    fp: str = "f1",
    status: str = "firing",
    *,
    severity: str = "critical",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    rule: str = "GpuMemoryLeak",
) -> Alert:
    return Alert(
        rule=rule,
        severity=severity,
        status=status,  # type: ignore[arg-type]
        labels=labels
        if labels is not None
        else {"alertname": rule, "host": "gpu-node-01", "gpu": "1", "pid": "4011", "team": "ml"},
        annotations=annotations
        if annotations is not None
        else {
            "summary": "GPU memory leak: rag-worker (pid 4011) on gpu-node-01 GPU 1",
            "hint": "FAISS index never reset",
        },
        value=1.3e9,
        expected=0.0,
        starts_at=T0,
        ends_at=None if status == "firing" else T0 + 3600,
        fingerprint=fp,
        at=T0 + 600,
    )


def note(*alerts: Alert, receiver: str = "rx") -> Notification:
    return Notification.of(
        receiver, {"alertname": alerts[0].rule}, alerts, external_url=STATUS_PAGE
    )


def many(n: int) -> list[Notification]:
    return [
        note(alert(f"fp{i}", labels={"alertname": "GpuMemoryLeak", "host": f"h{i}"}))
        for i in range(n)
    ]


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def drain(
    sender: Any, batch: Sequence[Notification], timeout_s: float = 15.0
) -> list[Outcome]:
    """What an outbox does: send what is due, wait as long as a Retry says, send again."""
    final: dict[str, Outcome] = {}
    pending = list(batch)
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        outcomes = await sender.send(pending)
        assert len(outcomes) == len(pending)
        final |= {
            n.key: o for n, o in zip(pending, outcomes, strict=True) if not isinstance(o, Retry)
        }
        waits = [o.after_s or 0.05 for o in outcomes if isinstance(o, Retry)]
        pending = [n for n, o in zip(pending, outcomes, strict=True) if isinstance(o, Retry)]
        if pending:
            await asyncio.sleep(max(waits))
    assert not pending, "still retrying at the deadline"
    return [final[n.key] for n in batch]


def gaps(server: FakeServer) -> list[float]:
    at = [r.at for r in server.received]
    return [b - a for a, b in itertools.pairwise(at)]


# ---------------------------------------------------------------- webhook


async def test_webhook_posts_the_alertmanager_v4_body_with_a_verifiable_hmac(
    session: aiohttp.ClientSession,
) -> None:
    with FakeServer() as rx:
        cfg = WebhookConfig.from_mapping("audit", {"url": rx.url, "hmac_secret": HMAC_SECRET})
        sender = WebhookSender(cfg, session)
        n = note(alert(), receiver="audit")
        assert await sender.send([n]) == [Delivered("HTTP 200")]
    (req,) = rx.received
    assert req.headers["Content-Type"] == "application/json"
    expected_sig = hmac.new(HMAC_SECRET.encode(), req.body, hashlib.sha256).hexdigest()
    assert req.headers["X-Ragwatch-Signature"] == f"sha256={expected_sig}"
    a = alert()
    assert req.json == {
        "version": "4",
        "groupKey": 'audit:{"alertname":"GpuMemoryLeak"}',
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": "audit",
        "groupLabels": {"alertname": "GpuMemoryLeak"},
        "commonLabels": a.labels,
        "commonAnnotations": a.annotations,
        "externalURL": STATUS_PAGE,
        "alerts": [
            {
                "status": "firing",
                "labels": a.labels,
                "annotations": a.annotations,
                "startsAt": "2026-01-01T00:00:00Z",
                "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": f"{STATUS_PAGE}/alerts/f1",
                "fingerprint": "f1",
                "value": 1.3e9,
                "expected": 0.0,
            }
        ],
    }
    assert sender.stats.sent == 1


async def test_webhook_without_a_secret_sends_no_signature_and_truncates_big_bodies(
    session: aiohttp.ClientSession,
) -> None:
    big = {"summary": "x" * 2000}
    alerts = [
        alert(f"fp{i}", annotations=big, labels={"alertname": "A", "i": str(i)}) for i in range(40)
    ]
    with FakeServer() as rx:
        cfg = WebhookConfig.from_mapping("w", {"url": rx.url, "max_body_bytes": 16384})
        assert await WebhookSender(cfg, session).send([note(*alerts)]) == [Delivered("HTTP 200")]
    (req,) = rx.received
    assert "X-Ragwatch-Signature" not in req.headers
    body = req.json
    assert len(req.body) <= 16384 and 1 <= len(body["alerts"]) < 40
    assert body["truncatedAlerts"] == 40 - len(body["alerts"])
    assert [a["fingerprint"] for a in body["alerts"]] == [
        f"fp{i}" for i in range(len(body["alerts"]))
    ]


@pytest.mark.parametrize(
    ("status", "kind"),
    [(200, Delivered), (204, Delivered), (408, Retry), (425, Retry), (429, Retry), (500, Retry),
     (502, Retry), (503, Retry), (400, Failed), (401, Failed), (404, Failed), (413, Failed)],
)  # fmt: skip
async def test_webhook_classifies_answers(
    session: aiohttp.ClientSession, status: int, kind: type
) -> None:
    with FakeServer() as rx:
        rx.then(status)
        out = await WebhookSender(WebhookConfig("w", rx.url), session).send([note(alert())])
    assert type(out[0]) is kind, out


async def test_webhook_timeout_and_refused_connection_are_retried(
    session: aiohttp.ClientSession,
) -> None:
    with SlowServer(delay_s=2.0) as slow:
        started = time.monotonic()
        (out,) = await WebhookSender(WebhookConfig("w", slow.url, timeout_s=0.3), session).send(
            [note(alert())]
        )
        assert isinstance(out, Retry) and "Timeout" in out.reason and out.after_s is None
        assert time.monotonic() - started < 1.5
    (out,) = await WebhookSender(WebhookConfig("w", closed_port_url()), session).send(
        [note(alert())]
    )
    assert isinstance(out, Retry) and "Connect" in out.reason


async def test_webhook_retry_after_holds_the_url_and_a_retry_stops_the_batch(
    session: aiohttp.ClientSession,
) -> None:
    clock = Clock()
    with FakeServer() as rx:
        rx.then(503, Retry_After="2")
        sender = WebhookSender(WebhookConfig("w", rx.url), session, clock=clock)
        out = await sender.send(many(3))
        assert [type(o) for o in out] == [Retry] * 3 and {o.after_s for o in out} == {2.0}  # type: ignore[union-attr]
        assert len(rx.received) == 1  # the other two were not tried
        clock.now += 1.0
        (held,) = await sender.send(many(1))
        assert isinstance(held, Retry) and held.after_s == pytest.approx(1.0)
        assert len(rx.received) == 1
        clock.now += 1.01
        assert await sender.send(many(3)) == [Delivered("HTTP 200")] * 3
    assert len(rx.received) == 4


# ---------------------------------------------------------------- slack


async def test_slack_message_is_block_kit_with_labels_value_hint_and_link(
    session: aiohttp.ClientSession,
) -> None:
    with FakeSlack() as slack:
        sender = SlackSender(SlackConfig.from_mapping("chat", {"url": slack.url}), session)
        assert await sender.send([note(alert())]) == [Delivered("HTTP 200")]
    (msg,) = slack.bodies()
    assert msg == {
        "text": ":red_circle: FIRING: GpuMemoryLeak: GPU memory leak: rag-worker (pid 4011) on "
        "gpu-node-01 GPU 1",
        "blocks": [
            {
                "type": "header",
                "text": {
                    "type": "plain_text",
                    "text": ":red_circle: FIRING: GpuMemoryLeak",
                    "emoji": True,
                },
            },
            {
                "type": "rich_text",  # text from telemetry: shown as it is, styled by us
                "elements": [
                    {
                        "type": "rich_text_section",
                        "elements": [
                            {"type": "emoji", "name": "red_circle"},
                            {"type": "text", "text": " "},
                            {
                                "type": "text",
                                "text": "GPU memory leak: rag-worker (pid 4011) on "
                                "gpu-node-01 GPU 1",
                                "style": {"bold": True},
                            },
                            {"type": "text", "text": "\n"},
                            {"type": "text", "text": "Value:", "style": {"bold": True}},
                            {"type": "text", "text": " 1,300,000,000"},
                            {"type": "text", "text": "  ·  "},
                            {"type": "text", "text": "Expected:", "style": {"bold": True}},
                            {"type": "text", "text": " 0"},
                        ],
                    }
                ],
            },
            {
                "type": "section",
                "fields": [  # labels as they are: Slack formats nothing in plain_text
                    {"type": "plain_text", "text": "host: gpu-node-01", "emoji": False},
                    {"type": "plain_text", "text": "gpu: 1", "emoji": False},
                    {"type": "plain_text", "text": "pid: 4011", "emoji": False},
                    {"type": "plain_text", "text": "team: ml", "emoji": False},
                ],
            },
            {
                "type": "rich_text",
                "elements": [
                    {
                        "type": "rich_text_section",
                        "elements": [
                            {"type": "emoji", "name": "mag"},
                            {"type": "text", "text": " Likely cause: ", "style": {"bold": True}},
                            {"type": "text", "text": "FAISS index never reset"},
                        ],
                    }
                ],
            },
            {
                "type": "context",
                "elements": [
                    {
                        "type": "mrkdwn",
                        "text": f"<{STATUS_PAGE}/alerts/f1|Open in ragwatch>",
                        "verbatim": True,
                    },
                    {"type": "mrkdwn", "text": "since 2026-01-01T00:00:00Z", "verbatim": True},
                ],
            },
        ],
        "unfurl_links": False,
        "unfurl_media": False,
    }


def split_lines(elements: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """A rich text paragraph's elements, line by line (a line break is its own element)."""
    lines: list[list[dict[str, Any]]] = [[]]
    for e in elements:
        if e == {"type": "text", "text": "\n"}:
            lines.append([])
        else:
            lines[-1].append(e)
    return lines


async def test_slack_token_bucket_holds_one_message_per_second(
    session: aiohttp.ClientSession,
) -> None:
    with FakeSlack() as slack:
        sender = SlackSender(SlackConfig.from_mapping("chat", {"url": slack.url}), session)
        for n in many(4):  # each due alone, one right after the other
            assert await drain(sender, [n]) == [Delivered("HTTP 200")]
    assert len(slack.received) == 4
    assert min(gaps(slack)) >= 0.9, gaps(slack)
    assert sender.stats.rate_limited >= 3 and sender.stats.digests == 0


async def test_slack_burst_of_ten_becomes_one_digest(session: aiohttp.ClientSession) -> None:
    with FakeSlack() as slack:
        cfg = SlackConfig.from_mapping("chat", {"url": slack.url, "max_digest": 4})
        sender = SlackSender(cfg, session)
        out = await sender.send(many(10))
    assert all(isinstance(o, Delivered) and "digest of 10" in o.detail for o in out)
    (msg,) = slack.bodies()
    assert msg["text"] == ":red_circle: 10 alerts: 10 firing, 0 resolved"
    (paragraph,) = msg["blocks"][1]["elements"]
    lines = split_lines(paragraph["elements"])
    assert len(lines) == 4
    assert lines[0][:3] == [
        {"type": "emoji", "name": "red_circle"},
        {"type": "text", "text": " "},
        {"type": "text", "text": "FIRING", "style": {"bold": True}},
    ]
    assert lines[0][3]["text"].startswith(" GpuMemoryLeak: ")
    assert {"type": "text", "text": "host=h0", "style": {"code": True}} in lines[0]
    assert lines[0][-1] == {"type": "link", "url": f"{STATUS_PAGE}/alerts/fp0", "text": "details"}
    assert msg["blocks"][-1]["elements"][0]["text"] == "… and 6 more"
    assert sender.stats.digests == 1 and sender.stats.sent == 1


async def test_slack_burst_arriving_while_the_bucket_is_empty_takes_two_messages(
    session: aiohttp.ClientSession,
) -> None:
    with FakeSlack() as slack:
        sender = SlackSender(SlackConfig.from_mapping("chat", {"url": slack.url}), session)
        first, *rest = many(10)
        assert await sender.send([first]) == [Delivered("HTTP 200")]
        out = await drain(sender, rest)  # empty bucket: Retry ~1 s, then one digest of 9
    assert all(isinstance(o, Delivered) for o in out)
    assert slack.bodies()[1]["text"].startswith(":red_circle: 9 alerts: ")
    assert len(slack.received) == 2 and gaps(slack)[0] >= 0.9


@pytest.mark.parametrize("in_body", [False, True], ids=["header", "json-retry_after"])
async def test_slack_429_is_honoured_and_nothing_goes_to_the_url_before_retry_after(
    session: aiohttp.ClientSession, in_body: bool
) -> None:
    with FakeSlack() as slack:
        slack.rate_limit_next(1, retry_after=1, in_body=in_body)
        cfg = SlackConfig.from_mapping("chat", {"url": slack.url, "burst": 3})
        sender = SlackSender(cfg, session)
        batch = many(2)
        (out,) = await sender.send(batch[:1])
        assert isinstance(out, Retry) and out.after_s == 1.0 and "HTTP 429" in out.reason
        for _ in range(3):  # a notifier that keeps trying is held back without a request
            await asyncio.sleep(0.2)
            held = await sender.send(batch)
            assert all(isinstance(o, Retry) and 0 < (o.after_s or 0) < 1.0 for o in held)
        assert len(slack.received) == 1
        assert all(isinstance(o, Delivered) for o in await drain(sender, batch))
    assert len(slack.received) == 2 and gaps(slack)[0] >= 1.0
    assert sender.stats.rate_limited >= 1


async def test_slack_without_retry_after_waits_thirty_seconds(
    session: aiohttp.ClientSession,
) -> None:
    with FakeSlack() as slack:
        slack.then(429, b"rate_limited")
        sender = SlackSender(SlackConfig.from_mapping("chat", {"url": slack.url}), session)
        (out,) = await sender.send(many(1))
    assert isinstance(out, Retry) and out.after_s == 30.0


async def test_slack_escapes_hostile_labels_and_annotations(session: aiohttp.ClientSession) -> None:
    """Nothing from telemetry is parsed as mrkdwn: labels are plain_text, annotations (which
    rules template from labels) and digest lines rich text, so neither a mention, a link
    nor ``*`` / ``_`` / ``~`` / a backtick can ping, link or format."""
    fmt = "*URGENT* _all_ ~ok~ `rm`"
    hostile = alert(
        labels={
            "alertname": "GpuMemoryLeak",
            "host": "<!channel>",
            "service": "<http://evil.example|click me>",
            "instance": "<@U024BE7LH> & <#C024BE7LR>",
            "team": fmt,
        },
        annotations={
            "summary": f"<!here> leak on {fmt}",
            "description": f"grows on {fmt}",
            "hint": "see <https://evil.example|this>",
            "runbook": f"https://wiki/{fmt}",
        },
    )
    with FakeSlack() as slack:
        sender = SlackSender(SlackConfig.from_mapping("chat", {"url": slack.url}), session)
        assert await sender.send([note(hostile)]) == [Delivered("HTTP 200")]
        assert all(isinstance(o, Delivered) for o in await drain(sender, [note(hostile), *many(2)]))
    for msg in slack.bodies():
        for text in slack_texts(msg["blocks"], parsed=True):  # what Slack parses: ours only
            ours = re.sub(rf"<{re.escape(STATUS_PAGE)}[^|<>\s]*\|[^<>]*>", "", text)
            assert "<" not in ours and ">" not in ours, text
            assert not any(c in ours for c in "*~`") and "_all_" not in ours, text
    single = slack.bodies()[0]
    shown = [f["text"] for b in single["blocks"] for f in b.get("fields", [])]
    assert "host: <!channel>" in shown and f"team: {fmt}" in shown
    assert all(f["type"] == "plain_text" for b in single["blocks"] for f in b.get("fields", []))
    rich = [
        e
        for b in single["blocks"]
        if b["type"] == "rich_text"
        for e in b["elements"][0]["elements"]
    ]
    assert {"type": "text", "text": f"<!here> leak on {fmt}", "style": {"bold": True}} in rich
    assert {"type": "text", "text": f"grows on {fmt}"} in rich
    assert {"type": "text", "text": "see <https://evil.example|this>"} in rich
    assert "&lt;!here&gt; leak" in single["text"]  # the fallback: escaped
    digest = slack.bodies()[1]  # the labels that say where, in code style: unformatted
    where = [e for b in digest["blocks"] if b["type"] == "rich_text"
             for e in b["elements"][0]["elements"] if e.get("style") == {"code": True}]  # fmt: skip
    assert where[0]["text"].startswith("host=<!channel> service=<http://evil.example|click me>")


async def test_slack_keeps_to_block_kit_limits_for_a_huge_group(
    session: aiohttp.ClientSession,
) -> None:
    huge = {"summary": "s" * 5000, "description": "d" * 5000, "hint": "h" * 5000}
    labels = {f"label{i}": "v" * 3000 for i in range(15)}
    alerts = [
        alert(f"fp{i}", labels={**labels, "alertname": "A", "i": str(i)}, annotations=huge)
        for i in range(60)
    ]
    with FakeSlack() as slack:
        sender = SlackSender(SlackConfig.from_mapping("chat", {"url": slack.url}), session)
        assert await sender.send([note(*alerts)]) == [Delivered("HTTP 200")]  # FakeSlack checks
    (msg,) = slack.bodies()
    assert block_problems(msg["blocks"]) == [] and len(msg["blocks"]) <= 50
    assert sum(len(t) for t in slack_texts(msg["blocks"])) <= 12_000
    assert "more alerts not shown" in msg["blocks"][-1]["elements"][0]["text"]


@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [(400, b"invalid_payload", Failed), (404, b"channel_not_found", Failed),
     (410, b"channel_is_archived", Failed), (500, b"rollup_error", Retry)],
)  # fmt: skip
async def test_slack_classifies_answers(
    session: aiohttp.ClientSession, status: int, body: bytes, kind: type
) -> None:
    with FakeSlack() as slack:
        slack.then(status, body)
        (out,) = await SlackSender(SlackConfig("chat", _secret(slack.url)), session).send(many(1))
    assert type(out) is kind and body.decode() in out.reason  # type: ignore[attr-defined]


async def test_slack_timeout_is_retried(session: aiohttp.ClientSession) -> None:
    with SlowServer(delay_s=2.0) as slow:
        sender = SlackSender(SlackConfig("chat", _secret(slow.url), timeout_s=0.3), session)
        (out,) = await sender.send(many(1))
    assert isinstance(out, Retry) and "Timeout" in out.reason


def _secret(url: str) -> Secret:
    return Secret(url)


# ---------------------------------------------------------------- pagerduty


def pd_config(url: str, **extra: Any) -> PagerDutyConfig:
    return PagerDutyConfig.from_mapping("pager", {"routing_key": ROUTING_KEY, "url": url, **extra})


async def test_pagerduty_trigger_event_has_every_field(session: aiohttp.ClientSession) -> None:
    with FakePagerDuty() as pd:
        sender = PagerDutySender(pd_config(pd.url), session)
        assert await sender.send([note(alert())]) == [Delivered("1 event(s) accepted")]
    (ev,) = pd.events()
    a = alert()
    assert ev == {
        "routing_key": ROUTING_KEY,
        "dedup_key": dedup_key(a),
        "event_action": "trigger",
        "payload": {
            "summary": "GPU memory leak: rag-worker (pid 4011) on gpu-node-01 GPU 1",
            "source": "gpu-node-01",
            "severity": "critical",
            "timestamp": "2026-01-01T00:10:00Z",
            "class": "GpuMemoryLeak",
            "component": "GPU 1",
            "group": "ml",
            "custom_details": {
                "hint": "FAISS index never reset",
                "value": 1.3e9,
                "expected": 0.0,
                "labels": a.labels,
                "annotations": {"summary": a.annotations["summary"]},
                "starts_at": "2026-01-01T00:00:00Z",
                "fingerprint": "f1",
            },
        },
        "client": "ragwatch",
        "links": [{"href": f"{STATUS_PAGE}/alerts/f1", "text": "ragwatch: GpuMemoryLeak"}],
        "client_url": STATUS_PAGE,
    }


async def test_pagerduty_resolve_reuses_the_trigger_dedup_key_across_restarts(
    session: aiohttp.ClientSession,
) -> None:
    with FakePagerDuty() as pd:
        await PagerDutySender(pd_config(pd.url), session).send([note(alert())])
        async with aiohttp.ClientSession() as fresh:  # a restarted notifier
            out = await PagerDutySender(pd_config(pd.url), fresh).send(
                [note(alert(status="resolved"))]
            )
        assert out == [Delivered("1 event(s) accepted")]
    trigger, resolve = pd.events()
    assert resolve == {
        "routing_key": ROUTING_KEY,
        "dedup_key": trigger["dedup_key"],
        "event_action": "resolve",
    }
    # sha256 of ["GpuMemoryLeak", sorted labels]: fixed, so a new release resolves old alerts
    assert (
        trigger["dedup_key"]
        == "ragwatch-"
        + hashlib.sha256(
            b'["GpuMemoryLeak",[["alertname","GpuMemoryLeak"],["gpu","1"],["host","gpu-node-01"],'
            b'["pid","4011"],["team","ml"]]]'
        ).hexdigest()
    )


async def test_pagerduty_sliding_window_holds_rate_per_min(session: aiohttp.ClientSession) -> None:
    clock = Clock()
    with FakePagerDuty() as pd:
        sender = PagerDutySender(pd_config(pd.url, rate_per_min=5), session, clock=clock)
        batch = many(7)
        out = await sender.send(batch)
        assert [type(o) for o in out] == [Delivered] * 5 + [Retry] * 2
        assert [o.after_s for o in out[5:]] == [60.0, 60.0]  # type: ignore[union-attr]
        assert len(pd.received) == 5
        clock.now += 30
        out = await sender.send(batch[5:])
        assert [o.after_s for o in out] == [30.0, 30.0]  # type: ignore[union-attr]
        assert len(pd.received) == 5  # nothing sent while the window is full
        clock.now += 30.001
        assert await sender.send(batch[5:]) == [Delivered("1 event(s) accepted")] * 2
        # a notification with more alerts than the window holds gets there in two minutes
        big = note(
            *(
                alert(f"big{i}", labels={"alertname": "GpuMemoryLeak", "host": f"b{i}"})
                for i in range(7)
            )
        )
        clock.now += 60.001
        (first,) = await sender.send([big])
        assert isinstance(first, Retry) and first.after_s == pytest.approx(60.0)
        clock.now += 60.001
        assert await sender.send([big]) == [Delivered("7 event(s) accepted")]
    assert len(pd.received) == 14
    assert sender.stats.rate_limited == 3


async def test_pagerduty_classifies_answers_and_holds_after_429(
    session: aiohttp.ClientSession,
) -> None:
    clock = Clock()
    with FakePagerDuty() as pd:
        sender = PagerDutySender(pd_config(pd.url), session, clock=clock)
        pd.then(500)
        (out,) = await sender.send(many(1))
        assert isinstance(out, Retry) and out.after_s is None and "HTTP 500" in out.reason
        pd.then(400, b'{"status":"invalid event","message":"Event object is invalid"}')
        (out,) = await sender.send(many(1))
        assert isinstance(out, Failed) and "invalid event" in out.reason
        pd.then(429)
        (out,) = await sender.send(many(1))
        assert isinstance(out, Retry) and out.after_s == 30.0  # PagerDuty's advice
        clock.now += 29
        (out,) = await sender.send(many(1))
        assert isinstance(out, Retry) and out.after_s == pytest.approx(1.0)
        assert len(pd.received) == 3  # held: nothing sent
        clock.now += 1.001
        pd.then(429, Retry_After="5")
        (out,) = await sender.send(many(1))
        assert isinstance(out, Retry) and out.after_s == 5.0
        clock.now += 5.001
        assert await sender.send(many(1)) == [Delivered("1 event(s) accepted")]
    with SlowServer(delay_s=2.0) as slow:
        (out,) = await PagerDutySender(pd_config(slow.url, timeout_s=0.3), session).send(many(1))
    assert isinstance(out, Retry) and "Timeout" in out.reason


async def test_pagerduty_partly_accepted_notification_is_retried_without_resending(
    session: aiohttp.ClientSession,
) -> None:
    alerts = [
        alert(f"fp{i}", labels={"alertname": "GpuMemoryLeak", "host": f"h{i}"}) for i in range(3)
    ]
    with FakePagerDuty() as pd:
        sender = PagerDutySender(pd_config(pd.url), session)
        pd.then(202, b"{}").then(503)
        (out,) = await sender.send([note(*alerts)])
        assert isinstance(out, Retry)
        assert await sender.send([note(*alerts)]) == [Delivered("3 event(s) accepted")]
    keys = [e["dedup_key"] for e in pd.events()]
    assert keys == [
        dedup_key(alerts[0]),
        dedup_key(alerts[1]),
        dedup_key(alerts[1]),
        dedup_key(alerts[2]),
    ]


# ---------------------------------------------------------------- secrets


async def test_secrets_never_appear_in_logs_errors_reprs_or_outcomes(
    session: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    secrets = [SLACK_TOKEN, "xoxb-s3cret", ROUTING_KEY, HMAC_SECRET, "hook-tok3n"]
    seen: list[str] = []
    with FakeSlack() as slack, FakePagerDuty() as pd, FakeServer(path="/hook-tok3n") as rx:
        senders = [
            SlackSender(
                SlackConfig.from_mapping("chat", {"url": slack.url, "rate_per_s": 1000}), session
            ),
            PagerDutySender(pd_config(pd.url), session),
            WebhookSender(
                WebhookConfig.from_mapping("w", {"url": rx.url, "hmac_secret": HMAC_SECRET}),
                session,
            ),
        ]
        for server in (slack, pd, rx):
            server.then(500).then(400, b"bad").then(429, Retry_After="0")
        for s in senders:
            seen += [repr(s.config), str(s.config), s.describe()]
            for _ in range(4):
                seen += [repr(o) for o in await s.send(many(1))]
    for cfg in (
        SlackConfig("chat", _secret(f"http://127.0.0.1:1/services/{SLACK_TOKEN}"), timeout_s=0.2),
        pd_config(closed_port_url(), timeout_s=0.2),
    ):
        s2: Any = (
            SlackSender(cfg, session)
            if isinstance(cfg, SlackConfig)
            else PagerDutySender(cfg, session)
        )
        seen += [repr(o) for o in await s2.send(many(1))]
    for bad in (
        lambda: SlackConfig.from_mapping("chat", {"url": f"hxxp:/{SLACK_TOKEN}"}),
        lambda: SlackConfig.from_mapping("chat", {"url": slack.url, "rate_per_s": -1}),
        lambda: PagerDutyConfig.from_mapping("pager", {"routing_key": ROUTING_KEY, "bogus": 1}),
        lambda: WebhookConfig.from_mapping("w", {"url": rx.url + "?x", "hmac_secret": 42}),
    ):
        with pytest.raises(ConfigError) as err:
            bad()
        seen.append(str(err.value))
    assert len(caplog.records) >= 6  # failures and retries were logged
    for text in [caplog.text, *seen]:
        for secret in secrets:
            assert secret not in text, f"{secret!r} leaked into {text!r}"
