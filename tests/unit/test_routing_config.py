"""The notify file is checked key by key when it is read: every error is one line that
names the file, the line and column, and the path of the bad value (issue 29, point 9).

Files are written to ``tmp_path`` and read with ``load_config``, the notifier's entry
point (``ragwatch notify`` calls it before it connects to anything).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from ragwatch.errors import ConfigError
from ragwatch.matchers import Matcher, may_overlap
from ragwatch.streams.notifier.routing import load_config, parse_config

ROOT = Path(__file__).resolve().parents[2]
HEAD = """\
receivers:
  - {name: chat, type: webhook, url: "http://chat.example/hook"}
  - {name: pager, type: webhook, url: "http://pager.example/hook"}
"""


def load(tmp_path: Path, text: str) -> str:
    """The one-line error of loading ``text`` as a notify file, the file's path cut."""
    path = tmp_path / "notify.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path, {})
    message = str(err.value)
    assert message.startswith(f"{path}:") and "\n" not in message
    return message[len(str(path)) :]


def test_a_quoted_false_in_continue_is_refused_where_it_is(tmp_path: Path) -> None:
    """It was read as true: every later sibling route got the alert too."""
    text = HEAD + (
        "route:\n"
        "  receiver: chat\n"
        "  routes:\n"
        "    - matchers: {severity: critical}\n"
        "      receiver: pager\n"
        '      continue: "false"\n'
        "    - receiver: chat\n"
    )
    assert load(tmp_path, text) == (
        ":9:17: route.routes[0].continue: expected true or false, got the string 'false' "
        "(write false without quotes)"
    )
    (tmp_path / "ok.yaml").write_text(text.replace('"false"', "false"))
    cfg = load_config(tmp_path / "ok.yaml", {})
    assert [r.receiver for r in cfg.route.match({"severity": "critical"})] == ["pager"]


def test_equal_takes_label_names_only(tmp_path: Path) -> None:
    text = HEAD + (
        "route: {receiver: chat}\n"
        "inhibit_rules:\n"
        "  - source_matchers: {alertname: GpuOomKill}\n"
        "    target_matchers: {alertname: GpuMemoryLeak}\n"
        "    equal: [null, 3]\n"
    )
    assert load(tmp_path, text) == (
        ":8:13: inhibit_rules[0].equal[0]: expected a label name, got null"
    )


@pytest.mark.parametrize(
    ("route", "message"),
    [
        (
            "{receiver: chat, group_by: [alertname, 'host name']}",
            ":4:47: route.group_by[1]: 'host name' is not a label name (letters, digits and _, "
            "not starting with a digit)",
        ),
        (
            "{receiver: chat, group_by: [host, host]}",
            ":4:42: route.group_by[1]: 'host' is listed twice",
        ),
        (
            "{receiver: chat, group_by: ['...', host]}",
            ":4:35: route.group_by: '...' (every label) goes alone",
        ),
        ("{receiver: chat, group_by: host}", ":4:35: route.group_by: expected a list of label"),
        (
            "{receiver: chat, matchers: {severity: critical}}",
            ":4:35: route.matchers: not allowed on the root route (the alerts they do not match "
            "would go nowhere)",
        ),
        ("{receiver: chat, continue: true}", ":4:35: route.continue: not allowed on the root"),
        ("{group_by: [host]}", ":4:8: route.receiver: required on the root route"),
        ("{receiver: chat, repeat_interval: 0s}", ":4:42: route.repeat_interval: must be > 0"),
        ("{receiver: chat, group_wait: 1e999}", ":4:37: route.group_wait: bad duration '1e999'"),
        (
            "{receiver: chat, routes: [{matchers: {1bad: x}, receiver: pager}]}",
            ":4:45: route.routes[0].matchers: '1bad' is not a label name",
        ),
        (
            "{receiver: chat, routes: [{matchers: [severity=critical]}]}",
            ":4:45: route.routes[0].matchers: expected a mapping of label: value, got a list",
        ),
        ("{receiver: chat, routes: {receiver: pager}}", ":4:33: route.routes: expected a list"),
    ],
)
def test_route_keys_are_checked(tmp_path: Path, route: str, message: str) -> None:
    assert load(tmp_path, HEAD + f"route: {route}\n").startswith(message)


