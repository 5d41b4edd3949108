"""Routing, grouping, inhibition and silences of the notifier, on its event-time clock:
Alertmanager's group_wait / group_interval / repeat_interval, never a resolve for an alert
the receiver was not told about, always a resolve for one it was."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ragwatch.errors import ConfigError
from ragwatch.schema import Alert
from ragwatch.silences import Silence, parse_matchers
from ragwatch.streams.notifier.grouping import Grouper
from ragwatch.streams.notifier.notification import Notification
from ragwatch.streams.notifier.routing import default_config, load_config, parse_config

CONFIG: dict[str, Any] = {
    "receivers": [
        {"name": "chat", "type": "slack", "url": "${SLACK_URL}"},
        {"name": "pager", "type": "pagerduty", "routing_key": "${PD_KEY}"},
    ],
    "route": {
        "receiver": "chat",
        "group_by": ["alertname", "host"],
        "group_wait": "30s",
        "group_interval": "5m",
        "repeat_interval": "4h",
        "routes": [
            {"matchers": {"severity": "critical"}, "receiver": "pager", "continue": True},
            {"matchers": {"service": "=~rag-.*"}, "group_by": ["service"]},
        ],
    },
    "inhibit_rules": [
        {
            "source_matchers": {"alertname": "GpuOomKill"},
            "target_matchers": {"alertname": "GpuMemoryLeak"},
            "equal": ["host", "gpu"],
        }
    ],
}
ENV = {"SLACK_URL": "https://hooks.slack.com/services/T/B/secret", "PD_KEY": "k" * 32}


def alert(
    name: str, status: str = "firing", at: float = 0.0, starts: float = 0.0, **labels: str
) -> Alert:
    labels = {"alertname": name, "severity": "warning", **labels}
    fp = name + "|" + ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    return Alert(
        rule=name,
        severity=labels["severity"],
        status=status,  # type: ignore[arg-type]
        labels=labels,
        annotations={"summary": name},
        value=1.0,
        expected=None,
        starts_at=starts,
        ends_at=at if status == "resolved" else None,
        fingerprint=fp,
        at=at,
    )


def names(ns: list[Notification]) -> list[tuple[str, str, list[str]]]:
    return [
        (n.receiver, n.status, sorted(a.fingerprint.split("|")[0] for a in n.alerts)) for n in ns
    ]


@pytest.fixture
def grouper() -> Grouper:
    return Grouper(parse_config(CONFIG, ENV))


def test_config_expands_environment_and_inherits_route_fields() -> None:
    cfg = parse_config(CONFIG, ENV)
    assert cfg.receivers["chat"]["url"] == ENV["SLACK_URL"]
    crit, rag = cfg.route.routes
    assert crit.group_by == ("alertname", "host") and crit.group_wait_s == 30.0
    assert rag.group_by == ("service",) and rag.receiver == "chat"
    assert [r.receiver for r in cfg.route.match({"severity": "critical", "service": "rag-a"})] == [
        "pager",
        "chat",
    ]
    assert [r.path for r in cfg.route.match({"severity": "info"})] == ["0"]
    assert [r.path for r in cfg.route.match({"severity": "critical", "service": "rag-api"})] == [
        "0.0",
        "0.1",
    ]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["receivers"][0].update(type="email"), "type: must be one of"),
        (lambda d: d["route"].update(receiver="nobody"), "'nobody' is not a configured receiver"),
        (lambda d: d["route"].update(group_wait="soon"), "route.group_wait: bad duration"),
        (lambda d: d["route"]["routes"][1].update(matchers={"x": "=~("}), "bad regular expression"),
        (lambda d: d["route"].update(color="red"), "unknown field(s) color"),
        (lambda d: d["receivers"][1].update(routing_key="${MISSING}"), "MISSING is not set"),
        (lambda d: d["receivers"].append(dict(d["receivers"][0])), "duplicate receiver name"),
    ],
)
def test_config_errors_name_the_field(mutate: Any, message: str) -> None:
    import copy

    d = copy.deepcopy(CONFIG)
    mutate(d)
    with pytest.raises(ConfigError, match=None) as err:
        parse_config(d, ENV, "notify.yaml")
    assert message in str(err.value)


def test_load_config_reads_yaml_and_defaults_without_a_file(tmp_path: Path) -> None:
    f = tmp_path / "notify.yaml"
    f.write_text("receivers: [{name: w, type: webhook, url: 'http://x/h'}]\nroute: {receiver: w}\n")
    assert list(load_config(f, {}).receivers) == ["w"]
    (tmp_path / "bad.yaml").write_text("route: [")
    with pytest.raises(ConfigError, match=r"bad\.yaml:1:9: expected the node content"):
        load_config(tmp_path / "bad.yaml", {})
    d = default_config(["http://a/1", "http://b/2"])
    assert [r.receiver for r in d.route.match({"alertname": "X"})] == ["webhook-1", "webhook-2"]


def test_group_wait_then_group_interval_then_repeat(grouper: Grouper) -> None:
    grouper.add(alert("Leak", host="h1"), now=0.0)
    grouper.add(alert("Leak", host="h1", gpu="1"), now=10.0)  # same group (alertname, host)
    assert grouper.flush(now=29.0) == []
    first = grouper.flush(now=30.0)
    assert names(first) == [("chat", "firing", ["Leak", "Leak"])]
    assert first[0].group_labels == {"alertname": "Leak", "host": "h1"}
    assert grouper.flush(now=31.0) == []  # nothing new
    grouper.add(alert("Leak", "resolved", at=60.0, host="h1"), now=60.0)
    assert grouper.flush(now=200.0) == []  # group_interval: 5 minutes after the last one
    update = grouper.flush(now=330.0)
    assert names(update) == [("chat", "firing", ["Leak", "Leak"])]
    assert sorted(a.status for a in update[0].alerts) == ["firing", "resolved"]
    assert grouper.flush(now=330.0 + 4 * 3600 - 1) == []
    repeat = grouper.flush(now=330.0 + 4 * 3600)
    assert [n.reason for n in repeat] == ["repeat"] and len(repeat[0].alerts) == 1
    assert repeat[0].key != update[0].key


def test_continue_lets_an_alert_match_later_siblings_too(grouper: Grouper) -> None:
    grouper.add(alert("Oom", severity="critical", host="h1", gpu="1"), now=0.0)
    assert [n.receiver for n in grouper.flush(now=30.0)] == ["pager"]  # as Alertmanager
    grouper.add(alert("Slow", severity="critical", service="rag-api"), now=40.0)
    out = grouper.flush(now=70.0)
    assert sorted((n.receiver, tuple(n.group_labels)) for n in out) == [
        ("chat", ("service",)),
        ("pager", ("alertname", "host")),
    ]


def test_a_resolve_is_sent_only_to_receivers_that_heard_of_the_firing(grouper: Grouper) -> None:
    grouper.add(alert("Leak", host="h1"), now=0.0)
    grouper.add(alert("Leak", "resolved", at=10.0, host="h1"), now=10.0)  # before group_wait
    assert grouper.flush(now=30.0) == []  # resolved before anyone was told: nothing to say
    grouper.add(alert("Other", "resolved", at=40.0, host="h1"), now=40.0)  # never seen firing
    assert grouper.flush(now=400.0) == []
    assert grouper.stats.dropped_resolved >= 2


def test_replayed_transitions_change_nothing_and_keep_the_key(grouper: Grouper) -> None:
    a = alert("Leak", host="h1")
    grouper.add(a, now=0.0)
    (n,) = grouper.flush(now=30.0)
    grouper.add(a, now=40.0)  # the same transition again
    assert grouper.flush(now=1000.0) == []
    other = Grouper(parse_config(CONFIG, ENV))
    other.add(a, now=0.0)
    assert [x.key for x in other.flush(now=30.0)] == [n.key]  # same transition -> same key


def test_inhibition_mutes_the_leak_while_the_oom_fires_and_not_after(grouper: Grouper) -> None:
    grouper.add(alert("GpuOomKill", host="h1", gpu="1"), now=0.0)
    grouper.add(alert("GpuMemoryLeak", host="h1", gpu="1"), now=0.0)
    grouper.add(alert("GpuMemoryLeak", host="h2", gpu="1"), now=0.0)  # other host: not muted
    out = grouper.flush(now=30.0)
    hosts = sorted(a.labels["host"] for n in out for a in n.alerts if a.rule == "GpuMemoryLeak")
    assert hosts == ["h2"] and grouper.stats.inhibited == 1
    grouper.add(alert("GpuOomKill", "resolved", at=100.0, host="h1", gpu="1"), now=100.0)
    later = grouper.flush(now=30.0 + 400.0)
    leaks = [a for n in later for a in n.alerts if a.rule == "GpuMemoryLeak"]
    assert [a.labels["host"] for a in leaks] == ["h1"]  # sent once the OOM alert resolved


# Issue 32: a rule whose source also matches its target (any Gpu* alert mutes a leak on
# its host). Two leaks on one host match both sides; each muted the other: 0 pages.
GPU_MUTES_LEAK = {
    "source_matchers": {"alertname": "=~Gpu.*"},
    "target_matchers": {"alertname": "GpuMemoryLeak"},
    "equal": ["host"],
}


def with_rules(*rules: dict[str, Any]) -> Grouper:
    return Grouper(parse_config({**CONFIG, "inhibit_rules": list(rules)}, ENV))


def sent(ns: list[Notification], label: str = "host") -> list[tuple[str, str]]:
    return sorted((a.rule, a.labels.get(label, "")) for n in ns for a in n.alerts)


def test_alerts_matching_both_sides_of_a_rule_never_mute_each_other() -> None:
    """Alertmanager's rule: an alert matching both sides cannot be inhibited by alerts
    that also match both sides, itself included."""
    g = with_rules(GPU_MUTES_LEAK)
    g.add(alert("GpuMemoryLeak", host="h1", gpu="0"), now=0.0)
    g.add(alert("GpuMemoryLeak", host="h1", gpu="1"), now=0.0)
    assert sent(g.flush(now=30.0), "gpu") == [("GpuMemoryLeak", "0"), ("GpuMemoryLeak", "1")]
    assert g.stats.inhibited == 0


def test_a_source_missing_the_target_side_mutes_alerts_matching_both() -> None:
    g = with_rules(GPU_MUTES_LEAK)
    g.add(alert("GpuXid", host="h1"), now=0.0)  # a source only: it mutes h1's leaks
    g.add(alert("GpuMemoryLeak", host="h1", gpu="0"), now=0.0)
    g.add(alert("GpuMemoryLeak", host="h1", gpu="1"), now=0.0)
    g.add(alert("GpuMemoryLeak", host="h2", gpu="0"), now=0.0)  # other host: sent
    assert sent(g.flush(now=30.0)) == [("GpuMemoryLeak", "h2"), ("GpuXid", "h1")]
    assert g.stats.inhibited == 2
    g.add(alert("GpuXid", "resolved", at=100.0, host="h1"), now=100.0)
    later = g.flush(now=30.0 + 400.0)
    assert sent(later, "gpu") == [("GpuMemoryLeak", "0"), ("GpuMemoryLeak", "1"), ("GpuXid", "")]


def test_only_a_firing_source_mutes_and_missing_equal_labels_are_equal() -> None:
    """As Alertmanager: a label missing on both alerts is equal (missing = empty); one
    missing on one side only is not; a pending source mutes nothing."""
    g = with_rules(
        {
            "source_matchers": {"alertname": "GpuOomKill"},
            "target_matchers": {"alertname": "GpuMemoryLeak"},
            "equal": ["cluster"],
        }
    )
    g.add(alert("GpuOomKill", "pending", host="h0", cluster="c2"), now=0.0)
    g.add(alert("GpuMemoryLeak", host="h0", cluster="c2"), now=0.0)  # source only pending
    g.add(alert("GpuOomKill", host="h1"), now=0.0)  # no cluster label
    g.add(alert("GpuMemoryLeak", host="h2"), now=0.0)  # none either: muted
    g.add(alert("GpuMemoryLeak", host="h3", cluster="c1"), now=0.0)  # c1 vs none: sent
    out = g.flush(now=30.0)
    assert sent(out) == [("GpuMemoryLeak", "h0"), ("GpuMemoryLeak", "h3"), ("GpuOomKill", "h1")]


def test_a_cycle_of_rules_mutes_both_alerts_as_alertmanager_does() -> None:
    """X mutes Y and Y mutes X: neither alert matches both sides of one rule, so each is
    muted by the other while both fire (the load warns about it: test_routing_config)."""
    g = with_rules(
        {"source_matchers": {"alertname": "X"}, "target_matchers": {"alertname": "Y"}},
        {"source_matchers": {"alertname": "Y"}, "target_matchers": {"alertname": "X"}},
    )
    g.add(alert("X", host="h1"), now=0.0)
    g.add(alert("Y", host="h1"), now=0.0)
    assert g.flush(now=30.0) == [] and g.stats.inhibited == 2


def test_without_a_file_a_leak_mutes_its_gpus_memory_high() -> None:
    """The default inhibition: the leak filling its GPU is one fault, paged once by the leak
    alert; the same GPU's GpuMemoryHigh is muted, another GPU's still pages."""
    g = Grouper(default_config(["http://a/1"]))
    g.add(alert("GpuMemoryLeakSlow", host="h1", gpu="1", pid="7"), now=0.0)
    g.add(alert("GpuMemoryHigh", host="h1", gpu="1"), now=10.0)
    g.add(alert("GpuMemoryHigh", host="h1", gpu="2"), now=10.0)  # no leak there: a page
    sent = [(a.rule, a.labels["gpu"]) for n in g.flush(now=20.0) for a in n.alerts]
    assert sorted(sent) == [("GpuMemoryHigh", "2"), ("GpuMemoryLeakSlow", "1")]
    assert g.stats.inhibited == 1


def test_a_source_that_fired_after_a_late_target_was_due_does_not_mute_it() -> None:
    """The worker's events path runs ahead of its GPU path: the OOM kill of 12:13 reaches
    the notifier before the GPU's "memory over 95 %" of 08:44. Live, the 08:44 page went
    out hours before the OOM; late, it must go out too (the demo's story, issue 34's CI).
    A source that fired before the target still mutes it, however late either arrives."""
    g = with_rules(
        {
            "source_matchers": {"alertname": "GpuOomKill"},
            "target_matchers": {"alertname": "GpuMemoryHigh"},
            "equal": ["host", "gpu"],
        }
    )
    oom, high = 12 * 3600.0, 8 * 3600.0
    g.add(alert("GpuOomKill", at=oom, starts=oom, host="h1", gpu="1"), now=oom)
    g.add(alert("GpuMemoryHigh", at=high, starts=high, host="h1", gpu="1"), now=oom + 1)
    g.add(alert("GpuMemoryHigh", at=oom + 5, starts=oom + 5, host="h1", gpu="2"), now=oom + 5)
    g.add(alert("GpuOomKill", at=high, starts=high, host="h2", gpu="1"), now=oom + 6)
    g.add(alert("GpuMemoryHigh", at=oom, starts=oom, host="h2", gpu="1"), now=oom + 6)
    got = sent(g.flush(now=oom + 40.0), "gpu")
    assert ("GpuMemoryHigh", "1") in got and got.count(("GpuMemoryHigh", "1")) == 1
    assert ("GpuMemoryHigh", "2") in got  # no OOM on GPU 2
    assert g.stats.inhibited == 1  # h2's: its OOM (08:00) fired before its high (12:00)
    hosts = sorted(a.labels["host"] for n in g.flush(now=oom + 40.0) for a in n.alerts)
    assert hosts == []


def test_without_a_file_a_cause_of_slow_answers_mutes_the_latency_backstop() -> None:
    """A queue that makes an instance's answers slow is paged by QueueWaitHigh; the same
    instance's E2eLatencyDeviation is muted, another instance's still pages."""
    g = Grouper(default_config(["http://a/1"]))
    g.add(alert("QueueWaitHigh", service="rag", instance="a"), now=0.0)
    g.add(alert("E2eLatencyDeviation", service="rag", instance="a"), now=10.0)
    g.add(alert("E2eLatencyDeviation", service="rag", instance="b"), now=10.0)
    sent = [(a.rule, a.labels["instance"]) for n in g.flush(now=20.0) for a in n.alerts]
    assert sorted(sent) == [("E2eLatencyDeviation", "b"), ("QueueWaitHigh", "a")]
    assert g.stats.inhibited == 1


def test_silences_mute_while_active_but_never_swallow_a_resolve(grouper: Grouper) -> None:
    s = Silence.new(parse_matchers(["host=h1"]), comment="maintenance", author="t", now=0.0)
    muted = lambda a: s.active(0.0) and s.matches(a.labels)  # noqa: E731
    grouper.add(alert("Leak", host="h1"), now=0.0)
    assert grouper.flush(now=30.0, silenced=muted) == [] and grouper.stats.silenced == 1
    assert names(grouper.flush(now=30.0 + 300.0)) == [("chat", "firing", ["Leak"])]  # expired
    grouper.add(alert("Leak", "resolved", at=400.0, host="h1"), now=400.0)
    out = grouper.flush(now=1000.0, silenced=muted)  # silenced again: the resolve still goes
    assert names(out) == [("chat", "resolved", ["Leak"])]


def test_group_state_survives_a_restart(grouper: Grouper) -> None:
    grouper.add(alert("Leak", host="h1"), now=0.0)
    grouper.add(alert("Oom", severity="critical", host="h1"), now=0.0)  # pager
    grouper.flush(now=30.0)
    restarted = Grouper(parse_config(CONFIG, ENV))
    assert restarted.loads(grouper.dumps()) == 2
    restarted.add(alert("Leak", "resolved", at=100.0, host="h1"), now=100.0)
    assert names(restarted.flush(now=400.0)) == [("chat", "resolved", ["Leak"])]


def test_silence_windows_and_validation() -> None:
    sat_2am = 1_767_405_600.0  # Saturday 2026-01-03 02:00 UTC
    w = Silence.new(
        {"host": "h"}, comment="c", author="a", now=0.0, cron="0 2 * * 6", duration_s=3600
    )
    assert [w.active(sat_2am + d) for d in (-1, 0, 3599, 3600)] == [False, True, True, False]
    assert w.state(sat_2am + 7200) == "pending"
    assert Silence.from_dict(w.to_dict()) == w
    for kwargs, msg in (
        ({"cron": "every saturday", "duration_s": 60.0}, "bad cron"),
        ({"cron": "0 2 * * 6"}, "needs --duration"),
        ({"duration_s": -1.0}, "duration must be > 0"),
    ):
        with pytest.raises(ConfigError, match=msg):
            Silence.new({"host": "h"}, comment="c", author="a", now=0.0, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="bad matcher"):
        parse_matchers(["novalue"])
    assert parse_matchers(["alertname=~Gpu.*"]) == {"alertname": "=~Gpu.*"}


def test_without_a_notify_file_the_webhook_settings_make_the_receivers(tmp_path: Path) -> None:
    from ragwatch.commands.notify import notify_config
    from ragwatch.config import Settings
    from ragwatch.streams.notifier.webhook import WebhookConfig

    settings = Settings.from_env(
        {
            "RAGWATCH_WEBHOOK_URLS": "http://a/1,http://b/2",
            "RAGWATCH_WEBHOOK_TIMEOUT": "2.5",
            "RAGWATCH_WEBHOOK_MAX_ATTEMPTS": "3",
            "RAGWATCH_WEBHOOK_HMAC_SECRET": "s3cret",
        }
    )
    cfg = notify_config(settings, {})
    assert cfg.max_attempts == 3
    hooks = [WebhookConfig.from_mapping(n, r) for n, r in cfg.receivers.items()]
    assert [(h.url, h.timeout_s) for h in hooks] == [("http://a/1", 2.5), ("http://b/2", 2.5)]
    assert all(h.hmac_secret is not None and h.hmac_secret.get() == "s3cret" for h in hooks)
    f = tmp_path / "notify.yaml"
    f.write_text("receivers: [{name: w, type: webhook, url: 'http://x/h'}]\nroute: {receiver: w}\n")
    with_file = Settings.from_env(
        {"RAGWATCH_NOTIFY_FILE": str(f), "RAGWATCH_WEBHOOK_URLS": "http://a/1"}
    )
    assert list(notify_config(with_file, {}).receivers) == ["w"]


def test_ragwatch_notify_refuses_a_bad_receiver_before_it_connects(tmp_path: Path) -> None:
    """Port 1 refuses connections: had the notifier connected first, the error would be
    about Kafka, after seconds of retries."""
    from ragwatch.commands.notify import run_notifier
    from ragwatch.config import Settings

    f = tmp_path / "notify.yaml"
    f.write_text(
        "receivers: [{name: w, type: webhook, url: 'http://x/h', timeout: 2s}]\n"
        "route: {receiver: w}\n"
    )
    env = {
        "RAGWATCH_NOTIFY_FILE": str(f),
        "RAGWATCH_KAFKA_BOOTSTRAP": "127.0.0.1:1",
        "RAGWATCH_REDIS_URL": "redis://127.0.0.1:1/0",
    }
    with pytest.raises(
        ConfigError, match=r"notify\.yaml:1:13: receivers\[0\]: unknown field\(s\) timeout"
    ):
        run_notifier(Settings.from_env(env), env)


def test_a_generic_alert_outliving_its_specific_cause_is_its_tail_and_not_told() -> None:
    """Without a file, a specific alert on an instance mutes its ServiceAnomaly while it
    fires; after it resolved, a ServiceAnomaly that fired with it is the incident's tail,
    muted until it resolves (a rhythm that learnt part of a long fault takes hours), and
    one that fires after it is muted for 30 min (its linger), told if it still fires
    then. A restarted notifier remembers the source that resolved."""
    g = Grouper(default_config(["http://a/1"]))
    generic = {"service": "rag", "anomaly": "generic"}
    g.add(alert("QueueWaitHigh", at=0.0, service="rag", instance="a"), now=0.0)
    g.add(alert("QueueWaitHigh", at=0.0, service="rag", instance="b"), now=0.0)
    g.add(alert("ServiceAnomaly", at=600.0, instance="a", **generic), now=600.0)
    assert sent(g.flush(now=601.0), "instance") == [("QueueWaitHigh", "a"), ("QueueWaitHigh", "b")]
    for inst in ("a", "b"):
        g.add(alert("QueueWaitHigh", "resolved", at=3600.0, service="rag", instance=inst), 3600.0)
    # b's deviation began after its queue alert resolved: another anomaly, in the linger
    g.add(alert("ServiceAnomaly", at=3700.0, starts=3650.0, instance="b", **generic), 3700.0)
    assert sent(g.flush(now=3701.0), "instance") == [("QueueWaitHigh", "a"), ("QueueWaitHigh", "b")]
    restarted = Grouper(default_config(["http://a/1"]))
    restarted.loads(g.dumps())
    assert restarted.flush(now=3600.0 + 1799.0) == []  # b: still in the linger
    told = restarted.flush(now=3600.0 + 1800.0 + 60.0)
    assert sent(told, "instance") == [("ServiceAnomaly", "b")]  # a: the tail, muted
    assert restarted.flush(now=4 * 3600.0) == []
    restarted.add(alert("ServiceAnomaly", "resolved", at=5 * 3600.0, instance="a", **generic),
                  now=5 * 3600.0)  # fmt: skip
    assert restarted.flush(now=5 * 3600.0 + 60) == []  # never told, so its end is not either


def test_a_generic_alert_whose_deviation_began_during_the_specific_one_is_its_tail() -> None:
    """A retrieval fault at a quiet hour: the stage's windows drain for half an hour after
    it, so ServiceAnomaly, pending since the fault's middle, fires a minute after
    RetrievalSlowdown resolved: the incident's tail, muted until it resolves, never told
    (bench/space_real.py's worlds 23 and 25 paged it 42-50 min after their faults)."""
    g = Grouper(default_config(["http://a/1"]))
    where = {"service": "rag", "instance": "a"}
    g.add(alert("RetrievalSlowdown", at=0.0, **where), now=0.0)
    assert sent(g.flush(now=1.0), "instance") == [("RetrievalSlowdown", "a")]
    g.add(alert("RetrievalSlowdown", "resolved", at=2400.0, **where), now=2400.0)
    assert sent(g.flush(now=2401.0), "instance") == [("RetrievalSlowdown", "a")]  # resolved
    g.add(alert("ServiceAnomaly", at=2460.0, starts=960.0, anomaly="generic", **where), 2460.0)
    assert g.flush(now=2460.0 + 1800.0 + 60.0) == []  # past the linger: still the tail
    g.add(alert("ServiceAnomaly", "resolved", at=9000.0, starts=960.0, anomaly="generic",
                **where), now=9000.0)  # fmt: skip
    assert g.flush(now=9060.0) == []


def test_a_linger_in_a_notify_file_is_a_duration() -> None:
    rule = {"source_matchers": {"alertname": "A"}, "target_matchers": {"alertname": "B"}}
    g = with_rules({**rule, "linger": "10m"})
    assert g.config.inhibit_rules[0].linger_s == 600.0
    with pytest.raises(ConfigError, match=r"inhibit_rules\[0\]\.linger: bad duration"):
        with_rules({**rule, "linger": "soon"})
