"""What ``ragwatch demo`` tells while it runs (issue 29, points 8 and 10): what each
scenario injects (true for each: ``healthy`` injects nothing), progress while it waits,
and why an alert it does not wait for fires; an alert nothing explains fails the demo.

The watch reads a real local webhook receiver; the workers' status and the wall clock are
injected (no Kafka, no Redis, no sleeps).
"""

from __future__ import annotations

import io
import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from ragwatch.commands.demo_scenarios import story
from ragwatch.commands.demo_watch import Watch
from ragwatch.config import Settings
from ragwatch.receiver import WebhookReceiver

START = 1_767_225_600.0  # 2026-01-01 00:00 UTC


def test_healthy_says_that_no_fault_is_injected_and_what_passes() -> None:
    s = story("healthy")
    assert s.expected == [] and s.consequences == []
    assert s.fault == (
        "no fault is injected (only daily seasonality, a deploy and a model reload); the demo "
        "passes if nothing pages for 3 simulated days"
    )


@pytest.mark.parametrize(
    ("scenario", "says"),
    [
        ("leak", "rag-worker pid 4011 on gpu-node-01 GPU 1 starts leaking 1.2 GB/h"),
        (
            "throughput",
            "rag-api-1 of rag-api (on gpu-node-02) loses 36% of its output tokens per request "
            "and 37% of its requests, and decodes 2.7x slower",
        ),
        ("retrieval", "3% of rag-api-1's retrievals stall (~470 ms)"),
        ("outliers", "rag-api-1 starts getting unusual requests (~12,000 context and ~20 output"),
        ("oom", "starts leaking 1.2 GB/h until the CUDA OOM killer takes it (~12.4 h in)"),
        ("all", "the request faults heal 5h later"),
    ],
)
def test_each_fault_scenario_says_what_it_injects_and_when(scenario: str, says: str) -> None:
    s = story(scenario)
    assert s.fault.startswith("at minute 20, ") and says in s.fault, s.fault
    assert s.expected


def test_the_throughput_fault_pages_decode_speed_and_answer_length_not_demand() -> None:
    """The simulator's throughput fault decodes 2.7x slower and answers shorter with a
    third fewer requests: that pages DecodeSpeedDrop and TokensPerRequestDrop; a demand
    collapse (ThroughputDrop, requests at a tenth) is nothing it explains."""
    s = story("throughput")
    on = {"service": "rag-api", "instance": "rag-api-1"}
    assert [e.rule for e in s.expected] == ["DecodeSpeedDrop", "TokensPerRequestDrop"]
    assert all(dict(e.labels) == on for e in s.expected)
    assert s.explain(_alert("ThroughputDrop", on)) is None
    oom = story("oom")  # the OOM kill fails most requests of the instance for 90 s
    assert "fails 80% of rag-api-1's requests" in str(oom.explain(_alert("ErrorRateHigh", on)))
    assert "decodes 1% slower" in str(oom.explain(_alert("DecodeSpeedDrop", on)))
    assert oom.explain(_alert("ThroughputDrop", on)) is None


def _alert(name: str, labels: dict[str, str], *, hint: str = "", status: str = "firing") -> Any:
    return {
        "status": status,
        "labels": {"alertname": name, **labels},
        "annotations": {"summary": f"{name} summary", **({"hint": hint} if hint else {})},
        "fingerprint": f"{name}-{sorted(labels.items())}",
    }


def _post(rx: WebhookReceiver, *alerts: Any) -> None:
    body = json.dumps({"alerts": list(alerts)}).encode()
    urllib.request.urlopen(urllib.request.Request(rx.url, data=body, method="POST")).close()


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as rx:
        yield rx
    rx.stop()


def _watch(scenario: str, rx: WebhookReceiver, **kw: Any) -> Watch:
    kw.setdefault("status", lambda: (0, 0.0))
    return Watch(
        story(scenario),
        rx,
        Settings.from_env({}),
        start_ts=START,
        hours=kw.pop("hours", None),
        out=io.StringIO(),
        err=kw.pop("err", io.StringIO()),
        tty=False,
        **kw,
    )