@pytest.mark.parametrize(
    ("tail", "message"),
    [
        (
            "inhibit_rules:\n  - source_match: {alertname: A}\n    target_matchers: {x: y}\n",
            ":6:5: inhibit_rules[0]: unknown field(s) source_match (an inhibit rule takes "
            "source_matchers, target_matchers, equal, linger)",
        ),
        (
            "inhibit_rules:\n  - source_matchers: {alertname: A}\n",
            ":6:5: inhibit_rules[0].target_matchers: required (without it the rule would mute "
            "on any alert)",
        ),
        ("inhibit_rules: {source_matchers: {a: b}}\n", ":5:16: inhibit_rules: expected a list"),
        ("max_attempts: true\n", ":5:15: max_attempts: expected an integer, got true"),
        ("max_attempts: 0\n", ":5:15: max_attempts: expected 1..1000, got 0"),
        ("max_attempts: 5000\n", ":5:15: max_attempts: expected 1..1000, got 5000"),
        ("routes: []\n", ":5:9: routes: unknown field (a notify file holds receivers, route"),
        ("route: {receiver: pager}\n", ":5:1: duplicate key 'route' (first at 4:1)"),
    ],
)
def test_top_level_and_inhibition_keys_are_checked(tmp_path: Path, tail: str, message: str) -> None:
    assert load(tmp_path, HEAD + "route: {receiver: chat}\n" + tail).startswith(message)


@pytest.mark.parametrize(
    ("receiver", "message"),
    [
        (
            "{name: chat, type: slack, url: 'https://hooks.slack.com/services/T/B/x',\n"
            "     rate_per_s: 0}",
            ":3:18: receivers[0].rate_per_s: must be > 0, got 0",
        ),
        (
            "{name: pd, type: pagerduty, routing_key: k, source_labels: [host, 'pod name']}",
            ":2:64: receivers[0].source_labels: 'pod name' is not a label name",
        ),
        (
            "{name: pd, type: pagerduty, routing_key: k, severity_map: {warn: error}}",
            ":2:70: receivers[0].severity_map.warn: not a severity (critical, error, warning",
        ),
    ],
    ids=["slack-rate", "pagerduty-source-labels", "pagerduty-severity-typo"],
)
def test_a_receivers_own_fields_are_checked_with_their_line(
    tmp_path: Path, receiver: str, message: str
) -> None:
    name = receiver.split(",")[0].removeprefix("{name: ")
    text = f"receivers:\n  - {receiver}\nroute: {{receiver: {name}}}\n"
    assert load(tmp_path, text).startswith(message)


def test_parse_config_names_its_source() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(
            {"receivers": [{"name": "w", "type": "webhook", "url": "http://x"}], "route": {}},
            {},
            "notify.yaml",
        )
    assert str(err.value) == "notify.yaml: route.receiver: required on the root route"


