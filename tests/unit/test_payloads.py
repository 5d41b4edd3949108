"""The pure parts of the three senders (webhook, Slack, PagerDuty): payloads and configs.

Fuzzing the payload builders with any unicode in labels and annotations, huge strings,
odd numbers and times: they never raise, their output is JSON (no NaN), Slack's block
limits hold, user text cannot ping or link in Slack, and PagerDuty events keep to the
Events API v2 limits. Then each config's ``from_mapping``: one-line errors naming the
receiver and the field, never quoting a secret.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragwatch.config import Secret
from ragwatch.errors import ConfigError
from ragwatch.schema import Alert
from ragwatch.streams.notifier.notification import Notification
from ragwatch.streams.notifier.pagerduty import PagerDutyConfig, dedup_key, pagerduty_event
from ragwatch.streams.notifier.slack import SlackConfig, slack_digest, slack_message
from ragwatch.streams.notifier.webhook import WebhookConfig, webhook_body
from tests.fakes import block_problems, slack_texts, utf16

FUZZ = settings(
    derandomize=True,
    database=None,
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
SEVERITIES = ("critical", "error", "warning", "info")
CFG = PagerDutyConfig.from_mapping("pager", {"routing_key": "K" * 32})

# Short text of any unicode (surrogates excluded: they cannot be encoded), sometimes
# repeated into a huge string without hypothesis generating every character.
short = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
hostile = st.sampled_from(["<!channel>", "<!here|x>", "<@U1>", "<http://evil|x>", "&", ">", "|"])
piece = short | hostile
text = piece | st.builds(lambda s, n: s * n, piece.filter(bool), st.integers(1, 30_000))
labels = st.dictionaries(piece, text, max_size=14)
annotations = st.dictionaries(
    st.sampled_from(["summary", "description", "hint", "runbook"]) | short, text, max_size=6
)
numbers = st.floats(allow_nan=True, allow_infinity=True)
times = st.floats(min_value=0, max_value=1e300)
external_url = st.sampled_from(["", "http://ragwatch.example:8080", "https://rw/"]) | short

alerts = st.builds(
    Alert,
    rule=text,
    severity=st.sampled_from(SEVERITIES) | short,
    status=st.sampled_from(["firing", "resolved", "pending"]),
    labels=labels,
    annotations=annotations,
    value=numbers,
    expected=st.none() | numbers,
    starts_at=times,
    ends_at=st.none() | times,
    fingerprint=text,
    at=st.none() | times,
)


@st.composite
def notifications(draw: st.DrawFn, max_alerts: int = 8) -> Notification:
    group = draw(alerts, label="first")
    rest = draw(st.lists(alerts, max_size=max_alerts - 1))
    return Notification.of(
        draw(short), draw(labels), [group, *rest], external_url=draw(external_url)
    )


def strict_json(obj: Any) -> None:
    json.dumps(obj, allow_nan=False)


OUR_LINK = re.compile(r"<https?://[^\s<>|]+\|[^<>]*>")


def check_slack(msg: dict[str, Any]) -> None:
    strict_json(msg)
    blocks = msg["blocks"]
    assert block_problems(blocks) == []
    assert 1 <= len(blocks) <= 50
    assert sum(utf16(t) for t in slack_texts(blocks)) <= 12_000
    assert 0 < utf16(msg["text"]) <= 40_000
    for t in [msg["text"], *slack_texts(blocks, parsed=True)]:  # only our links: no <!channel>
        assert "<" not in OUR_LINK.sub("", t) and ">" not in OUR_LINK.sub("", t), t
    for t in slack_texts(blocks, parsed=True):  # mrkdwn is ours alone: no telemetry formats
        ours = OUR_LINK.sub("", t)
        ours = ours[1:-1] if ours[:1] == ours[-1:] == "_" else ours  # our italic notes
        assert not any(c in ours for c in "*_~`"), t


@FUZZ
@given(notifications(), st.integers(4096, 200_000))
def test_webhook_body_is_json_within_max_body_bytes(n: Notification, max_bytes: int) -> None:
    body = webhook_body(n, max_body_bytes=max_bytes)
    d = orjson.loads(body)
    assert len(d["alerts"]) + d["truncatedAlerts"] == len(n.alerts)
    assert len(body) <= max_bytes or len(d["alerts"]) == 1
    assert d["groupKey"] == n.group_key and d["version"] == "4"


@FUZZ
@given(notifications())
def test_slack_message_holds_slack_limits_and_escapes(n: Notification) -> None:
    check_slack(slack_message(n))


@FUZZ
@given(st.lists(notifications(max_alerts=3), min_size=1, max_size=12), st.integers(1, 40))
def test_slack_digest_holds_slack_limits_and_escapes(batch: list[Notification], k: int) -> None:
    msg = slack_digest(batch, max_digest=k)
    check_slack(msg)
    assert msg["text"].split(" ", 2)[1] == str(sum(len(n.alerts) for n in batch))


@FUZZ
@given(alerts, external_url)
def test_pagerduty_event_keeps_to_the_events_api(alert: Alert, url: str) -> None:
    event = pagerduty_event(alert, CFG, external_url=url)
    if alert.status == "pending":
        assert event is None
        return
    assert event is not None
    strict_json(event)
    assert len(orjson.dumps(event)) <= 512_000
    assert event["dedup_key"] == dedup_key(alert) and len(event["dedup_key"]) <= 255
    if alert.status == "firing":
        p = event["payload"]
        assert 0 < len(p["summary"]) <= 1024 and p["source"]
        assert p["severity"] in SEVERITIES
    else:
        assert event["event_action"] == "resolve"


def test_pagerduty_event_over_512_kb_drops_its_custom_details() -> None:
    labels = {f"label{i}": "v" * 4000 for i in range(200)}
    a = Alert("R", "critical", "firing", labels, {}, 1.0, None, 0.0, None, "fp")
    event = pagerduty_event(a, CFG)
    assert event is not None and len(orjson.dumps(event)) <= 512_000
    assert event["payload"]["custom_details"]["note"].startswith("custom details removed")


# ---------------------------------------------------------------- configs

SLACK_URL = "https://hooks.slack.com/services/T0/B0/s3cretPath"


def test_configs_from_mapping_with_defaults_and_names_type_tolerated() -> None:
    slack = SlackConfig.from_mapping("chat", {"name": "chat", "type": "slack", "url": SLACK_URL})
    assert slack == SlackConfig("chat", Secret(SLACK_URL))
    pd = PagerDutyConfig.from_mapping("pager", {"routing_key": Secret("K" * 32), "timeout_s": "2s"})
    assert (pd.url, pd.rate_per_min, pd.timeout_s) == (
        "https://events.pagerduty.com/v2/enqueue",
        120,
        2.0,
    )
    assert pd.source_labels == ("host", "service", "instance")
    hook = WebhookConfig.from_mapping("w", {"url": "http://h:9/x", "max_body_bytes": 65536})
    assert (hook.hmac_secret, hook.timeout_s, hook.max_body_bytes) == (None, 10.0, 65536)


U = SLACK_URL
BAD = [
    (SlackConfig, {}, "r.url: required"),
    (SlackConfig, {"url": U[8:]}, "r.url: must be an http(s)://host/... URL, got a URL that"),
    (SlackConfig, {"url": U, "rate_per_s": 0}, "r.rate_per_s: must be > 0, got 0"),
    (SlackConfig, {"url": U, "burst": 1.5}, "r.burst: expected an integer >= 1, got 1.5"),
    (SlackConfig, {"url": U, "channel": "#x"}, "r: unknown field(s) channel (a slack receiver"),
    (SlackConfig, {"url": U, "type": "pagerduty"}, "r.type: must be 'slack' here"),
    (PagerDutyConfig, {"routing_key": 12345}, "r.routing_key: expected a string, got int"),
    (
        PagerDutyConfig,
        {"routing_key": "k", "severity_map": {"critical": "page"}},
        "r.severity_map.critical: must be one of critical, error, warning, info, got 'page'",
    ),
    (
        PagerDutyConfig,
        {"routing_key": "k", "rate_per_min": 0},
        "r.rate_per_min: expected an integer >= 1",
    ),
    (
        PagerDutyConfig,
        {"routing_key": "k", "url": "ftp://x"},
        "r.url: must be an http(s)://host/... URL, got 'ftp://x'",
    ),
    (
        PagerDutyConfig,
        {"routing_key": "k", "source_labels": "host"},
        "r.source_labels: expected a list",
    ),
    (
        WebhookConfig,
        {"url": "http://h/x", "timeout_s": "soon"},
        "r.timeout_s: expected a duration (e.g. 10, 10s, 2m), got 'soon'",
    ),
    (
        WebhookConfig,
        {"url": "http://h/x", "max_body_bytes": 100},
        "r.max_body_bytes: expected an integer >= 4096",
    ),
    (WebhookConfig, ["http://h/x"], "r: expected a mapping, got list"),
]


@pytest.mark.parametrize(("cls", "d", "message"), BAD)
def test_config_errors_name_the_receiver_and_the_field(cls: Any, d: Any, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        cls.from_mapping("r", d)
    assert str(err.value).startswith(f"receiver {message}"), str(err.value)
    assert "\n" not in str(err.value) and "s3cretPath" not in str(err.value)


# ---------------------------------------------------------------- re-learnt, not recovered


def _relearned() -> Alert:
    note = "not recovered: the baseline accepted the new level 24.0 h after the alert started"
    return Alert(
        rule="TokensPerRequestDrop",
        severity="warning",
        status="resolved",
        labels={"alertname": "TokensPerRequestDrop", "service": "rag", "instance": "rag-1"},
        annotations={
            "summary": "tokens per request 159, -36 %",
            "resolution": note + " (159 vs 248)",
        },
        value=-0.36,
        expected=159.0,
        starts_at=0.0,
        ends_at=86400.0,
        fingerprint="f9",
        resolution="relearned",
    )


def test_a_relearned_resolution_is_never_shown_as_a_recovery() -> None:
    a = _relearned()
    n = Notification.of("r", {"alertname": a.rule}, [a])
    slack = orjson.dumps(slack_message(n)).decode()
    assert "NOT RECOVERED (new level accepted)" in slack and "159 vs 248" in slack
    assert ":white_check_mark:" not in slack
    body = orjson.loads(webhook_body(n))
    (alert,) = body["alerts"]
    assert alert["status"] == "resolved" and alert["resolution"] == "relearned"
    assert "159 vs 248" in alert["annotations"]["resolution"]
    event = pagerduty_event(a, CFG)
    assert event is not None and event["event_action"] == "trigger"  # the incident stays open
    assert event["payload"]["summary"].startswith("NOT RECOVERED, new level accepted")


def test_a_recovery_still_resolves_everywhere() -> None:
    from dataclasses import replace

    a = replace(_relearned(), resolution="recovered", annotations={"summary": "back"})
    n = Notification.of("r", {"alertname": a.rule}, [a])
    assert "RESOLVED" in orjson.dumps(slack_message(n)).decode()
    assert pagerduty_event(a, CFG) == {
        "routing_key": "K" * 32,
        "dedup_key": dedup_key(a),
        "event_action": "resolve",
    }
    (alert,) = orjson.loads(webhook_body(n))["alerts"]
    assert alert["resolution"] == "recovered"