LEAK = {"host": "gpu-node-01", "gpu": "1", "pid": "4011", "process": "rag-worker"}


def test_alerts_the_faults_explain_are_said_why_and_others_fail_the_demo(
    receiver: WebhookReceiver, capsys: pytest.CaptureFixture[str]
) -> None:
    watch = _watch("all", receiver)
    _post(
        receiver,
        _alert("GpuMemoryLeak", LEAK, hint="suspect a leak"),  # expected
        _alert("GpuMemoryHigh", {"host": "gpu-node-01", "gpu": "1"}),
        _alert("E2eLatencyDeviation", {"service": "rag-api", "instance": "rag-api-1"}),
        _alert("GpuMemoryLeak", {**LEAK, "pid": "4012"}),  # the restarted worker
    )
    watch.poll(0.0)
    assert watch.verdict()
    err = capsys.readouterr().err
    assert (
        "[demo] also firing: GpuMemoryHigh host=gpu-node-01 gpu=1: the leak fills GPU 1 of "
        "gpu-node-01: over 95 % of its memory, the last warning before the CUDA OOM killer"
    ) in err
    assert (
        "[demo] also firing: E2eLatencyDeviation service=rag-api instance=rag-api-1: the "
        "throughput fault makes rag-api-1 decode 2.7x slower: its end-to-end latency rises"
    ) in err
    assert "pid=4012 process=rag-worker: after the OOM kill, rag-worker restarted" in err
    assert "UNEXPECTED" not in err

    _post(
        receiver, _alert("DecodeSpeedDrop", {"service": "rag-search", "instance": "rag-search-0"})
    )
    watch.poll(0.0)
    assert not watch.verdict()
    err = capsys.readouterr().err
    assert (
        "[demo] UNEXPECTED: DecodeSpeedDrop service=rag-search instance=rag-search-0: nothing in "
        "scenario all explains it"
    ) in err
    assert "failed: DecodeSpeedDrop service=rag-search instance=rag-search-0 fired" in err


def test_a_consequence_of_another_scenario_is_not_explained(
    receiver: WebhookReceiver, capsys: pytest.CaptureFixture[str]
) -> None:
    """GpuMemoryHigh follows from a leak: in ``retrieval`` nothing leaks."""
    watch = _watch("retrieval", receiver)
    _post(receiver, _alert("GpuMemoryHigh", {"host": "gpu-node-01", "gpu": "1"}))
    watch.poll(0.0)
    assert not watch.verdict()
    assert "UNEXPECTED: GpuMemoryHigh" in capsys.readouterr().err


def test_resolved_alerts_print_their_resolution(receiver: WebhookReceiver) -> None:
    watch = _watch("all", receiver)
    done = _alert("GpuMemoryLeak", LEAK, status="resolved")
    done["annotations"]["resolution"] = "its series went silent (no data since then)"
    _post(receiver, done)
    watch.poll(0.0)
    assert isinstance(watch.out, io.StringIO)
    assert watch.out.getvalue().splitlines() == [
        "RESOLVED GpuMemoryLeak host=gpu-node-01 gpu=1 pid=4011 process=rag-worker",
        "  summary: GpuMemoryLeak summary",
        "  resolution: its series went silent (no data since then)",
    ]
    assert watch.alerts == 0 and watch.verdict()  # a resolution is no page


def test_progress_every_10_s_says_event_time_messages_and_alerts(
    receiver: WebhookReceiver,
) -> None:
    """The healthy demo was ~100 s silent: a line every 10 s of wall time now (a bar on
    a terminal)."""
    now = [0.0]
    reached = [(0, 0.0)]
    err = io.StringIO()
    watch = _watch(
        "healthy", receiver, hours=72.0, err=err, clock=lambda: now[0], status=lambda: reached[0]
    )
    for step in range(1, 8):  # 4 s of wall time and 2 simulated hours a look
        now[0] = 4.0 * step
        reached[0] = (1000 * step, START + 7200.0 * step)
        watch.poll(0.0)
    watch.close()
    assert err.getvalue().splitlines() == [
        "[demo] 6 of 72 simulated hours (8.3%), 0.5/s, 2.2 min left; event time "
        "2026-01-01 06:00 UTC, 3,000 messages processed, 0 alerts so far",
        "[demo] 12 of 72 simulated hours (16.7%), 0.5/s, 2.0 min left; event time "
        "2026-01-01 12:00 UTC, 6,000 messages processed, 0 alerts so far",
    ]


