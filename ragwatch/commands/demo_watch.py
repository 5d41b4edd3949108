"""Watching a ``ragwatch demo`` run: the alerts as they reach the webhook, the progress of
the simulated fleet, and what the receivers got.

:class:`Watch` prints every alert the webhook receives (text or ``--json``), says for each
firing alert the scenario does not wait for why it fires (a consequence of the injected
faults, from :class:`~ragwatch.commands.demo_scenarios.Story`) or that nothing explains it
(the demo then fails), and reports progress on stderr while it waits: event time
reached, messages the worker processed and alerts so far (a ``rich`` bar on a terminal, a
line every 10 s otherwise, :class:`~ragwatch.progress.Progress`). Only the receivers and
the worker's status in Redis are read: what a user of the demo can see.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol, TextIO

import orjson

from ragwatch.commands.demo_scenarios import Story
from ragwatch.config import Settings
from ragwatch.progress import Progress
from ragwatch.receiver import WebhookReceiver

# Without the agent's count of what it delivered, the worker has drained once its count
# of messages has not moved for this long (it writes its status every 5 s: see
# RAGWATCH_STATUS_INTERVAL)
QUIET_S = 12.0
WHO = ("host", "gpu", "pid", "process", "container", "service", "instance")
SHOWN = ("summary", "description", "hint", "resolution", "runbook")


def say(msg: str) -> None:
    print(f"[demo] {msg}", file=sys.stderr, flush=True)


class Children(Protocol):
    """The demo's subprocesses, as the watch needs them."""

    def dead(self) -> list[str]: ...
    def fallen(self) -> list[tuple[str, int]]: ...
    def log_tail(self, name: str, chars: int = 1500) -> str: ...
    def agent_done(self) -> bool: ...
    def agent_delivered(self) -> int | None: ...


def who(alert: dict[str, Any]) -> str:
    lab = alert["labels"]
    return " ".join(f"{k}={lab[k]}" for k in WHO if k in lab)


def print_alert(a: dict[str, Any], as_json: bool, out: TextIO) -> None:
    if as_json:
        out.write(orjson.dumps(a).decode() + "\n")
    else:
        out.write(f"{a['status'].upper()} {a['labels'].get('alertname')} {who(a)}\n")
        for key in SHOWN:
            if key in a["annotations"]:
                out.write(f"  {key}: {a['annotations'][key]}\n")
    out.flush()


def redis_fired(settings: Settings) -> set[str]:
    """Fingerprints of every alert that has been firing, from the Redis alert history."""
    from ragwatch.store import Keys, blocking_client

    client = blocking_client(settings.redis_url)
    try:
        history = client.lrange(Keys(settings.redis_prefix).history, 0, -1)
        return {a["fingerprint"] for a in map(orjson.loads, history) if a["status"] == "firing"}
    finally:
        client.close()


def worker_status(settings: Settings) -> tuple[int, float]:
    """(messages processed, newest event time seen) over the workers' status in Redis."""
    from ragwatch.store import Keys, blocking_client

    client = blocking_client(settings.redis_url)
    try:
        workers = [orjson.loads(v) for v in client.hvals(Keys(settings.redis_prefix).workers)]
    finally:
        client.close()
    messages = sum(int(w.get("messages") or 0) for w in workers)
    return messages, max((float(w.get("watermark") or 0.0) for w in workers), default=0.0)