def test_the_documented_and_the_demos_notify_files_load(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """... without a warning: their inhibit rules neither overlap nor form a cycle."""
    from ragwatch.commands.demo import NOTIFY_YAML

    caplog.set_level(logging.WARNING)

    page = (ROOT / "docs" / "notifications.md").read_text()
    documented = re.search(r"```yaml\n(receivers:.*?)```", page, re.S)
    assert documented is not None
    env = {"PD_ROUTING_KEY": "k" * 32, "SLACK_WEBHOOK_URL": "https://h/x", "HOOK_SECRET": "s"}
    demo = NOTIFY_YAML.format(hook="http://h/1", slack="http://h/2", pd="http://h/3")
    for name, text in (("docs.yaml", documented.group(1)), ("demo.yaml", demo)):
        (tmp_path / name).write_text(text)
        cfg = load_config(tmp_path / name, {**env, "DEMO_PD_ROUTING_KEY": "k" * 32})
        assert cfg.route.receiver == "team-chat" and cfg.inhibit_rules
    assert caplog.messages == []


def test_ragwatch_notify_prints_a_bad_file_as_one_line_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ragwatch.cli import main

    path = tmp_path / "notify.yaml"
    path.write_text(HEAD + "route:\n  receiver: chat\n  continue: yes\n")
    env = {"RAGWATCH_NOTIFY_FILE": str(path), "RAGWATCH_KAFKA_BOOTSTRAP": "127.0.0.1:1"}
    assert main(["notify"], environ=env) == 2
    assert capsys.readouterr().err == (
        f"ragwatch: error: {path}:6:13: route.continue: not allowed on the root route "
        "(it has no sibling)\n"
    )


# Inhibit rules that Alertmanager accepts but that do what their author may not expect
# (issue 32) load with a warning naming the rules and their matchers.


def warnings_of(tmp_path: Path, caplog: pytest.LogCaptureFixture, rules: str) -> list[str]:
    """The warnings logged while loading a notify file with ``rules`` as inhibit_rules."""
    path = tmp_path / "notify.yaml"
    path.write_text(HEAD + "route: {receiver: chat}\ninhibit_rules:\n" + rules)
    caplog.set_level(logging.WARNING)
    load_config(path, {})
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_rule_whose_source_matches_its_target_loads_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rules = (
        "  - {source_matchers: {alertname: GpuOomKill}, target_matchers: {alertname: X}}\n"
        "  - source_matchers: {alertname: '=~Gpu.*'}\n"
        "    target_matchers: {alertname: GpuMemoryLeak}\n"
        "    equal: [host]\n"
    )
    (message,) = warnings_of(tmp_path, caplog, rules)
    assert message.startswith(
        f'{tmp_path / "notify.yaml"}: inhibit_rules[1] (source {{alertname=~"Gpu.*"}} '
        'target {alertname="GpuMemoryLeak"} equal [host]): an alert can match both its '
        "source and its target; such an alert is muted only by a source that does not "
        "match the target"
    )


def test_a_cycle_of_rules_loads_with_a_warning_naming_each_rule(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Rule 0 (X mutes Y) can mute the sources of rule 2 (Y mutes X) and 2 those of 0;
    rule 1 is in no cycle and not named."""
    rules = (
        "  - {source_matchers: {alertname: X}, target_matchers: {alertname: Y}, equal: [host]}\n"
        "  - {source_matchers: {alertname: A}, target_matchers: {alertname: B}}\n"
        "  - {source_matchers: {alertname: Y}, target_matchers: {alertname: X}, equal: [host]}\n"
    )
    (message,) = warnings_of(tmp_path, caplog, rules)
    assert (
        "form a cycle, inhibit_rules[0] -> inhibit_rules[2] -> inhibit_rules[0] "
        '(inhibit_rules[0]: source {alertname="X"} target {alertname="Y"} equal [host]; '
        'inhibit_rules[2]: source {alertname="Y"} target {alertname="X"} equal [host])'
    ) in message
    assert "inhibit_rules[1]" not in message


def test_a_longer_cycle_through_regexes_is_found(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rules = (
        "  - {source_matchers: {alertname: '=~Gpu.*'}, target_matchers: {alertname: Net}}\n"
        "  - {source_matchers: {alertname: '=~Net|Link'}, target_matchers: {alertname: Rack}}\n"
        "  - {source_matchers: {alertname: Rack}, target_matchers: {alertname: GpuXid}}\n"
    )
    (message,) = warnings_of(tmp_path, caplog, rules)
    path = "inhibit_rules[0] -> inhibit_rules[1] -> inhibit_rules[2] -> inhibit_rules[0]"
    assert f"form a cycle, {path} (" in message


def test_a_cycle_warning_names_every_rule_of_the_cycles(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Rule 1's target (severity=page) may be any alertname, a source of 0 and of 2: the
    shortest cycle is 0 -> 1 -> 0, and 2 is on another (1 -> 2 -> 0 -> 1): all named."""
    rules = (
        "  - {source_matchers: {alertname: '=~Gpu.*'}, target_matchers: {alertname: Net}}\n"
        "  - {source_matchers: {alertname: '=~Net|Disk'}, target_matchers: {severity: page}}\n"
        "  - {source_matchers: {severity: page}, target_matchers: {alertname: GpuXid}}\n"
    )
    messages = warnings_of(tmp_path, caplog, rules)
    (cycle,) = [m for m in messages if "form a cycle" in m]
    assert "form a cycle, inhibit_rules[0] -> inhibit_rules[1] -> inhibit_rules[0] (" in cycle
    assert all(f"inhibit_rules[{i}]: source" in cycle for i in range(3))
    overlaps = [m for m in messages if "can match both" in m]  # severity=page on both sides
    named = [re.findall(r"inhibit_rules\[\d+\]", m)[0] for m in overlaps]
    assert named == ["inhibit_rules[1]", "inhibit_rules[2]"]


@pytest.mark.parametrize(
    ("a", "b", "overlap"),
    [
        ({"alertname": "A"}, {"alertname": "B"}, False),
        ({"alertname": "A"}, {"alertname": "A"}, True),
        ({"alertname": "A"}, {"host": "h1"}, True),  # other labels never conflict
        ({"alertname": "GpuXid"}, {"alertname": "=~Gpu.*"}, True),
        ({"alertname": "Disk"}, {"alertname": "=~Gpu.*"}, False),
        ({"alertname": "=~A|B"}, {"alertname": "=~C|B"}, True),
        ({"alertname": "=~A|B"}, {"alertname": "=~C|D"}, False),
        ({"alertname": "=~A|B"}, {"alertname": "=~[AB]x"}, False),
        ({"alertname": "=~Gpu.*"}, {"alertname": "=~Net.*"}, True),  # assumed: conservative
        ({"cluster": ""}, {"cluster": "=~.*"}, True),  # a missing label is the empty value
    ],
)
def test_matcher_sets_overlap_unless_a_label_provably_conflicts(
    a: dict[str, str], b: dict[str, str], overlap: bool
) -> None:
    ms = [tuple(Matcher.parse(k, v, "m") for k, v in d.items()) for d in (a, b)]
    assert may_overlap(ms[0], ms[1]) is overlap
    assert may_overlap(ms[1], ms[0]) is overlap