def test_on_a_terminal_the_progress_is_a_bar(
    receiver: WebhookReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "160")  # a terminal of 160 columns
    now, err = [0.0], io.StringIO()
    watch = Watch(
        story("healthy"),
        receiver,
        Settings.from_env({}),
        start_ts=START,
        hours=72.0,
        out=io.StringIO(),
        err=err,
        clock=lambda: now[0],
        status=lambda: (500, START + 36 * 3600.0),
        tty=True,
    )
    now[0] = 1.0
    watch.poll(0.0)
    watch.close()
    drawn = err.getvalue()
    assert "[demo] simulated hours " in drawn
    assert "event time 2026-01-02 12:00 UTC, 500 messages" in drawn  # beside the bar
    assert "36/72" in drawn and "50%" in drawn, drawn


class _Fleet:
    """The demo's children as the watch sees them: the agent is done and said how many
    envelopes it delivered."""

    def __init__(self, delivered: int | None) -> None:
        self.delivered = delivered

    def dead(self) -> list[str]:
        return []

    def fallen(self) -> list[tuple[str, int]]:
        return []

    def log_tail(self, name: str, chars: int = 1500) -> str:
        return ""

    def agent_done(self) -> bool:
        return True

    def agent_delivered(self) -> int | None:
        return self.delivered


def test_healthy_ends_only_when_the_worker_processed_all_the_agent_delivered(
    receiver: WebhookReceiver, capsys: pytest.CaptureFixture[str]
) -> None:
    """A worker writes its status every 5 s: a count that stands still for 3 s is not a
    drained worker (the demo said 22,878 messages of 34,560)."""
    now = [0.0]
    counts = iter([100, 22_878, 22_878, 22_878, 22_878, 22_878, 22_878, 30_000, 34_560])

    def status() -> tuple[int, float]:
        now[0] += 1.0  # a look a second
        return next(counts), START

    watch = _watch("healthy", receiver, clock=lambda: now[0], status=status, wait_s=0.0)
    assert watch.until_expected(_Fleet(delivered=34_560), deadline=100.0)
    assert watch.messages == 34_560
    assert "[demo] healthy fleet: 34,560 messages processed, 0 page(s) in 9s" in (
        capsys.readouterr().err
    )


def test_without_the_agents_count_the_worker_is_drained_after_12_quiet_seconds(
    receiver: WebhookReceiver,
) -> None:
    now = [0.0]

    def status() -> tuple[int, float]:
        now[0] += 1.0
        return 500, START

    watch = _watch("healthy", receiver, clock=lambda: now[0], status=status, wait_s=0.0)
    assert watch.until_expected(_Fleet(delivered=None), deadline=100.0)
    assert 12.0 < now[0] < 15.0


def test_a_timeout_says_the_limit_set_not_how_long_the_last_look_took(
    receiver: WebhookReceiver, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--timeout 1s`` on a loaded machine: the last look ended 1.6 s after the watch began
    (the clean-clone run said "timeout after 2s")."""
    now = [0.0]

    def status() -> tuple[int, float]:
        now[0] += 1.6
        return 0, START

    watch = _watch("leak", receiver, clock=lambda: now[0], status=status, wait_s=0.0,
                   timeout_s=1.0)  # fmt: skip
    assert not watch.until_expected(_Fleet(delivered=None), deadline=1.0)
    said = capsys.readouterr().err
    assert "timeout after 1s: no firing GpuMemoryLeak alert for gpu-node-01 GPU 1 pid 4011" in said