class Watch:
    """One demo run seen from outside: see the module docstring.

    ``start_ts`` is the fleet's first event time and ``hours`` how much it plays (the
    progress' total, or None when the demo ends long before). ``status`` reads the
    workers' (messages, event time), ``clock`` the wall time, and each look waits up to
    ``wait_s`` for the webhook: injected by tests. Alerts go to ``out`` (default: the
    ``sys.stdout`` of the moment), progress to ``err`` (default: stderr).
    """

    def __init__(
        self,
        story: Story,
        receiver: WebhookReceiver,
        settings: Settings,
        *,
        start_ts: float,
        hours: float | None,
        as_json: bool = False,
        out: TextIO | None = None,
        err: TextIO | None = None,
        status: Callable[[], tuple[int, float]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        tty: bool | None = None,
        wait_s: float = 0.5,
        timeout_s: float | None = None,
    ) -> None:
        self.story, self.receiver, self.settings = story, receiver, settings
        self.timeout_s = timeout_s  # the demo's --timeout, said when it runs out
        self.start_ts, self.as_json, self.out = start_ts, as_json, out
        self.status = status or (lambda: worker_status(settings))
        self.clock, self.wait_s = clock, wait_s
        self.t0 = clock()
        self.seen = 0  # webhook bodies printed
        self.met: dict[str, str] = {}  # expectation -> fingerprint
        self.fallen: set[str] = set()  # workers of several that exited, said once
        self.alerts = 0  # firing alerts seen
        self.explained: dict[str, str] = {}  # fingerprint -> why it fires
        self.unexpected: dict[str, str] = {}  # fingerprint -> the alert, for the report
        self.messages, self.event_ts = 0, 0.0
        self.progress = Progress(
            "demo", "simulated hours", total=hours, out=err, clock=clock, tty=tty
        )
        self.progress.note(self._detail)

    # ------------------------------------------------------------------ one look

    def poll(self, wait_s: float | None = None) -> None:
        """Wait up to ``wait_s`` (default: the watch's) for the webhook, print what came,
        update the progress."""
        self.receiver.wait_for(lambda b: False, self.wait_s if wait_s is None else wait_s)
        bodies = self.receiver.bodies
        for b in bodies[self.seen :]:
            for a in b["alerts"]:
                self._alert(a)
        self.seen = len(bodies)
        try:
            self.messages, self.event_ts = self.status()
        except Exception:  # Redis busy or restarting: the next look will tell
            return
        if self.event_ts > 0:
            self.progress.update(max(self.event_ts - self.start_ts, 0.0) / 3600)

    def _alert(self, a: dict[str, Any]) -> None:
        # sys.stdout at the time: while the bar is drawn, rich routes it above the bar
        print_alert(a, self.as_json, self.out if self.out is not None else sys.stdout)
        if a.get("status") != "firing":
            return
        self.alerts += 1
        fp = a.get("fingerprint", "")
        self.met.update({e.what: fp for e in self.story.expected if e.met_by(a)})
        if self.story.expects(a) or fp in self.explained or fp in self.unexpected:
            return
        name = f"{a['labels'].get('alertname')} {who(a)}"
        why = self.story.explain(a)
        if why is not None:
            self.explained[fp] = why
            say(f"also firing: {name}: {why}")
        else:
            self.unexpected[fp] = name
            say(f"UNEXPECTED: {name}: nothing in scenario {self.story.scenario} explains it")

    def _detail(self) -> str:
        if self.event_ts <= 0:
            return "waiting for the worker's first status"
        when = datetime.fromtimestamp(self.event_ts, UTC).strftime("%Y-%m-%d %H:%M UTC")
        alerts = f"{self.alerts} alert{'' if self.alerts == 1 else 's'}"
        return f"event time {when}, {self.messages:,} messages processed, {alerts} so far"

    def elapsed(self) -> float:
        """Wall seconds since the watch began."""
        return self.clock() - self.t0

    def close(self) -> None:
        self.progress.close(final_line=False)

    # ------------------------------------------------------------------ the phases

    def until_expected(self, children: Children, deadline: float) -> bool:
        """Until every expectation is met at the webhook and in Redis (or, with none,
        until the agent is done and the worker has processed every message it
        delivered)."""
        expected = self.story.expected
        quiet_since, last = None, -1
        while self.clock() < deadline:
            if dead := children.dead():
                say(f"{dead[0]} exited early; last log lines:\n{children.log_tail(dead[0])}")
                return False
            self._fallen(children)
            self.poll()
            if expected and len(self.met) == len(expected):
                return self._stored(deadline)
            if not expected and children.agent_done():
                quiet_since = self.clock() if self.messages != last else quiet_since
                last = self.messages
                delivered = children.agent_delivered()
                if (delivered is not None and self.messages >= delivered) or (
                    delivered is None and self.clock() - (quiet_since or 0.0) > QUIET_S
                ):
                    say(
                        f"healthy fleet: {self.messages:,} messages processed, "
                        f"{self.alerts} page(s) in {self.elapsed():.0f}s"
                    )
                    return not self.alerts
        missing = [e.what for e in expected if e.what not in self.met]
        # the limit the user set, counted from the demo's start (the watch began later,
        # and a loaded machine's last poll may end past it)
        took = self.elapsed() if self.timeout_s is None else self.timeout_s
        say(
            f"timeout after {took:.0f}s: no firing {'; no firing '.join(missing)} "
            f"reached the webhook ({len(self.receiver.bodies)} bodies received). Worker log "
            f"tail:\n{children.log_tail('worker')}"
            if missing
            else f"timeout after {took:.0f}s: the worker did not finish the "
            f"simulated days ({self.messages:,} messages processed)"
        )
        return False

    def _fallen(self, children: Children) -> None:
        """Say once of each worker of several that exited: the others carry on."""
        for name, code in children.fallen():
            if name not in self.fallen:
                self.fallen.add(name)
                how = "was killed" if code == -9 else f"exited ({code})"
                say(f"{name} {how}: the other workers take its partitions over")

    def _stored(self, deadline: float) -> bool:
        while not set(self.met.values()) <= redis_fired(self.settings):
            if self.clock() > deadline:
                say("the webhook got the alerts but Redis did not record them firing")
                return False
            time.sleep(0.2)
        say(
            f"{len(self.met)} expected alert(s) delivered to the webhook and stored in Redis "
            f"({self.elapsed():.1f}s)"
        )
        return True

    def until_healed(self, children: Children, deadline: float) -> bool:
        """Until every expected alert has also resolved at the webhook."""
        names = {e.rule for e in self.story.expected}
        resolved: set[str] = set()
        while self.clock() < deadline:
            if children.dead():
                return False
            resolved = {
                a["labels"].get("alertname")
                for b in self.receiver.bodies
                for a in b["alerts"]
                if a["status"] == "resolved"
            }
            if names <= resolved:
                say(f"the scenario healed: {len(names)} alert(s) resolved at the webhook")
                return True
            self.poll()
        say(f"timeout: not resolved: {', '.join(sorted(names - resolved))}")
        return False

    def verdict(self) -> bool:
        """Whether every firing alert was expected or explained (printing what was not)."""
        self.poll(0.0)
        if self.explained:
            say(
                f"{len(self.explained)} more alert(s) fired as consequences of the injected "
                "faults (see 'also firing' above)"
            )
        for name in self.unexpected.values():
            say(f"failed: {name} fired and nothing in the scenario explains it")
        return not self.unexpected


RESOLVE_WAIT_S = 30.0
# how long PagerDuty's resolves may trail the webhook's: its sender paces itself
# (rate_per_min) and a healing scenario resolves several alerts within milliseconds


def _pager_keys(pager: WebhookReceiver) -> dict[str, str | None]:
    """Each PagerDuty incident's dedup key -> its alert's fingerprint (from its trigger)."""
    out: dict[str, str | None] = {}
    for e in pager.bodies:
        if e.get("event_action") == "trigger":
            details = (e.get("payload") or {}).get("custom_details", {})
            out[e.get("dedup_key", "")] = details.get("fingerprint")
    return out


def _resolved_at_webhook(hook: WebhookReceiver) -> set[str]:
    return {a["fingerprint"] for b in hook.bodies for a in b["alerts"] if a["status"] == "resolved"}


def _await_pager_resolves(hook: WebhookReceiver, pager: WebhookReceiver, wait_s: float) -> None:
    """Wait, up to ``wait_s`` in all, for PagerDuty to get the resolve of each incident
    whose alert the webhook has seen resolved."""
    deadline = time.monotonic() + wait_s
    done = _resolved_at_webhook(hook)
    for key, fp in sorted(_pager_keys(pager).items()):
        if fp in done:
            pager.wait_for(
                lambda e, k=key: e.get("dedup_key") == k and e.get("event_action") == "resolve",
                max(0.0, deadline - time.monotonic()),
            )


def check_receivers(
    hook: WebhookReceiver,
    slack: WebhookReceiver,
    pager: WebhookReceiver,
    *,
    expected: bool,
    healed: bool,
) -> bool:
    """What each receiver got: every transition once at the webhook and PagerDuty (one
    trigger, and after healing one resolve, per alert), and Slack in few messages."""
    time.sleep(1.0)  # let the last deliveries land
    if expected:  # Slack's group waits 30 s of event time; the notifier's clock may lag a bit
        slack.wait_for(lambda b: True, 10.0)
    if healed:
        _await_pager_resolves(hook, pager, RESOLVE_WAIT_S)
    seen: dict[tuple[str, str], int] = {}
    for b in hook.bodies:
        for a in b["alerts"]:
            k = (a["fingerprint"], a["status"])
            seen[k] = seen.get(k, 0) + 1
    events: dict[tuple[str, str], int] = {}
    for e in pager.bodies:
        k = (e.get("dedup_key", ""), e.get("event_action", ""))
        events[k] = events.get(k, 0) + 1
    triggers = sum(n for (_, act), n in events.items() if act == "trigger")
    resolves = sum(n for (_, act), n in events.items() if act == "resolve")
    say(
        f"receivers: webhook {len(hook.bodies)} bodies, Slack-like {len(slack.bodies)} "
        f"messages, PagerDuty-like {triggers} triggers + {resolves} resolves"
    )
    problems = [f"webhook got {k[1]} of {k[0]} {n} times" for k, n in seen.items() if n > 1]
    problems += [f"PagerDuty got {k[1]} {k[0]} {n} times" for k, n in events.items() if n > 1]
    if healed:  # every alert that resolved at the webhook was resolved at PagerDuty too
        resolved_fps = _resolved_at_webhook(hook)
        resolved_keys = {k for (k, act) in events if act == "resolve"}
        problems += [
            f"PagerDuty incident {k} was never resolved"
            for k, fp in sorted(_pager_keys(pager).items())
            if fp in resolved_fps and k not in resolved_keys
        ]
    if expected and not slack.bodies:
        problems.append("Slack got no message")
    for p in problems:
        say(p)
    return not problems
