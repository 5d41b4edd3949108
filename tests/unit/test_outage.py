"""OutageLog, the rate-limited "Redis unreachable" warning of the worker and the notifier,
on a fake clock: the first failure at once, then one line per 30 s with the failures
since, one line when Redis is back."""

from __future__ import annotations

import logging

import pytest

from ragwatch.outage import OutageLog

URL = "redis://:***@cache:6379/0"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def outage(clock: Clock) -> OutageLog:
    return OutageLog(logging.getLogger("test.outage"), "Redis", URL, prefix="notify: ", clock=clock)


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "test.outage"]


def test_first_failure_logs_at_once_then_one_line_per_30s_with_the_count(
    outage: OutageLog, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="test.outage")
    logged = []
    for i in range(300):  # an operation every 200 ms for a minute
        clock.now = 1000.0 + i * 0.2
        logged.append(outage.failed("read silences", ConnectionError("Connection refused")))
    assert outage.failures == 300  # every failure counted, whatever was logged
    assert [i for i, yes in enumerate(logged) if yes] == [0, 150]  # at 0 s and at 30 s
    first, second = lines(caplog)
    assert first == (
        f"notify: Redis unreachable at {URL} (read silences: Connection refused), "
        "retrying (1 operation failed so far)"
    )
    assert second == (
        f"notify: Redis still unreachable at {URL} after 30 s (read silences: Connection "
        "refused), retrying (151 operations failed so far, 150 since the last report)"
    )
    assert all(r.levelno == logging.WARNING for r in caplog.records)


def test_recovery_is_one_line_with_the_outage_length_and_a_new_outage_logs_at_once(
    outage: OutageLog, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="test.outage")
    assert outage.recovered() is None and not lines(caplog)  # nothing was down
    for _ in range(45):
        outage.failed("write status", OSError("refused"))
        clock.now += 1.0
    assert outage.down
    assert outage.recovered(": rewrote 2 active alert(s)") == 45.0
    assert not outage.down and outage.recovered() is None  # said once
    assert lines(caplog)[-1] == (
        "notify: Redis is back after 45 s (45 operations failed): rewrote 2 active alert(s)"
    )
    caplog.clear()
    clock.now += 1.0  # a new outage soon after: its first failure is not held back
    assert outage.failed("write status", OSError("refused"), "; 1 kept in memory")
    assert lines(caplog) == [
        f"notify: Redis unreachable at {URL} (write status: refused), retrying "
        "(1 operation failed so far); 1 kept in memory"
    ]


def test_no_url_and_no_prefix_read_plainly(clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="test.outage")
    OutageLog(logging.getLogger("test.outage"), "Redis", "", clock=clock).failed(
        "a retry", OSError("timeout")
    )
    assert lines(caplog) == [
        "Redis unreachable (a retry: timeout), retrying (1 operation failed so far)"
    ]


def test_a_period_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ValueError, match="every_s"):
        OutageLog(logging.getLogger("test.outage"), "Redis", URL, every_s=0)
